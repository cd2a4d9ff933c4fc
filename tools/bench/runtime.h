// Runtime pieces every penstock-bench workload shares: plain POSIX file I/O with the verified data
// pattern, a live progress line, a group of forked rank processes with barriers, cold-cache
// support and naming of fresh run directories.
// Ownership: each object is owned by the workload run that creates it.
// Thread-safety: Progress::add may be called from any thread and from forked children; every
// other member function of Progress and ProcessGroup is called from the thread that owns it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/base/result.h"
#include "common/base/status.h"

namespace penstock::bench {

// Seconds on CLOCK_MONOTONIC: comparable between processes of one machine.
double now_seconds();

// An error Status for a failed system call: "<what>: <strerror(errno)>", code from errno.
Status errno_status(const std::string& what, int err);

// A heap buffer aligned to 4 KiB (so O_DIRECT-style callers could use it), freed on destruction.
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t size);
  std::byte* data() { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_;
};

// Writes all of buf to fd at the current position (loops on short writes and EINTR).
// Errors name `path` and the file offset `offset` where the write started.
Status write_all(int fd, const std::byte* buf, size_t len, const std::string& path, uint64_t offset);

// Reads up to len bytes at the current position (or at `offset` with pread when `positional`),
// looping until len bytes or end of file. Returns the number of bytes read.
Result<size_t> read_full(int fd, std::byte* buf, size_t len, const std::string& path,
                         uint64_t offset, bool positional);

// Counts bytes and operations for the live progress line; the counters live in shared anonymous
// memory so forked rank processes can add to them.
class Progress {
 public:
  // `enabled`: draw the line (normally isatty(stderr)). Counting works either way.
  explicit Progress(bool enabled);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Resets the counters and, when enabled, starts redrawing "[label] done/total rate" on stderr
  // four times a second. total_bytes 0: unknown. REQUIRES: not started.
  void start(std::string label, uint64_t total_bytes);
  // Stops redrawing and erases the line. Harmless when not started.
  void stop();
  void add(uint64_t bytes, uint64_t ops) {
    counters_->bytes.fetch_add(bytes, std::memory_order_relaxed);
    counters_->ops.fetch_add(ops, std::memory_order_relaxed);
  }

 private:
  struct Counters {
    std::atomic<uint64_t> bytes;
    std::atomic<uint64_t> ops;
  };
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "counters are shared between processes");
  bool enabled_;
  Counters* counters_;  // mmap(MAP_SHARED | MAP_ANONYMOUS)
  std::atomic<bool> running_{false};
  std::thread thread_;
  std::string label_;
  uint64_t total_ = 0;
};

// What one rank process reports when its body returns.
struct RankReport {
  uint64_t bytes = 0;
  uint64_t ops = 0;
  double t_start = 0;  // now_seconds() when its timed work began
  double t_end = 0;    // now_seconds() when its timed work ended
};

// The child side of the group's barriers.
class Barrier {
 public:
  Barrier(int to_parent, int from_parent) : to_parent_(to_parent), from_parent_(from_parent) {}
  // Tells the parent this rank arrived and blocks until the parent releases every rank.
  // kCancelled when the parent gave up on the run (another rank failed).
  Status arrive_and_wait();

 private:
  int to_parent_;
  int from_parent_;
};

// R forked rank processes running one body. The parent drives barriers: each wait_barrier() waits
// until every rank has called Barrier::arrive_and_wait(), release() lets them all go at once.
// If any rank fails, the parent cancels the others (they see kCancelled at their next barrier)
// and reaps every child before returning the first error. Destruction reaps every child.
class ProcessGroup {
 public:
  using Body = std::function<Result<RankReport>(int rank, Barrier& barrier)>;
  ProcessGroup() = default;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Forks n children, each running body(rank) and exiting. Errors: fork or pipe failures.
  Status spawn(int n, Body body);
  // Waits until every rank arrived at its next barrier; returns now_seconds() at the last arrival.
  // On a rank failure returns its error (naming the rank) after cancelling and reaping all ranks.
  Result<double> wait_barrier();
  // Releases every rank waiting at the barrier.
  Status release();
  // Waits for every rank's final report and reaps the children.
  Result<std::vector<RankReport>> finish();

 private:
  struct Child {
    pid_t pid = -1;
    int from_child = -1;  // parent reads messages here
    int to_child = -1;    // parent writes release bytes here
  };
  void abort_all();
  Status reap_all();
  std::vector<Child> children_;
};

// Before a read phase: sync; when `dir` is on a Penstock mount (is_penstock_dir), drop the mount's
// chunk cache, the meta server's and every data server's caches (drop_penstock_caches); then write 3 to
// /proc/sys/vm/drop_caches. kPermission with advice when not root; kIo with advice when the
// Penstock drop fails.
Status drop_caches(const std::string& dir);

// Whether `dir` is on a Penstock mount: its mount's fstype (/proc/mounts) is fuse.penstock*, or
// reading the virtual xattr user.penstock.layout of `dir` succeeds. Never writes anything.
bool is_penstock_dir(const std::string& dir);

// setxattr(dir, "user.penstock.drop_caches", "1"): the mount drops its chunk cache and asks every
// data server to drop its caches. kIo saying what to do (EPERM: run as root or the mount's owner).
// REQUIRES: is_penstock_dir(dir); never call it on another file system.
Status drop_penstock_caches(const std::string& dir);

// How many times drop_penstock_caches() succeeded in this process (for the report's notes).
int penstock_cache_drops();

// Busy CPU time of the whole machine in clock ticks, from the text of /proc/stat: user + nice +
// system + irq + softirq + steal of the aggregate "cpu" line (idle and iowait are not busy; guest
// time is inside user already). kInvalid when the line is missing or malformed.
Result<uint64_t> busy_ticks_from_proc_stat(std::string_view text);

// busy_ticks_from_proc_stat of /proc/stat now, in seconds (ticks / _SC_CLK_TCK). Machine-wide: every
// process on this host counts. kIo / kInvalid when /proc/stat cannot be read or parsed.
Result<double> machine_busy_cpu_seconds();

// The file system type of the mount that holds `dir` according to /proc/mounts ("ext4",
// "fuse.penstock", ...); empty when it cannot be told.
std::string mount_fstype(const std::string& dir);

// The fstype of the mount holding the absolute, symlink-free `path`, given the text of
// /proc/mounts (octal escapes such as \040 decoded; the deepest and then the latest mount wins).
std::string fstype_for_path(const std::string& mounts, const std::string& path);

// True when the fstype is a Penstock FUSE mount ("fuse.penstock" or "fuse.penstock-mount").
bool is_penstock_fstype(const std::string& fstype);

// "<prefix>-20260101T120000.123456": a name that sorts by creation time.
std::string timestamp_name(const std::string& prefix);

// mkdir -p for `path` (mode 0755). Ok when it already exists as a directory.
Status make_dirs(const std::string& path);

// Removes `path` and everything below it. Ok when it does not exist.
Status remove_tree(const std::string& path);

// Size of a regular file, or an error (kNotFound when missing).
Result<uint64_t> file_size(const std::string& path);

}  // namespace penstock::bench
