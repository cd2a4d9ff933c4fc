// IoPool: N single-threaded Asio io_contexts, one thread each ("one loop per thread"), behind the
// client's IoRuntime and the RpcServer. Owned by either; thread-safe after construction.
//
// Why not one io_context run by N threads: Asio's multi-threaded scheduler hands ready operations
// between its threads through a mutex and a condition variable, so a small RPC cost about five
// futex calls and three epoll_waits per request on penstock-meta (perf trace, 2 threads). With
// one thread per context a connection's reads, handlers and writes stay on the thread whose epoll
// saw the socket; only posts from other threads (callers, worker pools) wake it.
// Every socket object still gets a strand: a connection's code must not depend on how many
// threads run its context.
//
// Included from .cc files only (it pulls in Asio).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

namespace penstock::net {

class IoPool {
 public:
  // `threads` contexts (at least one). No thread runs until start().
  explicit IoPool(int threads);
  // Stops the contexts hard and joins (after drain() when a graceful end is wanted).
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  // Starts one thread per context; each keeps running until drain() or stop().
  void start();
  size_t size() const { return contexts_.size(); }
  boost::asio::io_context& at(size_t i) { return *contexts_[i]->io; }
  // The context for a new connection: round-robin, so connections spread over the threads.
  boost::asio::io_context& next();
  // Lets each thread return once its context has no more work; returns when every thread has,
  // or stops the rest hard (logging it) after `grace`. Then joins. Idempotent.
  void drain(std::chrono::milliseconds grace);

 private:
  struct Loop {
    std::unique_ptr<boost::asio::io_context> io;
    std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> guard;
    std::thread thread;
  };
  std::vector<std::unique_ptr<Loop>> contexts_;
  std::atomic<size_t> next_{0};
  std::mutex mu_;  // leaf
  std::condition_variable cv_;
  size_t running_ = 0;  // threads still inside run(); guarded by mu_
};

}  // namespace penstock::net
