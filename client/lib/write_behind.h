// Building blocks of the client's write-behind (Client::write): DirtyBudget, the bound on the bytes
// a client holds that are not yet on the data servers (buffered or in flight), with back-pressure;
// WriteError, a file's asynchronous write errors, reported to each open handle once;
// TaskPool, the few threads that send full buffers and read-ahead fetches while the caller goes on;
// WriteSource, where one write's bytes come from.
// Thread-safety: DirtyBudget, WriteError and TaskPool are safe to use from any number of threads;
// a WriteSource belongs to the one write() that reads it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "common/base/status.h"

namespace penstock::client {

// The bytes of one write: the caller's memory, or a descriptor read once, in order (the pipe a
// FUSE WRITE was spliced into by the kernel, which put the writer's page-cache pages there by
// reference: reading them straight into a write-behind buffer is the only copy the mount makes
// before the socket's). take() hands out the next bytes.
class WriteSource {
 public:
  explicit WriteSource(std::span<const uint8_t> mem) : mem_(mem), size_(mem.size()) {}
  WriteSource(int fd, size_t size) : fd_(fd), size_(size) {}

  size_t size() const { return size_; }
  size_t taken() const { return taken_; }
  // The memory, when the source is memory (empty for a descriptor).
  std::span<const uint8_t> memory() const { return fd_ < 0 ? mem_ : std::span<const uint8_t>(); }
  // Copies the next `n` bytes to `dst`. kIo when the descriptor fails or ends before them.
  // REQUIRES: taken() + n <= size().
  Status take(uint8_t* dst, size_t n);

 private:
  std::span<const uint8_t> mem_;
  int fd_ = -1;
  size_t size_ = 0;
  size_t taken_ = 0;
};


class DirtyBudget {
 public:
  explicit DirtyBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // Takes `n` bytes of the budget. Blocks while taking them would pass the limit AND some bytes
  // are in flight (their completion frees budget): with nothing in flight, waiting could never
  // end, so the caller goes over the limit (by at most what is buffered and not yet sent).
  void acquire(uint64_t n);
  // Moves `n` taken bytes from "buffered" to "in flight" (a send started).
  void start_flight(uint64_t n);
  // Gives back `n` bytes that were in flight (the send finished, successfully or not).
  void finish_flight(uint64_t n);
  // Gives back `n` buffered bytes that will never be sent.
  void release_buffered(uint64_t n);

  uint64_t limit() const { return limit_; }
  uint64_t used() const;
  uint64_t in_flight() const;
  uint64_t waits() const;  // how many acquire() calls had to wait

 private:
  const uint64_t limit_;
  mutable std::mutex mu_;  // leaf lock
  std::condition_variable cv_;
  uint64_t used_ = 0;       // buffered + in flight; guarded by mu_
  uint64_t in_flight_ = 0;  // guarded by mu_
  uint64_t waits_ = 0;      // guarded by mu_
};

// The asynchronous write errors of one file, reported the way Linux reports writeback errors
// (errseq_t): every handle open when a send fails learns of it once, at its next write, flush or
// fsync, whichever handle's writes failed; a handle opened later learns of it only if no handle
// has yet. A handle's position is a WriteCursor; callers without handles (the library API used
// directly) share one "reported" mark instead: the first flush after a failure reports it.
// record() keeps the latest error (as Linux does: it is the one that describes the state now).
class WriteError;

// One open handle's view of its file's write errors. Created by Client::write_cursor() at open;
// the file's error record lives as long as a cursor or the file's write-behind record (which also
// stays while an error of it is unreported) holds it.
struct WriteCursor {
  std::shared_ptr<WriteError> errors;
  uint64_t seen = 0;  // sequence of the last error this handle reported; guarded by errors' lock
};

class WriteError {
 public:
  void record(const Status& st);
  // Where a handle opened now starts: before the latest error if nobody reported it yet (so the
  // new handle reports it), after it otherwise.
  uint64_t sample() const;
  // The latest error recorded after the cursor's position, or ok. `advance` marks it reported:
  // the cursor moves past it (a write() peeks, a flush or fsync advances). A null cursor reads
  // the shared mark: an error no handle has reported yet.
  Status check(WriteCursor* cursor, bool advance);
  // True when an error was recorded that no handle (and no cursor-less flush) reported yet.
  bool unreported() const;

 private:
  mutable std::mutex mu_;  // leaf lock
  Status latest_;          // guarded by mu_
  uint64_t seq_ = 0;       // errors recorded so far; guarded by mu_
  bool reported_ = true;   // the latest error reached some handle; guarded by mu_
};

// A fixed set of worker threads running queued tasks in FIFO order. stop() runs what is queued,
// then joins. Tasks must not call stop().
class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;

  // Queues `task`. After stop() the task runs on the caller's thread.
  void submit(std::function<void()> task);
  // Queues `task` and returns true; after stop() returns false and drops it (for callers that hold
  // a lock the task takes, and so cannot run it themselves).
  bool try_submit(std::function<void()> task);
  void stop();
  // True once stop() began: callers that hold locks a task needs must not submit then.
  bool stopped() const;

 private:
  void run();
  mutable std::mutex mu_;  // leaf lock
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace penstock::client
