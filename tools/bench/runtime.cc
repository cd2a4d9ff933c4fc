#include "tools/bench/runtime.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <optional>
#include <sstream>

#include "common/base/lines.h"
#include "tools/bench/units.h"

namespace penstock::bench {

double now_seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

Status errno_status(const std::string& what, int err) {
  Code code = Code::kIo;
  switch (err) {
    case ENOENT: code = Code::kNotFound; break;
    case EEXIST: code = Code::kExists; break;
    case ENOTDIR: code = Code::kNotDir; break;
    case EISDIR: code = Code::kIsDir; break;
    case ENOTEMPTY: code = Code::kNotEmpty; break;
    case EINVAL: code = Code::kInvalid; break;
    case ENOSPC: code = Code::kNoSpace; break;
    case EACCES: code = Code::kPermission; break;
    case EPERM: code = Code::kNotPermitted; break;
    case EROFS: code = Code::kNotPermitted; break;
    default: break;
  }
  return make_error(code, what + ": " + std::strerror(err));
}

AlignedBuffer::AlignedBuffer(size_t size) : size_(size) {
  const size_t rounded = (size + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded);
  PENSTOCK_CHECK(p != nullptr);
  data_.reset(static_cast<std::byte*>(p));
}

void AlignedBuffer::Free::operator()(std::byte* p) const { std::free(p); }

Status write_all(int fd, const std::byte* buf, size_t len, const std::string& path, uint64_t offset) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = ::write(fd, buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("write " + path + " at offset " + std::to_string(offset + done), errno);
    }
    if (n == 0) {
      return make_error(Code::kIo, "write " + path + " at offset " + std::to_string(offset + done) +
                                       " wrote nothing");
    }
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

Result<size_t> read_full(int fd, std::byte* buf, size_t len, const std::string& path,
                         uint64_t offset, bool positional) {
  size_t done = 0;
  while (done < len) {
    const ssize_t n = positional ? ::pread(fd, buf + done, len - done, static_cast<off_t>(offset + done))
                                 : ::read(fd, buf + done, len - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno_status("read " + path + " at offset " + std::to_string(offset + done), errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

// ---------------------------------------------------------------------------------- Progress

Progress::Progress(bool enabled) : enabled_(enabled) {
  void* p = mmap(nullptr, sizeof(Counters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  PENSTOCK_CHECK(p != MAP_FAILED);
  counters_ = new (p) Counters{};
}

Progress::~Progress() {
  stop();
  munmap(counters_, sizeof(Counters));
}

void Progress::start(std::string label, uint64_t total_bytes) {
  PENSTOCK_CHECK(!running_.load());
  counters_->bytes.store(0);
  counters_->ops.store(0);
  label_ = std::move(label);
  total_ = total_bytes;
  if (!enabled_) return;
  running_.store(true);
  thread_ = std::thread([this] {
    const double t0 = now_seconds();
    while (running_.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      if (!running_.load()) break;
      const double el = now_seconds() - t0;
      const uint64_t b = counters_->bytes.load(std::memory_order_relaxed);
      const uint64_t ops = counters_->ops.load(std::memory_order_relaxed);
      std::string line = "\r\033[K[" + label_ + "] ";
      if (b > 0 || total_ > 0) {
        line += format_size(b);
        if (total_ > 0) line += " / " + format_size(total_);
        line += "  " + format_number(el > 0 ? static_cast<double>(b) / el / 1e6 : 0, 0) + " MB/s";
      }
      line += "  " + std::to_string(ops) + " ops  " + format_number(el, 1) + " s";
      const ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
      (void)ignored;
    }
  });
}

void Progress::stop() {
  if (!running_.exchange(false)) return;
  if (thread_.joinable()) thread_.join();
  const char clear[] = "\r\033[K";
  const ssize_t ignored = ::write(STDERR_FILENO, clear, sizeof clear - 1);
  (void)ignored;
}

// ------------------------------------------------------------------------------ ProcessGroup

namespace {

enum class MsgType : uint32_t { kBarrier = 1, kDone = 2 };

struct Msg {
  MsgType type;
  uint32_t ok;
  uint32_t code;  // Code of a failed rank's Status
  RankReport report;
  char text[1024];
};
static_assert(sizeof(Msg) <= PIPE_BUF, "messages must be written atomically");

bool write_msg(int fd, const Msg& m) {
  const auto* p = reinterpret_cast<const char*>(&m);
  size_t done = 0;
  while (done < sizeof m) {
    const ssize_t n = ::write(fd, p + done, sizeof m - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// 1: a message, 0: end of file, -1: error.
int read_msg(int fd, Msg* m) {
  auto* p = reinterpret_cast<char*>(m);
  size_t done = 0;
  while (done < sizeof *m) {
    const ssize_t n = ::read(fd, p + done, sizeof *m - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    if (n == 0) return 0;
    done += static_cast<size_t>(n);
  }
  return 1;
}

// The error a rank reported, with the rank named and its code kept (kCorrupt decides the exit status).
Status rank_error(size_t rank, const Msg& m) {
  const Code code = code_is_known(m.code) && m.code != 0 ? static_cast<Code>(m.code) : Code::kIo;
  return make_error(code, "rank " + std::to_string(rank) + ": " + std::string(m.text, strnlen(m.text, sizeof m.text)));
}

std::string describe_wait_status(int st) {
  if (WIFEXITED(st)) return "exit status " + std::to_string(WEXITSTATUS(st));
  if (WIFSIGNALED(st)) return std::string("killed by signal ") + strsignal(WTERMSIG(st));
  return "status " + std::to_string(st);
}

}  // namespace

Status Barrier::arrive_and_wait() {
  Msg m{};
  m.type = MsgType::kBarrier;
  m.ok = 1;
  if (!write_msg(to_parent_, m)) return make_error(Code::kCancelled, "run cancelled by the parent");
  char c;
  for (;;) {
    const ssize_t n = ::read(from_parent_, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n == 1) return Status::ok();
    return make_error(Code::kCancelled, "run cancelled by the parent (another rank failed)");
  }
}

ProcessGroup::~ProcessGroup() {
  if (!children_.empty()) {
    abort_all();
    (void)reap_all();
  }
}

Status ProcessGroup::spawn(int n, Body body) {
  PENSTOCK_CHECK(children_.empty());
  std::fflush(stdout);
  std::fflush(stderr);
  for (int rank = 0; rank < n; ++rank) {
    int up[2];
    int down[2];
    if (pipe2(up, O_CLOEXEC) != 0) {
      const Status s = errno_status("pipe", errno);
      abort_all();
      (void)reap_all();
      return s;
    }
    if (pipe2(down, O_CLOEXEC) != 0) {
      const Status s = errno_status("pipe", errno);
      close(up[0]);
      close(up[1]);
      abort_all();
      (void)reap_all();
      return s;
    }
    const pid_t pid = fork();
    if (pid < 0) {
      const Status s = errno_status("fork", errno);
      for (int fd : {up[0], up[1], down[0], down[1]}) close(fd);
      abort_all();
      (void)reap_all();
      return s;
    }
    if (pid == 0) {
      // Child: drop the parent's ends of every pipe so a parent that gives up is seen as EOF.
      signal(SIGPIPE, SIG_IGN);
      for (const Child& c : children_) {
        close(c.from_child);
        close(c.to_child);
      }
      close(up[0]);
      close(down[1]);
      Barrier barrier(up[1], down[0]);
      Result<RankReport> r = body(rank, barrier);
      Msg m{};
      m.type = MsgType::kDone;
      if (r.has_value()) {
        m.ok = 1;
        m.report = *r;
      } else {
        m.ok = 0;
        m.code = static_cast<uint32_t>(r.error().code());
        std::snprintf(m.text, sizeof m.text, "%s", r.error().message().c_str());
      }
      const bool sent = write_msg(up[1], m);
      _exit(sent ? 0 : 1);
    }
    close(up[1]);
    close(down[0]);
    children_.push_back(Child{pid, up[0], down[1]});
  }
  return Status::ok();
}

void ProcessGroup::abort_all() {
  for (Child& c : children_) {
    if (c.to_child >= 0) close(c.to_child);
    if (c.from_child >= 0) close(c.from_child);
    c.to_child = c.from_child = -1;
  }
}

Status ProcessGroup::reap_all() {
  Status first = Status::ok();
  for (size_t i = 0; i < children_.size(); ++i) {
    int st = 0;
    pid_t r;
    do {
      r = waitpid(children_[i].pid, &st, 0);
    } while (r < 0 && errno == EINTR);
    if (r == children_[i].pid && !(WIFEXITED(st) && WEXITSTATUS(st) == 0) && first.is_ok()) {
      first = make_error(Code::kInternal,
                         "rank " + std::to_string(i) + " ended with " + describe_wait_status(st));
    }
  }
  children_.clear();
  return first;
}

Result<double> ProcessGroup::wait_barrier() {
  Status failure = Status::ok();
  for (size_t i = 0; i < children_.size() && failure.is_ok(); ++i) {
    Msg m{};
    const int r = read_msg(children_[i].from_child, &m);
    if (r == 1 && m.type == MsgType::kBarrier) continue;
    if (r == 1 && m.type == MsgType::kDone && !m.ok) {
      failure = rank_error(i, m);
    } else if (r == 1) {
      failure = make_error(Code::kInternal, "rank " + std::to_string(i) + " finished before a barrier");
    } else {
      failure = make_error(Code::kInternal, "rank " + std::to_string(i) + " exited without reporting");
    }
  }
  if (!failure.is_ok()) {
    abort_all();
    const Status reaped = reap_all();
    if (failure.code() == Code::kInternal && !reaped.is_ok()) return reaped;
    return failure;
  }
  return now_seconds();
}

Status ProcessGroup::release() {
  for (Child& c : children_) {
    const char go = 'g';
    ssize_t n;
    do {
      n = ::write(c.to_child, &go, 1);
    } while (n < 0 && errno == EINTR);
    if (n != 1) {
      const Status s = errno_status("release rank processes", errno);
      abort_all();
      (void)reap_all();
      return s;
    }
  }
  return Status::ok();
}

Result<std::vector<RankReport>> ProcessGroup::finish() {
  std::vector<RankReport> out;
  Status failure = Status::ok();
  for (size_t i = 0; i < children_.size(); ++i) {
    Msg m{};
    const int r = read_msg(children_[i].from_child, &m);
    if (!failure.is_ok()) continue;
    if (r == 1 && m.type == MsgType::kDone && m.ok) {
      out.push_back(m.report);
    } else if (r == 1 && m.type == MsgType::kDone) {
      failure = rank_error(i, m);
      abort_all();  // ranks still waiting at a barrier give up
    } else if (r == 1) {
      failure = make_error(Code::kInternal, "rank " + std::to_string(i) + " waits at an unexpected barrier");
      abort_all();
    } else {
      failure = make_error(Code::kInternal, "rank " + std::to_string(i) + " exited without reporting");
      abort_all();
    }
  }
  abort_all();
  const Status reaped = reap_all();
  if (!failure.is_ok()) {
    if (failure.code() == Code::kInternal && !reaped.is_ok()) return reaped;
    return failure;
  }
  if (!reaped.is_ok()) return reaped;
  return out;
}

// ----------------------------------------------------------------------------- caches, mounts

namespace {

// /proc/mounts escapes space, tab, newline and backslash as octal.
std::string unescape_mount_path(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      const std::string oct = s.substr(i + 1, 3);
      if (oct.size() == 3 && oct.find_first_not_of("01234567") == std::string::npos) {
        out.push_back(static_cast<char>(std::stoi(oct, nullptr, 8)));
        i += 3;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool path_under(const std::string& path, const std::string& mount) {
  if (mount == "/") return true;
  if (path.compare(0, mount.size(), mount) != 0) return false;
  return path.size() == mount.size() || path[mount.size()] == '/';
}

}  // namespace

std::string fstype_for_path(const std::string& mounts, const std::string& path) {
  std::istringstream in(mounts);
  std::string line;
  std::string best_mount;
  std::string best_type;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string dev, mnt, type;
    if (!(fields >> dev >> mnt >> type)) continue;
    mnt = unescape_mount_path(mnt);
    // The last matching entry of equal length wins: later mounts hide earlier ones.
    if (path_under(path, mnt) && mnt.size() >= best_mount.size()) {
      best_mount = mnt;
      best_type = type;
    }
  }
  return best_type;
}

namespace {

// The whole text of a small file (/proc files); std::nullopt when it cannot be opened.
std::optional<std::string> read_text(const char* path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string mount_fstype(const std::string& dir) {
  char* real = realpath(dir.c_str(), nullptr);
  if (real == nullptr) return "";
  const std::string path(real);
  std::free(real);
  return fstype_for_path(read_text("/proc/mounts").value_or(""), path);
}

bool is_penstock_fstype(const std::string& fstype) {
  return fstype == "fuse.penstock" || fstype == "fuse.penstock-mount";
}

namespace {

std::atomic<int> g_penstock_drops{0};

// The names client/lib/layout_text.h serves on every inode of a mount (penstock-bench links only
// common/base, so they are repeated here; the integration test checks they still work).
constexpr const char* kPenstockLayoutXattr = "user.penstock.layout";
constexpr const char* kPenstockDropCachesXattr = "user.penstock.drop_caches";

}  // namespace

bool is_penstock_dir(const std::string& dir) {
  if (is_penstock_fstype(mount_fstype(dir))) return true;
  // Mounted under another name (a bind mount, a renamed fstype): the virtual layout xattr answers
  // only on Penstock. Reading never changes anything, whatever the file system.
  char buf[256];
  return ::getxattr(dir.c_str(), kPenstockLayoutXattr, buf, sizeof buf) >= 0;
}

Status drop_penstock_caches(const std::string& dir) {
  if (::setxattr(dir.c_str(), kPenstockDropCachesXattr, "1", 1, 0) == 0) {
    g_penstock_drops.fetch_add(1);
    return Status::ok();
  }
  const int err = errno;
  std::string advice;
  if (err == EPERM || err == EACCES) {
    advice = "only root or the user who mounted it may drop a Penstock mount's caches: run as that user";
  } else if (err == ENOTSUP || err == EOPNOTSUPP) {
    advice = "this penstock-mount predates user.penstock.drop_caches: upgrade and remount it";
  } else {
    advice = "the mount or a data server failed; see the penstock-mount log";
  }
  return make_error(Code::kIo, std::string("--drop-caches: dropping the Penstock caches of ") + dir + " (setxattr " +
                                   kPenstockDropCachesXattr + ") failed: " + std::strerror(err) + "; " + advice +
                                   ", or leave out --drop-caches");
}

int penstock_cache_drops() { return g_penstock_drops.load(); }

Status drop_caches(const std::string& dir) {
  sync();
  // Penstock first: the mount and the data servers drop theirs (servers write their dirty pages
  // back first), then the kernel drops what is left, the mount's own page cache included.
  if (is_penstock_dir(dir)) PENSTOCK_RETURN_IF_ERROR(drop_penstock_caches(dir));
  const int fd = ::open("/proc/sys/vm/drop_caches", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return make_error(Code::kPermission,
                      std::string("--drop-caches: cannot open /proc/sys/vm/drop_caches for writing (") +
                          std::strerror(err) +
                          "): run penstock-bench as root on a host (not in an unprivileged container), "
                          "or leave out --drop-caches");
  }
  const ssize_t n = ::write(fd, "3", 1);
  const int err = errno;
  close(fd);
  if (n != 1) {
    return make_error(Code::kPermission,
                      std::string("--drop-caches: writing 3 to /proc/sys/vm/drop_caches failed (") +
                          std::strerror(err) + "): run as root, or leave out --drop-caches");
  }
  return Status::ok();
}

Result<uint64_t> busy_ticks_from_proc_stat(std::string_view text) {
  // The aggregate line: "cpu  user nice system idle iowait irq softirq steal guest guest_nice".
  LineReader lines(text);
  std::string_view line;
  while (lines.next(&line)) {
    if (line.size() < 4 || line.substr(0, 4) != "cpu ") continue;
    uint64_t f[8] = {};
    size_t i = 3;
    int got = 0;
    while (got < 8) {
      while (i < line.size() && line[i] == ' ') ++i;
      if (i >= line.size()) break;
      size_t j = i;
      uint64_t v = 0;
      while (j < line.size() && line[j] >= '0' && line[j] <= '9') v = v * 10 + static_cast<uint64_t>(line[j++] - '0');
      if (j == i) return make_error(Code::kInvalid, "/proc/stat: the cpu line has a field that is not a number");
      f[got++] = v;
      i = j;
    }
    // Kernels since 2.6.11 have all eight; older ones lack steal (then 0).
    if (got < 7) return make_error(Code::kInvalid, "/proc/stat: the cpu line has fewer than 7 fields");
    // user + nice + system + irq + softirq + steal; idle and iowait are not busy, and guest time
    // is already counted in user.
    return f[0] + f[1] + f[2] + f[5] + f[6] + f[7];
  }
  return make_error(Code::kInvalid, "/proc/stat has no aggregate \"cpu \" line");
}

Result<double> machine_busy_cpu_seconds() {
  const std::optional<std::string> text = read_text("/proc/stat");
  if (!text.has_value()) return make_error(Code::kIo, "cannot read /proc/stat");
  PENSTOCK_ASSIGN_OR_RETURN(uint64_t ticks, busy_ticks_from_proc_stat(*text));
  const long hz = ::sysconf(_SC_CLK_TCK);
  return static_cast<double>(ticks) / static_cast<double>(hz > 0 ? hz : 100);
}

std::string timestamp_name(const std::string& prefix) {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm t;
  gmtime_r(&ts.tv_sec, &t);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d%02d%02dT%02d%02d%02d.%06ld", t.tm_year + 1900, t.tm_mon + 1,
                t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec, ts.tv_nsec / 1000);
  return prefix + "-" + buf;
}

Status make_dirs(const std::string& path) {
  std::string cur;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t next = path.find('/', pos);
    const size_t end = next == std::string::npos ? path.size() : next;
    cur = path.substr(0, end);
    pos = end + 1;
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return errno_status("mkdir " + cur, errno);
    if (next == std::string::npos) break;
  }
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_status("stat " + path, errno);
  if (!S_ISDIR(st.st_mode)) return make_error(Code::kNotDir, path + " exists and is not a directory");
  return Status::ok();
}

Status remove_tree(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::ok();
    return errno_status("stat " + path, errno);
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* d = ::opendir(path.c_str());
    if (d == nullptr) return errno_status("opendir " + path, errno);
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
    for (const std::string& name : names) PENSTOCK_RETURN_IF_ERROR(remove_tree(path + "/" + name));
    if (::rmdir(path.c_str()) != 0) return errno_status("rmdir " + path, errno);
    return Status::ok();
  }
  if (::unlink(path.c_str()) != 0) return errno_status("unlink " + path, errno);
  return Status::ok();
}

Result<uint64_t> file_size(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return errno_status("stat " + path, errno);
  if (!S_ISREG(st.st_mode)) return make_error(Code::kInvalid, path + " is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace penstock::bench
