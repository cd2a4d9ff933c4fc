#include "server/meta/disk_reserve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace penstock::meta {

uint64_t DiskReserve::default_bytes(uint64_t fs_total) { return std::min<uint64_t>(uint64_t{256} << 20, fs_total / 20); }

DiskReserve::DiskReserve(DiskReserveOptions options) : options_(std::move(options)) {}

bool DiskReserve::held() const {
  struct stat st {};
  return ::stat(ballast_path().c_str(), &st) == 0;
}

Status DiskReserve::ensure(bool* made) {
  *made = false;
  const std::string path = ballast_path();
  // Made under another name and renamed, so that a crash midway never leaves a short ballast; one
  // such crash's leftover goes first.
  const std::string tmp = path + ".tmp";
  ::unlink(tmp.c_str());
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    // Its size and its blocks (a sparse copy holds no room).
    if (static_cast<uint64_t>(st.st_size) == options_.bytes && static_cast<uint64_t>(st.st_blocks) * 512 >= options_.bytes) {
      return Status::ok();
    }
    ::unlink(path.c_str());  // another size was asked for (0: none), or it holds no room
  }
  if (options_.bytes == 0) return Status::ok();
  PENSTOCK_ASSIGN_OR_RETURN(daemon::DiskSpace space, options_.space(options_.dir));
  if (space.free / 2 < options_.bytes) return Status::ok();
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status(Code::kIo, "cannot create " + tmp + ": " + std::strerror(errno));
  // posix_fallocate: fallocate(2), or where the file system lacks it, glibc writes each block.
  int err = 0;
  do {
    err = ::posix_fallocate(fd, 0, static_cast<off_t>(options_.bytes));
  } while (err == EINTR);
  ::close(fd);
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) != 0) err = errno;
  if (err == 0) {
    *made = true;
    return Status::ok();
  }
  ::unlink(tmp.c_str());
  if (err == ENOSPC) return Status::ok();  // the room went meanwhile: not made
  return Status(Code::kIo, "cannot make the ballast file " + path + ": " + std::strerror(err));
}

uint64_t DiskReserve::release() {
  uint64_t freed = 0;
  for (const std::string& path : {ballast_path(), ballast_path() + ".tmp"}) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && ::unlink(path.c_str()) == 0) freed += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  return freed;
}

uint64_t DiskReserve::reopen_bytes() const {
  uint64_t logs = 0;
  uint64_t manifest = 0;
  std::error_code ec;
  // increment(ec), not a range-for: that throws when reading the directory fails.
  for (std::filesystem::directory_iterator it(options_.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& e = *it;
    const std::string name = e.path().filename().string();
    const bool is_log = e.path().extension() == ".log";
    const bool is_manifest = name.rfind("MANIFEST-", 0) == 0;
    if (!is_log && !is_manifest) continue;
    std::error_code size_ec;
    const uint64_t n = e.file_size(size_ec);
    if (size_ec) continue;
    if (is_log) logs += n;
    if (is_manifest) manifest = std::max(manifest, n);  // the open writes the live one anew
  }
  return logs + manifest + kReopenMargin;
}

Result<bool> DiskReserve::ready_to_reopen(uint64_t* need, uint64_t* free) const {
  *need = reopen_bytes();
  PENSTOCK_ASSIGN_OR_RETURN(daemon::DiskSpace space, options_.space(options_.dir));
  *free = space.free;
  return space.free >= *need && space.free_inodes >= kReopenInodes;
}

}  // namespace penstock::meta
