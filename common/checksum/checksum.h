// Checksums: XXH3-64 over byte ranges, used per block of every chunk (on write and on read, by the
// data server or, for reads it leaves unread, by the client).
// Thread-safety: pure.
#pragma once

#include <cstdint>
#include <span>

namespace penstock::checksum {

uint64_t xxh3(std::span<const uint8_t> bytes);

// Checks `bytes` block by block (`block` bytes each, the last one may be shorter) against `sums`,
// which holds two acceptable checksums per block (a block may match either). Returns the index of
// the first block that matches neither, or -1 when every block matches.
// REQUIRES: block > 0 and sums.size() == 2 * ceil(bytes.size() / block).
int64_t first_bad_block(std::span<const uint8_t> bytes, std::span<const uint64_t> sums, uint32_t block);

}  // namespace penstock::checksum
