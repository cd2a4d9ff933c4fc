#include "server/data/chunk_format.h"

#include <gtest/gtest.h>

#include <vector>

namespace penstock::data {
namespace {

TEST(ChunkFormat, HeaderRoundTrip) {
  ChunkHeader h = make_chunk_header(42, 7, 4u << 20);
  EXPECT_EQ(h.block_count, 1024u);
  EXPECT_EQ(h.data_offset, 20480u);  // 64 + 1024 * 16 rounded up to 4 KiB
  auto bytes = encode_chunk_header(h);
  auto back = decode_chunk_header(bytes);
  ASSERT_TRUE(back.has_value()) << back.status().to_string();
  EXPECT_EQ(back->ino, 42u);
  EXPECT_EQ(back->chunk_index, 7u);
  EXPECT_EQ(back->chunk_size, 4u << 20);
  EXPECT_EQ(back->data_offset, 20480u);
}

TEST(ChunkFormat, DataOffsetsForChunkSizeLimits) {
  EXPECT_EQ(make_chunk_header(1, 0, 64u << 10).data_offset, 4096u);
  EXPECT_EQ(make_chunk_header(1, 0, 64u << 20).data_offset, 266240u);
}

TEST(ChunkFormat, EveryFlippedHeaderByteIsCorrupt) {
  auto good = encode_chunk_header(make_chunk_header(9, 3, 1u << 20));
  for (size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] ^= 0x01;
    auto r = decode_chunk_header(bad);
    ASSERT_FALSE(r.has_value()) << "byte " << i;
    EXPECT_EQ(r.error().code(), Code::kCorrupt);
  }
}

TEST(ChunkFormat, ShortHeaderIsCorrupt) {
  auto good = encode_chunk_header(make_chunk_header(9, 3, 1u << 20));
  auto r = decode_chunk_header(std::span<const uint8_t>(good.data(), 63));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kCorrupt);
}

TEST(ChunkFormat, TableEntryRoundTrip) {
  uint8_t buf[kTableEntrySize];
  encode_table_entry(TableEntry{0x1122334455667788ULL, 0x99aabbccddeeff00ULL}, buf);
  EXPECT_EQ(buf[0], 0x88);  // little-endian
  TableEntry e = decode_table_entry(buf);
  EXPECT_EQ(e.current, 0x1122334455667788ULL);
  EXPECT_EQ(e.previous, 0x99aabbccddeeff00ULL);
}

}  // namespace
}  // namespace penstock::data
