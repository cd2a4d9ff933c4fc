#include "client/fuse/fuse_ops.h"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "client/fuse/errno_map.h"
#include "client/fuse/fuse_ring.h"
#include "client/fuse/mount_options.h"
#include "client/lib/layout_text.h"
#include "common/base/log.h"

namespace penstock::fuse {
namespace {

namespace meta = proto::meta;
using client::Client;

// ---- The consistency contract, in one place (DESIGN.md, "Consistency contract") ----
// Namespace operations are immediately visible to all clients: the kernel may not reuse the dentry
// of a file without asking us again, and never caches "no such name" (no negative dentries).
constexpr double kEntryTimeout = 0.0;
constexpr double kNegativeTimeout = 0.0;
// A directory's dentry is the exception: the meta server leases its name to this mount for a
// second (Client::lookup_entry), and an rmdir or rename of it by another mount waits until that
// lease has run out, so reusing it cannot show a removed or moved directory. It saves the
// revalidating LOOKUP of every directory on every path walked, 2 of the 7 FUSE requests of a
// create in a shared directory.
constexpr bool kLeaseDirectoryEntries = true;
// Attributes may be reused for one second, but only by inodes the kernel has already resolved:
// every path lookup of a file asks the meta server again (kEntryTimeout 0), and its reply refreshes
// the attributes, so open() and stat() of a file by path always see what another host did
// (close-to-open, size authority at the meta server). What the timeout saves is the GETATTR of
// every permission check on each directory of a path, of every fstat() and of each read near the
// end of a file: 6 of the 12 FUSE requests of an open/read/close of a small file. The price:
// fstat() on a descriptor that is already open, or stat() of a directory whose name is leased, may
// show another host's change up to a second late (as with NFS's attribute cache).
constexpr double kAttrTimeout = 1.0;
// Close-to-open: the kernel keeps a file's page cache at open (keep_cache) only when the file's
// generation (bumped by the meta server on every size/data report and truncate) and mtime are
// those of this mount's previous open of it; otherwise the cache is dropped, so an open after
// another host's close() reads that host's bytes. The client library's cache follows the same
// generation (Client::open). (The writeback cache stays off: see op_init.)
constexpr bool kKeepCacheWhenUnchanged = true;

// A descriptor opened read-only gets no FLUSH at close (FOPEN_NOFLUSH): it buffered no write whose
// error close() must report, and locks are the kernel's own (no lock ops here). Its RELEASE does
// not flush either, so a write error stays for the writer's own close. One FUSE round trip fewer
// per small-file read (open, read, close).
constexpr bool kNoFlushForReadOnly = true;

constexpr uint32_t kMaxWrite = 1u << 20;

// An open regular file. Immutable after open except the size hint and a pending layout.
struct FileHandle {
  InodeId ino;
  // A file created behind (client/lib/create_behind.h) has no chains until the meta server has
  // applied its create: layout_of() fetches them at its first read, write or fsync, under
  // layout_mu; layout is read without it once layout_pending is false.
  proto::Layout layout;
  std::atomic<bool> layout_pending{false};
  std::mutex layout_mu;
  std::atomic<uint64_t> size_hint{0};  // the size known at open (or after our own truncate)
  // Client::truncates() when the size hint was taken: after a truncate through another handle or a
  // path of this mount the hint may lie past the end (size_hint_for_read).
  std::atomic<uint64_t> hint_truncates{0};
  bool keep_cache = false;             // the kernel may keep its pages (see kKeepCacheWhenUnchanged)
  // The file's version at this open, and whether a request on the handle has told the client that
  // the open completed (note_open_completed), for an open that had the kernel drop its pages.
  uint64_t generation = 0;
  int64_t mtime_ns = 0;
  std::atomic<bool> completion_noted{false};
  bool writable = true;                // opened for writing: its close flushes (kNoFlushForReadOnly)
  client::WriteCursor write_cursor;    // this handle's place in the file's write errors
  std::unique_ptr<client::ReadContext> read_ctx;  // cache generation and read-ahead streams
};

// An open directory: FUSE offsets of the last batch of entries handed to the kernel, mapped to the
// entry names that continue a ReadDir after them.
struct DirHandle {
  InodeId ino;
  std::mutex mu;                                  // leaf lock; never held across RPC or reply
  std::unordered_map<off_t, std::string> cursor;  // guarded by mu
};

MountState& state_of(fuse_req_t req) { return *static_cast<MountState*>(fuse_req_userdata(req)); }
Client& client_of(fuse_req_t req) { return *state_of(req).client; }

FileHandle* file_of(const fuse_file_info* fi) { return reinterpret_cast<FileHandle*>(fi->fh); }
DirHandle* dir_of(const fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(fi->fh); }

// A request on `fh` shows that its open completed in the kernel, which dropped the file's pages
// then if the open asked it to (keep_cache off): opens of that version may now keep them.
void note_open_completed(fuse_req_t req, FileHandle* fh) {
  if (fh->keep_cache || fh->completion_noted.load(std::memory_order_relaxed) || fh->completion_noted.exchange(true)) {
    return;
  }
  client_of(req).note_open_completed(fh->ino, fh->generation, fh->mtime_ns);
}

// The handle's layout, fetched first for a file created behind.
Result<const proto::Layout*> layout_of(fuse_req_t req, FileHandle* fh) {
  if (!fh->layout_pending.load(std::memory_order_acquire)) return &fh->layout;
  std::lock_guard lock(fh->layout_mu);
  if (fh->layout_pending.load(std::memory_order_relaxed)) {
    PENSTOCK_ASSIGN_OR_RETURN(proto::Layout l, client_of(req).created_layout(fh->ino));
    fh->layout = std::move(l);
    fh->layout_pending.store(false, std::memory_order_release);
  }
  return &fh->layout;
}

proto::Caller caller_of(fuse_req_t req) {
  const fuse_ctx* ctx = fuse_req_ctx(req);
  return proto::Caller{static_cast<uint32_t>(ctx->uid), static_cast<uint32_t>(ctx->gid)};
}

// The thread the kernel sends this request for (its pid field holds the task's id): a LOOKUP and
// the OPEN of one open() come from the same one (Client::lookup_entry, open tickets).
uint64_t caller_thread(fuse_req_t req) { return static_cast<uint64_t>(fuse_req_ctx(req)->pid); }

// The ONE place where a Status becomes an errno: it sends the reply (ok sends "success, no data").
void reply_status(fuse_req_t req, const Status& st, const char* op, fuse_ino_t ino) {
  const int err = errno_of(st.code());
  if (err != 0) {
    switch (st.code()) {
      case Code::kNotFound:
      case Code::kExists:
      case Code::kNoData:
      case Code::kRange:
      case Code::kNotEmpty:
        PENSTOCK_LOG(Debug) << op << " inode " << ino << ": " << st.to_string();
        break;
      case Code::kUnavailable:
        PENSTOCK_LOG(Warn) << op << " inode " << ino << " fails with EIO because a server is unreachable: "
                           << st.to_string();
        break;
      default:
        PENSTOCK_LOG(Info) << op << " inode " << ino << " fails with errno " << err << ": " << st.to_string();
    }
  }
  fuse_reply_err(req, err);
}

timespec to_timespec(int64_t ns) {
  timespec ts{};
  int64_t sec = ns / 1'000'000'000;
  int64_t rem = ns % 1'000'000'000;
  if (rem < 0) {
    rem += 1'000'000'000;
    --sec;
  }
  ts.tv_sec = static_cast<time_t>(sec);
  ts.tv_nsec = static_cast<long>(rem);
  return ts;
}

int64_t to_ns(const timespec& ts) { return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec; }

struct stat to_stat(const proto::InodeAttr& a) {
  struct stat st {};
  st.st_ino = a.ino.value;
  st.st_mode = a.mode;
  st.st_nlink = a.nlink;
  st.st_uid = a.uid;
  st.st_gid = a.gid;
  st.st_rdev = a.rdev;
  st.st_size = static_cast<off_t>(a.size);
  // Large preferred I/O size: cp and friends size their buffers from it (a full FUSE write).
  st.st_blksize = kMaxWrite;
  st.st_blocks = static_cast<blkcnt_t>((a.size + 511) / 512);
  st.st_atim = to_timespec(a.atime_ns);
  st.st_mtim = to_timespec(a.mtime_ns);
  st.st_ctim = to_timespec(a.ctime_ns);
  return st;
}

fuse_entry_param to_entry(const proto::InodeAttr& a) {
  fuse_entry_param e{};
  e.ino = a.ino.value;
  e.generation = 0;  // inode numbers are never reused by the meta server
  e.attr = to_stat(a);
  e.attr_timeout = kAttrTimeout;
  e.entry_timeout = kEntryTimeout;
  return e;
}

void reply_entry(fuse_req_t req, const Result<proto::InodeAttr>& r, const char* op, fuse_ino_t ino) {
  if (!r.has_value()) return reply_status(req, r.error(), op, ino);
  fuse_entry_param e = to_entry(*r);
  fuse_reply_entry(req, &e);
}

void reply_attr(fuse_req_t req, const Result<proto::InodeAttr>& r, const char* op, fuse_ino_t ino) {
  if (!r.has_value()) return reply_status(req, r.error(), op, ino);
  struct stat st = to_stat(*r);
  fuse_reply_attr(req, &st, kAttrTimeout);
}

// getxattr/listxattr size semantics: size 0 asks for the length; a smaller buffer is ERANGE.
void reply_xattr_bytes(fuse_req_t req, const std::string& value, size_t size, const char* op, fuse_ino_t ino) {
  if (size == 0) {
    fuse_reply_xattr(req, value.size());
  } else if (size < value.size()) {
    reply_status(req, Status(Code::kRange, "value of " + std::to_string(value.size()) +
                                               " bytes does not fit a buffer of " + std::to_string(size)),
                 op, ino);
  } else {
    fuse_reply_buf(req, value.data(), value.size());
  }
}

// The mount's counters (user.penstock.stats, and the log line at unmount). A new level (how much
// there is now, not how often) goes into client::is_level_counter() too.
std::vector<client::Counter> mount_counters(const MountState& state) {
  const Client& c = *state.client;
  const WorkerPoolStats workers = state.fuse_workers.load();
  const client::CacheStats cache = c.cache_stats();
  const client::OpenTicketStats tickets = c.open_ticket_stats();
  const client::CreateBehindStats cb = c.create_behind_stats();
  return {{"cache_hits", cache.hits},
          {"cache_joined_fetches", cache.waits},
          {"reads_answered_where_their_block_arrived", c.deferred_reads()},
          {"cache_misses", cache.misses},
          {"cache_evictions", cache.evictions},
          {"cache_bytes", cache.used_bytes},
          {"cache_blocks", cache.blocks},
          {"open_tickets_granted", tickets.granted},
          {"open_tickets_taken", tickets.taken},
          {"open_tickets_released_unused", tickets.dropped},
          {"dir_leases_granted", cb.leases},
          {"lookups_answered_by_dir_lease", cb.absent},
          {"creates_behind", cb.created},
          {"create_batches", cb.batches},
          {"creates_behind_refused", cb.failed},
          {"dir_lease_turns", cb.turned},
          {"fuse_places", static_cast<uint64_t>(state.fuse_places.load(std::memory_order_relaxed))},
          {"fuse_threads_started", workers.threads},
          {"fuse_places_handed_on_unanswered", workers.stalls},
          {"fuse_places_handed_on_long_wait", workers.long_waits}};
}

// libfuse reads a request into a pipe only when the pipe holds a whole one: max_write plus its
// header room (FUSE_BUFFER_HEADER_SIZE); otherwise it quietly reads every request into memory.
constexpr size_t kFuseHeaderRoom = 0x1000;

// Whether this process can grow a pipe to `bytes` (past /proc/sys/fs/pipe-max-size only with
// CAP_SYS_RESOURCE), as libfuse will try for each thread's splice pipe.
bool pipe_can_hold(size_t bytes, std::string* why_not) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    *why_not = std::string("pipe2: ") + std::strerror(errno);
    return false;
  }
  const bool ok = fcntl(fds[0], F_SETPIPE_SZ, static_cast<int>(bytes)) >= 0;
  if (!ok) *why_not = "a pipe cannot grow to " + std::to_string(bytes) + " bytes (" + std::strerror(errno) + ")";
  close(fds[0]);
  close(fds[1]);
  return ok;
}

// ---- ops ----

void op_init(void* userdata, fuse_conn_info* conn) {
  auto* mount = static_cast<MountState*>(userdata);
  if (mount->direct_writes && !direct_writes_supported(conn->proto_minor)) {
    mount->direct_writes = false;
    PENSTOCK_LOG(Info) << "direct_writes ignored, write-only opens use the page cache: this kernel's FUSE "
                       << conn->proto_major << "." << conn->proto_minor
                       << " does not drop cached pages on a direct write (7." << kMinorDirectWriteDropsCache
                       << ", Linux 6.6, does)";
  }
  auto want_if_offered = [conn](unsigned cap) {
    if ((conn->capable & cap) != 0) conn->want |= cap;
  };
  want_if_offered(FUSE_CAP_ASYNC_READ);
  want_if_offered(FUSE_CAP_PARALLEL_DIROPS);
  want_if_offered(FUSE_CAP_READDIRPLUS);
  want_if_offered(FUSE_CAP_READDIRPLUS_AUTO);
  // SPLICE_READ only with --splice-writes: a read() of /dev/fuse copies a WRITE's data from the
  // writer's page-cache pages into libfuse's buffer, and write-behind copies it again into its
  // own; spliced, the kernel puts those pages into libfuse's pipe by reference and write_buf reads
  // them straight into the write-behind buffer (op_write_buf), one copy fewer per byte written.
  // But every other request then costs a splice and a read of the pipe instead of one read.
  // SPLICE_WRITE/MOVE would only help replies from file descriptors, and ours come from memory.
  // No AUTO_INVAL_DATA: it makes the kernel fetch the attributes before every read() call (one meta
  // round trip per read); close-to-open needs the check only at open, which op_open does with the
  // file's generation (keep_cache). Reads past the cached size still fetch the attributes.
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE | FUSE_CAP_AUTO_INVAL_DATA);
  if (mount->splice_writes) {
    std::string why_not;
    if ((conn->capable & FUSE_CAP_SPLICE_READ) == 0) {
      why_not = "the kernel does not offer SPLICE_READ";
    } else if (!pipe_can_hold(kMaxWrite + kFuseHeaderRoom, &why_not)) {
      why_not += "; raise /proc/sys/fs/pipe-max-size to at least " + std::to_string(2 * kMaxWrite) +
                 " or give penstock-mount CAP_SYS_RESOURCE";
    }
    if (why_not.empty()) {
      conn->want |= FUSE_CAP_SPLICE_READ;
    } else {
      mount->splice_writes = false;
      PENSTOCK_LOG(Info) << "write data is read from /dev/fuse and copied, not spliced: " << why_not;
    }
  }
  // The writeback cache would keep written bytes (and the size) in this kernel past close():
  // close-to-open and "write errors at fsync/close" need every write to reach us. O_TRUNC comes
  // as setattr(size) so one path truncates. The kernel clears suid/sgid on write itself.
  conn->want &= ~(FUSE_CAP_WRITEBACK_CACHE | FUSE_CAP_ATOMIC_O_TRUNC | FUSE_CAP_HANDLE_KILLPRIV);
  conn->max_write = kMaxWrite;
  // Read-ahead and async reads are "background" requests: the kernel keeps at most 12 in flight by
  // default and starts dropping read-ahead at 9, which is too few for several sequential readers
  // each with a 1 MiB window. (Unprivileged mounts are capped by /proc/sys/fs/fuse/max_user_bgreq.)
  conn->max_background = 64;
  conn->congestion_threshold = 48;
  // conn->max_readahead stays what the kernel offered (libfuse clamps it to that, and the kernel
  // sets the mount's read-ahead to the smaller of the two): the offer is the 128 KiB bdi default,
  // so penstock-mount raises the bdi's read_ahead_kb itself once this INIT has been answered
  // (main.cc, kernel_readahead).
  PENSTOCK_LOG(Info) << "FUSE protocol " << conn->proto_major << "." << conn->proto_minor
                     << ", kernel offers 0x" << std::hex << conn->capable << ", agreed 0x" << conn->want
                     << std::dec << " (async_read " << ((conn->want & FUSE_CAP_ASYNC_READ) != 0)
                     << ", parallel_dirops " << ((conn->want & FUSE_CAP_PARALLEL_DIROPS) != 0)
                     << ", readdirplus " << ((conn->want & FUSE_CAP_READDIRPLUS) != 0)
                     << ", splice " << ((conn->want & FUSE_CAP_SPLICE_READ) != 0)
                     << ", auto_inval_data " << ((conn->want & FUSE_CAP_AUTO_INVAL_DATA) != 0)
                     << ", writeback_cache 0), max_write " << conn->max_write << ", max_read "
                     << conn->max_read << ", max_readahead " << conn->max_readahead
                     << ", max_background " << conn->max_background
                     << ", write-only opens " << (mount->direct_io || mount->direct_writes ? "direct" : "cached");
}

void op_destroy(void* userdata) {
  auto* state = static_cast<MountState*>(userdata);
  PENSTOCK_LOG(Info) << "FUSE session ends; closing the meta session";
  std::string counters;
  for (const client::Counter& c : mount_counters(*state)) {
    counters += (counters.empty() ? "" : ", ") + std::string(c.name) + " " + std::to_string(c.value);
  }
  PENSTOCK_LOG(Info) << "counters at unmount (user.penstock.stats): " << counters;
  state->client->shutdown();
}

void op_lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  auto r = client_of(req).lookup_entry(InodeId(parent), name, caller_thread(req));
  if (!r.has_value()) {
    if (r.error().code() == Code::kNotFound && kNegativeTimeout > 0) {
      fuse_entry_param e{};
      e.ino = 0;  // a negative entry
      e.entry_timeout = kNegativeTimeout;
      fuse_reply_entry(req, &e);
      return;
    }
    return reply_status(req, r.error(), "lookup", parent);
  }
  fuse_entry_param e = to_entry(r->attr);
  if (kLeaseDirectoryEntries && S_ISDIR(e.attr.st_mode)) e.entry_timeout = r->trust_s;
  Client& c = client_of(req);  // req is gone after the reply
  fuse_reply_entry(req, &e);
  // The open that took the ticket comes next: a small file's block is on its way from now, sent
  // after the answer so the kernel's OPEN and this send run side by side.
  if (r->opened) c.prefetch_small_file(r->attr.ino, O_RDONLY);
}

// We keep no per-inode state the kernel's lookup count protects: nothing to drop.
void op_forget(fuse_req_t req, fuse_ino_t, uint64_t) { fuse_reply_none(req); }
void op_forget_multi(fuse_req_t req, size_t, fuse_forget_data*) { fuse_reply_none(req); }

void op_getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  // A directory's attributes known from a recent reply (client/lib/dir_attr_cache.h): the kernel
  // asks again for every permission check after each create in the directory dropped them.
  if (auto hit = client_of(req).cached_dir_attr(InodeId(ino))) {
    struct stat st = to_stat(hit->attr);
    fuse_reply_attr(req, &st, std::min(kAttrTimeout, hit->left_s));
    return;
  }
  reply_attr(req, client_of(req).getattr(InodeId(ino)), "getattr", ino);
}

void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  Client& c = client_of(req);
  const proto::Caller caller = caller_of(req);
  std::optional<proto::InodeAttr> result;
  if ((to_set & FUSE_SET_ATTR_SIZE) != 0) {
    auto r = c.truncate(InodeId(ino), static_cast<uint64_t>(attr->st_size), caller);
    if (!r.has_value()) return reply_status(req, r.error(), "truncate", ino);
    if (fi != nullptr && fi->fh != 0) file_of(fi)->size_hint.store(r->size);
    result = std::move(r).value();
  }
  meta::SetAttrReq sa;
  sa.ino = InodeId(ino);
  sa.caller = caller;
  if ((to_set & FUSE_SET_ATTR_MODE) != 0) {
    sa.valid |= meta::kSetMode;
    sa.mode = attr->st_mode;
  }
  if ((to_set & FUSE_SET_ATTR_UID) != 0) {
    sa.valid |= meta::kSetUid;
    sa.uid = attr->st_uid;
  }
  if ((to_set & FUSE_SET_ATTR_GID) != 0) {
    sa.valid |= meta::kSetGid;
    sa.gid = attr->st_gid;
  }
  // The kernel sets ATIME together with ATIME_NOW for "now" (utimensat UTIME_NOW, touch).
  if ((to_set & FUSE_SET_ATTR_ATIME_NOW) != 0) {
    sa.valid |= meta::kSetAtimeNow;
  } else if ((to_set & FUSE_SET_ATTR_ATIME) != 0) {
    sa.valid |= meta::kSetAtime;
    sa.atime_ns = to_ns(attr->st_atim);
  }
  if ((to_set & FUSE_SET_ATTR_MTIME_NOW) != 0) {
    sa.valid |= meta::kSetMtimeNow;
  } else if ((to_set & FUSE_SET_ATTR_MTIME) != 0) {
    sa.valid |= meta::kSetMtime;
    sa.mtime_ns = to_ns(attr->st_mtim);
  }
  if (sa.valid != 0) {
    auto r = c.setattr(sa);
    if (!r.has_value()) return reply_status(req, r.error(), "setattr", ino);
    result = std::move(r).value();
  }
  if (!result) {
    // Only bits the meta server derives itself (ctime): report the current attributes.
    return reply_attr(req, c.getattr(InodeId(ino)), "setattr", ino);
  }
  struct stat st = to_stat(*result);
  fuse_reply_attr(req, &st, kAttrTimeout);
}

void op_readlink(fuse_req_t req, fuse_ino_t ino) {
  auto r = client_of(req).readlink(InodeId(ino));
  if (!r.has_value()) return reply_status(req, r.error(), "readlink", ino);
  fuse_reply_readlink(req, r->c_str());
}

void op_mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  reply_entry(req, client_of(req).mknod(InodeId(parent), name, mode, rdev, caller_of(req)), "mknod", parent);
}

void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  reply_entry(req, client_of(req).mkdir(InodeId(parent), name, mode, caller_of(req)), "mkdir", parent);
}

void op_unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  reply_status(req, client_of(req).unlink(InodeId(parent), name), "unlink", parent);
}

// An rmdir or rename whose outcome is unknown (the reply was lost) may have been applied without
// waiting for this mount's entry leases, and on such an error the kernel keeps its dentries: drop
// them once the reply has reached the kernel (before it, the kernel holds the directory's lock and
// waits for us; on a FUSE ring thread the reply goes out only after the op returns), from the
// notifier thread (the lock may be held by callers whose requests wait for a free thread):
// after_reply.
// `se` is read before the reply, which frees req.
void forget_entries_if_unknown(fuse_session* se, const Status& st,
                               std::initializer_list<std::pair<fuse_ino_t, std::string>> names) {
  if (!failed_in_transit(st.code()) || se == nullptr) return;
  after_reply([se, entries = std::vector<std::pair<fuse_ino_t, std::string>>(names)] {
    for (const auto& [parent, name] : entries) {
      const int rc = fuse_lowlevel_notify_inval_entry(se, parent, name.c_str(), name.size());
      if (rc != 0 && rc != -ENOENT) {
        PENSTOCK_LOG(Warn) << "cannot drop the kernel's entry " << name << " in directory " << parent << ": "
                           << std::strerror(-rc);
      }
    }
  });
}

void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  const Status st = client_of(req).rmdir(InodeId(parent), name);
  const std::string kept = name;  // req (and with it name) is gone after the reply
  fuse_session* se = state_of(req).session;
  reply_status(req, st, "rmdir", parent);
  forget_entries_if_unknown(se, st, {{parent, kept}});
}

void op_symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  reply_entry(req, client_of(req).symlink(InodeId(parent), name, link, caller_of(req)), "symlink", parent);
}

void op_rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
               unsigned int flags) {
  uint32_t wire = 0;
  if ((flags & RENAME_NOREPLACE) != 0) wire |= meta::kRenameNoReplace;
  if ((flags & RENAME_EXCHANGE) != 0) wire |= meta::kRenameExchange;
  if ((flags & ~static_cast<unsigned>(RENAME_NOREPLACE | RENAME_EXCHANGE)) != 0 ||
      wire == (meta::kRenameNoReplace | meta::kRenameExchange)) {
    return reply_status(req, Status(Code::kInvalid, "rename flags 0x" + std::to_string(flags) +
                                                        " are not supported (NOREPLACE or EXCHANGE only)"),
                        "rename", parent);
  }
  const Status st = client_of(req).rename(InodeId(parent), name, InodeId(newparent), newname, wire);
  const std::string kept_name = name, kept_newname = newname;  // gone with req after the reply
  fuse_session* se = state_of(req).session;
  reply_status(req, st, "rename", parent);
  forget_entries_if_unknown(se, st, {{parent, kept_name}, {newparent, kept_newname}});
}

void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  reply_entry(req, client_of(req).link(InodeId(ino), InodeId(newparent), newname), "link", ino);
}

// Hands a new handle to the kernel; if the request was interrupted meanwhile the kernel will never
// release it, so we do.
void reply_open_handle(fuse_req_t req, fuse_file_info* fi, std::unique_ptr<FileHandle> fh, const fuse_entry_param* e) {
  FileHandle* raw = fh.release();
  fi->fh = reinterpret_cast<uint64_t>(raw);
  fi->keep_cache = (kKeepCacheWhenUnchanged && raw->keep_cache) ? 1 : 0;
  // With -o direct_writes a write-only open bypasses the page cache too: the writer's bytes come
  // to us from its own buffer, one copy and no page-cache pages fewer. Other descriptors of the
  // file may still cache (a reader opened before, a mapping), so op_init keeps this only where the
  // kernel keeps them right itself (direct_writes_supported, mount_options.h). Doing that from here
  // instead (notify_inval_inode inside WRITE) would wait on page locks held for READs this daemon
  // has yet to answer, and would come after a dirty page's writeback could land.
  const MountState* mount = &state_of(req);
  fi->direct_io = (mount->direct_io || (mount->direct_writes && (fi->flags & O_ACCMODE) == O_WRONLY)) ? 1 : 0;
  raw->writable = !kNoFlushForReadOnly || (fi->flags & O_ACCMODE) != O_RDONLY;
  fi->noflush = raw->writable ? 0 : 1;
  // Every handle, read-only ones too: as on Linux, fsync of any descriptor reports a write error
  // that happened since it was opened (a read-only one only there: it gets no FLUSH).
  raw->write_cursor = client_of(req).write_cursor(raw->ino);
  const int rc = e != nullptr ? fuse_reply_create(req, e, fi) : fuse_reply_open(req, fi);
  if (rc != 0) {
    // It wrote nothing: no flush, which would also mark another handle's write error reported.
    Status st = client_of(req).release(raw->ino, /*flush_writes=*/false);
    if (!st.is_ok()) {
      PENSTOCK_LOG(Warn) << "release after an interrupted open: " << st.to_string();
    }
    delete raw;
  }
}

void op_open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Client& c = client_of(req);
  const uint64_t truncates = c.truncates();  // before the size is read
  bool unchanged = false;
  auto r = c.open(InodeId(ino), static_cast<uint32_t>(fi->flags), &unchanged, caller_thread(req));
  if (!r.has_value()) return reply_status(req, r.error(), "open", ino);
  auto fh = std::make_unique<FileHandle>();
  fh->ino = InodeId(ino);
  fh->layout = r->layout;
  fh->size_hint.store(r->size);
  fh->hint_truncates.store(truncates);
  fh->keep_cache = unchanged;
  fh->generation = r->generation;
  fh->mtime_ns = r->mtime_ns;
  fh->read_ctx = c.make_read_context(r->generation);
  reply_open_handle(req, fi, std::move(fh), nullptr);
}

void op_create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  const uint64_t truncates = client_of(req).truncates();
  auto r = client_of(req).create(InodeId(parent), name, mode, caller_of(req));
  if (!r.has_value()) return reply_status(req, create_error_for_open(r.error(), fi->flags), "create", parent);
  auto fh = std::make_unique<FileHandle>();
  fh->ino = r->ino;
  fh->layout = r->layout;
  fh->layout_pending.store(r->layout.chains.empty());  // created behind (every other file has chains)
  fh->size_hint.store(r->size);
  fh->hint_truncates.store(truncates);
  fh->generation = r->generation;  // the kernel drops a created file's pages too
  fh->mtime_ns = r->mtime_ns;
  fh->read_ctx = client_of(req).make_read_context(r->generation);
  fuse_entry_param e = to_entry(*r);
  reply_open_handle(req, fi, std::move(fh), &e);
}

// Replies a read's outcome: the pieces (cached blocks, scratch) as one buffer or an iovec.
void reply_read(fuse_req_t req, fuse_ino_t ino, const Result<size_t>& r, const client::ReadPieces& pieces) {
  if (!r.has_value()) return reply_status(req, r.error(), "read", ino);
  if (pieces.spans.size() <= 1) {
    const char* data = pieces.spans.empty() ? nullptr : reinterpret_cast<const char*>(pieces.spans[0].data());
    fuse_reply_buf(req, data, *r);
    return;
  }
  // A 1 MiB read spans at most two cache blocks (plus a partial one when unaligned).
  constexpr size_t kInline = 8;
  iovec inline_iov[kInline];
  std::vector<iovec> heap_iov;
  iovec* iov = inline_iov;
  if (pieces.spans.size() > kInline) {
    heap_iov.resize(pieces.spans.size());
    iov = heap_iov.data();
  }
  for (size_t i = 0; i < pieces.spans.size(); ++i) {
    iov[i].iov_base = const_cast<uint8_t*>(pieces.spans[i].data());
    iov[i].iov_len = pieces.spans[i].size();
  }
  fuse_reply_iov(req, iov, static_cast<int>(pieces.spans.size()));
}

// The size a read of `fh` may trust without asking the meta server. A truncate through another
// handle or a path of this mount (O_TRUNC) leaves the handle's hint past the new end, and a read
// under it would get zeros there instead of EOF (direct I/O: the kernel does not cut such reads at
// its size) and fetch read-ahead blocks past the end; so after one, the hint is fetched once more.
uint64_t size_hint_for_read(Client& c, FileHandle* fh) {
  const uint64_t truncates = c.truncates();
  if (fh->hint_truncates.load() == truncates) return fh->size_hint.load();
  auto attr = c.getattr(fh->ino);
  if (!attr.has_value()) return 0;  // read_pieces asks for the size itself
  fh->size_hint.store(attr->size);
  fh->hint_truncates.store(truncates);
  return attr->size;
}

void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  FileHandle* fh = file_of(fi);
  note_open_completed(req, fh);
  // Bytes the cache holds are replied straight from the cached blocks (an iovec the kernel copies
  // once); only bytes read directly land in this per-thread scratch buffer. `pieces` pins the
  // blocks until the reply has been written, and is emptied after it so no block stays pinned.
  thread_local std::vector<uint8_t> scratch;
  thread_local client::ReadPieces pieces;
  // On a FUSE ring thread the direct bytes land in the ring's reply buffer itself.
  uint8_t* direct_to = ring_reply_buffer(size);
  if (direct_to == nullptr) {
    if (scratch.size() < size) scratch.resize(size);
    direct_to = scratch.data();
  }
  auto layout = layout_of(req, fh);
  if (!layout.has_value()) return reply_status(req, layout.error(), "read", ino);
  // A read that would wait for a block in flight (a small file's fetch that its open started) is
  // answered by whoever completes the block, usually the I/O thread the data arrived on: this
  // thread goes back to the kernel at once instead of sleeping only to be woken to pass the bytes
  // on. Not on a ring thread, whose reply must go out before its op returns.
  auto* state = &state_of(req);
  const bool may_defer = !on_ring_thread() && state->late_replies.owe();
  client::ReadLater later;  // empty (no allocation) unless this read may be deferred
  if (may_defer) {
    later = [req, ino, state](Result<size_t> n, client::ReadPieces& got) {
      if (!state->late_replies.may_send()) return;
      reply_read(req, ino, n, got);
      state->late_replies.sent();
    };
  }
  auto r = state->client->read_pieces(fh->ino, **layout, size_hint_for_read(*state->client, fh), static_cast<uint64_t>(off),
                                      std::span<uint8_t>(direct_to, size), fh->read_ctx.get(), &pieces,
                                      may_defer ? &later : nullptr);
  if (!r.has_value() || !pieces.deferred) {
    if (may_defer) state->late_replies.answered_in_op();
    reply_read(req, ino, r, pieces);
  }
  pieces.clear();
}

// `spliced`: the bufvec whose pipe `src` reads; marked consumed once all of it was read, else
// libfuse would take the pipe as holding leftovers and replace it (a pipe2 and two closes a write).
void do_write(fuse_req_t req, fuse_ino_t ino, client::WriteSource& src, off_t off, fuse_file_info* fi,
              fuse_bufvec* spliced = nullptr) {
  FileHandle* fh = file_of(fi);
  auto layout = layout_of(req, fh);
  if (!layout.has_value()) return reply_status(req, layout.error(), "write", ino);
  Status st = client_of(req).write(fh->ino, **layout, static_cast<uint64_t>(off), src, &fh->write_cursor);
  if (spliced != nullptr && src.taken() == src.size()) spliced->idx = spliced->count;
  if (!st.is_ok()) return reply_status(req, st, "write", ino);
  fuse_reply_write(req, src.size());
}

void do_write(fuse_req_t req, fuse_ino_t ino, std::span<const uint8_t> data, off_t off, fuse_file_info* fi) {
  client::WriteSource src(data);
  do_write(req, ino, src, off, fi);
}

void op_write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off, fuse_file_info* fi) {
  do_write(req, ino, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(buf), size), off, fi);
}

void op_write_buf(fuse_req_t req, fuse_ino_t ino, fuse_bufvec* in, off_t off, fuse_file_info* fi) {
  const size_t size = fuse_buf_size(in);
  if (in->count == 1 && in->idx == 0 && in->off == 0) {
    const fuse_buf& b = in->buf[0];
    if ((b.flags & FUSE_BUF_IS_FD) == 0) {
      // The request's own memory: no copy here (write-behind copies once into its buffer).
      return do_write(req, ino, std::span<const uint8_t>(static_cast<const uint8_t*>(b.mem), size), off, fi);
    }
    if ((b.flags & FUSE_BUF_FD_SEEK) == 0) {
      // Spliced (SPLICE_READ): the data waits in libfuse's pipe; write-behind reads it into its buffer.
      client::WriteSource src(b.fd, size);
      return do_write(req, ino, src, off, fi, in);
    }
  }
  thread_local std::vector<uint8_t> buf;
  buf.resize(size);
  fuse_bufvec dst{};
  dst.count = 1;
  dst.buf[0].size = size;
  dst.buf[0].flags = static_cast<fuse_buf_flags>(0);
  dst.buf[0].mem = buf.data();
  dst.buf[0].fd = -1;
  const ssize_t n = fuse_buf_copy(&dst, in, static_cast<fuse_buf_copy_flags>(0));
  if (n < 0) {
    return reply_status(req, Status(Code::kIo, std::string("copying write data from the kernel: ") +
                                                   std::strerror(static_cast<int>(-n))),
                        "write", ino);
  }
  do_write(req, ino, std::span<const uint8_t>(buf.data(), static_cast<size_t>(n)), off, fi);
}

void op_flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  FileHandle* fh = file_of(fi);
  note_open_completed(req, fh);
  reply_status(req, client_of(req).flush(fh->ino, &fh->write_cursor), "flush", ino);
}

void op_fsync(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info* fi) {
  FileHandle* fh = file_of(fi);
  auto layout = layout_of(req, fh);
  if (!layout.has_value()) return reply_status(req, layout.error(), "fsync", ino);
  reply_status(req, client_of(req).fsync(fh->ino, **layout, &fh->write_cursor), "fsync", ino);
}

void op_release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  std::unique_ptr<FileHandle> fh(file_of(fi));
  Status st = client_of(req).release(fh->ino, fh->writable, &fh->write_cursor);
  fh.reset();
  reply_status(req, st, "release", ino);
}

void op_opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  auto dh = std::make_unique<DirHandle>();
  dh->ino = InodeId(ino);
  DirHandle* raw = dh.release();
  fi->fh = reinterpret_cast<uint64_t>(raw);
  if (fuse_reply_open(req, fi) != 0) delete raw;
}

void op_releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  delete dir_of(fi);
  reply_status(req, Status::ok(), "releasedir", ino);
}

// Creates and unlinks are acknowledged before the meta server's WAL sync (docs/meta-store.md
// "Durability"): fsyncdir waits for one that covers them.
void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int, fuse_file_info*) {
  reply_status(req, client_of(req).sync_namespace(), "fsyncdir", ino);
}

// Offsets: "." is 1, ".." is 2, the entries 3, 4, ... in name order. The kernel continues from the
// offset of the last entry it took; we map it back to that entry's name (the ReadDir cursor). An
// offset we do not know (an old telldir cookie) restarts the listing and skips that many entries.
void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  DirHandle* dh = dir_of(fi);
  Client& c = client_of(req);
  std::vector<char> out(size);
  size_t used = 0;
  std::vector<std::pair<off_t, std::string>> batch;

  auto add = [&](const char* name, const proto::InodeAttr* attr, uint64_t child, uint32_t mode, off_t entry_off) {
    size_t need;
    if (plus) {
      fuse_entry_param e{};
      if (attr != nullptr) {
        e = to_entry(*attr);
      } else {
        e.attr.st_ino = child;  // e.ino stays 0: the kernel adds no dentry and no lookup count
        e.attr.st_mode = mode;
      }
      need = fuse_add_direntry_plus(req, out.data() + used, size - used, name, &e, entry_off);
    } else {
      struct stat st {};
      st.st_ino = child;
      st.st_mode = mode;
      need = fuse_add_direntry(req, out.data() + used, size - used, name, &st, entry_off);
    }
    if (need > size - used) return false;
    used += need;
    return true;
  };

  off_t pos = off;
  bool full = false;
  if (pos == 0) {
    full = !add(".", nullptr, ino, S_IFDIR, 1);
    if (!full) pos = 1;
  }
  if (!full && pos == 1) {
    // The parent is not known here; the root stands in (d_ino of ".." is informational).
    full = !add("..", nullptr, FUSE_ROOT_ID, S_IFDIR, 2);
    if (!full) pos = 2;
  }
  std::string after;
  uint64_t skip = 0;
  if (!full && pos > 2) {
    std::lock_guard<std::mutex> lock(dh->mu);
    auto it = dh->cursor.find(pos);
    if (it != dh->cursor.end()) {
      after = it->second;
    } else {
      skip = static_cast<uint64_t>(pos - 2);
    }
  }
  const uint32_t page = static_cast<uint32_t>(std::clamp<size_t>(size / (plus ? 160 : 32), 8, 1024));
  while (!full) {
    auto r = c.readdir(InodeId(ino), after, skip > 0 ? std::max<uint32_t>(page, 1024) : page, plus);
    if (!r.has_value()) {
      if (used == 0) return reply_status(req, r.error(), plus ? "readdirplus" : "readdir", ino);
      break;  // hand over what we have; the next call meets the error again
    }
    for (const auto& e : r->entries) {
      after = e.name;
      if (e.name == "." || e.name == "..") continue;
      if (skip > 0) {
        --skip;
        continue;
      }
      const off_t next = pos + 1;
      if (!add(e.name.c_str(), e.attr ? &*e.attr : nullptr, e.ino.value, e.mode, next)) {
        full = true;
        break;
      }
      batch.emplace_back(next, e.name);
      pos = next;
    }
    if (full || r->eof || r->entries.empty()) break;
  }
  if (!batch.empty()) {
    std::lock_guard<std::mutex> lock(dh->mu);
    dh->cursor.clear();
    for (auto& [o, name] : batch) dh->cursor.emplace(o, std::move(name));
  }
  fuse_reply_buf(req, out.data(), used);
}

void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  do_readdir(req, ino, size, off, fi, false);
}

void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  do_readdir(req, ino, size, off, fi, true);
}

void op_statfs(fuse_req_t req, fuse_ino_t ino) {
  auto r = client_of(req).statfs();
  if (!r.has_value()) return reply_status(req, r.error(), "statfs", ino);
  struct statvfs sv {};
  const uint64_t bs = r->block_size != 0 ? r->block_size : 4096;
  sv.f_bsize = bs;
  sv.f_frsize = bs;
  sv.f_blocks = r->total_bytes / bs;
  sv.f_bfree = r->free_bytes / bs;
  sv.f_bavail = r->free_bytes / bs;
  sv.f_files = r->total_inodes;
  sv.f_ffree = r->total_inodes > r->used_inodes ? r->total_inodes - r->used_inodes : 0;
  sv.f_favail = sv.f_ffree;
  sv.f_namemax = r->max_name != 0 ? r->max_name : meta::kMaxNameBytes;
  fuse_reply_statfs(req, &sv);
}

void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  Client& c = client_of(req);
  const std::string v(value, size);
  if (name == client::kLayoutXattr) {
    return reply_status(req, c.set_layout_text(InodeId(ino), v), "setxattr layout", ino);
  }
  if (name == client::kStatsXattr) {
    return reply_status(req, Status(Code::kNotPermitted, "the stats xattr is read-only"), "setxattr stats", ino);
  }
  if (name == client::kDropCachesXattr) {
    // Cold caches slow every user of the cluster: root or whoever runs this mount only.
    const uid_t uid = fuse_req_ctx(req)->uid;
    if (uid != 0 && uid != ::getuid()) {
      return reply_status(req, Status(Code::kNotPermitted, "only root or the mount's owner may drop caches"),
                          "setxattr drop_caches", ino);
    }
    return reply_status(req, c.drop_caches(), "setxattr drop_caches", ino);
  }
  reply_status(req, c.setxattr(InodeId(ino), name, v, static_cast<uint32_t>(flags)), "setxattr", ino);
}

void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  Client& c = client_of(req);
  if (name == client::kDropCachesXattr) {
    return reply_status(req, Status(Code::kNoData, "drop_caches is an action, not a value"), "getxattr", ino);
  }
  if (name == client::kStatsXattr) {
    const std::vector<client::Counter> counters = mount_counters(state_of(req));
    if (size == 0) return (void)fuse_reply_xattr(req, client::max_counters_size(counters));
    return reply_xattr_bytes(req, client::format_counters(counters), size, "getxattr stats", ino);
  }
  if (name == client::kLayoutXattr) {
    auto r = c.get_layout(InodeId(ino));
    if (!r.has_value()) return reply_status(req, r.error(), "getxattr layout", ino);
    return reply_xattr_bytes(req, client::format_layout(*r), size, "getxattr layout", ino);
  }
  auto r = c.getxattr(InodeId(ino), name);
  if (!r.has_value()) return reply_status(req, r.error(), "getxattr", ino);
  reply_xattr_bytes(req, *r, size, "getxattr", ino);
}

void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  auto r = client_of(req).listxattr(InodeId(ino));
  if (!r.has_value()) return reply_status(req, r.error(), "listxattr", ino);
  std::string list;
  for (const auto& n : *r) {
    if (n == client::kLayoutXattr || n == client::kDropCachesXattr || n == client::kStatsXattr) continue;  // virtual
    list += n;
    list.push_back('\0');
  }
  reply_xattr_bytes(req, list, size, "listxattr", ino);
}

void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  if (name == client::kLayoutXattr) {
    return reply_status(req, Status(Code::kNotPermitted, "the layout xattr is virtual; set it instead"),
                        "removexattr", ino);
  }
  if (name == client::kStatsXattr) {
    return reply_status(req, Status(Code::kNotPermitted, "the stats xattr is virtual and read-only"), "removexattr",
                        ino);
  }
  reply_status(req, client_of(req).removexattr(InodeId(ino), name), "removexattr", ino);
}

fuse_lowlevel_ops make_ops() {
  fuse_lowlevel_ops ops{};
  ops.init = op_init;
  ops.destroy = op_destroy;
  ops.lookup = op_lookup;
  ops.forget = op_forget;
  ops.forget_multi = op_forget_multi;
  ops.getattr = op_getattr;
  ops.setattr = op_setattr;
  ops.readlink = op_readlink;
  ops.mknod = op_mknod;
  ops.mkdir = op_mkdir;
  ops.unlink = op_unlink;
  ops.rmdir = op_rmdir;
  ops.symlink = op_symlink;
  ops.rename = op_rename;
  ops.link = op_link;
  ops.open = op_open;
  ops.create = op_create;
  ops.read = op_read;
  ops.write = op_write;
  ops.write_buf = op_write_buf;
  ops.flush = op_flush;
  ops.release = op_release;
  ops.fsync = op_fsync;
  ops.opendir = op_opendir;
  ops.readdir = op_readdir;
  ops.readdirplus = op_readdirplus;
  ops.releasedir = op_releasedir;
  ops.fsyncdir = op_fsyncdir;
  ops.statfs = op_statfs;
  ops.setxattr = op_setxattr;
  ops.getxattr = op_getxattr;
  ops.listxattr = op_listxattr;
  ops.removexattr = op_removexattr;
  // access: left to the kernel (default_permissions).
  return ops;
}

}  // namespace

void apply_contract(client::ClientOptions* options) {
  options->dir_attr_max_age = std::chrono::milliseconds(static_cast<int64_t>(kAttrTimeout * 1000));
}

const fuse_lowlevel_ops& penstock_ops() {
  static const fuse_lowlevel_ops ops = make_ops();
  return ops;
}

}  // namespace penstock::fuse
