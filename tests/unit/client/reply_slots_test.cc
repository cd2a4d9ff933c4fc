#include "client/lib/reply_slots.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

using namespace std::chrono_literals;

TEST(ReplySlotsTest, EachChangeOfASlotTakesTheSlotsNextNumber) {
  ReplySlots slots;
  uint32_t first_slot = 0;
  {
    ReplySlots::Held a(slots);
    first_slot = a.slot();
    EXPECT_EQ(a.seq(), 1u);
  }
  ReplySlots::Held b(slots);  // the slot just freed comes back first
  EXPECT_EQ(b.slot(), first_slot);
  EXPECT_EQ(b.seq(), 2u);
  ReplySlots::Held c(slots);  // another slot starts at 1
  EXPECT_NE(c.slot(), b.slot());
  EXPECT_EQ(c.seq(), 1u);
}

// A change that got no answer may still run at penstock-meta, holding its slot there: the next
// changes take every other free slot before that one.
TEST(ReplySlotsTest, ASlotWhoseChangeGotNoAnswerIsHandedOutLast) {
  ReplySlots slots;
  uint32_t unanswered_slot = 0;
  {
    ReplySlots::Held a(slots);
    unanswered_slot = a.slot();
    a.unanswered();
  }
  std::vector<std::unique_ptr<ReplySlots::Held>> held;
  for (uint32_t i = 0; i + 1 < proto::meta::kReplySlots; ++i) {
    held.push_back(std::make_unique<ReplySlots::Held>(slots));
    EXPECT_NE(held.back()->slot(), unanswered_slot) << "change " << i;
  }
  ReplySlots::Held last(slots);
  EXPECT_EQ(last.slot(), unanswered_slot);
  EXPECT_EQ(last.seq(), 2u);
}

TEST(ReplySlotsTest, AllSlotsHeldMakesTheNextChangeWaitForOne) {
  ReplySlots slots;
  std::vector<std::unique_ptr<ReplySlots::Held>> held;
  std::set<uint32_t> seen;
  for (uint32_t i = 0; i < proto::meta::kReplySlots; ++i) {
    held.push_back(std::make_unique<ReplySlots::Held>(slots));
    EXPECT_LT(held.back()->slot(), proto::meta::kReplySlots);
    seen.insert(held.back()->slot());
  }
  EXPECT_EQ(seen.size(), proto::meta::kReplySlots);  // no slot twice
  std::atomic<bool> got{false};
  uint32_t waited_slot = proto::meta::kReplySlots;
  uint64_t waited_seq = 0;
  std::thread waiter([&] {
    ReplySlots::Held h(slots);
    waited_slot = h.slot();
    waited_seq = h.seq();
    got = true;
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_FALSE(got.load()) << "a 65th change got a slot while all were held";
  const uint32_t freed = held[10]->slot();
  held[10].reset();
  waiter.join();
  EXPECT_TRUE(got.load());
  EXPECT_EQ(waited_slot, freed);
  EXPECT_EQ(waited_seq, 2u);
}

}  // namespace
}  // namespace penstock::client
