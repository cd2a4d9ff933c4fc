// MetaService: penstock-meta's whole logic (namespace, sessions and open files, the cluster map)
// as plain methods over a Store, one per RPC of common/proto/meta_service.h. No networking here:
// server/meta/meta_server.h binds these methods to an rpc::RpcServer, and unit tests call them
// directly. Errors are the codes a local POSIX file system would give (see each method).
//
// Durability: every mutation is one atomic Store write batch; when a method returns ok its effect
// is durable. Inode numbers, session, node and target ids are never reused, also across crashes.
// Group commit: a mutation applies its batch under the mutex (visible to readers at once) and
// waits for the store's WAL sync after releasing it, so concurrent mutations share one fsync.
// Readers may thus see a mutation a moment before it is acknowledged (docs/meta-store.md).
//
// Ownership: borrows the Store (which must outlive it). Time comes from MetaOptions::now (a fake
// clock in tests); nothing here sleeps or starts threads (the daemon calls expire() periodically
// and runs the GarbageCollector of server/meta/gc.h).
// Thread-safety: every method may be called from any thread at once. Mutations are serialized by
// one mutex; pure namespace reads (lookup, getattr, readdir, readlink, xattrs, layouts) do not take
// it and read the store directly.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/base/result.h"
#include "common/proto/meta_service.h"
#include "server/meta/dir_leases.h"
#include "server/meta/entry_leases.h"
#include "server/meta/open_table.h"
#include "server/meta/schema.h"
#include "server/meta/store.h"

namespace penstock::meta {

namespace pm = ::penstock::proto::meta;

// Nanoseconds since the Unix epoch. Used for timestamps, session leases and node timeouts.
using NowFn = std::function<int64_t()>;
// The system clock as a NowFn.
int64_t system_now_ns();

// Within the clients' 5 s retry of kBusy, and longer than the data servers' 2 s heartbeat.
inline constexpr int64_t kDefaultNodeReportWaitNs = 3'000'000'000;

struct MetaOptions {
  int64_t session_lease_ns = 30'000'000'000;  // a session that does not heartbeat for this long expires
  int64_t node_timeout_ns = 10'000'000'000;   // a data server without heartbeat this long is offline
  // After a start, creates wait (kBusy, which clients retry) up to this long until every known data
  // server has reported again: until then all are offline, and a layout would leave them out. 0
  // (the default here, for tests) waits for none; the daemon uses kDefaultNodeReportWaitNs.
  int64_t node_report_wait_ns = 0;
  uint64_t inode_batch = 1024;                // inode numbers reserved per persisted counter write
  // An open still held this long after it changed is written to the store (server/meta/open_table.h);
  // one closed sooner never is. 0 writes each open and close at once, as before.
  int64_t open_store_delay_ns = 100'000'000;
  NowFn now = system_now_ns;
  uint64_t seed = 0;                          // chain selection randomness; 0: from std::random_device
  // Directory entry leases (server/meta/entry_leases.h); term 0 (the default here, for tests
  // with a fake clock) grants none. The daemon uses kDefaultEntryLeaseNs.
  EntryLeaseOptions entry_leases;
  // Directory leases for creates behind (server/meta/dir_leases.h); term 0 (the default here)
  // grants none. The daemon uses kDefaultDirLeaseNs.
  DirLeaseOptions dir_leases;
  // Called first in every Open, on the thread that serves it; empty: nothing. For tests, which hold
  // an Open there so that a restart loses its reply.
  std::function<void()> on_open;
};

inline constexpr int64_t kDefaultDirLeaseNs = 250'000'000;
// The longest directory lease term penstock-meta accepts (--dir-lease-ms).
inline constexpr int64_t kMaxDirLeaseNs = 2'000'000'000;

inline constexpr int64_t kDefaultEntryLeaseNs = 1'000'000'000;
// The longest term penstock-meta accepts (--entry-lease-s, inside a client's call deadline); a
// stored earlier term is never taken as longer than this.
inline constexpr int64_t kMaxEntryLeaseNs = 5'000'000'000;

// One queued garbage-collection job: remove every chunk of `ino` on each of `targets`.
struct GcTask {
  InodeId ino;
  std::vector<TargetId> targets;
};

class MetaService {
 public:
  // Loads the namespace from `store`, creating the root directory (inode 1, mode 0755, owner 0:0,
  // default layout 4 MiB chunks over all chains) on first start. Sessions found in the store get a
  // fresh lease from now (they expire unless they heartbeat); every node starts offline; the map
  // version is bumped once. kCorrupt / kIo from the store.
  static Result<std::unique_ptr<MetaService>> open(Store* store, MetaOptions options);

  MetaService(const MetaService&) = delete;
  MetaService& operator=(const MetaService&) = delete;

  // ---- sessions ----
  // A new session id (never reused) with the lease length.
  Result<pm::RegisterSessionResp> register_session(const pm::RegisterSessionReq& req);
  // Renews the lease. kBadHandle when the session is unknown or expired: register a new one.
  Result<pm::HeartbeatResp> heartbeat(const pm::SessionReq& req);
  // Drops the session and all its opens (which may release orphans to GC). kBadHandle if unknown.
  Status close_session(const pm::SessionReq& req);

  // ---- namespace ----
  // Errors common to everything taking (parent, name): kInvalid for an empty name, ".", "..", or a
  // name with '/' or NUL; kNameTooLong over 255 bytes; kNotFound when parent is missing;
  // kNotDir when parent is not a directory.
  // kNotFound when the name is absent. A directory found for a req.session gets an entry lease.
  Result<pm::AttrResp> lookup(const pm::LookupReq& req);
  // lookup() that also opens a regular file it finds for req.session (pm::LookupOpen); not synced,
  // like open_file() of a linked file.
  Result<pm::LookupOpenResp> lookup_open(const pm::LookupReq& req);
  Result<pm::AttrResp> get_attr(const pm::InodeReq& req);         // kNotFound when the inode is gone
  // Applies the `valid` fields. Size (regular files only: kIsDir on a directory, kInvalid on other
  // types) is set exactly and bumps generation; the caller has already cut the chunks. ctime is
  // always set to now; mtime too when the size is set without an explicit mtime.
  Result<pm::AttrResp> set_attr(const pm::SetAttrReq& req);
  // A regular file with chains chosen from the parent's layout. With req.session valid the file is
  // also opened for it. kExists when the name is taken; kUnavailable when no data chain is online;
  // kBadHandle for an unknown session.
  Result<pm::AttrResp> create(const pm::CreateReq& req);
  // Regular (type 0 or S_IFREG, like create), FIFO, socket, char and block devices (rdev kept).
  // S_IFDIR: kNotPermitted (use mkdir); S_IFLNK or unknown type: kInvalid.
  Result<pm::AttrResp> mknod(const pm::MknodReq& req);
  Result<pm::AttrResp> mkdir(const pm::MkdirReq& req);            // kExists
  Result<pm::UnlinkResp> unlink(const pm::NameReq& req);          // kNotFound, kIsDir
  // kNotFound, kNotDir, kNotEmpty. Rmdir and rename first wait until no session but req.session
  // holds an entry lease on a name they change (at most the lease term). Both answer the
  // directories they changed (pm::DirsResp).
  Result<pm::DirsResp> rmdir(const pm::NameReq& req);
  // renameat2 semantics, see namespace.cc for the full list of cases.
  Result<pm::DirsResp> rename(const pm::RenameReq& req);
  // kNotPermitted for a directory, kExists, kNotFound when ino has no links left.
  Result<pm::AttrResp> link(const pm::LinkReq& req);
  // kNameTooLong when the target exceeds 4095 bytes, kNotFound when it is empty (as Linux).
  Result<pm::AttrResp> symlink(const pm::SymlinkReq& req);
  Result<pm::ReadlinkResp> readlink(const pm::InodeReq& req);     // kInvalid when not a symlink
  // Entries with names strictly after req.after, in name order, at most max_entries (0 means 1024;
  // capped at 4096). "." and ".." are not listed (the client adds them). kNotDir.
  Result<pm::ReadDirResp> read_dir(const pm::ReadDirReq& req);
  Result<pm::StatFsResp> stat_fs();
  // Every operation on a directory's names above (lookup, read_dir, create, mknod, mkdir, symlink,
  // link, unlink, rmdir, rename) answers kBusy "retry" while another session holds that
  // directory's lease (until its term and grace have passed; server/meta/dir_leases.h).

  // ---- directory leases and creates behind ----
  // pm::DirLease / pm::CreateBatch (see common/proto/meta_service.h).
  Result<pm::DirLeaseResp> dir_lease(const pm::DirLeaseReq& req);
  Result<pm::CreateBatchResp> create_batch(const pm::CreateBatchReq& req);

  // ---- xattrs ----
  Result<pm::GetXattrResp> get_xattr(const pm::GetXattrReq& req);  // kNoData when absent
  // flags: 1 CREATE (kExists when present), 2 REPLACE (kNoData when absent), both: kInvalid.
  // Value over 64 KiB: kRange (Linux says E2BIG; ERANGE is the nearest code in our table).
  // Empty name or one over 255 bytes: kRange (as Linux).
  Status set_xattr(const pm::SetXattrReq& req);
  Result<pm::ListXattrResp> list_xattr(const pm::InodeReq& req);
  Status remove_xattr(const pm::GetXattrReq& req);                 // kNoData when absent

  // ---- open files ----
  // Counts one open of ino by the session; works on an unlinked-but-open inode. kNotFound,
  // kBadHandle for an unknown session. Replies without waiting for a WAL sync unless the inode is
  // already unlinked (see the comment at the definition).
  Result<pm::AttrResp> open_file(const pm::OpenReq& req);
  // Drops one open. Idempotent: releasing an open that is not recorded is ok. The last release of
  // an unlinked inode queues it for garbage collection. Replies without waiting for a WAL sync.
  Status release(const pm::ReleaseReq& req);
  // release() of each inode in turn (a repeated inode is released as often as it is listed); all
  // are tried, the first error is returned. kInvalid for more than pm::kMaxReleaseBatch inodes.
  Status release_many(const pm::ReleaseManyReq& req);
  // size = max(size, req.size), mtime = req.mtime_ns (now when 0), generation bumped. kIsDir.
  Result<pm::AttrResp> report_size(const pm::ReportSizeReq& req);
  // report_size() that replies once the change is applied (visible to every client) and asks the
  // store to make it durable soon (Store::sync_soon), without waiting for a WAL sync: close()'s
  // report, which needs visibility at once and durability only as its unsynced data has.
  Result<pm::AttrResp> report_size_at_close(const pm::ReportSizeReq& req);
  // Returns once every change applied before the call is durable (fsync after a close reported).
  Status sync_log();
  // Drops the store's caches (Store::drop_caches), for cold-start measurements.
  pm::DropCachesResp drop_caches() { return pm::DropCachesResp{store_->drop_caches()}; }

  // ---- layouts ----
  Result<pm::LayoutResp> get_layout(const pm::InodeReq& req);
  // Directories only (kNotDir); kInvalid for a bad chunk size. stripe_count 0 means all chains.
  Status set_layout(const pm::SetLayoutReq& req);

  // ---- cluster ----
  Result<pm::ClusterMapResp> get_cluster_map();
  // Same uuid => same id forever. kInvalid for an empty uuid or a bad address.
  Result<pm::RegisterNodeResp> register_node(const pm::RegisterNodeReq& req);
  // kNotFound for an unknown node or target: the data server should register again.
  Result<pm::HeartbeatResp> node_heartbeat(const pm::NodeHeartbeatReq& req);

  // ---- maintenance (the daemon calls these from its own threads) ----
  // Expires sessions whose lease passed (dropping their opens), writes the opens held longer than
  // open_store_delay_ns, marks nodes offline whose last heartbeat is older than node_timeout, and
  // forgets entry leases that have ended. Returns the first store error (and goes on with others).
  Status expire();
  // Writes every open the store does not hold yet (a clean stop calls it, so a restart keeps them).
  Status store_opens();
  // A mount's open counts after this server's start (proto ReclaimOpensReq): each count becomes
  // the larger of the two; with `last`, the session no longer holds unlinked files back. Synced.
  // kBadHandle for an unknown session, kInvalid past kMaxReclaimBatch.
  Status reclaim_opens(const pm::ReclaimOpensReq& req);
  // Up to `max` queued GC jobs in inode order, starting after `after`.
  Result<std::vector<GcTask>> gc_pending(InodeId after, size_t max);
  // The job of `ino` is done: deletes its queue entry. Applied but not synced (the one mutation
  // that does not wait): losing it in a crash only repeats idempotent removals.
  Status gc_done(InodeId ino);
  // The address of the node serving `target`; kNotFound if unknown.
  Result<std::string> target_address(TargetId target);
  // Called (outside the lock) whenever a job is queued, so the collector can wake up.
  void set_gc_wakeup(std::function<void()> fn);

  // ---- scrub (server/meta/scrub.h) ----
  struct ScrubTarget {
    TargetId id;
    std::string address;  // of the data server serving it
    bool online = false;
  };
  // Every target of the cluster map, in id order.
  std::vector<ScrubTarget> scrub_targets();
  // What chunks of `ino` found on a target are: kLive (the inode exists, linked or open),
  // kCollecting (unlinked; its garbage-collection job removes them), kOrphan (not in the
  // namespace: a create a power loss took back, or a write after its file was collected; the
  // number is never handed out again) or kNeverIssued (at or past the next number to hand out:
  // not this namespace's, left alone). Reads with Store::peek, so a pass over every chunk evicts
  // nothing from the caches clients use. kIo from the store.
  enum class ChunkOwner { kLive, kCollecting, kOrphan, kNeverIssued };
  Result<ChunkOwner> chunk_owner(InodeId ino);
  // The scrub RPC: runs `fn` (installed by the Scrubber; kNotSupported without one).
  using ScrubFn = std::function<Result<pm::ScrubResp>(const pm::ScrubReq&)>;
  void set_scrub_runner(ScrubFn fn);
  Result<pm::ScrubResp> scrub(const pm::ScrubReq& req);
  uint64_t map_version();
  // ---- exactly-once changes (pm::ReplayReq) ----
  // Runs `change`, the handler of the change `req` carries, at most once per (session, slot,
  // seq): the change's mutation writes its reply into its own batch (commit_change), and a repeat
  // of the slot's last seq gets that reply without running anything, also after a restart (a
  // Create's lost open is given back: reopen_created). One change at a time per slot: a repeat that
  // comes while the first still runs waits for it, up to 5 s (then kUnavailable: send it again);
  // without `may_wait` (on an I/O thread) it gets kUnavailable at once.
  // kInvalid for a slot out of range, seq 0, a seq below the slot's last or a repeat naming another
  // method or request; kBadHandle (nothing applied) when the session is unknown or expired at the
  // change's commit. Errors of `change` are not stored.
  Result<std::string> replay(const pm::ReplayReq& req, const std::function<Result<std::string>()>& change,
                             bool may_wait = true);
  // How many repeats replay() answered from a stored reply (since this service started).
  uint64_t replies_repeated() const { return replies_repeated_.load(); }

  // This file system's id (schema kFileSystemId). Fixed after open().
  const std::string& fs_id() const { return fs_id_; }
  const MetaOptions& options() const { return options_; }

 private:
  class Txn;
  struct SessionState {
    int64_t expires_ns = 0;
  };
  struct NodeState {
    schema::NodeRecord rec;
    bool online = false;
    int64_t last_heartbeat_ns = 0;
  };
  struct TargetState {
    schema::TargetRecord rec;
    bool online = false;
  };

  MetaService(Store* store, MetaOptions options);
  Status load();

  // The mutations behind the public methods of the same name: each takes mu_, applies its batch
  // (not yet synced) and returns; the public method then waits for the store's sync (durable()),
  // or hands the batch to the kernel (handed()) for the changes answered before a sync.
  Result<pm::RegisterSessionResp> register_session_applied(const pm::RegisterSessionReq& req);
  Status close_session_applied(const pm::SessionReq& req);
  // `ino`: the new inode's number, from take_inode_number().
  Result<pm::AttrResp> make_node_applied(InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                         const proto::Caller& caller, SessionId session,
                                         const std::string& symlink_target, InodeId ino);
  // make_node_applied's work inside `txn` (which the caller commits): nothing is changed when it
  // fails. REQUIRES mu_.
  Result<pm::AttrResp> make_node_in(Txn& txn, InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                    const proto::Caller& caller, SessionId session, const std::string& symlink_target,
                                    InodeId ino, int64_t now);
  Result<pm::UnlinkResp> unlink_applied(const pm::NameReq& req);
  Result<pm::DirsResp> rmdir_applied(const pm::NameReq& req, InodeId checked_victim);
  Result<pm::DirsResp> rename_applied(const pm::RenameReq& req, InodeId checked_victim);
  Result<pm::AttrResp> link_applied(const pm::LinkReq& req);
  Result<pm::AttrResp> set_attr_applied(const pm::SetAttrReq& req);
  Result<pm::AttrResp> report_size_applied(const pm::ReportSizeReq& req);
  Status set_xattr_applied(const pm::SetXattrReq& req);
  Status remove_xattr_applied(const pm::GetXattrReq& req);
  Result<pm::AttrResp> open_file_applied(const pm::OpenReq& req, bool* orphan);
  Status add_open_locked(SessionId session, InodeId ino, bool orphan);  // REQUIRES: mu_
  Status release_applied(const pm::ReleaseReq& req);
  Status release_many_applied(const pm::ReleaseManyReq& req);
  Status release_in(Txn& txn, SessionId session, InodeId ino, uint32_t times, bool* queued);
  Status set_layout_applied(const pm::SetLayoutReq& req);
  Result<pm::RegisterNodeResp> register_node_applied(const pm::RegisterNodeReq& req);
  Result<pm::HeartbeatResp> node_heartbeat_applied(const pm::NodeHeartbeatReq& req);
  Status expire_applied();
  Status gc_done_applied(InodeId ino);
  // txn.commit(), with the reply of the change this thread runs for replay() in the same batch
  // (`response`, encoded) while its session is alive. Every mutation a Replay may carry commits
  // this way. REQUIRES mu_.
  template <class Resp>
  Status commit_change(Txn& txn, const Resp& response);
  // replay() of a Create answered from its stored reply: the open it promises, again if lost.
  Status reopen_created(const pm::ReplayReq& req, const std::string& reply);
  // Waits (without mu_) until everything applied so far is durable; then `result`, or the sync
  // error instead when the sync failed.
  template <class T>
  T durable(T result);
  // Hands everything applied so far to the kernel (Store::sync_soon: a kill of this process keeps
  // it, a sync follows within --close-sync-ms); then `result`, or the error when it could not.
  template <class T>
  T handed(T result);
  // take_inode_number(), make_node_applied, then sync_soon() (durable() for an error).
  // docs/meta-store.md "Durability". `open_for`: the session the new file is opened for (or none);
  // `requester`: the session asking (directory leases).
  Result<pm::AttrResp> make_node(InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                 const proto::Caller& caller, SessionId open_for, SessionId requester,
                                 const std::string& symlink_target);

  // Without mu_: the next inode number, always below ino_synced_end_. Half a batch before the
  // synced numbers run out it applies the next reservation without waiting, and counts it synced
  // once the store says a sync covered it; should the numbers still run out, it syncs the
  // reservation (not under mu_) first.
  Result<InodeId> take_inode_number();
  // Records that a completed sync covered reservations up to `end`.
  void raise_ino_synced_end(uint64_t end);

  // All REQUIRE mu_ held.
  // Applies (does not sync) the reservation of every number below `end`.
  Status apply_inode_reservation(uint64_t end);
  Result<std::vector<ChainId>> pick_chains(uint32_t stripe_count, uint32_t* seed);
  Status drop_link(Txn& txn, schema::InodeRecord& rec, int64_t now, bool* queued_gc);
  Status finalize_inode(Txn& txn, const schema::InodeRecord& rec, int64_t now, bool* queued_gc);
  Status drop_opens_of_session(SessionId session, bool* queued_gc);
  Status reclaim_opens_applied(const pm::ReclaimOpensReq& req, bool* queued_gc, bool* wrote);
  // True while a session found at start has not sent its opens and one lease has not passed:
  // unlinked files then wait as orphans (grace_orphans_).
  bool reclaim_grace_locked(int64_t now) const;
  // True for a file unlinked during that wait, while it lasts: only its end may finalize it (an
  // open not sent yet may hold it).
  bool waits_for_reclaim_locked(InodeId ino, int64_t now) const;
  // After the wait: finalizes the waiting orphans no session has open.
  Status end_reclaim_grace_locked(int64_t now, bool* queued_gc);
  // `session` has sent its opens, or ended: it leaves unreclaimed_ and opened_unreclaimed_.
  void reclaimed_locked(uint64_t session);
  Status bump_map_version(WriteBatch* batch);
  bool session_alive(SessionId s);
  // Before a directory `name` in `parent` is removed (rmdir, or replaced by a rename): another
  // session may hold its lease with creates not yet applied, so its removal is a change of its
  // names too (*out, kBusy while leased elsewhere). Nothing when it is no directory. *checked:
  // the directory checked (0: none); rmdir_applied and rename_applied remove no other one (a
  // rename may swap it in between: kBusy, retried by the client).
  Status change_victim_dir(InodeId parent, const std::string& name, SessionId session,
                           std::optional<DirLeases::Change>* out, InodeId* checked);
  // REQUIRES mu_. kBusy while a restarted server waits for the data servers it knows to report
  // (MetaOptions::node_report_wait_ns); OK once all did or the wait is over.
  Status wait_for_nodes_locked();
  // REQUIRES mu_. The chains new files may use (every target online), after wait_for_nodes_locked();
  // kUnavailable when there is none.
  Result<std::vector<ChainId>> usable_chains_locked();
  // Fresh numbers for `session`'s creates behind: up to `want` (capped), fewer when it holds many.
  Result<std::vector<InodeId>> grant_inodes(SessionId session, uint32_t want);
  void notify_gc(bool queued);

  Store* store_;
  MetaOptions options_;
  OpenTable opens_;  // under mu_
  std::unordered_set<uint64_t> unreclaimed_;  // sessions found at start that have not sent their opens
  // For a session of unreclaimed_: the opens counted since the start (Open, LookupOpen), by inode.
  // Its reclaim sends the mount's count from a moment before, which may leave out an open this
  // server counted since (the mount counts one once answered) while the server lost the ones
  // before its start: the count a reclaim sets is at least the mount's plus these. Releases do
  // not lower them: the server cannot tell whether a release ends an open from before the start,
  // which the mount's count already left out. So a file opened again after the start is counted
  // too often (kept, should it be unlinked, until the session ends), not once too few (freed
  // while open). A create's open needs none of this: a new inode's count here is whole.
  std::unordered_map<uint64_t, std::unordered_map<uint64_t, uint32_t>> opened_unreclaimed_;
  int64_t reclaim_until_ns_ = 0;              // the wait for them ends here at the latest
  bool reclaim_wait_over_ = true;             // its end has been logged
  std::set<uint64_t> grace_orphans_;          // files unlinked during that wait with no open known
  EntryLeases leases_;  // its own lock; never taken under mu_
  DirLeases dir_leases_;  // its own lock, a leaf: taken under mu_ by drop_session and create_batch

  // Lock order: mu_ is the only lock of this class and is taken before the store's internal
  // locks. It serializes every mutation (so a read-check-write batch never races another) and
  // guards all in-memory state below. Never held across a network wait, nor across a WAL sync.
  std::mutex mu_;
  std::mutex grant_mu_;  // grant_inodes(): one at a time, so no session passes its cap
  // replay(): the (session, slot) pairs running a change; a leaf lock.
  std::mutex replay_mu_;
  std::condition_variable replay_cv_;
  std::set<std::pair<uint64_t, uint32_t>> replaying_;
  std::atomic<uint64_t> replies_repeated_{0};
  uint64_t next_ino_ = 0;  // next inode number to hand out
  // Applied reservation: numbers below it may have been handed out. Written under mu_, read by
  // durable() without it.
  std::atomic<uint64_t> ino_batch_end_{0};
  // Numbers below this lie in a reservation a completed sync covered; only they are handed out,
  // so no create is visible, or answered, with a number a crash could hand out again. Raised
  // under mu_ or by a completed sync (atomic max).
  std::atomic<uint64_t> ino_synced_end_{0};
  // Store::applied_ticket() just after the latest reservation was applied.
  uint64_t ino_reservation_ticket_ = 0;
  uint64_t next_session_ = 1;
  uint64_t next_node_ = 1;
  uint64_t next_target_ = 1;
  uint64_t used_inodes_ = 0;
  uint64_t map_version_ = 0;
  uint64_t chain_cursor_ = 0;   // rotating start position of chain selection
  int64_t nodes_wait_until_ = 0;  // options_.now() value; 0: every known data server has reported
  std::mt19937_64 rng_;
  std::unordered_map<uint64_t, SessionState> sessions_;
  std::map<uint64_t, NodeState> nodes_;
  std::map<uint64_t, TargetState> targets_;
  std::map<uint64_t, proto::ChainInfo> chains_;
  std::function<void()> gc_wakeup_;
  ScrubFn scrub_runner_;
  std::string fs_id_;  // set by load(), then read without the lock
  std::set<uint64_t> gc_queue_;  // inodes with a g/ entry (applied), mirrors the store's g/ keys
};

}  // namespace penstock::meta
