#include "server/data/recent_reads.h"

#include <utility>

namespace penstock::data {

RecentReads::Scope& RecentReads::Scope::operator=(Scope&& o) noexcept {
  if (this != &o) {
    end();
    owner_ = std::exchange(o.owner_, nullptr);
  }
  return *this;
}

void RecentReads::Scope::end() {
  RecentReads* r = std::exchange(owner_, nullptr);
  if (r == nullptr) return;
  // The end time first: a write that sees no read in progress then sees this one's end.
  r->last_end_ns_.store(now_ns(), std::memory_order_relaxed);
  r->reads_.fetch_sub(1, std::memory_order_release);
}

void RecentReads::Scope::cancel() {
  RecentReads* r = std::exchange(owner_, nullptr);
  if (r != nullptr) r->reads_.fetch_sub(1, std::memory_order_release);
}

RecentReads::Scope RecentReads::start() {
  reads_.fetch_add(1, std::memory_order_relaxed);
  return Scope(this);
}

bool RecentReads::recent() const {
  if (reads_.load(std::memory_order_acquire) > 0) return true;
  return now_ns() - last_end_ns_.load(std::memory_order_relaxed) < hold_ns_;
}

int64_t RecentReads::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace penstock::data
