#include "common/checksum/checksum.h"

#include <algorithm>

// On x86-64, libxxhash's runtime dispatch picks the widest vector unit the CPU has (AVX-512, AVX2,
// else SSE2): 1.5-3x the baseline SSE2 code the compiler emits for an inlined XXH3 on 4 KiB blocks
// (docs/performance.md, round 20). The checksum is the same either way; only the speed differs.
#if defined(__x86_64__)
#define XXH_DISPATCH_DISABLE_REPLACE
#include <xxh_x86dispatch.h>
#else
#define XXH_INLINE_ALL
#include <xxhash.h>
#endif

namespace penstock::checksum {

uint64_t xxh3(std::span<const uint8_t> bytes) {
#if defined(__x86_64__)
  return XXH3_64bits_dispatch(bytes.data(), bytes.size());
#else
  return XXH3_64bits(bytes.data(), bytes.size());
#endif
}

int64_t first_bad_block(std::span<const uint8_t> bytes, std::span<const uint64_t> sums, uint32_t block) {
  for (size_t pos = 0, b = 0; pos < bytes.size(); pos += block, ++b) {
    const uint64_t sum = xxh3(bytes.subspan(pos, std::min<size_t>(block, bytes.size() - pos)));
    if (sum != sums[2 * b] && sum != sums[2 * b + 1]) return static_cast<int64_t>(b);
  }
  return -1;
}

}  // namespace penstock::checksum
