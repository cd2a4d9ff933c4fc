// Store: the ordered key-value store under penstock-meta's namespace (docs/meta-store.md has the
// key schema). Keys and values are byte strings compared bytewise (memcmp order, shorter first).
// The namespace needs a point get, an atomic write batch (all of it is applied or none of it) and a
// forward scan over one key prefix starting at a seek key, delivered a few entries at a time so
// that listing a directory with millions of entries never loads it whole.
//
// Durability is split from visibility (group commit, docs/meta-store.md "Durability"): apply()
// makes a batch visible to every later get/scan at once, and sync() returns when every batch
// applied before the call is durable; concurrent sync() calls share one log sync. write() is both.
// The namespace applies under its mutex and syncs after releasing it, so one fsync covers the
// mutations of every thread that queued up meanwhile.
//
// Implementations: RocksDbStore (server/meta/rocksdb_store.h, the daemon's) and MemoryStore (below,
// for unit tests). A later distributed transactional KV fits behind the same interface.
//
// Ownership: the creator owns the Store; the namespace (MetaService) borrows it.
// Thread-safety: every method may be called from any thread at once. A scan sees every write that
// completed before it started; writes that complete during the scan may or may not be seen.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/base/result.h"

namespace penstock::meta {

// A list of puts and deletes applied atomically by Store::apply / Store::write, in order (a later operation on
// the same key wins). Single-threaded value type.
class WriteBatch {
 public:
  struct Op {
    bool is_delete = false;
    std::string key;
    std::string value;
  };

  void put(std::string key, std::string value) { ops_.push_back(Op{false, std::move(key), std::move(value)}); }
  void del(std::string key) { ops_.push_back(Op{true, std::move(key), {}}); }
  bool empty() const { return ops_.empty(); }
  size_t size() const { return ops_.size(); }
  const std::vector<Op>& ops() const { return ops_; }

 private:
  std::vector<Op> ops_;
};

// Called once per entry during a scan, in key order. Return false to stop the scan.
// The views are valid only during the call. The callback may call get() on the same store.
using ScanFn = std::function<bool(std::string_view key, std::string_view value)>;

class Store {
 public:
  virtual ~Store() = default;

  // The value of `key`, or nullopt when absent. kIo / kCorrupt when the store cannot be read.
  virtual Result<std::optional<std::string>> get(std::string_view key) = 0;

  // get() that leaves every cache as it was (a record cache in front, the database's block
  // cache): for a pass over many records nobody else reads (the scrub), which must not evict
  // those clients use. Same answer as get(). The default is get() (a store that caches nothing).
  virtual Result<std::optional<std::string>> peek(std::string_view key) { return get(key); }

  // Applies every operation of `batch` atomically and makes it visible to later get/scan calls.
  // Not yet durable: call sync() before acknowledging it. kIo / kNoSpace on failure (also after a
  // failed sync: the store refuses writes from then on), and then nothing of the batch was applied.
  virtual Status apply(const WriteBatch& batch) = 0;

  // Returns ok once every batch whose apply() returned before this call is durable (survives
  // kill -9 and power loss). Concurrent callers share syncs (group commit). A failed sync is
  // sticky: kIo now and from every later sync()/apply(), until the database is opened again
  // (penstock-meta does that itself after a full disk: server/meta/disk_reserve.h).
  virtual Status sync() = 0;

  // Without waiting for a sync: every batch applied before this call survives a kill of this
  // process when it returns, and a power loss once the store's delay has passed (its own sync, or
  // any sync() meanwhile). For changes a caller may acknowledge as visible but needs durable only
  // soon after (a close's size report, a create; fsync() asks sync() for it). kIo when the batches
  // could not be handed to the kernel (the caller must not acknowledge them); a failed delayed
  // sync is logged and sticky as for sync(). The default does nothing (a store whose process holds
  // nothing unsynced).
  virtual Status sync_soon() { return Status::ok(); }

  // Tickets, to learn later whether a batch became durable without asking for a sync: the ticket
  // of the latest batch applied so far, and whether a completed sync covered `ticket` (and every
  // batch applied before it). The default tracks nothing: nothing is known covered, so callers
  // fall back on sync().
  virtual uint64_t applied_ticket() const { return 0; }
  virtual bool covered_by_sync(uint64_t ticket) const {
    (void)ticket;
    return false;
  }

  // Drops what the store keeps in memory only for speed (caches; nothing durable changes), so that
  // the next reads start cold. Returns the bytes dropped. The default keeps nothing of the kind.
  virtual uint64_t drop_caches() { return 0; }

  // apply() then sync(): ok means the batch is durable.
  Status write(const WriteBatch& batch) {
    PENSTOCK_RETURN_IF_ERROR(apply(batch));
    return sync();
  }

  // Calls fn for every key that starts with `prefix` and is >= `seek`, in key order, until fn
  // returns false or the prefix is exhausted. `seek` smaller than `prefix` means "from the start
  // of the prefix". kIo when the store cannot be read.
  virtual Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) = 0;

  // A short description for logs ("rocksdb /var/lib/penstock/meta", "memory").
  virtual std::string describe() const = 0;
};

// An in-memory Store over std::map, for unit tests. apply() is atomic under a writer lock and
// sync() does nothing; nothing survives the object. Thread-safe.
class MemoryStore final : public Store {
 public:
  Result<std::optional<std::string>> get(std::string_view key) override;
  Status apply(const WriteBatch& batch) override;
  Status sync() override {
    syncs_.fetch_add(1, std::memory_order_relaxed);
    return Status::ok();
  }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override;
  std::string describe() const override { return "memory"; }

  // Number of keys (tests use it to check that nothing leaks).
  size_t size() const;
  // sync() calls so far (tests check which requests wait for one).
  uint64_t syncs() const { return syncs_.load(std::memory_order_relaxed); }

 private:
  mutable std::shared_mutex mu_;  // leaf lock: never held while calling out (scan copies a page)
  std::map<std::string, std::string, std::less<>> data_;
  std::atomic<uint64_t> syncs_{0};
};

}  // namespace penstock::meta
