#include "server/data/chunk_store.h"

#include <fcntl.h>
#include <linux/magic.h>  // EXT4_SUPER_MAGIC, XFS_SUPER_MAGIC
#include <sys/mount.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "common/base/bytes.h"
#include "common/checksum/checksum.h"
#include "server/data/chunk_format.h"
#include "server/data/uring_io.h"
#include "tests/support/posix_util.h"
#include "tests/unit/data/test_util.h"

namespace penstock::data {
namespace {

using testing::flip_byte;
using testing::pattern;
using testing::poke;
using testing::TempDir;

constexpr uint32_t kChunk4M = 4u << 20;
constexpr uint32_t kChunk64K = 64u << 10;
const InodeId kIno(1000);

// How a test's store runs: I/O engine, open-file cache size, O_DIRECT for all data, for writes
// of at least direct_write_min bytes, or for uncached reads of chunks of direct_read_min bytes.
struct StoreMode {
  bool posix = false;
  size_t fd_cache = 0;
  bool direct = false;
  uint32_t direct_write_min = 0;
  uint32_t direct_read_min = 0;
  const char* name = "";
};

// Every test runs on io_uring and on the POSIX fallback, with the open-file cache off and on (a
// small one, so eviction happens), with O_DIRECT data I/O, with O_DIRECT for large writes only
// (8 KiB and up: most test writes, so one chunk sees both kinds mixed with buffered reads), and
// with that and O_DIRECT for reads of chunks of 8 KiB and up whose range is not cached (so one
// chunk's reads go both ways, as its writes leave pages cached or not).
class ChunkStoreTest : public ::testing::TestWithParam<StoreMode> {
 protected:
  void SetUp() override {
    force_posix_io_for_test(GetParam().posix);
    open_store();
  }
  void TearDown() override {
    store_.reset();
    force_posix_io_for_test(false);
  }
  void open_store() {
    store_.reset();
    auto t = Target::open(dir_.path());
    ASSERT_TRUE(t.has_value()) << t.status().to_string();
    ChunkStoreOptions options;
    options.fd_cache = GetParam().fd_cache;
    options.direct_io = GetParam().direct;
    options.direct_write_min = GetParam().direct_write_min;
    options.direct_read_min = GetParam().direct_read_min;
    store_ = std::make_unique<ChunkStore>(std::shared_ptr<Target>(std::move(*t)), options);
    // Where the test directory's file system refuses O_DIRECT (tmpfs before Linux 6.6) the store
    // falls back to buffered I/O; on ext4/xfs it must really use O_DIRECT.
    struct statfs fs {};
    ASSERT_EQ(::statfs(dir_.path().c_str(), &fs), 0);
    if (GetParam().direct && (fs.f_type == EXT4_SUPER_MAGIC || fs.f_type == XFS_SUPER_MAGIC)) {
      EXPECT_TRUE(store_->direct_io_active());
    }
    if (GetParam().direct && !store_->direct_io_active()) {
      std::printf("note: O_DIRECT is refused by $TMPDIR's file system; the buffered fallback is tested\n");
    }
  }

  uint64_t write(uint64_t index, uint32_t offset, const std::vector<uint8_t>& data, uint32_t chunk = kChunk4M,
                 InodeId ino = kIno) {
    auto r = store_->write(ino, index, chunk, offset, data);
    EXPECT_TRUE(r.has_value()) << r.status().to_string();
    return r.has_value() ? *r : 0;
  }
  std::vector<uint8_t> read(uint64_t index, uint32_t offset, uint32_t length, uint32_t chunk = kChunk4M,
                            InodeId ino = kIno) {
    std::vector<uint8_t> out(length);
    auto r = store_->read(ino, index, chunk, offset, out);
    EXPECT_TRUE(r.has_value()) << r.status().to_string();
    out.resize(r.has_value() ? *r : 0);
    return out;
  }
  // Whether data written with O_DIRECT (so not cached) is read back with O_DIRECT: under
  // direct_io, or direct_read_min when the chunk is long enough.
  bool uncached_reads_direct(uint64_t chunk_length) const {
    return store_->direct_io_active() || (GetParam().direct_read_min > 0 && store_->direct_writes_active() &&
                                          chunk_length >= GetParam().direct_read_min);
  }
  Code read_code(uint64_t index, uint32_t offset, uint32_t length, uint32_t chunk = kChunk4M) {
    std::vector<uint8_t> out(length);
    return store_->read(kIno, index, chunk, offset, out).status().code();
  }
  std::string path(uint64_t index, InodeId ino = kIno) { return store_->target().chunk_path(ino, index); }
  uint64_t data_offset(uint32_t chunk = kChunk4M) { return make_chunk_header(0, 0, chunk).data_offset; }

  TempDir dir_;
  std::unique_ptr<ChunkStore> store_;
};

TEST_P(ChunkStoreTest, OneByteAtOddOffset) {
  auto b = pattern(1, 1);
  EXPECT_EQ(write(0, 12345, b), 12346u);
  EXPECT_EQ(read(0, 12345, 1), b);
  EXPECT_EQ(read(0, 0, 12345), std::vector<uint8_t>(12345, 0));
}

TEST_P(ChunkStoreTest, SpanAcrossBlockBoundaries) {
  auto d = pattern(4097, 2);
  EXPECT_EQ(write(3, 4095, d), 4095u + 4097u);
  EXPECT_EQ(read(3, 4095, 4097), d);
  // Overwrite inside: the neighbours within the partial blocks stay.
  auto mid = pattern(3, 3);
  write(3, 4096, mid);
  auto expect = d;
  std::copy(mid.begin(), mid.end(), expect.begin() + 1);
  EXPECT_EQ(read(3, 4095, 4097), expect);
  // Sub-ranges starting and ending mid-block.
  EXPECT_EQ(read(3, 4100, 10), std::vector<uint8_t>(expect.begin() + 5, expect.begin() + 15));
}

TEST_P(ChunkStoreTest, WholeChunk) {
  auto d = pattern(kChunk4M, 4);
  EXPECT_EQ(write(0, 0, d), kChunk4M);
  EXPECT_EQ(read(0, 0, kChunk4M), d);
  auto len = store_->chunk_length(kIno, 0);
  ASSERT_TRUE(len.has_value());
  EXPECT_EQ(*len, kChunk4M);
}

TEST_P(ChunkStoreTest, HoleReadsAsZeros) {
  auto d = pattern(100000, 5);
  EXPECT_EQ(write(0, 3u << 20, d), (3u << 20) + 100000u);
  EXPECT_EQ(read(0, 0, 3u << 20), std::vector<uint8_t>(3u << 20, 0));
  EXPECT_EQ(read(0, 3u << 20, 100000), d);
}

TEST_P(ChunkStoreTest, ExtendingPastAPartialLastBlockZeroFillsTheGap) {
  auto a = pattern(5000, 6), b = pattern(10, 7);
  write(0, 0, a);
  EXPECT_EQ(write(0, 20000, b), 20010u);
  auto all = read(0, 0, 20010);
  ASSERT_EQ(all.size(), 20010u);
  EXPECT_TRUE(std::equal(a.begin(), a.end(), all.begin()));
  EXPECT_TRUE(std::all_of(all.begin() + 5000, all.begin() + 20000, [](uint8_t x) { return x == 0; }));
  EXPECT_TRUE(std::equal(b.begin(), b.end(), all.begin() + 20000));
}

TEST_P(ChunkStoreTest, ShortReadAtChunkEnd) {
  write(0, 0, pattern(10000, 8));
  EXPECT_EQ(read(0, 9000, 5000).size(), 1000u);
  EXPECT_EQ(read(0, 10000, 100).size(), 0u);
  EXPECT_EQ(read(0, 20000, 100).size(), 0u);
}

TEST_P(ChunkStoreTest, MissingChunkReadsNothing) {
  EXPECT_EQ(read(9, 0, 4096).size(), 0u);
  EXPECT_EQ(read(9, 0, 4096, kChunk4M, InodeId(424242)).size(), 0u);
  EXPECT_EQ(store_->chunk_length(kIno, 9).status().code(), Code::kNotFound);
}

TEST_P(ChunkStoreTest, RandomWritesMatchAModel) {
  std::mt19937 rng(1234);
  std::vector<uint8_t> model;
  for (int i = 0; i < 300; ++i) {
    uint32_t len = 1 + rng() % 9000;
    uint32_t off = rng() % (kChunk64K * 2 - len);
    auto d = pattern(len, 100 + i);
    if (model.size() < off + len) model.resize(off + len, 0);
    std::copy(d.begin(), d.end(), model.begin() + off);
    ASSERT_EQ(write(0, off, d, kChunk64K * 2), model.size());
    if (i % 7 == 0) {
      ASSERT_EQ(read(0, 0, kChunk64K * 2, kChunk64K * 2), model) << "after write " << i;
    }
  }
  EXPECT_EQ(read(0, 0, kChunk64K * 2, kChunk64K * 2), model);
}

TEST_P(ChunkStoreTest, FlippedDataByteIsCorruptOnReadAndPartialWrite) {
  auto d = pattern(3 * 4096, 9);
  write(0, 0, d);
  flip_byte(path(0), data_offset() + 4096 + 17);  // block 1
  EXPECT_EQ(read_code(0, 4096 + 100, 10), Code::kCorrupt);
  EXPECT_EQ(read_code(0, 0, 3 * 4096), Code::kCorrupt);
  // Blocks 0 and 2 are intact and still served.
  EXPECT_EQ(read(0, 0, 4096), std::vector<uint8_t>(d.begin(), d.begin() + 4096));
  EXPECT_EQ(read(0, 8192, 4096), std::vector<uint8_t>(d.begin() + 8192, d.end()));
  // A partial write into the bad block must not bless it with a fresh checksum.
  std::vector<uint8_t> patch = pattern(10, 10);
  EXPECT_EQ(store_->write(kIno, 0, kChunk4M, 4096 + 50, patch).status().code(), Code::kCorrupt);
  EXPECT_EQ(read_code(0, 4096, 4096), Code::kCorrupt);
  // Overwriting the whole block replaces it (nothing of the old contents survives).
  auto fresh = pattern(4096, 11);
  write(0, 4096, fresh);
  EXPECT_EQ(read(0, 4096, 4096), fresh);
}

// Writes from page-aligned memory (a received payload is a ByteBuffer, bytes.h) go to O_DIRECT as
// they are when they start on a block and need no old bytes after their end; the other shapes
// still go through the bounce buffer. Every shape must read back exactly, checksums included.
TEST_P(ChunkStoreTest, WritesFromAlignedBuffersKeepEveryByte) {
  auto aligned = [](const std::vector<uint8_t>& v, size_t skip = 0) {
    ByteBuffer b(v.size() + skip);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kDataAlignment, 0u) << "ByteBuffer of " << b.size();
    std::copy(v.begin(), v.end(), b.begin() + static_cast<ptrdiff_t>(skip));
    return b;
  };
  std::vector<uint8_t> expect(kChunk4M, 0);
  uint64_t len = 0;
  // Writes `v` at `offset` (from its buffer's `skip`th byte) and says whether it bounced.
  auto put = [&](uint32_t offset, const std::vector<uint8_t>& v, bool should_bounce, size_t skip = 0) {
    const ByteBuffer b = aligned(v, skip);
    const uint64_t bounced = store_->bounced_writes(), unbounced = store_->unbounced_writes();
    auto r = store_->write(kIno, 0, kChunk4M, offset, std::span<const uint8_t>(b).subspan(skip));
    EXPECT_TRUE(r.has_value()) << r.status().to_string();
    std::copy(v.begin(), v.end(), expect.begin() + offset);
    len = std::max<uint64_t>(len, offset + v.size());
    if (store_->direct_writes_active() && v.size() >= GetParam().direct_write_min) {
      EXPECT_EQ(store_->bounced_writes() - bounced, should_bounce ? 1u : 0u) << "write at " << offset;
      EXPECT_EQ(store_->unbounced_writes() - unbounced, should_bounce ? 0u : 1u) << "write at " << offset;
    }
  };
  // Whole blocks at a block boundary; then a tail that ends the chunk mid-block.
  put(0, pattern(256u << 10, 31), false);
  put(256u << 10, pattern((128u << 10) + 100, 32), false);
  // Inside existing data, ending mid-block: the old bytes after the end must stay (bounced).
  put(64u << 10, pattern((64u << 10) + 10, 33), true);
  // Inside existing data, ending on a block boundary: nothing old to keep.
  put(8192, pattern(65536, 34), false);
  // After a gap, from a block boundary: the gap reads as zeros.
  put(1u << 20, pattern(69632, 35), false);
  // One byte past the page start of an aligned buffer, at an aligned offset and at an unaligned
  // one: both bounce.
  put(2u << 20, pattern(69632, 37), true, 1);
  put(500001, pattern(70000, 36), true, 1);
  auto want = [&] { return std::vector<uint8_t>(expect.begin(), expect.begin() + static_cast<ptrdiff_t>(len)); };
  EXPECT_EQ(read(0, 0, kChunk4M), want());
  // After a reopen (no cached descriptor, nothing of this process's memory): the same bytes.
  open_store();
  EXPECT_EQ(read(0, 0, kChunk4M), want());
}

// Reads the bytes an UnreadRange names from its descriptor (what the RPC server would send).
std::vector<uint8_t> bytes_of(const ChunkStore::UnreadRange& r) {
  std::vector<uint8_t> out(r.length);
  EXPECT_EQ(::pread(r.fd, out.data(), out.size(), static_cast<off_t>(r.file_offset)), static_cast<ssize_t>(r.length));
  return out;
}

TEST_P(ChunkStoreTest, UnreadRangesNameTheBytesAndTheirChecksums) {
  auto d = pattern(3 * 4096 + 1000, 21);  // the chunk ends 1000 bytes into block 3
  write(0, 0, d);
  auto whole = store_->read_unverified(kIno, 0, kChunk4M, 0, kChunk4M);
  ASSERT_TRUE(whole.has_value()) << whole.status().to_string();
  if (uncached_reads_direct(d.size())) {
    EXPECT_FALSE(whole->has_value()) << "O_DIRECT data is not in the page cache to send";
    return;
  }
  ASSERT_TRUE(whole->has_value());
  EXPECT_EQ((*whole)->length, d.size());
  EXPECT_EQ(bytes_of(**whole), d);
  ASSERT_EQ((*whole)->block_sums.size(), 8u);
  EXPECT_EQ(checksum::first_bad_block(d, (*whole)->block_sums, kBlockSize), -1);
  // One block in the middle: its checksums, and the bytes at the right place.
  auto mid = store_->read_unverified(kIno, 0, kChunk4M, 4096, 4096);
  ASSERT_TRUE(mid.has_value() && mid->has_value());
  const std::vector<uint8_t> block1(d.begin() + 4096, d.begin() + 8192);
  EXPECT_EQ(bytes_of(**mid), block1);
  ASSERT_EQ((*mid)->block_sums.size(), 2u);
  EXPECT_EQ((*mid)->block_sums[0], checksum::xxh3(block1));
  // Not verifiable by a receiver: an unaligned start, or an end inside a block before the chunk's.
  for (auto [off, len] : {std::pair<uint32_t, uint32_t>{100, 4096}, {0, 5000}}) {
    auto r = store_->read_unverified(kIno, 0, kChunk4M, off, len);
    ASSERT_TRUE(r.has_value());
    EXPECT_FALSE(r->has_value()) << off << "+" << len;
  }
  // Holes: a missing chunk and an offset past the end name nothing.
  for (auto [index, off] : {std::pair<uint64_t, uint32_t>{7, 0}, {0, 16384}}) {
    auto r = store_->read_unverified(kIno, index, kChunk4M, off, 4096);
    ASSERT_TRUE(r.has_value() && r->has_value());
    EXPECT_EQ((*r)->length, 0u);
    EXPECT_TRUE((*r)->block_sums.empty());
  }
  // The same validation as read().
  EXPECT_EQ(store_->read_unverified(kIno, 0, kChunk4M, kChunk4M - 4096, 8192).status().code(), Code::kInvalid);
}

TEST_P(ChunkStoreTest, UnreadRangeOfADamagedBlockFailsTheReceiversCheck) {
  auto d = pattern(2 * 4096, 22);
  write(0, 0, d);
  flip_byte(path(0), data_offset() + 4096 + 5);
  auto r = store_->read_unverified(kIno, 0, kChunk4M, 0, 8192);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  if (!r->has_value()) return;  // O_DIRECT: read() verifies (FlippedDataByteIsCorruptOnReadAndPartialWrite)
  EXPECT_EQ(checksum::first_bad_block(bytes_of(**r), (*r)->block_sums, kBlockSize), 1);
}

TEST_P(ChunkStoreTest, FlippedByteInTheLastPartialBlockIsCorrupt) {
  write(0, 0, pattern(5000, 12));
  flip_byte(path(0), data_offset() + 4999);
  EXPECT_EQ(read_code(0, 4096, 904), Code::kCorrupt);
  // Extending re-checksums the old last block: it must be verified first.
  EXPECT_EQ(store_->write(kIno, 0, kChunk4M, 9000, pattern(5, 13)).status().code(), Code::kCorrupt);
}

TEST_P(ChunkStoreTest, CorruptChecksumTableIsCorrupt) {
  write(0, 0, pattern(8192, 14));
  flip_byte(path(0), kChunkHeaderSize + 1 * kTableEntrySize + 3);  // block 1, current checksum
  EXPECT_EQ(read_code(0, 4096, 1), Code::kCorrupt);
  EXPECT_EQ(read(0, 0, 4096).size(), 4096u);
}

TEST_P(ChunkStoreTest, CorruptHeaderIsCorrupt) {
  write(0, 0, pattern(100, 15));
  flip_byte(path(0), 20);
  // The header is verified when the file is opened; a cached open file keeps the verified copy, so
  // drop the open-file cache to make the next request open (and verify) the file again.
  ASSERT_TRUE(store_->drop_caches().has_value());
  EXPECT_EQ(read_code(0, 0, 100), Code::kCorrupt);
  EXPECT_EQ(store_->write(kIno, 0, kChunk4M, 0, pattern(10, 16)).status().code(), Code::kCorrupt);
}

// A cold read whose data moves with O_DIRECT reads the chunk's header in the batch with that data
// (joined_header_reads) rather than before it. Every fault a header can hold is still found before
// a byte is returned, past the end of the chunk too, and a file enters the open-file cache only
// once its header checked out.
TEST_P(ChunkStoreTest, AColdOpenChecksItsHeaderBeforeAnyByteIsReturned) {
  const auto d = pattern(3 * 4096 + 100, 61);  // long enough for direct_read_min 8192
  for (uint64_t i = 0; i < 5; ++i) write(i, 0, d);
  write(5, 0, pattern(100u << 10, 62));
  std::vector<uint8_t> header0(kChunkHeaderSize);
  {
    std::FILE* f = std::fopen(path(0).c_str(), "rb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fread(header0.data(), 1, header0.size(), f), header0.size());
    std::fclose(f);
  }
  poke(path(1), 0, header0);  // another chunk's header
  flip_byte(path(2), 20);     // damaged
  poke(path(3), 0, std::vector<uint8_t>(kChunkHeaderSize, 0));  // never written
  ASSERT_TRUE(store_->drop_caches().has_value());
  const uint64_t joined = store_->joined_header_reads();

  EXPECT_EQ(read_code(1, 0, 4096), Code::kCorrupt);
  EXPECT_EQ(read_code(2, 0, 4096), Code::kCorrupt);
  EXPECT_EQ(read_code(2, 20000, 100), Code::kCorrupt) << "past the end, the header is still checked";
  EXPECT_EQ(read(3, 0, 4096).size(), 0u) << "a chunk whose header was never written reads as missing";
  EXPECT_EQ(store_->cached_files(), 0u) << "a file whose header failed (or was not read) was cached";
  EXPECT_EQ(read(0, 0, static_cast<uint32_t>(d.size())), d);
  EXPECT_EQ(store_->cached_files(), GetParam().fd_cache > 0 ? 1u : 0u);
  EXPECT_EQ(store_->joined_header_reads() - joined, uncached_reads_direct(d.size()) ? 1u : 0u);
  EXPECT_EQ(read(0, 4096, 4096), std::vector<uint8_t>(d.begin() + 4096, d.begin() + 8192));
  // Another chunk size than the chunk's (64 KiB): found in the header read with the data, and
  // where the file is too long for a chunk of that size, before it.
  std::vector<uint8_t> out(4096);
  EXPECT_EQ(store_->read(kIno, 4, kChunk64K, 0, out).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->read(kIno, 5, kChunk64K, 0, out).status().code(), Code::kInvalid);
}

TEST_P(ChunkStoreTest, CrashBetweenTableAndDataLeavesOldBytesReadable) {
  // After an update the table holds the new checksum and the old one; if the process died before
  // the data write landed, the old bytes are on disk and must still verify.
  auto v1 = pattern(4096, 17), v2 = pattern(4096, 18), v3 = pattern(4096, 19);
  write(0, 0, v1);
  write(0, 0, v2);
  poke(path(0), data_offset(), v1);
  EXPECT_EQ(read(0, 0, 4096), v1);
  poke(path(0), data_offset(), v3);  // neither old nor new: corrupt
  EXPECT_EQ(read_code(0, 0, 4096), Code::kCorrupt);
}

TEST_P(ChunkStoreTest, ChunkFileWithoutHeaderCountsAsMissing) {
  // A crash after create but before the header reached the disk leaves an empty file.
  std::filesystem::create_directories(store_->target().inode_dir(kIno));
  { std::FILE* f = std::fopen(path(4).c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  EXPECT_EQ(read(4, 0, 10).size(), 0u);
  auto d = pattern(10, 20);
  write(4, 0, d);
  EXPECT_EQ(read(4, 0, 10), d);
}

TEST_P(ChunkStoreTest, TruncateAcrossBlocksAndChunks) {
  const uint32_t cs = kChunk64K;
  std::vector<uint8_t> file = pattern(3 * cs + 100, 21);
  for (uint64_t k = 0; k < 4; ++k) {
    uint64_t start = k * cs;
    uint64_t n = std::min<uint64_t>(cs, file.size() - start);
    write(k, 0, std::vector<uint8_t>(file.begin() + start, file.begin() + start + n), cs);
  }
  // Down to the middle of chunk 1, mid-block.
  ASSERT_TRUE(store_->truncate(kIno, cs + 5000, cs).is_ok());
  EXPECT_EQ(read(0, 0, cs, cs), std::vector<uint8_t>(file.begin(), file.begin() + cs));
  EXPECT_EQ(read(1, 0, cs, cs), std::vector<uint8_t>(file.begin() + cs, file.begin() + cs + 5000));
  EXPECT_FALSE(std::filesystem::exists(path(2)));
  EXPECT_FALSE(std::filesystem::exists(path(3)));
  // Up again: nothing grows, and cut bytes never come back, even after writing past them.
  ASSERT_TRUE(store_->truncate(kIno, 3 * cs, cs).is_ok());
  EXPECT_EQ(read(1, 0, cs, cs).size(), 5000u);
  auto tail = pattern(10, 22);
  EXPECT_EQ(write(1, 20000, tail, cs), 20010u);
  auto got = read(1, 0, 20010, cs);
  EXPECT_TRUE(std::equal(file.begin() + cs, file.begin() + cs + 5000, got.begin()));
  EXPECT_TRUE(std::all_of(got.begin() + 5000, got.begin() + 20000, [](uint8_t x) { return x == 0; }));
  // To a block boundary.
  ASSERT_TRUE(store_->truncate(kIno, cs + 8192, cs).is_ok());
  EXPECT_EQ(read(1, 0, cs, cs).size(), 8192u);
  // To a chunk boundary: chunk 1 goes, chunk 0 stays whole.
  ASSERT_TRUE(store_->truncate(kIno, cs, cs).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path(1)));
  EXPECT_EQ(read(0, 0, cs, cs).size(), cs);
  // To zero: nothing left.
  ASSERT_TRUE(store_->truncate(kIno, 0, cs).is_ok());
  EXPECT_FALSE(std::filesystem::exists(path(0)));
}

// A size no file can have (a peer's 0 - 1) is refused; near UINT64_MAX the chunk count once
// wrapped to 0 and every chunk of the inode was removed.
TEST_P(ChunkStoreTest, ASizePastTheLargestFileIsRefusedAndCutsNothing) {
  const uint32_t cs = kChunk64K;
  write(0, 0, pattern(cs, 24), cs);
  write(1, 0, pattern(1000, 25), cs);
  for (uint64_t size : {UINT64_MAX, UINT64_MAX - cs + 2, static_cast<uint64_t>(INT64_MAX) + 1}) {
    Status st = store_->truncate(kIno, size, cs);
    EXPECT_EQ(st.code(), Code::kInvalid) << size;
    EXPECT_NE(st.message().find("largest file"), std::string::npos) << st.message();
  }
  EXPECT_EQ(read(0, 0, cs, cs), pattern(cs, 24));
  EXPECT_EQ(read(1, 0, cs, cs), pattern(1000, 25));
  ASSERT_TRUE(store_->truncate(kIno, static_cast<uint64_t>(INT64_MAX), cs).is_ok());  // grows nothing
  EXPECT_EQ(read(1, 0, cs, cs), pattern(1000, 25));
}

TEST_P(ChunkStoreTest, TruncateVerifiesTheBlockItCuts) {
  write(0, 0, pattern(10000, 23));
  flip_byte(path(0), data_offset() + 4096 + 1);
  EXPECT_EQ(store_->truncate(kIno, 6000, kChunk4M).code(), Code::kCorrupt);
  auto len = store_->chunk_length(kIno, 0);
  ASSERT_TRUE(len.has_value());
  EXPECT_EQ(*len, 10000u);
}

TEST_P(ChunkStoreTest, RemoveIsIdempotent) {
  write(0, 0, pattern(100, 24));
  write(5, 0, pattern(100, 25));
  write(0, 0, pattern(100, 26), kChunk4M, InodeId(kIno.value + 256));  // same bucket
  ASSERT_TRUE(store_->remove(kIno).is_ok());
  EXPECT_FALSE(std::filesystem::exists(store_->target().inode_dir(kIno)));
  EXPECT_EQ(read(0, 0, 100).size(), 0u);
  EXPECT_EQ(read(0, 0, 100, kChunk4M, InodeId(kIno.value + 256)).size(), 100u);
  EXPECT_TRUE(store_->remove(kIno).is_ok());
  EXPECT_TRUE(store_->remove(InodeId(999999)).is_ok());
}

// Chunk 0 lies in the bucket (a one-chunk file has no directory of its own); the inode's
// directory appears with chunk 1. Truncate and remove handle both places, and remove also drops
// a leftover creation of chunk 0.
TEST_P(ChunkStoreTest, ChunkZeroLivesInTheBucketAndLaterChunksInTheInodeDirectory) {
  namespace fs = std::filesystem;
  const std::string dir = store_->target().inode_dir(kIno);
  const std::vector<uint8_t> first = pattern(5000, 40);
  write(0, 0, first, kChunk64K);
  EXPECT_EQ(path(0), store_->target().bucket_dir(kIno) + "/" + std::to_string(kIno.value) + ".0");
  EXPECT_TRUE(fs::is_regular_file(path(0)));
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(store_->sync(kIno).is_ok());
  write(1, 0, pattern(100, 41), kChunk64K);
  EXPECT_TRUE(fs::is_regular_file(dir + "/1"));
  EXPECT_TRUE(store_->sync(kIno).is_ok());
  ASSERT_TRUE(store_->truncate(kIno, 3000, kChunk64K).is_ok());
  EXPECT_FALSE(fs::exists(dir + "/1"));
  EXPECT_EQ(read(0, 0, kChunk64K, kChunk64K), std::vector<uint8_t>(first.begin(), first.begin() + 3000));
  ASSERT_TRUE(store_->truncate(kIno, 0, kChunk64K).is_ok());
  EXPECT_FALSE(fs::exists(path(0)));
  write(0, 0, pattern(10, 42), kChunk64K);
  std::ofstream(path(0) + ".tmp") << "a creation cut off by a crash";
  ASSERT_TRUE(store_->remove(kIno).is_ok());
  EXPECT_FALSE(fs::exists(path(0)));
  EXPECT_FALSE(fs::exists(path(0) + ".tmp"));
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::is_directory(store_->target().bucket_dir(kIno)));
}

// A chunk created by a write at offset 0 has its header, table and that write's blocks reserved in
// one fallocate, so they lie in one run of disk blocks and a cold read of them is one request.
// (ext4 otherwise puts the header, a small allocation, in its per-CPU small-file area and the data
// elsewhere.) Checked with FIEMAP where the file system has it.
TEST_P(ChunkStoreTest, FirstWriteAtZeroLiesWithTheHeaderOnDisk) {
  write(0, 0, pattern(100 << 10, 43));
  ASSERT_TRUE(store_->sync(kIno).is_ok());
  int fd = ::open(path(0).c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  const uint64_t end = data_offset() + (100 << 10);
  auto runs = testing::physical_runs(fd, end);
  ::close(fd);
  if (!runs.has_value()) GTEST_SKIP() << "no FIEMAP on $TMPDIR's file system";
  EXPECT_EQ(*runs, 1) << "header and data are " << *runs << " separate runs of disk blocks";
}

TEST_P(ChunkStoreTest, SyncFlushesAndToleratesMissingInode) {
  write(0, 0, pattern(100, 27));
  write(1, 0, pattern(100, 28));
  EXPECT_TRUE(store_->sync(kIno).is_ok());
  EXPECT_TRUE(store_->sync(InodeId(31337)).is_ok());
}

TEST_P(ChunkStoreTest, RequestValidation) {
  auto d = pattern(10, 29);
  std::vector<uint8_t> out(10);
  EXPECT_EQ(store_->write(kIno, 0, 1000, 0, d).status().code(), Code::kInvalid);           // not a power of 2
  EXPECT_EQ(store_->write(kIno, 0, 3u << 20, 0, d).status().code(), Code::kInvalid);       // not a power of 2
  EXPECT_EQ(store_->write(kIno, 0, 128u << 20, 0, d).status().code(), Code::kInvalid);     // too large
  EXPECT_EQ(store_->write(kIno, 0, kChunk64K, kChunk64K - 5, d).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->write(kIno, 0, kChunk64K, 0, {}).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->write(InodeId(0), 0, kChunk64K, 0, d).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->read(kIno, 0, kChunk64K, kChunk64K - 5, out).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->read(kIno, 0, 12345, 0, out).status().code(), Code::kInvalid);
  EXPECT_EQ(store_->truncate(kIno, 0, 7).code(), Code::kInvalid);
  // A chunk keeps the chunk size it was created with.
  write(0, 0, d, kChunk64K);
  auto other = store_->write(kIno, 0, kChunk4M, 0, d);
  EXPECT_EQ(other.status().code(), Code::kInvalid);
  EXPECT_NE(other.status().message().find("created with chunk size 65536"), std::string::npos);
  EXPECT_EQ(store_->read(kIno, 0, kChunk4M, 0, out).status().code(), Code::kInvalid);
}

TEST_P(ChunkStoreTest, ConcurrentWritersToDistinctChunks) {
  constexpr int kThreads = 8;
  std::vector<std::vector<uint8_t>> models(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 40; ++i) {
        uint32_t len = 1 + rng() % 10000;
        uint32_t off = rng() % (kChunk64K - len);
        auto d = pattern(len, t * 1000 + i);
        if (models[t].size() < off + len) models[t].resize(off + len, 0);
        std::copy(d.begin(), d.end(), models[t].begin() + off);
        if (!store_->write(kIno, t, kChunk64K, off, d).has_value()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(read(t, 0, kChunk64K, kChunk64K), models[t]) << "chunk " << t;
}

TEST_P(ChunkStoreTest, ConcurrentWritersToOneChunkNeverTearChecksums) {
  // Neighbouring ranges share blocks, so an interleaved read-modify-write would lose bytes or
  // leave a block whose checksum no longer matches.
  constexpr int kThreads = 8;
  constexpr uint32_t kSpan = 5000;
  constexpr int kRounds = 30;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::atomic<bool> writers_done{false};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        auto d = pattern(kSpan, t * 100 + r);
        if (!store_->write(kIno, 0, kChunk64K, t * kSpan, d).has_value()) ++failures;
      }
    });
  }
  std::thread reader([&] {
    std::vector<uint8_t> out(kThreads * kSpan);
    while (!writers_done.load()) {
      auto r = store_->read(kIno, 0, kChunk64K, 0, out);
      if (!r.has_value()) ++failures;
    }
  });
  for (auto& th : threads) th.join();
  writers_done = true;
  reader.join();
  EXPECT_EQ(failures.load(), 0);
  auto all = read(0, 0, kThreads * kSpan, kChunk64K);
  ASSERT_EQ(all.size(), kThreads * kSpan);
  for (int t = 0; t < kThreads; ++t) {
    auto want = pattern(kSpan, t * 100 + kRounds - 1);
    EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + t * kSpan)) << "range " << t;
  }
}

TEST_P(ChunkStoreTest, ReopenKeepsDataAndUuid) {
  auto d = pattern(70000, 30);
  write(2, 1234, d);
  std::string uuid = store_->target().uuid();
  open_store();
  EXPECT_EQ(store_->target().uuid(), uuid);
  EXPECT_EQ(read(2, 1234, 70000), d);
}

TEST_P(ChunkStoreTest, UnalignedWritesAndReadsAcrossBlocksMatchAModel) {
  // Offsets and lengths that start and end inside blocks, extend the chunk with a partial last
  // block, leave gaps and overwrite parts of blocks: the O_DIRECT path assembles whole blocks.
  const uint32_t cs = kChunk64K * 2;
  std::vector<uint8_t> model;
  std::mt19937 rng(77);
  for (int i = 0; i < 60; ++i) {
    uint32_t off = rng() % (cs - 1);
    uint32_t len = 1 + rng() % std::min<uint32_t>(cs - off, 3 * 4096 + 123);
    auto d = pattern(len, 1000 + i);
    if (model.size() < off + len) model.resize(off + len, 0);
    std::copy(d.begin(), d.end(), model.begin() + off);
    ASSERT_EQ(write(0, off, d, cs), model.size());
    uint32_t roff = rng() % static_cast<uint32_t>(model.size());
    uint32_t rlen = 1 + rng() % static_cast<uint32_t>(model.size() - roff);
    ASSERT_EQ(read(0, roff, rlen, cs), std::vector<uint8_t>(model.begin() + roff, model.begin() + roff + rlen))
        << "step " << i << " read [" << roff << ", +" << rlen << ")";
  }
  EXPECT_EQ(read(0, 0, cs, cs), model);
}

TEST_P(ChunkStoreTest, OpenFileCacheIsBoundedAndDroppedByDropCaches) {
  for (uint64_t k = 0; k < 10; ++k) write(k, 0, pattern(5000, static_cast<uint32_t>(40 + k)));
  EXPECT_LE(store_->cached_files(), GetParam().fd_cache);
  if (GetParam().fd_cache > 0) {
    EXPECT_EQ(store_->cached_files(), GetParam().fd_cache);
  }
  auto dropped = store_->drop_caches();
  ASSERT_TRUE(dropped.has_value()) << dropped.status().to_string();
  EXPECT_EQ(dropped->fds_closed, GetParam().fd_cache);
  EXPECT_EQ(dropped->files, 10u);
  EXPECT_EQ(store_->cached_files(), 0u);
  // Nothing is lost: every chunk reads back, and the cache fills again.
  for (uint64_t k = 0; k < 10; ++k) EXPECT_EQ(read(k, 0, 5000), pattern(5000, static_cast<uint32_t>(40 + k)));
  EXPECT_EQ(store_->cached_files(), GetParam().fd_cache);
}

TEST_P(ChunkStoreTest, DropCachesWritesDirtyPagesAndLeavesThePageCacheEmpty) {
  struct statfs fs {};
  ASSERT_EQ(::statfs(dir_.path().c_str(), &fs), 0);
  if (fs.f_type == TMPFS_MAGIC) GTEST_SKIP() << "tmpfs pages are the storage: nothing can drop them";
  auto d = pattern(256 * 1024, 60);
  write(0, 0, d);
  auto dropped = store_->drop_caches();
  ASSERT_TRUE(dropped.has_value()) << dropped.status().to_string();
  EXPECT_EQ(dropped->files, 1u);
  // None of the file's pages is cached now.
  uint64_t cached = 0, pages = 0;
  ASSERT_TRUE(penstock::testing::resident_pages(path(0), &cached, &pages));
  EXPECT_EQ(cached, 0u) << cached << " of " << pages << " pages still cached";
  EXPECT_EQ(read(0, 0, static_cast<uint32_t>(d.size())), d);
}

TEST_P(ChunkStoreTest, RemoveAndTruncateForgetCachedFiles) {
  write(0, 0, pattern(100, 61));
  write(1, 0, pattern(100, 62));
  ASSERT_TRUE(store_->remove(kIno).is_ok());
  EXPECT_EQ(store_->cached_files(), 0u);
  // A new file of the same chunk is a new file on disk: the old descriptor must not answer.
  auto fresh = pattern(50, 63);
  write(0, 0, fresh);
  EXPECT_EQ(read(0, 0, 100), fresh);
  write(3, 0, pattern(100, 64), kChunk64K, InodeId(kIno.value + 1));
  ASSERT_TRUE(store_->truncate(InodeId(kIno.value + 1), 0, kChunk64K).is_ok());
  EXPECT_EQ(read(3, 0, 100, kChunk64K, InodeId(kIno.value + 1)).size(), 0u);
  auto again = pattern(20, 65);
  write(3, 0, again, kChunk64K, InodeId(kIno.value + 1));
  EXPECT_EQ(read(3, 0, 100, kChunk64K, InodeId(kIno.value + 1)), again);
}

TEST_P(ChunkStoreTest, DropCachesDuringConcurrentIoLosesNothing) {
  constexpr int kThreads = 4;
  std::atomic<bool> stop{false};
  std::vector<std::thread> dropper;
  dropper.emplace_back([&] {
    while (!stop.load()) {
      auto r = store_->drop_caches();
      EXPECT_TRUE(r.has_value()) << r.status().to_string();
    }
  });
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        auto d = pattern(9000 + 37 * i, static_cast<uint32_t>(t * 100 + i));
        const uint64_t chunk = static_cast<uint64_t>(t * 3 + i % 3);
        auto w = store_->write(kIno, chunk, kChunk64K, static_cast<uint32_t>(i * 100), d);
        ASSERT_TRUE(w.has_value()) << w.status().to_string();
        std::vector<uint8_t> out(d.size());
        auto r = store_->read(kIno, chunk, kChunk64K, static_cast<uint32_t>(i * 100), out);
        ASSERT_TRUE(r.has_value()) << r.status().to_string();
        ASSERT_EQ(out, d);
      }
    });
  }
  for (auto& w : workers) w.join();
  stop = true;
  dropper[0].join();
}

const StoreMode kModes[] = {
    {false, 0, false, 0, 0, "IoUring"},
    {true, 0, false, 0, 0, "Posix"},
    {false, 4, false, 0, 0, "IoUringFdCache"},
    {true, 4, false, 0, 0, "PosixFdCache"},
    {false, 4, true, 0, 0, "IoUringFdCacheDirect"},
    {true, 0, true, 0, 0, "PosixDirect"},
    {false, 4, false, 8192, 0, "IoUringFdCacheLargeWritesDirect"},
    {true, 0, false, 8192, 0, "PosixLargeWritesDirect"},
    {false, 4, false, 8192, 8192, "IoUringFdCacheLongChunksReadDirect"},
    {true, 0, false, 8192, 8192, "PosixLongChunksReadDirect"},
};
INSTANTIATE_TEST_SUITE_P(Modes, ChunkStoreTest, ::testing::ValuesIn(kModes),
                         [](const auto& info) { return std::string(info.param.name); });

// Pages of `path` in [from, to) that are in the page cache.
size_t resident_in(const std::string& path, uint64_t from, uint64_t to) {
  std::vector<bool> pages;
  EXPECT_TRUE(penstock::testing::page_residency(path, &pages));
  size_t n = 0;
  for (uint64_t page = from / 4096; page < (to + 4095) / 4096 && page < pages.size(); ++page) n += pages[page];
  return n;
}

// A store over a fresh target in `dir` with options `o`; null, with a failure, when the target
// cannot be opened.
std::unique_ptr<ChunkStore> open_store(const TempDir& dir, const ChunkStoreOptions& o) {
  auto t = Target::open(dir.path());
  EXPECT_TRUE(t.has_value()) << t.status().to_string();
  if (!t.has_value()) return nullptr;
  return std::make_unique<ChunkStore>(std::shared_ptr<Target>(std::move(*t)), o);
}

// direct_write_min: a large write reaches the disk with O_DIRECT and leaves none of its pages in the
// page cache; a small one is buffered (its pages are cached); reads of both go through the page
// cache (and so may be spliced); the bytes are right either way.
TEST(ChunkStoreDirectWrites, LargeWritesBypassThePageCacheSmallWritesAndReadsUseIt) {
  TempDir dir;
  ChunkStoreOptions o;
  o.direct_write_min = 1u << 20;
  auto owned = open_store(dir, o);
  ASSERT_NE(owned, nullptr);
  ChunkStore& store = *owned;
  EXPECT_FALSE(store.direct_io_active()) << "reads must stay buffered";
  const uint64_t data_off = make_chunk_header(kIno.value, 0, kChunk4M).data_offset;
  const auto large = pattern(2u << 20, 1);
  const auto small = pattern(64u << 10, 2);
  ASSERT_TRUE(store.write(kIno, 0, kChunk4M, 0, large).has_value());
  ASSERT_TRUE(store.write(kIno, 1, kChunk4M, 0, small).has_value());
  const std::string large_path = store.target().chunk_path(kIno, 0);
  const std::string small_path = store.target().chunk_path(kIno, 1);
  const size_t large_pages = large.size() / 4096;
  if (store.direct_writes_active()) {
    EXPECT_EQ(resident_in(large_path, data_off, data_off + large.size()), 0u) << "the large write was buffered";
  } else {
    std::printf("note: O_DIRECT is refused by $TMPDIR's file system; the buffered fallback is tested\n");
    EXPECT_EQ(resident_in(large_path, data_off, data_off + large.size()), large_pages);
  }
  EXPECT_EQ(resident_in(small_path, data_off, data_off + small.size()), small.size() / 4096);
  auto unread = store.read_unverified(kIno, 0, kChunk4M, 0, kChunk4M);
  ASSERT_TRUE(unread.has_value() && unread->has_value()) << "aligned reads must still be sendable unread";
  std::vector<uint8_t> back(kChunk4M);
  auto n = store.read(kIno, 0, kChunk4M, 0, back);
  ASSERT_TRUE(n.has_value()) << n.status().to_string();
  back.resize(*n);
  EXPECT_EQ(back, large);
  EXPECT_EQ(resident_in(large_path, data_off, data_off + large.size()), large_pages) << "the read bypassed the page cache";
  back.assign(kChunk4M, 0);
  n = store.read(kIno, 1, kChunk4M, 0, back);
  ASSERT_TRUE(n.has_value()) << n.status().to_string();
  back.resize(*n);
  EXPECT_EQ(back, small);
}

// A store with direct writes and reads of 1 MiB or more, as `--direct-read-min 1M` runs one.
ChunkStoreOptions hybrid_options() {
  ChunkStoreOptions o;
  o.direct_write_min = 1u << 20;
  o.direct_read_min = 1u << 20;
  return o;
}

// direct_read_min: a cold read of a long chunk (a large file's) moves its data with O_DIRECT,
// straight into an aligned buffer of whole blocks and through the bounce buffer otherwise, and
// leaves no page of it cached; a short chunk's reads, and a long chunk's ranges that are all in
// the page cache, stay buffered and can be sent unread. A cold open reads ahead the long chunk's
// table, not its data; a chunk that grows long through small writes reads direct once dropped.
TEST(ChunkStoreDirectReads, ColdReadsOfLongChunksBypassThePageCacheShortOnesAndCachedRangesUseIt) {
  TempDir dir;
  auto owned = open_store(dir, hybrid_options());
  ASSERT_NE(owned, nullptr);
  ChunkStore& store = *owned;
  EXPECT_FALSE(store.direct_io_active()) << "direct_read_min is not direct I/O for everything";
  const uint64_t data_off = make_chunk_header(kIno.value, 0, kChunk4M).data_offset;
  const auto large = pattern((2u << 20) + 300, 41);  // a partial last block
  const auto small = pattern(64u << 10, 42);
  ASSERT_TRUE(store.write(kIno, 0, kChunk4M, 0, large).has_value());
  ASSERT_TRUE(store.write(kIno, 1, kChunk4M, 0, small).has_value());
  const std::string large_path = store.target().chunk_path(kIno, 0);
  auto read_into = [&](auto& buf, uint64_t index, uint32_t offset) {
    auto n = store.read(kIno, index, kChunk4M, offset, std::span<uint8_t>(buf.data(), buf.size()));
    EXPECT_TRUE(n.has_value()) << n.status().to_string();
    return n.has_value() ? *n : 0;
  };
  auto slice = [](const std::vector<uint8_t>& v, uint64_t from, uint64_t n) {
    return std::vector<uint8_t>(v.begin() + static_cast<ptrdiff_t>(from), v.begin() + static_cast<ptrdiff_t>(from + n));
  };
  const bool cachestat = testing::cachestat_works(dir.path());
  if (!store.direct_writes_active() || !cachestat) {
    std::printf("note: %s; the buffered fallback is tested\n",
                cachestat ? "O_DIRECT is refused by $TMPDIR's file system" : "cachestat(2) is missing");
    ByteBuffer back(kChunk4M);
    ASSERT_EQ(read_into(back, 0, 0), large.size());
    EXPECT_EQ(std::vector<uint8_t>(back.begin(), back.begin() + static_cast<ptrdiff_t>(large.size())), large);
    EXPECT_EQ(store.direct_reads(), 0u);
    return;
  }
  EXPECT_EQ(resident_in(large_path, data_off, data_off + (2u << 20)), 0u) << "the large write was buffered";

  // The long chunk, cold: not sendable unread; read whole into an aligned buffer without a bounce,
  // its partial last block included, and at an unaligned offset through the bounce buffer.
  auto unread = store.read_unverified(kIno, 0, kChunk4M, 0, 1u << 20);
  ASSERT_TRUE(unread.has_value()) << unread.status().to_string();
  EXPECT_FALSE(unread->has_value()) << "a cold range of a long chunk was offered from the page cache";
  ByteBuffer whole(large.size());
  ASSERT_EQ(read_into(whole, 0, 0), large.size());
  EXPECT_TRUE(std::equal(whole.begin(), whole.end(), large.begin()));
  EXPECT_EQ(store.direct_reads(), 1u);
  EXPECT_EQ(store.unbounced_reads(), 1u) << "an aligned read of whole blocks went through the bounce buffer";
  std::vector<uint8_t> odd(10000);
  ASSERT_EQ(read_into(odd, 0, 4096 + 7), odd.size());
  EXPECT_EQ(odd, slice(large, 4096 + 7, odd.size()));
  EXPECT_EQ(store.direct_reads(), 2u);
  EXPECT_EQ(store.unbounced_reads(), 1u);
  EXPECT_EQ(resident_in(large_path, data_off, data_off + (2u << 20)), 0u) << "an O_DIRECT read filled the page cache";

  // The short chunk: buffered, sendable unread.
  std::vector<uint8_t> back(small.size());
  ASSERT_EQ(read_into(back, 1, 0), small.size());
  EXPECT_EQ(back, small);
  EXPECT_EQ(store.direct_reads(), 2u) << "a short chunk was read with O_DIRECT";
  auto short_unread = store.read_unverified(kIno, 1, kChunk4M, 0, kChunk4M);
  ASSERT_TRUE(short_unread.has_value() && short_unread->has_value());
  EXPECT_EQ(bytes_of(**short_unread), small);

  // A range of the long chunk just written through the page cache (a write under
  // direct_write_min) is read from there, and sent unread; once dropped it is read direct.
  const auto patch = pattern(64u << 10, 43);
  ASSERT_TRUE(store.write(kIno, 0, kChunk4M, 1u << 20, patch).has_value());
  {
    ByteBuffer cached(patch.size());
    ASSERT_EQ(read_into(cached, 0, 1u << 20), patch.size());
    EXPECT_TRUE(std::equal(cached.begin(), cached.end(), patch.begin()));
    EXPECT_EQ(store.direct_reads(), 2u) << "a cached range of a long chunk was read with O_DIRECT";
    auto warm = store.read_unverified(kIno, 0, kChunk4M, 1u << 20, static_cast<uint32_t>(patch.size()));
    ASSERT_TRUE(warm.has_value() && warm->has_value()) << "a cached range of a long chunk was not sendable unread";
    EXPECT_EQ(bytes_of(**warm), patch);
  }
  // A range only partly cached whose cached pages are not yet written back (the patch, while the
  // kernel has not flushed it) is read through the page cache: an O_DIRECT read would first write
  // them and wait. Once written back, such a range reads direct again.
  std::vector<uint8_t> expect_around = slice(large, (1u << 20) - (64u << 10), 192u << 10);
  std::copy(patch.begin(), patch.end(), expect_around.begin() + (64 << 10));
  if (testing::dirty_pages(large_path, data_off + (1u << 20), patch.size()) > 0) {
    ByteBuffer around(expect_around.size());
    ASSERT_EQ(read_into(around, 0, (1u << 20) - (64u << 10)), around.size());
    EXPECT_TRUE(std::equal(around.begin(), around.end(), expect_around.begin()));
    EXPECT_EQ(store.direct_reads(), 2u) << "a range holding dirty pages was read with O_DIRECT";
  } else {
    std::printf("note: the patch was written back at once; the dirty-range case is not tested\n");
  }
  {
    const int fd = ::open(large_path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << large_path;
    EXPECT_EQ(::fdatasync(fd), 0);
    // The buffered read above cached the patch's neighbours: drop them again, keeping the patch.
    EXPECT_EQ(::posix_fadvise(fd, static_cast<off_t>(data_off + (1u << 20) - (64u << 10)), 64 << 10,
                              POSIX_FADV_DONTNEED), 0);
    EXPECT_EQ(::posix_fadvise(fd, static_cast<off_t>(data_off + (1u << 20) + (64u << 10)), 64 << 10,
                              POSIX_FADV_DONTNEED), 0);
    ::close(fd);
    ASSERT_EQ(testing::dirty_pages(large_path, data_off, 2u << 20), 0u);
    ByteBuffer around(expect_around.size());
    ASSERT_EQ(read_into(around, 0, (1u << 20) - (64u << 10)), around.size());
    EXPECT_TRUE(std::equal(around.begin(), around.end(), expect_around.begin()));
    EXPECT_EQ(store.direct_reads(), 3u) << "a partly cached, written-back range was read buffered";
  }
  ASSERT_TRUE(store.drop_caches().has_value());
  ByteBuffer dropped(patch.size());
  const uint64_t before = store.direct_reads();
  ASSERT_EQ(read_into(dropped, 0, 1u << 20), patch.size());
  EXPECT_TRUE(std::equal(dropped.begin(), dropped.end(), patch.begin()));
  EXPECT_EQ(store.direct_reads(), before + 1) << "a dropped range of a long chunk was read buffered";

  // A cold open (the cache dropped its descriptors) reads ahead the table only.
  ASSERT_TRUE(store.drop_caches().has_value());
  std::vector<uint8_t> first(4096);
  ASSERT_EQ(read_into(first, 0, 0), first.size());
  EXPECT_EQ(first, slice(large, 0, 4096));
  EXPECT_EQ(resident_in(large_path, data_off, data_off + (2u << 20)), 0u) << "a cold open read the data ahead";
  // The partial last block alone: buffered (the direct path would read it buffered too), and so
  // sendable unread.
  const uint64_t before_tail = store.direct_reads();
  auto tail = store.read_unverified(kIno, 0, kChunk4M, 2u << 20, 4096);
  ASSERT_TRUE(tail.has_value() && tail->has_value()) << "a partial last block alone was not sendable unread";
  EXPECT_EQ(bytes_of(**tail), slice(large, 2u << 20, 300));
  std::vector<uint8_t> last(300);
  ASSERT_EQ(read_into(last, 0, 2u << 20), last.size());
  EXPECT_EQ(last, slice(large, 2u << 20, 300));
  EXPECT_EQ(store.direct_reads(), before_tail) << "a partial last block alone was read with O_DIRECT";

  // Small buffered writes grow chunk 2 past direct_read_min: once its pages leave the page cache
  // (dropped here behind the store's back, its descriptors kept open), it reads direct.
  std::vector<uint8_t> grown;
  for (uint32_t i = 0; i < 3; ++i) {
    const auto piece = pattern(512u << 10, 50 + i);
    ASSERT_TRUE(store.write(kIno, 2, kChunk4M, i * (512u << 10), piece).has_value());
    grown.insert(grown.end(), piece.begin(), piece.end());
  }
  {
    const std::string path = store.target().chunk_path(kIno, 2);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << path;
    EXPECT_EQ(::fdatasync(fd), 0);
    EXPECT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    ::close(fd);
  }
  ByteBuffer g(grown.size());
  const uint64_t before_grown = store.direct_reads();
  ASSERT_EQ(read_into(g, 2, 0), grown.size());
  EXPECT_TRUE(std::equal(g.begin(), g.end(), grown.begin()));
  EXPECT_EQ(store.direct_reads(), before_grown + 1);
}

// read_for_reply, the data service's one call per Read: a range that may go out unread does (a
// hole as an empty range); one that may not, or must not (a cold range of a long chunk under
// direct_read_min, an unaligned one), is read and verified into the buffer, sized to its bytes.
TEST(ChunkStoreReadForReply, SendsUnreadWhereItMayAndReadsIntoTheBufferElse) {
  TempDir dir;
  auto owned = open_store(dir, hybrid_options());
  ASSERT_NE(owned, nullptr);
  ChunkStore& store = *owned;
  const auto large = pattern(2u << 20, 61);
  const auto small = pattern(10000, 62);  // a partial last block
  ASSERT_TRUE(store.write(kIno, 0, kChunk4M, 0, large).has_value());
  ASSERT_TRUE(store.write(kIno, 1, kChunk4M, 0, small).has_value());
  ByteBuffer out;

  auto r = store.read_for_reply(kIno, 1, kChunk4M, 0, kChunk4M, true, &out);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  ASSERT_TRUE(r->unread.has_value());
  EXPECT_EQ(bytes_of(*r->unread), small);
  EXPECT_TRUE(out.empty());

  r = store.read_for_reply(kIno, 1, kChunk4M, 0, kChunk4M, false, &out);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  EXPECT_FALSE(r->unread.has_value());
  EXPECT_EQ(r->length, small.size());
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), small);

  r = store.read_for_reply(kIno, 1, kChunk4M, 100, 5000, true, &out);  // not whole blocks
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  EXPECT_FALSE(r->unread.has_value());
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()),
            std::vector<uint8_t>(small.begin() + 100, small.begin() + 5100));

  r = store.read_for_reply(kIno, 7, kChunk4M, 0, 4096, true, &out);  // no such chunk
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  ASSERT_TRUE(r->unread.has_value());
  EXPECT_EQ(r->unread->length, 0u);
  r = store.read_for_reply(kIno, 7, kChunk4M, 0, 4096, false, &out);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  EXPECT_EQ(r->length, 0u);
  EXPECT_TRUE(out.empty());

  ASSERT_TRUE(store.drop_caches().has_value());
  const uint64_t before = store.direct_reads();
  r = store.read_for_reply(kIno, 0, kChunk4M, 0, 1u << 20, true, &out);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), std::vector<uint8_t>(large.begin(), large.begin() + (1 << 20)));
  if (store.direct_writes_active() && testing::cachestat_works(dir.path())) {
    EXPECT_FALSE(r->unread.has_value()) << "a cold range of a long chunk went out unread";
    EXPECT_EQ(store.direct_reads(), before + 1);
    EXPECT_EQ(store.unbounced_reads(), 1u) << "the reply's buffer was not read into as it is";
  }

  ASSERT_FALSE(out.empty());
  EXPECT_EQ(store.read_for_reply(kIno, 0, kChunk4M, kChunk4M - 4096, 8192, false, &out).status().code(),
            Code::kInvalid);
  EXPECT_TRUE(out.empty()) << "a failed read left bytes in the reply";
  EXPECT_EQ(store.read_for_reply(InodeId{0}, 0, kChunk4M, 0, 4096, true, &out).status().code(), Code::kInvalid);
  EXPECT_TRUE(out.empty());
}

// direct_read_min with buffered_streams and a stream's reads (ReadReq::sequential): a cold range of
// a long chunk that a stream reads goes through the page cache (read ahead at a cold open, sent
// unread) while a random read of another cold range of the same chunk, on the descriptor the
// stream's open left cached, goes direct; a chunk a random read opened cold (its header read with
// the data) serves a later stream read from the page cache too. Without buffered_streams, and
// under direct_io, a stream's cold read goes direct like any other.
TEST(ChunkStoreDirectReads, UnderBufferedStreamsAStreamsReadsStayInThePageCacheRandomOnesGoDirect) {
  TempDir dir;
  ChunkStoreOptions streams = hybrid_options();
  streams.buffered_streams = true;
  auto owned = open_store(dir, streams);
  ASSERT_NE(owned, nullptr);
  ChunkStore& store = *owned;
  const bool direct = store.direct_writes_active() && testing::cachestat_works(dir.path());
  const auto large = pattern(3u << 20, 71);
  for (uint32_t index : {0u, 1u}) ASSERT_TRUE(store.write(kIno, index, kChunk4M, 0, large).has_value());
  auto slice = [&](uint64_t from, uint64_t n) {
    return std::vector<uint8_t>(large.begin() + static_cast<ptrdiff_t>(from),
                                large.begin() + static_cast<ptrdiff_t>(from + n));
  };
  ASSERT_TRUE(store.drop_caches().has_value());
  const std::string path0 = store.target().chunk_path(kIno, 0);
  const uint64_t data_off = make_chunk_header(kIno.value, 0, kChunk4M).data_offset;
  ByteBuffer out;

  // Chunk 0, opened cold by a stream's read: buffered, read ahead, sent unread.
  auto r = store.read_for_reply(kIno, 0, kChunk4M, 0, 1u << 20, true, &out, /*sequential=*/true);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  ASSERT_TRUE(r->unread.has_value()) << "a stream's cold range of a long chunk was not sent from the page cache";
  EXPECT_EQ(bytes_of(*r->unread), slice(0, 1u << 20));
  EXPECT_EQ(store.direct_reads(), 0u) << "a stream's read went direct";
  r = store.read_for_reply(kIno, 0, kChunk4M, 1u << 20, 1u << 20, false, &out, /*sequential=*/true);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), slice(1u << 20, 1u << 20));
  EXPECT_EQ(store.direct_reads(), 0u) << "a stream's read verified at the server went direct";
  EXPECT_GT(resident_in(path0, data_off + (1u << 20), data_off + (2u << 20)), 0u) << "a stream's read skipped the page cache";

  // A random read of a cold range of the same chunk (its descriptor cached): direct where it can.
  r = store.read_for_reply(kIno, 0, kChunk4M, 2u << 20, 128u << 10, true, &out);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  if (direct) {
    EXPECT_FALSE(r->unread.has_value()) << "a random cold range went out from the page cache";
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), slice(2u << 20, 128u << 10));
    EXPECT_EQ(store.direct_reads(), 1u);
    EXPECT_EQ(resident_in(path0, data_off + (2u << 20), data_off + (2u << 20) + (128u << 10)), 0u);
  } else {
    std::printf("note: O_DIRECT or cachestat(2) is missing under $TMPDIR; only the buffered side is tested\n");
    ASSERT_TRUE(r->unread.has_value());
    EXPECT_EQ(bytes_of(*r->unread), slice(2u << 20, 128u << 10));
    EXPECT_EQ(store.direct_reads(), 0u);
  }

  // Chunk 1, opened cold by a random read (its header read in the O_DIRECT batch), then a stream
  // reads another cold range of it: from the page cache.
  r = store.read_for_reply(kIno, 1, kChunk4M, 0, 128u << 10, true, &out);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  const uint64_t after_random = store.direct_reads();
  EXPECT_EQ(after_random, direct ? 2u : 0u);
  r = store.read_for_reply(kIno, 1, kChunk4M, 1u << 20, 1u << 20, true, &out, /*sequential=*/true);
  ASSERT_TRUE(r.has_value()) << r.status().to_string();
  ASSERT_TRUE(r->unread.has_value()) << "a stream's range of a chunk a random read opened went direct";
  EXPECT_EQ(bytes_of(*r->unread), slice(1u << 20, 1u << 20));
  EXPECT_EQ(store.direct_reads(), after_random);

  // direct_read_min alone, and direct_io: a stream's cold read goes direct.
  ChunkStoreOptions all;
  all.direct_io = true;
  for (const ChunkStoreOptions& o : {hybrid_options(), all}) {
    SCOPED_TRACE(o.describe_io());
    TempDir other_dir;
    auto other = open_store(other_dir, o);
    ASSERT_NE(other, nullptr);
    ASSERT_TRUE(other->write(kIno, 0, kChunk4M, 0, large).has_value());
    if (!(other->direct_io_active() || (direct && other->direct_writes_active()))) continue;
    ASSERT_TRUE(other->drop_caches().has_value());
    r = other->read_for_reply(kIno, 0, kChunk4M, 0, 1u << 20, true, &out, /*sequential=*/true);
    ASSERT_TRUE(r.has_value()) << r.status().to_string();
    EXPECT_FALSE(r->unread.has_value()) << "a stream's cold read went through the page cache";
    EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), slice(0, 1u << 20));
    EXPECT_EQ(other->direct_reads(), 1u);
  }
}

// write_piece_while_reading: a direct write goes in pieces only while a read of the target that
// waits for the disk is in progress (here a range read_unverified() returned from a file it had to
// open, which counts until its keep is dropped, as the bytes are staged after the call; a range
// already in the page cache does not count), and the bytes come out the same either way: at an
// unaligned offset into an existing chunk, and with a partial last block.
TEST(ChunkStoreDirectWrites, WritesGoInPiecesOnlyWhileAReadWaitsForTheDisk) {
  TempDir dir;
  ChunkStoreOptions o;
  o.direct_write_min = 1u << 20;
  o.write_piece_while_reading = 512u << 10;
  o.read_hold = std::chrono::milliseconds(0);
  auto owned = open_store(dir, o);
  ASSERT_NE(owned, nullptr);
  ChunkStore& store = *owned;
  auto expect0 = pattern(2u << 20, 11);
  ASSERT_TRUE(store.write(kIno, 0, kChunk4M, 0, expect0).has_value());
  if (!store.direct_writes_active()) GTEST_SKIP() << "O_DIRECT is refused by $TMPDIR's file system; only direct writes go in pieces";
  EXPECT_EQ(store.write_pieces(), 0u) << "a write went in pieces with no read around";

  std::vector<uint8_t> back(expect0.size());
  ASSERT_TRUE(store.read(kIno, 0, kChunk4M, 0, back).has_value());
  EXPECT_EQ(back, expect0);
  EXPECT_EQ(store.reads_in_progress(), 0) << "read() left its read counted";
  const bool cachestat = testing::cachestat_works(dir.path());
  if (cachestat) {  // it tells a cached range apart
    auto cached = store.read_unverified(kIno, 0, kChunk4M, 0, kChunk4M);
    ASSERT_TRUE(cached.has_value() && cached->has_value());
    EXPECT_EQ(store.reads_in_progress(), 0) << "a range in the page cache counted as a disk read";
  }
  ASSERT_TRUE(store.drop_caches().has_value());
  auto unread = store.read_unverified(kIno, 0, kChunk4M, 0, kChunk4M);
  ASSERT_TRUE(unread.has_value() && unread->has_value()) << "an aligned range must be sendable unread";
  EXPECT_EQ(store.reads_in_progress(), 1) << "a cold range stopped counting before its bytes were staged";

  // 1.5 MiB + 100 bytes at 8 KiB + 100 of chunk 0: three pieces of 512 KiB and one of 4 KiB,
  // the old bytes around it kept; then 2 MiB + 4 KiB + 100 bytes into a new chunk: four pieces,
  // one of 4 KiB, and a partial block through the buffered descriptor.
  const auto middle = pattern((3u << 19) + 100, 12);
  ASSERT_TRUE(store.write(kIno, 0, kChunk4M, 8192 + 100, middle).has_value());
  std::copy(middle.begin(), middle.end(), expect0.begin() + 8192 + 100);
  EXPECT_EQ(store.write_pieces(), 4u);
  // The O_DIRECT write dropped those pages: a range of the open (cached) file that needs them
  // waits for the disk and counts too (without cachestat every read counts).
  if (cachestat) {
    auto warm_fd = store.read_unverified(kIno, 0, kChunk4M, 0, kChunk4M);
    ASSERT_TRUE(warm_fd.has_value() && warm_fd->has_value());
    EXPECT_EQ(store.reads_in_progress(), 2) << "a range not in the page cache of an open file did not count";
    (*warm_fd)->keep.reset();
  }
  // A hole of an open file reads nothing: it does not count.
  ASSERT_TRUE(store.read_unverified(kIno, 0, kChunk4M, 3u << 20, 4096).has_value());
  EXPECT_EQ(store.reads_in_progress(), 1);
  const auto fresh = pattern((2u << 20) + 4096 + 100, 13);
  ASSERT_TRUE(store.write(kIno, 1, kChunk4M, 0, fresh).has_value());
  EXPECT_EQ(store.write_pieces(), 4u + 5u);
  (*unread)->keep.reset();
  EXPECT_EQ(store.reads_in_progress(), 0);
  const auto after = pattern(3u << 20, 14);
  ASSERT_TRUE(store.write(kIno, 2, kChunk4M, 0, after).has_value());
  EXPECT_EQ(store.write_pieces(), 9u) << "writes still went in pieces after the read ended";

  for (const auto& [index, expect] :
       {std::pair<uint64_t, const std::vector<uint8_t>*>{0, &expect0}, {1, &fresh}, {2, &after}}) {
    std::vector<uint8_t> got(kChunk4M);
    auto n = store.read(kIno, index, kChunk4M, 0, got);
    ASSERT_TRUE(n.has_value()) << n.status().to_string();
    got.resize(*n);
    EXPECT_EQ(got, *expect) << "chunk " << index;
  }
}

// Disk full: a small tmpfs is filled until writes fail; the failing write and every later one must
// leave existing chunk bytes as they were. Needs root for mount(2).
class ChunkStoreNoSpace : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs to fill needs root; run as root to cover ENOSPC";
    mnt_ = tmp_.path() + "/mnt";
    std::filesystem::create_directories(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=2m") != 0) {
      int err = errno;
      mnt_.clear();
      GTEST_SKIP() << "cannot mount tmpfs (" << std::strerror(err) << "); ENOSPC path not covered here";
    }
    mounted_ = true;
    auto t = Target::open(mnt_);
    ASSERT_TRUE(t.has_value()) << t.status().to_string();
    store_ = std::make_unique<ChunkStore>(std::shared_ptr<Target>(std::move(*t)));
  }
  void TearDown() override {
    store_.reset();
    if (mounted_ && ::umount2(mnt_.c_str(), 0) != 0) {
      ADD_FAILURE() << "umount " << mnt_ << ": " << std::strerror(errno) << "; detaching";
      ::umount2(mnt_.c_str(), MNT_DETACH);
    }
  }
  TempDir tmp_;
  std::string mnt_;
  bool mounted_ = false;
  std::unique_ptr<ChunkStore> store_;
};

TEST_F(ChunkStoreNoSpace, FullDiskLeavesExistingBytesUnchanged) {
  const uint32_t cs = 1u << 20;
  const InodeId keep(1), filler(2);
  auto original = pattern(100000, 31);
  ASSERT_TRUE(store_->write(keep, 0, cs, 0, original).has_value());
  bool full = false;
  for (uint64_t i = 0; i < 200 && !full; ++i) {
    auto r = store_->write(filler, i, cs, 0, pattern(256u << 10, 32));
    if (!r.has_value()) {
      ASSERT_EQ(r.status().code(), Code::kNoSpace) << r.status().to_string();
      full = true;
    }
  }
  ASSERT_TRUE(full) << "a 2 MiB tmpfs never filled up";
  // Extending the kept chunk and creating a new one both fail cleanly.
  auto grow = store_->write(keep, 0, cs, 100000, pattern(800000, 33));
  ASSERT_FALSE(grow.has_value());
  EXPECT_EQ(grow.status().code(), Code::kNoSpace);
  std::vector<uint8_t> out(cs);
  auto n = store_->read(keep, 0, cs, 0, out);
  ASSERT_TRUE(n.has_value()) << n.status().to_string();
  ASSERT_EQ(*n, original.size());
  out.resize(*n);
  EXPECT_EQ(out, original);
  // Overwriting bytes that already have space still works on a full disk.
  auto patch = pattern(5000, 34);
  auto over = store_->write(keep, 0, cs, 3000, patch);
  ASSERT_TRUE(over.has_value()) << over.status().to_string();
  EXPECT_EQ(*over, original.size());
  std::copy(patch.begin(), patch.end(), original.begin() + 3000);
  out.assign(cs, 0);
  n = store_->read(keep, 0, cs, 0, out);
  ASSERT_TRUE(n.has_value());
  out.resize(*n);
  EXPECT_EQ(out, original);
  // Freeing space makes writes work again.
  ASSERT_TRUE(store_->remove(filler).is_ok());
  EXPECT_TRUE(store_->write(keep, 0, cs, 100000, pattern(800000, 33)).has_value());
}

}  // namespace
}  // namespace penstock::data
