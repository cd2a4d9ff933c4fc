// GroupCommitter: group commit for a write-ahead log. Writers append to the log without syncing
// (the write is then visible to readers but not yet durable) and call note_applied(); whoever
// needs durability calls wait_durable(ticket), and one of the waiting threads (the leader) runs
// the sync function for everyone: a sync covers every write whose note_applied() returned before
// that sync started. Followers that arrived while a sync ran are covered by the next one, which
// again one leader runs for all of them. So N concurrent committers cost about two syncs, not N.
//
// Failure is sticky: once a sync fails, the log's state on disk is unknown (a failed fsync may have
// dropped dirty pages), so every later and every pending wait_durable() returns the same error and
// failed() turns true; the owner must refuse further writes and the daemon be restarted.
//
// Ownership: the owner of the log (RocksDbStore) owns the committer; the sync function is called
// from the waiting threads, never from a thread of its own, and must be callable while other
// threads append to the log (RocksDB's SyncWAL is).
// Thread-safety: every method may be called from any thread at once. One internal mutex, a leaf
// lock: it is not held while the sync function runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

#include "common/base/status.h"

namespace penstock::meta {

class GroupCommitter {
 public:
  using SyncFn = std::function<Status()>;

  // `sync` makes everything appended to the log so far durable (e.g. RocksDB's SyncWAL).
  explicit GroupCommitter(SyncFn sync);

  GroupCommitter(const GroupCommitter&) = delete;
  GroupCommitter& operator=(const GroupCommitter&) = delete;

  // Call after a write was appended to the log (not before: a sync that starts after this returns
  // must include the write). Returns the write's ticket for wait_durable().
  uint64_t note_applied();

  // The ticket of the latest write noted so far (0 when none).
  uint64_t last_applied() const { return applied_.load(std::memory_order_acquire); }

  // Returns ok once a sync covering `ticket` (and every ticket before it) has completed, running
  // the sync itself when no other thread is. Returns at once when it already has. The sticky
  // error after a failed sync (see above).
  Status wait_durable(uint64_t ticket);

  // wait_durable(last_applied()): every write noted before this call is durable on ok.
  Status sync_all() { return wait_durable(last_applied()); }

  // True after a failed sync.
  bool failed() const;
  // Completed syncs (tests and stats check the coalescing).
  uint64_t syncs() const;
  // The highest ticket known to be durable.
  uint64_t durable() const;
  // Threads blocked in wait_durable() behind a running sync (tests use it to line up followers).
  uint64_t followers() const;

 private:
  SyncFn sync_;
  std::atomic<uint64_t> applied_{0};

  mutable std::mutex mu_;  // leaf lock, guards the fields below
  std::condition_variable cv_;
  bool syncing_ = false;
  uint64_t durable_ = 0;
  uint64_t syncs_ = 0;
  uint64_t followers_ = 0;
  Status error_;  // sticky, set by a failed sync
};

}  // namespace penstock::meta
