// checksum::xxh3 must give the same value on every host: the values are stored in chunk files and
// compared across machines. The reference is the portable, inlined XXH3 (scalar and SSE2 code
// only), whatever vector unit the dispatched build picks on this CPU.
#include "common/checksum/checksum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace penstock::checksum {
namespace {

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : v) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  return v;
}

TEST(Checksum, EmptyInputHasTheSpecifiedValue) {
  EXPECT_EQ(xxh3({}), 0x2D06800538D394C2ull);  // XXH3_64bits of no bytes, from the XXH3 spec
}

TEST(Checksum, MatchesPortableXxh3AtEveryLengthAndAlignment) {
  const std::vector<uint8_t> data = pattern((1u << 20) + 64);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 300; ++n) lengths.push_back(n);  // every small-input code path
  for (size_t n : {1023u, 1024u, 1025u, 4095u, 4096u, 4097u, 65536u, 1u << 20}) lengths.push_back(n);
  for (size_t align = 0; align < 8; ++align) {
    for (size_t n : lengths) {
      const std::span<const uint8_t> s(data.data() + align, n);
      ASSERT_EQ(xxh3(s), XXH3_64bits(s.data(), s.size())) << "length " << n << ", offset " << align;
    }
  }
}

TEST(Checksum, FirstBadBlockNamesTheCorruptBlock) {
  std::vector<uint8_t> data = pattern(3 * 4096 + 100);
  std::vector<uint64_t> sums;
  for (size_t pos = 0; pos < data.size(); pos += 4096) {
    const size_t n = std::min<size_t>(4096, data.size() - pos);
    sums.push_back(0);  // a stale value, which must not matter when the other one matches
    sums.push_back(XXH3_64bits(data.data() + pos, n));
  }
  EXPECT_EQ(first_bad_block(data, sums, 4096), -1);
  data[3 * 4096 + 99] ^= 1;
  EXPECT_EQ(first_bad_block(data, sums, 4096), 3);
  data[4096] ^= 0x80;
  EXPECT_EQ(first_bad_block(data, sums, 4096), 1);
}

}  // namespace
}  // namespace penstock::checksum
