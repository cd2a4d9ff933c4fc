#include "server/meta/rocksdb_store.h"

#include <cstdarg>
#include <cstdio>

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>

#include "common/base/log.h"

namespace penstock::meta {

namespace {

rocksdb::Slice slice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

// Our code for a failed RocksDB status.
Code code_of(const rocksdb::Status& s) {
  if (s.IsCorruption()) return Code::kCorrupt;
  if (s.IsNoSpace()) return Code::kNoSpace;
  return Code::kIo;
}

Status from_rocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::ok();
  return Status(code_of(s), what + ": " + s.ToString());
}

// The smallest key greater than every key starting with `prefix`; empty when there is none.
std::string prefix_successor(std::string_view prefix) {
  std::string s(prefix);
  while (!s.empty()) {
    auto& c = reinterpret_cast<unsigned char&>(s.back());
    if (c != 0xff) {
      ++c;
      return s;
    }
    s.pop_back();
  }
  return s;
}

// RocksDB's own messages, into penstock-meta's log: warnings and errors as such, the rest (the
// options at open, flushes, compactions) at debug level. Not a LOG file in the database
// directory: on a full disk that file's writer fails, and RocksDB's next message, the one about
// the full disk, trips an assertion in it (Debian's librocksdb keeps assertions): the daemon
// would abort instead of refusing writes with ENOSPC.
class RocksLogger final : public rocksdb::Logger {
 public:
  explicit RocksLogger(rocksdb::InfoLogLevel level) : rocksdb::Logger(level) {}

  void Logv(const char* format, va_list ap) override { Logv(rocksdb::InfoLogLevel::INFO_LEVEL, format, ap); }
  void Logv(const rocksdb::InfoLogLevel level, const char* format, va_list ap) override {
    const LogLevel ours = level >= rocksdb::InfoLogLevel::ERROR_LEVEL && level != rocksdb::InfoLogLevel::HEADER_LEVEL
                              ? LogLevel::kError
                          : level == rocksdb::InfoLogLevel::WARN_LEVEL ? LogLevel::kWarn
                                                                       : LogLevel::kDebug;
    if (ours < log_level()) return;
    char text[2048];
    const int n = std::vsnprintf(text, sizeof text, format, ap);
    if (n > 0 && static_cast<size_t>(n) < sizeof text && text[n - 1] == '\n') text[n - 1] = '\0';
    detail::LogLine(ours, __FILE__, __LINE__).stream() << "rocksdb: " << text;
  }
};

// Turns off RocksDB's own recovery from a background error (its SstFileManager resumes the
// database once space is free): a resume would write the memtable, with batches whose callers
// were told the log failed, and the WAL writer again. After a failure the store stays refusing
// until penstock-meta opens the database anew (docs/meta-store.md, "A full disk").
class NoAutoRecovery final : public rocksdb::EventListener {
 public:
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason /*reason*/, rocksdb::Status bg_error,
                            bool* auto_recovery) override {
    bg_error.PermitUncheckedError();
    *auto_recovery = false;
  }
};

}  // namespace

RocksDbStore::RocksDbStore(std::string dir, std::unique_ptr<rocksdb::DB> db, RocksDbOptions options,
                           std::shared_ptr<rocksdb::Cache> block_cache)
    : dir_(std::move(dir)),
      db_(std::move(db)),
      block_cache_(std::move(block_cache)),
      options_(options),
      committer_([this] { return flush_wal(/*sync=*/true); }),
      soon_([this] { sync_soon_loop(); }) {}

RocksDbStore::~RocksDbStore() {
  {
    std::lock_guard<std::mutex> lock(soon_mu_);
    soon_stop_ = true;
  }
  soon_cv_.notify_all();
  soon_.join();
  if (db_) {
    // Batches applied but not yet synced (their callers were not answered, or were told only
    // "visible": sync_soon) are kept too.
    (void)flush_wal(/*sync=*/options_.sync);  // nothing after a failed one
    rocksdb::Status s = db_->Close();
    (void)s;  // nothing to do on a close error: every write acknowledged as durable was synced
  }
}

Result<std::unique_ptr<RocksDbStore>> RocksDbStore::open(const std::string& dir, RocksDbOptions options) {
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.paranoid_checks = true;
  // Point lookups (inode, dentry, open records) dominate: a bloom filter per SST skips files that
  // cannot hold the key, and index/filter blocks live in a bounded block cache.
  // Both are partitioned into 4 KiB blocks under a small pinned top level. A whole filter block
  // is 10 bits per key: past about 1.6M keys in one SST (800k files) it outgrew the 2 MiB shard
  // of the LRU cache (128 MiB / 64 shards), was dropped after every use and read again, 2.5 MB
  // per Get, and creates fell from 8k/s to 3.5k/s (docs/performance.md, round 16).
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  std::shared_ptr<rocksdb::Cache> block_cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  table.block_cache = block_cache;
  table.index_type = rocksdb::BlockBasedTableOptions::kTwoLevelIndexSearch;
  table.partition_filters = true;
  table.metadata_block_size = 4096;
  table.cache_index_and_filter_blocks = true;
  table.cache_index_and_filter_blocks_with_high_priority = true;
  table.pin_top_level_index_and_filter = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  opts.max_background_jobs = 2;
  // Most gets of a create miss (the new name, its inode): a whole-key bloom filter over the
  // memtable answers those without searching the skip list.
  opts.memtable_whole_key_filtering = true;
  opts.memtable_prefix_bloom_size_ratio = 0.05;
  // RocksDB's messages go to penstock-meta's log (RocksLogger), not to a LOG file in the database
  // directory. Debian's librocksdb logs at DEBUG by default: a formatted line per FlushWAL, that is
  // per group commit, in the commit's path; INFO keeps flushes, compactions and errors.
  opts.info_log_level = rocksdb::InfoLogLevel::INFO_LEVEL;
  opts.info_log = std::make_shared<RocksLogger>(opts.info_log_level);
  // The WAL is written to the OS only when sync() flushes it (FlushWAL(true) by the group's
  // leader) or sync_soon() hands it over (FlushWAL(false)): one write+fdatasync per group instead
  // of a write() per batch under the namespace mutex. Other applied-but-unsynced batches (opens,
  // releases) may then be lost on kill -9, which is fine: docs/meta-store.md "Durability".
  opts.manual_wal_flush = true;
  opts.listeners.push_back(std::make_shared<NoAutoRecovery>());
  // Nor resumes after a retryable I/O error (that path does not ask the listener).
  opts.max_bgerror_resume_count = 0;
  if (options.write_buffer_bytes > 0) opts.write_buffer_size = options.write_buffer_bytes;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(opts, dir, &raw);
  if (!s.ok()) {
    std::string text = s.ToString();
    if (s.IsIOError() && text.find("lock") != std::string::npos) {
      return Status(Code::kBusy, "cannot open the metadata database in " + dir +
                                     ": another penstock-meta holds the lock on " + dir +
                                     "? stop it or pick another --db (" + text + ")");
    }
    if (text.find("ermission denied") != std::string::npos) {
      return Status(Code::kPermission, "cannot open the metadata database in " + dir + ": " + text +
                                           "; fix the directory's owner or mode, or pick another --db");
    }
    return Status(code_of(s), "cannot open the metadata database in " + dir + ": " + text +
                            "; check that the directory exists and is writable, or pick another --db");
  }
  return std::unique_ptr<RocksDbStore>(
      new RocksDbStore(dir, std::unique_ptr<rocksdb::DB>(raw), options, std::move(block_cache)));
}

namespace {

Result<std::optional<std::string>> read_key(rocksdb::DB* db, const rocksdb::ReadOptions& ro, std::string_view key,
                                            const std::string& dir) {
  std::string value;
  rocksdb::Status s = db->Get(ro, slice(key), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return from_rocks(s, "read from " + dir);
  return std::optional<std::string>(std::move(value));
}

}  // namespace

Result<std::optional<std::string>> RocksDbStore::get(std::string_view key) {
  return read_key(db_.get(), rocksdb::ReadOptions(), key, dir_);
}

Result<std::optional<std::string>> RocksDbStore::peek(std::string_view key) {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;  // blocks read for this stay out of the block cache
  return read_key(db_.get(), ro, key, dir_);
}

Status RocksDbStore::flush_wal(bool sync) {
  {
    std::lock_guard<std::mutex> lock(wal_mu_);
    if (!wal_error_.is_ok()) return wal_error_;
    const Status written = from_rocks(db_->FlushWAL(/*sync=*/false), "write the write-ahead log in " + dir_);
    if (!written.is_ok()) return keep_wal_error_locked(written);
  }
  if (!sync) return Status::ok();
  // FlushWAL(true) is FlushWAL(false) + SyncWAL(): the fdatasync runs outside wal_mu_, so
  // mutations apply meanwhile (group commit) instead of waiting behind it.
  const Status synced = from_rocks(db_->SyncWAL(), "sync the write-ahead log in " + dir_);
  if (!synced.is_ok()) {
    std::lock_guard<std::mutex> lock(wal_mu_);
    return keep_wal_error_locked(synced);
  }
  return synced;
}

Status RocksDbStore::wal_error() const {
  std::lock_guard<std::mutex> lock(wal_mu_);
  return wal_error_;
}

Status RocksDbStore::keep_wal_error_locked(const Status& failure) {
  if (wal_error_.is_ok()) {
    wal_error_ = failure.with_context(
        failure.code() == Code::kNoSpace
            ? "what reached the disk after it is unknown, so nothing more is written until the database is opened "
              "again; penstock-meta does that itself once the disk has room (make room on it)"
            : "what reached the disk after it is unknown, so nothing more is written: fix the disk and restart "
              "penstock-meta");
    PENSTOCK_LOG(Error) << wal_error_.to_string();
  }
  return wal_error_;
}

Status RocksDbStore::apply(const WriteBatch& batch) {
  rocksdb::WriteBatch wb;
  for (const auto& op : batch.ops()) {
    rocksdb::Status s = op.is_delete ? wb.Delete(slice(op.key)) : wb.Put(slice(op.key), slice(op.value));
    if (!s.ok()) return from_rocks(s, "build write batch");
  }
  // Not synced here: sync() does that for a whole group of batches (group commit).
  rocksdb::WriteOptions wo;
  wo.sync = false;
  // Under wal_mu_, with the check: a Write appends to the WAL writer, which asserts when an
  // earlier write of it failed (a FlushWAL's, or a Write's own when its buffer was full and written
  // out). A failed Write is kept like a failed FlushWAL. The code stays the failure's (kNoSpace
  // on a full disk: the application sees ENOSPC).
  std::lock_guard<std::mutex> lock(wal_mu_);
  if (!wal_error_.is_ok()) {
    return Status(wal_error_.code(), "write to " + dir_ + " refused: " + wal_error_.message());
  }
  const Status written = from_rocks(db_->Write(wo, &wb), "write to " + dir_);
  if (!written.is_ok()) return keep_wal_error_locked(written);
  committer_.note_applied();
  return Status::ok();
}

Status RocksDbStore::sync() {
  if (!options_.sync) {
    // Still hand the WAL to the OS, so that a process kill loses nothing acknowledged.
    return flush_wal(/*sync=*/false);
  }
  return committer_.sync_all();
}

Status RocksDbStore::sync_soon() {
  // The WAL buffer (manual_wal_flush) to the file now, one write(): a kill of the process keeps it.
  const Status handed = flush_wal(/*sync=*/false);
  if (!handed.is_ok()) return handed;  // kept: no delayed sync either
  {
    std::lock_guard<std::mutex> lock(soon_mu_);
    if (!soon_asked_) {  // else the syncer's next run covers this caller's batch too
      soon_asked_ = true;
      soon_cv_.notify_all();
    }
  }
  return handed;
}

void RocksDbStore::sync_soon_loop() {
  std::unique_lock<std::mutex> lock(soon_mu_);
  for (;;) {
    soon_cv_.wait(lock, [this] { return soon_asked_ || soon_stop_; });
    if (!soon_asked_) return;  // stopping, nothing asked (the destructor flushes the WAL anyway)
    // Wait out the delay (cut short by a close), so that the batches of this interval share one
    // sync; then sync everything applied so far.
    soon_cv_.wait_for(lock, options_.sync_soon_delay, [this] { return soon_stop_; });
    soon_asked_ = false;
    lock.unlock();
    Status st = sync();
    if (!st.is_ok()) {
      PENSTOCK_LOG(Error) << "delayed sync of " << dir_ << " failed: " << st.to_string();
    }
    lock.lock();
  }
}

uint64_t RocksDbStore::drop_caches() {
  const size_t before = block_cache_->GetUsage();
  block_cache_->EraseUnRefEntries();
  const size_t after = block_cache_->GetUsage();
  return before > after ? before - after : 0;
}

Status RocksDbStore::scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) {
  // The upper bound stops the iterator at the end of the prefix. Without it a scan whose prefix
  // has no live key left walks over every tombstone after it (deleted open records, dentries)
  // to the next live key, which made unlink O(deleted keys).
  rocksdb::ReadOptions ro;
  std::string upper = prefix_successor(prefix);
  rocksdb::Slice upper_slice(upper);
  if (!upper.empty()) ro.iterate_upper_bound = &upper_slice;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro));
  it->Seek(slice(seek < prefix ? prefix : seek));
  for (; it->Valid(); it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    if (key.substr(0, prefix.size()) != prefix) break;
    if (!fn(key, std::string_view(it->value().data(), it->value().size()))) return Status::ok();
  }
  return from_rocks(it->status(), "scan " + dir_);
}

}  // namespace penstock::meta
