// LocalHandles: which files this host has open, and which it may be changing, so that a mount can
// put bytes it fetched into the kernel's page cache (penstock-mount fills a small file's pages at
// open) without ever writing over newer bytes a local writer or truncate put there, and without
// ever waiting for one of its own replies while it does.
//
// Why writers matter: the kernel copies a write() into its page cache before it sends the WRITE,
// and truncates its pages after the SETATTR reply, while a fill of the same pages can be on its way
// with bytes of the version the meta server had a moment earlier. So a fill runs only when no
// writer of the file is active on this host and none began or ended since the filler asked the meta
// server for the version it fills (the epoch it took before that call), and it runs under the
// file's shard lock, which begin() also takes: a writer that starts later waits until the fill is
// in the pages, then writes over it. Writers on other hosts are the generation check's job
// (close-to-open): the filler only fills bytes of the generation its open returned.
//
// Why readers matter: storing into a page waits for its lock, and the kernel holds a page locked
// while a READ of it is pending at the mount. With no handle of the file open (readers count, and
// the kernel sends an async READ's RELEASE only after its reply) no READ of it can be pending, so
// a fill only ever waits for memory copies, never for a FUSE thread, and holding the lock is safe.
//
// Epochs are per shard of inodes (64) and move only with writers, so a bounded table serves any
// number of files: a writer of another inode of the same shard only costs a fill that is skipped,
// never a wrong one.
//
// Thread-safety: every method may be called from any thread. The shard mutexes are leaves, except
// that a fill callback runs under one (it must not call back into this object).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>

#include "common/base/ids.h"

namespace penstock::client {

class LocalHandles {
 public:
  // kWriter: a handle opened for writing or with O_TRUNC (until its release), or a truncate (until
  // its reply has been sent). kReader: any other open handle.
  enum class Kind { kReader, kWriter };

  // A handle or truncate of `ino` begins. Call it before the kernel can use it: before the reply.
  void begin(InodeId ino, Kind kind);
  // It ends. REQUIRES: a matching begin(ino, kind).
  void end(InodeId ino, Kind kind);
  // The current epoch of `ino`: take it before the meta call that names the version to fill.
  uint64_t epoch(InodeId ino) const;
  // Runs fill() under the inode's shard lock when no handle of `ino` is open and no writer of its
  // shard began or ended since `epoch` was taken; returns whether fill() ran.
  bool run_if_quiet(InodeId ino, uint64_t epoch, const std::function<void()>& fill);
  // Handles (and truncates) of `ino` now, of either kind (tests and logs).
  int open_count(InodeId ino) const;

 private:
  static constexpr size_t kShards = 64;
  struct Counts {
    int readers = 0;
    int writers = 0;
  };
  struct Shard {
    mutable std::mutex mu;  // leaf lock (see the header comment)
    uint64_t epoch = 0;     // bumped by every writer's begin() and end() in this shard; guarded by mu
    std::unordered_map<InodeId, Counts> open;  // no all-zero entries; guarded by mu
  };
  Shard& shard(InodeId ino) { return shards_[ino.value % kShards]; }
  const Shard& shard(InodeId ino) const { return shards_[ino.value % kShards]; }

  std::array<Shard, kShards> shards_;
};

}  // namespace penstock::client
