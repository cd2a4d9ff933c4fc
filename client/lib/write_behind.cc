#include "client/lib/write_behind.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "common/base/long_wait.h"

namespace penstock::client {

Status WriteSource::take(uint8_t* dst, size_t n) {
  PENSTOCK_CHECK(taken_ + n <= size_);
  if (fd_ < 0) {
    std::memcpy(dst, mem_.data() + taken_, n);
    taken_ += n;
    return Status::ok();
  }
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd_, dst + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const std::string why = r < 0 ? std::strerror(errno) : "the pipe ended early";
      return Status(Code::kIo, "reading write data from the kernel's pipe (" + std::to_string(taken_ + got) + " of " +
                                   std::to_string(size_) + " bytes): " + why);
    }
    got += static_cast<size_t>(r);
  }
  taken_ += n;
  return Status::ok();
}

void DirtyBudget::acquire(uint64_t n) {
  std::unique_lock<std::mutex> lock(mu_);
  if (used_ + n > limit_ && in_flight_ > 0) {
    ++waits_;
    // Waiting for sends to finish can take milliseconds: a FUSE worker lets another take requests
    // meanwhile (outside this leaf lock, as the hook takes the pool's).
    lock.unlock();
    before_long_wait();
    lock.lock();
    cv_.wait(lock, [&] { return used_ + n <= limit_ || in_flight_ == 0; });
  }
  used_ += n;
}

void DirtyBudget::start_flight(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  in_flight_ += n;
}

void DirtyBudget::finish_flight(uint64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_ -= std::min(in_flight_, n);
    used_ -= std::min(used_, n);
  }
  cv_.notify_all();
}

void DirtyBudget::release_buffered(uint64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= std::min(used_, n);
  }
  cv_.notify_all();
}

uint64_t DirtyBudget::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t DirtyBudget::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

uint64_t DirtyBudget::waits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waits_;
}

void WriteError::record(const Status& st) {
  if (st.is_ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = st;
  ++seq_;
  reported_ = false;
}

uint64_t WriteError::sample() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reported_ && seq_ > 0 ? seq_ : 0;
}

Status WriteError::check(WriteCursor* cursor, bool advance) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool news = cursor != nullptr ? cursor->seen < seq_ : !reported_;
  if (!news) return Status::ok();
  if (advance) {
    if (cursor != nullptr) cursor->seen = seq_;
    reported_ = true;
  }
  return latest_;
}

bool WriteError::unreported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return !reported_;
}

TaskPool::TaskPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { run(); });
}

TaskPool::~TaskPool() { stop(); }

void TaskPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      queue_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  task();
}

bool TaskPool::try_submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return false;
  queue_.push_back(std::move(task));
  cv_.notify_one();
  return true;
}

void TaskPool::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool TaskPool::stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stopping_;
}

void TaskPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace penstock::client
