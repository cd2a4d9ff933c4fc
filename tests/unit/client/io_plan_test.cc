#include "client/lib/io_plan.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace penstock::client {
namespace {

constexpr uint32_t kChunk = 64u << 10;

proto::Layout three_chains(uint32_t seed = 0) {
  proto::Layout l;
  l.chunk_size = kChunk;
  l.stripe_count = 3;
  l.seed = seed;
  l.chains = {ChainId(11), ChainId(12), ChainId(13)};
  return l;
}

TEST(PlanChunkIo, SplitsAcrossChunksAndChains) {
  // 10 bytes before the end of chunk 0 through 5 bytes into chunk 3.
  const uint64_t off = kChunk - 10;
  const uint64_t len = 10 + 2ull * kChunk + 5;
  auto r = plan_chunk_io(three_chains(), off, len);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  const auto& p = *r;
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].chunk_index, 0u);
  EXPECT_EQ(p[0].offset_in_chunk, kChunk - 10);
  EXPECT_EQ(p[0].length, 10u);
  EXPECT_EQ(p[0].buf_offset, 0u);
  EXPECT_EQ(p[0].chain, ChainId(11));
  EXPECT_EQ(p[1].chunk_index, 1u);
  EXPECT_EQ(p[1].offset_in_chunk, 0u);
  EXPECT_EQ(p[1].length, kChunk);
  EXPECT_EQ(p[1].buf_offset, 10u);
  EXPECT_EQ(p[1].chain, ChainId(12));
  EXPECT_EQ(p[2].chunk_index, 2u);
  EXPECT_EQ(p[2].buf_offset, 10u + kChunk);
  EXPECT_EQ(p[2].chain, ChainId(13));
  EXPECT_EQ(p[3].chunk_index, 3u);  // wraps to the first chain
  EXPECT_EQ(p[3].length, 5u);
  EXPECT_EQ(p[3].buf_offset, 10u + 2ull * kChunk);
  EXPECT_EQ(p[3].chain, ChainId(11));
  uint64_t total = 0;
  for (const auto& io : p) total += io.length;
  EXPECT_EQ(total, len);
}

TEST(PlanChunkIo, SeedRotatesChains) {
  auto r = plan_chunk_io(three_chains(/*seed=*/2), 0, 2ull * kChunk);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].chain, ChainId(13));  // (0 + 2) % 3
  EXPECT_EQ((*r)[1].chain, ChainId(11));  // (1 + 2) % 3
}

TEST(PlanChunkIo, InsideOneChunk) {
  auto r = plan_chunk_io(three_chains(), 5 * kChunk + 100, 200);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->size(), 1u);
  EXPECT_EQ((*r)[0].chunk_index, 5u);
  EXPECT_EQ((*r)[0].offset_in_chunk, 100u);
  EXPECT_EQ((*r)[0].length, 200u);
  EXPECT_EQ((*r)[0].chain, ChainId(13));
}

TEST(PlanChunkIo, EmptyRange) {
  auto r = plan_chunk_io(three_chains(), 12345, 0);
  ASSERT_TRUE(r.has_value());
  EXPECT_TRUE(r->empty());
}

TEST(PlanChunkIo, RejectsInvalidLayouts) {
  proto::Layout no_chains = three_chains();
  no_chains.chains.clear();
  proto::Layout bad_chunk = three_chains();
  bad_chunk.chunk_size = 3000;
  proto::Layout mismatch = three_chains();
  mismatch.stripe_count = 2;
  for (const auto& l : {no_chains, bad_chunk, mismatch}) {
    auto r = plan_chunk_io(l, 0, 10);
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), Code::kInvalid);
  }
}

TEST(PlanChunkIo, RejectsRangePast64Bits) {
  auto r = plan_chunk_io(three_chains(), UINT64_MAX - 5, 10);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kFileTooBig);
}

TEST(ClipToEof, Cases) {
  EXPECT_EQ(clip_to_eof(0, 100, 1000), 100u);   // inside
  EXPECT_EQ(clip_to_eof(950, 100, 1000), 50u);  // crosses EOF
  EXPECT_EQ(clip_to_eof(1000, 100, 1000), 0u); // at EOF
  EXPECT_EQ(clip_to_eof(5000, 100, 1000), 0u); // past EOF
  EXPECT_EQ(clip_to_eof(0, 100, 0), 0u);        // empty file
}

TEST(ZeroFillTail, ShortChunkReadsAsZeros) {
  std::vector<uint8_t> buf(10, 0xAB);
  ASSERT_TRUE(zero_fill_tail(std::span<uint8_t>(buf), 4).is_ok());
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(buf[i], 0xAB) << i;
  for (size_t i = 4; i < 10; ++i) EXPECT_EQ(buf[i], 0) << i;
}

TEST(ZeroFillTail, HoleIsAllZerosAndFullPieceUntouched) {
  std::vector<uint8_t> hole(8, 0xFF);
  ASSERT_TRUE(zero_fill_tail(std::span<uint8_t>(hole), 0).is_ok());
  EXPECT_EQ(hole, std::vector<uint8_t>(8, 0));
  std::vector<uint8_t> full(8, 0x11);
  ASSERT_TRUE(zero_fill_tail(std::span<uint8_t>(full), 8).is_ok());
  EXPECT_EQ(full, std::vector<uint8_t>(8, 0x11));
}

TEST(ZeroFillTail, MoreThanAskedIsAProtocolError) {
  std::vector<uint8_t> buf(8, 0);
  Status st = zero_fill_tail(std::span<uint8_t>(buf), 9);
  EXPECT_EQ(st.code(), Code::kProtocol);
}

// A read of a sparse file: the plan, the per-piece answers of the servers and the zero filling
// together produce the file's bytes up to EOF.
TEST(ReadAssembly, HolesAndShortChunksUpToEof) {
  const proto::Layout layout = three_chains();
  const uint64_t file_size = 2ull * kChunk + 100;  // chunk 2 holds 100 bytes
  const uint64_t n = clip_to_eof(kChunk - 4, 3ull * kChunk, file_size);
  ASSERT_EQ(n, kChunk + 104);
  auto plan = plan_chunk_io(layout, kChunk - 4, n);
  ASSERT_TRUE(plan.has_value());
  ASSERT_EQ(plan->size(), 3u);
  std::vector<uint8_t> buf(n, 0xEE);  // garbage the fill must overwrite
  // Chunk 0 has its last 4 bytes (0x01), chunk 1 is a hole, chunk 2 was written for 60 bytes only.
  std::vector<uint32_t> received = {4, 0, 60};
  for (size_t i = 0; i < plan->size(); ++i) {
    auto piece = std::span<uint8_t>(buf).subspan((*plan)[i].buf_offset, (*plan)[i].length);
    for (uint32_t k = 0; k < received[i]; ++k) piece[k] = 0x01;
    ASSERT_TRUE(zero_fill_tail(piece, received[i]).is_ok());
  }
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(buf[i], 0x01);
  for (size_t i = 4; i < 4 + kChunk; ++i) ASSERT_EQ(buf[i], 0) << i;
  for (size_t i = 4 + kChunk; i < 4 + kChunk + 60; ++i) ASSERT_EQ(buf[i], 0x01) << i;
  for (size_t i = 4 + kChunk + 60; i < n; ++i) ASSERT_EQ(buf[i], 0) << i;
}

proto::ClusterMap sample_map() {
  proto::ClusterMap m;
  m.version = 7;
  m.nodes = {{NodeId(1), "127.0.0.1:7701", true, 0}, {NodeId(2), "127.0.0.1:7702", true, 0}};
  m.targets = {{TargetId(100), NodeId(1), "/t0", 0, 0, true},
               {TargetId(200), NodeId(2), "/t1", 0, 0, true},
               {TargetId(300), NodeId(9), "/t2", 0, 0, true}};  // node 9 unknown
  m.chains = {{ChainId(11), {TargetId(100)}},
              {ChainId(12), {TargetId(100), TargetId(200)}},
              {ChainId(13), {TargetId(300)}},
              {ChainId(14), {TargetId(999)}},
              {ChainId(15), {}}};
  return m;
}

TEST(ClusterRoutes, ResolvesHeadTailAndAll) {
  ClusterRoutes routes(sample_map());
  EXPECT_EQ(routes.version(), 7u);
  auto h = routes.head(ChainId(11));
  ASSERT_TRUE(h.has_value());
  EXPECT_EQ(h->target, TargetId(100));
  EXPECT_EQ(h->node, NodeId(1));
  EXPECT_EQ(h->address, "127.0.0.1:7701");
  EXPECT_EQ(routes.head(ChainId(12))->target, TargetId(100));
  EXPECT_EQ(routes.tail(ChainId(12))->target, TargetId(200));
  EXPECT_EQ(routes.tail(ChainId(12))->address, "127.0.0.1:7702");
  auto all = routes.all_targets(ChainId(12));
  ASSERT_TRUE(all.has_value());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].target, TargetId(100));
  EXPECT_EQ((*all)[1].target, TargetId(200));
}

TEST(ClusterRoutes, UnknownPartsAreNotFound) {
  ClusterRoutes routes(sample_map());
  EXPECT_EQ(routes.head(ChainId(99)).error().code(), Code::kNotFound);   // unknown chain
  EXPECT_EQ(routes.head(ChainId(13)).error().code(), Code::kNotFound);   // unknown node
  EXPECT_EQ(routes.head(ChainId(14)).error().code(), Code::kNotFound);   // unknown target
  EXPECT_EQ(routes.tail(ChainId(15)).error().code(), Code::kNotFound);   // empty chain
  EXPECT_EQ(routes.all_targets(ChainId(14)).error().code(), Code::kNotFound);
  EXPECT_EQ(ClusterRoutes().head(ChainId(11)).error().code(), Code::kNotFound);  // no map yet
}

TEST(DistinctChains, KeepsOrderDropsRepeats) {
  proto::Layout l;
  l.chains = {ChainId(3), ChainId(1), ChainId(3), ChainId(2), ChainId(1)};
  EXPECT_EQ(distinct_chains(l), (std::vector<ChainId>{ChainId(3), ChainId(1), ChainId(2)}));
}

}  // namespace
}  // namespace penstock::client
