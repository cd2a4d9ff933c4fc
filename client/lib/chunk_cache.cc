#include "client/lib/chunk_cache.h"

namespace penstock::client {

void CachedBlock::complete(Status st) {
  std::vector<std::function<void(const Status&)>> then;
  Status result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(st);
    done_ = true;
    then.swap(then_);
    if (!then.empty()) result = status_;
  }
  cv_.notify_all();
  for (auto& fn : then) fn(result);
}

bool CachedBlock::then(std::function<void(const Status&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return false;
  then_.push_back(std::move(fn));
  return true;
}

Status CachedBlock::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return status_;
}

bool CachedBlock::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

ChunkCache::ChunkCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

void ChunkCache::drop_locked(std::unordered_map<InodeId, InodeBlocks>::iterator it,
                             std::map<uint64_t, Entry>::iterator e) {
  used_ -= e->second.block->length();
  lru_.erase(e->second.lru);
  it->second.blocks.erase(e);
  if (it->second.blocks.empty()) inodes_.erase(it);
}

void ChunkCache::drop_inode_locked(std::unordered_map<InodeId, InodeBlocks>::iterator it) {
  for (auto& [off, entry] : it->second.blocks) {
    used_ -= entry.block->length();
    lru_.erase(entry.lru);
  }
  inodes_.erase(it);
}

ChunkCache::Lookup ChunkCache::get_or_start(InodeId ino, uint64_t generation, uint64_t offset, uint32_t length,
                                            uint32_t valid) {
  valid = std::min(valid, length);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it != inodes_.end()) {
    if (generation < it->second.generation) {
      // A handle of an older generation: its bytes must not mix with the newer ones.
      ++stats_.misses;
      return Lookup{std::make_shared<CachedBlock>(offset, length, valid), true};
    }
    if (generation > it->second.generation) {
      drop_inode_locked(it);
      it = inodes_.end();
    } else {
      auto e = it->second.blocks.find(offset);
      if (e != it->second.blocks.end()) {
        if (e->second.block->length() == length && e->second.block->valid() >= valid) {
          lru_.splice(lru_.begin(), lru_, e->second.lru);
          if (e->second.block->done()) {
            ++stats_.hits;
          } else {
            ++stats_.waits;
          }
          return Lookup{e->second.block, false};
        }
        drop_locked(it, e);  // fetched for an older end of file, or another block size: replace
        it = inodes_.find(ino);
      }
    }
  }
  ++stats_.misses;
  auto block = std::make_shared<CachedBlock>(offset, length, valid);
  if (length > capacity_) return Lookup{block, true};
  // Make room: least recently used first (blocks in flight are detached, their waiters keep them).
  while (used_ + length > capacity_ && !lru_.empty()) {
    const LruKey victim = lru_.back();
    auto vit = inodes_.find(victim.ino);
    auto ve = vit->second.blocks.find(victim.offset);
    drop_locked(vit, ve);
    ++stats_.evictions;
  }
  it = inodes_.find(ino);
  if (it == inodes_.end()) {
    it = inodes_.emplace(ino, InodeBlocks{}).first;
    it->second.generation = generation;
  }
  lru_.push_front(LruKey{ino, offset});
  it->second.blocks.emplace(offset, Entry{block, lru_.begin()});
  used_ += length;
  return Lookup{block, true};
}

std::shared_ptr<CachedBlock> ChunkCache::find_ready(InodeId ino, uint64_t generation, uint64_t offset, bool join) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end() || it->second.generation != generation) return nullptr;
  auto e = it->second.blocks.find(offset);
  if (e == it->second.blocks.end()) return nullptr;
  const bool done = e->second.block->done();
  if (!done && !join) return nullptr;
  lru_.splice(lru_.begin(), lru_, e->second.lru);
  ++(done ? stats_.hits : stats_.waits);
  return e->second.block;
}

void ChunkCache::erase(InodeId ino, const std::shared_ptr<CachedBlock>& block) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return;
  auto e = it->second.blocks.find(block->offset());
  if (e != it->second.blocks.end() && e->second.block == block) drop_locked(it, e);
}

void ChunkCache::invalidate_range(InodeId ino, uint64_t offset, uint64_t length) {
  if (length == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it == inodes_.end()) return;
  auto& blocks = it->second.blocks;
  const uint64_t end = offset + length;
  // The first block that may overlap starts before `end`; blocks are at most one chunk long, so
  // walk back from the first block at or after `offset` by one.
  auto e = blocks.lower_bound(offset);
  if (e != blocks.begin()) --e;
  std::vector<uint64_t> doomed;
  for (; e != blocks.end() && e->first < end; ++e) {
    const uint64_t b_end = e->first + e->second.block->length();
    if (b_end > offset) doomed.push_back(e->first);
  }
  for (uint64_t off : doomed) {
    auto it2 = inodes_.find(ino);
    if (it2 == inodes_.end()) break;
    auto e2 = it2->second.blocks.find(off);
    if (e2 != it2->second.blocks.end()) drop_locked(it2, e2);
  }
}

void ChunkCache::invalidate(InodeId ino) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it != inodes_.end()) drop_inode_locked(it);
}

void ChunkCache::set_generation(InodeId ino, uint64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = inodes_.find(ino);
  if (it != inodes_.end() && it->second.generation != generation) drop_inode_locked(it);
}

uint64_t ChunkCache::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t dropped = lru_.size();
  inodes_.clear();
  lru_.clear();
  used_ = 0;
  return dropped;
}

CacheStats ChunkCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CacheStats s = stats_;
  s.used_bytes = used_;
  s.blocks = lru_.size();
  return s;
}

}  // namespace penstock::client
