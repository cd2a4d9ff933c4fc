// ChunkCache: LRU bound and eviction, one fetch per block in flight, generation and range
// invalidation.
#include "client/lib/chunk_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace penstock::client {
namespace {

const InodeId kIno(7);
const InodeId kOther(8);

void fill(ChunkCache::Lookup& lk, uint8_t v) {
  ASSERT_TRUE(lk.fetch);
  std::fill(lk.block->buffer().begin(), lk.block->buffer().end(), v);
  lk.block->complete(Status::ok());
}

TEST(ChunkCache, FirstLookupFetchesThenHits) {
  ChunkCache c(1 << 20);
  auto a = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_TRUE(a.fetch);
  fill(a, 5);
  auto b = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_FALSE(b.fetch);
  EXPECT_EQ(b.block, a.block);
  ASSERT_TRUE(b.block->wait().is_ok());
  EXPECT_EQ(b.block->data()[100], 5);
  CacheStats s = c.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.hits, 1u);
  EXPECT_EQ(s.used_bytes, 4096u);
}

TEST(ChunkCache, StaysWithinCapacityEvictingLeastRecentlyUsed) {
  ChunkCache c(3 * 4096);
  for (uint64_t i = 0; i < 3; ++i) {
    auto lk = c.get_or_start(kIno, 1, i * 4096, 4096);
    fill(lk, static_cast<uint8_t>(i));
  }
  // Use block 0 so that block 1 is the least recently used.
  ASSERT_NE(c.find_ready(kIno, 1, 0), nullptr);
  auto d = c.get_or_start(kIno, 1, 3 * 4096, 4096);
  fill(d, 3);
  CacheStats s = c.stats();
  EXPECT_EQ(s.used_bytes, 3 * 4096u);
  EXPECT_EQ(s.evictions, 1u);
  EXPECT_NE(c.find_ready(kIno, 1, 0), nullptr);
  EXPECT_EQ(c.find_ready(kIno, 1, 4096), nullptr) << "the LRU block should be gone";
  EXPECT_NE(c.find_ready(kIno, 1, 2 * 4096), nullptr);
  EXPECT_NE(c.find_ready(kIno, 1, 3 * 4096), nullptr);
  // Many more blocks: never above capacity.
  for (uint64_t i = 10; i < 100; ++i) {
    auto lk = c.get_or_start(kOther, 1, i * 4096, 4096);
    fill(lk, 1);
    EXPECT_LE(c.stats().used_bytes, 3 * 4096u);
  }
}

// A file's last block holds whole pages: past the end of file it was fetched for, its bytes are
// zeros. Asked for the same block of a file that has grown within that page, the cache fetches
// it again instead of handing out the zeros; asked for no more than it holds, it hits.
TEST(ChunkCache, ABlockFetchedForAnOlderEndOfFileIsFetchedAgain) {
  ChunkCache c(1 << 20);
  auto old_end = c.get_or_start(kIno, 1, 0, 8192, 5000);
  EXPECT_EQ(old_end.block->valid(), 5000u);
  fill(old_end, 1);
  auto same = c.get_or_start(kIno, 1, 0, 8192, 4000);
  EXPECT_FALSE(same.fetch);
  EXPECT_EQ(same.block, old_end.block);
  auto grown = c.get_or_start(kIno, 1, 0, 8192, 6000);
  EXPECT_TRUE(grown.fetch);
  EXPECT_EQ(grown.block->valid(), 6000u);
  fill(grown, 2);
  EXPECT_EQ(c.find_ready(kIno, 1, 0), grown.block);
  EXPECT_EQ(c.stats().used_bytes, 8192u);
  EXPECT_EQ(CachedBlock(0, 4096).valid(), 4096u);  // no end given: the whole block
}

TEST(ChunkCache, ZeroCapacityCachesNothing) {
  ChunkCache c(0);
  auto a = c.get_or_start(kIno, 1, 0, 4096);
  fill(a, 1);
  auto b = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_TRUE(b.fetch);
  b.block->complete(Status::ok());
  EXPECT_EQ(c.stats().used_bytes, 0u);
}

TEST(ChunkCache, ConcurrentReadersOfABlockInFlightShareOneFetch) {
  ChunkCache c(1 << 20);
  auto first = c.get_or_start(kIno, 1, 0, 4096);
  ASSERT_TRUE(first.fetch);
  std::atomic<int> fetches{0};
  std::atomic<int> ok{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < 4; ++i) {
    readers.emplace_back([&] {
      auto lk = c.get_or_start(kIno, 1, 0, 4096);
      if (lk.fetch) ++fetches;
      if (lk.block->wait().is_ok() && lk.block->data()[0] == 9) ++ok;
    });
  }
  while (c.stats().waits < 4) std::this_thread::yield();
  std::fill(first.block->buffer().begin(), first.block->buffer().end(), 9);
  first.block->complete(Status::ok());
  for (auto& t : readers) t.join();
  EXPECT_EQ(fetches.load(), 0);
  EXPECT_EQ(ok.load(), 4);
}

TEST(ChunkCache, FindReadyJoinsABlockInFlightOnlyWhenAsked) {
  ChunkCache c(1 << 20);
  auto lk = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_EQ(c.find_ready(kIno, 1, 0), nullptr) << "a block in flight is not ready";
  auto joined = c.find_ready(kIno, 1, 0, /*join=*/true);
  ASSERT_EQ(joined, lk.block);
  EXPECT_EQ(c.find_ready(kIno, 2, 0, true), nullptr) << "another generation's block";
  EXPECT_EQ(c.find_ready(kIno, 1, 4096, true), nullptr) << "no block there: nothing is started";
  std::thread filler([&lk] { fill(lk, 9); });
  ASSERT_TRUE(joined->wait().is_ok());
  filler.join();
  EXPECT_EQ(joined->data()[4095], 9);
  CacheStats s = c.stats();
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.waits, 1u);
  EXPECT_EQ(s.hits, 0u);
}

TEST(ChunkCache, FailedFetchIsErasedAndWaitersSeeTheError) {
  ChunkCache c(1 << 20);
  auto first = c.get_or_start(kIno, 1, 0, 4096);
  auto joined = c.get_or_start(kIno, 1, 0, 4096);
  ASSERT_FALSE(joined.fetch);
  c.erase(kIno, first.block);
  first.block->complete(Status(Code::kIo, "disk"));
  EXPECT_EQ(joined.block->wait().code(), Code::kIo);
  EXPECT_TRUE(c.get_or_start(kIno, 1, 0, 4096).fetch) << "a failed block must not stay cached";
}

TEST(ChunkCache, ContinuationsRunOnceOnTheCompletingThreadAfterTheBytesArePublished) {
  ChunkCache c(1 << 20);
  auto lk = c.get_or_start(kIno, 1, 0, 4096);
  ASSERT_TRUE(lk.fetch);
  std::vector<std::string> ran;
  std::thread::id where;
  for (const char* name : {"first", "second"}) {
    ASSERT_TRUE(lk.block->then([&, name, block = lk.block](const Status& st) {
      EXPECT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_TRUE(block->done()) << "a continuation ran before the block was complete";
      EXPECT_EQ(block->data()[4095], 0x5a);
      where = std::this_thread::get_id();
      ran.push_back(name);
    }));
  }
  std::thread fetcher([&] {
    std::fill(lk.block->buffer().begin(), lk.block->buffer().end(), 0x5a);
    lk.block->complete(Status::ok());
  });
  const std::thread::id fetcher_id = fetcher.get_id();
  fetcher.join();
  EXPECT_EQ(ran, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(where, fetcher_id);
  // Complete already: nothing is kept, the caller reads the block itself.
  EXPECT_FALSE(lk.block->then([&](const Status&) { ran.push_back("late"); }));
  EXPECT_EQ(ran.size(), 2u);

  auto failed = c.get_or_start(kIno, 1, 8192, 4096);
  Status seen;
  ASSERT_TRUE(failed.block->then([&](const Status& st) { seen = st; }));
  c.erase(kIno, failed.block);
  failed.block->complete(Status(Code::kCorrupt, "block 0 fails its checksum"));
  EXPECT_EQ(seen.code(), Code::kCorrupt);
}

TEST(ChunkCache, NewGenerationDropsTheOldOneAndOldHandlesBypass) {
  ChunkCache c(1 << 20);
  auto a = c.get_or_start(kIno, 1, 0, 4096);
  fill(a, 1);
  // Another host's close bumped the generation: an open at generation 2 drops generation 1.
  c.set_generation(kIno, 2);
  EXPECT_EQ(c.find_ready(kIno, 1, 0), nullptr);
  EXPECT_EQ(c.stats().used_bytes, 0u);
  auto b = c.get_or_start(kIno, 2, 0, 4096);
  ASSERT_TRUE(b.fetch);
  fill(b, 2);
  // A handle still at generation 1 neither sees nor pollutes generation 2.
  auto old = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_TRUE(old.fetch);
  old.block->complete(Status::ok());
  auto again = c.get_or_start(kIno, 2, 0, 4096);
  EXPECT_FALSE(again.fetch);
  EXPECT_EQ(again.block->data()[0], 2);
  // A lookup of a newer generation drops the older one too.
  auto c3 = c.get_or_start(kIno, 3, 4096, 4096);
  EXPECT_TRUE(c3.fetch);
  c3.block->complete(Status::ok());
  EXPECT_EQ(c.find_ready(kIno, 2, 0), nullptr);
  // Same generation at open keeps the blocks.
  c.set_generation(kIno, 3);
  EXPECT_NE(c.find_ready(kIno, 3, 4096), nullptr);
}

TEST(ChunkCache, InvalidateRangeDropsOnlyOverlappingBlocks) {
  ChunkCache c(1 << 20);
  for (uint64_t i = 0; i < 4; ++i) {
    auto lk = c.get_or_start(kIno, 1, i * 65536, 65536);
    fill(lk, 1);
  }
  auto o = c.get_or_start(kOther, 1, 0, 65536);
  fill(o, 1);
  // An own write of 10 bytes straddling blocks 1 and 2.
  c.invalidate_range(kIno, 2 * 65536 - 5, 10);
  EXPECT_NE(c.find_ready(kIno, 1, 0), nullptr);
  EXPECT_EQ(c.find_ready(kIno, 1, 65536), nullptr);
  EXPECT_EQ(c.find_ready(kIno, 1, 2 * 65536), nullptr);
  EXPECT_NE(c.find_ready(kIno, 1, 3 * 65536), nullptr);
  EXPECT_NE(c.find_ready(kOther, 1, 0), nullptr);
  c.invalidate(kIno);
  EXPECT_EQ(c.find_ready(kIno, 1, 0), nullptr);
  EXPECT_EQ(c.stats().used_bytes, 65536u);
}

TEST(ChunkCache, InvalidatedBlockInFlightIsDetached) {
  ChunkCache c(1 << 20);
  auto inflight = c.get_or_start(kIno, 1, 0, 4096);
  ASSERT_TRUE(inflight.fetch);
  c.invalidate_range(kIno, 0, 1);  // an own write lands while the old bytes are on their way
  auto after = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_TRUE(after.fetch) << "a read after the write must not join the stale fetch";
  EXPECT_NE(after.block, inflight.block);
  inflight.block->complete(Status::ok());
  after.block->complete(Status::ok());
}

TEST(ChunkCache, ClearDropsEverythingAndCountsBlocks) {
  ChunkCache c(1 << 20);
  auto a = c.get_or_start(kIno, 1, 0, 4096);
  fill(a, 1);
  auto b = c.get_or_start(kOther, 3, 8192, 4096);
  fill(b, 2);
  EXPECT_EQ(c.clear(), 2u);
  CacheStats s = c.stats();
  EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(s.blocks, 0u);
  EXPECT_EQ(s.misses, 2u);  // counters survive a clear
  // Blocks held by readers stay readable; the cache itself fetches again.
  EXPECT_EQ(a.block->data()[0], 1);
  auto again = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_TRUE(again.fetch);
  EXPECT_NE(again.block, a.block);
  fill(again, 3);
  EXPECT_EQ(c.find_ready(kIno, 1, 0), again.block);
  EXPECT_EQ(c.clear(), 1u);
  EXPECT_EQ(c.clear(), 0u);
}

TEST(ChunkCache, ClearDetachesABlockInFlight) {
  ChunkCache c(1 << 20);
  auto fetching = c.get_or_start(kIno, 1, 0, 4096);
  ASSERT_TRUE(fetching.fetch);
  auto waiter = c.get_or_start(kIno, 1, 0, 4096);
  ASSERT_FALSE(waiter.fetch);
  EXPECT_EQ(c.clear(), 1u);
  // A lookup after the clear must not join the old fetch (it may carry pre-drop bytes).
  auto after = c.get_or_start(kIno, 1, 0, 4096);
  EXPECT_TRUE(after.fetch);
  EXPECT_NE(after.block, fetching.block);
  // The old fetch completes (successfully or not) without coming back into the cache.
  fill(fetching, 9);
  c.erase(kIno, fetching.block);  // what a failed fetch does: must not touch the new block
  ASSERT_TRUE(waiter.block->wait().is_ok());
  EXPECT_EQ(waiter.block->data()[10], 9);
  EXPECT_EQ(c.find_ready(kIno, 1, 0), nullptr);  // `after` is still in flight
  fill(after, 4);
  auto ready = c.find_ready(kIno, 1, 0);
  ASSERT_EQ(ready, after.block);
  EXPECT_EQ(ready->data()[0], 4);
  EXPECT_EQ(c.stats().blocks, 1u);
  EXPECT_EQ(c.stats().used_bytes, 4096u);
}

}  // namespace
}  // namespace penstock::client
