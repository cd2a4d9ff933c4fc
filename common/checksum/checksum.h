// Checksums: XXH3-64 over byte ranges, used per block of every chunk (on write and on read).
// Thread-safety: pure.
#pragma once

#include <cstdint>
#include <span>

namespace penstock::checksum {

uint64_t xxh3(std::span<const uint8_t> bytes);

}  // namespace penstock::checksum
