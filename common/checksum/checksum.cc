#include "common/checksum/checksum.h"

#include <algorithm>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace penstock::checksum {

uint64_t xxh3(std::span<const uint8_t> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

int64_t first_bad_block(std::span<const uint8_t> bytes, std::span<const uint64_t> sums, uint32_t block) {
  for (size_t pos = 0, b = 0; pos < bytes.size(); pos += block, ++b) {
    const uint64_t sum = xxh3(bytes.subspan(pos, std::min<size_t>(block, bytes.size() - pos)));
    if (sum != sums[2 * b] && sum != sums[2 * b + 1]) return static_cast<int64_t>(b);
  }
  return -1;
}

}  // namespace penstock::checksum
