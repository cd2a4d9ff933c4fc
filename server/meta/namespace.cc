#include "server/meta/namespace.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <unordered_set>

#include "common/base/log.h"
#include "common/checksum/checksum.h"
#include "common/layout/layout.h"
#include "common/net/endpoint.h"
#include "server/daemon/daemon.h"

namespace penstock::meta {

using schema::DentryRecord;
using schema::InodeRecord;

int64_t system_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// The registered node or target with this uuid, or null. Maps are small (one entry per server or
// disk), so a scan is fine.
template <class Map>
const typename Map::mapped_type* find_by_uuid(const Map& map, const std::string& uuid) {
  for (const auto& [id, v] : map) {
    if (v.rec.uuid == uuid) return &v;
  }
  return nullptr;
}

constexpr uint32_t kMaxLinks = 65000;           // as ext4
constexpr uint32_t kDefaultReadDirEntries = 1024;
constexpr uint32_t kMaxReadDirEntries = 4096;
constexpr uint64_t kDirSize = 4096;             // what stat reports as a directory's size
constexpr uint32_t kMaxDirDepth = 1u << 16;     // bound of the ancestor walk (loop guard)
constexpr uint32_t kKnownSetAttrBits = pm::kSetMode | pm::kSetUid | pm::kSetGid | pm::kSetSize | pm::kSetAtime |
                                       pm::kSetMtime | pm::kSetAtimeNow | pm::kSetMtimeNow;

// The change this thread runs for MetaService::replay(), which commit_change() stores the reply of.
struct ReplyScope {
  SessionId session;
  uint32_t slot = 0;
  uint64_t seq = 0;
  uint16_t method = 0;
  uint64_t request_hash = 0;
};

// How long a repeat waits for the change still running in its slot before it is told to come again.
constexpr auto kRepeatWait = std::chrono::seconds(5);
thread_local const ReplyScope* t_reply_scope = nullptr;

bool is_dir(uint32_t mode) { return S_ISDIR(mode); }
bool is_reg(uint32_t mode) { return S_ISREG(mode); }

// Built by appends: "'" + std::string(name) + "'" trips gcc 12's -Wrestrict false positive at -O3.
std::string quoted(std::string_view name) {
  std::string out;
  out.reserve(name.size() + 2);
  out.push_back('\'');
  out.append(name);
  out.push_back('\'');
  return out;
}

Status validate_name(std::string_view name) {
  if (name.empty()) return Status(Code::kInvalid, "empty file name");
  if (name == "." || name == "..") return Status(Code::kInvalid, "the name " + quoted(name) + " is reserved");
  if (name.size() > pm::kMaxNameBytes) {
    return Status(Code::kNameTooLong, "name of " + std::to_string(name.size()) + " bytes is longer than 255");
  }
  if (name.find('/') != std::string_view::npos) return Status(Code::kInvalid, "name " + quoted(name) + " contains '/'");
  if (name.find('\0') != std::string_view::npos) return Status(Code::kInvalid, "name contains a NUL byte");
  return Status::ok();
}

// The answer to an operation on `dir`'s names while another session's directory lease may still be
// in use for `wait_ns` (DirLeases::check; 0: go on).
Status leased_elsewhere(int64_t wait_ns, InodeId dir) {
  if (wait_ns == 0) return Status::ok();
  const int64_t ms = std::max<int64_t>(1, (wait_ns + 999'999) / 1'000'000);
  return Status(Code::kBusy, "directory " + dir.to_string() + " is leased to another mount for creates; retry in " +
                                 std::to_string(ms) + " ms");
}

// The directory about to be removed is not the one whose lease was checked before (a rename put
// another in its place meanwhile).
Status victim_replaced(const std::string& name, InodeId parent) {
  return Status(Code::kBusy, "directory " + quoted(name) + " in " + parent.to_string() +
                                 " was replaced while this call waited; retry in 1 ms");
}

Status validate_xattr_name(std::string_view name) {
  // Linux gives ERANGE for an empty or over-long attribute name.
  if (name.empty() || name.size() > pm::kMaxNameBytes) {
    return Status(Code::kRange, "xattr name must be 1 to 255 bytes, got " + std::to_string(name.size()));
  }
  if (name.find('\0') != std::string_view::npos) return Status(Code::kInvalid, "xattr name contains a NUL byte");
  return Status::ok();
}

std::string u64_record(uint64_t v) { return schema::encode_record(schema::U64Record{v}); }

Result<uint64_t> read_counter(Store* store, std::string_view key, uint64_t dflt) {
  PENSTOCK_ASSIGN_OR_RETURN(auto v, store->get(key));
  if (!v.has_value()) return dflt;
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, schema::decode_record<schema::U64Record>(*v, key));
  return rec.value;
}

Result<std::optional<InodeRecord>> read_inode(Store* store, InodeId ino) {
  std::string key = schema::inode_key(ino);
  PENSTOCK_ASSIGN_OR_RETURN(auto v, store->get(key));
  if (!v.has_value()) return std::optional<InodeRecord>();
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, schema::decode_record<InodeRecord>(*v, "inode " + ino.to_string()));
  return std::optional<InodeRecord>(std::move(rec));
}

Result<std::optional<DentryRecord>> read_dentry(Store* store, InodeId parent, std::string_view name) {
  std::string key = schema::dentry_key(parent, name);
  PENSTOCK_ASSIGN_OR_RETURN(auto v, store->get(key));
  if (!v.has_value()) return std::optional<DentryRecord>();
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, schema::decode_record<DentryRecord>(
                                          *v, "dentry " + quoted(name) + " in inode " + parent.to_string()));
  return std::optional<DentryRecord>(rec);
}

// The inode that `name` in `parent` names, read without mu_. A rename or unlink may commit between
// reading the entry and reading its inode (a checkpoint's "latest.pt" replaced by os.replace()),
// and the inode the entry named is then gone. So the entry is read again, and while it names
// another inode, that one is read: a name that existed all along is never answered "no such
// entry". nullopt: no entry (or one that kept changing, or named an inode with no record).
Result<std::optional<InodeRecord>> resolve_name(Store* store, InodeId parent, std::string_view name) {
  constexpr int kAttempts = 16;
  PENSTOCK_ASSIGN_OR_RETURN(auto d, read_dentry(store, parent, name));
  for (int attempt = 0; attempt < kAttempts && d.has_value(); ++attempt) {
    PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store, d->ino));
    if (rec.has_value()) return rec;
    PENSTOCK_ASSIGN_OR_RETURN(auto again, read_dentry(store, parent, name));
    if (again.has_value() && again->ino == d->ino) break;
    d = again;
  }
  return std::optional<InodeRecord>();
}

// The directory record of `ino`: kNotFound when missing, kNotDir when not a directory.
Result<InodeRecord> read_dir_inode(Store* store, InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store, ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "directory inode " + ino.to_string() + " does not exist");
  if (!is_dir(rec->attr.mode)) return Status(Code::kNotDir, "inode " + ino.to_string() + " is not a directory");
  return std::move(*rec);
}

Result<bool> dir_is_empty(Store* store, InodeId ino) {
  bool empty = true;
  std::string prefix = schema::dentry_prefix(ino);
  PENSTOCK_RETURN_IF_ERROR(store->scan(prefix, prefix, [&](std::string_view, std::string_view) {
    empty = false;
    return false;
  }));
  return empty;
}

void set_mtime_ctime(InodeRecord* rec, int64_t now) {
  rec->attr.mtime_ns = now;
  rec->attr.ctime_ns = now;
}

}  // namespace

// One mutation: inode records read through a cache (so that two names for one object, e.g. the
// same parent on both sides of a rename, are one object), other keys written to a batch, and
// everything committed as one atomic store write. REQUIRES: MetaService::mu_ held for its life.
class MetaService::Txn {
 public:
  Txn(Store* store, uint64_t* used_inodes, std::set<uint64_t>* gc_queue, OpenTable* opens)
      : store_(store), used_inodes_(used_inodes), gc_queue_(gc_queue), opens_(opens) {}
  // What was changed in memory before the commit is put back unless the commit succeeds.
  ~Txn() {
    if (committed_) return;
    opens_->written_dropped();
    for (auto it = undo_.rbegin(); it != undo_.rend(); ++it) (*it)();
  }
  Txn(const Txn&) = delete;
  Txn& operator=(const Txn&) = delete;

  // The inode, or nullptr when it does not exist (or was removed in this transaction).
  Result<InodeRecord*> find(InodeId ino) {
    auto it = cache_.find(ino.value);
    if (it != cache_.end()) return it->second.removed ? nullptr : &it->second.rec;
    PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, ino));
    if (!rec.has_value()) return static_cast<InodeRecord*>(nullptr);
    auto& e = cache_[ino.value];
    e.rec = std::move(*rec);
    return &e.rec;
  }
  Result<InodeRecord*> need(InodeId ino) {
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, find(ino));
    if (rec == nullptr) return Status(Code::kNotFound, "inode " + ino.to_string() + " does not exist");
    return rec;
  }
  Result<InodeRecord*> need_dir(InodeId ino) {
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, find(ino));
    if (rec == nullptr) return Status(Code::kNotFound, "directory inode " + ino.to_string() + " does not exist");
    if (!is_dir(rec->attr.mode)) return Status(Code::kNotDir, "inode " + ino.to_string() + " is not a directory");
    return rec;
  }
  InodeRecord* add(InodeRecord rec) {
    auto& e = cache_[rec.attr.ino.value];
    e.rec = std::move(rec);
    e.dirty = true;
    e.removed = false;
    ++used_delta_;
    return &e.rec;
  }
  void dirty(const InodeRecord* rec) { cache_[rec->attr.ino.value].dirty = true; }
  void remove(InodeId ino) {
    auto& e = cache_[ino.value];
    e.removed = true;
    --used_delta_;
  }

  WriteBatch& batch() { return batch_; }
  Store* store() { return store_; }
  // Queues `ino` for garbage collection (its g/ record must be in batch()); the in-memory queue
  // learns of it once the batch is applied.
  void queue_gc(InodeId ino) { gc_added_.push_back(ino.value); }
  // Opens `ino` for `session` once the batch is applied (a create with its open).
  void open_after_commit(SessionId session, InodeId ino, int64_t now) {
    after_commit([opens = opens_, session, ino, now] { opens->add(session, ino, now); });
  }
  // Takes back `times` opens of `ino` by `session` now, and gives them back unless this commits.
  uint32_t release_open(SessionId session, InodeId ino, uint32_t times, int64_t now) {
    const uint32_t before = opens_->count(session, ino);
    const uint32_t left = opens_->drop(session, ino, times, now);
    if (before > left) undo_on_failure([this, session, ino, n = before - left, now] { opens_->add(session, ino, now, n); });
    return left;
  }
  void undo_on_failure(std::function<void()> undo) { undo_.push_back(std::move(undo)); }
  void after_commit(std::function<void()> done) { done_.push_back(std::move(done)); }

  Status commit() {
    for (auto& [ino, e] : cache_) {
      if (e.removed) {
        batch_.del(schema::inode_key(InodeId(ino)));
      } else if (e.dirty) {
        batch_.put(schema::inode_key(InodeId(ino)), schema::encode_record(e.rec));
      }
    }
    uint64_t used = *used_inodes_ + static_cast<uint64_t>(used_delta_);
    if (used_delta_ != 0) batch_.put(std::string(schema::kUsedInodes), u64_record(used));
    if (!batch_.empty()) {
      PENSTOCK_RETURN_IF_ERROR(store_->apply(batch_));
      *used_inodes_ = used;
      gc_queue_->insert(gc_added_.begin(), gc_added_.end());
    }
    opens_->written_applied();
    for (auto& done : done_) done();
    committed_ = true;
    return Status::ok();
  }

 private:
  struct Entry {
    InodeRecord rec;
    bool dirty = false;
    bool removed = false;
  };
  Store* store_;
  uint64_t* used_inodes_;
  std::set<uint64_t>* gc_queue_;
  OpenTable* opens_;
  std::vector<std::function<void()>> undo_;
  std::vector<std::function<void()>> done_;
  bool committed_ = false;
  std::vector<uint64_t> gc_added_;
  int64_t used_delta_ = 0;
  std::map<uint64_t, Entry> cache_;
  WriteBatch batch_;
};

template <class Resp>
Status MetaService::commit_change(Txn& txn, const Resp& response) {
  const ReplyScope* scope = t_reply_scope;
  if (scope != nullptr) {
    // Without its reply stored the change could be applied twice (its repeat would run it again):
    // a session that expired while the change ran gets nothing applied.
    if (!session_alive(scope->session)) {
      return Status(Code::kBadHandle, "session " + scope->session.to_string() +
                                          " expired while its change ran; nothing was changed; register a new session");
    }
    txn.batch().put(schema::reply_key(scope->session, scope->slot),
                    schema::encode_record(schema::ReplyRecord{scope->seq, scope->method, proto::encode(response),
                                                              scope->request_hash}));
  }
  return txn.commit();
}

// ---------------------------------------------------------------------------------------------
// Setup

MetaService::MetaService(Store* store, MetaOptions options)
    : store_(store), options_(std::move(options)), leases_(options_.entry_leases), dir_leases_(options_.dir_leases) {
  if (!options_.now) options_.now = system_now_ns;
  if (options_.inode_batch == 0) options_.inode_batch = 1;
  uint64_t seed = options_.seed;
  if (seed == 0) seed = (static_cast<uint64_t>(std::random_device()()) << 32) | std::random_device()();
  rng_.seed(seed);
  chain_cursor_ = rng_();
}

Result<std::unique_ptr<MetaService>> MetaService::open(Store* store, MetaOptions options) {
  // Kernels may still trust entry leases an earlier run granted, for up to the longest term this
  // database was served with: changes wait that long after this start, even if this run's term is
  // shorter or leases are off now (load() records the longer of the two).
  auto stored = read_counter(store, schema::kLeaseTerm, 0);
  if (!stored.has_value()) return stored.error().with_context("load metadata from " + store->describe());
  const uint64_t earlier = *stored;
  EntryLeaseOptions& leases = options.entry_leases;
  leases.restart_guard_ns = std::max(leases.restart_guard_ns,
                                     static_cast<int64_t>(std::min<uint64_t>(earlier, kMaxEntryLeaseNs)));
  // The same for directory leases: a mount may answer from one until its term ends.
  auto stored_dir = read_counter(store, schema::kDirLeaseTerm, 0);
  if (!stored_dir.has_value()) return stored_dir.error().with_context("load metadata from " + store->describe());
  options.dir_leases.restart_guard_ns = std::max(
      options.dir_leases.restart_guard_ns, static_cast<int64_t>(std::min<uint64_t>(*stored_dir, kMaxDirLeaseNs)));
  std::unique_ptr<MetaService> svc(new MetaService(store, std::move(options)));
  PENSTOCK_RETURN_IF_ERROR(svc->load().with_context("load metadata from " + store->describe()));
  return svc;
}

Status MetaService::load() {
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  PENSTOCK_ASSIGN_OR_RETURN(ino_batch_end_, read_counter(store_, schema::kNextInode, 0));
  PENSTOCK_ASSIGN_OR_RETURN(next_session_, read_counter(store_, schema::kNextSession, 1));
  PENSTOCK_ASSIGN_OR_RETURN(next_node_, read_counter(store_, schema::kNextNode, 1));
  PENSTOCK_ASSIGN_OR_RETURN(next_target_, read_counter(store_, schema::kNextTarget, 1));
  PENSTOCK_ASSIGN_OR_RETURN(map_version_, read_counter(store_, schema::kMapVersion, 0));
  PENSTOCK_ASSIGN_OR_RETURN(used_inodes_, read_counter(store_, schema::kUsedInodes, 0));

  WriteBatch batch;
  PENSTOCK_ASSIGN_OR_RETURN(auto root, read_inode(store_, kRootInode));
  if (!root.has_value()) {
    if (ino_batch_end_ > kRootInode.value) {
      return Status(Code::kCorrupt, "the root directory (inode 1) is missing from a used database; "
                                    "restore the metadata database from a backup");
    }
    InodeRecord rec;
    rec.attr.ino = kRootInode;
    rec.attr.mode = S_IFDIR | 0755;
    rec.attr.nlink = 2;
    rec.attr.size = kDirSize;
    rec.attr.atime_ns = rec.attr.mtime_ns = rec.attr.ctime_ns = now;
    rec.attr.generation = 1;
    rec.attr.layout.chunk_size = layout::kDefaultChunkSize;
    rec.attr.layout.stripe_count = 0;
    rec.parent = kRootInode;
    batch.put(schema::inode_key(kRootInode), schema::encode_record(rec));
    ino_batch_end_ = kRootInode.value + 1;
    used_inodes_ = 1;
    batch.put(std::string(schema::kUsedInodes), u64_record(used_inodes_));
    PENSTOCK_LOG(Info) << "created the root directory in " << store_->describe();
  }
  PENSTOCK_ASSIGN_OR_RETURN(auto fs_id, store_->get(schema::kFileSystemId));
  if (fs_id.has_value()) {
    PENSTOCK_ASSIGN_OR_RETURN(auto rec, schema::decode_record<schema::FileSystemRecord>(*fs_id, "file system id"));
    if (!daemon::is_uuid(rec.id)) {
      return Status(Code::kCorrupt, "the file system id in the database ('" + rec.id +
                                        "') is not 32 lowercase hex digits; restore the database from a backup");
    }
    fs_id_ = std::move(rec.id);
  } else {
    // Made once (a database from before ids gets one now; its targets take it at their next
    // registration).
    fs_id_ = daemon::random_uuid();
    batch.put(std::string(schema::kFileSystemId), schema::encode_record(schema::FileSystemRecord{fs_id_}));
  }
  // Numbers below the persisted batch end may have been handed out before a crash: skip them all,
  // and reserve the first batch of this run in the synced batch below.
  next_ino_ = ino_batch_end_;
  ino_batch_end_ = next_ino_ + options_.inode_batch;
  batch.put(std::string(schema::kNextInode), u64_record(ino_batch_end_));

  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kSessionPrefix, "", [&](std::string_view key, std::string_view) {
    if (key.size() == schema::kSessionPrefix.size() + 8) {
      sessions_[schema::read_be64(key.substr(schema::kSessionPrefix.size()))] =
          SessionState{now + options_.session_lease_ns};
    }
    return true;
  }));

  // Numbers given to a session for creates behind and not used yet: its mount may still send the
  // files it made with them. Those of a session that is gone are deleted.
  std::unordered_map<uint64_t, std::vector<InodeId>> granted;
  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kGrantPrefix, "", [&](std::string_view key, std::string_view) {
    const size_t at = schema::kGrantPrefix.size();
    if (key.size() != at + 16) return true;
    const uint64_t session = schema::read_be64(key.substr(at));
    if (sessions_.count(session) != 0) {
      granted[session].emplace_back(schema::read_be64(key.substr(at + 8)));
    } else {
      batch.del(std::string(key));
    }
    return true;
  }));
  for (const auto& [session, inos] : granted) dir_leases_.give_inodes(SessionId(session), inos);

  // Opens the store holds: those of orphans, and those held longer than the delay before a stop.
  Status bad_open;
  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kOpenPrefix, "", [&](std::string_view key, std::string_view value) {
    const size_t at = schema::kOpenPrefix.size();
    if (key.size() != at + 16) return true;
    auto rec = schema::decode_record<schema::OpenRecord>(value, "open record");
    if (!rec.has_value()) {
      bad_open = rec.error();
      return false;
    }
    const SessionId session(schema::read_be64(key.substr(at)));
    const InodeId ino(schema::read_be64(key.substr(at + 8)));
    if (sessions_.count(session.value) == 0) {
      // Its session is gone (a close whose deletes a crash took back): nobody holds this open.
      batch.del(std::string(key));
      batch.del(schema::open_by_inode_key(ino, session));
      return true;
    }
    opens_.load(session, ino, rec->count);
    return true;
  }));
  PENSTOCK_RETURN_IF_ERROR(bad_open);
  // Opens not written yet died with the last run: until the sessions it knew have sent theirs
  // (reclaim_opens) or one lease has passed, unlinked files wait as orphans. So does every orphan
  // found now: a session that has not sent its opens yet may hold one (also one whose stored
  // opens are another session's, or one a wait that a crash cut short left with none).
  for (const auto& [id, state] : sessions_) unreclaimed_.insert(id);
  reclaim_until_ns_ = now + options_.session_lease_ns;
  reclaim_wait_over_ = unreclaimed_.empty();
  if (!unreclaimed_.empty()) {
    PENSTOCK_LOG(Info) << "waiting up to " << options_.session_lease_ns / 1'000'000'000 << " s for the "
                       << unreclaimed_.size() << " session(s) found in the database to send their open files; "
                       << "until then an unlinked file keeps its data";
  }
  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kOrphanPrefix, "", [&](std::string_view key, std::string_view) {
    if (key.size() != schema::kOrphanPrefix.size() + 8) return true;
    grace_orphans_.insert(schema::read_be64(key.substr(schema::kOrphanPrefix.size())));
    return true;
  }));

  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kGcPrefix, "", [&](std::string_view key, std::string_view) {
    if (key.size() == schema::kGcPrefix.size() + 8) gc_queue_.insert(schema::read_be64(key.substr(schema::kGcPrefix.size())));
    return true;
  }));

  Status st;
  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kNodePrefix, "", [&](std::string_view, std::string_view value) {
    auto rec = schema::decode_record<schema::NodeRecord>(value, "node");
    if (!rec.has_value()) {
      st = rec.error();
      return false;
    }
    nodes_[rec->id.value] = NodeState{std::move(*rec), false, 0};
    return true;
  }));
  PENSTOCK_RETURN_IF_ERROR(st);
  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kTargetPrefix, "", [&](std::string_view, std::string_view value) {
    auto rec = schema::decode_record<schema::TargetRecord>(value, "target");
    if (!rec.has_value()) {
      st = rec.error();
      return false;
    }
    targets_[rec->id.value] = TargetState{std::move(*rec), false};
    return true;
  }));
  PENSTOCK_RETURN_IF_ERROR(st);
  PENSTOCK_RETURN_IF_ERROR(store_->scan(schema::kChainPrefix, "", [&](std::string_view, std::string_view value) {
    auto rec = schema::decode_record<proto::ChainInfo>(value, "chain");
    if (!rec.has_value()) {
      st = rec.error();
      return false;
    }
    chains_[rec->id.value] = std::move(*rec);
    return true;
  }));
  PENSTOCK_RETURN_IF_ERROR(st);

  batch.put(std::string(schema::kLeaseTerm), u64_record(static_cast<uint64_t>(options_.entry_leases.restart_guard())));
  batch.put(std::string(schema::kDirLeaseTerm), u64_record(static_cast<uint64_t>(options_.dir_leases.restart_guard())));
  // Every node starts offline: the map differs from the one before the restart, so it gets a new
  // version.
  PENSTOCK_RETURN_IF_ERROR(bump_map_version(&batch));
  PENSTOCK_RETURN_IF_ERROR(store_->write(batch));
  ino_synced_end_ = ino_batch_end_.load();
  if (!targets_.empty() && options_.node_report_wait_ns > 0) nodes_wait_until_ = now + options_.node_report_wait_ns;
  PENSTOCK_LOG(Info) << "metadata loaded: " << used_inodes_ << " inodes, " << sessions_.size() << " sessions, "
                     << nodes_.size() << " nodes, " << targets_.size() << " targets, map version " << map_version_
                     << ", file system " << fs_id_;
  return Status::ok();
}

Status MetaService::bump_map_version(WriteBatch* batch) {
  ++map_version_;
  batch->put(std::string(schema::kMapVersion), u64_record(map_version_));
  return Status::ok();
}

uint64_t MetaService::map_version() {
  std::lock_guard lock(mu_);
  return map_version_;
}

void MetaService::set_gc_wakeup(std::function<void()> fn) {
  std::lock_guard lock(mu_);
  gc_wakeup_ = std::move(fn);
}

std::vector<MetaService::ScrubTarget> MetaService::scrub_targets() {
  std::lock_guard lock(mu_);
  std::vector<ScrubTarget> out;
  for (const auto& [id, t] : targets_) {
    ScrubTarget st{TargetId(id), "", t.online};
    auto nit = nodes_.find(t.rec.node.value);
    if (nit != nodes_.end()) {
      st.address = nit->second.rec.address;
      st.online = st.online && nit->second.online;
    } else {
      st.online = false;
    }
    out.push_back(std::move(st));
  }
  return out;
}

Result<MetaService::ChunkOwner> MetaService::chunk_owner(InodeId ino) {
  {
    // Numbers are handed out in order and never again after a restart (load() starts past every
    // earlier reservation), so one at or past next_ino_ is no file of this namespace, ever.
    std::lock_guard lock(mu_);
    if (!ino.valid() || ino.value >= next_ino_) return ChunkOwner::kNeverIssued;
  }
  // The record first, then the queue entry: an unlink between the two reads removes the record
  // and adds the entry in one batch, so the inode is seen live or collecting; a collection that
  // finishes between them leaves it an orphan, whose removal repeats the collector's.
  // peek(): a pass over every file must not evict the records and blocks clients use.
  PENSTOCK_ASSIGN_OR_RETURN(std::optional<std::string> record, store_->peek(schema::inode_key(ino)));
  if (record.has_value()) return ChunkOwner::kLive;
  PENSTOCK_ASSIGN_OR_RETURN(std::optional<std::string> queued, store_->peek(schema::gc_key(ino)));
  return queued.has_value() ? ChunkOwner::kCollecting : ChunkOwner::kOrphan;
}

void MetaService::set_scrub_runner(ScrubFn fn) {
  std::lock_guard lock(mu_);
  scrub_runner_ = std::move(fn);
}

Result<pm::ScrubResp> MetaService::scrub(const pm::ScrubReq& req) {
  ScrubFn fn;
  {
    std::lock_guard lock(mu_);
    fn = scrub_runner_;
  }
  if (!fn) return Status(Code::kNotSupported, "this penstock-meta runs no scrubber");
  return fn(req);
}

void MetaService::notify_gc(bool queued) {
  if (!queued) return;
  std::function<void()> fn;
  {
    std::lock_guard lock(mu_);
    fn = gc_wakeup_;
  }
  if (fn) fn();
}

Status MetaService::apply_inode_reservation(uint64_t end) {
  WriteBatch batch;
  batch.put(std::string(schema::kNextInode), u64_record(end));
  PENSTOCK_RETURN_IF_ERROR(store_->apply(batch).with_context("reserve inode numbers"));
  ino_batch_end_.store(end, std::memory_order_release);
  ino_reservation_ticket_ = store_->applied_ticket();  // this batch's, or a later one's
  return Status::ok();
}

void MetaService::raise_ino_synced_end(uint64_t end) {
  uint64_t cur = ino_synced_end_.load(std::memory_order_relaxed);
  while (cur < end && !ino_synced_end_.compare_exchange_weak(cur, end, std::memory_order_relaxed)) {
  }
}

Result<InodeId> MetaService::take_inode_number() {
  for (;;) {
    uint64_t reserved = 0;
    {
      std::lock_guard lock(mu_);
      uint64_t synced = ino_synced_end_.load(std::memory_order_relaxed);
      // An early reservation some sync has covered meanwhile (the delayed sync creates ask for,
      // any waiting mutation's): its numbers are safe to hand out.
      if (ino_batch_end_ > synced && store_->covered_by_sync(ino_reservation_ticket_)) {
        raise_ino_synced_end(ino_batch_end_);
        synced = ino_synced_end_.load(std::memory_order_relaxed);
      }
      if (next_ino_ < synced) {
        // Half a batch before its end, reserve the next one without waiting: a sync covers it
        // before it is needed. A failure here is retried by the next create.
        if (next_ino_ + options_.inode_batch / 2 >= synced && ino_batch_end_ == synced) {
          Status st = apply_inode_reservation(synced + options_.inode_batch);
          if (!st.is_ok()) {
            PENSTOCK_LOG(Warn) << "early reservation of inode numbers failed (the next create retries it): "
                               << st.to_string();
          }
        }
        return InodeId(next_ino_++);
      }
      if (ino_batch_end_ <= next_ino_) PENSTOCK_RETURN_IF_ERROR(apply_inode_reservation(next_ino_ + options_.inode_batch));
      reserved = ino_batch_end_;
    }
    // Out of synced numbers (rare: the early reservation was not synced yet): sync it now,
    // without the namespace mutex, then take a number.
    PENSTOCK_RETURN_IF_ERROR(store_->sync().with_context("sync the reservation of inode numbers"));
    raise_ino_synced_end(reserved);
  }
}

bool MetaService::session_alive(SessionId s) {
  auto it = sessions_.find(s.value);
  return it != sessions_.end() && it->second.expires_ns >= options_.now();
}

Status MetaService::wait_for_nodes_locked() {
  if (nodes_wait_until_ == 0) return Status::ok();
  const int64_t now = options_.now();
  const auto offline = std::find_if(targets_.begin(), targets_.end(), [](const auto& t) { return !t.second.online; });
  if (offline == targets_.end() || now >= nodes_wait_until_) {
    if (offline != targets_.end()) {
      PENSTOCK_LOG(Warn) << "target " << offline->first << " has not reported since this start; new files leave it out";
    }
    nodes_wait_until_ = 0;
    return Status::ok();
  }
  return Status(Code::kBusy, "penstock-meta has just started and waits up to " +
                                 std::to_string((nodes_wait_until_ - now) / 1'000'000) +
                                 " ms more for data server targets to report (target " + std::to_string(offline->first) +
                                 " has not yet); retry");
}

Result<std::vector<ChainId>> MetaService::usable_chains_locked() {
  PENSTOCK_RETURN_IF_ERROR(wait_for_nodes_locked());
  std::vector<ChainId> usable;
  for (const auto& [id, chain] : chains_) {
    bool ok = !chain.targets.empty();
    for (TargetId t : chain.targets) {
      auto it = targets_.find(t.value);
      if (it == targets_.end() || !it->second.online) ok = false;
    }
    if (ok) usable.push_back(chain.id);
  }
  if (usable.empty()) return Status(Code::kUnavailable, "no data server is registered and online; start penstock-data");
  return usable;
}

Result<std::vector<ChainId>> MetaService::pick_chains(uint32_t stripe_count, uint32_t* seed) {
  PENSTOCK_ASSIGN_OR_RETURN(const std::vector<ChainId> usable, usable_chains_locked());
  size_t n = usable.size();
  size_t stripe = stripe_count == 0 ? n : std::min<size_t>(stripe_count, n);
  size_t start = chain_cursor_++ % n;
  std::vector<ChainId> out;
  out.reserve(stripe);
  for (size_t i = 0; i < stripe; ++i) out.push_back(usable[(start + i) % n]);
  *seed = static_cast<uint32_t>(rng_() % stripe);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Sessions

Result<pm::RegisterSessionResp> MetaService::register_session_applied(const pm::RegisterSessionReq& req) {
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  SessionId id(next_session_);
  WriteBatch batch;
  batch.put(schema::session_key(id), schema::encode_record(schema::SessionRecord{req.client_name, req.hostname, now}));
  batch.put(std::string(schema::kNextSession), u64_record(id.value + 1));
  PENSTOCK_RETURN_IF_ERROR(store_->apply(batch).with_context("register session"));
  next_session_ = id.value + 1;
  sessions_[id.value] = SessionState{now + options_.session_lease_ns};
  PENSTOCK_LOG(Info) << "session " << id.value << " registered by " << req.client_name << " on " << req.hostname;
  pm::RegisterSessionResp resp;
  resp.session = id;
  resp.map_version = map_version_;
  resp.lease_ns = options_.session_lease_ns;
  return resp;
}

Result<pm::HeartbeatResp> MetaService::heartbeat(const pm::SessionReq& req) {
  std::lock_guard lock(mu_);
  if (!session_alive(req.session)) {
    return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired; register a new session");
  }
  sessions_[req.session.value].expires_ns = options_.now() + options_.session_lease_ns;
  return pm::HeartbeatResp{map_version_};
}

Status MetaService::drop_opens_of_session(SessionId session, bool* queued_gc) {
  const std::vector<InodeId> inos = opens_.inodes_of(session);
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  int64_t now = options_.now();
  for (InodeId ino : inos) {
    txn.undo_on_failure([this, session, ino, n = opens_.count(session, ino), now] { opens_.add(session, ino, now, n); });
  }
  opens_.drop_session(session, &txn.batch());
  for (InodeId ino : inos) {
    if (opens_.has_other(ino, session) || waits_for_reclaim_locked(ino, now)) continue;
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.find(ino));
    if (rec != nullptr && rec->attr.nlink == 0) {
      opens_.store_inode(ino, &txn.batch());  // other sessions' closed opens still in the store
      PENSTOCK_RETURN_IF_ERROR(finalize_inode(txn, *rec, now, queued_gc));
    }
  }
  for (InodeId ino : dir_leases_.inodes_of(session)) txn.batch().del(schema::grant_key(session, ino));
  const std::string replies = schema::reply_prefix(session);
  PENSTOCK_RETURN_IF_ERROR(store_->scan(replies, replies, [&](std::string_view key, std::string_view) {
    txn.batch().del(std::string(key));
    return true;
  }));
  txn.batch().del(schema::session_key(session));
  return txn.commit();
}

Status MetaService::close_session_applied(const pm::SessionReq& req) {
  bool queued = false;
  {
    std::lock_guard lock(mu_);
    if (sessions_.count(req.session.value) == 0) {
      return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired");
    }
    PENSTOCK_RETURN_IF_ERROR(drop_opens_of_session(req.session, &queued).with_context("close session " + req.session.to_string()));
    sessions_.erase(req.session.value);
    reclaimed_locked(req.session.value);
    dir_leases_.drop_session(req.session);
    PENSTOCK_LOG(Info) << "session " << req.session.value << " closed";
  }
  notify_gc(queued);
  return Status::ok();
}

// ---------------------------------------------------------------------------------------------
// Reads (lock-free: one consistent record each, straight from the store)

Result<pm::AttrResp> MetaService::lookup(const pm::LookupReq& req) {
  PENSTOCK_RETURN_IF_ERROR(validate_name(req.name));
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(dir_leases_.check(req.parent, req.session), req.parent));
  const uint64_t lease_epoch = leases_.epoch();  // before the reads (entry_leases.h)
  PENSTOCK_ASSIGN_OR_RETURN(auto parent, read_dir_inode(store_, req.parent));
  (void)parent;
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, resolve_name(store_, req.parent, req.name));
  if (!rec.has_value()) {
    return Status(Code::kNotFound, "no entry " + quoted(req.name) + " in directory " + req.parent.to_string());
  }
  pm::AttrResp resp{rec->attr};
  if (is_dir(rec->attr.mode)) resp.entry_lease_ns = leases_.grant({req.parent, req.name}, req.session, lease_epoch);
  return resp;
}

Result<pm::LookupOpenResp> MetaService::lookup_open(const pm::LookupReq& req) {
  PENSTOCK_ASSIGN_OR_RETURN(pm::AttrResp found, lookup(req));
  pm::LookupOpenResp resp{std::move(found.attr), found.entry_lease_ns, false};
  if (!S_ISREG(resp.attr.mode)) return resp;
  // The name was read without mu_: an unlink or a rename over it may have come since. Under mu_
  // the name is resolved again and what it names now is opened, so a change either came first
  // (the lookup answers as after it) or sees the open; a name that existed all along is found.
  std::lock_guard lock(mu_);
  if (!session_alive(req.session)) return resp;
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, resolve_name(store_, req.parent, req.name));
  if (!rec.has_value() || rec->attr.nlink == 0) {
    return Status(Code::kNotFound, "entry " + quoted(req.name) + " was removed while being looked up");
  }
  if (rec->attr.ino != resp.attr.ino) resp.entry_lease_ns = 0;  // granted for what it named before
  resp.attr = rec->attr;
  if (!S_ISREG(resp.attr.mode)) return resp;  // exchanged with a directory meanwhile
  // On a failed store write the lookup stands unopened: the kernel's Open asks again.
  resp.opened = add_open_locked(req.session, rec->attr.ino, /*orphan=*/false).is_ok();
  return resp;
}

Result<pm::AttrResp> MetaService::get_attr(const pm::InodeReq& req) {
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, req.ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " does not exist");
  return pm::AttrResp{rec->attr};
}

Result<pm::ReadlinkResp> MetaService::readlink(const pm::InodeReq& req) {
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, req.ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " does not exist");
  if (!S_ISLNK(rec->attr.mode)) return Status(Code::kInvalid, "inode " + req.ino.to_string() + " is not a symlink");
  return pm::ReadlinkResp{rec->symlink_target};
}

Result<pm::ReadDirResp> MetaService::read_dir(const pm::ReadDirReq& req) {
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(dir_leases_.check(req.ino, req.session), req.ino));
  PENSTOCK_ASSIGN_OR_RETURN(auto dir, read_dir_inode(store_, req.ino));
  (void)dir;
  uint32_t limit = req.max_entries == 0 ? kDefaultReadDirEntries : std::min(req.max_entries, kMaxReadDirEntries);
  std::string prefix = schema::dentry_prefix(req.ino);
  std::string seek = prefix + req.after;
  pm::ReadDirResp resp;
  bool more = false;
  Status st;
  PENSTOCK_RETURN_IF_ERROR(store_->scan(prefix, seek, [&](std::string_view key, std::string_view value) {
    std::string_view name = key.substr(prefix.size());
    if (!req.after.empty() && name == req.after) return true;
    if (resp.entries.size() >= limit) {
      more = true;
      return false;
    }
    auto d = schema::decode_record<DentryRecord>(value, key);
    if (!d.has_value()) {
      st = d.error();
      return false;
    }
    pm::DirEntry e;
    e.name = std::string(name);
    e.ino = d->ino;
    e.mode = d->type;
    resp.entries.push_back(std::move(e));
    return true;
  }));
  PENSTOCK_RETURN_IF_ERROR(st);
  if (req.plus) {
    std::vector<pm::DirEntry> kept;
    kept.reserve(resp.entries.size());
    for (auto& e : resp.entries) {
      PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, e.ino));
      // Renamed over or removed since the scan: what the name names now, if anything.
      if (!rec.has_value()) {
        PENSTOCK_ASSIGN_OR_RETURN(rec, resolve_name(store_, req.ino, e.name));
      }
      if (!rec.has_value()) continue;
      e.ino = rec->attr.ino;
      e.mode = rec->attr.mode & S_IFMT;
      e.attr = rec->attr;
      kept.push_back(std::move(e));
    }
    resp.entries = std::move(kept);
  }
  resp.eof = !more;
  return resp;
}

Result<pm::GetXattrResp> MetaService::get_xattr(const pm::GetXattrReq& req) {
  PENSTOCK_RETURN_IF_ERROR(validate_xattr_name(req.name));
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, req.ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " does not exist");
  PENSTOCK_ASSIGN_OR_RETURN(auto v, store_->get(schema::xattr_key(req.ino, req.name)));
  if (!v.has_value()) return Status(Code::kNoData, "no xattr " + quoted(req.name) + " on inode " + req.ino.to_string());
  return pm::GetXattrResp{std::move(*v)};
}

Result<pm::ListXattrResp> MetaService::list_xattr(const pm::InodeReq& req) {
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, req.ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " does not exist");
  pm::ListXattrResp resp;
  std::string prefix = schema::xattr_prefix(req.ino);
  PENSTOCK_RETURN_IF_ERROR(store_->scan(prefix, prefix, [&](std::string_view key, std::string_view) {
    resp.names.emplace_back(key.substr(prefix.size()));
    return true;
  }));
  return resp;
}

Result<pm::LayoutResp> MetaService::get_layout(const pm::InodeReq& req) {
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, req.ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " does not exist");
  return pm::LayoutResp{rec->attr.layout};
}

// ---------------------------------------------------------------------------------------------
// Mutations

Result<pm::AttrResp> MetaService::make_node_applied(InodeId parent_ino, const std::string& name, uint32_t mode,
                                            uint64_t rdev, const proto::Caller& caller, SessionId session,
                                            const std::string& symlink_target, InodeId ino) {
  PENSTOCK_RETURN_IF_ERROR(validate_name(name));
  std::lock_guard lock(mu_);
  const int64_t now = options_.now();
  if (session.valid() && !session_alive(session)) {
    return Status(Code::kBadHandle, "session " + session.to_string() + " is unknown or expired; register a new session");
  }
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(pm::AttrResp resp,
                            make_node_in(txn, parent_ino, name, mode, rdev, caller, session, symlink_target, ino, now));
  PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("create " + quoted(name) + " in directory " + parent_ino.to_string()));
  return resp;
}

Result<pm::AttrResp> MetaService::make_node_in(Txn& txn, InodeId parent_ino, const std::string& name, uint32_t mode,
                                               uint64_t rdev, const proto::Caller& caller, SessionId session,
                                               const std::string& symlink_target, InodeId ino, int64_t now) {
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * parent, txn.need_dir(parent_ino));
  PENSTOCK_ASSIGN_OR_RETURN(auto existing, read_dentry(store_, parent_ino, name));
  if (existing.has_value()) {
    return Status(Code::kExists, quoted(name) + " already exists in directory " + parent_ino.to_string());
  }
  uint32_t type = mode & S_IFMT;
  InodeRecord rec;
  if (is_reg(type)) {
    uint32_t seed = 0;
    PENSTOCK_ASSIGN_OR_RETURN(auto chains, pick_chains(parent->attr.layout.stripe_count, &seed));
    rec.attr.layout.chunk_size = parent->attr.layout.chunk_size;
    rec.attr.layout.stripe_count = static_cast<uint32_t>(chains.size());
    rec.attr.layout.seed = seed;
    rec.attr.layout.chains = std::move(chains);
  } else if (is_dir(type)) {
    rec.attr.layout.chunk_size = parent->attr.layout.chunk_size;
    rec.attr.layout.stripe_count = parent->attr.layout.stripe_count;
  }
  rec.attr.ino = ino;
  rec.attr.mode = type | (mode & 07777);
  rec.attr.uid = caller.uid;
  rec.attr.gid = caller.gid;
  if ((parent->attr.mode & S_ISGID) != 0) {
    // BSD group semantics of a setgid directory, as local file systems do.
    rec.attr.gid = parent->attr.gid;
    if (is_dir(type)) rec.attr.mode |= S_ISGID;
  }
  rec.attr.rdev = rdev;
  rec.attr.atime_ns = rec.attr.mtime_ns = rec.attr.ctime_ns = now;
  rec.attr.generation = 1;
  if (is_dir(type)) {
    rec.attr.nlink = 2;
    rec.attr.size = kDirSize;
    rec.parent = parent_ino;
    parent->attr.nlink += 1;
  } else {
    rec.attr.nlink = 1;
  }
  if (S_ISLNK(type)) {
    rec.symlink_target = symlink_target;
    rec.attr.size = symlink_target.size();
  }
  set_mtime_ctime(parent, now);
  txn.dirty(parent);
  txn.batch().put(schema::dentry_key(parent_ino, name), schema::encode_record(DentryRecord{ino, type}));
  if (session.valid()) txn.open_after_commit(session, ino, now);
  pm::AttrResp resp{rec.attr};
  resp.parent = parent->attr;
  txn.add(std::move(rec));
  return resp;
}

Result<pm::AttrResp> MetaService::create(const pm::CreateReq& req) {
  return make_node(req.parent, req.name, S_IFREG | (req.mode & 07777), 0, req.caller, req.session, req.session, "");
}

Result<pm::AttrResp> MetaService::mknod(const pm::MknodReq& req) {
  uint32_t type = req.mode & S_IFMT;
  switch (type) {
    case 0:
      type = S_IFREG;  // mknod(2): a zero type means a regular file
      break;
    case S_IFREG:
    case S_IFIFO:
    case S_IFSOCK:
    case S_IFCHR:
    case S_IFBLK:
      break;
    case S_IFDIR:
      return Status(Code::kNotPermitted, "mknod cannot make a directory; use mkdir");
    default:
      return Status(Code::kInvalid, "mknod: unsupported file type " + std::to_string(type));
  }
  uint64_t rdev = (S_ISCHR(type) || S_ISBLK(type)) ? req.rdev : 0;
  return make_node(req.parent, req.name, type | (req.mode & 07777), rdev, req.caller, SessionId(), req.session, "");
}

Result<pm::AttrResp> MetaService::mkdir(const pm::MkdirReq& req) {
  return make_node(req.parent, req.name, S_IFDIR | (req.mode & 07777), 0, req.caller, SessionId(), req.session, "");
}

Result<pm::AttrResp> MetaService::symlink(const pm::SymlinkReq& req) {
  if (req.target.empty()) return Status(Code::kNotFound, "symlink target is empty");
  if (req.target.size() > pm::kMaxSymlinkBytes) {
    return Status(Code::kNameTooLong, "symlink target of " + std::to_string(req.target.size()) + " bytes is longer than 4095");
  }
  return make_node(req.parent, req.name, S_IFLNK | 0777, 0, req.caller, SessionId(), req.session, req.target);
}

// Removes the inode for good: its xattrs and record go in this transaction; a regular file with
// chunks is queued for garbage collection. REQUIRES: no link and no open is left.
Status MetaService::finalize_inode(Txn& txn, const InodeRecord& rec, int64_t now, bool* queued_gc) {
  InodeId ino = rec.attr.ino;
  std::string prefix = schema::xattr_prefix(ino);
  std::vector<std::string> keys;
  PENSTOCK_RETURN_IF_ERROR(store_->scan(prefix, prefix, [&](std::string_view key, std::string_view) {
    keys.emplace_back(key);
    return true;
  }));
  for (auto& k : keys) txn.batch().del(std::move(k));
  txn.batch().del(schema::orphan_key(ino));
  if (is_reg(rec.attr.mode) && !rec.attr.layout.chains.empty()) {
    txn.batch().put(schema::gc_key(ino), schema::encode_record(schema::GcRecord{rec.attr, now}));
    txn.queue_gc(ino);
    *queued_gc = true;
  }
  txn.remove(ino);
  return Status::ok();
}

// One link of `rec` is gone. At zero links the inode becomes an orphan while some session has it
// open, and is finalized otherwise.
Status MetaService::drop_link(Txn& txn, InodeRecord& rec, int64_t now, bool* queued_gc) {
  if (rec.attr.nlink > 0) rec.attr.nlink -= 1;
  rec.attr.ctime_ns = now;
  txn.dirty(&rec);
  if (rec.attr.nlink > 0) return Status::ok();
  const bool open = opens_.has_other(rec.attr.ino, SessionId());
  // A session this server found at its start may hold an open the last run's crash made it
  // forget: while it has not sent its opens (reclaim_opens), the file waits as an orphan.
  const bool wait = !is_dir(rec.attr.mode) && reclaim_grace_locked(now);
  if (open || wait) {
    // Its opens must survive a crash as long as this unlink does: they go in the same batch.
    if (open) opens_.store_inode(rec.attr.ino, &txn.batch());
    txn.batch().put(schema::orphan_key(rec.attr.ino), "");
    if (wait) txn.after_commit([this, ino = rec.attr.ino.value] { grace_orphans_.insert(ino); });
    return Status::ok();
  }
  return finalize_inode(txn, rec, now, queued_gc);
}

Result<pm::UnlinkResp> MetaService::unlink_applied(const pm::NameReq& req) {
  PENSTOCK_RETURN_IF_ERROR(validate_name(req.name));
  bool queued = false;
  pm::UnlinkResp resp;
  {
    std::lock_guard lock(mu_);
    int64_t now = options_.now();
    Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * parent, txn.need_dir(req.parent));
    PENSTOCK_ASSIGN_OR_RETURN(auto d, read_dentry(store_, req.parent, req.name));
    if (!d.has_value()) return Status(Code::kNotFound, "no entry " + quoted(req.name) + " in directory " + req.parent.to_string());
    if (is_dir(d->type)) return Status(Code::kIsDir, quoted(req.name) + " is a directory; use rmdir");
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(d->ino));
    txn.batch().del(schema::dentry_key(req.parent, req.name));
    PENSTOCK_RETURN_IF_ERROR(drop_link(txn, *rec, now, &queued));
    set_mtime_ctime(parent, now);
    txn.dirty(parent);
    resp.parent = parent->attr;
    PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("unlink " + quoted(req.name)));
  }
  notify_gc(queued);
  return resp;
}

Result<pm::DirsResp> MetaService::rmdir_applied(const pm::NameReq& req, InodeId checked_victim) {
  PENSTOCK_RETURN_IF_ERROR(validate_name(req.name));
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * parent, txn.need_dir(req.parent));
  PENSTOCK_ASSIGN_OR_RETURN(auto d, read_dentry(store_, req.parent, req.name));
  if (!d.has_value()) return Status(Code::kNotFound, "no entry " + quoted(req.name) + " in directory " + req.parent.to_string());
  if (!is_dir(d->type)) return Status(Code::kNotDir, quoted(req.name) + " is not a directory");
  if (d->ino != checked_victim) return victim_replaced(req.name, req.parent);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * child, txn.need(d->ino));
  PENSTOCK_ASSIGN_OR_RETURN(bool empty, dir_is_empty(store_, d->ino));
  if (!empty) return Status(Code::kNotEmpty, "directory " + quoted(req.name) + " is not empty");
  txn.batch().del(schema::dentry_key(req.parent, req.name));
  bool queued = false;
  PENSTOCK_RETURN_IF_ERROR(finalize_inode(txn, *child, now, &queued));
  parent->attr.nlink -= 1;
  set_mtime_ctime(parent, now);
  txn.dirty(parent);
  pm::DirsResp resp{{parent->attr}, d->ino};
  PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("rmdir " + quoted(req.name)));
  return resp;
}

// Rename, as renameat2(2) on a local file system:
//  - source missing: kNotFound; both flags, or unknown flags: kInvalid.
//  - source and destination are the same inode (same name, or two hard links): nothing happens.
//  - kRenameNoReplace with an existing destination: kExists.
//  - kRenameExchange: both must exist (kNotFound), they swap; directories may not move into their
//    own subtree (kInvalid).
//  - a directory moving into its own subtree: kInvalid; over a non-directory: kNotDir; over a
//    non-empty directory: kNotEmpty; over an empty directory: replaces it.
//  - a non-directory over a directory: kIsDir; over a file: replaces it (the replaced inode loses
//    a link and may become an orphan or be collected).
//  - parents' nlink follow moved directories; both parents get new mtime/ctime, the moved inode a
//    new ctime.
// The reply names every directory it changed, as it is after the rename, and one it replaced.
Result<pm::DirsResp> MetaService::rename_applied(const pm::RenameReq& req, InodeId checked_victim) {
  PENSTOCK_RETURN_IF_ERROR(validate_name(req.name));
  PENSTOCK_RETURN_IF_ERROR(validate_name(req.new_name));
  const uint32_t known = pm::kRenameNoReplace | pm::kRenameExchange;
  if ((req.flags & ~known) != 0) return Status(Code::kInvalid, "unknown rename flags " + std::to_string(req.flags));
  if ((req.flags & pm::kRenameNoReplace) != 0 && (req.flags & pm::kRenameExchange) != 0) {
    return Status(Code::kInvalid, "rename flags NOREPLACE and EXCHANGE exclude each other");
  }
  bool exchange = (req.flags & pm::kRenameExchange) != 0;
  bool queued = false;
  pm::DirsResp resp;
  {
    std::lock_guard lock(mu_);
    int64_t now = options_.now();
    Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * p, txn.need_dir(req.parent));
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * np, txn.need_dir(req.new_parent));
    PENSTOCK_ASSIGN_OR_RETURN(auto sd, read_dentry(store_, req.parent, req.name));
    if (!sd.has_value()) return Status(Code::kNotFound, "no entry " + quoted(req.name) + " in directory " + req.parent.to_string());
    PENSTOCK_ASSIGN_OR_RETURN(auto dd, read_dentry(store_, req.new_parent, req.new_name));
    if (exchange && !dd.has_value()) {
      return Status(Code::kNotFound, "exchange: no entry " + quoted(req.new_name) + " in directory " + req.new_parent.to_string());
    }
    if ((req.flags & pm::kRenameNoReplace) != 0 && dd.has_value()) {
      return Status(Code::kExists, quoted(req.new_name) + " already exists in directory " + req.new_parent.to_string());
    }
    if (dd.has_value() && dd->ino == sd->ino) return resp;  // same inode: POSIX says do nothing

    // Is `ancestor` equal to `dir` or one of its ancestors?
    auto in_subtree = [&](InodeId dir, InodeId ancestor) -> Result<bool> {
      InodeId cur = dir;
      for (uint32_t depth = 0; depth < kMaxDirDepth; ++depth) {
        if (cur == ancestor) return true;
        if (cur == kRootInode) return false;
        PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(cur));
        cur = rec->parent;
      }
      return Status(Code::kCorrupt, "directory " + dir.to_string() + " has no path to the root");
    };

    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * src, txn.need(sd->ino));
    bool src_dir = is_dir(sd->type);
    bool cross = req.parent != req.new_parent;
    if (exchange) {
      PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * dst, txn.need(dd->ino));
      bool dst_dir = is_dir(dd->type);
      if (cross && src_dir) {
        PENSTOCK_ASSIGN_OR_RETURN(bool bad, in_subtree(req.new_parent, src->attr.ino));
        if (bad) return Status(Code::kInvalid, "cannot move directory " + quoted(req.name) + " into its own subtree");
      }
      if (cross && dst_dir) {
        PENSTOCK_ASSIGN_OR_RETURN(bool bad, in_subtree(req.parent, dst->attr.ino));
        if (bad) return Status(Code::kInvalid, "cannot move directory " + quoted(req.new_name) + " into its own subtree");
      }
      txn.batch().put(schema::dentry_key(req.parent, req.name), schema::encode_record(*dd));
      txn.batch().put(schema::dentry_key(req.new_parent, req.new_name), schema::encode_record(*sd));
      if (cross && src_dir) {
        src->parent = req.new_parent;
        p->attr.nlink -= 1;
        np->attr.nlink += 1;
      }
      if (cross && dst_dir) {
        dst->parent = req.parent;
        np->attr.nlink -= 1;
        p->attr.nlink += 1;
      }
      dst->attr.ctime_ns = now;
      txn.dirty(dst);
      if (dst_dir) resp.dirs.push_back(dst->attr);
    } else {
      if (src_dir) {
        PENSTOCK_ASSIGN_OR_RETURN(bool bad, in_subtree(req.new_parent, src->attr.ino));
        if (bad) return Status(Code::kInvalid, "cannot move directory " + quoted(req.name) + " into its own subtree");
        if (dd.has_value()) {
          if (!is_dir(dd->type)) return Status(Code::kNotDir, quoted(req.new_name) + " is not a directory");
          if (dd->ino != checked_victim) return victim_replaced(req.new_name, req.new_parent);
          PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * dst, txn.need(dd->ino));
          PENSTOCK_ASSIGN_OR_RETURN(bool empty, dir_is_empty(store_, dd->ino));
          if (!empty) return Status(Code::kNotEmpty, "directory " + quoted(req.new_name) + " is not empty");
          PENSTOCK_RETURN_IF_ERROR(finalize_inode(txn, *dst, now, &queued));
          np->attr.nlink -= 1;
          resp.removed = dd->ino;
        }
        if (cross) {
          src->parent = req.new_parent;
          p->attr.nlink -= 1;
          np->attr.nlink += 1;
        }
      } else if (dd.has_value()) {
        if (is_dir(dd->type)) return Status(Code::kIsDir, quoted(req.new_name) + " is a directory");
        PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * dst, txn.need(dd->ino));
        PENSTOCK_RETURN_IF_ERROR(drop_link(txn, *dst, now, &queued));
      }
      txn.batch().del(schema::dentry_key(req.parent, req.name));
      txn.batch().put(schema::dentry_key(req.new_parent, req.new_name), schema::encode_record(*sd));
    }
    src->attr.ctime_ns = now;
    txn.dirty(src);
    set_mtime_ctime(p, now);
    set_mtime_ctime(np, now);
    txn.dirty(p);
    txn.dirty(np);
    if (src_dir) resp.dirs.push_back(src->attr);
    resp.dirs.push_back(p->attr);
    if (cross) resp.dirs.push_back(np->attr);
    PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("rename " + quoted(req.name) + " to " + quoted(req.new_name)));
  }
  notify_gc(queued);
  return resp;
}

Result<pm::AttrResp> MetaService::link_applied(const pm::LinkReq& req) {
  PENSTOCK_RETURN_IF_ERROR(validate_name(req.new_name));
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(req.ino));
  if (is_dir(rec->attr.mode)) return Status(Code::kNotPermitted, "cannot make a hard link to a directory");
  if (rec->attr.nlink == 0) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " was unlinked");
  if (rec->attr.nlink >= kMaxLinks) return Status(Code::kTooManyLinks, "inode " + req.ino.to_string() + " has 65000 links");
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * np, txn.need_dir(req.new_parent));
  PENSTOCK_ASSIGN_OR_RETURN(auto existing, read_dentry(store_, req.new_parent, req.new_name));
  if (existing.has_value()) {
    return Status(Code::kExists, quoted(req.new_name) + " already exists in directory " + req.new_parent.to_string());
  }
  rec->attr.nlink += 1;
  rec->attr.ctime_ns = now;
  txn.dirty(rec);
  set_mtime_ctime(np, now);
  txn.dirty(np);
  txn.batch().put(schema::dentry_key(req.new_parent, req.new_name),
                  schema::encode_record(DentryRecord{req.ino, rec->attr.mode & S_IFMT}));
  pm::AttrResp resp{rec->attr};
  resp.parent = np->attr;
  PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("link " + quoted(req.new_name)));
  return resp;
}

Result<pm::AttrResp> MetaService::set_attr_applied(const pm::SetAttrReq& req) {
  if ((req.valid & ~kKnownSetAttrBits) != 0) {
    return Status(Code::kInvalid, "setattr: unknown bits in valid mask " + std::to_string(req.valid));
  }
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(req.ino));
  auto& a = rec->attr;
  if ((req.valid & pm::kSetSize) != 0) {
    if (is_dir(a.mode)) return Status(Code::kIsDir, "cannot set the size of directory " + req.ino.to_string());
    if (!is_reg(a.mode)) return Status(Code::kInvalid, "cannot set the size of inode " + req.ino.to_string() + ": not a regular file");
  }
  if ((req.valid & pm::kSetMode) != 0) a.mode = (a.mode & S_IFMT) | (req.mode & 07777);
  if ((req.valid & pm::kSetUid) != 0) a.uid = req.uid;
  if ((req.valid & pm::kSetGid) != 0) a.gid = req.gid;
  if ((req.valid & pm::kSetSize) != 0) {
    a.size = req.size;
    a.generation += 1;
    if ((req.valid & (pm::kSetMtime | pm::kSetMtimeNow)) == 0) a.mtime_ns = now;
  }
  if ((req.valid & pm::kSetAtimeNow) != 0) {
    a.atime_ns = now;
  } else if ((req.valid & pm::kSetAtime) != 0) {
    a.atime_ns = req.atime_ns;
  }
  if ((req.valid & pm::kSetMtimeNow) != 0) {
    a.mtime_ns = now;
  } else if ((req.valid & pm::kSetMtime) != 0) {
    a.mtime_ns = req.mtime_ns;
  }
  a.ctime_ns = now;
  txn.dirty(rec);
  pm::AttrResp resp{a};
  PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("setattr inode " + req.ino.to_string()));
  return resp;
}

Result<pm::AttrResp> MetaService::report_size_applied(const pm::ReportSizeReq& req) {
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(req.ino));
  if (is_dir(rec->attr.mode)) return Status(Code::kIsDir, "inode " + req.ino.to_string() + " is a directory");
  if (!is_reg(rec->attr.mode)) return Status(Code::kInvalid, "inode " + req.ino.to_string() + " is not a regular file");
  rec->attr.size = std::max(rec->attr.size, req.size);
  if (req.mtime_ns != 0) rec->attr.mtime_ns = req.mtime_ns;  // 0: a setattr set it since the writes
  rec->attr.ctime_ns = now;
  rec->attr.generation += 1;
  txn.dirty(rec);
  pm::AttrResp resp{rec->attr};
  PENSTOCK_RETURN_IF_ERROR(commit_change(txn, resp).with_context("report size of inode " + req.ino.to_string()));
  return resp;
}

Status MetaService::set_xattr_applied(const pm::SetXattrReq& req) {
  PENSTOCK_RETURN_IF_ERROR(validate_xattr_name(req.name));
  constexpr uint32_t kCreate = 1, kReplace = 2;
  if ((req.flags & ~(kCreate | kReplace)) != 0 || req.flags == (kCreate | kReplace)) {
    return Status(Code::kInvalid, "setxattr: bad flags " + std::to_string(req.flags));
  }
  // Linux returns E2BIG for an oversized value; our code table's nearest is kRange (ERANGE).
  if (req.value.size() > pm::kMaxXattrValueBytes) {
    return Status(Code::kRange, "xattr value of " + std::to_string(req.value.size()) + " bytes is larger than 64 KiB");
  }
  std::lock_guard lock(mu_);
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(req.ino));
  std::string key = schema::xattr_key(req.ino, req.name);
  PENSTOCK_ASSIGN_OR_RETURN(auto existing, store_->get(key));
  if ((req.flags & kCreate) != 0 && existing.has_value()) {
    return Status(Code::kExists, "xattr " + quoted(req.name) + " already exists on inode " + req.ino.to_string());
  }
  if ((req.flags & kReplace) != 0 && !existing.has_value()) {
    return Status(Code::kNoData, "no xattr " + quoted(req.name) + " on inode " + req.ino.to_string());
  }
  if (!existing.has_value()) {
    // A new name must leave the list of names within what listxattr can return.
    uint64_t list_bytes = req.name.size() + 1;
    const std::string prefix = schema::xattr_prefix(req.ino);
    PENSTOCK_RETURN_IF_ERROR(store_->scan(prefix, prefix, [&](std::string_view k, std::string_view) {
      list_bytes += k.size() - prefix.size() + 1;
      return list_bytes <= pm::kMaxXattrListBytes;
    }));
    if (list_bytes > pm::kMaxXattrListBytes) {
      return Status(Code::kNoSpace, "inode " + req.ino.to_string() + " has no room for xattr " + quoted(req.name) +
                                        ": its names would pass the 64 KiB a listing holds; remove some first");
    }
  }
  txn.batch().put(std::move(key), req.value);
  rec->attr.ctime_ns = options_.now();
  txn.dirty(rec);
  return commit_change(txn, proto::Empty{}).with_context("setxattr on inode " + req.ino.to_string());
}

Status MetaService::remove_xattr_applied(const pm::GetXattrReq& req) {
  PENSTOCK_RETURN_IF_ERROR(validate_xattr_name(req.name));
  std::lock_guard lock(mu_);
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need(req.ino));
  std::string key = schema::xattr_key(req.ino, req.name);
  PENSTOCK_ASSIGN_OR_RETURN(auto existing, store_->get(key));
  if (!existing.has_value()) return Status(Code::kNoData, "no xattr " + quoted(req.name) + " on inode " + req.ino.to_string());
  txn.batch().del(std::move(key));
  rec->attr.ctime_ns = options_.now();
  txn.dirty(rec);
  return commit_change(txn, proto::Empty{}).with_context("removexattr on inode " + req.ino.to_string());
}

Result<pm::AttrResp> MetaService::open_file_applied(const pm::OpenReq& req, bool* orphan) {
  std::lock_guard lock(mu_);
  if (!session_alive(req.session)) {
    return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired; register a new session");
  }
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, req.ino));
  if (!rec.has_value()) return Status(Code::kNotFound, "inode " + req.ino.to_string() + " does not exist");
  *orphan = rec->attr.nlink == 0;
  PENSTOCK_RETURN_IF_ERROR(add_open_locked(req.session, req.ino, *orphan).with_context("open inode " + req.ino.to_string()));
  return pm::AttrResp{rec->attr};
}

// Counts one open of `ino` by `session` and writes the open records that are due; an orphan's
// (opened by inode after its unlink) at once. A failed write drops the open again.
// REQUIRES: mu_ held.
Status MetaService::add_open_locked(SessionId session, InodeId ino, bool orphan) {
  const int64_t now = options_.now();
  opens_.add(session, ino, now);
  WriteBatch batch;
  if (orphan) opens_.store_inode(ino, &batch);
  opens_.flush_aged(now, options_.open_store_delay_ns, &batch);
  if (!batch.empty()) {
    if (Status st = store_->apply(batch); !st.is_ok()) {
      opens_.written_dropped();
      opens_.drop(session, ino, 1, now);
      return st;
    }
    opens_.written_applied();
  }
  if (unreclaimed_.count(session.value) != 0) {
    uint32_t& n = opened_unreclaimed_[session.value][ino.value];
    if (n < UINT32_MAX) ++n;
  }
  return Status::ok();
}

void MetaService::reclaimed_locked(uint64_t session) {
  unreclaimed_.erase(session);
  opened_unreclaimed_.erase(session);
}

// Drops `times` opens of `ino` by `session` in `txn`; the last one finalizes an unlinked inode that
// no other session has open. An open the session does not hold is nothing to release (a repeated
// release, an expired session).
// REQUIRES: mu_ held; no other release of the same (session, ino) pending in `txn`.
Status MetaService::release_in(Txn& txn, SessionId session, InodeId ino, uint32_t times, bool* queued) {
  const int64_t now = options_.now();
  if (opens_.count(session, ino) == 0) return Status::ok();  // not open: nothing to release
  if (txn.release_open(session, ino, times, now) > 0 || opens_.has_other(ino, session)) return Status::ok();
  // Only the last close of an unlinked file does more: its open records go with it.
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.find(ino));
  if (rec == nullptr || rec->attr.nlink != 0) return Status::ok();
  opens_.store_inode(ino, &txn.batch());
  if (waits_for_reclaim_locked(ino, now)) return Status::ok();
  PENSTOCK_RETURN_IF_ERROR(finalize_inode(txn, *rec, now, queued));
  return Status::ok();
}

Status MetaService::release_applied(const pm::ReleaseReq& req) {
  bool queued = false;
  {
    std::lock_guard lock(mu_);
    Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
    PENSTOCK_RETURN_IF_ERROR(release_in(txn, req.session, req.ino, 1, &queued));
    opens_.flush_aged(options_.now(), options_.open_store_delay_ns, &txn.batch());
    PENSTOCK_RETURN_IF_ERROR(txn.commit().with_context("release inode " + req.ino.to_string()));
  }
  notify_gc(queued);
  return Status::ok();
}

// Every release of the batch in one transaction (one store write). Should one of them fail, each
// is applied on its own instead, so the others still land and the first error is returned.
Status MetaService::release_many_applied(const pm::ReleaseManyReq& req) {
  std::map<uint64_t, uint32_t> times;  // an inode opened twice may be released twice in one batch
  for (InodeId ino : req.inos) ++times[ino.value];
  bool queued = false;
  Status st;
  {
    std::lock_guard lock(mu_);
    Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
    for (const auto& [ino, n] : times) {
      st = release_in(txn, req.session, InodeId(ino), n, &queued);
      if (!st.is_ok()) break;
    }
    if (st.is_ok()) {
      opens_.flush_aged(options_.now(), options_.open_store_delay_ns, &txn.batch());
      st = txn.commit().with_context("release " + std::to_string(times.size()) + " inodes");
    }
  }
  if (st.is_ok()) {
    notify_gc(queued);
    return st;
  }
  Status first;
  for (InodeId ino : req.inos) {
    Status one = release_applied(pm::ReleaseReq{ino, req.session});
    if (!one.is_ok() && first.is_ok()) first = std::move(one);
  }
  return first;
}

Status MetaService::set_layout_applied(const pm::SetLayoutReq& req) {
  PENSTOCK_RETURN_IF_ERROR(layout::validate_chunk_size(req.chunk_size));
  std::lock_guard lock(mu_);
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.need_dir(req.ino));
  rec->attr.layout.chunk_size = req.chunk_size;
  rec->attr.layout.stripe_count = req.stripe_count;
  rec->attr.layout.seed = 0;
  rec->attr.layout.chains.clear();
  txn.dirty(rec);
  return commit_change(txn, proto::Empty{}).with_context("set layout of directory " + req.ino.to_string());
}

Result<pm::StatFsResp> MetaService::stat_fs() {
  std::lock_guard lock(mu_);
  pm::StatFsResp resp;
  for (const auto& [id, t] : targets_) {
    if (!t.online) continue;
    resp.total_bytes += t.rec.capacity_bytes;
    resp.free_bytes += t.rec.free_bytes;
  }
  // Inodes are not a preallocated resource here; report plenty free.
  resp.used_inodes = used_inodes_;
  resp.total_inodes = used_inodes_ + (uint64_t{1} << 32);
  resp.block_size = 4096;
  resp.max_name = pm::kMaxNameBytes;
  return resp;
}

// ---------------------------------------------------------------------------------------------
// Cluster map

Result<pm::ClusterMapResp> MetaService::get_cluster_map() {
  std::lock_guard lock(mu_);
  pm::ClusterMapResp resp;
  resp.map.version = map_version_;
  for (const auto& [id, n] : nodes_) {
    resp.map.nodes.push_back(proto::NodeInfo{n.rec.id, n.rec.address, n.online, n.last_heartbeat_ns});
  }
  for (const auto& [id, t] : targets_) {
    resp.map.targets.push_back(
        proto::TargetInfo{t.rec.id, t.rec.node, t.rec.path, t.rec.capacity_bytes, t.rec.free_bytes, t.online});
  }
  for (const auto& [id, c] : chains_) resp.map.chains.push_back(c);
  return resp;
}

Result<pm::RegisterNodeResp> MetaService::register_node_applied(const pm::RegisterNodeReq& req) {
  if (req.node_uuid.empty()) return Status(Code::kInvalid, "register node: empty node uuid");
  auto ep = net::Endpoint::parse(req.address);
  if (!ep.has_value()) return std::move(ep).error().with_context("register node " + req.node_uuid + ": bad address");
  std::set<std::string> seen;
  for (const auto& t : req.targets) {
    if (t.uuid.empty()) return Status(Code::kInvalid, "register node " + req.node_uuid + ": a target has an empty uuid");
    if (!seen.insert(t.uuid).second) return Status(Code::kInvalid, "register node " + req.node_uuid + ": target uuid " + t.uuid + " listed twice");
    if (!t.fs_id.empty() && t.fs_id != fs_id_) {
      return Status(Code::kInvalid, "target " + t.path + " (uuid " + t.uuid + ") belongs to file system " + t.fs_id +
                                        ", but this penstock-meta serves file system " + fs_id_ +
                                        ": is --meta wrong, or was the metadata database replaced? Its chunks are "
                                        "not this namespace's; start the data server with that file system's meta");
    }
  }
  std::lock_guard lock(mu_);
  int64_t now = options_.now();
  WriteBatch batch;
  // Work on copies; they replace the live state only once the batch is durable.
  uint64_t next_node = next_node_, next_target = next_target_;
  NodeState node;
  if (const NodeState* known = find_by_uuid(nodes_, req.node_uuid)) {
    node = *known;
  } else {
    node.rec.id = NodeId(next_node++);
    node.rec.uuid = req.node_uuid;
    batch.put(schema::node_uuid_key(req.node_uuid), u64_record(node.rec.id.value));
    batch.put(std::string(schema::kNextNode), u64_record(next_node));
  }
  node.rec.address = req.address;
  node.online = true;
  node.last_heartbeat_ns = now;
  batch.put(schema::node_key(node.rec.id), schema::encode_record(node.rec));

  pm::RegisterNodeResp resp;
  resp.node = node.rec.id;
  resp.fs_id = fs_id_;
  std::vector<TargetState> new_targets;
  std::vector<proto::ChainInfo> new_chains;
  for (const auto& rep : req.targets) {
    TargetState t;
    const TargetState* existing = find_by_uuid(targets_, rep.uuid);
    if (existing != nullptr) {
      t = *existing;
    } else if (rep.fs_id.empty() && rep.has_chunks) {
      // Nothing is applied yet: the whole registration is refused.
      return Status(Code::kInvalid, "target " + rep.path + " (uuid " + rep.uuid + ") holds chunks but belongs to no "
                                        "file system and was never registered with this one: is --meta wrong? If "
                                        "its chunks are garbage, empty its chunks/ directory");
    } else {
      t.rec.id = TargetId(next_target++);
      t.rec.uuid = rep.uuid;
      batch.put(schema::target_uuid_key(rep.uuid), u64_record(t.rec.id.value));
      batch.put(std::string(schema::kNextTarget), u64_record(next_target));
      // v0: one chain per target, replication 1, chain id = target id.
      proto::ChainInfo chain{ChainId(t.rec.id.value), {t.rec.id}};
      batch.put(schema::chain_key(chain.id), schema::encode_record(chain));
      new_chains.push_back(std::move(chain));
    }
    t.rec.node = node.rec.id;
    t.rec.path = rep.path;
    t.rec.capacity_bytes = rep.capacity_bytes;
    t.rec.free_bytes = rep.free_bytes;
    t.online = true;
    batch.put(schema::target_key(t.rec.id), schema::encode_record(t.rec));
    resp.targets.push_back(t.rec.id);
    new_targets.push_back(std::move(t));
  }
  PENSTOCK_RETURN_IF_ERROR(bump_map_version(&batch));
  Status st = store_->apply(batch);
  if (!st.is_ok()) {
    --map_version_;
    return st.with_context("register node " + req.node_uuid);
  }
  next_node_ = next_node;
  next_target_ = next_target;
  // Targets of this node that it no longer reports are offline.
  for (auto& [id, t] : targets_) {
    if (t.rec.node == node.rec.id) t.online = false;
  }
  for (auto& t : new_targets) targets_[t.rec.id.value] = std::move(t);
  for (auto& c : new_chains) chains_[c.id.value] = std::move(c);
  nodes_[node.rec.id.value] = node;
  resp.map_version = map_version_;
  PENSTOCK_LOG(Info) << "data server " << req.node_uuid << " registered as node " << node.rec.id.value << " at "
                     << req.address << " with " << req.targets.size() << " targets; map version " << map_version_;
  return resp;
}

Result<pm::HeartbeatResp> MetaService::node_heartbeat_applied(const pm::NodeHeartbeatReq& req) {
  std::lock_guard lock(mu_);
  auto nit = nodes_.find(req.node.value);
  if (nit == nodes_.end()) {
    return Status(Code::kNotFound, "node " + req.node.to_string() + " is not registered; register it again");
  }
  std::vector<TargetState*> reported;
  for (const auto& rep : req.targets) {
    TargetState* found = nullptr;
    for (auto& [id, t] : targets_) {
      if (t.rec.uuid == rep.uuid && t.rec.node == req.node) found = &t;
    }
    if (found == nullptr) {
      return Status(Code::kNotFound, "target " + rep.uuid + " is not registered for node " + req.node.to_string() +
                                         "; register the node again");
    }
    reported.push_back(found);
  }
  bool changed = !nit->second.online;
  for (size_t i = 0; i < reported.size(); ++i) {
    changed = changed || !reported[i]->online;
  }
  if (changed) {
    WriteBatch batch;
    PENSTOCK_RETURN_IF_ERROR(bump_map_version(&batch));
    Status st = store_->apply(batch);
    if (!st.is_ok()) {
      --map_version_;
      return st.with_context("node heartbeat");
    }
    PENSTOCK_LOG(Info) << "node " << req.node.value << " is online again; map version " << map_version_;
    const int64_t last = nit->second.last_heartbeat_ns;
    if (!nit->second.online && last != 0 && options_.now() - last > options_.node_timeout_ns) {
      PENSTOCK_LOG(Warn) << "node " << req.node.value << " sent no heartbeat for " << (options_.now() - last) / 1'000'000
                         << " ms, past the node timeout (" << options_.node_timeout_ns / 1'000'000
                         << " ms), and was offline meanwhile: keep its --heartbeat-ms well under --node-timeout-s, "
                         << "or look for what stalls it";
    }
  }
  nit->second.online = true;
  nit->second.last_heartbeat_ns = options_.now();
  for (size_t i = 0; i < reported.size(); ++i) {
    reported[i]->online = true;
    reported[i]->rec.capacity_bytes = req.targets[i].capacity_bytes;
    reported[i]->rec.free_bytes = req.targets[i].free_bytes;
  }
  return pm::HeartbeatResp{map_version_};
}

// ---------------------------------------------------------------------------------------------
// Maintenance and GC support

bool MetaService::reclaim_grace_locked(int64_t now) const { return !unreclaimed_.empty() && now < reclaim_until_ns_; }

bool MetaService::waits_for_reclaim_locked(InodeId ino, int64_t now) const {
  return grace_orphans_.count(ino.value) != 0 && reclaim_grace_locked(now);
}

Status MetaService::end_reclaim_grace_locked(int64_t now, bool* queued) {
  if (reclaim_grace_locked(now)) return Status::ok();
  if (!reclaim_wait_over_) {
    reclaim_wait_over_ = true;
    if (unreclaimed_.empty()) {
      PENSTOCK_LOG(Info) << "every session found at the start has sent its open files";
    } else {
      std::string ids;
      for (uint64_t id : unreclaimed_) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
      PENSTOCK_LOG(Warn) << "the wait for the open files of the sessions found at the start is over (one session lease); "
                         << "session(s) " << ids << " did not send theirs (an older penstock-mount, or one cut off): "
                         << "a file they opened just before the last stop may lose its data when unlinked";
    }
    // Their opens are no longer counted apart: a session that never sends its list would grow
    // that count by every file it opens, for as long as it lives. A list sent later is taken
    // as one from a session registered after the start (the larger of the two counts).
    unreclaimed_.clear();
    opened_unreclaimed_.clear();
  }
  if (grace_orphans_.empty()) return Status::ok();
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  for (uint64_t ino : grace_orphans_) {
    if (opens_.has_other(InodeId(ino), SessionId())) continue;  // an ordinary orphan now: its last close ends it
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.find(InodeId(ino)));
    if (rec != nullptr && rec->attr.nlink == 0) {
      opens_.store_inode(InodeId(ino), &txn.batch());  // closed opens still in the store
      PENSTOCK_RETURN_IF_ERROR(finalize_inode(txn, *rec, now, queued));
    }
  }
  PENSTOCK_RETURN_IF_ERROR(txn.commit().with_context("finalize files unlinked while the sessions sent their opens"));
  PENSTOCK_LOG(Info) << grace_orphans_.size() << " file(s) unlinked after the start waited for the sessions' opens; "
                     << "those no session has open are removed now";
  grace_orphans_.clear();
  return Status::ok();
}

Status MetaService::reclaim_opens_applied(const pm::ReclaimOpensReq& req, bool* queued, bool* wrote) {
  std::lock_guard lock(mu_);
  if (!session_alive(req.session)) {
    return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired; register a new session");
  }
  const int64_t now = options_.now();
  // What the session holds by inode: its count, plus what this server counted since the start
  // (opened_unreclaimed_); with `last`, also the inodes it did not list.
  std::map<uint64_t, uint64_t> want;
  const auto since = opened_unreclaimed_.find(req.session.value);
  for (const pm::OpenCount& o : req.opens) {
    uint64_t w = o.count;
    if (since != opened_unreclaimed_.end()) {
      if (auto i = since->second.find(o.ino.value); i != since->second.end()) w += i->second;
    }
    uint64_t& at = want[o.ino.value];
    at = std::max(at, w);  // an inode listed twice counts once
  }
  if (req.last && since != opened_unreclaimed_.end()) {
    for (const auto& [ino, n] : since->second) want.try_emplace(ino, n);
  }
  Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
  size_t added = 0;
  for (const auto& [ino_value, w] : want) {
    const InodeId ino(ino_value);
    PENSTOCK_ASSIGN_OR_RETURN(InodeRecord * rec, txn.find(ino));
    if (rec == nullptr) continue;  // gone, or a create behind not applied yet (its batch opens it)
    const uint32_t have = opens_.count(req.session, ino);
    const auto target = static_cast<uint32_t>(std::min<uint64_t>(w, UINT32_MAX));
    if (target <= have) continue;
    opens_.add(req.session, ino, now, target - have);
    txn.undo_on_failure([this, s = req.session, ino, n = target - have] { opens_.drop(s, ino, n, 0); });
    if (rec->attr.nlink == 0) {
      opens_.store_inode(ino, &txn.batch());  // an orphan's opens are kept at once
      *wrote = true;
    }
    ++added;
  }
  PENSTOCK_RETURN_IF_ERROR(txn.commit().with_context("take back the opens of session " + req.session.to_string()));
  if (added != 0) {
    PENSTOCK_LOG(Info) << "session " << req.session.to_string() << " sent " << added
                       << " open(s) this server had not kept across its restart";
  }
  if (req.last) reclaimed_locked(req.session.value);
  return end_reclaim_grace_locked(now, queued);
}

Status MetaService::store_opens() {
  std::lock_guard lock(mu_);
  WriteBatch batch;
  if (!opens_.flush_aged(options_.now(), 0, &batch)) return Status::ok();
  Status st = store_->apply(batch);
  if (!st.is_ok()) {
    opens_.written_dropped();
    return st.with_context("store open records");
  }
  opens_.written_applied();
  return st;
}

Status MetaService::expire_applied() {
  bool queued = false;
  Status first;
  {
    std::lock_guard lock(mu_);
    int64_t now = options_.now();
    std::vector<uint64_t> expired;
    for (const auto& [id, s] : sessions_) {
      if (s.expires_ns < now) expired.push_back(id);
    }
    for (uint64_t id : expired) {
      Status st = drop_opens_of_session(SessionId(id), &queued);
      if (!st.is_ok()) {
        if (first.is_ok()) first = st.with_context("expire session " + std::to_string(id));
        continue;
      }
      sessions_.erase(id);
      reclaimed_locked(id);
      dir_leases_.drop_session(SessionId(id));
      PENSTOCK_LOG(Info) << "session " << id << " expired (no heartbeat within the lease); its opens were dropped";
    }
    if (Status st = end_reclaim_grace_locked(now, &queued); !st.is_ok() && first.is_ok()) first = st;
    WriteBatch aged;
    if (opens_.flush_aged(now, options_.open_store_delay_ns, &aged)) {
      if (Status st = store_->apply(aged); !st.is_ok()) {
        opens_.written_dropped();
        if (first.is_ok()) first = st.with_context("store open records");
      } else {
        opens_.written_applied();
      }
    }
    std::vector<uint64_t> offline;
    for (const auto& [id, n] : nodes_) {
      if (n.online && now - n.last_heartbeat_ns > options_.node_timeout_ns) offline.push_back(id);
    }
    if (!offline.empty()) {
      WriteBatch batch;
      Status st = bump_map_version(&batch);
      if (st.is_ok()) st = store_->apply(batch);
      if (!st.is_ok()) {
        --map_version_;
        if (first.is_ok()) first = st.with_context("mark nodes offline");
      } else {
        for (uint64_t id : offline) {
          nodes_[id].online = false;
          for (auto& [tid, t] : targets_) {
            if (t.rec.node.value == id) t.online = false;
          }
          PENSTOCK_LOG(Warn) << "node " << id << " (" << nodes_[id].rec.address
                             << ") missed its heartbeats and is offline; map version " << map_version_;
        }
      }
    }
  }
  notify_gc(queued);
  return first;
}

Result<std::vector<GcTask>> MetaService::gc_pending(InodeId after, size_t max) {
  // The queue's inode numbers come from memory (gc_queue_), not from a scan of g/: collected
  // entries leave tombstones at the front of g/ that a scan from the start would walk over on
  // every pass, which made a pass cost O(everything ever collected).
  std::vector<uint64_t> inos;
  {
    std::lock_guard lock(mu_);
    for (auto it = gc_queue_.upper_bound(after.value); it != gc_queue_.end() && inos.size() < max; ++it) {
      inos.push_back(*it);
    }
  }
  std::vector<std::pair<InodeId, std::vector<ChainId>>> jobs;
  for (uint64_t ino : inos) {
    std::string key = schema::gc_key(InodeId(ino));
    // Read through a reference: moving the optional<string> out trips gcc 12's
    // -Wmaybe-uninitialized under ASan at -O2 (a false positive).
    auto got = store_->get(key);
    if (!got.has_value()) return got.error();
    const std::optional<std::string>& v = *got;
    if (!v.has_value()) continue;  // collected meanwhile
    PENSTOCK_ASSIGN_OR_RETURN(auto rec, schema::decode_record<schema::GcRecord>(*v, key));
    jobs.emplace_back(rec.attr.ino, rec.attr.layout.chains);
  }
  std::vector<GcTask> out;
  {
    std::lock_guard lock(mu_);
    for (auto& [ino, chains] : jobs) {
      GcTask task{ino, {}};
      for (ChainId c : chains) {
        auto it = chains_.find(c.value);
        if (it == chains_.end()) continue;
        for (TargetId t : it->second.targets) {
          if (std::find(task.targets.begin(), task.targets.end(), t) == task.targets.end()) task.targets.push_back(t);
        }
      }
      out.push_back(std::move(task));
    }
  }
  // The queue entries may not be synced yet (their unlink is not acknowledged yet). Each was
  // applied, and noted by the store, before it entered gc_queue_ under mu_: after this sync none
  // can be lost, so no chunk is removed for an unlink that a crash would undo.
  PENSTOCK_RETURN_IF_ERROR(store_->sync().with_context("sync before garbage collection"));
  return out;
}

Status MetaService::gc_done_applied(InodeId ino) {
  std::lock_guard lock(mu_);
  WriteBatch batch;
  batch.del(schema::gc_key(ino));
  PENSTOCK_RETURN_IF_ERROR(store_->apply(batch).with_context("finish collecting inode " + ino.to_string()));
  gc_queue_.erase(ino.value);
  return Status::ok();
}

Result<std::string> MetaService::target_address(TargetId target) {
  std::lock_guard lock(mu_);
  auto it = targets_.find(target.value);
  if (it == targets_.end()) return Status(Code::kNotFound, "target " + target.to_string() + " is not in the cluster map");
  auto nit = nodes_.find(it->second.rec.node.value);
  if (nit == nodes_.end()) return Status(Code::kNotFound, "node of target " + target.to_string() + " is not in the cluster map");
  return nit->second.rec.address;
}

// ---------------------------------------------------------------------------------------------
// Acknowledgement (group commit)
//
// Every mutation runs as *_applied: under mu_ it validates and applies its batch to the store
// (visible at once, not yet synced), then releases mu_. The public method then waits in
// store_->sync() until a WAL sync covers everything applied so far, so concurrent mutations share
// one fsync. Errors wait too: a reply never reports state (e.g. kExists for a name another client
// just created) that a crash could still take back. Creating or removing one name (create, mkdir,
// mknod, symlink, unlink) and a close's size report instead hand the WAL to the kernel
// (sync_soon: safe from a kill of penstock-meta, synced within --close-sync-ms), as a local file
// system's create is durable only at the next journal commit or fsync; fsync and fsyncdir send
// SyncLog. docs/meta-store.md "Durability" has the why.

template <class T>
T MetaService::durable(T result) {
  const uint64_t reserved = ino_batch_end_.load(std::memory_order_acquire);  // applied before the sync starts
  Status st = store_->sync();
  if (!st.is_ok()) return st;
  raise_ino_synced_end(reserved);
  return result;
}

template <class T>
T MetaService::handed(T result) {
  Status st = store_->sync_soon();
  if (!st.is_ok()) return st.with_context("the change is applied but not in the write-ahead log, and may be lost when the database is opened again");
  return result;
}

Result<pm::RegisterSessionResp> MetaService::register_session(const pm::RegisterSessionReq& req) {
  return durable(register_session_applied(req));
}
Status MetaService::close_session(const pm::SessionReq& req) { return durable(close_session_applied(req)); }
Result<pm::AttrResp> MetaService::make_node(InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                            const proto::Caller& caller, SessionId open_for, SessionId requester,
                                            const std::string& symlink_target) {
  DirLeases::Change change(dir_leases_, parent, requester);
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(change.wait_ns(), parent));
  // A number taken for a create that then fails (the name exists, ...) is skipped.
  PENSTOCK_ASSIGN_OR_RETURN(InodeId ino, take_inode_number());
  auto r = make_node_applied(parent, name, mode, rdev, caller, open_for, symlink_target, ino);
  if (!r.has_value()) return durable(std::move(r));
  return handed(std::move(r));
}
Status MetaService::change_victim_dir(InodeId parent, const std::string& name, SessionId session,
                                      std::optional<DirLeases::Change>* out, InodeId* checked) {
  *checked = InodeId{0};
  if (!validate_name(name).is_ok()) return Status::ok();  // the change itself says what is wrong
  PENSTOCK_ASSIGN_OR_RETURN(auto d, read_dentry(store_, parent, name));
  if (!d.has_value() || !is_dir(d->type)) return Status::ok();
  *checked = d->ino;
  out->emplace(dir_leases_, d->ino, session);
  return leased_elsewhere((*out)->wait_ns(), d->ino);
}

Result<std::vector<InodeId>> MetaService::grant_inodes(SessionId session, uint32_t want) {
  std::lock_guard grant_lock(grant_mu_);  // the room seen is the room given, also for concurrent calls
  std::vector<InodeId> out;
  const size_t held = dir_leases_.inodes_held(session);
  const size_t room = held >= options_.dir_leases.max_inodes_per_session ? 0
                                                                          : options_.dir_leases.max_inodes_per_session - held;
  const size_t n = std::min<size_t>({want, pm::kMaxInodeGrant, room});
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    PENSTOCK_ASSIGN_OR_RETURN(InodeId ino, take_inode_number());
    out.push_back(ino);
  }
  if (out.empty()) return out;
  // Stored before the mount sees them, so a batch made with them is still applied after a restart
  // (the batch deletes each number it uses in its own transaction).
  WriteBatch batch;
  for (InodeId ino : out) batch.put(schema::grant_key(session, ino), "");
  std::lock_guard lock(mu_);  // a session's end (which deletes its keys) comes before or after
  if (!session_alive(session)) {
    return Status(Code::kBadHandle, "session " + session.to_string() + " is unknown or expired; register a new session");
  }
  PENSTOCK_RETURN_IF_ERROR(store_->apply(batch).with_context("store the inode numbers given to session " +
                                                              session.to_string()));
  dir_leases_.give_inodes(session, out);
  return out;
}

Result<pm::DirLeaseResp> MetaService::dir_lease(const pm::DirLeaseReq& req) {
  {
    std::lock_guard lock(mu_);
    if (!session_alive(req.session)) {
      return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired; register a new session");
    }
  }
  PENSTOCK_ASSIGN_OR_RETURN(auto dir, read_dir_inode(store_, req.dir));
  pm::DirLeaseResp resp;
  resp.dir_attr = dir.attr;
  const DirLeases::Grant g = dir_leases_.grant(req.dir, req.session, req.have_names);
  resp.lease_ns = g.lease_ns;
  resp.fresh = g.fresh;
  if (g.lease_ns > 0 && g.fresh) {
    const std::string prefix = schema::dentry_prefix(req.dir);
    bool too_many = false;
    PENSTOCK_RETURN_IF_ERROR(store_->scan(prefix, prefix, [&](std::string_view key, std::string_view) {
      if (resp.names.size() >= pm::kMaxLeasedNames) {
        too_many = true;
        return false;
      }
      resp.names.emplace_back(key.substr(prefix.size()));
      return true;
    }));
    if (too_many || !dir_leases_.confirm(req.dir, req.session)) {
      if (too_many) dir_leases_.release(req.dir, req.session);
      resp.lease_ns = 0;
      resp.fresh = false;
      resp.names.clear();
    }
  }
  if (resp.lease_ns > 0) {
    // An rmdir that ended between the look above and the grant did not see the lease: the
    // directory is looked at again now that the lease holds off every later one.
    auto still = read_dir_inode(store_, req.dir);
    if (!still.has_value()) {
      dir_leases_.release(req.dir, req.session);
      return std::move(still).error();
    }
    resp.dir_attr = still->attr;
  }
  {
    // A session closed or expired since the check above holds nothing.
    std::lock_guard lock(mu_);
    if (!session_alive(req.session)) {
      dir_leases_.drop_session(req.session);
      return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired; register a new session");
    }
  }
  // take_inode_number hands out numbers a completed sync covered only; their u/ keys reach the
  // write-ahead log before the reply (handed), as a batch's do.
  PENSTOCK_ASSIGN_OR_RETURN(resp.inos, grant_inodes(req.session, req.want_inodes));
  if (resp.inos.empty()) return resp;
  return handed(Result<pm::DirLeaseResp>(std::move(resp)));
}

Result<pm::CreateBatchResp> MetaService::create_batch(const pm::CreateBatchReq& req) {
  if (req.entries.size() > pm::kMaxCreateBatch) {
    return Status(Code::kInvalid, std::to_string(req.entries.size()) + " creates in one CreateBatch; at most " +
                                      std::to_string(pm::kMaxCreateBatch));
  }
  pm::CreateBatchResp resp;
  resp.results.reserve(req.entries.size());
  {
    // The holder's own change: never waits while it holds dir, and keeps anyone else from dropping
    // the hold halfway through the batch. A batch that comes after the hold ended (another mount
    // looked at dir meanwhile) is applied all the same: the mount told its applications these
    // files exist, and refusing them would only make what the other mount saw permanent. Only
    // while someone else holds dir now must it wait.
    DirLeases::Change change(dir_leases_, req.dir, req.session);
    PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(change.wait_ns(), req.dir));
    const bool held = dir_leases_.holds(req.dir, req.session);
    // The whole batch is one transaction (one store write).
    std::lock_guard lock(mu_);
    const int64_t now = options_.now();
    if (!session_alive(req.session)) {
      return Status(Code::kBadHandle, "session " + req.session.to_string() + " is unknown or expired; register a new session");
    }
    // As a whole (the mount sends it again): a refused entry would lose its file for good.
    PENSTOCK_RETURN_IF_ERROR(usable_chains_locked().status());
    Txn txn(store_, &used_inodes_, &gc_queue_, &opens_);
    std::unordered_set<std::string_view> names;  // made in this batch (the store does not show them yet)
    for (const pm::CreateBehind& e : req.entries) {
      pm::CreateResult r;
      Status st = validate_name(e.name);
      if (!st.is_ok()) {
      } else if (names.count(e.name) != 0) {
        st = Status(Code::kExists, quoted(e.name) + " already exists in directory " + req.dir.to_string());
      } else if (!dir_leases_.take_inode(req.session, e.ino)) {
        // Sent again after a lost reply: the entry was applied if its name has its number, and
        // refused as existing if its name has another (kInvalid would make the mount drop every
        // number it holds).
        Result<std::optional<DentryRecord>> again = read_dentry(store_, req.dir, e.name);
        if (!again.has_value()) {
          st = again.error();
        } else if (again->has_value() && (*again)->ino == e.ino) {
          auto rec = read_inode(store_, e.ino);
          if (!rec.has_value()) {
            st = rec.error();
          } else if (!rec->has_value()) {
            st = Status(Code::kNotFound, "inode " + e.ino.to_string() + " of " + quoted(e.name) + " is gone");
          } else {
            r.attr = std::move((*rec)->attr);
          }
        } else if (again->has_value()) {
          st = Status(Code::kExists, quoted(e.name) + " already exists in directory " + req.dir.to_string());
        } else {
          st = Status(Code::kInvalid, "inode number " + e.ino.to_string() + " was not given to session " +
                                          req.session.to_string() + " (or is used already)");
        }
      } else {
        txn.batch().del(schema::grant_key(req.session, e.ino));  // used, also when the create fails
        auto a = make_node_in(txn, req.dir, e.name, S_IFREG | (e.mode & 07777), 0, e.caller,
                              e.open ? req.session : SessionId(), "", e.ino, now);
        if (a.has_value()) {
          r.attr = std::move(a->attr);
          names.insert(e.name);
        } else {
          st = a.error();
        }
      }
      r.code = static_cast<uint32_t>(st.code());
      if (!st.is_ok()) r.message = st.message();
      resp.results.push_back(std::move(r));
    }
    if (Status st = txn.commit(); !st.is_ok()) {
      for (pm::CreateResult& r : resp.results) {
        if (r.code != static_cast<uint32_t>(Code::kOk)) continue;
        r.code = static_cast<uint32_t>(st.code());
        r.message = "create behind in directory " + req.dir.to_string() + ": " + st.message();
        r.attr.reset();
      }
    } else if (!held && !names.empty()) {
      PENSTOCK_LOG(Info) << names.size() << " files created behind by session " << req.session.to_string()
                         << " in directory " << req.dir.to_string()
                         << " were applied after its lease ended (another mount may have listed the directory without them)";
    }
  }
  resp.lease_ns = dir_leases_.renew(req.dir, req.session);
  // The batch is committed: a failed refill must not turn its answer into an error (the mount
  // would count its files as lost). The mount asks again with its next batch or lease.
  if (Result<std::vector<InodeId>> inos = grant_inodes(req.session, req.want_inodes); inos.has_value()) {
    resp.inos = std::move(*inos);
  } else {
    PENSTOCK_LOG(Warn) << "no inode numbers for session " << req.session.to_string() << " with its batch: "
                       << inos.error().to_string();
  }
  return handed(Result<pm::CreateBatchResp>(std::move(resp)));
}

Result<pm::UnlinkResp> MetaService::unlink(const pm::NameReq& req) {
  DirLeases::Change change(dir_leases_, req.parent, req.session);
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(change.wait_ns(), req.parent));
  Result<pm::UnlinkResp> r = unlink_applied(req);
  if (!r.has_value()) return durable(std::move(r));
  return handed(std::move(r));
}
Result<pm::DirsResp> MetaService::rmdir(const pm::NameReq& req) {
  DirLeases::Change dir_change(dir_leases_, req.parent, req.session);
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(dir_change.wait_ns(), req.parent));
  std::optional<DirLeases::Change> victim;
  InodeId checked;
  PENSTOCK_RETURN_IF_ERROR(change_victim_dir(req.parent, req.name, req.session, &victim, &checked));
  EntryLeases::Change change(leases_, {{req.parent, req.name}}, req.session);
  return durable(rmdir_applied(req, checked));
}
Result<pm::DirsResp> MetaService::rename(const pm::RenameReq& req) {
  DirLeases::Change from_dir(dir_leases_, req.parent, req.session);
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(from_dir.wait_ns(), req.parent));
  std::optional<DirLeases::Change> to_dir;
  if (req.new_parent != req.parent) {
    to_dir.emplace(dir_leases_, req.new_parent, req.session);
    PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(to_dir->wait_ns(), req.new_parent));
  }
  std::optional<DirLeases::Change> victim;  // a directory the rename may replace
  InodeId checked;
  PENSTOCK_RETURN_IF_ERROR(change_victim_dir(req.new_parent, req.new_name, req.session, &victim, &checked));
  const EntryLeases::Name from{req.parent, req.name}, to{req.new_parent, req.new_name};
  EntryLeases::Change change(leases_, {from, to}, req.session);
  Result<pm::DirsResp> r = durable(rename_applied(req, checked));
  if (r.has_value()) {
    change.moved(from, to);
    if ((req.flags & pm::kRenameExchange) != 0) change.moved(to, from);
  }
  return r;
}
Result<pm::AttrResp> MetaService::link(const pm::LinkReq& req) {
  DirLeases::Change change(dir_leases_, req.new_parent, req.session);
  PENSTOCK_RETURN_IF_ERROR(leased_elsewhere(change.wait_ns(), req.new_parent));
  return durable(link_applied(req));
}
Result<pm::AttrResp> MetaService::set_attr(const pm::SetAttrReq& req) { return durable(set_attr_applied(req)); }
Result<pm::AttrResp> MetaService::report_size(const pm::ReportSizeReq& req) { return durable(report_size_applied(req)); }
// A close's report is as durable as the data it describes: close() syncs neither (fsync() does,
// with SyncLog for a size a close reported). docs/meta-store.md "Durability".
Result<pm::AttrResp> MetaService::report_size_at_close(const pm::ReportSizeReq& req) {
  auto r = report_size_applied(req);
  if (!r.has_value()) return r;
  return handed(std::move(r));
}
Status MetaService::sync_log() { return durable(Status::ok()); }
Result<std::string> MetaService::replay(const pm::ReplayReq& req, const std::function<Result<std::string>()>& change,
                                        bool may_wait) {
  const std::string where = "change " + std::to_string(req.seq) + " in reply slot " + std::to_string(req.slot) +
                            " of session " + req.session.to_string();
  if (req.slot >= pm::kReplySlots) {
    return Status(Code::kInvalid, where + ": slots are 0.." + std::to_string(pm::kReplySlots - 1));
  }
  if (req.seq == 0) return Status(Code::kInvalid, where + ": sequence numbers start at 1");
  // The session is checked where the change commits (commit_change, under mu_): taking mu_ here
  // too would make every change wait for the mutation running beside it twice.
  const uint64_t request_hash =
      checksum::xxh3(proto::bytes_of(req.message));
  // One change per slot at a time: a repeat that comes while the first runs (its connection broke,
  // this server lives) waits for the first's reply instead of running beside it; for a while only,
  // then it is told to come again (which its sender does, same slot and number).
  const std::pair<uint64_t, uint32_t> slot{req.session.value, req.slot};
  {
    std::unique_lock lock(replay_mu_);
    if (!replay_cv_.wait_for(lock, may_wait ? kRepeatWait : std::chrono::seconds(0),
                             [&] { return replaying_.count(slot) == 0; })) {
      return Status(Code::kUnavailable, where + ": the slot's change still runs; send it again");
    }
    replaying_.insert(slot);
  }
  struct Leave {
    MetaService* self;
    std::pair<uint64_t, uint32_t> slot;
    ~Leave() {
      {
        std::lock_guard lock(self->replay_mu_);
        self->replaying_.erase(slot);
      }
      self->replay_cv_.notify_all();
    }
  } leave{this, slot};

  PENSTOCK_ASSIGN_OR_RETURN(auto stored, store_->get(schema::reply_key(req.session, req.slot)));
  std::optional<schema::ReplyRecord> last;
  if (stored.has_value()) {
    auto rec = schema::decode_record<schema::ReplyRecord>(*stored, "reply record of " + where);
    if (rec.has_value()) {
      last = std::move(*rec);
    } else {
      // A record this server cannot read (damaged, or of another format) must not stop the slot
      // for good: the change runs and its reply replaces it. Only a repeat of the change that
      // wrote it could run twice.
      PENSTOCK_LOG(Warn) << rec.error().to_string() << "; the slot's next change replaces it";
    }
  }
  if (last.has_value()) {
    schema::ReplyRecord& rec = *last;
    if (rec.seq == req.seq) {
      if (rec.method != req.method || rec.request_hash != request_hash) {
        return Status(Code::kInvalid, where + " carries another request than the change that ran under its number");
      }
      // Applied before: the same reply, nothing runs again, as long as the store still stands behind
      // it. After a failed WAL write or sync (sticky) the first send was refused although its
      // change and this reply are visible: they may not survive a restart, so the repeat is
      // refused the same way instead of reporting success.
      if (Status st = store_->sync_soon(); !st.is_ok()) {
        return st.with_context("the stored reply of " + where + " is not known to be in the write-ahead log");
      }
      if (req.method == pm::Create::kId) PENSTOCK_RETURN_IF_ERROR(reopen_created(req, rec.message));
      ++replies_repeated_;
      return std::move(rec.message);
    }
    if (rec.seq > req.seq) {
      return Status(Code::kInvalid, where + " is older than the slot's last change (" + std::to_string(rec.seq) +
                                        "); it is not run");
    }
  }
  const ReplyScope scope{req.session, req.slot, req.seq, req.method, request_hash};
  Result<std::string> r = [&] {
    t_reply_scope = &scope;
    struct Clear {
      ~Clear() { t_reply_scope = nullptr; }
    } clear;
    return change();
  }();
  if (!r.has_value() && r.error().code() != Code::kBadHandle) {
    // A session that ended took its stored replies along: this may be the repeat of a change that
    // was applied, which ran again and failed (kNotFound, kExists, kBusy, ...). Its sender must not
    // take that as the change's answer.
    std::lock_guard lock(mu_);
    if (!session_alive(req.session)) {
      return Status(Code::kBadHandle, "session " + req.session.to_string() +
                                          " is unknown or expired; whether an earlier send of " + where +
                                          " was applied is not known; register a new session");
    }
  }
  return r;
}

// A Create opens its file for its session, in memory until the open is old enough to be written
// (OpenTable), so a restart may have lost the open its stored reply promises: the session gets it
// again, unless it holds the file open already (then the open survived, or the session's mount has
// reclaimed it).
Status MetaService::reopen_created(const pm::ReplayReq& req, const std::string& reply) {
  PENSTOCK_ASSIGN_OR_RETURN(auto create, proto::decode<pm::CreateReq>(proto::bytes_of(req.message)));
  if (!create.session.valid()) return Status::ok();
  PENSTOCK_ASSIGN_OR_RETURN(auto made, proto::decode<pm::AttrResp>(proto::bytes_of(reply)));
  const InodeId ino = made.attr.ino;
  std::lock_guard lock(mu_);
  if (!session_alive(create.session) || opens_.count(create.session, ino) > 0) return Status::ok();
  PENSTOCK_ASSIGN_OR_RETURN(auto rec, read_inode(store_, ino));
  if (!rec.has_value()) return Status::ok();  // gone since: the mount's I/O on it fails as on any removed file
  PENSTOCK_LOG(Info) << "the repeated create of inode " << ino.to_string() << " found its open gone (a restart): "
                     << "session " << create.session.to_string() << " has it open again";
  if (Status st = add_open_locked(create.session, ino, rec->attr.nlink == 0); !st.is_ok()) {
    // Not the change's error (it was applied): its sender tries again.
    return Status(Code::kUnavailable, "the repeated create of inode " + ino.to_string() +
                                          " could not open it again (" + st.to_string() + "); send it again");
  }
  return Status::ok();
}

Status MetaService::set_xattr(const pm::SetXattrReq& req) { return durable(set_xattr_applied(req)); }
Status MetaService::remove_xattr(const pm::GetXattrReq& req) { return durable(remove_xattr_applied(req)); }
// Opens and releases are the hot path of every file read: they live in memory (OpenTable) and are
// not synced. Only an orphan's opens keep chunks alive, and the unlink that orphans a file writes
// them in its own batch, so a crash that keeps the unlink keeps them. An open of a file that is
// already an orphan (opened by inode after its unlink) is therefore written at once and synced. A
// release lost in a crash only keeps an orphan until its session ends; the collector syncs before
// it removes anything. docs/meta-store.md "Durability" and "Open records".
Result<pm::AttrResp> MetaService::open_file(const pm::OpenReq& req) {
  if (options_.on_open) options_.on_open();
  bool orphan = false;
  auto r = open_file_applied(req, &orphan);
  return orphan ? durable(std::move(r)) : r;
}
Status MetaService::release(const pm::ReleaseReq& req) { return release_applied(req); }
Status MetaService::reclaim_opens(const pm::ReclaimOpensReq& req) {
  if (req.opens.size() > pm::kMaxReclaimBatch) {
    return Status(Code::kInvalid, std::to_string(req.opens.size()) + " opens in one ReclaimOpens; at most " +
                                      std::to_string(pm::kMaxReclaimBatch) + " (send several)");
  }
  bool queued = false;
  bool wrote = false;  // only an orphan's opens (and the end of the wait) need the sync
  Status st = reclaim_opens_applied(req, &queued, &wrote);
  if (wrote || queued || !st.is_ok()) st = durable(std::move(st));
  notify_gc(queued);
  return st;
}
Status MetaService::release_many(const pm::ReleaseManyReq& req) {
  if (req.inos.size() > pm::kMaxReleaseBatch) {
    return Status(Code::kInvalid, std::to_string(req.inos.size()) + " releases in one ReleaseMany; at most " +
                                      std::to_string(pm::kMaxReleaseBatch) + " (send several)");
  }
  return release_many_applied(req);
}
Status MetaService::set_layout(const pm::SetLayoutReq& req) { return durable(set_layout_applied(req)); }
Result<pm::RegisterNodeResp> MetaService::register_node(const pm::RegisterNodeReq& req) {
  return durable(register_node_applied(req));
}
Result<pm::HeartbeatResp> MetaService::node_heartbeat(const pm::NodeHeartbeatReq& req) {
  return durable(node_heartbeat_applied(req));
}
Status MetaService::expire() {
  leases_.sweep_expired();
  dir_leases_.sweep();
  return durable(expire_applied());
}
// Not synced: a dequeue lost in a crash only makes the collector repeat removals, which are
// idempotent; the next sync (any mutation's, or gc_pending's) makes it durable anyway.
Status MetaService::gc_done(InodeId ino) { return gc_done_applied(ino); }

}  // namespace penstock::meta
