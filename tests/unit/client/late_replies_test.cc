// LateReplies: replies owed by other threads are waited for before unmounting, none is sent after.
#include "client/fuse/late_replies.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace penstock::fuse {
namespace {

using namespace std::chrono_literals;

TEST(LateReplies, CloseWaitsForOwedRepliesThenRefusesNewOnes) {
  LateReplies late;
  ASSERT_TRUE(late.owe());
  ASSERT_TRUE(late.owe());
  late.answered_in_op();  // one op answered itself after all
  std::atomic<bool> sent{false};
  std::thread holder([&] {
    std::this_thread::sleep_for(50ms);
    ASSERT_TRUE(late.may_send());
    sent = true;
    late.sent();
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(late.close(10s), 0u);
  EXPECT_TRUE(sent.load()) << "close() returned while a reply was still owed";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  holder.join();
  EXPECT_FALSE(late.owe()) << "an op may defer its reply after close()";
}

TEST(LateReplies, RepliesStillOwedAfterTheGraceAreNotSent) {
  LateReplies late;
  ASSERT_TRUE(late.owe());
  EXPECT_EQ(late.close(20ms), 1u);
  EXPECT_FALSE(late.may_send()) << "a reply after close() would write to a closed descriptor";
}

TEST(LateReplies, CloseWaitsForAReplyBeingSent) {
  LateReplies late;
  ASSERT_TRUE(late.owe());
  ASSERT_TRUE(late.may_send());  // sending now, not owed any more
  std::atomic<bool> done{false};
  std::thread sender([&] {
    std::this_thread::sleep_for(50ms);
    done = true;
    late.sent();
  });
  EXPECT_EQ(late.close(0ms), 0u);
  EXPECT_TRUE(done.load()) << "close() returned while a reply was being written";
  sender.join();
}

}  // namespace
}  // namespace penstock::fuse
