#include "common/net/io_pool.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>

#include "common/base/log.h"

namespace penstock::net {

IoPool::IoPool(int threads) {
  const int n = std::max(threads, 1);  // a configured 0 still gets one I/O thread
  for (int i = 0; i < n; ++i) {
    auto loop = std::make_unique<Loop>();
    // Concurrency hint 1: only this loop's thread runs the context, so Asio skips waking others.
    loop->io = std::make_unique<boost::asio::io_context>(1);
    contexts_.push_back(std::move(loop));
  }
}

IoPool::~IoPool() { drain(std::chrono::milliseconds(0)); }

void IoPool::start() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& loop : contexts_) {
    if (loop->thread.joinable()) continue;
    loop->guard.emplace(loop->io->get_executor());
    ++running_;
    loop->thread = std::thread([this, io = loop->io.get()] {
      // A splice into a socket the peer reset raises SIGPIPE (it cannot pass MSG_NOSIGNAL the way
      // Asio's sends do); blocked here, the call just fails with EPIPE, in every embedding process.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      io->run();
      std::lock_guard<std::mutex> done(mu_);
      --running_;
      cv_.notify_all();
    });
  }
}

boost::asio::io_context& IoPool::next() {
  return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()]->io;
}

void IoPool::drain(std::chrono::milliseconds grace) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (auto& loop : contexts_) loop->guard.reset();
    if (!cv_.wait_for(lock, grace, [&] { return running_ == 0; })) {
      if (grace.count() > 0) {
        PENSTOCK_LOG(Warn) << "I/O threads still busy " << grace.count() << " ms after shutdown began; stopping them";
      }
      for (auto& loop : contexts_) loop->io->stop();
    }
  }
  for (auto& loop : contexts_) {
    if (loop->thread.joinable()) loop->thread.join();
  }
}

}  // namespace penstock::net
