// penstock-mount: mounts a Penstock file system through FUSE (libfuse3 low-level API).
//
//   penstock-mount [options] MOUNTPOINT
//   penstock-mount META_ADDR MOUNTPOINT -o opt1,opt2,...   (the form mount(8) uses via
//                                                           /sbin/mount.fuse.penstock)
//
// Startup order: parse options; unless --foreground, fork before any thread exists (the parent
// waits until the child reports "mounted" and exits 0, or exits with the child's failure); connect
// to penstock-meta and register the session BEFORE mounting (an unreachable server leaves the
// mountpoint untouched); mount; answer the kernel's INIT request; raise the mount's kernel
// read-ahead (it must follow INIT, whose reply caps it at the kernel's 128 KiB default); detach from
// the terminal; serve until SIGINT/SIGTERM/SIGHUP or `fusermount3 -u`; unmount and close the session.
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/fuse/fuse_ops.h"
#include "client/fuse/fuse_ring.h"
#include "client/fuse/mount_options.h"
#include "client/fuse/worker_pool.h"
#include "client/lib/client.h"
#include "common/base/log.h"
#include "common/base/malloc_tuning.h"

namespace {

using penstock::Code;
using penstock::Status;
using penstock::fuse::MountSettings;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "penstock-mount: %s\n", msg.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

// Forks; the parent waits for one byte on the pipe (sent once the mount is up) and exits 0, or
// exits with the child's status when the child dies first. Returns the write end in the child.
int fork_and_wait_for_mount() {
  int fds[2];
  if (pipe(fds) != 0) die(std::string("pipe: ") + std::strerror(errno));
  const pid_t pid = fork();
  if (pid < 0) die(std::string("fork: ") + std::strerror(errno));
  if (pid > 0) {
    close(fds[1]);
    char c = 1;
    ssize_t n;
    do {
      n = read(fds[0], &c, 1);
    } while (n < 0 && errno == EINTR);
    if (n == 1 && c == 0) std::_Exit(0);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    std::_Exit(WIFEXITED(status) && WEXITSTATUS(status) != 0 ? WEXITSTATUS(status) : 1);
  }
  close(fds[0]);
  setsid();
  return fds[1];
}

// After the mount is up: stdio away from the terminal (logs to --log-file), then tell the parent.
void finish_daemonizing(int ready_fd, const std::string& log_file) {
  int null_fd = open("/dev/null", O_RDWR);
  int log_fd = null_fd;
  if (!log_file.empty()) {
    log_fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      PENSTOCK_LOG(Warn) << "cannot open log file " << log_file << ": " << std::strerror(errno)
                         << "; logs are discarded";
      log_fd = null_fd;
    }
  }
  if (null_fd >= 0) {
    dup2(null_fd, STDIN_FILENO);
    dup2(null_fd, STDOUT_FILENO);
  }
  if (log_fd >= 0) dup2(log_fd, STDERR_FILENO);
  if (log_fd > STDERR_FILENO && log_fd != null_fd) close(log_fd);
  if (null_fd > STDERR_FILENO) close(null_fd);
  if (chdir("/") != 0) {
    // Not fatal: only keeps a directory busy.
  }
  const char ok = 0;
  ssize_t n;
  do {
    n = write(ready_fd, &ok, 1);
  } while (n < 0 && errno == EINTR);
  close(ready_fd);
}

// The FUSE requests that come through /dev/fuse, for the worker pool.
class DevFuseRequests final : public penstock::fuse::RequestSource {
 public:
  explicit DevFuseRequests(fuse_session* se) : se_(se) {}

  struct Buffer final : Context {
    fuse_buf buf{};  // receive_buf allocates its memory at the first request and reuses it
    ~Buffer() override { std::free(buf.mem); }
  };
  std::unique_ptr<Context> new_context() override { return std::make_unique<Buffer>(); }
  int receive(Context& ctx) override { return fuse_session_receive_buf(se_, &static_cast<Buffer&>(ctx).buf); }
  void serve(Context& ctx) override { fuse_session_process_buf(se_, &static_cast<Buffer&>(ctx).buf); }
  bool ended() override { return fuse_session_exited(se_) != 0; }
  void end() override { fuse_session_exit(se_); }

 private:
  fuse_session* const se_;
};

// Answers the first request of a new mount, INIT, on this thread: the kernel sets the mount's bdi
// read-ahead when it gets the reply, so only after that can set_kernel_readahead() raise it. Returns
// false when no request could be read (the session loop then meets the same error).
bool serve_init(DevFuseRequests& requests) {
  const std::unique_ptr<penstock::fuse::RequestSource::Context> ctx = requests.new_context();
  int n;
  do {
    n = requests.receive(*ctx);
  } while (n == -EINTR);
  if (n <= 0) {
    PENSTOCK_LOG(Warn) << "reading the FUSE INIT request failed: " << std::strerror(n < 0 ? -n : EIO)
                       << "; kernel read-ahead stays at the kernel default";
    return false;
  }
  requests.serve(*ctx);
  return true;
}

// How many worker threads take requests at once: --active-threads, or four per CPU (at least 8),
// never more than --threads. Why 8 on 2 CPUs and not 4 (round 40): 4 served metadata as fast, but
// let four checkpoint writers take every place from the training reads beside them.
int active_threads(const penstock::fuse::MountSettings& s) {
  const int cpus = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return std::min(s.threads, s.active_threads > 0 ? s.active_threads : std::max(8, 4 * cpus));
}

// Serves the requests that come through /dev/fuse until the session ends: 0, or a negative errno.
// --clone-fd needs libfuse's own loop (the cloned descriptors are libfuse's).
int serve_requests(fuse_session* se, DevFuseRequests& requests, const penstock::fuse::MountSettings& s,
                   penstock::fuse::MountState& state) {
  if (s.clone_fd) {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_max_threads(cfg, static_cast<unsigned>(s.threads));
    fuse_loop_cfg_set_clone_fd(cfg, 1);
    const int rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    return rc > 0 ? 0 : rc;  // > 0: ended on a signal, a clean stop
  }
  penstock::fuse::WorkerPoolOptions options;
  options.active = active_threads(s);
  options.max_threads = s.threads;
  options.thread_name = "penstock-fuse";
  options.counters = &state.fuse_workers;
  state.fuse_places.store(options.active, std::memory_order_relaxed);
  penstock::fuse::WorkerPool pool(requests, options);
  const int rc = pool.run();
  const penstock::fuse::WorkerPoolStats st = pool.stats();
  PENSTOCK_LOG(Info) << "FUSE workers: " << st.threads << " started for " << options.active
                     << " places; places handed on by requests unanswered after "
                     << options.stall.count() / 1000 << " ms: " << st.stalls << ", by long waits: " << st.long_waits;
  if (rc < 0) {
    PENSTOCK_LOG(Error) << "the FUSE loop ended on an error: " << std::strerror(-rc)
                        << (rc == -EAGAIN ? " (no worker thread could be started)" : " (reading /dev/fuse)");
  }
  return rc;
}

// Sets the mount's bdi read_ahead_kb to `bytes` (0: leave the kernel default). Failing is not fatal:
// reads work, only large reads cross FUSE in smaller requests, so it is logged and skipped.
void set_kernel_readahead(const std::string& mountpoint, uint64_t bytes) {
  if (bytes == 0) return;
  std::ifstream in("/proc/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  auto dev = penstock::fuse::fuse_mount_dev(text.str(), mountpoint);
  if (!dev.has_value()) {
    PENSTOCK_LOG(Warn) << "kernel read-ahead left at the kernel default: " << dev.error().message();
    return;
  }
  auto old_kb = penstock::fuse::set_bdi_read_ahead("/sys/class/bdi", *dev, bytes);
  if (!old_kb.has_value()) {
    PENSTOCK_LOG(Warn) << "kernel read-ahead left at the kernel default (large reads cross FUSE in "
                          "smaller requests): "
                       << old_kb.error().message()
                       << (old_kb.error().code() == Code::kNotPermitted
                               ? "; mount as root, or pass kernel_readahead=0 to silence this"
                               : "");
    return;
  }
  PENSTOCK_LOG(Info) << "kernel read-ahead of bdi " << penstock::fuse::bdi_name(*dev) << " set to "
                     << bytes / 1024 << " KiB (was " << *old_kb << " KiB)";
}

}  // namespace

int main(int argc, char** argv) {
  MountSettings s;
  std::vector<std::string> positionals;
  std::vector<std::string> option_lists;
  CLI::App app{
      "penstock-mount: mount a Penstock file system through FUSE.\n"
      "  penstock-mount [options] MOUNTPOINT\n"
      "  penstock-mount META_ADDR MOUNTPOINT -o opt1,opt2,...   (mount helper form; see\n"
      "      deploy/mount.fuse.penstock for `mount -t fuse.penstock` and fstab)\n"
      "Unmount with `fusermount3 -u MOUNTPOINT` (or umount as root)."};
  app.set_config("--config", "", "read options from a TOML file (keys: meta, threads, active-threads, clone-fd, "
                                 "direct-io, direct-writes, create-behind, foreground, log-level, log-file, transport, cache-size, readahead-max, "
                                 "dirty-limit, kernel-readahead, sched, fuse-uring)");
  // A misspelled key is an error, not a default silently kept.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--meta", s.meta, "penstock-meta address host:port")->capture_default_str();
  app.add_flag("-f,--foreground", s.foreground, "stay in the foreground, logging to stderr");
  app.add_option("--threads", s.threads, "most FUSE worker threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--active-threads", s.active_threads,
                 "FUSE worker threads taking requests at once (default: four per CPU, at least 8 and at "
                 "most --threads); a thread whose request waits long (more than 2 ms) hands its place to "
                 "another, up to --threads")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--clone-fd", s.clone_fd,
               "give each FUSE worker thread its own /dev/fuse descriptor (libfuse's loop: every "
               "started thread takes requests, --active-threads does not apply)");
  app.add_flag("--direct-io", s.direct_io,
               "bypass the kernel page cache for file data (faster checkpoint writes and restores; "
               "shared writable mmap then fails with ENODEV)");
  app.add_flag("--direct-writes", s.direct_writes,
               "write-only opens (checkpoint shards) bypass the kernel page cache on Linux 6.6+: one copy "
               "less per byte written, and reads that start after a write returns see it; the writer is no "
               "longer paced by that copy, so it takes more CPU from other processes on the host");
  app.add_option("--create-behind", s.create_behind,
                 "true: many files created in one directory by this mount alone are answered at once and "
                 "sent to penstock-meta in batches, under a lease on the directory's names (another mount's "
                 "first use of it waits up to the lease term); false: every create is a meta round trip")
      ->capture_default_str();
  app.add_option("--splice-writes", s.splice_writes,
                 "true: write data is spliced from /dev/fuse and read from the pipe into the write-behind "
                 "buffer, one copy per byte fewer (needs a pipe of 2 MiB: CAP_SYS_RESOURCE or "
                 "/proc/sys/fs/pipe-max-size), but every other request costs a splice more (creates 20% "
                 "slower): for checkpoint mounts; false: every request is read whole into memory")
      ->capture_default_str();
  app.add_option("--log-level", s.log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}))
      ->capture_default_str();
  app.add_option("--log-file", s.log_file, "append logs to FILE once daemonized (default: discarded)");
  app.add_option("--transport", s.transport,
                 "to data servers: auto (RDMA when an RDMA device reaches the server and it accepts RDMA, "
                 "else TCP), rdma or tcp; the log says which each connection uses")
      ->check(CLI::IsMember({"auto", "rdma", "tcp"}))
      ->capture_default_str();
  std::string cache_size, readahead_max, dirty_limit, kernel_readahead;
  app.add_option("--cache-size", cache_size,
                 "bytes of file data the client caches for all files (LRU; K/M/G/T suffixes, powers of "
                 "1024; 0 = no cache) [default 1G]");
  app.add_option("--readahead-max", readahead_max,
                 "largest read-ahead window of one sequential stream (0 = no read-ahead) [default 64M]");
  app.add_option("--dirty-limit", dirty_limit,
                 "write-behind: most bytes written but not yet on the data servers; writers wait "
                 "beyond it (0 = every write goes out before it returns) [default 256M]");
  app.add_option("--kernel-readahead", kernel_readahead,
                 "the kernel's read-ahead for this mount (its bdi read_ahead_kb; the kernel default of "
                 "128K splits every large read into 128 KiB FUSE requests); whole KiB up to 1G; "
                 "0 = keep the kernel default; needs root [default " +
                     std::to_string(MountSettings::kDefaultKernelReadahead >> 20) + "M]");
  app.add_option("--sched", s.sched,
                 "CPU scheduling policy of the mount's threads: batch (SCHED_BATCH: they take their share "
                 "of the CPU but do not preempt the application's threads when they wake, so the mount's "
                 "traffic adds less to the application's latency) or normal (SCHED_OTHER)")
      ->check(CLI::IsMember({"batch", "normal"}))
      ->capture_default_str();
  app.add_option("--fuse-uring", s.fuse_uring,
                 "FUSE requests over io_uring (Linux 6.14+): auto (when the kernel offers it, i.e. "
                 "/sys/module/fuse/parameters/enable_uring is Y), on (also switch that parameter on; root) "
                 "or off (/dev/fuse). Each request is then answered by a thread on its caller's CPU")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  app.add_option("-o", option_lists,
                 "mount options: meta=HOST:PORT, threads=N, active_threads=N, clone_fd, direct_io, direct_writes, "
                 "[no_]create_behind, [no_]splice_writes, log_level=L, log_file=F, ro, "
                 "transport=auto|rdma|tcp, cache_size=S, readahead_max=S, dirty_limit=S, "
                 "kernel_readahead=S, sched=batch|normal, fuse_uring=auto|on|off; the "
                 "generic rw, defaults, nodev, nosuid, noatime, _netdev, allow_other, ... are accepted")
      ->allow_extra_args(false);
  app.add_option("args", positionals, "[META_ADDR] MOUNTPOINT")->required()->expected(1, 2);
  CLI11_PARSE(app, argc, argv);

  if (positionals.size() == 2) {
    // mount(8) passes the fstab "device" first: an address, or a label such as "penstock".
    if (positionals[0].find(':') != std::string::npos) s.meta = positionals[0];
    s.mountpoint = positionals[1];
  } else {
    s.mountpoint = positionals[0];
  }
  auto size_flag = [](const std::string& text, const char* flag, uint64_t* out) {
    if (text.empty()) return;
    auto v = penstock::parse_byte_size(text);
    if (!v.has_value()) die(std::string(flag) + ": " + v.error().message());
    *out = *v;
  };
  size_flag(cache_size, "--cache-size", &s.cache_size);
  size_flag(readahead_max, "--readahead-max", &s.readahead_max);
  size_flag(dirty_limit, "--dirty-limit", &s.dirty_limit);
  size_flag(kernel_readahead, "--kernel-readahead", &s.kernel_readahead);
  if (Status st = penstock::fuse::check_kernel_readahead(s.kernel_readahead, "--kernel-readahead"); !st.is_ok()) {
    die(st.message());
  }
  for (const auto& list : option_lists) {
    Status st = penstock::fuse::apply_mount_options(list, &s);
    if (!st.is_ok()) die(st.message());
  }
  penstock::LogLevel level;
  if (!penstock::parse_log_level(s.log_level, &level)) die("log level '" + s.log_level + "' is not debug, info, warn or error");
  penstock::set_log_level(level);
  penstock::set_log_component("mount");

  char resolved[PATH_MAX];
  if (realpath(s.mountpoint.c_str(), resolved) == nullptr) {
    die("mountpoint " + s.mountpoint + ": " + std::strerror(errno) + " (create the directory first)");
  }
  struct stat mst {};
  if (stat(resolved, &mst) != 0 || !S_ISDIR(mst.st_mode)) die("mountpoint " + s.mountpoint + " is not a directory");
  const std::string mountpoint = resolved;

  penstock::keep_large_buffers_mapped();  // before any thread starts

  // Before any thread exists: threads do not survive fork().
  const int ready_fd = s.foreground ? -1 : fork_and_wait_for_mount();

  // Only the FUSE threads (started from this thread after unblocking) may take the termination
  // signals; the I/O and heartbeat threads inherit this mask.
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGINT);
  sigaddset(&term, SIGTERM);
  sigaddset(&term, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &term, nullptr);

  // Before any thread exists, so that every thread of the mount inherits it.
  if (Status st = penstock::fuse::apply_sched_policy(s.sched); !st.is_ok()) {
    PENSTOCK_LOG(Warn) << st.message() << "; the mount's threads keep the policy it was started with";
  }

  penstock::client::ClientOptions copts;
  copts.meta_address = s.meta;
  copts.client_name = "penstock-mount " + mountpoint;
  copts.io_threads = 2;
  auto transport = penstock::net::parse_transport(s.transport);
  if (!transport.has_value()) die(transport.error().message());
  copts.transport = *transport;
  copts.cache_size = s.cache_size;
  copts.readahead_max = s.readahead_max;
  copts.dirty_limit = s.dirty_limit;
  copts.create_behind = s.create_behind;
  penstock::fuse::apply_contract(&copts);
  auto connected = penstock::client::Client::connect(copts);
  if (!connected.has_value()) {
    const Status& st = connected.error();
    die(st.code() == Code::kUnavailable ? st.message() : st.to_string());
  }
  std::unique_ptr<penstock::client::Client> client = std::move(connected).value();
  penstock::fuse::MountState state{client.get(), s.direct_io, s.direct_writes};
  state.splice_writes = s.splice_writes;

  // allow_other: every user of the host reaches the mount, and the kernel checks their permissions
  // (default_permissions). fusermount3 refuses it to an unprivileged user unless /etc/fuse.conf
  // says user_allow_other; such a mount is then for its owner alone, with a warning.
  bool allow_other = geteuid() == 0;
  if (!allow_other) {
    std::ifstream conf("/etc/fuse.conf");
    std::stringstream text;
    text << conf.rdbuf();
    allow_other = penstock::fuse::fuse_conf_allows_other(text.str());
    if (!allow_other) {
      PENSTOCK_LOG(Warn) << "mounting without allow_other: only uid " << geteuid()
                         << " can use this mount (to share it, mount as root or add user_allow_other to /etc/fuse.conf)";
    }
  }
  std::string fuse_opts = "fsname=penstock:" + s.meta + ",subtype=penstock,default_permissions";
  if (allow_other) fuse_opts += ",allow_other";
  if (s.read_only) fuse_opts += ",ro";
  for (const std::string& flag : s.kernel_flags) fuse_opts += "," + flag;
  std::vector<std::string> fuse_argv_s = {argv[0], "-o", fuse_opts};
  std::vector<char*> fuse_argv;
  for (auto& a : fuse_argv_s) fuse_argv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(fuse_argv.size()), fuse_argv.data());
  const fuse_lowlevel_ops& ops = penstock::fuse::penstock_ops();
  fuse_session* se = fuse_session_new(&args, &ops, sizeof(ops), &state);
  // fuse_session_new may have rewritten args into heap memory that is ours to free.
  fuse_opt_free_args(&args);
  if (se == nullptr) {
    client->shutdown();
    die("cannot create the FUSE session (see the message above)");
  }
  state.session = se;
  if (fuse_set_signal_handlers(se) != 0) {
    fuse_session_destroy(se);
    client->shutdown();
    die("cannot install signal handlers");
  }
  // Before the mount: the kernel decides whether to offer the ring in the INIT it sends then.
  std::unique_ptr<penstock::fuse::FuseRing> ring;
  std::string no_ring;
  // As many serving threads as the /dev/fuse loop may start, spread over the CPUs' queues.
  const int per_queue = std::max(2, s.threads / std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  ring = penstock::fuse::FuseRing::prepare(s.fuse_uring, per_queue, &no_ring);
  if (fuse_session_mount(se, mountpoint.c_str()) != 0) {
    fuse_remove_signal_handlers(se);
    fuse_session_destroy(se);
    client->shutdown();
    die("cannot mount at " + mountpoint +
        " (see the message above; is /dev/fuse available and the directory not already a mount?)");
  }
  if (ring != nullptr && !ring->attach(se, &no_ring)) ring.reset();
  DevFuseRequests requests(se);
  const bool init_served = (s.kernel_readahead != 0 || ring != nullptr) && serve_init(requests);
  if (init_served && s.kernel_readahead != 0) set_kernel_readahead(mountpoint, s.kernel_readahead);
  if (ring != nullptr && !ring->start(&no_ring)) ring.reset();
  if (ring != nullptr) {
    PENSTOCK_LOG(Info) << "FUSE requests come over io_uring: " << ring->queues() << " CPU queues, "
                       << ring->threads() << " threads pinned to their CPUs";
  } else if (s.fuse_uring == "on") {
    PENSTOCK_LOG(Warn) << "FUSE requests go through /dev/fuse: " << no_ring;
  } else {
    PENSTOCK_LOG(Info) << "FUSE requests go through /dev/fuse: " << no_ring;
  }
  PENSTOCK_LOG(Info) << "mounted penstock:" << s.meta << " at " << mountpoint << " (threads " << s.threads
                     << (s.clone_fd ? ", clone_fd" : ", " + std::to_string(active_threads(s)) + " active") << (s.direct_io ? ", direct_io" : "") << (state.direct_writes ? ", direct_writes" : "") << (state.splice_writes ? ", splice_writes" : "") << "; cache " << s.cache_size << " bytes, read-ahead up to "
                     << s.readahead_max << " bytes per stream, write-behind up to " << s.dirty_limit
                     << " dirty bytes; creates behind directory leases " << (s.create_behind ? "on" : "off")
                     << "; scheduling policy " << s.sched << ")";
  if (ready_fd >= 0) finish_daemonizing(ready_fd, s.log_file);
  pthread_sigmask(SIG_UNBLOCK, &term, nullptr);

  const int rc = serve_requests(se, requests, s, state);

  PENSTOCK_LOG(Info) << "unmounting " << mountpoint;
  // Reads answered by the thread their data arrives on write to the session's descriptor, which
  // the unmount closes: they go first (their data servers answer or time out meanwhile).
  if (const uint64_t unanswered = state.late_replies.close(std::chrono::seconds(5)); unanswered > 0) {
    PENSTOCK_LOG(Warn) << unanswered << " read(s) still waiting for their data after 5 s get no answer; the kernel "
                       << "fails them as it unmounts";
  }
  fuse_session_unmount(se);
  if (ring != nullptr) ring->stop();  // its threads use the session until they end
  penstock::fuse::stop_after_reply();  // so does what request threads left to notify
  fuse_remove_signal_handlers(se);
  fuse_session_destroy(se);  // runs op_destroy, which closes the meta session
  client->shutdown();
  client.reset();
  // rc > 0: the loop ended on a signal, a clean stop.
  return rc < 0 ? 1 : 0;
}
