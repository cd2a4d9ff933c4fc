// CachedStore: a bounded in-memory record cache in front of another Store, for the point reads of
// penstock-meta's hot path. A lookup reads three records (parent, entry, inode), an open two, a
// release one; from RocksDB each is a memtable skip-list search, about a fifth of the meta
// server's CPU in a cold small-file read (docs/performance.md, round 12). Here a hit is a hash
// lookup.
//
// Only keys under the configured prefixes are cached (the namespace's inode and directory-entry
// records); absent keys are cached too (a create's "name is free" check). Every other call goes
// straight to the inner store.
//
// Consistency: a get() returns exactly what the inner store would return at some moment during
// the call, so the namespace sees the same store with or without the cache. apply() marks the
// batch's cached keys as in flight (dropping their entries) before it writes the inner store and
// clears the mark after: a get of a key in flight reads the inner store and caches nothing. A miss
// caches what it read only if no write started or ended in that key's shard meanwhile.
//
// Ownership: borrows the inner store, which must outlive it.
// Thread-safety: every method may be called from any thread at once (the inner store's own
// guarantee); the cache is split into shards with one leaf mutex each.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "server/meta/store.h"

namespace penstock::meta {

struct CachedStoreOptions {
  // Bytes of keys and values (with a fixed per-entry overhead) kept; least recently used go first.
  // 0 caches nothing (every call goes to the inner store).
  size_t capacity_bytes = size_t{128} << 20;
  // Keys starting with one of these are cached; the rest are not.
  std::vector<std::string> prefixes;
};

class CachedStore final : public Store {
 public:
  // REQUIRES: inner outlives the CachedStore.
  CachedStore(Store* inner, CachedStoreOptions options);

  Result<std::optional<std::string>> get(std::string_view key) override;
  // Straight to the inner store's peek(): nothing is looked up in or added to this cache. The
  // inner store holds every applied batch (writes go through), so the answer is get()'s.
  Result<std::optional<std::string>> peek(std::string_view key) override { return inner_->peek(key); }
  Status apply(const WriteBatch& batch) override;
  Status sync() override { return inner_->sync(); }
  Status sync_soon() override { return inner_->sync_soon(); }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return inner_->scan(prefix, seek, fn);
  }
  std::string describe() const override { return inner_->describe(); }
  // Empties the cache, then the inner store's caches; the bytes of both.
  uint64_t drop_caches() override;
  uint64_t applied_ticket() const override { return inner_->applied_ticket(); }
  bool covered_by_sync(uint64_t ticket) const override { return inner_->covered_by_sync(ticket); }

  // Counters for logs and tests: cached reads answered from memory and from the inner store.
  uint64_t hits() const { return hits_.load(std::memory_order_relaxed); }
  uint64_t misses() const { return misses_.load(std::memory_order_relaxed); }
  // Bytes held now (keys, values and the per-entry overhead), all shards.
  size_t bytes() const;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Entry {
    std::string key;
    std::optional<std::string> value;
  };
  struct alignas(64) Shard {  // one cache line each: threads on different shards do not meet
    mutable std::mutex mu;  // leaf lock: never held while calling the inner store
    std::list<Entry> lru;   // most recently used first
    std::unordered_map<std::string_view, std::list<Entry>::iterator, StringHash, std::equal_to<>> index;
    std::unordered_map<std::string, int, StringHash, std::equal_to<>> in_flight;  // key -> applies writing it
    uint64_t generation = 0;  // bumped when a write to this shard starts or ends
    size_t bytes = 0;
  };

  bool cacheable(std::string_view key) const;
  Shard& shard_of(std::string_view key);
  static size_t entry_bytes(const Entry& e);
  // REQUIRES: s.mu held.
  void erase_locked(Shard& s, std::string_view key);
  void insert_locked(Shard& s, std::string_view key, const std::optional<std::string>& value);

  Store* inner_;
  CachedStoreOptions options_;
  size_t shard_capacity_;
  std::vector<Shard> shards_;
  alignas(64) std::atomic<uint64_t> hits_{0};
  alignas(64) std::atomic<uint64_t> misses_{0};
};

}  // namespace penstock::meta
