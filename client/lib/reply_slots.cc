#include "client/lib/reply_slots.h"

namespace penstock::client {

ReplySlots::ReplySlots() {
  free_.reserve(proto::meta::kReplySlots);
  // Handed out from the back: slot 0 first.
  for (uint32_t s = proto::meta::kReplySlots; s > 0; --s) free_.push_back(s - 1);
}

ReplySlots::Held::Held(ReplySlots& slots) : slots_(slots) {
  std::unique_lock lock(slots_.mu_);
  slots_.freed_.wait(lock, [&] { return !slots_.free_.empty(); });
  slot_ = slots_.free_.back();
  slots_.free_.pop_back();
  seq_ = ++slots_.last_seq_[slot_];
}

ReplySlots::Held::~Held() {
  {
    std::lock_guard lock(slots_.mu_);
    if (unanswered_) {
      slots_.free_.insert(slots_.free_.begin(), slot_);
    } else {
      slots_.free_.push_back(slot_);
    }
  }
  slots_.freed_.notify_one();
}

}  // namespace penstock::client
