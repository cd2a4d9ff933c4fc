#include "server/data/recent_reads.h"

#include <gtest/gtest.h>

#include <chrono>
#include <utility>

namespace penstock::data {
namespace {

using namespace std::chrono_literals;

TEST(RecentReads, NoReadYetIsNotRecent) {
  RecentReads r(1h);
  EXPECT_FALSE(r.recent());
  EXPECT_EQ(r.in_progress(), 0);
}

TEST(RecentReads, AReadIsRecentWhileInProgressAndForTheHoldAfter) {
  RecentReads r(1h);
  {
    RecentReads::Scope a = r.start();
    RecentReads::Scope b = r.start();
    EXPECT_TRUE(r.recent());
    EXPECT_EQ(r.in_progress(), 2);
  }
  EXPECT_EQ(r.in_progress(), 0);
  EXPECT_TRUE(r.recent()) << "a read that ended a moment ago no longer counts";
}

TEST(RecentReads, WithoutAHoldOnlyReadsInProgressCount) {
  RecentReads r(0ns);
  RecentReads::Scope a = r.start();
  EXPECT_TRUE(r.recent());
  a = RecentReads::Scope();
  EXPECT_FALSE(r.recent());
}

TEST(RecentReads, ACancelledReadStartsNoHold) {
  RecentReads r(1h);
  RecentReads::Scope a = r.start();
  a.cancel();
  EXPECT_EQ(r.in_progress(), 0);
  EXPECT_FALSE(r.recent()) << "a read that never waited for the disk held writes back";
  a = RecentReads::Scope();  // ending a cancelled scope does nothing
  EXPECT_FALSE(r.recent());
}

TEST(RecentReads, AMovedScopeEndsOnce) {
  RecentReads r(0ns);
  {
    RecentReads::Scope a = r.start();
    RecentReads::Scope b = std::move(a);
    RecentReads::Scope c;
    c = std::move(b);
    EXPECT_EQ(r.in_progress(), 1);
  }
  EXPECT_EQ(r.in_progress(), 0);
}

}  // namespace
}  // namespace penstock::data
