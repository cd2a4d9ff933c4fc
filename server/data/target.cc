#include "server/data/target.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string_view>

#include "common/base/log.h"
#include "server/daemon/daemon.h"

namespace penstock::data {
namespace {

// mkdir that accepts an existing directory; sets *created when it made one.
Status make_dir(const std::string& dir, bool* created) {
  if (::mkdir(dir.c_str(), 0755) == 0) {
    *created = true;
    return Status::ok();
  }
  if (errno == EEXIST) return Status::ok();
  int err = errno;
  return Status(err == ENOSPC ? Code::kNoSpace : Code::kIo, "cannot create " + dir + ": " + std::strerror(err));
}

constexpr const char* kFsIdFile = "filesystem.id";

std::string bucket_name(uint32_t bucket) {
  char name[8];
  std::snprintf(name, sizeof(name), "%02x", bucket);
  return name;
}

// The number a whole string spells in decimal ("17"); nullopt for anything else ("3.tmp", "junk").
std::optional<uint64_t> decimal(std::string_view text) {
  uint64_t v = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  return v;
}

Status fsync_dir(const std::string& dir);

// Layout 1 -> 2: every "<bucket>/<ino>/0" becomes "<bucket>/<ino>.0", and an inode directory left
// empty is removed; then each changed bucket is fsynced. Each step is a rename or rmdir, so a crash
// leaves every chunk under exactly one of its names, and running it again finishes the job.
Status move_first_chunks(const std::string& chunks) {
  uint64_t moved = 0;
  for (uint32_t b = 0; b < Target::kBuckets; ++b) {
    const std::string bucket = chunks + "/" + bucket_name(b);
    DIR* d = ::opendir(bucket.c_str());
    if (d == nullptr) return Status(Code::kIo, "cannot list " + bucket + ": " + std::strerror(errno));
    std::vector<std::string> inodes;
    while (dirent* e = ::readdir(d)) {
      if (decimal(e->d_name).has_value()) inodes.emplace_back(e->d_name);
    }
    ::closedir(d);
    bool changed = false;
    for (const std::string& ino : inodes) {
      const std::string dir = bucket + "/" + ino;
      struct stat st {};
      if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
      const std::string from = dir + "/0";
      const std::string to = dir + ".0";
      if (::rename(from.c_str(), to.c_str()) == 0) {
        ++moved;
        changed = true;
      } else if (errno != ENOENT) {
        return Status(Code::kIo, "cannot move " + from + " to " + to + ": " + std::strerror(errno));
      }
      const std::string tmp = dir + "/0.tmp";  // a creation cut off by a crash: never a chunk
      ::unlink(tmp.c_str());
      if (::rmdir(dir.c_str()) == 0) changed = true;  // ENOTEMPTY: chunks 1 and up stay there
    }
    if (changed) PENSTOCK_RETURN_IF_ERROR(fsync_dir(bucket));
  }
  PENSTOCK_LOG(Info) << "moved " << moved << " chunk(s) of " << chunks << " to chunk layout " << Target::kLayoutVersion
                     << " (chunk 0 of each inode in its bucket)";
  return Status::ok();
}

Status fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status(Code::kIo, "cannot open " + dir + ": " + std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return Status(Code::kIo, "cannot fsync " + dir + ": " + std::strerror(err));
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Target>> Target::open(const std::string& dir) {
  PENSTOCK_RETURN_IF_ERROR(daemon::ensure_directory(dir));
  std::string path = dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::string uuid_file = path + "/target.uuid";
  std::string uuid;
  auto existing = daemon::read_small_file(uuid_file);
  if (existing.has_value()) {
    uuid = *existing;
    if (!daemon::is_uuid(uuid)) {
      return Status(Code::kCorrupt, uuid_file + " does not hold a target uuid (32 hex digits); "
                                    "restore it from a backup or point --target at another directory");
    }
  } else {
    struct stat st {};
    if (::stat(uuid_file.c_str(), &st) == 0) {
      return Status(Code::kIo, "cannot read " + uuid_file + "; check its permissions");
    }
    uuid = daemon::random_uuid();
    PENSTOCK_RETURN_IF_ERROR(daemon::write_small_file_durably(uuid_file, uuid));
    PENSTOCK_LOG(Info) << "initialised new target " << path << " uuid " << uuid;
  }
  bool created = false;
  std::string chunks = path + "/chunks";
  PENSTOCK_RETURN_IF_ERROR(make_dir(chunks, &created));
  bool bucket_created = false;
  for (uint32_t b = 0; b < kBuckets; ++b) {
    PENSTOCK_RETURN_IF_ERROR(make_dir(chunks + "/" + bucket_name(b), &bucket_created));
  }
  // Buckets are made once; later chunk creation only has to sync the inode and bucket directories.
  if (bucket_created) PENSTOCK_RETURN_IF_ERROR(fsync_dir(chunks));
  if (created) PENSTOCK_RETURN_IF_ERROR(fsync_dir(path));
  // A target without `layout` is new (nothing in its chunk tree) or was written before layouts
  // were numbered (layout 1).
  const std::string layout_file = path + "/layout";
  uint32_t layout = created ? kLayoutVersion : 1;
  auto text = daemon::read_small_file(layout_file);
  if (struct stat st {}; !text.has_value() && ::stat(layout_file.c_str(), &st) == 0) {
    return Status(Code::kIo, "cannot read " + layout_file + "; check its permissions");
  }
  if (text.has_value()) {
    const std::optional<uint64_t> number = decimal(*text);
    if (!number.has_value() || *number == 0 || *number > UINT32_MAX) {
      return Status(Code::kCorrupt, layout_file + " does not hold a layout number; restore it (\"" +
                                        std::to_string(kLayoutVersion) + "\" for a target of this build)");
    }
    const uint32_t v = static_cast<uint32_t>(*number);
    if (v > kLayoutVersion) {
      return Status(Code::kInvalid, path + " has chunk layout " + std::to_string(v) + ", newer than this penstock-data (" +
                                        std::to_string(kLayoutVersion) + "); run a newer penstock-data on it");
    }
    layout = v;
  }
  if (layout < kLayoutVersion) PENSTOCK_RETURN_IF_ERROR(move_first_chunks(chunks));
  if (!text.has_value() || layout < kLayoutVersion) {
    PENSTOCK_RETURN_IF_ERROR(daemon::write_small_file_durably(layout_file, std::to_string(kLayoutVersion)));
  }
  const std::string fs_file = path + "/" + kFsIdFile;
  std::string fs_id;
  if (auto stored = daemon::read_small_file(fs_file); stored.has_value()) {
    if (!daemon::is_uuid(*stored)) {
      return Status(Code::kCorrupt, fs_file + " does not hold a file-system id (32 hex digits); restore it, or "
                                              "remove it if this target is empty");
    }
    fs_id = *stored;
  } else if (struct stat st {}; ::stat(fs_file.c_str(), &st) == 0) {
    return Status(Code::kIo, "cannot read " + fs_file + "; check its permissions");
  }
  return std::unique_ptr<Target>(new Target(std::move(path), std::move(uuid), std::move(fs_id)));
}

bool Target::has_chunks() const {
  for (uint32_t b = 0; b < kBuckets; ++b) {
    const std::string dir = bucket_path(b);
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return true;
    bool found = false;
    while (dirent* e = ::readdir(d)) {
      const std::string_view name(e->d_name);
      if (name != "." && name != "..") {
        found = true;
        break;
      }
    }
    ::closedir(d);
    if (found) return true;
  }
  return false;
}

std::string Target::fs_id() const {
  std::lock_guard lock(fs_mu_);
  return fs_id_;
}

Status Target::claim(const std::string& id) {
  if (!daemon::is_uuid(id)) return Status(Code::kInvalid, "'" + id + "' is not a file-system id (32 lowercase hex digits)");
  std::lock_guard lock(fs_mu_);
  if (fs_id_ == id) return Status::ok();
  if (!fs_id_.empty()) {
    return Status(Code::kInvalid, "target " + path_ + " belongs to file system " + fs_id_ + ", not " + id +
                                      "; start this data server with that file system's --meta");
  }
  PENSTOCK_RETURN_IF_ERROR(daemon::write_small_file_durably(path_ + "/" + kFsIdFile, id));
  fs_id_ = id;
  PENSTOCK_LOG(Info) << "target " << path_ << " now belongs to file system " << id;
  return Status::ok();
}

Result<Target::Space> Target::space() const {
  PENSTOCK_ASSIGN_OR_RETURN(daemon::DiskSpace d, daemon::disk_space(path_));
  return Space{d.total, d.free};
}

std::string Target::bucket_path(uint32_t bucket) const { return path_ + "/chunks/" + bucket_name(bucket); }

std::string Target::bucket_dir(InodeId ino) const { return bucket_path(static_cast<uint32_t>(ino.value % kBuckets)); }

std::string Target::inode_dir(InodeId ino) const { return bucket_dir(ino) + "/" + std::to_string(ino.value); }

std::string Target::chunk_dir(InodeId ino, uint64_t chunk_index) const {
  return chunk_index == 0 ? bucket_dir(ino) : inode_dir(ino);
}

std::string Target::chunk_path(InodeId ino, uint64_t chunk_index) const {
  if (chunk_index == 0) return inode_dir(ino) + ".0";
  return inode_dir(ino) + "/" + std::to_string(chunk_index);
}

Result<std::vector<uint64_t>> Target::list_chunks(InodeId ino) const {
  std::vector<uint64_t> out;
  const std::string first = chunk_path(ino, 0);
  struct stat st {};
  if (::stat(first.c_str(), &st) == 0) {
    out.push_back(0);
  } else if (errno != ENOENT) {
    return Status(Code::kIo, "cannot stat " + first + ": " + std::strerror(errno));
  }
  std::string dir = inode_dir(ino);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return out;
    return Status(Code::kIo, "cannot list " + dir + ": " + std::strerror(errno));
  }
  while (dirent* e = ::readdir(d)) {
    std::optional<uint64_t> index = decimal(e->d_name);
    if (index.has_value() && *index > 0) out.push_back(*index);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

Result<std::vector<InodeId>> Target::list_inodes(uint32_t bucket, InodeId after, size_t max, bool* more) const {
  *more = false;
  if (bucket >= kBuckets) {
    return Status(Code::kInvalid, "bucket " + std::to_string(bucket) + " is out of range (0 to " +
                                      std::to_string(kBuckets - 1) + ")");
  }
  const std::string dir = bucket_path(bucket);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status(Code::kIo, "cannot list " + dir + ": " + std::strerror(errno));
  std::vector<uint64_t> found;
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    // "<ino>", "<ino>.0" or "<ino>.0.tmp": the inode is the decimal before the first dot.
    const std::string_view name(e->d_name);
    std::optional<uint64_t> ino = decimal(name.substr(0, name.find('.')));
    if (ino.has_value() && *ino > after.value && *ino % kBuckets == bucket) found.push_back(*ino);
  }
  const int err = errno;
  ::closedir(d);
  if (err != 0) return Status(Code::kIo, "cannot list " + dir + ": " + std::strerror(err));
  std::sort(found.begin(), found.end());
  found.erase(std::unique(found.begin(), found.end()), found.end());
  if (found.size() > max) {
    found.resize(max);
    *more = true;
  }
  std::vector<InodeId> out;
  out.reserve(found.size());
  for (uint64_t ino : found) out.emplace_back(ino);
  return out;
}

}  // namespace penstock::data
