// OpenTable: which sessions have which inodes open, held in memory by penstock-meta, and which of
// those opens the store must hold too (docs/meta-store.md, "Open records").
//
// Why: every file read opens and closes its file, and a training job reads thousands of small
// files a second. Writing each open and close to the store (two keys each way, a WAL append and
// four memtable inserts per file) cost a quarter of penstock-meta's CPU in a small-file read, yet
// an open matters to the store only when its file is unlinked while it is open: the last close of
// such an orphan is what frees its chunks, so its open must survive a crash as long as the unlink
// does.
//
// So an open lives here, and reaches the store (`o/` and `p/` keys, the format of earlier
// releases) in three cases:
//   - store_inode(): the change that unlinks a file's last name carries the records of every open
//     of it in its own batch, so a crash keeps both or neither;
//   - an open of a file that is already an orphan is written at once (the caller syncs it);
//   - flush_aged(): an open that is still held `delay` after it changed is written, so a
//     long-lived open also survives a crash of penstock-meta. An open and close within the delay
//     never touch the store.
// A crash therefore forgets only opens not written yet whose file was not unlinked since; the
// mounts send those again after the restart (MetaService::reclaim_opens, docs/meta-store.md).
//
// Thread-safety: none; MetaService calls it under its mu_.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/base/ids.h"
#include "server/meta/store.h"

namespace penstock::meta {

class OpenTable {
 public:
  // `n` opens more of `ino` by `session`; `now_ns` starts its delay. Returns the session's count.
  uint32_t add(SessionId session, InodeId ino, int64_t now_ns, uint32_t n = 1);
  // The opens `session` holds of `ino`.
  uint32_t count(SessionId session, InodeId ino) const;
  // Up to `times` opens fewer; returns the count left (0 when none, also when there was none).
  uint32_t drop(SessionId session, InodeId ino, uint32_t times, int64_t now_ns);
  // True when a session other than `except` has `ino` open.
  bool has_other(InodeId ino, SessionId except) const;
  // The inodes `session` has open (each once).
  std::vector<InodeId> inodes_of(SessionId session) const;
  // Forgets every open of `session`, deleting the records the store holds in `batch`.
  void drop_session(SessionId session, WriteBatch* batch);
  // An open found in the store at start: already stored.
  void load(SessionId session, InodeId ino, uint32_t count);
  // Writes into `batch` every open of `ino` that the store does not hold as it is now.
  void store_inode(InodeId ino, WriteBatch* batch);
  // Writes into `batch` every open that has differed from the store for at least `delay_ns` (or
  // changed "after" `now_ns`: the clock stepped back). Returns whether it wrote anything.
  bool flush_aged(int64_t now_ns, int64_t delay_ns, WriteBatch* batch);
  // What the methods above wrote into a batch counts as stored only once the caller applied the
  // batch: written_applied() after it succeeded, written_dropped() when it failed or was never
  // applied (those opens are written again by the next flush_aged).
  void written_applied();
  void written_dropped();
  // Opens held (sessions × inodes with a count above zero); counts every entry.
  size_t size() const;

 private:
  struct Key {
    uint64_t session = 0;
    uint64_t ino = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const noexcept { return std::hash<uint64_t>()(k.session * 0x9e3779b97f4a7c15ULL ^ k.ino); }
  };
  struct Entry {
    uint32_t count = 0;   // opens held now
    uint32_t stored = 0;  // the count the store holds (0: no record)
  };

  // The entry of `k`, made (and indexed) if there is none.
  Entry& entry(const Key& k);
  // Marks `k` changed at `now_ns` (queued for flush_aged once it differs from the store).
  void touch(const Key& k, const Entry& e, int64_t now_ns);
  // Writes `k` as it is now into `batch` (pending until written_applied()).
  void write(const Key& k, const Entry& e, WriteBatch* batch);
  void erase(const Key& k);

  std::unordered_map<Key, Entry, KeyHash> entries_;
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> by_inode_;    // ino -> sessions
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> by_session_;  // session -> inos
  // Entries that changed, oldest first; an entry may be here more than once, or be clean again.
  std::deque<std::pair<Key, int64_t>> changed_;
  std::vector<std::pair<Key, uint32_t>> written_;  // written into a batch not applied yet: the count
};

}  // namespace penstock::meta
