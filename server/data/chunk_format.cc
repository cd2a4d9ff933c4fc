#include "server/data/chunk_format.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/checksum/checksum.h"
#include "common/layout/layout.h"

namespace penstock::data {
namespace {

template <class I>
void put(uint8_t* out, size_t pos, I v) {
  std::memcpy(out + pos, &v, sizeof(I));
}
template <class I>
I get(const uint8_t* in, size_t pos) {
  I v{};
  std::memcpy(&v, in + pos, sizeof(I));
  return v;
}

// Byte positions inside the header.
constexpr size_t kMagicPos = 0, kVersionPos = 4, kHeaderSizePos = 6, kBlockSizePos = 8, kChunkSizePos = 12,
                 kInoPos = 16, kIndexPos = 24, kTableOffsetPos = 32, kBlockCountPos = 36, kDataOffsetPos = 40,
                 kChecksumPos = 56;

uint32_t round_up(uint32_t v, uint32_t a) { return (v + a - 1) / a * a; }

}  // namespace

ChunkHeader make_chunk_header(uint64_t ino, uint64_t chunk_index, uint32_t chunk_size) {
  ChunkHeader h;
  h.chunk_size = chunk_size;
  h.ino = ino;
  h.chunk_index = chunk_index;
  h.block_count = chunk_size / kBlockSize;
  h.data_offset = round_up(kChunkHeaderSize + h.block_count * kTableEntrySize, kDataAlignment);
  return h;
}

std::array<uint8_t, kChunkHeaderSize> encode_chunk_header(const ChunkHeader& h) {
  std::array<uint8_t, kChunkHeaderSize> out{};
  put<uint32_t>(out.data(), kMagicPos, kChunkMagic);
  put<uint16_t>(out.data(), kVersionPos, kChunkFormatVersion);
  put<uint16_t>(out.data(), kHeaderSizePos, static_cast<uint16_t>(kChunkHeaderSize));
  put<uint32_t>(out.data(), kBlockSizePos, h.block_size);
  put<uint32_t>(out.data(), kChunkSizePos, h.chunk_size);
  put<uint64_t>(out.data(), kInoPos, h.ino);
  put<uint64_t>(out.data(), kIndexPos, h.chunk_index);
  put<uint32_t>(out.data(), kTableOffsetPos, h.table_offset);
  put<uint32_t>(out.data(), kBlockCountPos, h.block_count);
  put<uint32_t>(out.data(), kDataOffsetPos, h.data_offset);
  put<uint64_t>(out.data(), kChecksumPos, checksum::xxh3(std::span<const uint8_t>(out.data(), kChecksumPos)));
  return out;
}

Result<ChunkHeader> decode_chunk_header(std::span<const uint8_t> bytes) {
  auto bad = [](const std::string& what) { return Status(Code::kCorrupt, "chunk header: " + what); };
  if (bytes.size() < kChunkHeaderSize) return bad("shorter than 64 bytes");
  const uint8_t* in = bytes.data();
  if (get<uint32_t>(in, kMagicPos) != kChunkMagic) return bad("wrong magic (not a penstock chunk file)");
  if (get<uint64_t>(in, kChecksumPos) != checksum::xxh3(bytes.first(kChecksumPos))) {
    return bad("checksum mismatch");
  }
  if (get<uint16_t>(in, kVersionPos) != kChunkFormatVersion) {
    return bad("unknown format version " + std::to_string(get<uint16_t>(in, kVersionPos)));
  }
  if (get<uint16_t>(in, kHeaderSizePos) != kChunkHeaderSize) return bad("wrong header size");
  ChunkHeader h;
  h.block_size = get<uint32_t>(in, kBlockSizePos);
  h.chunk_size = get<uint32_t>(in, kChunkSizePos);
  h.ino = get<uint64_t>(in, kInoPos);
  h.chunk_index = get<uint64_t>(in, kIndexPos);
  h.table_offset = get<uint32_t>(in, kTableOffsetPos);
  h.block_count = get<uint32_t>(in, kBlockCountPos);
  h.data_offset = get<uint32_t>(in, kDataOffsetPos);
  if (h.block_size != kBlockSize) return bad("unsupported block size " + std::to_string(h.block_size));
  if (!layout::validate_chunk_size(h.chunk_size).is_ok()) return bad("invalid chunk size " + std::to_string(h.chunk_size));
  ChunkHeader want = make_chunk_header(h.ino, h.chunk_index, h.chunk_size);
  if (h.table_offset != want.table_offset || h.block_count != want.block_count || h.data_offset != want.data_offset) {
    return bad("table or data offset disagrees with the chunk size");
  }
  return h;
}

void encode_table_entry(const TableEntry& e, uint8_t* out) {
  put<uint64_t>(out, 0, e.current);
  put<uint64_t>(out, 8, e.previous);
}

TableEntry decode_table_entry(const uint8_t* in) { return TableEntry{get<uint64_t>(in, 0), get<uint64_t>(in, 8)}; }

uint64_t zero_block_checksum() {
  static const uint64_t value = [] {
    std::vector<uint8_t> zeros(kBlockSize, 0);
    return checksum::xxh3(zeros);
  }();
  return value;
}

}  // namespace penstock::data
