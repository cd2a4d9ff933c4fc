// WorkerPool: the threads that take FUSE requests from /dev/fuse and answer them, in place of
// libfuse's loop. Only `active` of them take requests at once (places); the others are parked.
// libfuse's loop keeps every thread it ever started waiting in read(), and the kernel hands each
// request to the one that has waited longest, so after a burst every request wakes a sleeping
// thread; with a few places a request usually finds a thread still running (round 39 of
// docs/performance.md measured 1.1-1.8x on metadata at 4 threads against 16 on 2 CPUs).
// A few places must not let a few slow requests stop the mount (a rename waiting out leases,
// write-behind back-pressure, a server that does not answer): a thread about to wait long gives
// its place away (before_long_wait(), common/base/long_wait.h), and a watch gives away the place
// of a request still unanswered after `stall` when no place is free (it ticks only while every
// place is serving). A place given away wakes
// the thread parked last (its cache is warmest) or starts one, up to `max_threads`; the slow
// thread, once answered, takes a free place back or parks.
// No FUSE dependency: a RequestSource reads and answers the requests.
// Thread-safety: run() once, from one thread; stats() from any.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace penstock::fuse {

class RequestSource {
 public:
  // One worker's own state (its receive buffer).
  struct Context {
    virtual ~Context() = default;
  };

  virtual ~RequestSource() = default;
  virtual std::unique_ptr<Context> new_context() = 0;
  // Waits for the next request: > 0 one came, 0 the session ended, < 0 -errno (-EINTR: woken by a
  // signal, try again).
  virtual int receive(Context& ctx) = 0;
  // Answers the request the last receive() on `ctx` returned.
  virtual void serve(Context& ctx) = 0;
  // Whether the session was told to end (a termination signal).
  virtual bool ended() = 0;
  // Tells the session to end.
  virtual void end() = 0;
};

struct WorkerPoolStats {
  uint64_t threads = 0;     // started
  uint64_t stalls = 0;      // places the watch gave away
  uint64_t long_waits = 0;  // places given away by before_long_wait()
};

// What a pool counts as it runs, readable from any thread meanwhile (the mount's
// user.penstock.stats reads them while the pool serves).
struct WorkerPoolCounters {
  std::atomic<uint64_t> threads{0};
  std::atomic<uint64_t> stalls{0};
  std::atomic<uint64_t> long_waits{0};

  WorkerPoolStats load() const {
    return {threads.load(std::memory_order_relaxed), stalls.load(std::memory_order_relaxed),
            long_waits.load(std::memory_order_relaxed)};
  }
};

struct WorkerPoolOptions {
  int active = 8;                             // threads taking requests at once (the mount: active_threads())
  int max_threads = 16;                       // threads in all
  std::chrono::microseconds stall{2000};      // a request unanswered this long gives its place away
  std::string thread_name = "penstock-fuse";  // of every worker thread
  // Where the pool counts; must outlive it. nullptr: counters of its own (stats()).
  WorkerPoolCounters* counters = nullptr;
};

class WorkerPool {
 public:
  WorkerPool(RequestSource& source, WorkerPoolOptions options);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Serves requests until the session ends (receive() returns 0, or ended()), then wakes every
  // worker and waits for it. Returns 0, or the -errno a receive() failed with. Runs the watch on
  // the calling thread.
  int run();

  WorkerPoolStats stats() const;

 private:
  struct Worker;

  void work(Worker* w);
  static void on_long_wait(void* arg);
  // Gives `w`'s place to another thread, counted in `count` before that thread can run (so a
  // request it serves never sees the counter behind); false when it had none to give. mu_ held.
  bool give_place(Worker* w, std::atomic<uint64_t>& count);
  // Puts a counted place to use: wakes the thread parked last or starts one. mu_ held.
  void fill_place();
  // Whether fill_place() has a thread to give a place to. mu_ held.
  bool can_fill() const;
  // After a request: takes a free place back, or parks until given one. False: stop.
  bool take_place(Worker* w);
  // A worker took the last waiting place: fills another if one is free.
  void grow();
  void stop(int error);
  void watch();
  void join_all();

  RequestSource& source_;
  const WorkerPoolOptions options_;

  std::atomic<int> receiving_{0};        // places waiting in receive()
  std::atomic<bool> stopping_{false};    // written under mu_
  mutable std::mutex mu_;
  std::condition_variable watch_cv_;
  bool watch_armed_ = false;                      // guarded by mu_: every place was serving
  int places_ = 0;                               // guarded by mu_: threads holding a place
  std::vector<std::unique_ptr<Worker>> workers_;  // guarded by mu_; only grows until join_all()
  std::vector<Worker*> parked_;                  // guarded by mu_; the last parked is woken first
  int live_ = 0;                                 // guarded by mu_: threads not yet ended
  int error_ = 0;                                // guarded by mu_
  bool start_failed_ = false;                    // guarded by mu_: logged once
  WorkerPoolCounters own_counters_;
  WorkerPoolCounters* const counters_;  // options_.counters, or &own_counters_
};

}  // namespace penstock::fuse
