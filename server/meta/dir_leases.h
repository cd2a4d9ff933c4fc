// DirLeases: a mount's exclusive lease on the names of one directory, under which it answers "no
// such name" itself and creates files behind (docs/architecture.md, "Creates behind a directory
// lease").
//
// Why: the kernel holds a directory's lock across the negative LOOKUP and the CREATE of every
// open(O_CREAT), so creates in one shared directory are serial, two meta round trips each. A mount
// that holds the directory's lease knows every name in it (the grant lists them; nobody else may
// add one), so it answers both itself and sends the creates to the meta server in batches.
//
// The promise: while session S holds dir D, no other session's operation on D's names runs — not a
// lookup, listing or change (check() and Change). Such an operation waits (the caller answers
// kBusy with the time to retry) until S's lease has run out plus grace, then drops S's hold and
// marks D contended: no grant for `contended_ns`. S sends what it created behind before its own,
// earlier, view of the expiry, and the meta server applies a batch only while S still holds D
// (also past the term, as long as nobody else came), so nobody ever sees D without a name S
// already reported as created. Nothing is sent to the holder (no recall): a foreign operation waits
// at most the term plus grace, once per contention.
//
// Grants: only to a live session, for a directory without another session's change in progress,
// not contended, and (for a new hold; MetaService checks) with at most proto::meta::kMaxLeasedNames
// names. A new hold is granted in two steps: grant() records S as holder, the caller reads D's
// names, and confirm() checks that S still holds D. Another session's change cannot run across
// the two steps (it waits from grant() on); S's own may (the listing may miss them): a mount lists
// every name it adds itself, whatever the outcome, before it answers the kernel
// (client/lib/create_behind.h).
// A holder's renewal keeps its names (`fresh` false).
//
// Inode numbers for creates behind: the meta server gives a session numbers from its synced
// reservation (give_inodes) and a batch may only use those (take_inode), each once.
//
// A restarted server knows no holds: for `restart_guard_ns` (the longest term an earlier run may
// have granted) plus grace after construction, every check() waits. A new database has none.
//
// Time is a steady clock in nanoseconds, injectable for tests. Thread-safety: every method from
// any thread (one internal mutex).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/proto/types.h"
#include "server/meta/entry_leases.h"

namespace penstock::meta {

struct DirLeaseOptions {
  int64_t term_ns = 0;                      // 0: no grants, and check() never waits (but the restart guard)
  int64_t grace_ns = 100'000'000;           // delivery slack past a holder's expiry
  int64_t contended_ns = 10'000'000'000;    // no grant for this long after a foreign operation on a held dir
  int64_t restart_guard_ns = 0;             // the longest term an earlier run may have granted
  size_t max_dirs = 65536;                  // directories with a record; grants beyond are refused
  size_t max_inodes_per_session = 4096;     // unused numbers a session may hold
  std::function<int64_t()> clock = steady_now_ns;

  // What the next run must wait out: the longer of this run's term and the earlier runs'.
  int64_t restart_guard() const { return std::max<int64_t>({term_ns, restart_guard_ns, 0}); }
};

class DirLeases {
 public:
  explicit DirLeases(DirLeaseOptions options);
  DirLeases(const DirLeases&) = delete;
  DirLeases& operator=(const DirLeases&) = delete;

  int64_t term_ns() const { return options_.term_ns; }

  // Before `session` looks up or lists names of `dir`: 0 when it may go on now; otherwise how many
  // nanoseconds from now another session's hold may still be in use (retry after that). An invalid
  // session counts as another session.
  int64_t check(InodeId dir, SessionId session);

  // One change of dir's names (add, remove, rename in or out), by anyone. check()s first; when that
  // says wait, wait_ns() is non-zero and the change must not run. Otherwise the change is counted
  // in progress (no other session is granted a new hold) until destruction.
  class Change {
   public:
    Change(DirLeases& leases, InodeId dir, SessionId session);
    ~Change();
    Change(const Change&) = delete;
    Change& operator=(const Change&) = delete;
    int64_t wait_ns() const { return wait_ns_; }

   private:
    DirLeases& leases_;
    InodeId dir_;
    uint64_t session_;
    int64_t wait_ns_ = 0;
  };

  struct Grant {
    int64_t lease_ns = 0;  // 0: refused
    bool fresh = false;    // a new hold: the caller lists the names, then confirm()s
  };
  // Grants or renews `session`'s hold on dir. `have_names`: the session still knows the names from
  // its hold (a renewal may then skip the listing).
  Grant grant(InodeId dir, SessionId session, bool have_names);
  // After a fresh grant's listing: false when `session` no longer holds dir (the caller answers
  // "refused").
  bool confirm(InodeId dir, SessionId session);
  // Whether `session` still holds dir (also past its term while nobody else came).
  bool holds(InodeId dir, SessionId session);
  // A batch of creates behind arrived: extends the hold by the term unless dir is contended.
  // Returns the new term, 0 when not renewed.
  int64_t renew(InodeId dir, SessionId session);
  // Gives up the hold (the holder asked, or its session ended).
  void release(InodeId dir, SessionId session);

  // ---- inode numbers for creates behind ----
  size_t inodes_held(SessionId session);
  void give_inodes(SessionId session, const std::vector<InodeId>& inos);
  // True (and the number is used up) when it was given to `session` and not used yet.
  bool take_inode(SessionId session, InodeId ino);
  // The numbers `session` holds and has not used.
  std::vector<InodeId> inodes_of(SessionId session);
  // The session ended: drops its holds and numbers.
  void drop_session(SessionId session);

  // Forgets records nobody needs any more (the daemon calls it with its expiry sweep).
  void sweep();
  // Directories with a record. For tests and status.
  size_t size() const;

 private:
  struct Dir {
    uint64_t holder = 0;          // session id; 0: none
    int64_t expiry = 0;           // clock() value
    int64_t contended_until = 0;  // no grants before this
    std::vector<uint64_t> changers;  // the session of each change in progress (few: one per meta thread)
  };
  static bool changed_by_other(const Dir& d, uint64_t session) {
    return std::any_of(d.changers.begin(), d.changers.end(), [&](uint64_t s) { return s != session; });
  }
  // REQUIRES mu_. 0 or the nanoseconds to wait; drops an ended hold and marks contention.
  int64_t check_locked(Dir& d, SessionId session, int64_t now);
  void sweep_locked(int64_t now);

  const DirLeaseOptions options_;
  const int64_t restart_guard_until_;  // clock() value; 0: none
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Dir> dirs_;                               // guarded by mu_
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> inodes_;  // session -> unused numbers; guarded by mu_
};

}  // namespace penstock::meta
