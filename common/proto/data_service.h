// The data service (penstock-data): chunk I/O on targets, declared once. Chunk bytes travel in the
// frame's bulk segment, never inside these messages. Method numbers are wire format.
#pragma once

#include <cstdint>
#include <vector>

#include "common/proto/method.h"
#include "common/proto/types.h"

namespace penstock::proto::data {

// Which chunk: a target holds chunks of many inodes, keyed by (inode, chunk index). chunk_size is
// the file's layout chunk size; an offset+length past it is kInvalid.
struct ChunkKey {
  ChainId chain; TargetId target; InodeId ino; uint64_t chunk_index = 0; uint32_t chunk_size = 0;
  PENSTOCK_FIELDS(chain, target, ino, chunk_index, chunk_size);
};

// Write the request's bulk bytes at `offset` in the chunk. Checksums are computed and stored per
// block; the response is sent only once the bytes are written (kNoSpace when the disk is full, and
// then no existing byte of the chunk changed).
struct WriteReq { ChunkKey key; uint32_t offset = 0; PENSTOCK_FIELDS(key, offset); };
struct WriteResp { uint64_t chunk_length = 0; PENSTOCK_FIELDS(chunk_length); };

// Read up to `length` bytes at `offset`. The response's bulk holds the bytes the chunk has there
// (fewer at the end of the chunk, none for a missing chunk: the caller reads holes as zeros).
// The server verifies each kChecksumBlock block against its stored checksums and answers kCorrupt
// on a mismatch, unless the request says `verify_at_client` and the server chooses to send the
// bytes unread (straight from its page cache): then `block_sums` holds, for every block of the
// range, the two checksums the block may match (XXH3 64 of its bytes: current, previous), and the
// client must check them before it uses a byte. The server chooses so only for a range that
// starts on a block and ends on a block or at the chunk's end. Empty `block_sums`: verified.
// `sequential`: the read belongs to a stream the client reads ahead of (its read-ahead, or a read
// the stream's window covers), as opposed to a random sample or a read the client cannot place; a
// data server that reads cold ranges of long chunks with O_DIRECT (--direct-read-min) keeps a
// stream's reads in its page cache when it runs --buffered-streams. A hint: no answer changes.
inline constexpr uint32_t kChecksumBlock = 4096;
struct ReadReq {
  ChunkKey key; uint32_t offset = 0; uint32_t length = 0; bool verify_at_client = false; bool sequential = false;
  PENSTOCK_FIELDS(key, offset, length, verify_at_client, sequential);
};
struct ReadResp { uint32_t length = 0; std::vector<uint64_t> block_sums; PENSTOCK_FIELDS(length, block_sums); };
// A Read's response carries at most `length` bytes: the server counts them in flight from the
// moment it reads the request (rpc::RpcServer::reply_bound).
inline uint64_t reply_bulk_bound(const ReadReq& r) { return r.length; }

// Make the target's chunks of `ino` match a file of `size` bytes: chunks wholly past it are
// removed, the chunk that holds the end is cut there.
struct TruncateReq { TargetId target; InodeId ino; uint64_t size = 0; uint32_t chunk_size = 0; PENSTOCK_FIELDS(target, ino, size, chunk_size); };
// Remove every chunk of `ino` on the target (a missing inode is fine: removal is idempotent).
struct RemoveReq { TargetId target; InodeId ino; PENSTOCK_FIELDS(target, ino); };
// Flush `ino`'s chunks on the target to stable storage (fsync).
struct SyncReq { TargetId target; InodeId ino; PENSTOCK_FIELDS(target, ino); };
// Drop the server's caches of the named targets (every target it serves when `targets` is empty):
// its open chunk-file descriptors and the kernel page cache of the chunk files (dirty pages are
// written first, so no byte changes). For benchmarks that must start cold; safe during I/O.
struct DropCachesReq { std::vector<TargetId> targets; PENSTOCK_FIELDS(targets); };
struct DropCachesResp {
  uint32_t targets = 0;     // targets whose caches were dropped
  uint64_t files = 0;       // chunk files whose page cache was dropped
  uint64_t fds_closed = 0;  // open-file cache entries dropped
  PENSTOCK_FIELDS(targets, files, fds_closed);
};
// The inodes that have chunks in one bucket of a target (Target::kBuckets buckets, an inode's
// chunks lie in bucket ino % kBuckets): those above `after`, ascending, at most `max` of them
// (0 or more than kMaxListInodes: kMaxListInodes). For penstock-meta's scrub, which pages through
// every bucket and removes the chunks of inodes the namespace does not have.
inline constexpr uint32_t kListBuckets = 256;
inline constexpr uint32_t kMaxListInodes = 65536;  // 512 KiB of reply
struct ListInodesReq {
  TargetId target; uint32_t bucket = 0; InodeId after; uint32_t max = 0;
  PENSTOCK_FIELDS(target, bucket, after, max);
};
struct ListInodesResp {
  std::vector<InodeId> inodes;  // ascending
  bool more = false;            // inodes above the last one remain in the bucket
  PENSTOCK_FIELDS(inodes, more);
};

// What one target served since its data server started, for `penstock stats`: its Write, Read,
// Truncate, Remove and Sync requests answered (failed ones included; DropCaches and ListInodes are
// not counted), bytes moved, how reads went. Counters only grow; a restart of the data server
// starts them at 0 again (StatsResp::uptime_ms says when). `Count` is uint64_t on the wire; the
// data server keeps them as relaxed atomics of the same layout, read one by one, so a snapshot
// under load may be a request apart between fields.
template <class Count>
struct TargetCountersOf {
  Count reads{};             // Read requests of the target
  Count read_bytes{};        // bytes they answered (holes count none)
  Count sequential_reads{};  // of the reads answered, those marked ReadReq::sequential (a stream read ahead)
  Count direct_reads{};      // reads whose bytes came from the disk with O_DIRECT
  Count unread_reads{};      // reads answered with bytes sent from the page cache unread (client verifies)
  Count writes{};            // Write requests
  Count write_bytes{};       // bytes they wrote
  Count truncates{};
  Count removes{};
  Count syncs{};
  Count errors{};            // of those requests, the ones answered with an error
  Count corrupt{};           // of them, kCorrupt: a block failing its checksum, a damaged chunk header
  Count no_space{};          // of them, kNoSpace: a full disk or quota (ENOSPC, EDQUOT)
  PENSTOCK_FIELDS(reads, read_bytes, sequential_reads, direct_reads, unread_reads, writes, write_bytes, truncates,
                  removes, syncs, errors, corrupt, no_space);
};
using TargetCounters = TargetCountersOf<uint64_t>;
struct TargetStats {
  TargetId target;
  TargetCounters counters;
  PENSTOCK_FIELDS(target, counters);
};
struct StatsResp {
  uint64_t uptime_ms = 0;              // since the data server started
  std::vector<TargetStats> targets;    // every target it serves now, by id
  std::vector<MethodStats> methods;    // every method it has handled, by name (none called: left out)
  uint64_t instance = 0;               // this run of the data server (RpcServer::instance)
  PENSTOCK_FIELDS(uptime_ms, targets, methods, instance);
};

using ServiceId = ::penstock::proto::ServiceId;
PENSTOCK_METHOD(Write, ServiceId::kData, 1, WriteReq, WriteResp);
PENSTOCK_METHOD(Read, ServiceId::kData, 2, ReadReq, ReadResp);
PENSTOCK_METHOD(Truncate, ServiceId::kData, 3, TruncateReq, Empty);
PENSTOCK_METHOD(Remove, ServiceId::kData, 4, RemoveReq, Empty);
PENSTOCK_METHOD(Sync, ServiceId::kData, 5, SyncReq, Empty);
PENSTOCK_METHOD(DropCaches, ServiceId::kData, 6, DropCachesReq, DropCachesResp);
PENSTOCK_METHOD(ListInodes, ServiceId::kData, 7, ListInodesReq, ListInodesResp);
PENSTOCK_METHOD(Stats, ServiceId::kData, 8, Empty, StatsResp);

}  // namespace penstock::proto::data
