#include "client/fuse/worker_pool.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "client/fuse/wake_signal.h"
#include "common/base/log.h"
#include "common/base/long_wait.h"

namespace penstock::fuse {
namespace {

// While some place waits for requests the watch ticks slowly, enough to notice a termination
// signal; a worker that takes the last waiting place arms it (grow()).
constexpr auto kIdleTick = std::chrono::milliseconds(100);

constexpr int64_t kHandedOn = -1;  // Worker::serving_since after the watch gave the place away

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

struct WorkerPool::Worker {
  WorkerPool* pool = nullptr;
  std::thread thread;
  std::condition_variable cv;              // parked: woken
  bool woken = false;                      // guarded by pool->mu_
  bool ended = false;                      // guarded by pool->mu_
  std::atomic<bool> placeless{false};      // holds no place (gave it away, or parked); written under mu_
  std::atomic<bool> in_receive{false};     // waiting in receive(): join_all() signals it
  // Steady ns when its request came, 0 between requests, kHandedOn once the watch gave its place
  // away: the watch's compare-exchange and the worker's exchange to 0 after the request decide
  // between them whether the place went, so a request that just ended keeps its place.
  std::atomic<int64_t> serving_since{0};
};

WorkerPool::WorkerPool(RequestSource& source, WorkerPoolOptions options) : source_(source), options_([&] {
  options.max_threads = std::max(1, options.max_threads);
  options.active = std::clamp(options.active, 1, options.max_threads);
  return options;
}()),
  counters_(options_.counters != nullptr ? options_.counters : &own_counters_) {}

WorkerPool::~WorkerPool() = default;  // run() joins every thread it started

WorkerPoolStats WorkerPool::stats() const { return counters_->load(); }

int WorkerPool::run() {
  install_wake_signal();  // join_all() wakes a worker waiting in receive() with it
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++places_;
    fill_place();
    if (workers_.empty()) return -EAGAIN;
  }
  watch();
  join_all();
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void WorkerPool::work(Worker* w) {
  pthread_setname_np(pthread_self(), options_.thread_name.substr(0, 15).c_str());
  set_long_wait_hook(&WorkerPool::on_long_wait, w);
  std::unique_ptr<RequestSource::Context> ctx = source_.new_context();
  while (!stopping_.load(std::memory_order_acquire)) {
    receiving_.fetch_add(1, std::memory_order_relaxed);
    w->in_receive.store(true, std::memory_order_relaxed);
    const int n = source_.receive(*ctx);
    w->in_receive.store(false, std::memory_order_relaxed);
    const int still_receiving = receiving_.fetch_sub(1, std::memory_order_relaxed) - 1;
    if (n == -EINTR) continue;
    if (n <= 0) {
      stop(n);
      break;
    }
    w->serving_since.store(now_ns(), std::memory_order_relaxed);
    if (still_receiving == 0) grow();
    source_.serve(*ctx);
    const bool handed_on = w->serving_since.exchange(0, std::memory_order_acq_rel) == kHandedOn;
    if ((handed_on || w->placeless.load(std::memory_order_acquire)) && !take_place(w)) break;
  }
  set_long_wait_hook(nullptr, nullptr);
  ctx.reset();
  std::lock_guard<std::mutex> lock(mu_);
  if (!w->placeless.load(std::memory_order_relaxed)) --places_;
  w->ended = true;
  --live_;
  watch_cv_.notify_one();
}

void WorkerPool::on_long_wait(void* arg) {
  auto* w = static_cast<Worker*>(arg);
  WorkerPool* pool = w->pool;
  std::lock_guard<std::mutex> lock(pool->mu_);
  pool->give_place(w, pool->counters_->long_waits);
}

bool WorkerPool::give_place(Worker* w, std::atomic<uint64_t>& count) {
  if (stopping_.load(std::memory_order_relaxed) || w->placeless.load(std::memory_order_relaxed)) return false;
  if (!can_fill()) return false;  // no thread to take it: the place stays with `w`
  w->placeless.store(true, std::memory_order_release);
  count.fetch_add(1, std::memory_order_relaxed);
  fill_place();  // the place moves on; places_ stays
  return true;
}

bool WorkerPool::can_fill() const {
  return !parked_.empty() || (!start_failed_ && static_cast<int>(workers_.size()) < options_.max_threads);
}

void WorkerPool::fill_place() {
  if (!parked_.empty()) {
    Worker* p = parked_.back();
    parked_.pop_back();
    p->woken = true;
    p->cv.notify_one();
    return;
  }
  if (static_cast<int>(workers_.size()) < options_.max_threads) {
    auto w = std::make_unique<Worker>();
    w->pool = this;
    counters_->threads.fetch_add(1, std::memory_order_relaxed);  // before it can serve anything
    try {
      w->thread = std::thread([this, p = w.get()] { work(p); });
    } catch (const std::system_error& e) {
      counters_->threads.fetch_sub(1, std::memory_order_relaxed);
      if (!start_failed_) {
        PENSTOCK_LOG(Warn) << "FUSE: cannot start another worker thread (" << e.what() << "); the "
                           << workers_.size() << " running serve every request";
      }
      start_failed_ = true;
      --places_;
      return;
    }
    ++live_;
    workers_.push_back(std::move(w));
    return;
  }
  // Every thread is serving or waiting long: the place stays free for the first one back.
  --places_;
}

bool WorkerPool::take_place(Worker* w) {
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_.load(std::memory_order_relaxed)) return false;
  if (!w->placeless.load(std::memory_order_relaxed)) return true;  // the watch's hand-off did not happen
  if (places_ < options_.active) {
    ++places_;
    w->placeless.store(false, std::memory_order_relaxed);
    return true;
  }
  w->woken = false;
  parked_.push_back(w);
  w->cv.wait(lock, [&] { return w->woken; });
  if (stopping_.load(std::memory_order_relaxed)) return false;  // stop() wakes parked threads placeless
  w->placeless.store(false, std::memory_order_relaxed);       // fill_place() counted the place
  return true;
}

void WorkerPool::grow() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_.load(std::memory_order_relaxed)) return;
  if (receiving_.load(std::memory_order_relaxed) > 0) return;  // one came back meanwhile
  if (places_ < options_.active) {
    ++places_;
    fill_place();
    return;
  }
  // Every place is serving: the watch looks for a stalled one until a place waits again.
  if (!watch_armed_) {
    watch_armed_ = true;
    watch_cv_.notify_one();
  }
}

void WorkerPool::stop(int error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error < 0 && error_ == 0) error_ = error;
    stopping_.store(true, std::memory_order_release);
    for (Worker* p : parked_) {
      p->woken = true;
      p->cv.notify_one();
    }
    parked_.clear();
    watch_cv_.notify_one();
  }
  source_.end();
}

void WorkerPool::watch() {
  const auto tick = std::clamp<std::chrono::microseconds>(options_.stall / 2, std::chrono::microseconds(100), kIdleTick);
  const int64_t stall_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(options_.stall).count();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_.load(std::memory_order_relaxed)) {
    watch_cv_.wait_for(lock, watch_armed_ ? tick : kIdleTick);
    if (stopping_.load(std::memory_order_relaxed)) break;
    if (source_.ended()) {
      lock.unlock();
      stop(0);
      return;
    }
    if (receiving_.load(std::memory_order_relaxed) > 0) {
      // A place waits for requests, so none waits for a place. grow() arms the watch again,
      // under mu_, when the last waiting place takes a request.
      watch_armed_ = false;
      continue;
    }
    if (!watch_armed_) continue;  // a place is being filled (grow()): a reader comes
    // Every place is serving: the request unanswered longest gives its place, once it has
    // waited `stall`.
    const int64_t now = now_ns();
    Worker* oldest = nullptr;
    int64_t since = now;
    for (const auto& w : workers_) {
      if (w->placeless.load(std::memory_order_relaxed)) continue;
      const int64_t s = w->serving_since.load(std::memory_order_relaxed);
      if (s > 0 && s < since) {
        since = s;
        oldest = w.get();
      }
    }
    if (oldest == nullptr || now - since < stall_ns) continue;
    if (!can_fill()) continue;
    // Still the same request? Its worker may have just answered it and gone back to receive().
    int64_t expected = since;
    if (!oldest->serving_since.compare_exchange_strong(expected, kHandedOn, std::memory_order_acq_rel)) continue;
    give_place(oldest, counters_->stalls);
  }
}

void WorkerPool::join_all() {
  stop(0);
  std::vector<std::unique_ptr<Worker>> workers;
  {
    std::unique_lock<std::mutex> lock(mu_);
    // A thread waiting in receive() returns with EINTR and sees stopping_; one serving a request
    // ends after it. The signal is sent again until each has ended: one sent just before its
    // receive() began is lost. A thread that ended is not joined yet, so its handle is still valid.
    while (live_ > 0) {
      for (const auto& w : workers_) {
        if (!w->ended && w->in_receive.load(std::memory_order_relaxed)) {
          pthread_kill(w->thread.native_handle(), kWakeSignal);
        }
      }
      watch_cv_.wait_for(lock, std::chrono::milliseconds(2));
    }
    workers = std::move(workers_);
    workers_.clear();
  }
  for (auto& w : workers) {
    if (w->thread.joinable()) w->thread.join();
  }
}

}  // namespace penstock::fuse
