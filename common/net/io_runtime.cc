// IoRuntime: the io_context and its threads shared by every channel of a process.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "common/base/log.h"
#include "common/net/transport.h"

namespace penstock::net {

namespace asio = boost::asio;

struct IoRuntime::Impl {
  asio::io_context io;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> guard;
  std::vector<std::thread> threads;
  std::mutex mu;
  std::condition_variable cv;
  int running = 0;  // threads still inside io.run(); guarded by mu
};

IoRuntime::IoRuntime(int threads) : impl_(std::make_unique<Impl>()) {
  threads = std::max(threads, 1);  // a configured 0 still gets one I/O thread
  impl_->guard.emplace(impl_->io.get_executor());
  impl_->running = threads;
  for (int i = 0; i < threads; ++i) {
    impl_->threads.emplace_back([impl = impl_.get()] {
      impl->io.run();
      std::lock_guard<std::mutex> lock(impl->mu);
      --impl->running;
      impl->cv.notify_all();
    });
  }
}

IoRuntime::~IoRuntime() {
  // Let outstanding work (closing sockets, failing pending calls) drain so every callback runs;
  // if something keeps the context busy past the grace period, stop it hard.
  impl_->guard.reset();
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    if (!impl_->cv.wait_for(lock, std::chrono::seconds(5), [&] { return impl_->running == 0; })) {
      PENSTOCK_LOG(Warn) << "I/O runtime still busy 5 s after shutdown began; stopping it";
      impl_->io.stop();
    }
  }
  for (auto& t : impl_->threads) t.join();
}

void* IoRuntime::native_context() { return &impl_->io; }

}  // namespace penstock::net
