// The on-disk format of one chunk file (docs/chunk-format.md is the specification): a 64-byte
// header, a checksum table with one 16-byte entry per 4 KiB block, then the data region starting at
// a 4 KiB-aligned offset. The chunk's length is the file size minus the data offset.
// Thread-safety: pure functions and value types.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "common/base/result.h"

namespace penstock::data {

inline constexpr uint32_t kChunkMagic = 0x4b435350;  // "PSCK" little-endian
inline constexpr uint16_t kChunkFormatVersion = 1;
inline constexpr uint32_t kChunkHeaderSize = 64;
// Checksum granularity. One page: a process killed mid-write leaves each page wholly old or wholly
// new, so with two checksum slots per block (below) every block still verifies after kill -9.
inline constexpr uint32_t kBlockSize = 4096;
inline constexpr uint32_t kTableEntrySize = 16;
inline constexpr uint32_t kDataAlignment = 4096;

struct ChunkHeader {
  uint32_t block_size = kBlockSize;
  uint32_t chunk_size = 0;
  uint64_t ino = 0;
  uint64_t chunk_index = 0;
  uint32_t table_offset = kChunkHeaderSize;
  uint32_t block_count = 0;
  uint32_t data_offset = 0;
};

// A block's two checksums. `current` is the checksum of the block's newest contents; `previous`
// of the contents before the last change. A block verifies when its bytes match either: between
// the table write and the data write of an update (a crash window) the old bytes are still valid.
struct TableEntry {
  uint64_t current = 0;
  uint64_t previous = 0;
};

// The header of a new chunk of `chunk_size` bytes. REQUIRES: chunk_size is a valid layout size.
ChunkHeader make_chunk_header(uint64_t ino, uint64_t chunk_index, uint32_t chunk_size);

std::array<uint8_t, kChunkHeaderSize> encode_chunk_header(const ChunkHeader& h);

// Parses a header read from disk. kCorrupt (naming the field) on a wrong magic, an unknown version,
// a header checksum mismatch or fields that disagree with each other; disk bytes are never trusted.
Result<ChunkHeader> decode_chunk_header(std::span<const uint8_t> bytes);

// Table entries are stored little-endian, current then previous.
void encode_table_entry(const TableEntry& e, uint8_t* out);
TableEntry decode_table_entry(const uint8_t* in);

// XXH3 of one full block of zeros (the checksum of a hole filled by extending a chunk).
uint64_t zero_block_checksum();

}  // namespace penstock::data
