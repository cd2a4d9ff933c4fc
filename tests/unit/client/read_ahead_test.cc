// StreamDetector: sequential streams get a growing window, random reads none, and several streams
// on one handle are tracked apart.
#include "client/lib/read_ahead.h"

#include <cstdint>
#include <random>
#include <vector>

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

TEST(StreamDetector, ThirdSequentialReadStartsAStreamNotAtZero) {
  StreamDetector d(opts());
  ReadAdvice a = d.on_read(100 * kMiB, 64 * 1024);
  EXPECT_FALSE(a.sequential);
  EXPECT_EQ(a.prefetch_length, 0u);
  a = d.on_read(100 * kMiB + 64 * 1024, 64 * 1024);
  EXPECT_FALSE(a.sequential) << "one read on another's end could be two samples that touch";
  EXPECT_EQ(a.prefetch_length, 0u);
  a = d.on_read(100 * kMiB + 128 * 1024, 64 * 1024);
  EXPECT_TRUE(a.sequential);
  EXPECT_GT(a.prefetch_length, 0u);
}

TEST(StreamDetector, AReorderedStreamNotAtZeroIsFoundOnReadsThatStartOnAnotherOnesEnd) {
  StreamDetector d(opts());
  const uint64_t base = 10 * kMiB;
  constexpr uint64_t k = 128 * 1024;
  EXPECT_FALSE(d.on_read(base, k).sequential);
  EXPECT_FALSE(d.on_read(base + 2 * k, k).sequential);  // overtook the read of base + k
  EXPECT_FALSE(d.on_read(base + k, k).sequential);      // on the first read's end: 1 of 2
  ReadAdvice a = d.on_read(base + 3 * k, k);            // on the second read's end: 2 of 2
  EXPECT_TRUE(a.sequential);
  EXPECT_GT(a.prefetch_length, 0u);
  EXPECT_TRUE(d.on_read(base + 4 * k, k).sequential);
}

// Reads of one stream that overtake each other by more than the slack (an O_DIRECT read of
// several MiB reaches the mount as 1 MiB READs in any order) leave two trackers at first; each
// READ still starts on another one's end, and the stream is found.
TEST(StreamDetector, AStreamReorderedBeyondTheSlackIsFound) {
  StreamDetector d(opts());
  const uint64_t base = 10 * kMiB;
  EXPECT_FALSE(d.on_read(base + 2 * kMiB, kMiB).sequential);
  EXPECT_FALSE(d.on_read(base, kMiB).sequential);
  EXPECT_FALSE(d.on_read(base + 3 * kMiB, kMiB).sequential);
  EXPECT_FALSE(d.on_read(base + kMiB, kMiB).sequential);
  ReadAdvice a = d.on_read(base + 4 * kMiB, kMiB);
  EXPECT_TRUE(a.sequential);
  EXPECT_GT(a.prefetch_length, 0u);
}

// The READ at offset 0 may come second, after its successor made the tracker.
TEST(StreamDetector, AReadAtZeroThatComesSecondStartsTheStream) {
  StreamDetector d(opts());
  EXPECT_FALSE(d.on_read(128 * 1024, 128 * 1024).sequential);
  ReadAdvice a = d.on_read(0, 128 * 1024);
  EXPECT_TRUE(a.sequential);
  EXPECT_GT(a.prefetch_length, 0u);
  EXPECT_TRUE(d.on_read(256 * 1024, 128 * 1024).sequential);
}

// A confirmed stream whose reads skip bytes (padding between records, pages the kernel had
// cached) keeps growing its window.
TEST(StreamDetector, AStreamThatSkipsBytesKeepsGrowingItsWindow) {
  StreamDetector d(opts());
  uint64_t off = 0;
  ReadAdvice a;
  for (int i = 0; i < 12; ++i) {
    a = d.on_read(off, 128 * 1024);
    EXPECT_TRUE(a.sequential) << i;
    off += 128 * 1024 + 4096;
  }
  EXPECT_EQ(a.window, 8 * kMiB);
}

// A sampler's 128 KiB reads at random offsets of a 128 MiB file, as the kernel sends them to the
// mount: only the pages it does not cache yet, so a sample that overlaps an earlier one is read
// from that one's end. Counting every read within the slack of a stream's end as sequential (the
// detector before round 25) took 1 in 15 for a stream: whole 1 MiB blocks and read-ahead of
// up to 64 MiB, 3.4x the bytes of a 4 GiB dataset moved in train-rand.
TEST(StreamDetector, RandomSamplesStayRandomWhileThePageCacheFills) {
  StreamDetector d;  // the mount's defaults: 1 MiB slack, 4 trackers, windows up to 64 MiB
  constexpr uint64_t kFile = 128 * kMiB;
  constexpr uint64_t kPage = 4096;
  constexpr uint64_t kSample = 128 * 1024;
  std::vector<bool> cached(kFile / kPage);
  std::mt19937_64 rng(1);
  uint64_t reads = 0, sequential = 0, bytes = 0, prefetched = 0;
  for (int i = 0; i < 20000; ++i) {
    const uint64_t off = rng() % (kFile - kSample);
    const uint64_t last = (off + kSample - 1) / kPage;
    for (uint64_t p = off / kPage; p <= last;) {  // each run of pages not cached yet: one READ
      if (cached[p]) {
        ++p;
        continue;
      }
      uint64_t q = p;
      while (q <= last && !cached[q]) cached[q++] = true;
      const ReadAdvice a = d.on_read(p * kPage, (q - p) * kPage);
      ++reads;
      bytes += (q - p) * kPage;
      sequential += a.sequential ? 1 : 0;
      prefetched += a.prefetch_length;
      p = q;
    }
  }
  ASSERT_GT(reads, 1500u);  // the file is all cached after ~1900
  EXPECT_LT(sequential * 200, reads) << sequential << " of " << reads << " reads taken for a stream";
  EXPECT_LT(prefetched * 100, bytes) << prefetched << " bytes read ahead for " << bytes << " read";
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
