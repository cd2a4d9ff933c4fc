#include "client/fuse/late_replies.h"

namespace penstock::fuse {

bool LateReplies::owe() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  ++owed_;
  return true;
}

void LateReplies::answered_in_op() {
  std::lock_guard<std::mutex> lock(mu_);
  --owed_;
  cv_.notify_all();
}

bool LateReplies::may_send() {
  std::lock_guard<std::mutex> lock(mu_);
  --owed_;
  cv_.notify_all();
  if (closed_) return false;
  ++sending_;
  return true;
}

void LateReplies::sent() {
  std::lock_guard<std::mutex> lock(mu_);
  --sending_;
  cv_.notify_all();
}

uint64_t LateReplies::close(std::chrono::milliseconds grace) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, grace, [this] { return owed_ == 0; });
  closed_ = true;
  cv_.wait(lock, [this] { return sending_ == 0; });
  return owed_;
}

}  // namespace penstock::fuse
