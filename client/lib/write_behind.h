// Building blocks of the client's write-behind (Client::write): DirtyBudget, the bound on the bytes
// a client holds that are not yet on the data servers (buffered or in flight), with back-pressure;
// WriteError, the first asynchronous write error of a file, kept until it is reported; and
// TaskPool, the few threads that send full buffers and read-ahead fetches while the caller goes on.
// Thread-safety: every class here is safe to use from any number of threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "common/base/status.h"

namespace penstock::client {

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

// The first error of a file's asynchronous writes. record() keeps the first; peek() reads it for
// the next write(); take() reports it once (flush/fsync) and clears it.
class WriteError {
 public:
  void record(const Status& st);
  Status peek() const;
  Status take();

 private:
  mutable std::mutex mu_;  // leaf lock
  Status first_;           // guarded by mu_
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
