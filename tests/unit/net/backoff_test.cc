// common/base/backoff.h: the pause doubles up to its cap, and a pause that would end past the
// deadline is not taken. (Here because the retry loops it serves are the transports' and the
// clients'.) No timing is asserted: only the pauses the object reports.
#include "common/base/backoff.h"

#include <gtest/gtest.h>

namespace penstock {
namespace {

using std::chrono::milliseconds;

TEST(Backoff, DoublesUpToItsCapAndToACapGivenPerPause) {
  Backoff b(milliseconds(1), milliseconds(4));
  EXPECT_EQ(b.pause(), milliseconds(1));
  b.sleep();
  EXPECT_EQ(b.pause(), milliseconds(2));
  b.sleep();
  EXPECT_EQ(b.pause(), milliseconds(4));
  b.sleep();
  EXPECT_EQ(b.pause(), milliseconds(4)) << "capped";
  b.sleep(milliseconds(3));
  EXPECT_EQ(b.pause(), milliseconds(3)) << "this pause's cap";
}

TEST(Backoff, APauseEndingPastTheDeadlineIsNotTaken) {
  Backoff b(milliseconds(1), milliseconds(8));
  const auto now = Backoff::Clock::now();
  EXPECT_FALSE(b.fits(now));
  EXPECT_FALSE(b.sleep_before(now));
  EXPECT_EQ(b.pause(), milliseconds(1)) << "nothing slept, nothing doubled";
  const auto later = Backoff::Clock::now() + std::chrono::seconds(60);
  EXPECT_TRUE(b.fits(later));
  EXPECT_TRUE(b.sleep_before(later));
  EXPECT_EQ(b.pause(), milliseconds(2));
}

}  // namespace
}  // namespace penstock
