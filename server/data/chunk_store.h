// ChunkStore: the chunks of one Target, keyed by (inode, chunk index), each block checksummed with
// XXH3 and verified on every read and before every read-modify-write (docs/chunk-format.md).
//
// Disk I/O goes through run_io() (io_uring, one ring per calling thread). Writes first reserve the
// byte range with fallocate, so a full disk gives kNoSpace before any byte of the chunk changes.
//
// Thread-safety: every method may be called from any thread at once. Locks, in this order:
//   inode lock   shared by write/read/sync of one inode, exclusive for truncate and remove
//   chunk lock   shared by reads of one chunk, exclusive for a write or a cut of that chunk
// so writes to one chunk never interleave their read-modify-write, while different chunks (and
// concurrent reads of one chunk) proceed in parallel. No lock is held across anything but local
// disk I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "common/base/ids.h"
#include "common/base/result.h"
#include "server/data/lock_table.h"
#include "server/data/target.h"

namespace penstock::data {

class ChunkStore {
 public:
  explicit ChunkStore(std::shared_ptr<Target> target);

  Target& target() { return *target_; }
  const Target& target() const { return *target_; }

  // Writes `data` at `offset` of chunk (ino, chunk_index), creating the chunk if missing. A block
  // only partly covered is read and verified first; a gap between the old end and `offset` reads
  // back as zeros. Returns the chunk's new length (max(old length, offset + size)).
  // Errors: kInvalid (bad chunk_size, ino 0, empty data, offset + size > chunk_size, or the chunk
  // exists with another chunk size), kCorrupt (a block it must keep fails its checksum; nothing is
  // changed), kNoSpace (no byte of the chunk changed), kIo.
  Result<uint64_t> write(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint32_t offset,
                         std::span<const uint8_t> data);

  // Reads up to out.size() bytes at `offset` into `out`; returns how many: fewer at the end of the
  // chunk, 0 for a missing chunk or an offset at/after its end. Every block touched is verified.
  // Errors: kInvalid (bad chunk_size, ino 0, offset + out.size() > chunk_size, chunk size differs
  // from the stored one), kCorrupt (a checksum mismatch; `out` then holds no promise), kIo.
  Result<uint32_t> read(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint32_t offset,
                        std::span<uint8_t> out);

  // Makes the chunks of `ino` match a file of `file_size` bytes: chunks wholly at/after it are
  // removed, the chunk that holds the end is cut there (its last block re-checksummed after being
  // verified). Chunks already shorter are left alone (the missing part reads as a hole).
  // Errors: kInvalid (bad chunk_size or ino), kCorrupt (the block at the cut fails its checksum;
  // nothing changed in that chunk), kIo.
  Status truncate(InodeId ino, uint64_t file_size, uint32_t chunk_size);

  // Removes every chunk of `ino` and its directory. A missing inode is ok (idempotent). kIo.
  Status remove(InodeId ino);

  // fsyncs every chunk file of `ino` and the directories that name them. Missing inode: ok. kIo.
  Status sync(InodeId ino);

  // The length of a chunk, kNotFound when missing (tests and tools).
  Result<uint64_t> chunk_length(InodeId ino, uint64_t chunk_index);

 private:
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const noexcept {
      return std::hash<uint64_t>()(p.first * 0x9e3779b97f4a7c15ULL ^ p.second);
    }
  };

  Status cut_chunk(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint64_t keep);

  std::shared_ptr<Target> target_;
  LockTable<uint64_t> inode_locks_;                                  // first
  LockTable<std::pair<uint64_t, uint64_t>, PairHash> chunk_locks_;   // second
};

}  // namespace penstock::data
