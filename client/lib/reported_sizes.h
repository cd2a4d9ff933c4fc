// ReportedSizes: what this mount's last size reports (close, fsync) left at the meta server, kept
// for a while so that a reply the server made before a report was applied cannot take the
// reported size back.
//
// Why: Client merges its own unreported write offset into the size of every reply (merge_local_size)
// and forgets that offset once a size report returned. A GETATTR the server answered just before
// the report was applied, but merged here after the report returned, would carry the old, smaller
// size; the kernel takes it (its attribute version only guards against replies older than its own
// writes), and an O_APPEND writer on another descriptor of this mount would then write at the old
// end for up to the attribute timeout.
//
// How: every size report bumps the inode's generation at the meta server and its reply carries the
// attributes after it. A later reply whose generation is lower was made before the report, so
// merge() raises its size and mtime to the reported ones; a reply at the same or a higher
// generation (the report itself, a truncate after it) is left as it is. An entry is kept for
// `keep` (past every call's deadline: no reply to a call sent before the report arrives later) and
// at most `max_entries` entries are kept (the oldest go first).
//
// Thread-safety: none; Client guards it with its files_mu_.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>

#include "common/base/ids.h"
#include "common/proto/types.h"

namespace penstock::client {

class ReportedSizes {
 public:
  using Clock = std::chrono::steady_clock;

  ReportedSizes(Clock::duration keep, size_t max_entries) : keep_(keep), max_entries_(max_entries) {}

  // A size report of a regular file returned with `after`, the file's attributes once it applied.
  void note(const proto::InodeAttr& after, Clock::time_point now = Clock::now());

  // Raises `attr`'s size and mtime to a report that `attr` predates (see above); else nothing.
  void merge(proto::InodeAttr* attr) const;

  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    uint64_t generation = 0;
    uint64_t size = 0;
    int64_t mtime_ns = 0;
    Clock::time_point at;
  };
  void drop_expired(Clock::time_point now);
  void drop_oldest();  // REQUIRES: order_ not empty

  const Clock::duration keep_;
  const size_t max_entries_;
  std::unordered_map<InodeId, Entry> entries_;
  std::deque<std::pair<Clock::time_point, InodeId>> order_;  // by note time; may name replaced entries
};

}  // namespace penstock::client
