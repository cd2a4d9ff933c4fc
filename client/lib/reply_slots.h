// ReplySlots: the reply slots of this mount's session for exactly-once changes
// (common/proto/meta_service.h, ReplayReq). A change holds one slot from its first send to its
// answer (or its deadline), and every send of it carries the same sequence number, so the meta
// server can tell a repeat from a new change; the slot's next change takes the next number.
//
// Why slots and not one number per change: the meta server keeps one reply per slot, overwritten by
// the slot's next change, so what it stores per session is bounded (kReplySlots records) without
// the mount ever telling it which replies it has seen.
//
// Thread-safety: every method from any thread; acquire() blocks while all slots are held.
#pragma once

#include <array>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <vector>

#include "common/proto/meta_service.h"

namespace penstock::client {

class ReplySlots {
 public:
  ReplySlots();
  ReplySlots(const ReplySlots&) = delete;
  ReplySlots& operator=(const ReplySlots&) = delete;

  // One slot, held while it lives, with the sequence number of its change.
  class Held {
   public:
    explicit Held(ReplySlots& slots);
    ~Held();
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    uint32_t slot() const { return slot_; }
    uint64_t seq() const { return seq_; }
    // The change got no answer before its deadline: it may still run at the server, holding the
    // slot there, so the slot is handed out again only after every other free one.
    void unanswered() { unanswered_ = true; }

   private:
    ReplySlots& slots_;
    uint32_t slot_ = 0;
    uint64_t seq_ = 0;
    bool unanswered_ = false;
  };

 private:
  std::mutex mu_;  // leaf lock
  std::condition_variable freed_;
  std::vector<uint32_t> free_;  // handed out from the back; guarded by mu_
  std::array<uint64_t, proto::meta::kReplySlots> last_seq_{};    // guarded by mu_
};

}  // namespace penstock::client
