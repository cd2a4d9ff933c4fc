// RocksDbStore: the durable Store of penstock-meta, one RocksDB database in a directory.
// apply() is a RocksDB WriteBatch written to the WAL without sync (visible at once); sync() is
// group commit over DB::FlushWAL(true) (server/meta/group_commit.h; the WAL is written with
// manual_wal_flush, so the leader writes and fdatasyncs it): one fsync of the WAL covers every
// batch applied before it started, whichever thread runs it. So a mutation acknowledged after
// sync() survives kill -9 and power loss, and N concurrent mutations cost about one fsync.
// RocksDB holds a LOCK file in the directory: a second process opening the same directory fails
// with a message that says so.
// Ownership: the caller owns the store; destroying it closes the database.
// Thread-safety: all methods are thread-safe (RocksDB's own guarantees).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "server/meta/group_commit.h"
#include "server/meta/store.h"

namespace rocksdb {
class Cache;
class DB;
}

namespace penstock::meta {

struct RocksDbOptions {
  // fsync the WAL in sync(). Only tests that need speed over durability turn this off (sync()
  // then returns at once; the WAL still reaches the OS on every apply, so a process kill loses
  // nothing, a power loss may).
  bool sync = true;
  // RocksDB block cache (data, index and bloom filter blocks), bytes.
  size_t block_cache_bytes = size_t{128} << 20;
  // sync_soon(): how long a batch may stay unsynced after it was asked for (penstock-meta
  // --close-sync-ms). Fixed at open.
  std::chrono::milliseconds sync_soon_delay{50};
  // RocksDB's memtable (write buffer) size, bytes; 0 keeps RocksDB's default (64 MiB). The live
  // write-ahead log stays about this size: a reopen after a full disk needs that much room.
  size_t write_buffer_bytes = 0;
};

class RocksDbStore final : public Store {
 public:
  // Opens (creating if missing) the database in `dir`. kBusy when another process holds its lock,
  // kIo / kPermission / kCorrupt otherwise; each message names the directory and what to do.
  static Result<std::unique_ptr<RocksDbStore>> open(const std::string& dir, RocksDbOptions options = {});
  ~RocksDbStore() override;

  Result<std::optional<std::string>> get(std::string_view key) override;
  Result<std::optional<std::string>> peek(std::string_view key) override;
  Status apply(const WriteBatch& batch) override;
  Status sync() override;
  // One thread of the store runs sync() options.sync_soon_delay after the first request since its
  // last run (a sync covers every batch applied before it starts, so requests meanwhile share it).
  Status sync_soon() override;
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override;
  std::string describe() const override { return "rocksdb " + dir_; }
  // Empties the block cache of every block no reader holds.
  uint64_t drop_caches() override;
  uint64_t applied_ticket() const override { return committer_.last_applied(); }
  // With options.sync off a sync only hands the WAL to the kernel: nothing is known covered.
  bool covered_by_sync(uint64_t ticket) const override { return options_.sync && committer_.durable() >= ticket; }

  // The first failed WAL write or sync, kept (ok while there is none): from then on every change
  // is refused until the database is opened again (penstock-meta does that after a full disk).
  Status wal_error() const;

  // WAL syncs done so far (each covers one group of applied batches).
  uint64_t wal_syncs() const { return committer_.syncs(); }

 private:
  RocksDbStore(std::string dir, std::unique_ptr<rocksdb::DB> db, RocksDbOptions options,
               std::shared_ptr<rocksdb::Cache> block_cache);

  void sync_soon_loop();
  // db_->FlushWAL(false) under wal_mu_, then with `sync` SyncWAL() outside it; never again after
  // a WAL write or sync failed: RocksDB's WAL writer asserts when it is appended to after an error
  // (Debian's librocksdb keeps assertions, so the daemon would abort on a full disk). The first
  // failure is kept and returned from then on.
  Status flush_wal(bool sync);
  // Keeps `failure` as the WAL's (the first one only) and returns the kept one. REQUIRES wal_mu_.
  Status keep_wal_error_locked(const Status& failure);

  std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
  std::shared_ptr<rocksdb::Cache> block_cache_;
  RocksDbOptions options_;
  GroupCommitter committer_;

  // A leaf lock (after MetaService's mutex): held across every Write and every FlushWAL(false),
  // never across an fdatasync.
  mutable std::mutex wal_mu_;
  Status wal_error_;           // guarded by wal_mu_: the first failed FlushWAL, kept

  std::mutex soon_mu_;  // leaf lock; guards the two flags below
  std::condition_variable soon_cv_;
  bool soon_asked_ = false;  // a sync_soon() since the last run of the syncer
  bool soon_stop_ = false;   // the store is closing: the syncer runs what was asked, then ends
  std::thread soon_;         // started with the store, joined before the database closes
};

}  // namespace penstock::meta
