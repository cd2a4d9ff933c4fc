#include "tools/bench/pattern.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>

#include <xxhash.h>

namespace penstock::bench {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the pattern is stored little-endian and written with memcpy");

constexpr size_t kRestWords = (kPatternBlock - kPatternHeader) / 8;  // 508
constexpr size_t kTableWords = 1024;

constexpr uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A fixed random table: the rest of each block is a window of it, XORed with a per-block key.
// Cheap to produce (a few GB/s per core), so generating data never limits what is measured.
struct Table {
  std::array<uint64_t, kTableWords> words{};
  Table() {
    uint64_t s = 0x50656E73746F636BULL;  // "Penstock"
    for (auto& w : words) {
      s = splitmix64(s);
      w = s;
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

uint64_t block_key(uint64_t file_id, uint64_t block_offset) {
  return splitmix64(file_id * 0xD1B54A32D192ED03ULL ^ splitmix64(block_offset));
}

uint64_t load_u64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void store_u64(std::byte* p, uint64_t v) { std::memcpy(p, &v, 8); }

std::string hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

Status corrupt(std::string_view what, uint64_t offset, const std::string& detail) {
  return make_error(Code::kCorrupt, "verification failed: " + std::string(what) + " at offset " +
                                        std::to_string(offset) + ": " + detail);
}

// Compares `got` with the regenerated block bytes `want` (both `n` bytes, starting at absolute
// offset `abs`) and describes the first difference.
Status first_difference(std::string_view what, uint64_t abs, const std::byte* got,
                        const std::byte* want, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (got[i] != want[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "byte is 0x%02x, expected 0x%02x",
                    static_cast<unsigned>(got[i]), static_cast<unsigned>(want[i]));
      return corrupt(what, abs + i, buf);
    }
  }
  return Status::ok();
}

Status verify_full_block(uint64_t file_id, uint64_t block_offset, const std::byte* b,
                         std::string_view what) {
  const uint64_t magic = load_u64(b);
  const uint64_t fid = load_u64(b + 8);
  const uint64_t boff = load_u64(b + 16);
  const uint64_t hash = load_u64(b + 24);
  if (magic != kMagic) {
    const bool zeros = std::all_of(b, b + kPatternBlock, [](std::byte x) { return x == std::byte{0}; });
    return corrupt(what, block_offset,
                   zeros ? "4 KiB block is all zeros (a hole or a lost write)"
                         : "4 KiB block has no penstock-bench header (magic " + hex(magic) +
                               "): foreign or shifted data");
  }
  if (fid != file_id) {
    return corrupt(what, block_offset,
                   "block belongs to file id " + hex(fid) + ", expected " + hex(file_id) +
                       " (data of another file)");
  }
  if (boff != block_offset) {
    return corrupt(what, block_offset,
                   "block belongs to offset " + std::to_string(boff) + " (misplaced block)");
  }
  const uint64_t actual = XXH3_64bits(b + kPatternHeader, kPatternBlock - kPatternHeader);
  if (actual != hash) {
    std::array<std::byte, kPatternBlock> want;
    generate_block(file_id, block_offset, want.data());
    Status s = first_difference(what, block_offset, b, want.data(), kPatternBlock);
    if (!s.is_ok()) return s;
    return corrupt(what, block_offset, "block checksum mismatch");
  }
  return Status::ok();
}

}  // namespace

void generate_block(uint64_t file_id, uint64_t block_offset, std::byte* out) {
  const uint64_t key = block_key(file_id, block_offset);
  static_assert(kTableWords - kRestWords >= 512);
  const size_t start = key & 511;  // window start in [0, 512)
  const uint64_t* src = table().words.data() + start;
  std::byte* rest = out + kPatternHeader;
  uint64_t k = key;
  for (size_t j = 0; j < kRestWords; ++j) {
    store_u64(rest + j * 8, src[j] ^ k);
    k += 0x9E3779B97F4A7C15ULL;
  }
  store_u64(out, kMagic);
  store_u64(out + 8, file_id);
  store_u64(out + 16, block_offset);
  store_u64(out + 24, XXH3_64bits(rest, kPatternBlock - kPatternHeader));
}

void fill_pattern(uint64_t file_id, uint64_t offset, std::byte* buf, size_t len) {
  size_t pos = 0;
  std::array<std::byte, kPatternBlock> tmp;
  while (pos < len) {
    const uint64_t abs = offset + pos;
    const uint64_t block_offset = abs - abs % kPatternBlock;
    const size_t in_block = abs - block_offset;
    const size_t n = std::min(kPatternBlock - in_block, len - pos);
    if (in_block == 0 && n == kPatternBlock) {
      generate_block(file_id, block_offset, buf + pos);
    } else {
      generate_block(file_id, block_offset, tmp.data());
      std::memcpy(buf + pos, tmp.data() + in_block, n);
    }
    pos += n;
  }
}

Status verify_pattern(uint64_t file_id, uint64_t offset, const std::byte* buf, size_t len,
                      std::string_view what) {
  size_t pos = 0;
  std::array<std::byte, kPatternBlock> tmp;
  while (pos < len) {
    const uint64_t abs = offset + pos;
    const uint64_t block_offset = abs - abs % kPatternBlock;
    const size_t in_block = abs - block_offset;
    const size_t n = std::min(kPatternBlock - in_block, len - pos);
    if (in_block == 0 && n == kPatternBlock) {
      PENSTOCK_RETURN_IF_ERROR(verify_full_block(file_id, block_offset, buf + pos, what));
    } else {
      generate_block(file_id, block_offset, tmp.data());
      PENSTOCK_RETURN_IF_ERROR(first_difference(what, abs, buf + pos, tmp.data() + in_block, n));
    }
    pos += n;
  }
  return Status::ok();
}

}  // namespace penstock::bench
