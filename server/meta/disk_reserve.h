// DiskReserve: penstock-meta's way out of a full disk without a person restarting it
// (docs/meta-store.md, "A full disk").
//
// Why: after a failed write of the write-ahead log the database's state on disk is unknown, so the
// store refuses every change until it is opened again (RocksDbStore::wal_error). A reopen replays
// the log and writes what it holds to a table file, so it needs about the log's size in free space.
// On a disk that filled up, even the deletes that would make room are changes, and are refused.
//
// So the database directory holds a ballast file (`kBallastName`, `bytes` long, allocated with
// fallocate) while there is room for it. After the disk filled:
// - release() removes the ballast, and its space is the reopen's;
// - ready_to_reopen() says whether the disk now has room for a reopen: the live log files
//   (`*.log`), the live manifest (the open writes it anew) and `kReopenMargin` more, and a few
//   free inodes (ENOSPC may also mean none are left).
// A reopened service recreates the ballast (ensure()) once twice its size is free again.
//
// The free space is daemon::disk_space's (f_bavail, also for root). Thread-safety: one thread at a time (penstock-meta's
// start and its disk watch).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/base/result.h"
#include "server/daemon/daemon.h"

namespace penstock::meta {

struct DiskReserveOptions {
  std::string dir;     // the database directory
  uint64_t bytes = 0;  // the ballast's size; 0: no ballast
  std::function<Result<daemon::DiskSpace>(const std::string&)> space = daemon::disk_space;  // injectable for tests
};

class DiskReserve {
 public:
  static constexpr const char* kBallastName = "PENSTOCK-BALLAST";
  // Free space a reopen needs beyond the live log files (the manifest, a new log, the options file).
  static constexpr uint64_t kReopenMargin = uint64_t{1} << 20;
  // Files a reopen makes: a log, a manifest, a table, the options file, CURRENT's temporary.
  static constexpr uint64_t kReopenInodes = 16;
  // The default ballast: 256 MiB, or 5 % of the file system when that is less.
  static uint64_t default_bytes(uint64_t fs_total);

  explicit DiskReserve(DiskReserveOptions options);

  std::string ballast_path() const { return options_.dir + "/" + kBallastName; }
  uint64_t bytes() const { return options_.bytes; }
  // Whether the ballast file is there (whatever its size).
  bool held() const;

  // Creates the ballast when it is missing and at least twice its size is free; one of another
  // size (or any, when `bytes` is 0) is removed first, and so is a leftover of a crash while making
  // one. Ok also when it is not made for lack of room (*made false); an error names the file.
  Status ensure(bool* made);
  // Removes the ballast (and a leftover of making one); the bytes that freed (0 when none).
  uint64_t release();

  // Bytes a reopen of the database needs free: the live logs, the live manifest, kReopenMargin.
  uint64_t reopen_bytes() const;
  // Whether the disk has room for a reopen (reopen_bytes(), and kReopenInodes free inodes).
  // `*need` and `*free` say how much (for the log line). An error when the space is unknown.
  Result<bool> ready_to_reopen(uint64_t* need, uint64_t* free) const;

 private:
  DiskReserveOptions options_;
};

}  // namespace penstock::meta
