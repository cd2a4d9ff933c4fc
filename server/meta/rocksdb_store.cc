#include "server/meta/rocksdb_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

namespace penstock::meta {

namespace {

rocksdb::Slice slice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }

Status from_rocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::ok();
  Code code = Code::kIo;
  if (s.IsCorruption()) code = Code::kCorrupt;
  if (s.IsNoSpace()) code = Code::kNoSpace;
  return Status(code, what + ": " + s.ToString());
}

}  // namespace

RocksDbStore::RocksDbStore(std::string dir, std::unique_ptr<rocksdb::DB> db, RocksDbOptions options)
    : dir_(std::move(dir)), db_(std::move(db)), options_(options) {}

RocksDbStore::~RocksDbStore() {
  if (db_) {
    rocksdb::Status s = db_->Close();
    (void)s;  // nothing to do on a close error: every write was already synced
  }
}

Result<std::unique_ptr<RocksDbStore>> RocksDbStore::open(const std::string& dir, RocksDbOptions options) {
  rocksdb::Options opts;
  opts.create_if_missing = true;
  opts.paranoid_checks = true;
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
    Code code = s.IsCorruption() ? Code::kCorrupt : Code::kIo;
    return Status(code, "cannot open the metadata database in " + dir + ": " + text +
                            "; check that the directory exists and is writable, or pick another --db");
  }
  return std::unique_ptr<RocksDbStore>(new RocksDbStore(dir, std::unique_ptr<rocksdb::DB>(raw), options));
}

Result<std::optional<std::string>> RocksDbStore::get(std::string_view key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), slice(key), &value);
  if (s.IsNotFound()) return std::optional<std::string>();
  if (!s.ok()) return from_rocks(s, "read from " + dir_);
  return std::optional<std::string>(std::move(value));
}

Status RocksDbStore::write(const WriteBatch& batch) {
  rocksdb::WriteBatch wb;
  for (const auto& op : batch.ops()) {
    rocksdb::Status s = op.is_delete ? wb.Delete(slice(op.key)) : wb.Put(slice(op.key), slice(op.value));
    if (!s.ok()) return from_rocks(s, "build write batch");
  }
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync;
  return from_rocks(db_->Write(wo, &wb), "write to " + dir_);
}

Status RocksDbStore::scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) {
  rocksdb::ReadOptions ro;
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
