// Notifier: one thread that runs what FUSE request threads hand over to be done after their reply
// (after_reply, fuse_ring.h): kernel notifications such as notify_inval_entry, which wait for
// locks the kernel holds until other requests are answered. Run on a request thread, such a
// notification can wait for requests that no free thread reads any more, and the mount hangs.
// The thread starts at the first post(). No FUSE dependency.
// Thread-safety: post() and stop() from any thread at once, but not from the notifier's own thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace penstock::fuse {

class Notifier {
 public:
  explicit Notifier(std::string thread_name) : thread_name_(std::move(thread_name)) {}
  ~Notifier() { stop(); }
  Notifier(const Notifier&) = delete;
  Notifier& operator=(const Notifier&) = delete;

  // Queues `fns` for the thread, in order. When no thread can be started they run here, at once
  // (logged); after stop(), too.
  void post(std::vector<std::function<void()>> fns);

  // Runs what is queued, then ends the thread. Idempotent.
  void stop();

 private:
  void run();

  const std::string thread_name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::thread thread_;
};

}  // namespace penstock::fuse
