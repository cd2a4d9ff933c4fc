// SlotAllocator (common/net/rdma/slot_allocator.h): contiguous runs, exhaustion, reuse after
// release, fragmentation, and a randomized check against a reference model.
#include "common/net/rdma/slot_allocator.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace penstock::net::rdma {
namespace {

TEST(SlotAllocator, RunsAreContiguousAndExhaust) {
  SlotAllocator a(8, 1024);
  EXPECT_EQ(a.capacity_bytes(), 8u * 1024);
  auto x = a.allocate(1);
  auto y = a.allocate(3000);  // 3 slots
  ASSERT_TRUE(x && y);
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 1u);
  EXPECT_EQ(a.used_slots(), 4u);
  EXPECT_FALSE(a.allocate(5 * 1024).has_value());  // 4 left
  auto z = a.allocate(4 * 1024);
  ASSERT_TRUE(z);
  EXPECT_EQ(*z, 4u);
  EXPECT_FALSE(a.allocate(1).has_value());
  a.release(*y, 3000);
  auto w = a.allocate(2048);
  ASSERT_TRUE(w);
  EXPECT_GE(*w, 1u);
  EXPECT_LE(*w + 2, 4u);
  EXPECT_FALSE(a.allocate(9 * 1024).has_value());  // more than the region
}

TEST(SlotAllocator, FragmentationNeedsAContiguousRun) {
  SlotAllocator a(6, 10);
  std::vector<size_t> firsts;
  for (int i = 0; i < 6; ++i) firsts.push_back(*a.allocate(10));
  a.release(firsts[1], 10);
  a.release(firsts[3], 10);
  a.release(firsts[5], 10);
  EXPECT_FALSE(a.allocate(20).has_value());  // three free slots, no two adjacent
  a.release(firsts[4], 10);
  auto r = a.allocate(30);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, 3u);
}

TEST(SlotAllocator, RandomizedAgainstModel) {
  std::mt19937 rng(42);
  constexpr size_t kSlots = 64;
  SlotAllocator a(kSlots, 100);
  std::vector<int> owner(kSlots, -1);
  struct Live {
    size_t first;
    size_t bytes;
    int tag;
  };
  std::vector<Live> live;
  for (int step = 0; step < 20000; ++step) {
    if (!live.empty() && (rng() % 2 == 0)) {
      size_t k = rng() % live.size();
      for (size_t s = 0; s < a.slots_for(live[k].bytes); ++s) owner[live[k].first + s] = -1;
      a.release(live[k].first, live[k].bytes);
      live.erase(live.begin() + static_cast<long>(k));
      continue;
    }
    size_t bytes = 1 + rng() % 1000;
    auto r = a.allocate(bytes);
    size_t n = a.slots_for(bytes);
    bool exists = false;
    for (size_t i = 0; i + n <= kSlots && !exists; ++i) {
      bool ok = true;
      for (size_t s = 0; s < n; ++s) ok = ok && owner[i + s] == -1;
      exists = ok;
    }
    ASSERT_EQ(r.has_value(), exists) << step;
    if (!r) continue;
    for (size_t s = 0; s < n; ++s) {
      ASSERT_EQ(owner[*r + s], -1);
      owner[*r + s] = step;
    }
    live.push_back({*r, bytes, step});
  }
}

}  // namespace
}  // namespace penstock::net::rdma
