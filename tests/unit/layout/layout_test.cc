// Layout math: splitting byte ranges into chunk pieces, chain rotation, layout validation.
#include "common/layout/layout.h"

#include <map>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::layout {
namespace {

constexpr uint32_t k64K = 64u << 10;
constexpr uint32_t k4M = 4u << 20;

// The pieces must tile [offset, offset + length) exactly, in order, each inside one chunk.
void expect_tiles(const std::vector<ChunkPiece>& pieces, uint64_t offset, uint64_t length, uint32_t chunk) {
  uint64_t pos = offset;
  for (const auto& p : pieces) {
    EXPECT_EQ(p.file_offset, pos);
    EXPECT_EQ(p.chunk_index, pos / chunk);
    EXPECT_EQ(p.offset_in_chunk, pos % chunk);
    EXPECT_GT(p.length, 0u);
    EXPECT_LE(static_cast<uint64_t>(p.offset_in_chunk) + p.length, chunk);
    pos += p.length;
  }
  EXPECT_EQ(pos, offset + length);
}

TEST(LayoutTest, ZeroLengthGivesNoPieces) {
  EXPECT_TRUE(split(0, 0, k4M).empty());
  EXPECT_TRUE(split(12345, 0, k4M).empty());
  EXPECT_TRUE(split(5ull << 32, 0, k64K).empty());
}

TEST(LayoutTest, InsideOneChunk) {
  auto p = split(100, 200, k64K);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].chunk_index, 0u);
  EXPECT_EQ(p[0].offset_in_chunk, 100u);
  EXPECT_EQ(p[0].length, 200u);
  EXPECT_EQ(p[0].file_offset, 100u);
}

TEST(LayoutTest, ExactChunkBoundaries) {
  auto p = split(k4M, 2ull * k4M, k4M);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].chunk_index, 1u);
  EXPECT_EQ(p[0].offset_in_chunk, 0u);
  EXPECT_EQ(p[0].length, k4M);
  EXPECT_EQ(p[1].chunk_index, 2u);
  EXPECT_EQ(p[1].length, k4M);
  expect_tiles(p, k4M, 2ull * k4M, k4M);

  auto whole = split(0, k64K, k64K);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].length, k64K);
}

TEST(LayoutTest, StartMidChunkAcrossBoundaries) {
  const uint64_t off = k64K - 10;
  const uint64_t len = 2ull * k64K + 20;
  auto p = split(off, len, k64K);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].chunk_index, 0u);
  EXPECT_EQ(p[0].offset_in_chunk, k64K - 10);
  EXPECT_EQ(p[0].length, 10u);
  EXPECT_EQ(p[1].chunk_index, 1u);
  EXPECT_EQ(p[1].length, k64K);
  EXPECT_EQ(p[2].length, k64K);
  EXPECT_EQ(p[3].chunk_index, 3u);
  EXPECT_EQ(p[3].offset_in_chunk, 0u);
  EXPECT_EQ(p[3].length, 10u);
  expect_tiles(p, off, len, k64K);
}

TEST(LayoutTest, EndsOneByteIntoNextChunk) {
  auto p = split(0, k4M + 1ull, k4M);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[1].chunk_index, 1u);
  EXPECT_EQ(p[1].length, 1u);
}

TEST(LayoutTest, LargeOffsetsPastFourGiB) {
  const uint64_t off = (5ull << 32) + 12345;  // 20 GiB + change
  const uint64_t len = 3ull * k4M;
  auto p = split(off, len, k4M);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].chunk_index, off / k4M);
  EXPECT_EQ(p[0].offset_in_chunk, off % k4M);
  expect_tiles(p, off, len, k4M);

  const uint64_t far = (1ull << 50) - 1;
  auto q = split(far, 2, kMaxChunkSize);
  ASSERT_EQ(q.size(), 2u);
  EXPECT_EQ(q[0].chunk_index, far / kMaxChunkSize);
  EXPECT_EQ(q[0].length, 1u);
  EXPECT_EQ(q[1].chunk_index, far / kMaxChunkSize + 1);
  EXPECT_EQ(q[1].offset_in_chunk, 0u);
}

TEST(LayoutTest, ManyRangesTile) {
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  for (int i = 0; i < 500; ++i) {
    const uint32_t chunk = kMinChunkSize << (next() % 11);  // 64 KiB .. 64 MiB
    const uint64_t off = next() % (1ull << 44);
    const uint64_t len = next() % (5ull * chunk);
    expect_tiles(split(off, len, chunk), off, len, chunk);
  }
}

proto::Layout file_layout(uint32_t stripes, uint32_t seed) {
  proto::Layout l;
  l.chunk_size = k4M;
  l.stripe_count = stripes;
  l.seed = seed;
  for (uint32_t i = 0; i < stripes; ++i) l.chains.push_back(ChainId{100 + i});
  return l;
}

TEST(LayoutTest, ChainOfRotatesWithSeed) {
  for (uint32_t stripes : {1u, 2u, 3u, 7u, 16u}) {
    for (uint32_t seed : {0u, 1u, 5u, 0xffffffffu}) {
      SCOPED_TRACE(testing::Message() << "stripes " << stripes << " seed " << seed);
      auto l = file_layout(stripes, seed);
      ASSERT_TRUE(validate_file_layout(l).is_ok());
      std::map<uint64_t, int> hits;
      for (uint64_t k = 0; k < 4ull * stripes; ++k) {
        ChainId c = chain_of(l, k);
        EXPECT_EQ(c, l.chains[(k + seed) % stripes]);
        ++hits[c.value];
        // Consecutive chunks land on consecutive chains: a sequential writer uses them all.
        EXPECT_EQ(chain_of(l, k + stripes), c);
      }
      EXPECT_EQ(hits.size(), stripes);
      for (auto& [chain, n] : hits) EXPECT_EQ(n, 4) << chain;
    }
  }
  auto l = file_layout(3, 1);
  EXPECT_EQ(chain_of(l, 0), ChainId{101});
  EXPECT_EQ(chain_of(l, 1), ChainId{102});
  EXPECT_EQ(chain_of(l, 2), ChainId{100});
  EXPECT_EQ(chain_of(l, (1ull << 40) + 2), l.chains[((1ull << 40) + 3) % 3]);
}

TEST(LayoutTest, ValidateChunkSize) {
  for (uint32_t ok : {kMinChunkSize, 128u << 10, kDefaultChunkSize, kMaxChunkSize}) {
    EXPECT_TRUE(validate_chunk_size(ok).is_ok()) << ok;
  }
  for (uint32_t bad : {0u, 1u, 4096u, kMinChunkSize - 1, kMinChunkSize / 2, kMinChunkSize + 1, 3u << 20,
                       kMaxChunkSize * 2, kMaxChunkSize + 1, 0x80000000u, 0xffffffffu}) {
    Status st = validate_chunk_size(bad);
    EXPECT_EQ(st.code(), Code::kInvalid) << bad;
  }
}

TEST(LayoutTest, ValidateFileLayout) {
  EXPECT_TRUE(validate_file_layout(file_layout(1, 0)).is_ok());
  EXPECT_TRUE(validate_file_layout(file_layout(8, 3)).is_ok());

  auto bad_chunk = file_layout(2, 0);
  bad_chunk.chunk_size = 3u << 20;
  EXPECT_EQ(validate_file_layout(bad_chunk).code(), Code::kInvalid);

  auto no_stripes = file_layout(0, 0);
  EXPECT_EQ(validate_file_layout(no_stripes).code(), Code::kInvalid);

  auto mismatch = file_layout(3, 0);
  mismatch.stripe_count = 2;
  EXPECT_EQ(validate_file_layout(mismatch).code(), Code::kInvalid);
  mismatch.stripe_count = 4;
  EXPECT_EQ(validate_file_layout(mismatch).code(), Code::kInvalid);

  auto zero_chain = file_layout(3, 0);
  zero_chain.chains[1] = ChainId{0};
  EXPECT_EQ(validate_file_layout(zero_chain).code(), Code::kInvalid);

  proto::Layout dir;  // a directory layout (no chains) is not a valid file layout
  EXPECT_EQ(validate_file_layout(dir).code(), Code::kInvalid);
}

TEST(LayoutTest, ChunkCount) {
  EXPECT_EQ(chunk_count(0, k4M), 0u);
  EXPECT_EQ(chunk_count(1, k4M), 1u);
  EXPECT_EQ(chunk_count(k4M, k4M), 1u);
  EXPECT_EQ(chunk_count(k4M + 1ull, k4M), 2u);
  EXPECT_EQ(chunk_count(5ull << 32, k4M), (5ull << 32) / k4M);
  EXPECT_EQ(chunk_count(UINT64_MAX, 64u << 10), 1ull << 48);  // no wrap near the top
  EXPECT_EQ(chunk_count(UINT64_MAX - (64u << 10) + 2, 64u << 10), 1ull << 48);
}

}  // namespace
}  // namespace penstock::layout
