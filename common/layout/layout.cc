#include "common/layout/layout.h"

#include <algorithm>
#include <string>

namespace penstock::layout {

std::vector<ChunkPiece> split(uint64_t offset, uint64_t length, uint32_t chunk_size) {
  PENSTOCK_CHECK(chunk_size != 0);
  std::vector<ChunkPiece> pieces;
  uint64_t pos = offset;
  const uint64_t end = offset + length;
  while (pos < end) {
    ChunkPiece p;
    p.chunk_index = pos / chunk_size;
    p.offset_in_chunk = static_cast<uint32_t>(pos % chunk_size);
    p.length = static_cast<uint32_t>(std::min<uint64_t>(end - pos, chunk_size - p.offset_in_chunk));
    p.file_offset = pos;
    pieces.push_back(p);
    pos += p.length;
  }
  return pieces;
}

ChainId chain_of(const proto::Layout& layout, uint64_t chunk_index) {
  PENSTOCK_CHECK(!layout.chains.empty());
  return layout.chains[(chunk_index + layout.seed) % layout.chains.size()];
}

Status validate_chunk_size(uint32_t chunk_size) {
  if (chunk_size < kMinChunkSize || chunk_size > kMaxChunkSize || (chunk_size & (chunk_size - 1)) != 0) {
    return Status(Code::kInvalid, "chunk size " + std::to_string(chunk_size) +
                                      " is not a power of two between 64 KiB and 64 MiB");
  }
  return Status::ok();
}

Status validate_file_layout(const proto::Layout& layout) {
  PENSTOCK_RETURN_IF_ERROR(validate_chunk_size(layout.chunk_size));
  if (layout.stripe_count == 0 || layout.stripe_count != layout.chains.size()) {
    return Status(Code::kInvalid, "stripe count " + std::to_string(layout.stripe_count) + " does not match " +
                                      std::to_string(layout.chains.size()) + " chains");
  }
  for (const auto& c : layout.chains) {
    if (!c.valid()) return Status(Code::kInvalid, "layout names chain 0");
  }
  return Status::ok();
}

}  // namespace penstock::layout
