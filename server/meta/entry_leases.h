// EntryLeases: the meta server's promises that a name stays bound to the same directory for a
// short while, so that a mount's kernel may walk through that directory's dentry without asking
// again (docs/architecture.md, "Directory entry leases").
//
// A lookup that finds a directory grants the asking session a lease on (parent, name) for `term`.
// rmdir and rename, before they change a binding, stop new grants on the names they change and
// wait until every lease that another session holds on them has run out; the requesting mount's
// kernel updates its own dentry as part of the operation. Nothing is sent to the holders, so a
// change of a directory that other mounts use waits at most `term` plus a grace period.
//
// Lookups race changes: a lookup reads epoch() before it reads the namespace and hands it to
// grant(); a change that finished in between has bumped the epoch, so the grant is refused and no
// mount caches a binding the change has just undone. A change still in progress refuses grants on
// its names directly.
//
// A restarted server does not know the leases its previous runs granted: for `restart_guard`
// (the longest term any earlier run of the database may have granted, or this run's term when that
// is longer) plus grace after construction, every change waits as if each of its names were
// leased, also when this run grants no leases at all.
//
// Time is a steady clock in nanoseconds; the clock and sleeping are injectable for tests.
// Thread-safety: every method may be called from any thread at once (one internal mutex, never
// held while sleeping).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/proto/types.h"

namespace penstock::meta {

// Nanoseconds of std::chrono::steady_clock.
int64_t steady_now_ns();

struct EntryLeaseOptions {
  int64_t term_ns = 0;                   // 0: no leases are granted and changes never wait
  int64_t grace_ns = 100'000'000;        // a change waits this long past the last expiry (delivery slack)
  // The longest term an earlier run may have granted (MetaService keeps it in the store); the
  // restart guard is the longer of it and term_ns.
  int64_t restart_guard_ns = 0;
  size_t max_names = size_t{1} << 20;    // names with live leases; grants beyond this are refused
  std::function<int64_t()> clock = steady_now_ns;
  std::function<void(int64_t)> sleep_until;  // until a clock() value; empty: this thread sleeps

  // How long after start every change waits: the longer of term_ns and restart_guard_ns (0: not at
  // all). MetaService also stores it as the term the next run must cover.
  int64_t restart_guard() const { return std::max<int64_t>({term_ns, restart_guard_ns, 0}); }
};

class EntryLeases {
 public:
  struct Name {
    InodeId parent;
    std::string_view name;
  };

  explicit EntryLeases(EntryLeaseOptions options);
  EntryLeases(const EntryLeases&) = delete;
  EntryLeases& operator=(const EntryLeases&) = delete;

  int64_t term_ns() const { return options_.term_ns; }

  // Read before the namespace read whose result grant() is asked to lease.
  uint64_t epoch() const;

  // Records that `holder` may trust (parent, name) for the returned number of nanoseconds from
  // now: the term, or 0 when leases are off, a change of the name is in progress, any change
  // finished since `epoch_seen`, the table is full, or holder is 0.
  int64_t grant(Name n, SessionId holder, uint64_t epoch_seen);

  // One change of name bindings. Constructing it stops grants on the names and sleeps until no
  // session but `requester` holds a lease on any of them; destroying it (after the change is
  // applied, or failed) allows grants again and bumps the epoch.
  class Change {
   public:
    Change(EntryLeases& leases, std::vector<Name> names, SessionId requester);
    ~Change();
    Change(const Change&) = delete;
    Change& operator=(const Change&) = delete;

    // A rename succeeded: `requester`'s kernel moved its dentry from `from` to `to` and keeps
    // trusting it there for what is left of its lease, so the lease moves along.
    void moved(Name from, Name to);
    // How long the constructor slept (0 when nobody else held a lease).
    int64_t waited_ns() const { return waited_ns_; }

   private:
    EntryLeases& leases_;
    std::vector<uint64_t> keys_;
    SessionId requester_;
    int64_t waited_ns_ = 0;
  };

  // Drops the records of leases that have ended (the daemon calls it with its expiry sweep; a
  // full table also sweeps itself).
  void sweep_expired();
  // Names with a lease record. For tests and status.
  size_t size() const;

 private:
  struct Holder {
    uint64_t session = 0;
    int64_t expiry = 0;
  };
  struct Entry {
    std::vector<Holder> holders;
    int changing = 0;  // changes in progress on this name
  };

  static uint64_t key(Name n);
  void sweep(int64_t now);  // REQUIRES mu_

  const EntryLeaseOptions options_;
  const int64_t restart_guard_until_;  // clock() value; 0: none (see the file comment)
  mutable std::mutex mu_;
  // Changes finished so far: bumped under mu_ (release) after a change is applied, read without it
  // (acquire) by every lookup, so the namespace read that follows sees that change.
  std::atomic<uint64_t> epoch_{0};
  std::unordered_map<uint64_t, Entry> names_;  // guarded by mu_; key(): hash of (parent, name)
};

}  // namespace penstock::meta
