// Layout math: pure functions from a file offset to chunks and chains (see DESIGN.md, Data layout).
// No I/O, no state. Thread-safety: pure.
#pragma once

#include <cstdint>
#include <vector>

#include "common/base/result.h"
#include "common/proto/types.h"

namespace penstock::layout {

inline constexpr uint32_t kMinChunkSize = 64u << 10;
inline constexpr uint32_t kMaxChunkSize = 64u << 20;
inline constexpr uint32_t kDefaultChunkSize = 4u << 20;

// One piece of a byte range that falls inside one chunk.
struct ChunkPiece {
  uint64_t chunk_index = 0;
  uint32_t offset_in_chunk = 0;
  uint32_t length = 0;
  uint64_t file_offset = 0;  // where the piece starts in the file
};

// Splits [offset, offset + length) into chunk pieces in file order. REQUIRES: chunk_size is valid.
std::vector<ChunkPiece> split(uint64_t offset, uint64_t length, uint32_t chunk_size);

// The chain that holds chunk `chunk_index` of a file: chains[(index + seed) % stripe_count].
// REQUIRES: the file layout is valid (validate_file_layout).
ChainId chain_of(const proto::Layout& layout, uint64_t chunk_index);

// kInvalid unless chunk_size is a power of two in [64 KiB, 64 MiB].
Status validate_chunk_size(uint32_t chunk_size);
// A file layout: valid chunk size, 1 <= stripe_count == chains.size(), no invalid chain.
Status validate_file_layout(const proto::Layout& layout);

// Number of chunks a file of `size` bytes spans (no overflow near UINT64_MAX).
inline uint64_t chunk_count(uint64_t size, uint32_t chunk_size) {
  return size / chunk_size + (size % chunk_size != 0 ? 1 : 0);
}

}  // namespace penstock::layout
