// DirAttrCache: only directories, newest by ctime, invalidation of replies in flight, age limit,
// bounded size.
#include "client/lib/dir_attr_cache.h"

#include <sys/stat.h>

#include <thread>

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

using std::chrono::milliseconds;

proto::InodeAttr dir(uint64_t ino, int64_t ctime, uint32_t nlink = 2) {
  proto::InodeAttr a;
  a.ino = InodeId(ino);
  a.mode = S_IFDIR | 0755;
  a.nlink = nlink;
  a.ctime_ns = a.mtime_ns = ctime;
  return a;
}

TEST(DirAttrCache, ServesADirectoryWithTheAgeLeft) {
  DirAttrCache c(milliseconds(1000), 16);
  c.offer(c.ticket(), dir(5, 100));
  auto hit = c.get(InodeId(5));
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->attr.ctime_ns, 100);
  EXPECT_GT(hit->left_s, 0.5);
  EXPECT_LE(hit->left_s, 1.0);
  EXPECT_FALSE(c.get(InodeId(6)).has_value());
}

TEST(DirAttrCache, IgnoresFilesAndInvalidInodes) {
  DirAttrCache c(milliseconds(1000), 16);
  proto::InodeAttr f = dir(7, 1);
  f.mode = S_IFREG | 0644;
  c.offer(c.ticket(), f);
  c.offer(c.ticket(), dir(0, 1));
  EXPECT_EQ(c.size(), 0u);
}

TEST(DirAttrCache, AnOlderReplyDoesNotReplaceANewerOne) {
  DirAttrCache c(milliseconds(1000), 16);
  const auto early = c.ticket();  // e.g. a GETATTR sent before this mount's create
  c.offer(c.ticket(), dir(5, 200, 3));  // the create's reply: the parent after the create
  c.offer(early, dir(5, 150, 2));       // the GETATTR's reply arrives late
  EXPECT_EQ(c.get(InodeId(5))->attr.nlink, 3u);
  c.offer(c.ticket(), dir(5, 250, 4));
  EXPECT_EQ(c.get(InodeId(5))->attr.nlink, 4u);
}

TEST(DirAttrCache, AReplyToARequestSentBeforeAnInvalidationIsDropped) {
  DirAttrCache c(milliseconds(1000), 16);
  c.offer(c.ticket(), dir(5, 100));
  const auto in_flight = c.ticket();
  c.invalidate(InodeId(5));  // an unlink in the directory returned
  EXPECT_FALSE(c.get(InodeId(5)).has_value());
  c.offer(in_flight, dir(5, 300));
  EXPECT_FALSE(c.get(InodeId(5)).has_value()) << "may predate the unlink";
  c.offer(c.ticket(), dir(5, 400));
  EXPECT_TRUE(c.get(InodeId(5)).has_value());
  c.offer(c.ticket(), dir(6, 1));
  c.invalidate_all();
  EXPECT_EQ(c.size(), 0u);
}

TEST(DirAttrCache, NothingIsServedPastTheMaximumAgeOrWhenOff) {
  DirAttrCache c(milliseconds(20), 16);
  c.offer(c.ticket(), dir(5, 100));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(c.get(InodeId(5)).has_value());
  DirAttrCache off(milliseconds(0), 16);
  off.offer(off.ticket(), dir(5, 100));
  EXPECT_FALSE(off.get(InodeId(5)).has_value());
}

TEST(DirAttrCache, StaysWithinItsSize) {
  DirAttrCache c(milliseconds(1000), 4);
  for (uint64_t i = 1; i <= 10; ++i) c.offer(c.ticket(), dir(i, 1));
  EXPECT_LE(c.size(), 4u);
  EXPECT_TRUE(c.get(InodeId(10)).has_value()) << "the newest is kept";
}

}  // namespace
}  // namespace penstock::client
