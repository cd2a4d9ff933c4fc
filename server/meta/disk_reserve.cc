#include "server/meta/disk_reserve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace penstock::meta {

Result<DiskSpace> disk_space_of(const std::string& dir) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    return Status(Code::kIo, "cannot read the free space of " + dir + ": " + std::strerror(errno));
  }
  DiskSpace s;
  s.total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  const uint64_t blocks = ::geteuid() == 0 ? vfs.f_bfree : vfs.f_bavail;
  s.free = blocks * vfs.f_frsize;
  return s;
}

uint64_t DiskReserve::default_bytes(uint64_t fs_total) { return std::min<uint64_t>(uint64_t{256} << 20, fs_total / 20); }

DiskReserve::DiskReserve(DiskReserveOptions options) : options_(std::move(options)) {}

bool DiskReserve::held() const {
  struct stat st {};
  return ::stat(ballast_path().c_str(), &st) == 0;
}

Status DiskReserve::ensure(bool* made) {
  *made = false;
  if (options_.bytes == 0 || held()) return Status::ok();
  PENSTOCK_ASSIGN_OR_RETURN(DiskSpace space, options_.space(options_.dir));
  if (space.free / 2 < options_.bytes) return Status::ok();
  const std::string path = ballast_path();
  // Made under another name and renamed: a crash midway never leaves a short ballast behind.
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return Status(Code::kIo, "cannot create " + tmp + ": " + std::strerror(errno));
  int rc = 0;
  do {
    rc = ::fallocate(fd, 0, 0, static_cast<off_t>(options_.bytes));
  } while (rc != 0 && errno == EINTR);
  const int err = rc == 0 ? 0 : errno;
  ::close(fd);
  if (err == 0 && ::rename(tmp.c_str(), path.c_str()) == 0) {
    *made = true;
    return Status::ok();
  }
  const int why = err != 0 ? err : errno;
  ::unlink(tmp.c_str());
  if (why == ENOSPC) return Status::ok();  // the room went meanwhile: not made
  return Status(why == EOPNOTSUPP ? Code::kNotSupported : Code::kIo,
                std::string(err != 0 ? "cannot allocate " : "cannot rename to ") + path + ": " + std::strerror(why));
}

uint64_t DiskReserve::release() {
  const std::string path = ballast_path();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  if (::unlink(path.c_str()) != 0) return 0;
  return static_cast<uint64_t>(st.st_blocks) * 512;
}

uint64_t DiskReserve::log_bytes() const {
  uint64_t sum = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(options_.dir, ec)) {
    if (e.path().extension() != ".log") continue;
    std::error_code size_ec;
    const uintmax_t n = e.file_size(size_ec);
    if (!size_ec) sum += n;
  }
  return sum;
}

Result<bool> DiskReserve::ready_to_reopen(uint64_t* need, uint64_t* free) const {
  PENSTOCK_ASSIGN_OR_RETURN(DiskSpace space, options_.space(options_.dir));
  *need = log_bytes() + kReopenMargin;
  *free = space.free;
  return space.free >= *need;
}

}  // namespace penstock::meta
