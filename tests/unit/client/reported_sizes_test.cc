// ReportedSizes: a reply made before a size report applied (a lower generation) gets the reported
// size and mtime; the report's own reply and later ones (a truncate) are left alone; entries expire
// and the table stays bounded.
#include "client/lib/reported_sizes.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

using Clock = ReportedSizes::Clock;
using std::chrono::seconds;

proto::InodeAttr file(uint64_t ino, uint64_t generation, uint64_t size, int64_t mtime) {
  proto::InodeAttr a;
  a.ino = InodeId(ino);
  a.mode = S_IFREG | 0644;
  a.generation = generation;
  a.size = size;
  a.mtime_ns = mtime;
  return a;
}

// A GETATTR the server answered at generation 3 (size 0), merged after the close's report that
// made generation 4 with 1 MiB returned: the kernel must not be told the file shrank.
TEST(ReportedSizes, AReplyFromBeforeTheReportGetsTheReportedSizeAndMtime) {
  ReportedSizes r(seconds(11), 16);
  const auto t0 = Clock::now();
  r.note(file(9, 4, 1 << 20, 500), t0);
  proto::InodeAttr older = file(9, 3, 0, 100);
  r.merge(&older);
  EXPECT_EQ(older.size, 1u << 20);
  EXPECT_EQ(older.mtime_ns, 500);
  // Another inode's reply is not touched.
  proto::InodeAttr other = file(10, 1, 7, 1);
  r.merge(&other);
  EXPECT_EQ(other.size, 7u);
  EXPECT_EQ(other.mtime_ns, 1);
}

TEST(ReportedSizes, TheReportItselfAndLaterRepliesAreLeftAlone) {
  ReportedSizes r(seconds(11), 16);
  r.note(file(9, 4, 1 << 20, 500));
  proto::InodeAttr same = file(9, 4, 1 << 20, 500);
  r.merge(&same);
  EXPECT_EQ(same.size, 1u << 20);
  // A truncate after the report (any host) is newer: its smaller size stands.
  proto::InodeAttr truncated = file(9, 5, 10, 600);
  r.merge(&truncated);
  EXPECT_EQ(truncated.size, 10u);
  EXPECT_EQ(truncated.mtime_ns, 600);
  // An older reply that already holds more (another host's report before ours) keeps it.
  proto::InodeAttr bigger = file(9, 3, 2 << 20, 700);
  r.merge(&bigger);
  EXPECT_EQ(bigger.size, 2u << 20);
  EXPECT_EQ(bigger.mtime_ns, 700);
}

TEST(ReportedSizes, ALaterReportReplacesTheEarlierOne) {
  ReportedSizes r(seconds(11), 16);
  const auto t0 = Clock::now();
  r.note(file(9, 4, 100, 1), t0);
  r.note(file(9, 6, 300, 2), t0 + seconds(5));
  proto::InodeAttr between = file(9, 5, 100, 1);  // made between the two reports
  r.merge(&between);
  EXPECT_EQ(between.size, 300u);
  // The first report's expiry does not take the second one with it.
  r.note(file(20, 1, 1, 1), t0 + seconds(12));
  EXPECT_EQ(r.size(), 2u);
  proto::InodeAttr still = file(9, 5, 100, 1);
  r.merge(&still);
  EXPECT_EQ(still.size, 300u);
}

TEST(ReportedSizes, EntriesExpireAfterKeepAndTheTableIsBounded) {
  ReportedSizes r(seconds(11), 4);
  const auto t0 = Clock::now();
  r.note(file(1, 2, 100, 1), t0);
  r.note(file(2, 2, 100, 1), t0 + seconds(12));  // the first one is past keep now
  EXPECT_EQ(r.size(), 1u);
  proto::InodeAttr old = file(1, 1, 0, 0);
  r.merge(&old);
  EXPECT_EQ(old.size, 0u) << "an expired entry was used";
  for (uint64_t ino = 3; ino < 10; ++ino) r.note(file(ino, 2, 100, 1), t0 + seconds(12));
  EXPECT_EQ(r.size(), 4u);
  proto::InodeAttr newest = file(9, 1, 0, 0);
  r.merge(&newest);
  EXPECT_EQ(newest.size, 100u) << "the newest entry must be the one kept";
}

TEST(ReportedSizes, KeepZeroKeepsNothing) {
  ReportedSizes r(Clock::duration::zero(), 16);
  r.note(file(9, 4, 100, 1));
  EXPECT_EQ(r.size(), 0u);
}

}  // namespace
}  // namespace penstock::client
