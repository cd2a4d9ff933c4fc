// CreateBehind: files this mount creates in a directory it holds the lease of are answered at once
// and sent to the meta server in batches (docs/architecture.md, "Creates behind a directory lease";
// the server side is server/meta/dir_leases.h).
//
// How a directory becomes leased: after `creates_before_lease` files synchronously created in it
// were closed again within `burst_window` (markers, lock files, a tree of empty files, a dataset's
// small files written one by one), the closing thread asks the meta server (DirLease) for the
// lease and a block of inode numbers. The
// grant lists the directory's names; from then on this mount knows every name in it: its own
// creates, mkdirs, links and renames add to that list (whatever their outcome, before the kernel
// is answered; also those that race the grant's listing, which may miss them), its removals take
// from it, and nobody else may add one while the lease lasts.
//
// While the lease lasts (until `deadline`: the term from when the request that granted or renewed it
// was sent, less a quarter of it):
// - known_absent(): a LOOKUP of a name not in the list is answered "no such name" here;
// - create(): a CREATE of such a name takes a number from the pool, makes the attributes (mode,
//   owner, group as the parent's setgid bit says, times from this host's clock, no layout yet) and
//   queues the create; the caller answers the kernel with them.
// A directory whose files are mostly written at once (a dataset or a checkpoint step's files
// written one by one) keeps its lease but creates synchronously (`sync_creates`): each first write
// would wait for its batch, and one flusher sending the batches of several directories in turn is
// slower than each thread sending its own Create. So a written small file costs two meta round
// trips (Create, the close's size report) instead of three (the negative lookup too). Which way a
// directory goes is judged from the burst that asked for the lease and then from every
// kJudgeAfter files: creates behind written before they were sent, or synchronous creates closed
// unwritten, in half of them turn it the other way.
// A flusher thread sends what is queued every `flush_interval` (or at once when `max_batch` are
// queued or someone waits in barrier()), one CreateBatch per directory; each reply renews the lease
// and tops up the pool. A batch that arrives after the lease ended is still applied; one whose call
// failed on the way is sent again (for `batch_retry_for`), and so is one refused for a full disk
// (for `no_space_retry_for`). A create the server refuses (another mount made the same name
// meanwhile, a penstock-meta restart forgot the session, a disk full for longer) is logged as an
// error: the application was told it exists; later calls on it fail.
//
// Ordering: every other meta call of this client first waits in barrier() until everything queued
// before it has been answered, so the meta server never sees an operation on a file before its
// create, and this mount's own lookups, listings, releases and size reports see them.
//
// Thread-safety: every method from any thread. One mutex guards the state; no RPC is made under it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/base/result.h"
#include "common/proto/meta_service.h"

namespace penstock::client {

struct CreateBehindOptions {
  int creates_before_lease = 16;                        // synchronous creates in a directory ...
  std::chrono::milliseconds burst_window{1000};         // ... within this long before asking
  std::chrono::milliseconds refused_backoff{10000};     // not asked again this long after a refusal
  std::chrono::microseconds flush_interval{1000};       // the longest a create waits before it is sent
  size_t max_batch = 256;                               // sent at once when this many are queued
  uint32_t inode_refill = 512;                          // numbers asked for when fewer than half are left
  size_t max_dirs = 64;                                 // directories tracked (the oldest are forgotten)
  size_t max_names = 65536;                             // a leased directory grown past this is given up
  // A batch whose call failed on the way (unreachable, timed out) or waited (kBusy: another mount
  // holds the directory now) is sent again, with a growing pause, for this long: the server answers
  // a resent create it applied already as before (meta_service.h, CreateBatch).
  std::chrono::milliseconds batch_retry_for{30000};
  // A batch refused for a full metadata disk (kNoSpace) is sent again for this long from the first
  // refusal (within batch_retry_for): penstock-meta opens its database again in its ballast's room
  // about a second later (docs/meta-store.md, "A full disk"), and answers a resent entry as before
  // whether or not the refused send applied it. Short, since this mount's other meta calls wait
  // for the batch meanwhile.
  std::chrono::milliseconds no_space_retry_for{5000};
};

struct CreateBehindStats {
  uint64_t leases = 0;          // grants (not renewals)
  uint64_t absent = 0;          // lookups answered here
  uint64_t created = 0;         // creates answered here
  uint64_t batches = 0;         // CreateBatch calls
  uint64_t failed = 0;          // creates the server refused after they were answered
  uint64_t resent = 0;          // batches sent again after a failed call or kBusy
  uint64_t turned = 0;          // directories turned from creates behind to synchronous creates or back
};

class CreateBehind {
 public:
  using Clock = std::chrono::steady_clock;
  struct Rpc {
    std::function<Result<proto::meta::DirLeaseResp>(const proto::meta::DirLeaseReq&)> lease;
    std::function<Result<proto::meta::CreateBatchResp>(const proto::meta::CreateBatchReq&)> batch;
    std::function<SessionId()> session;  // the client's current session (it changes after a loss)
  };

  CreateBehind(CreateBehindOptions options, Rpc rpc);
  // stop().
  ~CreateBehind();
  CreateBehind(const CreateBehind&) = delete;
  CreateBehind& operator=(const CreateBehind&) = delete;

  // Sends everything queued, ends the flusher and answers nothing here any more. Idempotent.
  void stop();

  // LOOKUP of `name` in `dir`: true when it is known absent (answer ENOENT).
  bool known_absent(InodeId dir, std::string_view name);
  // CREATE of a regular file: its attributes when it was created behind (answer the kernel with
  // them; layout.chains is empty until the server applied it), nullopt when it must be created
  // synchronously.
  std::optional<proto::InodeAttr> create(InodeId dir, std::string_view name, uint32_t mode,
                                         const proto::Caller& caller);
  // A synchronous create of `ino` as `name` in `dir` succeeded.
  void created_sync(InodeId dir, std::string_view name, InodeId ino);
  // Data is being written to `ino` (the first write since its last size report).
  void written(InodeId ino);
  // A handle of `ino` closed (the first close of a file created synchronously decides whether it
  // counts as written). After a burst of synchronously created files closed again this asks for
  // the lease (an RPC on this thread).
  void closed(InodeId ino);
  // This client added or removed a name in `dir` through the meta server.
  void added(InodeId dir, std::string_view name);
  void removed(InodeId dir, std::string_view name);
  // Returns once every create queued before the call has been answered by the server (or failed).
  void barrier();
  // The file's last handle closed. True when its create is still queued: it is then sent as
  // closed (no open record), and the caller sends no Release for it.
  bool closed_before_sent(InodeId ino);
  // The layout (chains) the server gave a file created behind, once its create is answered
  // (barrier()); nullopt when it is not known here (not created behind, refused, or forgotten:
  // the last kLayoutsKept are kept until taken). Taken once.
  std::optional<proto::Layout> take_layout(InodeId ino);
  static constexpr size_t kLayoutsKept = 4096;
  static constexpr int kJudgeAfter = 32;

  CreateBehindStats stats() const;

 private:
  struct Dir {
    bool held = false;
    Clock::time_point deadline;                 // answer here only before this
    std::unordered_set<std::string> names;      // every name in the directory (held only)
    proto::InodeAttr attr;                      // the directory's, from the grant
    std::vector<proto::meta::CreateBehind> queued;
    SessionId queued_session;                   // the session `queued` was made under
    // Files here are mostly written at once: the lease answers lookups, creates go to the server
    // one by one (see the top of this file).
    bool sync_creates = false;
    // Of the last files judged (up to kJudgeAfter), how many went against the way this directory
    // creates: creates behind written before they were sent (each such write waits for its batch),
    // or synchronous creates closed unwritten (each could have been answered here). When they are
    // half, the directory turns the other way.
    int judged = 0;
    int against = 0;
    int burst = 0;                              // synchronous creates closed since burst_start
    int burst_written = 0;                      // of them, written
    Clock::time_point burst_start;
    Clock::time_point refused_until;
    Clock::time_point used;                     // last touched (to forget the oldest)
    // Lease requests in flight: the record is not forgotten meanwhile, so that the names this
    // mount adds while the server lists them (the listing may miss them) are kept.
    int asking = 0;
  };

  // REQUIRES mu_. The session to use: when the client's changed (the server lost the old one, and
  // with it the holds and the numbers), every hold and number of the old one is dropped here.
  SessionId session_locked();
  // REQUIRES mu_. The directory's record, made when missing (forgetting the oldest idle one).
  Dir& dir_locked(InodeId dir, Clock::time_point now);
  bool live_locked(const Dir& d, Clock::time_point now) const { return d.held && now < d.deadline; }
  // Counts one file judged for `d` (`against`: it went against the way d creates). First, when the
  // last kJudgeAfter counted had half against, turns d the other way instead and returns true (the
  // caller's file then goes the new way and is judged there: at its close, when it is created
  // synchronously). REQUIRES mu_.
  bool judge_locked(Dir& d, InodeId dir, bool against);
  // Applies a grant or renewal answered to a request sent at `sent`. REQUIRES mu_.
  void apply_lease_locked(Dir& d, InodeId dir, const proto::meta::DirLeaseResp& r, Clock::time_point sent);
  void extend_locked(Dir& d, int64_t lease_ns, Clock::time_point sent);
  // Asks for (have_names false) or renews the lease of `dir` for `session`, releasing `lock` during
  // the call, and applies the answer. False when nothing may be answered here now (stopping, the
  // session changed, the call failed).
  bool ask_lease_locked(std::unique_lock<std::mutex>& lock, InodeId dir, SessionId session, bool have_names);
  void flush_loop();
  // One CreateBatch, sent again while it fails on the way or waits (see batch_retry_for) and the
  // session stays the same. `sent`: when the last try left (the lease renews from then).
  Result<proto::meta::CreateBatchResp> send_batch(const proto::meta::CreateBatchReq& req, Clock::time_point* sent);

  const CreateBehindOptions options_;
  const Rpc rpc_;

  mutable std::mutex mu_;
  std::condition_variable wake_;      // the flusher: something queued, or hurry
  std::condition_variable answered_;  // barrier(): answered_seq_ moved
  std::unordered_map<uint64_t, Dir> dirs_;  // guarded by mu_
  std::vector<InodeId> pool_;               // unused numbers of pool_session_; guarded by mu_
  // Files created synchronously and not closed yet (at most kRecentKept), by inode number.
  struct Recent {
    uint64_t dir = 0;
    bool written = false;
  };
  std::unordered_map<uint64_t, Recent> recent_;  // guarded by mu_
  std::atomic<size_t> recent_size_{0};            // recent_.size(), read without mu_ (written()'s fast path)
  static constexpr size_t kRecentKept = 1024;
  // Layouts of answered creates behind, for take_layout(); `layout_order` drops the oldest.
  std::unordered_map<uint64_t, proto::Layout> layouts_;  // guarded by mu_
  std::deque<uint64_t> layout_order_;                    // guarded by mu_
  SessionId pool_session_;                  // guarded by mu_
  uint64_t queued_seq_ = 0;    // creates queued so far; guarded by mu_
  uint64_t answered_seq_ = 0;  // of them, answered; guarded by mu_
  size_t queued_now_ = 0;      // creates waiting to be sent; guarded by mu_
  bool hurry_ = false;         // guarded by mu_
  bool stopping_ = false;      // guarded by mu_
  std::atomic<uint64_t> unanswered_{0};  // queued_seq_ - answered_seq_, read without mu_ (barrier's fast path)
  CreateBehindStats stats_;    // guarded by mu_
  std::thread flusher_;
};

}  // namespace penstock::client
