// RocksDbStore: the durable Store of penstock-meta, one RocksDB database in a directory.
// Every write() is a RocksDB WriteBatch written with WriteOptions.sync = true, so an acknowledged
// mutation survives kill -9 and power loss (the WAL is fsynced before write() returns).
// RocksDB holds a LOCK file in the directory: a second process opening the same directory fails
// with a message that says so.
// Ownership: the caller owns the store; destroying it closes the database.
// Thread-safety: all methods are thread-safe (RocksDB's own guarantees).
#pragma once

#include <memory>
#include <string>

#include "server/meta/store.h"

namespace rocksdb {
class DB;
}

namespace penstock::meta {

struct RocksDbOptions {
  // fsync the WAL on every write. Only tests that need speed over durability turn this off.
  bool sync = true;
};

class RocksDbStore final : public Store {
 public:
  // Opens (creating if missing) the database in `dir`. kBusy when another process holds its lock,
  // kIo / kPermission / kCorrupt otherwise; each message names the directory and what to do.
  static Result<std::unique_ptr<RocksDbStore>> open(const std::string& dir, RocksDbOptions options = {});
  ~RocksDbStore() override;

  Result<std::optional<std::string>> get(std::string_view key) override;
  Status write(const WriteBatch& batch) override;
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override;
  std::string describe() const override { return "rocksdb " + dir_; }

 private:
  RocksDbStore(std::string dir, std::unique_ptr<rocksdb::DB> db, RocksDbOptions options);

  std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
  RocksDbOptions options_;
};

}  // namespace penstock::meta
