// The metadata service (penstock-meta): every request and response, declared once.
// Method numbers are wire format: append, never renumber. Errors travel as the frame's status code
// (see common/base/status.h); each method notes the codes a caller must handle besides
// kUnavailable/kTimeout/kProtocol/kInternal, which any call can return.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "common/proto/method.h"
#include "common/proto/types.h"

namespace penstock::proto::meta {

inline constexpr uint32_t kMaxNameBytes = 255;
inline constexpr uint32_t kMaxSymlinkBytes = 4095;
inline constexpr uint32_t kMaxXattrValueBytes = 64 * 1024;
// The names of one inode's xattrs, each with its NUL, as listxattr(2) returns them: Linux's
// XATTR_LIST_MAX, beyond which no listing could hold them (the server refuses more: ENOSPC).
inline constexpr uint32_t kMaxXattrListBytes = 64 * 1024;

// ---- sessions (one per mount) ----
struct RegisterSessionReq { std::string client_name; std::string hostname; PENSTOCK_FIELDS(client_name, hostname); };
struct RegisterSessionResp { SessionId session; uint64_t map_version = 0; int64_t lease_ns = 0; PENSTOCK_FIELDS(session, map_version, lease_ns); };
struct SessionReq { SessionId session; PENSTOCK_FIELDS(session); };
struct HeartbeatResp { uint64_t map_version = 0; PENSTOCK_FIELDS(map_version); };

// ---- namespace ----
// With `session` set, a lookup that finds a directory may lease the name to that session: the
// answer's entry_lease_ns says for how long (from when the request was sent, less delivery slack)
// the mount may reuse the binding without asking; rmdir and rename of it wait that lease out
// (server/meta/entry_leases.h). 0: no lease, ask again every time.
struct LookupReq { InodeId parent; std::string name; SessionId session; PENSTOCK_FIELDS(parent, name, session); };
// `parent`: after create, mknod, mkdir, symlink and link, the attributes of the directory the
// name was added to, as that change left them (a client's directory-attribute cache).
struct AttrResp {
  InodeAttr attr; int64_t entry_lease_ns = 0; std::optional<InodeAttr> parent;
  PENSTOCK_FIELDS(attr, entry_lease_ns, parent);
};
struct InodeReq { InodeId ino; PENSTOCK_FIELDS(ino); };
// LookupOpen: a Lookup (same request, same errors) that also opens a regular file it finds for
// req.session, as Open would (`opened`). The mount's open() that follows the lookup in the same
// path walk then sends no Open of its own (client/lib/client.h, "Open tickets"); the session
// releases the open like any other. Other types, an unknown session, or an inode unlinked since
// the name was read: the lookup's answer, not opened.
struct LookupOpenResp {
  InodeAttr attr; int64_t entry_lease_ns = 0; bool opened = false;
  PENSTOCK_FIELDS(attr, entry_lease_ns, opened);
};

// Bits of SetAttrReq::valid.
enum SetAttrBits : uint32_t {
  kSetMode = 1u << 0, kSetUid = 1u << 1, kSetGid = 1u << 2, kSetSize = 1u << 3,
  kSetAtime = 1u << 4, kSetMtime = 1u << 5, kSetAtimeNow = 1u << 6, kSetMtimeNow = 1u << 7,
};
struct SetAttrReq {
  InodeId ino; uint32_t valid = 0; uint32_t mode = 0; uint32_t uid = 0; uint32_t gid = 0;
  uint64_t size = 0; int64_t atime_ns = 0; int64_t mtime_ns = 0; Caller caller;
  PENSTOCK_FIELDS(ino, valid, mode, uid, gid, size, atime_ns, mtime_ns, caller);
};

// Create a regular file. With `session` set the file is also opened for that session (one round
// trip for create+open). kExists when the name is taken (always: the kernel asks for O_EXCL semantics
// through lookup first).
struct CreateReq {
  InodeId parent; std::string name; uint32_t mode = 0; Caller caller; SessionId session;
  PENSTOCK_FIELDS(parent, name, mode, caller, session);
};
// `session` (here and in every request naming a directory's entries): the requester. Another
// session's directory lease makes the request wait (kBusy, see DirLease below); the requester's own
// does not.
struct MknodReq {
  InodeId parent; std::string name; uint32_t mode = 0; uint64_t rdev = 0; Caller caller; SessionId session;
  PENSTOCK_FIELDS(parent, name, mode, rdev, caller, session);
};
struct MkdirReq {
  InodeId parent; std::string name; uint32_t mode = 0; Caller caller; SessionId session;
  PENSTOCK_FIELDS(parent, name, mode, caller, session);
};
// `session`: also the requester whose own entry lease on the name does not delay an rmdir (its
// kernel drops the dentry itself).
struct NameReq { InodeId parent; std::string name; SessionId session; PENSTOCK_FIELDS(parent, name, session); };
// The directory's attributes after the unlink (new mtime, ctime): the mount answers the kernel's
// next GETATTR of it (the permission check of the next path walk) without asking (version 6).
struct UnlinkResp { InodeAttr parent; PENSTOCK_FIELDS(parent); };

// Rename flags as in renameat2(2).
enum RenameFlags : uint32_t { kRenameNoReplace = 1u << 0, kRenameExchange = 1u << 1 };
// `session`: the requester, as for NameReq.
struct RenameReq {
  InodeId parent; std::string name; InodeId new_parent; std::string new_name; uint32_t flags = 0; SessionId session;
  PENSTOCK_FIELDS(parent, name, new_parent, new_name, flags, session);
};
// What an rmdir or rename did to directories (version 7): `dirs`, every directory whose
// attributes it changed, as they are after it (the parents; a directory a rename moved or
// exchanged: its ctime, its ".."), which the mount keeps for the kernel's next GETATTR of them;
// `removed`, the directory it removed (an rmdir's, or an empty one a rename replaced; 0: none),
// whose attributes the mount forgets. Empty for a rename between two links of one inode.
struct DirsResp { std::vector<InodeAttr> dirs; InodeId removed; PENSTOCK_FIELDS(dirs, removed); };
struct LinkReq { InodeId ino; InodeId new_parent; std::string new_name; SessionId session; PENSTOCK_FIELDS(ino, new_parent, new_name, session); };
struct SymlinkReq {
  InodeId parent; std::string name; std::string target; Caller caller; SessionId session;
  PENSTOCK_FIELDS(parent, name, target, caller, session);
};
struct ReadlinkResp { std::string target; PENSTOCK_FIELDS(target); };

// Directory listing in pages, in name order. `after` is the last name of the previous page (empty
// for the first page); at most `max_entries` come back. With `plus`, each entry carries attributes.
struct ReadDirReq {
  InodeId ino; std::string after; uint32_t max_entries = 0; bool plus = false; SessionId session;
  PENSTOCK_FIELDS(ino, after, max_entries, plus, session);
};
struct DirEntry { std::string name; InodeId ino; uint32_t mode = 0; std::optional<InodeAttr> attr; PENSTOCK_FIELDS(name, ino, mode, attr); };
struct ReadDirResp { std::vector<DirEntry> entries; bool eof = false; PENSTOCK_FIELDS(entries, eof); };

struct StatFsResp {
  uint64_t total_bytes = 0; uint64_t free_bytes = 0; uint64_t total_inodes = 0; uint64_t used_inodes = 0;
  uint32_t block_size = 0; uint32_t max_name = 0;
  PENSTOCK_FIELDS(total_bytes, free_bytes, total_inodes, used_inodes, block_size, max_name);
};

// ---- directory leases and creates behind (server/meta/dir_leases.h) ----
// DirLease grants (or renews) `session` an exclusive lease on the names of directory `dir` for
// lease_ns (0: refused) from when the request was sent, less delivery slack: while it lasts, no
// other session looks up, lists or changes dir's names (they get kBusy and retry), so the holder
// may answer "no such name" itself and create files behind (CreateBatch). `have_names`: the
// holder still knows dir's names from its hold; otherwise, or when the hold is new (`fresh`),
// `names` lists them all (a new hold is refused on a directory with more than kMaxLeasedNames).
// `dir_attr`: the directory's attributes. `want_inodes` (at most kMaxInodeGrant): fresh inode
// numbers for this session's creates behind come back in `inos` (fewer when it holds many unused).
// kBadHandle for a dead session, kNotDir, kNotFound.
inline constexpr uint32_t kMaxInodeGrant = 1024;
inline constexpr size_t kMaxLeasedNames = 4096;
struct DirLeaseReq {
  SessionId session; InodeId dir; bool have_names = false; uint32_t want_inodes = 0;
  PENSTOCK_FIELDS(session, dir, have_names, want_inodes);
};
struct DirLeaseResp {
  int64_t lease_ns = 0; bool fresh = false; std::vector<std::string> names; InodeAttr dir_attr;
  std::vector<InodeId> inos;
  PENSTOCK_FIELDS(lease_ns, fresh, names, dir_attr, inos);
};
// Files the holder of dir's lease created behind, in the order it answered them: each gets its
// own result, applied as a Create with the given number (one of the session's inos) that also
// opens the file for the session, unless `open` is false (it was closed again before it was sent:
// no open record, and no Release follows). A batch that comes after the session's hold ended is
// still applied (the mount told the applications these files exist), unless another session
// holds dir now: then the whole call is kBusy ("retry in N ms") and nothing is applied. Sent
// again after a lost reply, an entry already applied (its name has its number) succeeds again,
// one refused because its name exists is refused again (kExists).
// An entry fails with kInvalid for a number not given to the session, else as a Create.
// `lease_ns`: the hold renewed from when the request was sent (0: not renewed, or not held). At
// most kMaxCreateBatch entries (kInvalid). `want_inodes` as for DirLease.
inline constexpr size_t kMaxCreateBatch = 1024;
struct CreateBehind {
  std::string name; InodeId ino; uint32_t mode = 0; Caller caller; bool open = true;
  PENSTOCK_FIELDS(name, ino, mode, caller, open);
};
struct CreateBatchReq {
  SessionId session; InodeId dir; std::vector<CreateBehind> entries; uint32_t want_inodes = 0;
  PENSTOCK_FIELDS(session, dir, entries, want_inodes);
};
struct CreateResult {
  uint32_t code = 0; std::string message; std::optional<InodeAttr> attr;  // code: a base Code
  PENSTOCK_FIELDS(code, message, attr);
};
struct CreateBatchResp {
  std::vector<CreateResult> results; int64_t lease_ns = 0; std::vector<InodeId> inos;
  PENSTOCK_FIELDS(results, lease_ns, inos);
};

// ---- xattrs (kNoData when missing; SetXattr flags as in setxattr(2): 1 CREATE, 2 REPLACE) ----
struct GetXattrReq { InodeId ino; std::string name; PENSTOCK_FIELDS(ino, name); };
struct GetXattrResp { std::string value; PENSTOCK_FIELDS(value); };
struct SetXattrReq { InodeId ino; std::string name; std::string value; uint32_t flags = 0; PENSTOCK_FIELDS(ino, name, value, flags); };
struct ListXattrResp { std::vector<std::string> names; PENSTOCK_FIELDS(names); };

// ---- open files ----
// Open/Release keep the per-session open count that keeps an unlinked file's chunks alive.
struct OpenReq { InodeId ino; SessionId session; uint32_t flags = 0; PENSTOCK_FIELDS(ino, session, flags); };
struct ReleaseReq { InodeId ino; SessionId session; PENSTOCK_FIELDS(ino, session); };
// Many releases of one session in one RPC (a client batches the releases of files it closed), at
// most kMaxReleaseBatch (kInvalid beyond).
inline constexpr size_t kMaxReleaseBatch = 1024;
struct ReleaseManyReq { SessionId session; std::vector<InodeId> inos; PENSTOCK_FIELDS(session, inos); };
// A restarted penstock-meta knows only the opens its store kept (docs/meta-store.md, "Open
// records"). A mount that sees a new map version (every start bumps it) sends how many times it
// has each file open; the server keeps the larger of that and its own count. Until every session
// it found at start has sent its list with `last` set (or ended), or one session lease has
// passed, it finalizes no unlinked file, which an open it forgot may still hold. At most
// kMaxReclaimBatch opens per call (kInvalid beyond; send several, `last` on the final one).
inline constexpr size_t kMaxReclaimBatch = 4096;
struct OpenCount { InodeId ino; uint32_t count = 0; PENSTOCK_FIELDS(ino, count); };
struct ReclaimOpensReq {
  SessionId session;
  std::vector<OpenCount> opens;
  bool last = true;
  PENSTOCK_FIELDS(session, opens, last);
};
// A client reports the end of what it wrote: size becomes max(size, `size`), mtime is set.
// ReportSize replies once the change is durable (fsync); ReportSizeAtClose once it is applied and
// visible to every client (close-to-open), durable within the server's --close-sync-ms like the
// data it describes, which close() does not sync either. SyncLog replies once every change the
// server applied before it is durable (fsync() after a close reported the size).
// `mtime_ns`: the file's new mtime (its last write's time, or what a setattr or truncate after the
// writes made it); 0 leaves the mtime as it is (mounts before 2026-11-28 never send 0).
struct ReportSizeReq { InodeId ino; uint64_t size = 0; int64_t mtime_ns = 0; PENSTOCK_FIELDS(ino, size, mtime_ns); };

// ---- layouts ----
struct LayoutResp { Layout layout; PENSTOCK_FIELDS(layout); };
// Sets a directory's layout for files created in it from now on (kNotDir on a file).
struct SetLayoutReq { InodeId ino; uint32_t chunk_size = 0; uint32_t stripe_count = 0; PENSTOCK_FIELDS(ino, chunk_size, stripe_count); };

// ---- cluster ----
struct ClusterMapResp { ClusterMap map; PENSTOCK_FIELDS(map); };
// `fs_id`: the file system the target belongs to (stamped at its first registration; empty before).
// `has_chunks`: whether the target held any chunk when its server started.
struct TargetReport {
  std::string uuid; std::string path; uint64_t capacity_bytes = 0; uint64_t free_bytes = 0; std::string fs_id;
  bool has_chunks = false;
  PENSTOCK_FIELDS(uuid, path, capacity_bytes, free_bytes, fs_id, has_chunks);
};
// A data server registers at start with a stable uuid per node and per target (kept in the target
// directory); the meta server maps them to ids that never change. A target stamped with another
// file system's id is refused (kInvalid): its chunks are not this namespace's to serve, collect or
// scrub; so is an unstamped target that holds chunks but whose uuid this meta never registered
// (written under some other file system before ids existed). The reply's `fs_id` is what the data
// server stamps into targets that have none yet.
struct RegisterNodeReq { std::string node_uuid; std::string address; std::vector<TargetReport> targets; PENSTOCK_FIELDS(node_uuid, address, targets); };
struct RegisterNodeResp {
  NodeId node; std::vector<TargetId> targets; uint64_t map_version = 0; std::string fs_id;
  PENSTOCK_FIELDS(node, targets, map_version, fs_id);
};
struct NodeHeartbeatReq { NodeId node; std::vector<TargetReport> targets; PENSTOCK_FIELDS(node, targets); };

// ---- caches ----
// Drops what the server keeps in memory only for speed (its record cache, RocksDB's block cache),
// so that the next reads start cold (penstock-bench --drop-caches); nothing durable changes.
// `bytes`: what was dropped.
struct DropCachesResp { uint64_t bytes = 0; PENSTOCK_FIELDS(bytes); };

// ---- scrub ----
// One pass over every target's chunks: the chunks of inodes the namespace does not have (a create
// a power loss took back after its data was written, a write that came after its file was
// collected) are removed; with `dry_run` only counted. Waits for the pass (one at a time: a call
// during a pass gets kBusy). `errors`: at most kMaxScrubErrors lines, each
// naming a target that could not be listed or a removal that failed (the pass goes on past them).
inline constexpr size_t kMaxScrubErrors = 16;
struct ScrubReq { bool dry_run = false; PENSTOCK_FIELDS(dry_run); };
struct ScrubResp {
  uint32_t targets = 0;          // targets listed to the end
  uint32_t targets_failed = 0;   // targets skipped (offline, unreachable, an error listing them)
  // Counted per target (an inode with chunks on three targets counts three times):
  uint64_t inodes = 0;           // inodes found with chunks
  uint64_t orphans = 0;          // of them, not in the namespace
  uint64_t removed = 0;          // orphans whose chunks on that target are gone now
  uint64_t unknown = 0;          // inode numbers this server never handed out (left alone)
  std::vector<std::string> errors;
  PENSTOCK_FIELDS(targets, targets_failed, inodes, orphans, removed, unknown, errors);
};

// What the meta server handled since it started, per method (`penstock stats`): by name, methods
// never called left out.
struct ServerStatsResp {
  uint64_t uptime_ms = 0;
  std::vector<MethodStats> methods;
  uint64_t instance = 0;  // this run of penstock-meta (RpcServer::instance)
  PENSTOCK_FIELDS(uptime_ms, methods, instance);
};

// ---- exactly-once changes (a reply cache the meta server keeps on disk) ----
// A change sent as Replay carries its session, a reply slot and a sequence number. The meta server
// writes the change's reply into the change's own write batch, keyed by (session, slot), so a
// change is applied at most once however often its request comes: a repeat of the slot's last
// sequence number gets the stored reply (also after a restart of penstock-meta), a higher one runs
// as a new change, a lower one is kInvalid. A mount whose change lost its connection on the way
// (penstock-meta restarting) sends it again with the same slot and number until its deadline.
// `method`: the change's own method id (one of the kinds below), `message`: its encoded request;
// the response's `message` is the change's encoded response, its errors the change's errors
// (never stored: an error applies nothing). A slot holds one change at a time; slots are
// 0..kReplySlots-1. kBadHandle for an unknown or expired session, kNotSupported for a method that
// is not a change (server/meta/meta_server.cc lists them).
inline constexpr uint32_t kReplySlots = 64;
struct ReplayReq {
  SessionId session; uint32_t slot = 0; uint64_t seq = 0; uint16_t method = 0; std::string message;
  PENSTOCK_FIELDS(session, slot, seq, method, message);
};
struct ReplayResp { std::string message; PENSTOCK_FIELDS(message); };

using ServiceId = ::penstock::proto::ServiceId;
PENSTOCK_METHOD(RegisterSession, ServiceId::kMeta, 1, RegisterSessionReq, RegisterSessionResp);
PENSTOCK_METHOD(Heartbeat, ServiceId::kMeta, 2, SessionReq, HeartbeatResp);
PENSTOCK_METHOD(CloseSession, ServiceId::kMeta, 3, SessionReq, Empty);
PENSTOCK_METHOD(Lookup, ServiceId::kMeta, 10, LookupReq, AttrResp);
PENSTOCK_METHOD(GetAttr, ServiceId::kMeta, 11, InodeReq, AttrResp);
PENSTOCK_METHOD(SetAttr, ServiceId::kMeta, 12, SetAttrReq, AttrResp);
PENSTOCK_METHOD(Create, ServiceId::kMeta, 13, CreateReq, AttrResp);
PENSTOCK_METHOD(Mknod, ServiceId::kMeta, 14, MknodReq, AttrResp);
PENSTOCK_METHOD(Mkdir, ServiceId::kMeta, 15, MkdirReq, AttrResp);
PENSTOCK_METHOD(Unlink, ServiceId::kMeta, 16, NameReq, UnlinkResp);
PENSTOCK_METHOD(Rmdir, ServiceId::kMeta, 17, NameReq, DirsResp);
PENSTOCK_METHOD(Rename, ServiceId::kMeta, 18, RenameReq, DirsResp);
PENSTOCK_METHOD(Link, ServiceId::kMeta, 19, LinkReq, AttrResp);
PENSTOCK_METHOD(Symlink, ServiceId::kMeta, 20, SymlinkReq, AttrResp);
PENSTOCK_METHOD(Readlink, ServiceId::kMeta, 21, InodeReq, ReadlinkResp);
PENSTOCK_METHOD(ReadDir, ServiceId::kMeta, 22, ReadDirReq, ReadDirResp);
PENSTOCK_METHOD(StatFs, ServiceId::kMeta, 23, Empty, StatFsResp);
PENSTOCK_METHOD(LookupOpen, ServiceId::kMeta, 24, LookupReq, LookupOpenResp);
PENSTOCK_METHOD(GetXattr, ServiceId::kMeta, 30, GetXattrReq, GetXattrResp);
PENSTOCK_METHOD(SetXattr, ServiceId::kMeta, 31, SetXattrReq, Empty);
PENSTOCK_METHOD(ListXattr, ServiceId::kMeta, 32, InodeReq, ListXattrResp);
PENSTOCK_METHOD(RemoveXattr, ServiceId::kMeta, 33, GetXattrReq, Empty);
PENSTOCK_METHOD(Open, ServiceId::kMeta, 40, OpenReq, AttrResp);
PENSTOCK_METHOD(Release, ServiceId::kMeta, 41, ReleaseReq, Empty);
PENSTOCK_METHOD(ReleaseMany, ServiceId::kMeta, 43, ReleaseManyReq, Empty);
PENSTOCK_METHOD(ReportSize, ServiceId::kMeta, 42, ReportSizeReq, AttrResp);
PENSTOCK_METHOD(ReportSizeAtClose, ServiceId::kMeta, 44, ReportSizeReq, AttrResp);
PENSTOCK_METHOD(SyncLog, ServiceId::kMeta, 45, Empty, Empty);
PENSTOCK_METHOD(DropCaches, ServiceId::kMeta, 46, Empty, DropCachesResp);
PENSTOCK_METHOD(Scrub, ServiceId::kMeta, 47, ScrubReq, ScrubResp);
PENSTOCK_METHOD(ReclaimOpens, ServiceId::kMeta, 48, ReclaimOpensReq, Empty);
PENSTOCK_METHOD(ServerStats, ServiceId::kMeta, 49, Empty, ServerStatsResp);
PENSTOCK_METHOD(GetLayout, ServiceId::kMeta, 50, InodeReq, LayoutResp);
PENSTOCK_METHOD(SetLayout, ServiceId::kMeta, 51, SetLayoutReq, Empty);
PENSTOCK_METHOD(GetClusterMap, ServiceId::kMeta, 60, Empty, ClusterMapResp);
PENSTOCK_METHOD(RegisterNode, ServiceId::kMeta, 61, RegisterNodeReq, RegisterNodeResp);
PENSTOCK_METHOD(NodeHeartbeat, ServiceId::kMeta, 62, NodeHeartbeatReq, HeartbeatResp);
PENSTOCK_METHOD(DirLease, ServiceId::kMeta, 70, DirLeaseReq, DirLeaseResp);
PENSTOCK_METHOD(CreateBatch, ServiceId::kMeta, 71, CreateBatchReq, CreateBatchResp);
// Replay carries the changes that may run on the worker pool; ReplayWaiting those that may wait
// out other mounts' leases (rmdir, rename), on the waiting pool; ReplayInline those answered on
// penstock-meta's I/O thread (a close's size report), where a repeat that finds the slot's first
// send still running is told kUnavailable at once instead of waiting for it (send it again).
PENSTOCK_METHOD(Replay, ServiceId::kMeta, 80, ReplayReq, ReplayResp);
PENSTOCK_METHOD(ReplayWaiting, ServiceId::kMeta, 81, ReplayReq, ReplayResp);
PENSTOCK_METHOD(ReplayInline, ServiceId::kMeta, 82, ReplayReq, ReplayResp);

// The changes a Replay carries, for both sides: the mount sends them so, penstock-meta accepts
// them so (server/meta/meta_server.cc). Those that may wait out other mounts' leases go as
// ReplayWaiting, a close's size report (answered on the I/O thread, not synced) as ReplayInline.
// Opens and releases are not among them (docs/architecture.md, "Exactly-once changes", says why).
template <class M>
inline constexpr bool kReplayWaits = std::is_same_v<M, Rmdir> || std::is_same_v<M, Rename>;
template <class M>
inline constexpr bool kReplayInline = std::is_same_v<M, ReportSizeAtClose>;
template <class M>
inline constexpr bool kReplayed =
    kReplayWaits<M> || kReplayInline<M> || std::is_same_v<M, SetAttr> || std::is_same_v<M, Create> || std::is_same_v<M, Mknod> ||
    std::is_same_v<M, Mkdir> || std::is_same_v<M, Unlink> || std::is_same_v<M, Link> || std::is_same_v<M, Symlink> ||
    std::is_same_v<M, SetXattr> || std::is_same_v<M, RemoveXattr> || std::is_same_v<M, ReportSize> ||
    std::is_same_v<M, SetLayout>;

}  // namespace penstock::proto::meta
