#include "server/daemon/daemon.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <ctime>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

namespace penstock::daemon {

void block_termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
}

namespace {

sigset_t termination_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

std::string signal_name(int sig) { return sig == SIGINT ? "SIGINT" : "SIGTERM"; }

}  // namespace

std::string wait_for_termination_signal() {
  const sigset_t set = termination_signals();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) return signal_name(sig);
  }
}

std::string wait_for_termination_signal(std::chrono::milliseconds timeout) {
  const sigset_t set = termination_signals();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::max<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now(),
                                                         std::chrono::nanoseconds(0));
    const timespec ts{static_cast<time_t>(left.count() / 1'000'000'000), static_cast<long>(left.count() % 1'000'000'000)};
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return signal_name(sig);
    if (errno == EAGAIN) return "";  // timed out
    // EINTR (another signal's handler ran): wait out the rest.
  }
}

Status ensure_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status(Code::kIo, "cannot create directory " + dir + ": " + ec.message());
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return Status(Code::kIo, "cannot stat " + dir + ": " + std::strerror(errno));
  if (!S_ISDIR(st.st_mode)) return Status(Code::kInvalid, dir + " exists and is not a directory; pick another path");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return Status(Code::kPermission, dir + " is not writable by this user; fix its owner or mode");
  }
  return Status::ok();
}

Result<DiskSpace> disk_space(const std::string& path) {
  struct statvfs vfs {};
  if (::statvfs(path.c_str(), &vfs) != 0) {
    return Status(Code::kIo, "cannot read the free space of " + path + ": " + std::strerror(errno));
  }
  DiskSpace s;
  s.total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  s.free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  s.free_inodes = vfs.f_files == 0 ? UINT64_MAX : static_cast<uint64_t>(vfs.f_favail);
  return s;
}

size_t raise_open_file_limit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit raised = rl;
    raised.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) rl = raised;
  }
  return rl.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(rl.rlim_cur);
}

Result<std::string> read_small_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(Code::kNotFound, "cannot read " + path);
  std::string line;
  std::getline(in, line);
  return line;
}

Status write_small_file_durably(const std::string& path, const std::string& contents) {
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status(Code::kIo, "cannot create " + tmp + ": " + std::strerror(errno));
  std::string data = contents + "\n";
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()) && ::fsync(fd) == 0;
  int err = errno;
  ::close(fd);
  if (!ok) return Status(err == ENOSPC ? Code::kNoSpace : Code::kIo, "cannot write " + tmp + ": " + std::strerror(err));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Status(Code::kIo, "cannot rename " + tmp + ": " + std::strerror(errno));
  std::string dir = std::filesystem::path(path).parent_path().string();
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return Status::ok();
}

std::string random_uuid() {
  std::random_device rd;
  std::ostringstream out;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof(buf), "%08x", rd());
    out << buf;
  }
  return out.str();
}

bool is_uuid(const std::string& s) {
  return s.size() == 32 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

}  // namespace penstock::daemon
