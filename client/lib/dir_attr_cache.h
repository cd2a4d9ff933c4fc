// DirAttrCache: the attributes of directories as this mount last heard them from the meta server,
// so that the kernel's GETATTR of a directory can be answered without a round trip.
//
// Why: after every create in a directory the kernel drops that directory's cached attributes, and
// the permission check of the next path walk through it (default_permissions) asks for them
// again. With several processes creating in one directory that is a GETATTR per permission check,
// each a meta RPC, while the answer is known: the meta server sends the parent's new attributes
// with every create, mkdir, mknod, symlink, link and unlink, and every directory an rmdir or
// rename changed (its reply also names a directory it removed, which is forgotten).
//
// Freshness: an entry remembers when the request that brought it was sent; get() serves it only
// while that is less than `max_age` ago and says how much of max_age is left, which the caller
// gives the kernel as its attribute timeout. So a directory's attributes are never older than the
// attribute timeout, the same promise the kernel's own attribute cache makes.
//
// Own changes: the newest attributes win (by ctime, which the meta server sets from its clock on
// every change under its namespace lock; a clock stepped back could let an older reply win for
// up to max_age), so a reply that raced this mount's own create cannot replace the attributes
// that include it. A change whose reply carries no new attributes (xattrs, a layout), or
// whose reply was lost, invalidates: afterwards only replies to requests sent after it are taken.
//
// Thread-safety: every method from any thread (one mutex).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "common/proto/types.h"

namespace penstock::client {

class DirAttrCache {
 public:
  using Clock = std::chrono::steady_clock;

  DirAttrCache(Clock::duration max_age, size_t max_entries) : max_age_(max_age), max_entries_(max_entries) {}

  // Taken just before sending a request whose reply may be offered.
  struct Ticket {
    uint64_t generation = 0;
    Clock::time_point sent;
  };
  Ticket ticket() const;

  // A directory's attributes from a reply to a request sent at `t`. Ignored for anything but a
  // directory, when an invalidation happened since `t`, or when what is cached is newer.
  void offer(const Ticket& t, const proto::InodeAttr& attr);
  // This mount changed `dir` in a way whose reply did not carry its new attributes.
  void invalidate(InodeId dir);
  // As invalidate, for every directory: a change that failed without saying which directories it
  // reached, if any (a lost reply; a failed rmdir or rename).
  void invalidate_all();

  struct Hit {
    proto::InodeAttr attr;
    double left_s = 0;  // of max_age
  };
  std::optional<Hit> get(InodeId dir) const;

  size_t size() const;

 private:
  struct Entry {
    proto::InodeAttr attr;
    Clock::time_point sent;
  };

  const Clock::duration max_age_;
  const size_t max_entries_;
  mutable std::mutex mu_;
  uint64_t generation_ = 0;  // guarded by mu_; bumped by every invalidation
  std::unordered_map<uint64_t, Entry> entries_;  // guarded by mu_
};

}  // namespace penstock::client
