#include "common/checksum/checksum.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace penstock::checksum {

uint64_t xxh3(std::span<const uint8_t> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

}  // namespace penstock::checksum
