#include "server/data/target.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "common/base/log.h"
#include "server/daemon/daemon.h"

namespace penstock::data {
namespace {

bool is_uuid(const std::string& s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

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
    if (!is_uuid(uuid)) {
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
    char name[8];
    std::snprintf(name, sizeof(name), "/%02x", b);
    PENSTOCK_RETURN_IF_ERROR(make_dir(chunks + name, &bucket_created));
  }
  // Buckets are made once; later chunk creation only has to sync the inode and bucket directories.
  if (bucket_created) PENSTOCK_RETURN_IF_ERROR(fsync_dir(chunks));
  if (created) PENSTOCK_RETURN_IF_ERROR(fsync_dir(path));
  return std::unique_ptr<Target>(new Target(std::move(path), std::move(uuid)));
}

Result<Target::Space> Target::space() const {
  struct statvfs vfs {};
  if (::statvfs(path_.c_str(), &vfs) != 0) {
    return Status(Code::kIo, "statvfs " + path_ + ": " + std::strerror(errno));
  }
  Space s;
  s.capacity_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  s.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  return s;
}

std::string Target::bucket_dir(InodeId ino) const {
  char name[8];
  std::snprintf(name, sizeof(name), "%02x", static_cast<unsigned>(ino.value % kBuckets));
  return path_ + "/chunks/" + name;
}

std::string Target::inode_dir(InodeId ino) const { return bucket_dir(ino) + "/" + std::to_string(ino.value); }

std::string Target::chunk_path(InodeId ino, uint64_t chunk_index) const {
  return inode_dir(ino) + "/" + std::to_string(chunk_index);
}

Result<std::vector<uint64_t>> Target::list_chunks(InodeId ino) const {
  std::vector<uint64_t> out;
  std::string dir = inode_dir(ino);
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return out;
    return Status(Code::kIo, "cannot list " + dir + ": " + std::strerror(errno));
  }
  while (dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (name.empty() || name[0] == '.') continue;
    uint64_t index = 0;
    auto [ptr, ec] = std::from_chars(name.data(), name.data() + name.size(), index);
    if (ec != std::errc() || ptr != name.data() + name.size()) continue;
    out.push_back(index);
  }
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace penstock::data
