// StreamDetector: sequential streams get a growing window, random reads none, and several streams
// on one handle are tracked apart.
#include "client/lib/read_ahead.h"

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

ReadAheadOptions opts() {
  ReadAheadOptions o;
  o.initial_window = 1 * kMiB;
  o.max_window = 8 * kMiB;
  o.slack = 1 * kMiB;
  o.trackers = 2;
  return o;
}

TEST(StreamDetector, SequentialFromZeroPrefetchesAtOnceAndWindowGrowsToMax) {
  StreamDetector d(opts());
  ReadAdvice a = d.on_read(0, 128 * 1024);
  EXPECT_TRUE(a.sequential);
  EXPECT_EQ(a.window, 1 * kMiB);
  EXPECT_EQ(a.prefetch_offset, 128 * 1024u);
  EXPECT_EQ(a.prefetch_length, 1 * kMiB);
  uint64_t off = 128 * 1024;
  uint64_t last_window = a.window;
  for (int i = 0; i < 10; ++i) {
    a = d.on_read(off, 128 * 1024);
    off += 128 * 1024;
    EXPECT_TRUE(a.sequential);
    EXPECT_GE(a.window, last_window);
    last_window = a.window;
  }
  EXPECT_EQ(last_window, 8 * kMiB);  // capped
}

TEST(StreamDetector, PrefetchRangesAreHandedOutOnceAndContiguous) {
  StreamDetector d(opts());
  uint64_t next_pf = 0;
  uint64_t off = 0;
  uint64_t total = 0;
  for (int i = 0; i < 200; ++i) {
    ReadAdvice a = d.on_read(off, 256 * 1024);
    off += 256 * 1024;
    if (a.prefetch_length == 0) continue;
    if (next_pf != 0) {
      EXPECT_EQ(a.prefetch_offset, next_pf) << "gap or overlap at read " << i;
    }
    EXPECT_GE(a.prefetch_offset, off);  // never behind the reader
    next_pf = a.prefetch_offset + a.prefetch_length;
    total += a.prefetch_length;
    EXPECT_LE(next_pf, off + 8 * kMiB);  // never more than the max window ahead
  }
  EXPECT_GT(total, 40 * kMiB);
}

TEST(StreamDetector, SecondSequentialReadStartsAStreamNotAtZero) {
  StreamDetector d(opts());
  ReadAdvice a = d.on_read(100 * kMiB, 64 * 1024);
  EXPECT_FALSE(a.sequential);
  EXPECT_EQ(a.prefetch_length, 0u);
  a = d.on_read(100 * kMiB + 64 * 1024, 64 * 1024);
  EXPECT_TRUE(a.sequential);
  EXPECT_GT(a.prefetch_length, 0u);
}

TEST(StreamDetector, RandomReadsGetNoReadAhead) {
  StreamDetector d(opts());
  const uint64_t offsets[] = {500 * kMiB, 20 * kMiB, 300 * kMiB, 77 * kMiB, 900 * kMiB, 150 * kMiB, 640 * kMiB};
  for (uint64_t off : offsets) {
    ReadAdvice a = d.on_read(off, 128 * 1024);
    EXPECT_FALSE(a.sequential) << off;
    EXPECT_EQ(a.prefetch_length, 0u) << off;
  }
}

TEST(StreamDetector, RecordReaderSurvivesARandomSamplerOnTheSameHandle) {
  ReadAheadOptions o = opts();
  o.trackers = 3;
  StreamDetector d(o);
  uint64_t seq = 0;
  d.on_read(seq, 64 * 1024);
  seq += 64 * 1024;
  const uint64_t randoms[] = {700 * kMiB, 300 * kMiB, 900 * kMiB, 450 * kMiB, 800 * kMiB};
  for (uint64_t r : randoms) {
    ReadAdvice s = d.on_read(seq, 64 * 1024);
    seq += 64 * 1024;
    EXPECT_TRUE(s.sequential) << "the record stream was lost at " << seq;
    ReadAdvice x = d.on_read(r, 4096);
    EXPECT_FALSE(x.sequential);
    EXPECT_EQ(x.prefetch_length, 0u);
  }
  EXPECT_LE(d.tracked_streams(), 3u);
}

TEST(StreamDetector, SlightlyReorderedReadsStayInTheStream) {
  StreamDetector d(opts());
  d.on_read(0, 128 * 1024);
  // Concurrent FUSE reads arrive out of order.
  EXPECT_TRUE(d.on_read(256 * 1024, 128 * 1024).sequential);
  EXPECT_TRUE(d.on_read(128 * 1024, 128 * 1024).sequential);
  EXPECT_TRUE(d.on_read(384 * 1024, 128 * 1024).sequential);
}

TEST(StreamDetector, ZeroMaxWindowMeansNoReadAhead) {
  ReadAheadOptions o = opts();
  o.max_window = 0;
  o.initial_window = 0;
  StreamDetector d(o);
  for (uint64_t off = 0; off < 4 * kMiB; off += 128 * 1024) EXPECT_EQ(d.on_read(off, 128 * 1024).prefetch_length, 0u);
}

TEST(StreamDetector, ResetForgetsStreams) {
  StreamDetector d(opts());
  d.on_read(0, 4096);
  EXPECT_EQ(d.tracked_streams(), 1u);
  d.reset();
  EXPECT_EQ(d.tracked_streams(), 0u);
  EXPECT_FALSE(d.on_read(4096, 4096).sequential);
}

}  // namespace
}  // namespace penstock::client
