// ChunkCache: the client's one bounded cache of file data, shared by every file of a mount. It
// holds aligned ranges of chunks ("blocks", at most one chunk each) keyed by (inode, generation,
// file offset), evicts the least recently used block when a new one would pass the capacity, and
// lets a read of a block that is being fetched wait for that fetch instead of issuing its own.
//
// Freshness (README consistency contract): one generation per inode is cached at a time; a lookup
// with a newer generation (the file changed at the meta server since: another host's close, a
// truncate) drops every block of the older one; a lookup with an older generation (a handle opened
// before the change) bypasses the cache. Client invalidates ranges on its own writes and truncates.
// An invalidated or evicted block that is still being fetched is detached: its current waiters
// get its bytes, later lookups start a new fetch.
//
// Thread-safety: every method may be called from any thread. CachedBlock::complete() must be called
// exactly once by the caller that got `fetch = true` (also for blocks not kept in the cache).
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/base/ids.h"
#include "common/base/status.h"

namespace penstock::client {

// One block of file data, complete or in flight.
class CachedBlock {
 public:
  // The buffer is not zeroed: the fetcher writes every byte (holes as zeros, zero_fill_tail).
  // `valid`: see valid(); more than `length` means the whole block.
  CachedBlock(uint64_t offset, uint32_t length, uint32_t valid = UINT32_MAX)
      : offset_(offset), length_(length), valid_(std::min(valid, length)), data_(new uint8_t[length]) {}

  uint64_t offset() const { return offset_; }
  uint32_t length() const { return length_; }
  // The bytes from the block's start that lay before the file's end when its fetch was asked for.
  // A block holds whole pages, so past them it holds zeros, or bytes of unknown age: a read of a
  // file that grew since (another client appended within the last page) must not take them.
  uint32_t valid() const { return valid_; }
  // The buffer the fetcher fills before complete(); readers use it only after wait() returns ok.
  std::span<uint8_t> buffer() { return std::span<uint8_t>(data_.get(), length_); }
  const uint8_t* data() const { return data_.get(); }

  // Publishes the fetch result (the buffer must be fully filled, holes as zeros), wakes waiters and
  // then runs the continuations given to then(), in order, on this thread, with no lock held.
  void complete(Status st);
  // Waits until complete() and returns its status.
  Status wait();
  bool done() const;
  // Instead of waiting: `fn` runs with the fetch's status inside complete(), on the thread that
  // completes the block (often a connection's I/O thread, so `fn` must not block). Returns false,
  // without keeping `fn`, when the block is complete already (the caller reads it at once).
  bool then(std::function<void(const Status&)> fn);

 private:
  const uint64_t offset_;
  const uint32_t length_;
  const uint32_t valid_;
  const std::unique_ptr<uint8_t[]> data_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  Status status_;      // guarded by mu_
  std::vector<std::function<void(const Status&)>> then_;  // guarded by mu_; run once by complete()
};

struct CacheStats {
  uint64_t hits = 0;        // lookups that found a complete block
  uint64_t waits = 0;       // lookups that joined a fetch in flight
  uint64_t misses = 0;      // lookups that started a fetch
  uint64_t evictions = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;
};

class ChunkCache {
 public:
  // capacity_bytes 0 disables caching (every lookup is a fetch that is not kept).
  explicit ChunkCache(uint64_t capacity_bytes);

  struct Lookup {
    std::shared_ptr<CachedBlock> block;
    bool fetch = false;  // the caller must fill block->buffer() and call complete()
  };
  // The block of `ino` at `offset` (length `length`, at least `valid` bytes of it valid: see
  // CachedBlock::valid) for `generation`; a cached block with fewer valid bytes is replaced by a
  // new fetch. Counts as a use (LRU).
  Lookup get_or_start(InodeId ino, uint64_t generation, uint64_t offset, uint32_t length,
                      uint32_t valid = UINT32_MAX);
  // Only a complete block or, with `join`, one still being fetched (the caller then waits for it);
  // nullptr otherwise (no fetch is started). Counts as a use.
  std::shared_ptr<CachedBlock> find_ready(InodeId ino, uint64_t generation, uint64_t offset, bool join = false);
  // Removes `block` if it is still the cached block at its offset (after a failed fetch).
  void erase(InodeId ino, const std::shared_ptr<CachedBlock>& block);
  // Drops every block of `ino` that overlaps [offset, offset + length).
  void invalidate_range(InodeId ino, uint64_t offset, uint64_t length);
  // Drops every block of `ino`.
  void invalidate(InodeId ino);
  // Drops the blocks of `ino` unless they belong to `generation` (e.g. at open).
  void set_generation(InodeId ino, uint64_t generation);
  // Drops every block of every inode (cold-cache benchmarks). Blocks still being fetched are
  // detached like evicted ones: their current waiters get their bytes, their fetchers complete them
  // without putting them back (erase() checks identity), and every later lookup starts a new fetch.
  // Returns the number of blocks dropped; the hit/miss counters are kept.
  uint64_t clear();

  uint64_t capacity() const { return capacity_; }
  CacheStats stats() const;

 private:
  struct LruKey {
    InodeId ino;
    uint64_t offset;
  };
  struct Entry {
    std::shared_ptr<CachedBlock> block;
    std::list<LruKey>::iterator lru;
  };
  struct InodeBlocks {
    uint64_t generation = 0;
    std::map<uint64_t, Entry> blocks;  // by file offset
  };
  // REQUIRES mu_ held. Removes one entry; erases the inode record when it becomes empty.
  void drop_locked(std::unordered_map<InodeId, InodeBlocks>::iterator it, std::map<uint64_t, Entry>::iterator e);
  void drop_inode_locked(std::unordered_map<InodeId, InodeBlocks>::iterator it);

  const uint64_t capacity_;
  mutable std::mutex mu_;  // leaf lock
  std::unordered_map<InodeId, InodeBlocks> inodes_;  // guarded by mu_
  std::list<LruKey> lru_;                            // most recent first; guarded by mu_
  uint64_t used_ = 0;                                // guarded by mu_
  CacheStats stats_;                                 // guarded by mu_ (used_bytes, blocks derived)
};

}  // namespace penstock::client
