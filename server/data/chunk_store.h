// ChunkStore: the chunks of one Target, keyed by (inode, chunk index), each block checksummed with
// XXH3 and verified on every read and before every read-modify-write (docs/chunk-format.md).
//
// Disk I/O goes through run_io() (io_uring, one ring per calling thread). Writes first reserve the
// byte range with fallocate, so a full disk gives kNoSpace before any byte of the chunk changes.
//
// Open chunk files are kept in a bounded LRU (ChunkStoreOptions::fd_cache entries, each one or two
// descriptors), so a request costs no open/close. An entry is shared (shared_ptr) by the requests
// using it: eviction or drop_caches() never closes a descriptor under a running request. Only this
// store changes chunk files, so an entry stays valid until truncate/remove of its inode (which hold
// the inode lock exclusively, so no request of that inode runs) drop it. The length is read with
// fstat on every request; the header is verified once, when the file is opened, or, for a cold
// read whose data moves with O_DIRECT, in the same batch as that data (one wait for the disk, not
// one for the header and one for the data), before any byte of it is used. A file enters the cache
// only with its header verified.
//
// With ChunkStoreOptions::direct_io, chunk data moves with O_DIRECT through a 4 KiB-aligned
// per-thread buffer (the header and checksum table stay buffered: they are small and not aligned);
// the partial last block of a chunk goes through the buffered descriptor, because an O_DIRECT write
// would round the file size up. With direct_write_min, only writes at least that large take the
// O_DIRECT path (a checkpoint's streaming writes, which fsync follows: the disk write overlaps the
// transfer and nothing is left dirty), while small writes use the page cache. With
// direct_read_min, a read of a chunk at least that long (a large file's) whose bytes are not all in
// the page cache moves them with O_DIRECT, straight into the caller's buffer when it is aligned:
// cold data reaches the client without filling this host's page cache first, while the chunks of
// small files, ranges still cached (just written through it), and ranges holding pages not yet
// written back (which an O_DIRECT read would wait for) are read buffered and may be sent unread.
// The page cache is asked with cachestat(2) (Linux 6.5); without it direct_read_min is off (logged).
// A target whose file system refuses O_DIRECT (tmpfs) logs a warning once and runs buffered.
//
// Thread-safety: every method may be called from any thread at once. Locks, in this order:
//   inode lock   shared by write/read/sync of one inode, exclusive for truncate and remove
//   chunk lock   shared by reads of one chunk, exclusive for a write or a cut of that chunk
// so writes to one chunk never interleave their read-modify-write, while different chunks (and
// concurrent reads of one chunk) proceed in parallel. No lock is held across anything but local
// disk I/O.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/ids.h"
#include "common/base/result.h"
#include "common/proto/data_service.h"
#include "server/data/lock_table.h"
#include "server/data/recent_reads.h"
#include "server/data/target.h"

namespace penstock::data {

// penstock-data's default for ChunkStoreOptions::direct_write_min (--direct-write-min): a
// checkpoint's chunk-sized writes go direct, small files and partial updates stay buffered.
inline constexpr uint32_t kDefaultDirectWriteMin = 1u << 20;
// penstock-data's default for ChunkStoreOptions::write_piece_while_reading
// (--write-piece-while-reading): a piece is ~0.5 ms of a disk writing 1 GB/s.
inline constexpr uint32_t kDefaultWritePieceWhileReading = 512u << 10;

struct ChunkStoreOptions {
  // Open chunk files kept (LRU); 0 opens and closes the file on every request. Fixed at start.
  size_t fd_cache = 1024;
  // O_DIRECT for all chunk data I/O (off: through the page cache). Fixed at start.
  bool direct_io = false;
  // Writes of at least this many bytes move their data with O_DIRECT even when direct_io is off;
  // smaller writes stay buffered. 0: never. Fixed at start.
  uint32_t direct_write_min = 0;
  // Reads of a chunk at least this long move their data with O_DIRECT even when direct_io is off,
  // unless every page of the range is in the page cache or its whole blocks hold pages not yet
  // written back; reads of shorter chunks, and of a chunk's partial last block alone, stay
  // buffered. 0: never. Fixed at start; off where cachestat(2) is missing.
  uint32_t direct_read_min = 0;
  // Under direct_read_min, reads a client marks sequential (ReadReq::sequential: its read-ahead, a
  // stream's blocks, small files) stay buffered too; off, they go direct like random ones. Which
  // wins depends on the host's cost of a fresh page-cache page (docs/architecture.md).
  bool buffered_streams = false;
  // While reads of the target that wait for the disk are in progress, or one ended less than
  // `read_hold` ago, an O_DIRECT write goes to the disk in pieces of this many bytes (whole
  // blocks), one after another, so a read queues at the disk behind one piece of each write
  // instead of all of it; 0: writes always go whole. Both fixed at start.
  uint32_t write_piece_while_reading = 0;
  std::chrono::milliseconds read_hold{20};

  // Whether some chunk data may move with O_DIRECT (each cached file then may hold two descriptors).
  bool any_direct() const { return direct_io || direct_write_min > 0 || direct_read_min > 0; }
  // The I/O mode in words, for logs.
  std::string describe_io() const;
};

class ChunkStore {
 public:
  explicit ChunkStore(std::shared_ptr<Target> target, ChunkStoreOptions options = {});
  ~ChunkStore();
  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

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

  // A range to send without reading it (rpc::FileBulk) for the receiver to verify.
  struct UnreadRange {
    std::shared_ptr<const void> keep;  // keeps `fd` open, and the read counted until the bytes are staged
    int fd = -1;
    uint64_t file_offset = 0;          // of the range's first byte in the chunk file
    uint32_t length = 0;               // 0: a hole (no chunk, or the offset is at/after its end)
    std::vector<uint64_t> block_sums;  // per block of the range: current, previous (chunk_format.h)
  };
  // Like read(), but neither reads nor verifies the bytes: returns where they are and the stored
  // checksums of each block they cover. std::nullopt when the range must go through read()
  // instead: its data moves with O_DIRECT (direct_io, or direct_read_min and not cached), or the
  // range does not start on a block or end on one or at the end of the chunk. The bytes may
  // change after this returns (a later write), so the receiver re-reads on a mismatch. Errors:
  // those of read() except kCorrupt.
  Result<std::optional<UnreadRange>> read_unverified(InodeId ino, uint64_t chunk_index, uint32_t chunk_size,
                                                     uint32_t offset, uint32_t length);

  // What read_for_reply() did: `unread` holds the range to send unread (a hole has length 0), or,
  // when empty, `length` bytes were read and verified into the buffer.
  struct ReplyRead {
    std::optional<UnreadRange> unread;
    uint32_t length = 0;
  };
  // The read of a reply: read_unverified() when `unread_ok` and the range can be sent so, else
  // read() of `length` bytes into `out`, sized to them first (page-aligned from 64 KiB, so an
  // O_DIRECT read lands in it as it is) and to the bytes read after (empty on an error). One
  // lock, open and plan (plan_read) per request, whichever way it goes. Errors: read()'s.
  // `sequential`: the read belongs to a stream the client reads ahead of (ReadReq::sequential);
  // it counts under buffered_streams only.
  Result<ReplyRead> read_for_reply(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint32_t offset,
                                   uint32_t length, bool unread_ok, ByteBuffer* out, bool sequential = false);

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

  struct DropStats {
    uint64_t fds_closed = 0;  // open-file cache entries dropped
    uint64_t files = 0;       // chunk files whose page cache was dropped
  };
  // Drops this target's caches: every open-file cache entry (descriptors in use by a running
  // request close when it ends), then the page cache of every chunk file: dirty pages are written
  // first (sync_file_range, no metadata flush), then POSIX_FADV_DONTNEED. Safe while I/O runs: no
  // byte is lost or changed (the kernel never discards dirty pages for DONTNEED); pages a
  // concurrent request touches may stay cached. Walks every chunk file: cost grows with the number
  // of chunks. Errors: kIo naming the directory when the chunk tree cannot be listed.
  Result<DropStats> drop_caches();

  // Entries in the open-file cache (tests).
  size_t cached_files() const;
  // Whether all data I/O really uses O_DIRECT (direct_io on and not refused by the file system).
  bool direct_io_active() const { return options_.direct_io && direct_.load(); }
  // Whether writes of direct_write_min bytes or more really use O_DIRECT (also under direct_io).
  bool direct_writes_active() const { return options_.any_direct() && direct_.load(); }
  // O_DIRECT writes that went through the bounce buffer (not page-aligned, or old bytes merged in)
  // and those written from the caller's memory as it was (tests).
  uint64_t bounced_writes() const { return bounced_writes_.load(); }
  uint64_t unbounced_writes() const { return unbounced_writes_.load(); }
  // Reads whose data moved with O_DIRECT, and those of them read straight into the caller's
  // buffer (aligned, whole blocks) rather than through the bounce buffer (tests).
  uint64_t direct_reads() const { return counters_.direct_reads.load(); }
  uint64_t unbounced_reads() const { return unbounced_reads_.load(); }
  // O_DIRECT reads of a file just opened that read and checked its header in their own batch
  // (tests).
  uint64_t joined_header_reads() const { return joined_header_reads_.load(); }
  // The pieces of the O_DIRECT writes that went in pieces because reads were recent, the last,
  // shorter one of each included (tests).
  uint64_t write_pieces() const { return write_pieces_.load(); }
  // Reads of this target in progress that wait for the disk; a range read_unverified() returned
  // counts until its keep is dropped (tests).
  int reads_in_progress() const { return recent_reads_->in_progress(); }

  // What this target served, for `penstock stats` (proto::data::Stats): ChunkService counts the
  // requests into counters(), the store itself its reads that went O_DIRECT. Relaxed atomics, so a
  // snapshot (counters_now) may catch one request counted in some fields and not yet in others.
  using Counters = proto::data::TargetCountersOf<std::atomic<uint64_t>>;
  Counters& counters() { return counters_; }
  proto::data::TargetCounters counters_now() const;

  struct ChunkFile;  // an open chunk file (chunk_store.cc)
  // The range of a chunk a read asks for: what a cold open starts reading from disk at once.
  // `buffered_stream`: the read belongs to a stream the client reads ahead of (ReadReq::sequential)
  // and buffered_streams is set, so it goes through the page cache even under direct_read_min
  // (plan_read); read_for_reply() decides it.
  struct ReadRange {
    uint32_t chunk_size = 0;
    uint64_t offset = 0;
    uint64_t length = 0;
    bool buffered_stream = false;
  };

 private:
  struct PairHash {
    size_t operator()(const std::pair<uint64_t, uint64_t>& p) const noexcept {
      return std::hash<uint64_t>()(p.first * 0x9e3779b97f4a7c15ULL ^ p.second);
    }
  };

  using Key = std::pair<uint64_t, uint64_t>;  // (inode, chunk index)

  Status cut_chunk(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint64_t keep);
  // The open file of a chunk: from the cache, else opened (and cached, unless the open left its
  // header to the read's O_DIRECT batch: header_pending). kNotFound when missing.
  // `cold`: the read this is for, whose bytes an open starts reading at once (null: no read);
  // *opened_size (if given) is set to the file's size when the file was opened here (and so the
  // read started), left empty for one from the cache.
  // REQUIRES: the chunk's lock (either mode) and the inode lock held.
  Result<std::shared_ptr<ChunkFile>> acquire(InodeId ino, uint64_t chunk_index, const ReadRange* cold = nullptr,
                                             std::optional<uint64_t>* opened_size = nullptr);
  Result<std::shared_ptr<ChunkFile>> open_for_read(InodeId ino, uint64_t chunk_index, const ReadRange& range,
                                                   uint64_t* chunk_length, bool* read_started = nullptr);
  // Caches a file just created. REQUIRES: the chunk lock held exclusively.
  void remember(InodeId ino, uint64_t chunk_index, std::shared_ptr<ChunkFile> file);
  // For a file opened with its header pending: checks `hdr`, the first kChunkHeaderSize bytes read
  // from it, against the header the open assumed, and caches the file when they agree. Errors:
  // kNotFound (never written), kCorrupt, kInvalid (created with another chunk size).
  // read_header_now() reads them first (a wait for the disk of its own). REQUIRES: as acquire.
  Status settle_header(InodeId ino, uint64_t chunk_index, const std::shared_ptr<ChunkFile>& file,
                       std::span<const uint8_t> hdr);
  Status read_header_now(InodeId ino, uint64_t chunk_index, const std::shared_ptr<ChunkFile>& file);
  // Drops one chunk's / every chunk's of `ino` cache entry. REQUIRES: the chunk lock exclusive /
  // the inode lock exclusive (no request of theirs runs).
  void forget(InodeId ino, uint64_t chunk_index);
  void forget_inode(InodeId ino);
  // Opens the O_DIRECT descriptor of `file` when direct I/O is on; turns it off (once, logged) when
  // the file system refuses it. REQUIRES: no other request uses `file` (the chunk lock held
  // exclusively, or the file not yet shared).
  void open_direct(ChunkFile& file, const std::string& path);
  // Opens the O_DIRECT descriptor that reads of `file` use and turns read-ahead off on its buffered
  // one. REQUIRES: as open_direct.
  void ready_direct_reads(ChunkFile& file, const std::string& path);
  // Whether direct_read_min is in force (set, O_DIRECT taken, cachestat answering), and whether a
  // chunk of `chunk_length` bytes then reads with O_DIRECT.
  bool direct_reads_on() const;
  bool wants_direct_reads(uint64_t chunk_length) const;
  // How the read of whole blocks [file_offset, file_offset + length) of `file`, a chunk of
  // `chunk_length` bytes, goes: through its O_DIRECT descriptor always under direct_io, else under
  // direct_read_min when the chunk is long enough, the read is no `buffered_stream` (ReadRange) and the
  // range neither all in the page cache nor holding pages to be written back in its aligned part;
  // and whether it is all cached (asked only where it matters: a buffered read of a file this read
  // did not open, `opened_cold`).
  struct ReadPlan {
    bool direct = false;
    bool cached = false;
  };
  ReadPlan plan_read(const ChunkFile& file, uint64_t chunk_length, uint64_t file_offset, uint64_t length,
                     bool opened_cold, bool buffered_stream) const;
  // One read in progress, from its locks to its plan (chunk_store.cc; on the caller's stack, no
  // allocation per read), and its steps: start_read() opens the chunk and plans the read;
  // sendable_unread() says whether the range can go out unread (a hole, or whole blocks read
  // buffered); unread_range() then gives it (the open file and the read's count move into its
  // keep), read_blocks() else reads and verifies it into `out` (at least the range's bytes long).
  struct ReadRequest;
  Status start_read(ReadRequest& r, const ReadRange& range);
  static bool sendable_unread(const ReadRequest& r, uint32_t offset);
  Result<UnreadRange> unread_range(ReadRequest& r);
  Result<uint32_t> read_blocks(const ReadRequest& r, uint32_t offset, std::span<uint8_t> out);

  std::shared_ptr<Target> target_;
  const ChunkStoreOptions options_;
  std::atomic<bool> direct_{false};
  // options_.direct_read_min, or 0 where the target refuses O_DIRECT or cachestat(2) is missing.
  uint32_t direct_read_min_ = 0;
  std::atomic<uint64_t> bounced_writes_{0};
  std::atomic<uint64_t> unbounced_writes_{0};
  std::atomic<uint64_t> unbounced_reads_{0};
  std::atomic<uint64_t> joined_header_reads_{0};
  std::atomic<bool> direct_warned_{false};
  std::atomic<uint64_t> write_pieces_{0};
  Counters counters_;
  // Shared with the keep of every range read_unverified() returned, which may outlive this store.
  const std::shared_ptr<RecentReads> recent_reads_ = std::make_shared<RecentReads>(options_.read_hold);

  struct FdEntry {
    std::shared_ptr<ChunkFile> file;
    std::list<Key>::iterator lru;
  };
  mutable std::mutex fd_mu_;  // leaf lock (taken under the inode and chunk locks, never the reverse)
  std::map<Key, FdEntry> fds_;   // guarded by fd_mu_; ordered so an inode's chunks are one range
  std::list<Key> fd_lru_;        // guarded by fd_mu_; most recent first

  LockTable<uint64_t> inode_locks_;                                  // first
  LockTable<std::pair<uint64_t, uint64_t>, PairHash> chunk_locks_;   // second
};

}  // namespace penstock::data
