#include "tests/support/cluster.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>

#ifndef PENSTOCK_SOURCE_ROOT
#error "build with -DPENSTOCK_SOURCE_ROOT=\"...\" (tests/support/meson.build does)"
#endif
#ifndef PENSTOCK_BUILD_ROOT
#error "build with -DPENSTOCK_BUILD_ROOT=\"...\" (tests/support/meson.build does)"
#endif

extern char** environ;

namespace penstock::testing {
namespace {

namespace fs = std::filesystem;

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : std::string(fallback);
}

std::string local_cluster_script() { return source_dir() + "/deploy/local-cluster"; }

// ------------------------------------------------------------------------------------------
// Emergency cleanup: a fixed table the signal handler can read without allocating.

constexpr int kMaxClusters = 16;
constexpr size_t kPathMax = 4096;

struct Slot {
  std::atomic<bool> used{false};
  char script[kPathMax] = {};
  char state[kPathMax] = {};
};

std::array<Slot, kMaxClusters> g_slots;
std::mutex g_slots_mu;  // guards slot allocation only; the handler reads `used` atomically
std::once_flag g_handlers_once;

// Runs `script down --state state` and waits for it. Only async-signal-safe calls.
void run_down_signal_safe(const Slot& slot) {
  pid_t pid = fork();
  if (pid == 0) {
    char down[] = "down";
    char flag[] = "--state";
    char* argv[] = {const_cast<char*>(slot.script), down, flag, const_cast<char*>(slot.state),
                    nullptr};
    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
      dup2(devnull, 0);
    }
    execve(slot.script, argv, environ);
    _exit(127);
  }
  if (pid > 0) {
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
}

void down_all_signal_safe() {
  for (auto& slot : g_slots) {
    if (slot.used.load()) {
      run_down_signal_safe(slot);
      slot.used.store(false);
    }
  }
}

void on_fatal_signal(int sig) {
  static const char kMsg[] = "\n[cluster] caught a termination signal: stopping test clusters\n";
  ssize_t ignored = write(2, kMsg, sizeof(kMsg) - 1);
  (void)ignored;
  down_all_signal_safe();
  signal(sig, SIG_DFL);
  raise(sig);
}

void on_exit_cleanup() { down_all_signal_safe(); }

void install_handlers() {
  std::call_once(g_handlers_once, [] {
    std::atexit(on_exit_cleanup);
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      sigaction(sig, &sa, nullptr);
    }
  });
}

int register_cluster(const std::string& script, const std::string& state) {
  install_handlers();
  std::lock_guard<std::mutex> lock(g_slots_mu);
  if (script.size() >= kPathMax || state.size() >= kPathMax) {
    return -1;
  }
  for (int i = 0; i < kMaxClusters; ++i) {
    if (!g_slots[i].used.load()) {
      std::memcpy(g_slots[i].script, script.c_str(), script.size() + 1);
      std::memcpy(g_slots[i].state, state.c_str(), state.size() + 1);
      g_slots[i].used.store(true);
      return i;
    }
  }
  return -1;
}

void unregister_cluster(int slot) {
  if (slot >= 0 && slot < kMaxClusters) {
    g_slots[slot].used.store(false);
  }
}

// ------------------------------------------------------------------------------------------
// Watchdog: a process in its own session that runs `local-cluster down` when the test process
// disappears without saying "done" (its end of the pipe closes).

struct Watchdog {
  pid_t pid = -1;
  int fd = -1;  // write end; "done\n" then close means a clean shutdown
};

Watchdog start_watchdog(const std::string& script, const std::string& state,
                        const std::string& dir) {
  Watchdog w;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    return w;
  }
  std::string log = dir + "/watchdog.log";
  // The script: wait for a line or EOF; unless it is "done", stop the cluster and, when nothing
  // is mounted below dir any more, remove dir.
  static const char kScript[] =
      "IFS= read -r word || true\n"
      "[ \"$word\" = done ] && exit 0\n"
      "echo \"watchdog: test process gone; stopping the cluster in $2\"\n"
      "\"$1\" down --state \"$2\"\n"
      "if awk -v d=\"$3/\" 'index($5, d) == 1 { f = 1 } END { exit f }' /proc/self/mountinfo; then\n"
      "  rm -rf -- \"$3\"\n"
      "fi\n";
  std::vector<std::string> args = {"/bin/bash", "-c", kScript, "penstock-watchdog", script, state,
                                   dir};
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setsid();
    dup2(fds[0], 0);
    int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (out < 0) {
      out = open("/dev/null", O_WRONLY);
    }
    dup2(out, 1);
    dup2(out, 2);
    close_range(3, ~0U, 0);
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    execve(argv[0], argv.data(), environ);
    _exit(127);
  }
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    return w;
  }
  w.pid = pid;
  w.fd = fds[1];
  return w;
}

void stop_watchdog(Watchdog* w) {
  if (w->fd >= 0) {
    static const char kDone[] = "done\n";
    ssize_t ignored = write(w->fd, kDone, sizeof(kDone) - 1);
    (void)ignored;
    close(w->fd);
    w->fd = -1;
  }
  if (w->pid > 0) {
    int status = 0;
    while (waitpid(w->pid, &status, 0) < 0 && errno == EINTR) {
    }
    w->pid = -1;
  }
}

// One watchdog per cluster slot; kept outside Cluster so the header stays small.
std::array<Watchdog, kMaxClusters> g_watchdogs;

std::string unescape_mountinfo(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] == '\\' && i + 3 < in.size()) {
      int v = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = in[i + k];
        if (c < '0' || c > '7') {
          ok = false;
          break;
        }
        v = v * 8 + (c - '0');
      }
      if (ok) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(in[i]);
  }
  return out;
}

std::vector<std::string> mount_points() {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string f;
    for (int i = 0; i < 5 && (fields >> f); ++i) {
    }
    out.push_back(unescape_mountinfo(f));
  }
  return out;
}

// True when `dir` or anything below it is a mount point, not counting those below `except` (when
// given): the state directory, where a test may mount small file systems of its own
// (ClusterOptions::before_first_up).
bool anything_mounted_below(const std::string& dir, const std::string& except = "") {
  std::string prefix = dir + "/";
  for (const auto& m : mount_points()) {
    if (!except.empty() && m.rfind(except + "/", 0) == 0) continue;
    if (m == dir || m.rfind(prefix, 0) == 0) {
      return true;
    }
  }
  return false;
}

// Removes everything below `dir` but `dir` itself and the mount points in it, which are emptied
// instead (a test's own mounts under the state directory, ClusterOptions::before_first_up).
void empty_keeping_mounts(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_mount_point(entry.path().string())) {
      empty_keeping_mounts(entry.path().string());
    } else {
      fs::remove_all(entry.path(), ec);
    }
  }
}

std::string tail_of_file(const std::string& path, int lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) {
    all.push_back(line);
  }
  std::string out;
  size_t start = all.size() > static_cast<size_t>(lines) ? all.size() - lines : 0;
  for (size_t i = start; i < all.size(); ++i) {
    out += all[i];
    out += '\n';
  }
  return out;
}

}  // namespace

std::string build_dir() { return env_or("PENSTOCK_BUILD", PENSTOCK_BUILD_ROOT); }
std::string source_dir() { return env_or("PENSTOCK_SOURCE", PENSTOCK_SOURCE_ROOT); }

CommandResult run_command(const std::vector<std::string>& argv_in, int timeout_s,
                          const std::vector<std::string>& extra_env) {
  CommandResult result;
  auto start = std::chrono::steady_clock::now();
  if (argv_in.empty()) {
    result.exit_code = 127;
    result.output = "run_command: empty argv";
    return result;
  }
  // Build argv and envp before fork: the child may only make async-signal-safe calls.
  std::vector<std::string> args = argv_in;
  std::vector<char*> argv;
  for (auto& a : args) {
    argv.push_back(a.data());
  }
  argv.push_back(nullptr);
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    bool overridden = false;
    for (const auto& x : extra_env) {
      auto eq = x.find('=');
      if (eq != std::string::npos && entry.compare(0, eq + 1, x, 0, eq + 1) == 0) {
        overridden = true;
      }
    }
    if (!overridden) {
      env_strings.push_back(entry);
    }
  }
  for (const auto& x : extra_env) {
    env_strings.push_back(x);
  }
  std::vector<char*> envp;
  for (auto& e : env_strings) {
    envp.push_back(e.data());
  }
  envp.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    result.exit_code = 127;
    result.output = std::string("run_command: pipe: ") + std::strerror(errno);
    return result;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    result.exit_code = 127;
    result.output = std::string("run_command: fork: ") + std::strerror(errno);
    return result;
  }
  if (pid == 0) {
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      dup2(devnull, 0);
    }
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close_range(3, ~0U, 0);
    signal(SIGPIPE, SIG_DFL);
    execve(argv[0], argv.data(), envp.data());
    static const char kMsg[] = "run_command: exec failed\n";
    ssize_t ignored = write(2, kMsg, sizeof(kMsg) - 1);
    (void)ignored;
    _exit(127);
  }
  close(fds[1]);
  auto deadline = start + std::chrono::seconds(timeout_s);
  bool exited = false;
  int status = 0;
  bool eof = false;
  char buf[4096];
  while (!eof) {
    pollfd p{fds[0], POLLIN, 0};
    int r = poll(&p, 1, 100);
    if (r > 0) {
      ssize_t n = read(fds[0], buf, sizeof(buf));
      if (n > 0) {
        result.output.append(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        eof = true;
      }
    }
    if (!exited && waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
    }
    if (exited && r == 0) {
      break;  // exited and nothing more buffered (a grandchild may keep the pipe open)
    }
    if (!exited && std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      result.timed_out = true;
    }
  }
  close(fds[0]);
  if (!exited) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    result.exit_code = 128 + WTERMSIG(status);
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

int find_free_port_base(int count) {
  std::random_device rd;
  std::mt19937 rng(rd());
  std::uniform_int_distribution<int> pick(20000, 32000 - count - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    int base = pick(rng);
    bool ok = true;
    for (int k = 0; k < count && ok; ++k) {
      int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (s < 0) {
        return 0;
      }
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(base + k));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        ok = false;
      }
      close(s);
    }
    if (ok) {
      return base;
    }
  }
  return 0;
}

bool local_only() {
  const char* d = std::getenv("PENSTOCK_TEST_DIR");
  return d != nullptr && *d != '\0';
}

bool is_mount_point(const std::string& path) {
  for (const auto& m : mount_points()) {
    if (m == path) {
      return true;
    }
  }
  return false;
}

// ------------------------------------------------------------------------------------------
// Cluster

Cluster::Cluster(ClusterOptions options) : options_(options) {}

Cluster::~Cluster() {
  ::testing::AssertionResult r = down();
  if (!r) {
    std::fprintf(stderr, "[cluster] teardown: %s\n", r.message());
  }
  if (!dir_.empty()) {
    if (anything_mounted_below(dir_)) {
      std::fprintf(stderr, "[cluster] something is still mounted below %s; leaving it in place\n",
                   dir_.c_str());
    } else if (std::getenv("PENSTOCK_KEEP_TEST_DIR") == nullptr) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }
  unregister_cluster(registry_slot_);
}

std::string Cluster::meta_addr() const {
  std::ifstream in(state_ + "/cluster.env");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("META_ADDR=", 0) == 0) {
      return line.substr(std::strlen("META_ADDR="));
    }
  }
  return "";
}

pid_t Cluster::pid_of(const std::string& role) const {
  std::ifstream in(state_ + "/pids");
  std::string r;
  long pid = 0;
  while (in >> r >> pid) {
    if (r == role) {
      return static_cast<pid_t>(pid);
    }
  }
  return -1;
}

std::string Cluster::log_tails(int lines) const {
  std::string out;
  std::error_code ec;
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(state_ + "/logs", ec)) {
    logs.push_back(e.path());
  }
  std::sort(logs.begin(), logs.end());
  for (const auto& p : logs) {
    out += "---- " + p.string() + " (last " + std::to_string(lines) + " lines) ----\n";
    out += tail_of_file(p.string(), lines);
  }
  return out;
}

::testing::AssertionResult Cluster::up() {
  if (running_) {
    return ::testing::AssertionSuccess();
  }
  const std::string script = local_cluster_script();
  bool first = dir_.empty();
  if (first) {
    std::string tmp = env_or("TMPDIR", "/tmp") + "/penstock-it-XXXXXX";
    if (mkdtemp(tmp.data()) == nullptr) {
      return ::testing::AssertionFailure() << "mkdtemp " << tmp << ": " << std::strerror(errno);
    }
    dir_ = tmp;
    // Other users (the EACCES tests run as nobody) must be able to reach the mount point.
    chmod(dir_.c_str(), 0755);
    state_ = dir_ + "/state";
    mount_ = dir_ + "/mnt";
    registry_slot_ = register_cluster(script, state_);
    if (registry_slot_ < 0) {
      return ::testing::AssertionFailure() << "too many test clusters at once";
    }
    if (options_.before_first_up) {
      if (mkdir(state_.c_str(), 0755) != 0) {
        return ::testing::AssertionFailure() << "mkdir " << state_ << ": " << std::strerror(errno);
      }
      ::testing::AssertionResult prepared = options_.before_first_up(state_);
      if (!prepared) return prepared;
    }
  }
  CommandResult r;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::vector<std::string> argv = {script, "up", "--state", state_, "--mount", mount_};
    if (first) {
      port_base_ = find_free_port_base(options_.data_servers + 1);
      if (port_base_ == 0) {
        return ::testing::AssertionFailure() << "no free loopback ports";
      }
      argv.insert(argv.end(), {"--data-servers", std::to_string(options_.data_servers),
                               "--port-base", std::to_string(port_base_)});
    }
    r = run_command(argv, 180, command_env());
    if (r.exit_code == 0) {
      break;
    }
    // A port taken between our check and the servers' bind: retry a new cluster on new ports.
    bool port_race = r.output.find("is taken") != std::string::npos ||
                     r.output.find("ddress already in use") != std::string::npos ||
                     log_tails(20).find("ddress already in use") != std::string::npos;
    if (!first || !port_race) {
      break;
    }
    empty_keeping_mounts(state_);
  }
  if (r.exit_code != 0) {
    return ::testing::AssertionFailure()
           << "local-cluster up failed (exit " << r.exit_code << (r.timed_out ? ", timed out" : "")
           << "):\n"
           << r.output << "\n"
           << log_tails();
  }
  running_ = true;
  if (registry_slot_ >= 0) {
    g_watchdogs[registry_slot_] = start_watchdog(script, state_, dir_);
  }
  for (const auto& m : extra_mounts_) {
    auto mr = start_mount(m);
    if (!mr) {
      return mr;
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<std::string> Cluster::command_env() const {
  std::vector<std::string> env = {"PENSTOCK_BUILD=" + build_dir()};
  if (!options_.meta_args.empty()) env.push_back("PENSTOCK_META_ARGS=" + options_.meta_args);
  if (!options_.data_args.empty()) env.push_back("PENSTOCK_DATA_ARGS=" + options_.data_args);
  if (!options_.mount_args.empty()) env.push_back("PENSTOCK_MOUNT_ARGS=" + options_.mount_args);
  return env;
}

::testing::AssertionResult Cluster::restart_meta(bool crash) {
  if (!running_) return ::testing::AssertionFailure() << "restart_meta: the cluster is not running";
  std::vector<std::string> argv = {local_cluster_script(), "restart-meta", "--state", state_};
  if (crash) argv.push_back("--kill");
  CommandResult r = run_command(argv, 60, command_env());
  if (r.exit_code != 0) {
    return ::testing::AssertionFailure() << "local-cluster restart-meta failed (exit " << r.exit_code
                                         << (r.timed_out ? ", timed out" : "") << "):\n"
                                         << r.output << "\n"
                                         << log_tails();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Cluster::start_mount(const std::string& path) {
  CommandResult r = run_command({local_cluster_script(), "mount", "--state", state_, "--mount", path},
                                120, command_env());
  if (r.exit_code != 0) {
    return ::testing::AssertionFailure() << "local-cluster mount " << path << " failed (exit "
                                         << r.exit_code << "):\n"
                                         << r.output << "\n"
                                         << log_tails();
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Cluster::add_mount(std::string* path) {
  if (!running_) {
    return ::testing::AssertionFailure() << "add_mount: the cluster is not running";
  }
  std::string p = dir_ + "/mnt" + std::to_string(extra_mounts_.size() + 2);
  auto r = start_mount(p);
  if (!r) {
    return r;
  }
  extra_mounts_.push_back(p);
  *path = p;
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Cluster::adopt_mount(const std::string& path) {
  std::ofstream out(state_ + "/mounts", std::ios::app);
  out << path << "\n";
  out.flush();
  if (!out) {
    return ::testing::AssertionFailure() << "cannot append to " << state_ << "/mounts";
  }
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult Cluster::down() {
  if (dir_.empty()) {
    return ::testing::AssertionSuccess();
  }
  CommandResult r = run_command({local_cluster_script(), "down", "--state", state_}, 120);
  running_ = false;
  if (registry_slot_ >= 0) {
    stop_watchdog(&g_watchdogs[registry_slot_]);
  }
  if (r.exit_code != 0) {
    return ::testing::AssertionFailure() << "local-cluster down failed (exit " << r.exit_code
                                         << "):\n"
                                         << r.output;
  }
  if (anything_mounted_below(dir_, state_)) {
    return ::testing::AssertionFailure() << "still mounted below " << dir_ << " after down:\n"
                                         << r.output;
  }
  std::string reports = new_sanitizer_reports();
  if (!reports.empty()) {
    return ::testing::AssertionFailure() << "a daemon reported a sanitizer error:\n" << reports;
  }
  return ::testing::AssertionSuccess();
}

std::string Cluster::new_sanitizer_reports() {
  static const char* const kMarkers[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                         "runtime error:", "WARNING: ThreadSanitizer"};
  std::string out;
  std::error_code ec;
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(state_ + "/logs", ec)) {
    logs.push_back(e.path());
  }
  std::sort(logs.begin(), logs.end());
  for (const auto& path : logs) {
    std::ifstream in(path, std::ios::binary);
    uintmax_t& done = log_scanned_[path.string()];
    in.seekg(static_cast<std::streamoff>(done));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    done += text.size();
    for (const char* marker : kMarkers) {
      size_t at = text.find(marker);
      if (at != std::string::npos) {
        size_t from = text.rfind('\n', at);
        from = from == std::string::npos ? 0 : from + 1;
        out += "---- " + path.string() + " ----\n" + text.substr(from, 6000) + "\n";
        break;
      }
    }
  }
  return out;
}

::testing::AssertionResult Cluster::restart() {
  auto d = down();
  if (!d) {
    if (anything_mounted_below(dir_)) {
      return d;  // not stopped: starting again on top would only confuse
    }
    // Stopped, but something went wrong on the way (e.g. a sanitizer report at exit): record it
    // and restart anyway, so the test still checks what it restarted for.
    ADD_FAILURE() << "restart: " << d.message();
  }
  return up();
}

// ------------------------------------------------------------------------------------------
// SharedClusterEnvironment

namespace {
std::unique_ptr<Cluster> g_shared_cluster;
std::string g_shared_root;
bool g_on_penstock = false;
}  // namespace

void SharedClusterEnvironment::SetUp() {
  const char* local = std::getenv("PENSTOCK_TEST_DIR");
  if (local != nullptr && *local != '\0') {
    std::error_code ec;
    fs::create_directories(local, ec);
    g_shared_root = fs::absolute(local).lexically_normal().string();
    if (g_shared_root.size() > 1 && g_shared_root.back() == '/') {
      g_shared_root.pop_back();
    }
    g_on_penstock = false;
    std::printf("[cluster] PENSTOCK_TEST_DIR set: testing the local directory %s\n",
                g_shared_root.c_str());
    return;
  }
  g_on_penstock = true;
  g_shared_cluster = std::make_unique<Cluster>();
  auto r = g_shared_cluster->up();
  if (!r) {
    std::fprintf(stderr, "[cluster] the shared cluster did not start:\n%s\n", r.message());
    g_shared_root.clear();
    return;
  }
  g_shared_root = g_shared_cluster->mount_path();
  std::printf("[cluster] shared cluster mounted at %s (meta %s)\n", g_shared_root.c_str(),
              g_shared_cluster->meta_addr().c_str());
}

void SharedClusterEnvironment::TearDown() {
  if (g_shared_cluster) {
    auto r = g_shared_cluster->down();
    EXPECT_TRUE(r) << "stopping the shared cluster";
    g_shared_cluster.reset();
  }
}

const std::string& SharedClusterEnvironment::root() { return g_shared_root; }
bool SharedClusterEnvironment::on_penstock() { return g_on_penstock; }
Cluster* SharedClusterEnvironment::cluster() { return g_shared_cluster.get(); }

std::string make_test_dir(const std::string& parent) {
  if (parent.empty()) {
    ADD_FAILURE() << "no directory to test in (the cluster did not start; see the log above)";
    return "";
  }
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info != nullptr
                         ? std::string(info->test_suite_name()) + "." + info->name()
                         : std::string("test");
  for (char& c : name) {
    if (c == '/') {
      c = '_';
    }
  }
  static std::atomic<int> counter{0};
  std::string path = parent + "/" + name + "." + std::to_string(getpid()) + "." +
                     std::to_string(counter.fetch_add(1));
  if (mkdir(path.c_str(), 0755) != 0) {
    ADD_FAILURE() << "mkdir " << path << ": " << std::strerror(errno);
    return "";
  }
  chmod(path.c_str(), 0755);
  return path;
}

}  // namespace penstock::testing
