// LockTable: one reader/writer lock per key (a chunk, an inode), created on first use and dropped
// when the last holder releases it, so memory follows the number of keys in use, not on disk.
// Different keys never block each other (beyond a short critical section on the table itself).
// Thread-safety: all methods may be called from any thread. Lock order where two tables are used:
// the inode table before the chunk table (see chunk_store.h).
#pragma once

#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace penstock::data {

template <class Key, class Hash = std::hash<Key>>
class LockTable {
  struct Entry {
    std::shared_mutex mu;
    int refs = 0;  // guarded by LockTable::mu_
  };

 public:
  // Holds one key's lock (shared or exclusive) until destroyed.
  class Guard {
   public:
    Guard(LockTable* table, Key key, Entry* entry, bool exclusive)
        : table_(table), key_(std::move(key)), entry_(entry), exclusive_(exclusive) {}
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    Guard(Guard&& o) noexcept : table_(o.table_), key_(std::move(o.key_)), entry_(o.entry_), exclusive_(o.exclusive_) {
      o.table_ = nullptr;
    }
    ~Guard() {
      if (table_ == nullptr) return;
      if (exclusive_) {
        entry_->mu.unlock();
      } else {
        entry_->mu.unlock_shared();
      }
      table_->release(key_);
    }

   private:
    LockTable* table_;
    Key key_;
    Entry* entry_;
    bool exclusive_;
  };

  // Blocks until the key's lock is held exclusively.
  Guard lock(const Key& key) {
    Entry* e = acquire(key);
    e->mu.lock();
    return Guard(this, key, e, true);
  }
  // Blocks until the key's lock is held shared.
  Guard lock_shared(const Key& key) {
    Entry* e = acquire(key);
    e->mu.lock_shared();
    return Guard(this, key, e, false);
  }

  // Number of keys with a holder or waiter (tests).
  size_t size() {
    std::lock_guard<std::mutex> g(mu_);
    return map_.size();
  }

 private:
  Entry* acquire(const Key& key) {
    std::lock_guard<std::mutex> g(mu_);
    auto& slot = map_[key];
    if (!slot) slot = std::make_unique<Entry>();
    ++slot->refs;
    return slot.get();
  }
  void release(const Key& key) {
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(key);
    if (it != map_.end() && --it->second->refs == 0) map_.erase(it);
  }

  std::mutex mu_;  // guards map_ and every Entry::refs; never held while waiting on an Entry::mu
  std::unordered_map<Key, std::unique_ptr<Entry>, Hash> map_;
};

}  // namespace penstock::data
