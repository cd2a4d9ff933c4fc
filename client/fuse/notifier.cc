#include "client/fuse/notifier.h"

#include <pthread.h>

#include <system_error>

#include "common/base/log.h"

namespace penstock::fuse {

void Notifier::post(std::vector<std::function<void()>> fns) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!stopping_ && !thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      PENSTOCK_LOG(Warn) << "FUSE: no notifier thread (" << e.what() << "); notifying from the request thread";
    }
  }
  if (stopping_ || !thread_.joinable()) {
    lock.unlock();
    for (auto& fn : fns) fn();
    return;
  }
  for (auto& fn : fns) queue_.push_back(std::move(fn));
  cv_.notify_one();
}

void Notifier::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

void Notifier::run() {
  pthread_setname_np(pthread_self(), thread_name_.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> fn = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    fn();
    lock.lock();
  }
}

}  // namespace penstock::fuse
