#include "client/lib/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <numeric>
#include <optional>
#include <thread>
#include <type_traits>

#include "client/lib/layout_text.h"
#include "common/base/backoff.h"
#include "common/base/log.h"
#include "common/checksum/checksum.h"

namespace penstock::client {

namespace meta = proto::meta;
namespace data = proto::data;

namespace {

int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

bool is_regular(const proto::InodeAttr& attr) { return (attr.mode & S_IFMT) == S_IFREG; }

// Errors after which a fresh cluster map may route the request elsewhere.
bool retry_with_new_map(const Status& st) {
  return st.code() == Code::kUnavailable || st.code() == Code::kNotFound;
}

// Waits for a fixed number of completions; each slot receives one Status.
class Completion {
 public:
  explicit Completion(size_t n) : statuses_(n), pending_(n) {}
  void set(size_t i, Status st) {
    std::lock_guard<std::mutex> lock(mu_);
    statuses_[i] = std::move(st);
    if (--pending_ == 0) cv_.notify_all();
  }
  // Returns once every slot was set. No timeout here: every call has a deadline in the transport,
  // which promises to run each callback exactly once.
  std::vector<Status> wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return pending_ == 0; });
    return std::move(statuses_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Status> statuses_;  // guarded by mu_
  size_t pending_;                // guarded by mu_
};

}  // namespace

std::string local_hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

namespace {
constexpr size_t kMaxCachedDirAttrs = 65536;
constexpr size_t kMaxReportedSizes = 65536;
}  // namespace

Client::Client(ClientOptions options, net::Endpoint meta_endpoint)
    : options_(std::move(options)),
      meta_endpoint_(std::move(meta_endpoint)),
      // A reply to a call sent before a report arrives within the call's deadline, or never.
      reported_(options_.call_timeout + std::chrono::seconds(1), kMaxReportedSizes),
      dir_attrs_(options_.dir_attr_max_age, kMaxCachedDirAttrs) {}

Result<std::unique_ptr<Client>> Client::connect(const ClientOptions& options) {
  auto ep = net::Endpoint::parse(options.meta_address);
  if (!ep.has_value()) {
    return ep.error().with_context("meta server address '" + options.meta_address + "'");
  }
  std::unique_ptr<Client> c(new Client(options, std::move(ep).value()));
  PENSTOCK_RETURN_IF_ERROR(c->start());
  return c;
}

Status Client::start() {
  runtime_ = std::make_unique<net::IoRuntime>(std::max(1, options_.io_threads));
  net::TcpOptions tcp;
  tcp.connect_timeout = options_.connect_timeout;
  tcp.connections = std::max(1, options_.connections_per_server);
  // A restarting penstock-meta (its port closed for a moment) makes a mount's metadata calls wait
  // for it, not fail; one-shot tools (no session) fail at once.
  tcp.wait_while_refused = options_.register_session;
  meta_ = std::make_unique<rpc::RpcClient>(net::make_tcp_channel(*runtime_, meta_endpoint_, tcp),
                                           options_.call_timeout);

  // The first call proves the server is there; it may take no longer than the connect timeout.
  rpc::CallOptions first;
  first.timeout = options_.connect_timeout;
  auto unreachable = [this](const Status& st) {
    return Status(Code::kUnavailable, "cannot reach penstock-meta at " + options_.meta_address + ": " +
                                          st.message() + "; is it running?");
  };
  if (options_.register_session) {
    meta::RegisterSessionReq req{options_.client_name, local_hostname()};
    auto r = meta_->call<meta::RegisterSession>(req, first);
    if (!r.has_value()) {
      if (failed_in_transit(r.error().code())) {
        return unreachable(r.error());
      }
      return r.error().with_context("register session at penstock-meta " + options_.meta_address);
    }
    session_.store(r->session.value);
    lease_ns_.store(r->lease_ns);
    PENSTOCK_LOG(Info) << "session " << r->session.value << " at penstock-meta " << options_.meta_address
                       << " (lease " << r->lease_ns / 1'000'000 << " ms)";
  }
  auto map = meta_->call<meta::GetClusterMap>(proto::Empty{}, first);
  if (!map.has_value()) {
    if (!options_.register_session && failed_in_transit(map.error().code())) {
      return unreachable(map.error());
    }
    return map.error().with_context("load the cluster map from penstock-meta " + options_.meta_address);
  }
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    routes_ = std::make_shared<const ClusterRoutes>(std::move(map->map));
  }
  if (options_.register_session) {
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
    rel_running_ = true;
    releaser_ = std::thread([this] { release_loop(); });
    if (options_.create_behind) {
      CreateBehind::Rpc rpc;
      rpc.lease = [this](const meta::DirLeaseReq& req) { return meta_call<meta::DirLease>(req); };
      rpc.batch = [this](const meta::CreateBatchReq& req) { return meta_call<meta::CreateBatch>(req); };
      rpc.session = [this] { return session(); };
      cb_ = std::make_unique<CreateBehind>(options_.create_behind_options, std::move(rpc));
    }
  }
  cache_ = std::make_unique<ChunkCache>(options_.cache_size);
  if (options_.dirty_limit > 0) budget_ = std::make_unique<DirtyBudget>(options_.dirty_limit);
  pool_ = std::make_unique<TaskPool>(std::max(1, options_.worker_threads));
  return Status::ok();
}

Client::~Client() { shutdown(); }

void Client::shutdown() {
  std::call_once(shutdown_once_, [this] {
    // A penstock-meta that is down holds up no call of the shutdown past the connect (the creates
    // behind still go on trying for their 30 s).
    if (meta_ != nullptr) meta_->channel()->stop_waiting_while_refused();
    // Files created behind reach the meta server before anything else of this session does.
    if (cb_ != nullptr) cb_->stop();
    // Buffered writes go out before the session closes (an unmount must not drop them).
    std::vector<InodeId> dirty;
    {
      std::lock_guard<std::mutex> lock(wb_mu_);
      for (const auto& [ino, wf] : wb_files_) dirty.push_back(ino);
    }
    for (InodeId ino : dirty) {
      Status st = flush(ino);
      if (!st.is_ok()) {
        PENSTOCK_LOG(Warn) << "writing back inode " << ino.to_string() << " at shutdown: " << st.to_string();
      }
    }
    {
      // Fetches sent without a thread (fetch_block_async) may still hand their block to the pool.
      std::unique_lock<std::mutex> lock(async_mu_);
      async_closed_ = true;
      async_cv_.wait(lock, [this] { return async_fetches_ == 0; });
    }
    if (pool_ != nullptr) pool_->stop();
    tickets_closed_.store(true);  // no new tickets: the releaser's last sweep takes every one
    {
      std::lock_guard<std::mutex> lock(rel_mu_);
      rel_stop_ = true;  // the releaser sends what is queued, then ends
    }
    rel_cv_.notify_all();
    if (releaser_.joinable()) releaser_.join();
    {
      std::lock_guard<std::mutex> lock(hb_mu_);
      stop_ = true;
    }
    hb_cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
    const uint64_t sid = session_.exchange(0);
    if (sid != 0 && meta_ != nullptr) {
      rpc::CallOptions opts;
      opts.timeout = options_.connect_timeout;
      auto r = meta_->call<meta::CloseSession>(meta::SessionReq{SessionId(sid)}, opts);
      if (!r.has_value()) {
        PENSTOCK_LOG(Warn) << "closing session " << sid << " failed: " << r.error().to_string()
                           << " (the meta server will expire it when its lease ends)";
      } else {
        PENSTOCK_LOG(Info) << "session " << sid << " closed";
      }
    }
  });
}

SessionId Client::session() const { return SessionId(session_.load()); }

void Client::heartbeat_loop() {
  for (;;) {
    int64_t lease = lease_ns_.load();
    auto interval = lease > 0 ? std::chrono::nanoseconds(lease / 3) : std::chrono::nanoseconds(10'000'000'000);
    interval = std::max<std::chrono::nanoseconds>(interval, std::chrono::milliseconds(100));
    {
      std::unique_lock<std::mutex> lock(hb_mu_);
      if (hb_cv_.wait_for(lock, interval, [this] { return stop_; })) return;
    }
    const SessionId sid(session_.load());
    auto r = meta_->call<meta::Heartbeat>(meta::SessionReq{sid});
    if (r.has_value()) {
      auto current = routes();
      if (current == nullptr || current->version() != r->map_version) {
        Status st = refresh_map();
        if (!st.is_ok()) {
          PENSTOCK_LOG(Warn) << "cluster map refresh failed: " << st.to_string();
        }
      }
      // Every start of penstock-meta bumps the version (so do node changes: sending again then
      // costs one call and changes nothing). Compared with what the server last took, not with
      // the routes: another call may have fetched the new map first.
      {
        std::lock_guard<std::mutex> lock(rel_mu_);
        if (rel_running_ && r->map_version != reclaimed_version_ && reclaim_version_ != r->map_version) {
          reclaim_version_ = r->map_version;
          rel_cv_.notify_all();
        }
      }
      // A new map version may be a new penstock-meta (an upgrade): ask it for Replay again.
      if (replay_checked_version_.exchange(r->map_version, std::memory_order_relaxed) != r->map_version) {
        replay_unsupported_.store(false, std::memory_order_relaxed);
        replay_inline_unsupported_.store(false, std::memory_order_relaxed);
      }
      continue;
    }
    if (r.error().code() == Code::kBadHandle || r.error().code() == Code::kNotFound || r.error().code() == Code::kStale) {
      // The meta server forgot the session (expired while unreachable): start a new one.
      auto reg = meta_->call<meta::RegisterSession>(meta::RegisterSessionReq{options_.client_name, local_hostname()});
      if (reg.has_value()) {
        PENSTOCK_LOG(Warn) << "session " << sid.value << " was lost at the meta server; now session "
                           << reg->session.value;
        session_.store(reg->session.value);
        lease_ns_.store(reg->lease_ns);
        continue;
      }
      PENSTOCK_LOG(Warn) << "re-registering the session failed: " << reg.error().to_string();
      continue;
    }
    PENSTOCK_LOG(Warn) << "heartbeat for session " << sid.value << " failed: " << r.error().to_string();
  }
}

namespace {

// Calls on a directory's names, which wait (kBusy) while another mount holds its lease
// (server/meta/dir_leases.h).
template <class M>
constexpr bool kWaitsForDirLease =
    std::is_same_v<M, meta::Lookup> || std::is_same_v<M, meta::LookupOpen> || std::is_same_v<M, meta::ReadDir> ||
    std::is_same_v<M, meta::Create> ||
    std::is_same_v<M, meta::Mknod> || std::is_same_v<M, meta::Mkdir> || std::is_same_v<M, meta::Symlink> ||
    std::is_same_v<M, meta::Link> || std::is_same_v<M, meta::Unlink> || std::is_same_v<M, meta::Rmdir> ||
    std::is_same_v<M, meta::Rename>;
// The calls that must not wait for this client's creates behind: the ones that send them, and the
// heartbeat that keeps the session (and so the lease) alive.
template <class M>
constexpr bool kPassesCreatesBehind =
    std::is_same_v<M, meta::DirLease> || std::is_same_v<M, meta::CreateBatch> || std::is_same_v<M, meta::Heartbeat> ||
    std::is_same_v<M, meta::GetClusterMap>;

// Calls that change nothing on the server (a repeat finds it as the first left it): one that met
// no server or lost its connection (kUnavailable: penstock-meta restarting) goes again, until
// the call timeout. Others may have been applied before the connection was lost.
template <class M>
constexpr bool kSafeToRepeat =
    std::is_same_v<M, meta::Lookup> || std::is_same_v<M, meta::GetAttr> || std::is_same_v<M, meta::Readlink> ||
    std::is_same_v<M, meta::ReadDir> || std::is_same_v<M, meta::StatFs> || std::is_same_v<M, meta::GetXattr> ||
    std::is_same_v<M, meta::ListXattr> || std::is_same_v<M, meta::GetLayout> ||
    std::is_same_v<M, meta::GetClusterMap> || std::is_same_v<M, meta::SyncLog>;

// An Open may have been applied before its connection was lost, yet it goes again too: a repeat
// can count it once too often (the file's space, should it be unlinked, then waits for the
// session's end, as after a lost release). A restarted server adds the opens it counted since its
// start to those the mount gives back (server/meta/namespace.h, opened_unreclaimed_), so a repeat
// applied there before this mount counted it is not lost. Failing instead fails the application's
// open() whenever penstock-meta crashes, restarts or opens its database again (a full disk) under it.
template <class M>
constexpr bool kRepeatMayCountTwice = std::is_same_v<M, meta::Open>;
template <class M>
constexpr bool kRepeatedWhenLost = kSafeToRepeat<M> || kRepeatMayCountTwice<M>;

// An error of a Replay named as the change it carried ("Rmdir: ..." for "ReplayWaiting: ...").
Status named_as_change(const Status& st, std::string_view envelope, std::string_view change) {
  std::string_view m = st.message();
  if (m.starts_with(envelope) && m.substr(envelope.size()).starts_with(": ")) m.remove_prefix(envelope.size() + 2);
  return Status(st.code(), std::string(m)).with_context(change);
}

template <class M>
Result<typename M::Response> send_to_meta(rpc::RpcClient& meta, const typename M::Request& req,
                                          std::chrono::milliseconds timeout) {
  if constexpr (!kRepeatedWhenLost<M>) {
    return meta.call<M>(req);
  } else {
    const auto give_up = Backoff::Clock::now() + timeout;
    Backoff backoff(std::chrono::milliseconds(5), std::chrono::milliseconds(200));
    for (bool again = false;; again = true) {
      auto r = meta.call<M>(req);
      if constexpr (kRepeatMayCountTwice<M>) {
        if (again && r.has_value()) {
          PENSTOCK_LOG(Info) << M::kName << " of inode " << req.ino.to_string() << " reached penstock-meta again and was answered";
        }
        if (!again && !r.has_value() && r.error().code() == Code::kUnavailable) {
          PENSTOCK_LOG(Info) << M::kName << " of inode " << req.ino.to_string() << " got no answer from penstock-meta ("
                             << r.error().to_string() << "); sent again until answered or its deadline passes";
        }
      }
      if (r.has_value() || r.error().code() != Code::kUnavailable || !backoff.sleep_before(give_up)) return r;
    }
  }
}

}  // namespace

template <class M>
Result<typename M::Response> Client::meta_call(const typename M::Request& req) {
  // The meta server sees every operation of this client after the creates behind it answered
  // before (create_behind.h, "Ordering").
  if constexpr (!kPassesCreatesBehind<M>) {
    if (cb_ != nullptr) cb_->barrier();
  }
  if constexpr (kWaitsForDirLease<M>) {
    // Another mount's lease ends within its term plus grace (at most 2.1 s): retry until then, with
    // a growing pause, inside twice that.
    // The 5 s count from the first kBusy: the first call may have waited for a restarting server.
    std::optional<Backoff::Clock::time_point> give_up;
    Backoff backoff(std::chrono::milliseconds(2), std::chrono::milliseconds(50));
    for (;;) {
      auto r = send_meta<M>(req);
      if (r.has_value() || r.error().code() != Code::kBusy) return r;
      if (!give_up.has_value()) give_up = Backoff::Clock::now() + std::chrono::milliseconds(5000);
      if (!backoff.sleep_before(*give_up)) return r;
    }
  } else {
    return send_meta<M>(req);
  }
}

template <class M>
Result<typename M::Response> Client::send_meta(const typename M::Request& req) {
  if constexpr (meta::kReplayed<M>) {
    const SessionId sid = session();
    if (sid.valid() && !replay_unsupported<M>().load(std::memory_order_relaxed)) {
      if (auto r = send_change<M>(sid, req); r.has_value()) return std::move(*r);
    }
  }
  return send_to_meta<M>(*meta_, req, options_.call_timeout);
}

template <class M>
std::optional<Result<typename M::Response>> Client::send_change(SessionId session, const typename M::Request& req) {
  using Envelope = std::conditional_t<meta::kReplayWaits<M>, meta::ReplayWaiting,
                                      std::conditional_t<meta::kReplayInline<M>, meta::ReplayInline, meta::Replay>>;
  std::atomic<bool>& unsupported = replay_unsupported<M>();
  ReplySlots::Held held(reply_slots_);
  const meta::ReplayReq envelope{session, held.slot(), held.seq(), M::kId, proto::encode(req)};
  const auto give_up = Backoff::Clock::now() + options_.call_timeout;
  Backoff backoff(std::chrono::milliseconds(5), std::chrono::milliseconds(200));
  for (bool again = false;; again = true) {
    auto r = meta_->call<Envelope>(envelope);
    if (r.has_value()) {
      if (again) {
        PENSTOCK_LOG(Info) << M::kName << " reached penstock-meta again and was answered once";
      }
      auto resp = proto::decode<typename M::Response>(proto::bytes_of(r->message));
      if (!resp.has_value()) return std::move(resp).error().with_context(std::string(M::kName) + " reply in a Replay");
      return std::move(*resp);
    }
    const Code code = r.error().code();
    // Nothing ran: an older server without Replay, or a session it no longer knows. On the first
    // send the change goes as itself, as before Replay (and meets that). Not after a send that was
    // lost: the change may have been applied then (its reply went with a session that ended, or
    // with a server that was replaced by an older one), and must not run a second time.
    if (code == Code::kNotSupported || code == Code::kBadHandle) {
      if (code == Code::kNotSupported && !unsupported.exchange(true, std::memory_order_relaxed)) {
        PENSTOCK_LOG(Warn) << "penstock-meta does not answer " << (meta::kReplayInline<M> ? "a close's size report"
                                                                                           : "changes")
                           << " exactly once (" << r.error().to_string()
                           << "); one whose connection is lost on the way fails with EIO";
      }
      if (!again) return std::nullopt;
      return Status(Code::kUnavailable, std::string(M::kName) + ": penstock-meta lost the connection before it answered, "
                                            "and can no longer tell whether it applied the change (" +
                                            r.error().to_string() + ")");
    }
    if (!failed_in_transit(code)) {
      if (again) {
        // Not applied before (a stored reply would have come back): e.g. kBusy while a restarted
        // server waits out the leases of its earlier run, which the caller retries as a new change.
        PENSTOCK_LOG(Info) << M::kName << " reached penstock-meta again, which answered " << r.error().to_string();
      }
      return named_as_change(r.error(), Envelope::kName, M::kName);
    }
    // Lost on the way (penstock-meta restarting, a broken connection), or its slot still busy
    // there: the same slot and number again, which the server answers from its reply cache when
    // the change was applied.
    if (!again) {
      PENSTOCK_LOG(Info) << M::kName << " got no answer from penstock-meta (" << r.error().to_string()
                         << "); sending it again in reply slot " << held.slot() << " until it is answered";
    }
    if (!backoff.sleep_before(give_up)) {
      held.unanswered();
      return named_as_change(r.error(), Envelope::kName, M::kName);
    }
  }
}

void Client::merge_local_size(proto::InodeAttr* attr) {
  if (!is_regular(*attr)) return;
  std::lock_guard<std::mutex> lock(files_mu_);
  auto it = files_.find(attr->ino);
  reported_.merge(attr);  // a reply made before one of our size reports applied
  if (it == files_.end()) return;
  if (it->second.written_end > attr->size) attr->size = it->second.written_end;
  if (it->second.mtime_ns > attr->mtime_ns) attr->mtime_ns = it->second.mtime_ns;
}

Result<proto::InodeAttr> Client::merged(const DirAttrCache::Ticket& t, Result<meta::AttrResp> r) {
  if (!r.has_value()) {
    // A lost reply: the change may have been applied, the parent's new attributes are unknown.
    if (failed_in_transit(r.error().code())) dir_attrs_.invalidate_all();
    return std::move(r).error();
  }
  dir_attrs_.offer(t, r->attr);
  if (r->parent) dir_attrs_.offer(t, *r->parent);
  proto::InodeAttr attr = std::move(r->attr);
  merge_local_size(&attr);
  return attr;
}

template <class M, class Req>
Result<proto::InodeAttr> Client::attr_call(const Req& req) {
  const DirAttrCache::Ticket t = dir_attrs_.ticket();  // before the call is sent
  return merged(t, meta_call<M>(req));
}

// ---- namespace ----

Result<proto::InodeAttr> Client::lookup(InodeId parent, const std::string& name) {
  return attr_call<meta::Lookup>(meta::LookupReq{parent, name, session()});
}

std::optional<DirAttrCache::Hit> Client::cached_dir_attr(InodeId dir) const { return dir_attrs_.get(dir); }

Result<Client::Entry> Client::lookup_entry(InodeId parent, const std::string& name, uint64_t caller) {
  // The kernel starts its entry timeout when it gets our reply, later than the server started the
  // lease: counting from the send, less a margin for the reply's way into the kernel, keeps the
  // kernel's trust inside the lease (the server waits a further grace period on top).
  // 100 ms covers jiffy rounding and a thread descheduled between here and the kernel.
  constexpr auto kMargin = std::chrono::milliseconds(100);
  if (cb_ != nullptr && cb_->known_absent(parent, name)) {
    return Status(Code::kNotFound, "no entry " + name + " in directory " + parent.to_string() +
                                       " (this mount holds the directory's lease)");
  }
  std::vector<OpenTicket> dropped;  // open tickets to release, sent after the answer
  const bool ask = caller != 0 && want_ticket(caller, &dropped);
  const meta::LookupReq req{parent, name, session()};
  const DirAttrCache::Ticket t = dir_attrs_.ticket();  // t.sent: when the call left
  bool opened = false;
  Result<meta::AttrResp> r = [&]() -> Result<meta::AttrResp> {
    if (!ask) return meta_call<meta::Lookup>(req);
    // Sent once: a lost answer or an unreachable server falls back to Lookup, which waits for a
    // restarting server, and the kernel's open then sends an Open. (A LookupOpen applied but not
    // answered leaves its open until the session ends, as an Open applied twice does.)
    auto lo = meta_call<meta::LookupOpen>(req);
    if (lo.has_value()) {
      opened = lo->opened;
      return meta::AttrResp{std::move(lo->attr), lo->entry_lease_ns, std::nullopt};
    }
    const Code code = lo.error().code();
    if (code != Code::kNotSupported && !failed_in_transit(code)) return std::move(lo).error();
    if (code == Code::kNotSupported && lookup_open_ok_.exchange(false)) {
      PENSTOCK_LOG(Info) << "penstock-meta predates LookupOpen: every open asks the meta server itself";
    }
    return meta_call<meta::Lookup>(req);
  }();
  Result<Entry> out = [&]() -> Result<Entry> {
    if (!r.has_value()) return std::move(r).error();
    const auto left =
        std::chrono::nanoseconds(r->entry_lease_ns) - (std::chrono::steady_clock::now() - t.sent) - kMargin;
    Entry e;
    e.trust_s = r->entry_lease_ns > 0 && left.count() > 0 ? std::chrono::duration<double>(left).count() : 0.0;
    PENSTOCK_ASSIGN_OR_RETURN(e.attr, merged(t, std::move(r)));
    return e;
  }();
  if (out.has_value()) {
    if (opened) count_open(out->attr.ino);
    if (ask) keep_ticket(caller, out->attr, opened ? std::optional<SessionId>(req.session) : std::nullopt, &dropped);
    note_small_file(out->attr);
    out->opened = opened;
  } else if (ask) {
    keep_ticket(caller, proto::InodeAttr{}, std::nullopt, &dropped);
  }
  release_tickets(dropped);
  return out;
}

Result<proto::InodeAttr> Client::getattr(InodeId ino) {
  return attr_call<meta::GetAttr>(meta::InodeReq{ino});
}

Result<proto::InodeAttr> Client::setattr(const meta::SetAttrReq& req) {
  PENSTOCK_CHECK((req.valid & meta::kSetSize) == 0);
  const DirAttrCache::Ticket t = dir_attrs_.ticket();
  auto r = meta_call<meta::SetAttr>(req);
  if (r.has_value() && (req.valid & (meta::kSetMtime | meta::kSetMtimeNow)) != 0) {
    adopt_mtime(req.ino, r->attr.mtime_ns);
  }
  return merged(t, std::move(r));
}

void Client::adopt_mtime(InodeId ino, int64_t mtime_ns) {
  std::lock_guard<std::mutex> lock(files_mu_);
  auto it = files_.find(ino);
  if (it != files_.end()) it->second.mtime_ns = mtime_ns;
}

Result<proto::InodeAttr> Client::create(InodeId parent, const std::string& name, uint32_t mode,
                                        const proto::Caller& caller) {
  if (cb_ != nullptr) {
    if (std::optional<proto::InodeAttr> a = cb_->create(parent, name, mode, caller)) {
      {
        std::lock_guard<std::mutex> lock(opened_mu_);
        opened_[a->ino] = OpenedVersion{a->generation, a->mtime_ns};
      }
      count_open(a->ino);
      note_no_caps(a->ino);
      // The parent's cached attributes stay as they are (its mtime may lag up to their age).
      return *a;
    }
  }
  auto r = attr_call<meta::Create>(meta::CreateReq{parent, name, mode, caller, session()});
  // The name may exist after a failure too (kExists, a lost reply): a lease's list keeps it.
  if (cb_ != nullptr && !r.has_value()) cb_->added(parent, name);
  if (r.has_value()) {
    count_open(r->ino);
    if (cb_ != nullptr) cb_->created_sync(parent, name, r->ino);
    {
      std::lock_guard<std::mutex> lock(opened_mu_);
      opened_[r->ino] = OpenedVersion{r->generation, r->mtime_ns};
    }
    // A file just made has no xattrs: the kernel's question before its first write() ("is there a
    // security.capability to drop?") needs no meta call.
    note_no_caps(r->ino);
  }
  return r;
}

Result<proto::InodeAttr> Client::mknod(InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                       const proto::Caller& caller) {
  auto r = attr_call<meta::Mknod>(meta::MknodReq{parent, name, mode, rdev, caller, session()});
  if (cb_ != nullptr) cb_->added(parent, name);  // also after a failure: it may exist (see create)
  return r;
}

Result<proto::InodeAttr> Client::mkdir(InodeId parent, const std::string& name, uint32_t mode,
                                       const proto::Caller& caller) {
  auto r = attr_call<meta::Mkdir>(meta::MkdirReq{parent, name, mode, caller, session()});
  if (cb_ != nullptr) cb_->added(parent, name);  // also after a failure: it may exist (see create)
  return r;
}

Status Client::unlink(InodeId parent, const std::string& name) {
  const DirAttrCache::Ticket t = dir_attrs_.ticket();
  auto r = meta_call<meta::Unlink>(meta::NameReq{parent, name, session()});
  if (!r.has_value()) {
    dir_attrs_.invalidate(parent);  // the outcome of a lost reply is unknown
    return std::move(r).error();
  }
  // The kernel drops the directory's attributes after an unlink; its next permission check there
  // is answered with these.
  dir_attrs_.offer(t, r->parent);
  if (cb_ != nullptr) cb_->removed(parent, name);
  return Status::ok();
}

// The kernel drops the attributes of the directories an rmdir or rename changed; its next
// permission checks there are answered with the ones the reply carries. Which directories a
// failed one changed is not known (a lost reply may hide a done change): all are forgotten.
Status Client::take_dirs(const DirAttrCache::Ticket& t, const Result<meta::DirsResp>& r) {
  if (!r.has_value()) {
    dir_attrs_.invalidate_all();
    return r.error();
  }
  for (const proto::InodeAttr& dir : r->dirs) dir_attrs_.offer(t, dir);
  if (r->removed.valid()) dir_attrs_.invalidate(r->removed);
  return Status::ok();
}

Status Client::rmdir(InodeId parent, const std::string& name) {
  const DirAttrCache::Ticket t = dir_attrs_.ticket();  // before the call is sent
  Status st = take_dirs(t, meta_call<meta::Rmdir>(meta::NameReq{parent, name, session()}));
  if (st.is_ok() && cb_ != nullptr) cb_->removed(parent, name);
  return st;
}

Status Client::rename(InodeId parent, const std::string& name, InodeId new_parent, const std::string& new_name,
                      uint32_t flags) {
  const DirAttrCache::Ticket t = dir_attrs_.ticket();
  Status st = take_dirs(t, meta_call<meta::Rename>(meta::RenameReq{parent, name, new_parent, new_name, flags, session()}));
  // The source name stays listed (a rename between two links of one inode keeps both); a longer
  // list only sends more lookups to the server.
  if (cb_ != nullptr) cb_->added(new_parent, new_name);
  return st;
}

Result<proto::InodeAttr> Client::link(InodeId ino, InodeId new_parent, const std::string& new_name) {
  auto r = attr_call<meta::Link>(meta::LinkReq{ino, new_parent, new_name, session()});
  if (cb_ != nullptr) cb_->added(new_parent, new_name);  // also after a failure (see create)
  return r;
}

Result<proto::InodeAttr> Client::symlink(InodeId parent, const std::string& name, const std::string& target,
                                         const proto::Caller& caller) {
  auto r = attr_call<meta::Symlink>(meta::SymlinkReq{parent, name, target, caller, session()});
  if (cb_ != nullptr) cb_->added(parent, name);  // also after a failure (see create)
  return r;
}

Result<std::string> Client::readlink(InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::Readlink>(meta::InodeReq{ino}));
  return std::move(resp.target);
}

Result<meta::ReadDirResp> Client::readdir(InodeId ino, const std::string& after, uint32_t max_entries,
                                          bool plus) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::ReadDir>(meta::ReadDirReq{ino, after, max_entries, plus, session()}));
  for (auto& e : resp.entries) {
    if (e.attr) merge_local_size(&*e.attr);
  }
  return resp;
}

Result<meta::StatFsResp> Client::statfs() { return meta_call<meta::StatFs>(proto::Empty{}); }

namespace {
constexpr std::string_view kCapsXattr = "security.capability";
constexpr size_t kMaxNoCaps = 65536;  // entries remembered; the map is emptied when it is full
}  // namespace

Result<std::string> Client::getxattr(InodeId ino, const std::string& name) {
  const bool caps = name == kCapsXattr && options_.absent_xattr_ttl.count() > 0;
  if (caps) {
    std::lock_guard<std::mutex> lock(caps_mu_);
    auto it = no_caps_.find(ino);
    if (it != no_caps_.end() && std::chrono::steady_clock::now() < it->second) {
      return Status(Code::kNoData, "inode " + ino.to_string() + " has no " + name);
    }
  }
  auto r = meta_call<meta::GetXattr>(meta::GetXattrReq{ino, name});
  if (caps && !r.has_value() && r.error().code() == Code::kNoData) note_no_caps(ino);
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, std::move(r));
  return std::move(resp.value);
}

void Client::note_no_caps(InodeId ino) {
  if (options_.absent_xattr_ttl.count() <= 0) return;
  std::lock_guard<std::mutex> lock(caps_mu_);
  if (no_caps_.size() >= kMaxNoCaps) no_caps_.clear();
  no_caps_[ino] = std::chrono::steady_clock::now() + options_.absent_xattr_ttl;
}

void Client::forget_caps(InodeId ino, const std::string& name) {
  if (name != kCapsXattr) return;
  std::lock_guard<std::mutex> lock(caps_mu_);
  no_caps_.erase(ino);
}

Status Client::setxattr(InodeId ino, const std::string& name, const std::string& value, uint32_t flags) {
  forget_caps(ino, name);
  Status st = meta_call<meta::SetXattr>(meta::SetXattrReq{ino, name, value, flags}).status();
  forget_caps(ino, name);  // also a lookup that raced the set
  dir_attrs_.invalidate(ino);  // its ctime moved
  return st;
}

Result<std::vector<std::string>> Client::listxattr(InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::ListXattr>(meta::InodeReq{ino}));
  return std::move(resp.names);
}

Status Client::removexattr(InodeId ino, const std::string& name) {
  Status st = meta_call<meta::RemoveXattr>(meta::GetXattrReq{ino, name}).status();
  dir_attrs_.invalidate(ino);  // its ctime moved
  return st;
}

Result<proto::InodeAttr> Client::open(InodeId ino, uint32_t flags, bool* unchanged, uint64_t caller) {
  prefetch_small_file(ino, flags);
  const bool read_only = (flags & O_ACCMODE) == O_RDONLY && (flags & O_TRUNC) == 0;
  std::optional<proto::InodeAttr> ticket = take_ticket(caller, ino, read_only);
  if (ticket.has_value()) {
    merge_local_size(&*ticket);  // own writes since the lookup (counted at the grant)
  } else {
    PENSTOCK_ASSIGN_OR_RETURN(ticket, attr_call<meta::Open>(meta::OpenReq{ino, session(), flags}));
    count_open(ino);
  }
  const proto::InodeAttr& r = *ticket;  // the open's attributes, either way
  // Close-to-open: cached blocks of an older generation go now.
  cache_->set_generation(ino, r.generation);
  bool same = false;
  {
    std::lock_guard<std::mutex> lock(opened_mu_);
    auto it = opened_.find(ino);
    const bool match = it != opened_.end() && it->second.generation == r.generation && it->second.mtime_ns == r.mtime_ns;
    same = match && it->second.dropped;
    // A bounded memory of versions: forgetting only costs a cache drop at the next open.
    if (it == opened_.end() && opened_.size() >= (1u << 20)) opened_.clear();
    opened_[ino] = OpenedVersion{r.generation, r.mtime_ns, /*kernel_read=*/false, /*dropped=*/same};
  }
  // Our own unreported writes are in the kernel's pages but not in the meta generation: the
  // merged mtime covers them (it moves on our writes), so `same` stays correct.
  if (unchanged != nullptr) *unchanged = same;
  return r;
}

void Client::note_open_completed(InodeId ino, uint64_t generation, int64_t mtime_ns) {
  std::lock_guard<std::mutex> lock(opened_mu_);
  auto it = opened_.find(ino);
  if (it != opened_.end() && it->second.generation == generation && it->second.mtime_ns == mtime_ns) {
    it->second.dropped = true;
  }
}

void Client::note_kernel_read(InodeId ino) {
  std::lock_guard<std::mutex> lock(opened_mu_);
  auto it = opened_.find(ino);
  if (it != opened_.end()) it->second.kernel_read = true;
}

std::unique_ptr<ReadContext> Client::make_read_context(uint64_t generation) const {
  ReadAheadOptions ra;
  // A window must fit the cache many times over, or read-ahead evicts what it fetched before use.
  ra.max_window = std::min<uint64_t>(options_.readahead_max, options_.cache_size / 16);
  ra.initial_window = std::min<uint64_t>(ra.initial_window, ra.max_window);
  return std::make_unique<ReadContext>(generation, ra);
}

Result<proto::Layout> Client::get_layout(InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::GetLayout>(meta::InodeReq{ino}));
  return std::move(resp.layout);
}

Result<proto::Layout> Client::created_layout(InodeId ino) {
  if (cb_ != nullptr) {
    if (std::optional<proto::Layout> l = cb_->take_layout(ino)) return std::move(*l);
  }
  return get_layout(ino);
}

Status Client::set_layout(InodeId dir, uint32_t chunk_size, uint32_t stripe_count) {
  Status st = meta_call<meta::SetLayout>(meta::SetLayoutReq{dir, chunk_size, stripe_count}).status();
  dir_attrs_.invalidate(dir);  // the layout is part of its attributes
  return st;
}

Status Client::set_layout_text(InodeId dir, const std::string& text) {
  PENSTOCK_ASSIGN_OR_RETURN(LayoutSpec spec, parse_layout_spec(text));
  uint32_t chunk_size = 0;
  uint32_t stripe_count = 0;
  if (!spec.chunk_size || !spec.stripe_count) {
    PENSTOCK_ASSIGN_OR_RETURN(proto::Layout current, get_layout(dir));
    chunk_size = current.chunk_size;
    stripe_count = current.stripe_count;
  }
  if (spec.chunk_size) chunk_size = *spec.chunk_size;
  if (spec.stripe_count) stripe_count = *spec.stripe_count;
  return set_layout(dir, chunk_size, stripe_count)
      .with_context("set layout of directory " + dir.to_string());
}

Result<proto::ClusterMap> Client::get_cluster_map() {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::GetClusterMap>(proto::Empty{}));
  return std::move(resp.map);
}

// ---- cluster map and data clients ----

std::shared_ptr<const ClusterRoutes> Client::routes() const {
  std::lock_guard<std::mutex> lock(routes_mu_);
  return routes_;
}

Status Client::refresh_map() {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::GetClusterMap>(proto::Empty{}));
  auto fresh = std::make_shared<const ClusterRoutes>(std::move(resp.map));
  std::lock_guard<std::mutex> lock(routes_mu_);
  // Never go back to an older map (two refreshes may finish out of order).
  if (routes_ == nullptr || routes_->version() <= fresh->version()) {
    if (routes_ == nullptr || routes_->version() != fresh->version()) {
      PENSTOCK_LOG(Debug) << "cluster map version " << fresh->version();
    }
    routes_ = std::move(fresh);
  }
  return Status::ok();
}

Result<meta::ScrubResp> Client::scrub(bool dry_run, std::chrono::milliseconds timeout) {
  rpc::CallOptions opts;
  opts.timeout = timeout;
  return meta_->call<meta::Scrub>(meta::ScrubReq{dry_run}, opts);
}

Result<std::shared_ptr<rpc::RpcClient>> Client::data_client(const std::string& address) {
  {
    std::lock_guard<std::mutex> lock(data_mu_);
    auto it = data_clients_.find(address);
    if (it != data_clients_.end()) return it->second;
  }
  auto ep = net::Endpoint::parse(address);
  if (!ep.has_value()) return ep.error().with_context("data server address in the cluster map");
  net::ChannelOptions copts;
  copts.transport = options_.transport;
  copts.tcp.connect_timeout = options_.connect_timeout;
  copts.tcp.connections = std::max(1, options_.connections_per_server);
  copts.rdma.connect_timeout = options_.connect_timeout;
  auto channel = net::make_channel(*runtime_, *ep, copts);
  if (!channel.has_value()) return channel.error().with_context("data server " + address);
  auto fresh = std::make_shared<rpc::RpcClient>(std::move(channel).value(), options_.call_timeout);
  std::lock_guard<std::mutex> lock(data_mu_);
  auto [it, inserted] = data_clients_.emplace(address, std::move(fresh));
  if (inserted) {
    PENSTOCK_LOG(Info) << "data server " << address << ": " << it->second->channel()->describe();
  }
  return it->second;
}

template <class M>
Status Client::call_online_data_servers(const typename M::Request& req, std::vector<proto::NodeInfo>* nodes,
                                        std::vector<Status>* statuses, std::vector<typename M::Response>* replies) {
  PENSTOCK_RETURN_IF_ERROR(refresh_map());
  auto current = routes();
  nodes->clear();
  for (const proto::NodeInfo& n : current->map().nodes) {
    if (n.online) nodes->push_back(n);  // an offline node serves nothing and caches nothing for us
  }
  auto completion = std::make_shared<Completion>(nodes->size());
  auto answers = std::make_shared<std::vector<typename M::Response>>(nodes->size());
  for (size_t i = 0; i < nodes->size(); ++i) {
    auto rpc = data_client((*nodes)[i].address);
    if (!rpc.has_value()) {
      completion->set(i, rpc.error());
      continue;
    }
    (*rpc)->template call_async<M>(req, {}, [completion, answers, i](Result<typename M::Response> r) {
      if (r.has_value()) (*answers)[i] = std::move(*r);
      completion->set(i, r.status());
    });
  }
  *statuses = completion->wait();
  *replies = std::move(*answers);
  return Status::ok();
}

Result<std::vector<Client::DataServerStats>> Client::data_stats() {
  std::vector<proto::NodeInfo> nodes;
  std::vector<Status> results;
  std::vector<data::StatsResp> replies;
  PENSTOCK_RETURN_IF_ERROR(call_online_data_servers<data::Stats>(proto::Empty{}, &nodes, &results, &replies)
                               .with_context("data server stats: fetching the cluster map"));
  std::vector<DataServerStats> out(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) out[i] = DataServerStats{nodes[i], results[i], std::move(replies[i])};
  return out;
}

Result<proto::meta::ServerStatsResp> Client::meta_stats() {
  return meta_call<meta::ServerStats>(proto::Empty{});
}

Status Client::drop_caches() {
  const uint64_t blocks = cache_->clear();
  // The meta server's record and block caches; an older server has none to drop.
  uint64_t meta_bytes = 0;
  if (auto r = meta_call<meta::DropCaches>(proto::Empty{}); r.has_value()) {
    meta_bytes = r->bytes;
  } else if (r.status().code() != Code::kNotSupported) {
    return r.status().with_context("DropCaches on the meta server");
  }
  std::vector<proto::NodeInfo> nodes;
  std::vector<Status> results;
  std::vector<data::DropCachesResp> replies;
  PENSTOCK_RETURN_IF_ERROR(call_online_data_servers<data::DropCaches>(data::DropCachesReq{}, &nodes, &results, &replies)
                               .with_context("drop caches: fetching the cluster map"));
  data::DropCachesResp total;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!results[i].is_ok()) {
      return results[i].with_context("DropCaches on data server " + nodes[i].address + " (node " +
                                     nodes[i].id.to_string() + ")");
    }
    total.targets += replies[i].targets;
    total.files += replies[i].files;
    total.fds_closed += replies[i].fds_closed;
  }
  PENSTOCK_LOG(Info) << "caches dropped: " << blocks << " client cache block(s); on the meta server "
                     << meta_bytes << " bytes of records and blocks; on " << nodes.size() << " data server(s), "
                     << total.targets << " target(s), page cache of " << total.files << " chunk file(s), "
                     << total.fds_closed << " open descriptor(s)";
  return Status::ok();
}

Result<std::string> Client::data_transport(const std::string& address) {
  PENSTOCK_ASSIGN_OR_RETURN(std::shared_ptr<rpc::RpcClient> rpc, data_client(address));
  return rpc->channel()->describe();
}

Result<Route> Client::resolve(const ClusterRoutes& routes, const DataTask& task) const {
  if (task.target.valid()) {
    PENSTOCK_ASSIGN_OR_RETURN(std::vector<Route> all, routes.all_targets(task.chain));
    for (auto& r : all) {
      if (r.target == task.target) return r;
    }
    return Status(Code::kNotFound, "target " + task.target.to_string() + " is no longer in chain " +
                                       task.chain.to_string());
  }
  return task.to_tail ? routes.tail(task.chain) : routes.head(task.chain);
}

Status Client::fan_out(const std::vector<DataTask>& tasks, const IssueFn& issue) {
  std::vector<size_t> pending(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) pending[i] = i;
  bool refreshed = false;
  while (!pending.empty()) {
    auto current = routes();
    if (current == nullptr) {
      PENSTOCK_RETURN_IF_ERROR(refresh_map());
      refreshed = true;
      current = routes();
    }
    // Resolve every task first; an unknown chain/target is worth one map refresh.
    std::vector<Route> resolved(pending.size());
    std::vector<std::shared_ptr<rpc::RpcClient>> clients(pending.size());
    for (size_t k = 0; k < pending.size(); ++k) {
      const DataTask& task = tasks[pending[k]];
      auto r = resolve(*current, task);
      if (!r.has_value() && !refreshed) {
        PENSTOCK_RETURN_IF_ERROR(refresh_map().with_context(task.what));
        refreshed = true;
        current = routes();
        r = resolve(*current, task);
      }
      if (!r.has_value()) return r.error().with_context(task.what);
      resolved[k] = std::move(r).value();
      PENSTOCK_ASSIGN_OR_RETURN(clients[k], data_client(resolved[k].address));
    }
    // Issue all at once, then wait for every completion (the buffers stay alive until then). One
    // call alone is made on this thread: no I/O thread has to receive it and wake us.
    const bool blocking = pending.size() == 1;
    auto completion = std::make_shared<Completion>(pending.size());
    for (size_t k = 0; k < pending.size(); ++k) {
      issue(pending[k], resolved[k], *clients[k], blocking,
            [completion, k](Status st) { completion->set(k, std::move(st)); });
    }
    std::vector<Status> results = completion->wait();
    std::vector<size_t> retry;
    for (size_t k = 0; k < pending.size(); ++k) {
      const Status& st = results[k];
      if (st.is_ok()) continue;
      const DataTask& task = tasks[pending[k]];
      const std::string where = task.what + " on target " + resolved[k].target.to_string() + " at " +
                                resolved[k].address;
      if (refreshed || !retry_with_new_map(st)) return st.with_context(where);
      PENSTOCK_LOG(Info) << where << ": " << st.to_string() << "; refreshing the cluster map and retrying";
      retry.push_back(pending[k]);
    }
    if (!retry.empty()) {
      PENSTOCK_RETURN_IF_ERROR(refresh_map());
      refreshed = true;
    }
    pending = std::move(retry);
  }
  return Status::ok();
}

// ---- file data ----

namespace {

// Cache blocks: at most 1 MiB and never across a chunk (chunk sizes are powers of two >= 64 KiB).
constexpr uint64_t kCacheBlock = 1ull << 20;
// Write-behind buffers: one chunk, at least 1 MiB and at most 4 MiB, aligned to their size.
uint64_t wb_unit(const proto::Layout& layout) {
  return std::clamp<uint64_t>(layout.chunk_size, 1ull << 20, 4ull << 20);
}
uint64_t block_size(const proto::Layout& layout) { return std::min<uint64_t>(kCacheBlock, layout.chunk_size); }
// The length of the block at `block_off` for a file of `size` bytes: whole 4 KiB pages up to EOF
// (a small file's block holds the file, not 1 MiB).
uint32_t block_length(uint64_t bs, uint64_t block_off, uint64_t size) {
  const uint64_t left = size > block_off ? size - block_off : 0;
  const uint64_t pages = (left + 4095) / 4096 * 4096;
  return static_cast<uint32_t>(std::clamp<uint64_t>(pages, 4096, bs));
}
// The bytes of that block before EOF (CachedBlock::valid).
uint32_t block_valid(uint64_t bs, uint64_t block_off, uint64_t size) {
  return static_cast<uint32_t>(std::min(bs, size > block_off ? size - block_off : 0));
}
bool overlaps(uint64_t a, uint64_t a_end, uint64_t b, uint64_t b_end) { return a < b_end && b < a_end; }
// A cursor without a record (a default-constructed one) means the same as none.
WriteCursor* usable(WriteCursor* cursor) { return cursor != nullptr && cursor->errors != nullptr ? cursor : nullptr; }
// Reads of a range whose bytes fail their checksums at the client: the last one is verified by
// the data server instead (its kCorrupt is the verdict), so this is never exceeded.
constexpr int kVerifiedReadAttempts = 3;

}  // namespace

Status Client::read_ranges(InodeId ino, const proto::Layout& layout,
                           const std::vector<std::pair<uint64_t, std::span<uint8_t>>>& ranges, bool sequential) {
  struct Piece {
    ChunkIo io;
    std::span<uint8_t> dst;
  };
  std::vector<Piece> pieces;
  for (const auto& [offset, buf] : ranges) {
    auto plan_r = plan_chunk_io(layout, offset, buf.size());
    if (!plan_r.has_value()) return plan_r.error().with_context("read inode " + ino.to_string());
    for (const ChunkIo& io : *plan_r) pieces.push_back(Piece{io, buf.subspan(io.buf_offset, io.length)});
  }
  std::vector<DataTask> tasks(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    tasks[i].chain = pieces[i].io.chain;
    tasks[i].to_tail = true;
    tasks[i].what = "read chunk " + std::to_string(pieces[i].io.chunk_index) + " of inode " + ino.to_string();
  }
  std::vector<uint32_t> received(pieces.size(), 0);
  // Checksums of a range the server sent unread (data_service.h): verified here, before use.
  std::vector<std::vector<uint64_t>> sums(pieces.size());
  std::vector<size_t> which(pieces.size());
  std::iota(which.begin(), which.end(), size_t{0});
  for (int attempt = 1;; ++attempt) {
    std::vector<DataTask> batch(which.size());
    for (size_t k = 0; k < which.size(); ++k) batch[k] = tasks[which[k]];
    Status st = fan_out(batch, [&](size_t k, const Route& route, rpc::RpcClient& rpc, bool blocking,
                                   std::function<void(Status)> done) {
      const size_t i = which[k];
      data::ReadReq req;
      req.key = data::ChunkKey{route.chain, route.target, ino, pieces[i].io.chunk_index, layout.chunk_size};
      req.offset = pieces[i].io.offset_in_chunk;
      req.length = pieces[i].io.length;
      // The last attempt lets the server verify under its chunk lock: a block that keeps failing
      // on a busy chunk is then told apart from one damaged on disk.
      req.verify_at_client = attempt < kVerifiedReadAttempts;
      req.sequential = sequential;
      rpc::CallOptions opts;
      opts.bulk_in = pieces[i].dst;
      opts.bulk_received = &received[i];
      rpc.call_either<data::Read>(req, opts, blocking, [done = std::move(done), out = &sums[i]](Result<data::ReadResp> r) {
        if (r.has_value()) *out = std::move(r->block_sums);
        done(r.status());
      });
    });
    if (!st.is_ok()) return st;
    // A block that fails may have been rewritten between the server taking its checksums and
    // sending its bytes: read it again; damage on the server fails every time.
    std::vector<size_t> bad;
    int64_t bad_block = -1;
    for (size_t i : which) {
      if (sums[i].empty()) continue;  // the server verified it
      const std::span<const uint8_t> got = pieces[i].dst.first(received[i]);
      const uint64_t blocks = (got.size() + data::kChecksumBlock - 1) / data::kChecksumBlock;
      // Fewer bytes than checksums: the chunk was cut between the two (a racing truncate).
      const int64_t b = sums[i].size() != 2 * blocks
                            ? static_cast<int64_t>(blocks)
                            : checksum::first_bad_block(got, sums[i], data::kChecksumBlock);
      if (b >= 0) {
        if (bad.empty()) bad_block = b;
        bad.push_back(i);
      }
    }
    if (bad.empty()) break;
    const std::string& what = tasks[bad.front()].what;
    const uint64_t block =
        pieces[bad.front()].io.offset_in_chunk / data::kChecksumBlock + static_cast<uint64_t>(bad_block);
    if (attempt >= kVerifiedReadAttempts) {
      // Only a server that ignored verify_at_client=false gets here.
      return Status(Code::kCorrupt, "block " + std::to_string(block) + " fails its checksum and the data server " +
                                        "sent it unverified when asked to verify")
          .with_context(what);
    }
    PENSTOCK_LOG(Info) << what << ": block " << block
                       << " failed its checksum (a concurrent write or truncate?); reading it again";
    which = std::move(bad);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    Status fill = zero_fill_tail(pieces[i].dst, received[i]);
    if (!fill.is_ok()) return fill.with_context(tasks[i].what);
  }
  return Status::ok();
}

void Client::note_small_file(const proto::InodeAttr& attr) {
  if (!is_regular(attr) || cache_->capacity() == 0) return;
  const bool small = attr.size > 0 && attr.layout.chunk_size != 0 && attr.size <= block_size(attr.layout);
  std::lock_guard<std::mutex> lock(looked_up_mu_);
  if (!small) {
    // What an earlier lookup saw is out of date (the file grew or was emptied): no fetch of it.
    looked_up_.erase(attr.ino);
    return;
  }
  // Bounded: forgetting costs only the overlap at the next open of a forgotten file.
  if (looked_up_.size() >= (1u << 16)) looked_up_.clear();
  looked_up_[attr.ino] = LookedUp{attr.generation, attr.size, attr.layout};
}

// The block is cached under the lookup's generation, so if the open finds a newer one,
// set_generation() drops it unread (close-to-open holds); the read joins the fetch in flight
// (ChunkCache).
void Client::prefetch_small_file(InodeId ino, uint32_t flags) {
  LookedUp f;
  {
    // Any open uses up what the lookup saw, so a later open without a lookup fetches nothing old.
    std::lock_guard<std::mutex> lock(looked_up_mu_);
    auto it = looked_up_.find(ino);
    if (it == looked_up_.end()) return;
    f = std::move(it->second);
    looked_up_.erase(it);
  }
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC) != 0) return;
  {
    // Opened before at this generation: the kernel may still hold the pages (keep_cache) and then
    // sends no read at all; it did not at that open when it read the file from us then (a data
    // set larger than the page cache, read again every epoch).
    std::lock_guard<std::mutex> lock(opened_mu_);
    auto it = opened_.find(ino);
    if (it != opened_.end() && it->second.generation == f.generation && !it->second.kernel_read) return;
  }
  if (wb_find(ino) != nullptr || pool_->stopped()) return;
  ChunkCache::Lookup lk;
  {
    // Our own writes not yet reported are not in the lookup's generation. The check and the insert
    // are one step under files_mu_: write() enters the file there before it buffers anything and
    // invalidates the cached range after, so a write either is seen here or drops this block
    // (a write between a check and a later insert would leave the old bytes cached under the
    // generation the open keeps, and this client's own reads would serve them).
    std::lock_guard<std::mutex> lock(files_mu_);
    if (files_.count(ino) != 0) return;
    const uint64_t bs = block_size(f.layout);
    lk = cache_->get_or_start(ino, f.generation, 0, block_length(bs, 0, f.size), block_valid(bs, 0, f.size));
  }
  if (lk.fetch) fetch_block_async(ino, f.layout, std::move(lk.block));
}

// Sent by the calling thread and completed by the reply on the I/O thread: no thread wakes up to
// send it and nobody waits for it (a reader that comes early waits on the block). The fast path
// only; anything else (no route yet, an error reply, a block failing its checksum) hands the block
// to fetch_block() on the pool, which has the map refreshes and the verified re-reads.
void Client::fetch_block_async(InodeId ino, const proto::Layout& layout, std::shared_ptr<CachedBlock> block) {
  auto give_up = [this, ino, block] {
    cache_->erase(ino, block);
    block->complete(Status(Code::kUnavailable, "the client is shutting down"));
  };
  auto slow_path = [this, ino, layout, block, give_up] {
    const bool queued = pool_->try_submit([this, ino, layout, block, give_up] {
      // Once shutdown() began nobody will read the block: no re-reads that would only delay it
      // (pool_->stop() runs what is queued, after shutdown() set async_closed_).
      bool closing = false;
      {
        std::lock_guard<std::mutex> lock(async_mu_);
        closing = async_closed_;
      }
      if (closing) return give_up();
      fetch_block(ino, layout, block);
    });
    if (!queued) give_up();  // the pool has stopped: nobody may block on an I/O thread now
  };
  auto plan = plan_chunk_io(layout, block->offset(), block->length());
  auto current = routes();
  if (!plan.has_value() || plan->size() != 1 || current == nullptr) return slow_path();
  const ChunkIo io = plan->front();
  DataTask task;
  task.chain = io.chain;
  task.to_tail = true;
  auto route = resolve(*current, task);
  if (!route.has_value()) return slow_path();
  auto rpc = data_client(route->address);
  if (!rpc.has_value()) return slow_path();
  data::ReadReq req;
  req.key = data::ChunkKey{route->chain, route->target, ino, io.chunk_index, layout.chunk_size};
  req.offset = io.offset_in_chunk;
  req.length = io.length;
  req.verify_at_client = true;
  req.sequential = true;  // the file whole, from its start
  bool closed = false;
  {
    // shutdown() waits for every reply handled here before it stops the pool.
    std::lock_guard<std::mutex> lock(async_mu_);
    closed = async_closed_;
    if (!closed) ++async_fetches_;
  }
  if (closed) return give_up();
  auto received = std::make_shared<uint32_t>(0);
  rpc::CallOptions opts;
  opts.bulk_in = block->buffer();
  opts.bulk_received = received.get();
  (*rpc)->call_async<data::Read>(req, opts, [this, block, received, slow_path, keep = *rpc](Result<data::ReadResp> r) {
    auto finish = [&] {
      if (!r.has_value()) return slow_path();
      const std::span<uint8_t> buf = block->buffer();
      if (*received > buf.size()) return slow_path();
      if (!r->block_sums.empty()) {
        const std::span<const uint8_t> got = buf.first(*received);
        const uint64_t blocks = (got.size() + data::kChecksumBlock - 1) / data::kChecksumBlock;
        if (r->block_sums.size() != 2 * blocks ||
            checksum::first_bad_block(got, r->block_sums, data::kChecksumBlock) >= 0) {
          return slow_path();
        }
      }
      if (!zero_fill_tail(buf, *received).is_ok()) return slow_path();
      block->complete(Status::ok());
    };
    finish();
    std::lock_guard<std::mutex> lock(async_mu_);  // the last use of `this`
    if (--async_fetches_ == 0) async_cv_.notify_all();
  });
}

void Client::fetch_block(InodeId ino, const proto::Layout& layout, const std::shared_ptr<CachedBlock>& block) {
  std::vector<std::pair<uint64_t, std::span<uint8_t>>> one{{block->offset(), block->buffer()}};
  Status st = read_ranges(ino, layout, one, true);  // read-ahead, or a small file whole
  if (!st.is_ok()) cache_->erase(ino, block);
  block->complete(std::move(st));
}

Result<size_t> Client::read(InodeId ino, const proto::Layout& layout, uint64_t size_hint, uint64_t offset,
                            std::span<uint8_t> buf, ReadContext* ctx) {
  ReadPieces pieces;
  PENSTOCK_ASSIGN_OR_RETURN(size_t n, read_pieces(ino, layout, size_hint, offset, buf, ctx, &pieces));
  size_t pos = 0;
  for (std::span<const uint8_t> piece : pieces.spans) {
    // Pieces read directly are in `buf` at their place already; cached ones are copied.
    if (piece.data() != buf.data() + pos) std::memcpy(buf.data() + pos, piece.data(), piece.size());
    pos += piece.size();
  }
  return n;
}

Result<size_t> Client::read_pieces(InodeId ino, const proto::Layout& layout, uint64_t size_hint, uint64_t offset,
                                   std::span<uint8_t> buf, ReadContext* ctx, ReadPieces* out_pieces,
                                   const ReadLater* later) {
  out_pieces->clear();
  // The whole range landed in `buf` (a direct read): one piece.
  auto direct = [out_pieces](std::span<const uint8_t> bytes) {
    out_pieces->clear();
    out_pieces->spans.push_back(bytes);
    out_pieces->bytes = bytes.size();
    return bytes.size();
  };
  if (buf.empty()) return size_t{0};
  if (offset == 0) note_kernel_read(ino);
  // Our own buffered writes first: a client always reads what it wrote.
  PENSTOCK_RETURN_IF_ERROR(wb_drain_overlap(ino, offset, buf.size()));
  uint64_t size = size_hint;
  {
    std::lock_guard<std::mutex> lock(files_mu_);
    auto it = files_.find(ino);
    if (it != files_.end()) size = std::max(size, it->second.written_end);
  }
  if (offset + buf.size() > size) {
    // The range passes what we know: another client may have grown the file since.
    PENSTOCK_ASSIGN_OR_RETURN(proto::InodeAttr attr, getattr(ino));
    size = attr.size;
  }
  const uint64_t n = clip_to_eof(offset, buf.size(), size);
  if (n == 0) return size_t{0};
  std::span<uint8_t> out = buf.first(n);
  if (ctx == nullptr || cache_->capacity() == 0 || layout.chunk_size == 0) {
    PENSTOCK_RETURN_IF_ERROR(read_ranges(ino, layout, {{offset, out}}, false));
    return direct(out);
  }
  const uint64_t bs = block_size(layout);
  ReadAdvice advice;
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    advice = ctx->detector.on_read(offset, n);
  }
  const uint64_t first = offset / bs * bs;
  const uint64_t end = offset + n;
  std::vector<std::shared_ptr<CachedBlock>> blocks;
  if (!advice.sequential) {
    // Random reads: whole blocks would multiply the bytes moved; use the cache only when it holds
    // the whole range already. A file of one block joins that block's fetch: it is the one its
    // open started (prefetch_small_file), and a first read elsewhere (a footer) would read twice.
    const bool join = size <= bs;
    for (uint64_t b = first; b < end; b += bs) {
      auto blk = cache_->find_ready(ino, ctx->generation, b, join);
      if (blk == nullptr || blk->offset() + blk->valid() < std::min(end, b + bs)) {
        blocks.clear();
        break;
      }
      blocks.push_back(std::move(blk));
    }
    if (blocks.empty()) {
      PENSTOCK_RETURN_IF_ERROR(read_ranges(ino, layout, {{offset, out}}, false));
      return direct(out);
    }
  } else {
    std::vector<std::shared_ptr<CachedBlock>> mine;
    for (uint64_t b = first; b < end; b += bs) {
      auto lk = cache_->get_or_start(ino, ctx->generation, b, block_length(bs, b, size), block_valid(bs, b, size));
      if (lk.fetch) mine.push_back(lk.block);
      blocks.push_back(std::move(lk.block));
    }
    // Read-ahead: queued before our own fetch so that both travel at once.
    if (advice.prefetch_length > 0 && advice.prefetch_offset < size) {
      const uint64_t pf_end = std::min(size, advice.prefetch_offset + advice.prefetch_length);
      for (uint64_t b = advice.prefetch_offset / bs * bs; b < pf_end; b += bs) {
        auto lk = cache_->get_or_start(ino, ctx->generation, b, block_length(bs, b, size), block_valid(bs, b, size));
        if (!lk.fetch) continue;
        pool_->submit([this, ino, layout, blk = lk.block] { fetch_block(ino, layout, blk); });
      }
    }
    if (!mine.empty()) {
      std::vector<std::pair<uint64_t, std::span<uint8_t>>> ranges;
      for (auto& blk : mine) ranges.emplace_back(blk->offset(), blk->buffer());
      Status st = read_ranges(ino, layout, ranges, true);
      for (auto& blk : mine) {
        if (!st.is_ok()) cache_->erase(ino, blk);
        blk->complete(st);
      }
      if (!st.is_ok()) return st;
    }
  }
  if (later != nullptr && blocks.size() == 1 && !blocks.front()->done()) {
    std::shared_ptr<CachedBlock> blk = blocks.front();
    auto rest = [this, ino, layout, offset, n, bs, blk, rest_of_read = *later](const Status&) {
      finish_deferred_read(ino, layout, offset, n, bs, blk, rest_of_read);
    };
    if (blk->then(std::move(rest))) {
      deferred_reads_.fetch_add(1, std::memory_order_relaxed);
      out_pieces->deferred = true;
      return size_t{0};
    }
  }
  PENSTOCK_ASSIGN_OR_RETURN(bool done, collect_pieces(std::move(blocks), offset, end, bs, out_pieces));
  if (!done) {
    PENSTOCK_RETURN_IF_ERROR(read_ranges(ino, layout, {{offset, out}}, advice.sequential));
    return direct(out);
  }
  return static_cast<size_t>(n);
}

Result<bool> Client::collect_pieces(std::vector<std::shared_ptr<CachedBlock>> blocks, uint64_t offset, uint64_t end,
                                    uint64_t bs, ReadPieces* out) {
  for (auto& blk : blocks) {
    Status st = blk->wait();
    if (!st.is_ok()) {
      out->clear();  // its spans point into `blocks`, which go away now
      return st;
    }
    const uint64_t lo = std::max(offset, blk->offset());
    const uint64_t hi = std::min(end, blk->offset() + blk->valid());
    // A block cut at an older EOF (a fetch in flight it joined, or the end of file moved within
    // its last page since): the range is read directly.
    if (hi < std::min(end, blk->offset() + bs)) {
      out->clear();
      return false;
    }
    if (hi > lo) {
      out->spans.emplace_back(blk->data() + (lo - blk->offset()), hi - lo);
      out->bytes += hi - lo;
    }
  }
  // The spans point into the blocks: they stay pinned as long as *out holds them.
  out->pins = std::move(blocks);
  return true;
}

void Client::finish_deferred_read(InodeId ino, const proto::Layout& layout, uint64_t offset, uint64_t n,
                                  uint64_t bs, std::shared_ptr<CachedBlock> block, const ReadLater& later) {
  ReadPieces pieces;
  auto done = collect_pieces({std::move(block)}, offset, offset + n, bs, &pieces);
  if (!done.has_value()) return later(done.error(), pieces);
  if (*done) return later(static_cast<size_t>(n), pieces);
  // Reading directly waits for the data servers: not on the thread that completed the block.
  pieces.clear();
  const bool queued = pool_->try_submit([this, ino, layout, offset, n, later] {
    std::vector<uint8_t> bytes(n);
    ReadPieces direct;
    Status st = read_ranges(ino, layout, {{offset, std::span<uint8_t>(bytes)}}, true);  // a stream's block
    if (!st.is_ok()) return later(st, direct);
    direct.spans.emplace_back(bytes.data(), bytes.size());
    direct.bytes = bytes.size();
    later(static_cast<size_t>(n), direct);
  });
  if (!queued) later(Status(Code::kUnavailable, "the client is shutting down"), pieces);
}

Status Client::write_now(InodeId ino, const proto::Layout& layout, uint64_t offset, std::span<const uint8_t> bytes) {
  auto plan_r = plan_chunk_io(layout, offset, bytes.size());
  if (!plan_r.has_value()) return plan_r.error().with_context("write inode " + ino.to_string());
  const std::vector<ChunkIo>& plan = *plan_r;
  std::vector<DataTask> tasks(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    tasks[i].chain = plan[i].chain;
    tasks[i].what = "write chunk " + std::to_string(plan[i].chunk_index) + " of inode " + ino.to_string();
  }
  return fan_out(tasks, [&](size_t i, const Route& route, rpc::RpcClient& rpc, bool blocking,
                            std::function<void(Status)> done) {
    data::WriteReq req;
    req.key = data::ChunkKey{route.chain, route.target, ino, plan[i].chunk_index, layout.chunk_size};
    req.offset = plan[i].offset_in_chunk;
    rpc::CallOptions opts;
    opts.bulk_out = bytes.subspan(plan[i].buf_offset, plan[i].length);
    rpc.call_either<data::Write>(req, opts, blocking,
                                 [done = std::move(done)](Result<data::WriteResp> r) { done(r.status()); });
  });
}

std::shared_ptr<Client::WbFile> Client::wb_find(InodeId ino) {
  std::lock_guard<std::mutex> lock(wb_mu_);
  auto it = wb_files_.find(ino);
  return it == wb_files_.end() ? nullptr : it->second;
}

void Client::wb_send_locked(InodeId ino, const std::shared_ptr<WbFile>& wf, std::unique_lock<std::mutex>& lock,
                            bool here) {
  if (wf->buf.empty()) return;
  auto data = std::make_shared<ByteBuffer>(std::move(wf->buf));
  wf->buf = {};
  const uint64_t off = wf->buf_offset;
  const uint64_t len = data->size();
  budget_->start_flight(len);
  wf->inflight.emplace_back(off, off + len);
  PENSTOCK_LOG(Debug) << "write-behind send inode " << ino.to_string() << " [" << off << ", " << off + len << ")";
  // The bytes to the data servers; no lock is needed (the range is listed in `inflight`).
  auto transfer = [this, ino, data, off, len, layout = wf->layout] {
    Status st = write_now(ino, layout, off, *data);
    PENSTOCK_LOG(Debug) << "write-behind done inode " << ino.to_string() << " [" << off << ", " << off + len << "): " << st.to_string();
    // Blocks fetched while these bytes were on their way may hold the old ones.
    cache_->invalidate_range(ino, off, len);
    return st;
  };
  // After the send: the range leaves `inflight`, a failure is recorded for the file's handles,
  // waiters wake. REQUIRES: wf->mu held.
  auto settle = [this, ino, wf, off, len](const Status& st) {
    auto it = std::find(wf->inflight.begin(), wf->inflight.end(), std::make_pair(off, off + len));
    if (it != wf->inflight.end()) wf->inflight.erase(it);
    if (!st.is_ok()) {
      PENSTOCK_LOG(Warn) << "write-behind of inode " << ino.to_string() << " at " << off << " (" << len
                         << " bytes) failed: " << st.to_string() << "; reported at the next write, close or fsync";
      wf->error->record(st);
    }
    wf->cv.notify_all();
    budget_->finish_flight(len);
  };
  if (here) {
    // A drain sends the last buffer itself: it waits for it anyway, and a pool thread would only
    // add two thread wake-ups (close() of a small file is one write).
    lock.unlock();
    const Status st = transfer();
    lock.lock();
    settle(st);
    return;
  }
  const bool queued = pool_->try_submit([wf, transfer, settle] {
    const Status st = transfer();
    std::lock_guard<std::mutex> g(wf->mu);
    settle(st);
  });
  // The pool stopped (shutdown raced with this write): send here, keeping the file's lock, since
  // write() goes on appending to the buffer as it left it.
  if (!queued) settle(transfer());
}

Status Client::wb_drain(InodeId ino) {
  auto wf = wb_find(ino);
  if (wf == nullptr) return Status::ok();
  std::unique_lock<std::mutex> lock(wf->mu);
  wb_send_locked(ino, wf, lock, /*here=*/true);
  wf->cv.wait(lock, [&] { return wf->inflight.empty(); });
  return wf->error->check(nullptr, /*advance=*/false);
}

Status Client::wb_drain_overlap(InodeId ino, uint64_t offset, uint64_t length) {
  auto wf = wb_find(ino);
  if (wf == nullptr) return Status::ok();
  bool hit = false;
  {
    std::lock_guard<std::mutex> lock(wf->mu);
    const uint64_t end = offset + length;
    hit = !wf->buf.empty() && overlaps(offset, end, wf->buf_offset, wf->buf_offset + wf->buf.size());
    for (const auto& [b, e] : wf->inflight) hit = hit || overlaps(offset, end, b, e);
  }
  return hit ? wb_drain(ino) : Status::ok();
}

void Client::wb_retire_if_idle(InodeId ino) {
  std::lock_guard<std::mutex> lock(wb_mu_);
  auto it = wb_files_.find(ino);
  if (it == wb_files_.end()) return;
  // Our own reference, destroyed after `g` unlocks: erasing the map's may leave the last one to a
  // finished send task, which would free the WbFile (and the mutex `g` holds) on its thread.
  const std::shared_ptr<WbFile> wf = it->second;
  std::lock_guard<std::mutex> g(wf->mu);
  if (!wf->buf.empty() || !wf->inflight.empty() || wf->writers > 0 || wf->error->unreported()) return;
  wf->retired = true;
  wb_files_.erase(it);
}

std::shared_ptr<WriteError> Client::error_record(InodeId ino) {
  std::lock_guard<std::mutex> lock(errors_mu_);
  std::weak_ptr<WriteError>& slot = errors_[ino];
  if (auto live = slot.lock()) return live;
  auto fresh = std::make_shared<WriteError>();
  slot = fresh;
  if (errors_.size() >= errors_sweep_at_) {
    std::erase_if(errors_, [](const auto& e) { return e.second.expired(); });
    errors_sweep_at_ = std::max<size_t>(64, 2 * errors_.size());
  }
  return fresh;
}

WriteCursor Client::write_cursor(InodeId ino) {
  WriteCursor c;
  c.errors = error_record(ino);
  c.seen = c.errors->sample();
  return c;
}

Status Client::take_write_error(InodeId ino, WriteCursor* cursor) {
  cursor = usable(cursor);
  std::shared_ptr<WriteError> rec;
  if (cursor != nullptr) {
    rec = cursor->errors;
  } else if (auto wf = wb_find(ino); wf != nullptr) {
    rec = wf->error;
  }
  if (rec == nullptr) return Status::ok();
  Status err = rec->check(cursor, /*advance=*/true);
  return err.is_ok() ? err : err.with_context("write-behind of inode " + ino.to_string());
}

Status Client::write(InodeId ino, const proto::Layout& layout, uint64_t offset, WriteSource& src,
                     WriteCursor* cursor) {
  const size_t size = src.size();
  if (size == 0) return Status::ok();
  cursor = usable(cursor);
  bool first = false;  // since the last size report
  {
    // A new write makes any flush that started before it stale (see flush()).
    std::lock_guard<std::mutex> lock(files_mu_);
    first = ++files_[ino].seq == 1;
  }
  if (first && cb_ != nullptr) cb_->written(ino);  // how a directory's files are used (create_behind.h)
  // After shutdown() nothing is left behind: writes go out before they return.
  Status taken = Status::ok();  // a descriptor source that failed part way
  if (budget_ == nullptr || layout.chunk_size == 0 || pool_->stopped()) {
    std::span<const uint8_t> bytes = src.memory();
    ByteBuffer copy;
    if (bytes.size() != size) {
      copy.resize(size);
      PENSTOCK_RETURN_IF_ERROR(src.take(copy.data(), size));
      bytes = copy;
    }
    PENSTOCK_RETURN_IF_ERROR(write_now(ino, layout, offset, bytes));
    cache_->invalidate_range(ino, offset, size);
  } else {
    budget_->acquire(size);  // back-pressure: may wait for sends of any file
    std::shared_ptr<WbFile> wf;
    std::unique_lock<std::mutex> lock;
    for (;;) {
      {
        std::lock_guard<std::mutex> g(wb_mu_);
        auto& slot = wb_files_[ino];
        if (slot == nullptr) {
          slot = std::make_shared<WbFile>();
          slot->error = cursor != nullptr ? cursor->errors : error_record(ino);
        }
        wf = slot;
      }
      lock = std::unique_lock<std::mutex>(wf->mu);
      if (!wf->retired) break;
      lock.unlock();
    }
    if (Status err = wf->error->check(cursor, /*advance=*/false); !err.is_ok()) {
      lock.unlock();
      budget_->release_buffered(size);
      return err;
    }
    // While we are inside (also while waiting below with mu released) the record must stay in
    // wb_files_, or bytes appended after a wait would land in a record no flush ever sees.
    ++wf->writers;
    const uint64_t unit = wb_unit(layout);
    size_t pos = 0;
    while (pos < size) {
      const uint64_t off = offset + pos;
      if (!wf->buf.empty() &&
          (off != wf->buf_offset + wf->buf.size() || off / unit != wf->buf_offset / unit)) {
        wb_send_locked(ino, wf, lock);
      }
      if (wf->buf.empty()) {
        // Sends of one file may overlap only in order: wait out any in flight over this unit.
        const uint64_t unit_end = (off / unit + 1) * unit;
        bool busy = false;
        for (const auto& [b, e] : wf->inflight) busy = busy || overlaps(off, unit_end, b, e);
        if (busy) {
          // The wait lets other writers of this file (other processes, other threads) in: look at
          // the buffer again from the top afterwards.
          wf->cv.wait(lock);
          continue;
        }
        wf->buf_offset = off;
        wf->layout = layout;
        wf->buf.reserve(unit_end - off);
      }
      const uint64_t room = unit - (off % unit);
      const size_t take = static_cast<size_t>(std::min<uint64_t>(room, size - pos));
      const size_t had = wf->buf.size();
      wf->buf.resize(had + take);
      taken = src.take(wf->buf.data() + had, take);
      if (!taken.is_ok()) {
        wf->buf.resize(had);
        budget_->release_buffered(size - pos);
        break;
      }
      pos += take;
      if ((wf->buf_offset + wf->buf.size()) % unit == 0) wb_send_locked(ino, wf, lock);
    }
    --wf->writers;
    lock.unlock();
    cache_->invalidate_range(ino, offset, size);
  }
  const uint64_t written = taken.is_ok() ? size : src.taken();
  std::lock_guard<std::mutex> lock(files_mu_);
  FileState& fs = files_[ino];
  if (written > 0) fs.written_end = std::max(fs.written_end, offset + written);
  fs.mtime_ns = std::max(fs.mtime_ns, now_ns());
  ++fs.seq;
  if (!taken.is_ok()) return taken.with_context("write inode " + ino.to_string() + " at " + std::to_string(offset));
  return Status::ok();
}

Status Client::flush(InodeId ino, WriteCursor* cursor) { return flush_and_report(ino, cursor, /*durable=*/false); }

Status Client::flush_and_report(InodeId ino, WriteCursor* cursor, bool durable) {
  (void)wb_drain(ino);  // its error is the record's, reported next
  Status err = take_write_error(ino, cursor);
  wb_retire_if_idle(ino);  // also after reporting an error: the handles keep the record itself
  if (!err.is_ok()) return err;
  // With nothing (new) to report, fsync still needs a size an earlier close reported on disk.
  auto sync_log = [&] {
    if (!durable) return Status::ok();
    return sync_namespace().with_context("sync size of inode " + ino.to_string());
  };
  uint64_t written_end = 0;
  int64_t mtime = 0;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(files_mu_);
    auto it = files_.find(ino);
    if (it == files_.end()) return sync_log();
    written_end = it->second.written_end;
    mtime = it->second.mtime_ns;
    seq = it->second.seq;
  }
  // Writes are on the data servers now (visible to every reader); what close-to-open still needs
  // is the size at the meta server: visible at once, and durable when fsync asks for it.
  // An entry with neither bytes nor a time holds no write that succeeded (write() enters the file
  // before it sends): nothing to report, as before a setattr could set the time.
  if (written_end == 0 && mtime == 0) return sync_log();
  const meta::ReportSizeReq req{ino, written_end, mtime};
  auto r = durable ? meta_call<meta::ReportSize>(req) : meta_call<meta::ReportSizeAtClose>(req);
  // A meta server older than ReportSizeAtClose syncs every report (and has no SyncLog).
  if (!r.has_value() && r.error().code() == Code::kNotSupported) r = meta_call<meta::ReportSize>(req);
  if (!r.has_value()) return r.error().with_context("report size of inode " + ino.to_string());
  std::lock_guard<std::mutex> lock(files_mu_);
  reported_.note(r->attr);
  auto it = files_.find(ino);
  // The meta server now knows the size; forget ours unless another write came in meanwhile.
  if (it != files_.end() && it->second.seq == seq) files_.erase(it);
  return Status::ok();
}

Status Client::sync_namespace() {
  Status st = meta_call<meta::SyncLog>(proto::Empty{}).status();
  // An older server has no SyncLog and synced every change before acknowledging it.
  if (st.code() == Code::kNotSupported) return Status::ok();
  return st;
}

Status Client::fsync(InodeId ino, const proto::Layout& layout, WriteCursor* cursor) {
  (void)wb_drain(ino);
  PENSTOCK_RETURN_IF_ERROR(take_write_error(ino, cursor));
  // One Sync per target of every chain of the file, not only the chains this handle wrote: fsync
  // covers writes made through any descriptor, also ones already closed. Syncing a clean chunk
  // file costs no I/O on the data server.
  auto current = routes();
  std::vector<DataTask> tasks;
  for (ChainId chain : layout.chains) {
    Result<std::vector<Route>> all = current ? current->all_targets(chain)
                                             : Result<std::vector<Route>>(Status(Code::kNotFound, "no map"));
    if (!all.has_value()) {
      PENSTOCK_RETURN_IF_ERROR(refresh_map());
      current = routes();
      all = current->all_targets(chain);
      if (!all.has_value()) return all.error().with_context("sync inode " + ino.to_string());
    }
    for (const Route& r : *all) {
      DataTask t;
      t.chain = chain;
      t.target = r.target;
      t.what = "sync inode " + ino.to_string() + " (chain " + chain.to_string() + ")";
      tasks.push_back(std::move(t));
    }
  }
  PENSTOCK_RETURN_IF_ERROR(fan_out(tasks, [&](size_t, const Route& route, rpc::RpcClient& rpc, bool blocking,
                                               std::function<void(Status)> done) {
    rpc.call_either<data::Sync>(data::SyncReq{route.target, ino}, {}, blocking,
                                [done = std::move(done)](Result<proto::Empty> r) { done(r.status()); });
  }));
  return flush_and_report(ino, cursor, /*durable=*/true);
}

Status Client::release(InodeId ino, bool flush_writes, WriteCursor* cursor) {
  Status flushed = flush_writes ? flush(ino, cursor) : Status::ok();
  if (cb_ != nullptr) {
    // A file created behind and closed before its create was sent is sent closed: nothing to release.
    if (cb_->closed_before_sent(ino)) {
      count_release(ino);
      return flushed;
    }
    cb_->closed(ino);
  }
  queue_releases({ino});
  return flushed;
}

void Client::queue_releases(const std::vector<InodeId>& inos) {
  if (inos.empty()) return;
  bool queued = false;
  {
    std::lock_guard<std::mutex> lock(rel_mu_);
    if (rel_running_ && !rel_stop_) {
      const bool was_empty = rel_queue_.empty();
      rel_queue_.insert(rel_queue_.end(), inos.begin(), inos.end());
      queued = true;
      if (was_empty || rel_queue_.size() >= meta::kMaxReleaseBatch) rel_cv_.notify_all();
    }
  }
  if (!queued) send_releases(inos);  // no session, or after shutdown()
}

// ---- open tickets (client.h) ----

// Threads remembered at once; beyond it every ticket is dropped and the table starts again.
constexpr size_t kMaxTicketCallers = 4096;

bool Client::tickets_on() const {
  return options_.open_tickets && options_.register_session && lookup_open_ok_.load(std::memory_order_relaxed) &&
         !tickets_closed_.load();
}

void Client::release_tickets(const std::vector<OpenTicket>& dropped) {
  if (dropped.empty()) return;
  std::vector<InodeId> send;
  const SessionId now = session();
  for (const OpenTicket& t : dropped) {
    // Granted to a session this client no longer has: that session's opens went with it, and a
    // release under the new one could take away an open of a real handle.
    if (t.session == now) {
      send.push_back(t.ino);
    } else {
      count_release(t.ino);
    }
  }
  queue_releases(send);
}

void Client::drop_ticket_locked(CallerTickets& c, std::vector<OpenTicket>* dropped) {
  if (!c.ticket.has_value()) return;
  dropped->push_back(std::move(*c.ticket));
  c.ticket.reset();
  c.want = false;  // this thread's lookups have not been for opens lately
  ++ticket_stats_.dropped;
  tickets_held_.fetch_sub(1);
}

bool Client::want_ticket(uint64_t caller, std::vector<OpenTicket>* dropped) {
  if (!tickets_on()) return false;
  std::lock_guard<std::mutex> lock(tickets_mu_);
  auto it = tickets_.find(caller);
  if (it == tickets_.end()) {
    if (tickets_.size() >= kMaxTicketCallers) {
      for (auto& [tid, c] : tickets_) drop_ticket_locked(c, dropped);
      tickets_.clear();
    }
    it = tickets_.emplace(caller, CallerTickets{}).first;
  }
  // An earlier ticket cannot belong to an open after this lookup: the open takes its own. Asking
  // again keeps it until the answer, in case it names the same file (stat() then open()).
  if (!it->second.want) drop_ticket_locked(it->second, dropped);
  return it->second.want;
}

void Client::keep_ticket(uint64_t caller, const proto::InodeAttr& attr, std::optional<SessionId> opened_for,
                         std::vector<OpenTicket>* dropped) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(tickets_mu_);
    CallerTickets& c = tickets_[caller];
    if (!opened_for.has_value()) return drop_ticket_locked(c, dropped);
    ++ticket_stats_.granted;
    OpenTicket fresh{attr.ino, attr, std::chrono::steady_clock::now(), *opened_for};
    if (tickets_closed_.load()) {
      // shutdown() has begun: the releaser may have swept for the last time.
      dropped->push_back(std::move(fresh));
      ++ticket_stats_.dropped;
      return;
    }
    if (c.ticket.has_value() && c.ticket->ino == attr.ino && c.ticket->session == *opened_for) {
      // The same file again (stat() and then open()): one open is enough, the newer attributes win.
      dropped->push_back(std::move(*c.ticket));
      ++ticket_stats_.dropped;
      c.ticket = std::move(fresh);
      return;
    }
    drop_ticket_locked(c, dropped);
    c.ticket = std::move(fresh);
    first = tickets_held_.fetch_add(1) == 0;
  }
  if (first && releaser_idle_.load()) {
    // The releaser sleeps without a timeout: wake it to expire this ticket should nobody take it.
    std::lock_guard<std::mutex> lock(rel_mu_);
    rel_cv_.notify_all();
  }
}

std::optional<proto::InodeAttr> Client::take_ticket(uint64_t caller, InodeId ino, bool usable) {
  if (caller == 0) return std::nullopt;
  std::vector<OpenTicket> dropped;
  std::optional<proto::InodeAttr> taken;
  {
    std::lock_guard<std::mutex> lock(tickets_mu_);
    auto it = tickets_.find(caller);
    if (it == tickets_.end()) return std::nullopt;
    CallerTickets& c = it->second;
    if (c.ticket.has_value() && c.ticket->ino == ino) {
      if (usable && std::chrono::steady_clock::now() - c.ticket->granted <= options_.open_ticket_window &&
          c.ticket->session == session()) {
        taken = std::move(c.ticket->attr);
        c.ticket.reset();
        ++ticket_stats_.taken;
        tickets_held_.fetch_sub(1);
      } else {
        drop_ticket_locked(c, &dropped);
      }
    }
    // This thread opens files after its lookups: it asks again if the open could take a ticket
    // (a thread opening for writing would only get tickets to release).
    c.want = usable;
  }
  release_tickets(dropped);
  return taken;
}

std::vector<Client::OpenTicket> Client::expire_tickets(bool all) {
  std::vector<OpenTicket> dropped;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(tickets_mu_);
  for (auto& [tid, c] : tickets_) {
    if (c.ticket.has_value() && (all || now - c.ticket->granted > options_.open_ticket_window)) {
      drop_ticket_locked(c, &dropped);
    }
  }
  return dropped;
}

OpenTicketStats Client::open_ticket_stats() const {
  std::lock_guard<std::mutex> lock(tickets_mu_);
  return ticket_stats_;
}

// Closes come in bursts (a loader closing the files it read, a rank closing its shards): after
// the first queued release the thread waits this long for more before sending them together.
constexpr auto kReleaseGather = std::chrono::milliseconds(2);

void Client::release_loop() {
  std::unique_lock<std::mutex> lock(rel_mu_);
  auto ready = [this] { return rel_stop_ || !rel_queue_.empty() || reclaim_version_ != reclaimed_version_; };
  auto last_sweep = std::chrono::steady_clock::now();
  for (;;) {
    if (tickets_held_.load() > 0) {
      rel_cv_.wait_for(lock, options_.open_ticket_window, ready);
    } else {
      // keep_ticket() notifies when it sees us idle; checking tickets_held_ after publishing that
      // closes the window in which it could miss us.
      releaser_idle_.store(true);
      rel_cv_.wait(lock, [&] { return ready() || tickets_held_.load() > 0; });
      releaser_idle_.store(false);
    }
    // Once a window (a sweep walks every thread's entry), and at the stop: nobody takes them then.
    const auto now = std::chrono::steady_clock::now();
    if (tickets_held_.load() > 0 && (rel_stop_ || now - last_sweep >= options_.open_ticket_window)) {
      last_sweep = now;
      const bool all = rel_stop_;
      lock.unlock();
      release_tickets(expire_tickets(all));  // queued, or at the stop sent from here
      lock.lock();
    }
    if (!ready()) continue;
    if (reclaim_version_ != reclaimed_version_ && !rel_stop_) {
      const uint64_t version = reclaim_version_;
      lock.unlock();
      const bool done = reclaim_opens();
      lock.lock();
      // Not taken: the next heartbeat asks again.
      if (done) {
        reclaimed_version_ = version;
      } else {
        reclaim_version_ = reclaimed_version_;
      }
      continue;
    }
    if (rel_queue_.empty()) return;  // stopping and everything was sent
    rel_cv_.wait_for(lock, kReleaseGather,
                     [this] { return rel_stop_ || rel_queue_.size() >= meta::kMaxReleaseBatch; });
    std::vector<InodeId> batch;
    if (rel_queue_.size() > meta::kMaxReleaseBatch) {
      const auto end = rel_queue_.begin() + static_cast<std::ptrdiff_t>(meta::kMaxReleaseBatch);
      batch.assign(rel_queue_.begin(), end);
      rel_queue_.erase(rel_queue_.begin(), end);
    } else {
      batch.swap(rel_queue_);
    }
    lock.unlock();
    send_releases(std::move(batch));
    lock.lock();
  }
}

void Client::count_open(InodeId ino) {
  std::lock_guard<std::mutex> lock(open_counts_mu_);
  ++open_counts_[ino.value];
}

void Client::count_release(InodeId ino) {
  std::lock_guard<std::mutex> lock(open_counts_mu_);
  auto it = open_counts_.find(ino.value);
  if (it == open_counts_.end()) return;
  if (--it->second == 0) open_counts_.erase(it);
}

bool Client::reclaim_opens() {
  std::vector<meta::OpenCount> all;
  {
    std::lock_guard<std::mutex> lock(open_counts_mu_);
    all.reserve(open_counts_.size());
    for (const auto& [ino, n] : open_counts_) all.push_back(meta::OpenCount{InodeId(ino), n});
  }
  const SessionId sid = session();
  size_t at = 0;
  do {  // at least one call: an empty list with `last` still tells the server we are done
    const size_t n = std::min(all.size() - at, meta::kMaxReclaimBatch);
    meta::ReclaimOpensReq req{sid, {all.begin() + static_cast<std::ptrdiff_t>(at), all.begin() + static_cast<std::ptrdiff_t>(at + n)},
                              at + n == all.size()};
    at += n;
    auto r = meta_->call<meta::ReclaimOpens>(req);
    if (!r.has_value() && r.error().code() == Code::kNotSupported) {
      PENSTOCK_LOG(Info) << "penstock-meta predates ReclaimOpens: it keeps every open in its store itself";
      return true;
    }
    if (!r.has_value()) {
      PENSTOCK_LOG(Warn) << "sending the " << all.size() << " open file(s) of session " << sid.value
                         << " to the meta server failed: " << r.error().to_string()
                         << "; trying again at the next heartbeat";
      return false;
    }
  } while (at < all.size());
  return true;
}

void Client::send_releases(std::vector<InodeId> inos) {
  const size_t n = inos.size();
  auto r = meta_call<meta::ReleaseMany>(meta::ReleaseManyReq{session(), inos});
  // Sent (or lost: either way the handles are closed): the counts a reclaim sends fall only now.
  for (InodeId ino : inos) count_release(ino);
  if (!r.has_value()) {
    PENSTOCK_LOG(Warn) << "releasing " << n << " closed file(s) at the meta server failed: " << r.error().to_string()
                       << " (their open records stay until the session ends, which only delays freeing the "
                          "space of files unlinked meanwhile)";
  }
}

Result<proto::InodeAttr> Client::truncate(InodeId ino, uint64_t size, const proto::Caller& caller) {
  PENSTOCK_ASSIGN_OR_RETURN(auto current, meta_call<meta::GetAttr>(meta::InodeReq{ino}));
  const proto::InodeAttr& attr = current.attr;
  if ((attr.mode & S_IFMT) == S_IFDIR) {
    return Status(Code::kIsDir, "truncate inode " + ino.to_string() + ": it is a directory");
  }
  if (!is_regular(attr)) {
    return Status(Code::kInvalid, "truncate inode " + ino.to_string() + ": not a regular file");
  }
  // Our buffered writes land before the cut (in order, as the application issued them); an error
  // of theirs stays remembered for the next flush/fsync.
  (void)wb_drain(ino);
  // Data first: once the meta size says `size`, no byte past it may come back from a data server.
  std::vector<DataTask> tasks;
  auto routes_now = routes();
  for (ChainId chain : distinct_chains(attr.layout)) {
    Result<std::vector<Route>> all = routes_now ? routes_now->all_targets(chain)
                                                : Result<std::vector<Route>>(Status(Code::kNotFound, "no map"));
    if (!all.has_value()) {
      PENSTOCK_RETURN_IF_ERROR(refresh_map());
      routes_now = routes();
      all = routes_now->all_targets(chain);
      if (!all.has_value()) return all.error().with_context("truncate inode " + ino.to_string());
    }
    for (const Route& r : *all) {
      DataTask t;
      t.chain = chain;
      t.target = r.target;
      t.what = "truncate inode " + ino.to_string() + " to " + std::to_string(size) + " (chain " +
               chain.to_string() + ")";
      tasks.push_back(std::move(t));
    }
  }
  const uint32_t chunk_size = attr.layout.chunk_size;
  PENSTOCK_RETURN_IF_ERROR(fan_out(tasks, [&](size_t, const Route& route, rpc::RpcClient& rpc, bool blocking,
                                               std::function<void(Status)> done) {
    rpc.call_either<data::Truncate>(data::TruncateReq{route.target, ino, size, chunk_size}, {}, blocking,
                                    [done = std::move(done)](Result<proto::Empty> r) { done(r.status()); });
  }));
  cache_->invalidate(ino);
  meta::SetAttrReq req;
  req.ino = ino;
  req.valid = meta::kSetSize;
  req.size = size;
  req.caller = caller;
  const DirAttrCache::Ticket t = dir_attrs_.ticket();
  auto r = meta_call<meta::SetAttr>(req);
  if (!r.has_value()) return r.error().with_context("set size of inode " + ino.to_string());
  {
    // Our written_end is void now: the meta server holds the exact size.
    std::lock_guard<std::mutex> lock(files_mu_);
    auto it = files_.find(ino);
    if (it != files_.end()) {
      it->second.written_end = 0;
      ++it->second.seq;
    }
  }
  adopt_mtime(ino, r->attr.mtime_ns);  // the cut's time, later than our writes'
  truncates_.fetch_add(1);
  cache_->invalidate(ino);
  return merged(t, std::move(r));
}

}  // namespace penstock::client
