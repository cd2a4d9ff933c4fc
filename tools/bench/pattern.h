// Self-verifying data pattern of penstock-bench: every byte the benchmark writes is a pure function
// of (file id, offset in the file), so every byte it reads back can be checked without keeping a
// copy. The file is cut into 4 KiB blocks; each block is
//   [0, 8)    magic "PSTKBNCH" (little-endian u64 kMagic)
//   [8, 16)   file id        (u64 LE)
//   [16, 24)  block offset   (u64 LE, offset of the block's first byte in the file)
//   [24, 32)  XXH3-64 of bytes [32, 4096) of the block
//   [32, 4096) pseudo-random bytes derived from (file id, block offset)
// A flipped byte breaks the hash (or a header field), a block written at the wrong place or into
// the wrong file carries the wrong offset or file id. A file whose size is not a multiple of 4 KiB
// ends with a prefix of a full block; partial blocks are checked byte by byte against the
// regenerated block.
// Thread-safety: all functions are pure and may be called from any thread concurrently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/status.h"

namespace penstock::bench {

inline constexpr size_t kPatternBlock = 4096;
inline constexpr size_t kPatternHeader = 32;
inline constexpr uint64_t kMagic = 0x48434E424B545350ULL;  // "PSTKBNCH" little-endian

// Writes the full 4 KiB block that starts at `block_offset` (a multiple of kPatternBlock) of file
// `file_id` into `out` (kPatternBlock bytes, owned by the caller).
void generate_block(uint64_t file_id, uint64_t block_offset, std::byte* out);

// Fills `buf[0, len)` with the bytes of file `file_id` at [offset, offset + len). Any alignment.
void fill_pattern(uint64_t file_id, uint64_t offset, std::byte* buf, size_t len);

// Checks that `buf[0, len)` holds exactly the bytes of file `file_id` at [offset, offset + len).
// Ok when it does; otherwise kCorrupt with a message naming `what` (normally the path), the
// absolute offset of the first wrong byte or of the wrong block, and what was found instead
// (e.g. a block that belongs to another offset or another file).
Status verify_pattern(uint64_t file_id, uint64_t offset, const std::byte* buf, size_t len,
                      std::string_view what);

}  // namespace penstock::bench
