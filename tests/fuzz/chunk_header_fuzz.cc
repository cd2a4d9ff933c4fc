// Fuzz target for the chunk header decoder (bytes read from disk are never trusted): decoding
// arbitrary bytes must not crash, and a header that decodes must be self-consistent and re-encode
// to exactly the bytes it came from.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "server/data/chunk_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace penstock::data;
  auto h = decode_chunk_header(std::span<const uint8_t>(data, size));
  if (!h.has_value()) return 0;
  if (size < kChunkHeaderSize) std::abort();  // decoded from fewer bytes than a header
  if (h->block_count == 0 || h->data_offset < h->table_offset + uint64_t{h->block_count} * kTableEntrySize) {
    std::abort();  // a table that overlaps the data region would let writes corrupt checksums
  }
  auto again = encode_chunk_header(*h);
  if (std::memcmp(again.data(), data, kChunkHeaderSize) != 0) std::abort();
  return 0;
}
