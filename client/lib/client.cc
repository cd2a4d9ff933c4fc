#include "client/lib/client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>

#include "client/lib/layout_text.h"
#include "common/base/log.h"

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

Client::Client(ClientOptions options, net::Endpoint meta_endpoint)
    : options_(std::move(options)), meta_endpoint_(std::move(meta_endpoint)) {}

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
      if (r.error().code() == Code::kUnavailable || r.error().code() == Code::kTimeout) {
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
    if (!options_.register_session &&
        (map.error().code() == Code::kUnavailable || map.error().code() == Code::kTimeout)) {
      return unreachable(map.error());
    }
    return map.error().with_context("load the cluster map from penstock-meta " + options_.meta_address);
  }
  {
    std::lock_guard<std::mutex> lock(routes_mu_);
    routes_ = std::make_shared<const ClusterRoutes>(std::move(map->map));
  }
  if (options_.register_session) heartbeat_ = std::thread([this] { heartbeat_loop(); });
  return Status::ok();
}

Client::~Client() { shutdown(); }

void Client::shutdown() {
  std::call_once(shutdown_once_, [this] {
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
      continue;
    }
    if (r.error().code() == Code::kNotFound || r.error().code() == Code::kStale) {
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

template <class M>
Result<typename M::Response> Client::meta_call(const typename M::Request& req) {
  return meta_->call<M>(req);
}

void Client::merge_local_size(proto::InodeAttr* attr) {
  if (!is_regular(*attr)) return;
  std::lock_guard<std::mutex> lock(files_mu_);
  auto it = files_.find(attr->ino);
  if (it == files_.end()) return;
  if (it->second.written_end > attr->size) attr->size = it->second.written_end;
  if (it->second.mtime_ns > attr->mtime_ns) attr->mtime_ns = it->second.mtime_ns;
}

Result<proto::InodeAttr> Client::merged(Result<meta::AttrResp> r) {
  if (!r.has_value()) return std::move(r).error();
  proto::InodeAttr attr = std::move(r->attr);
  merge_local_size(&attr);
  return attr;
}

// ---- namespace ----

Result<proto::InodeAttr> Client::lookup(InodeId parent, const std::string& name) {
  return merged(meta_call<meta::Lookup>(meta::LookupReq{parent, name}));
}

Result<proto::InodeAttr> Client::getattr(InodeId ino) {
  return merged(meta_call<meta::GetAttr>(meta::InodeReq{ino}));
}

Result<proto::InodeAttr> Client::setattr(const meta::SetAttrReq& req) {
  PENSTOCK_CHECK((req.valid & meta::kSetSize) == 0);
  return merged(meta_call<meta::SetAttr>(req));
}

Result<proto::InodeAttr> Client::create(InodeId parent, const std::string& name, uint32_t mode,
                                        const proto::Caller& caller) {
  return merged(meta_call<meta::Create>(meta::CreateReq{parent, name, mode, caller, session()}));
}

Result<proto::InodeAttr> Client::mknod(InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                       const proto::Caller& caller) {
  return merged(meta_call<meta::Mknod>(meta::MknodReq{parent, name, mode, rdev, caller}));
}

Result<proto::InodeAttr> Client::mkdir(InodeId parent, const std::string& name, uint32_t mode,
                                       const proto::Caller& caller) {
  return merged(meta_call<meta::Mkdir>(meta::MkdirReq{parent, name, mode, caller}));
}

Status Client::unlink(InodeId parent, const std::string& name) {
  return meta_call<meta::Unlink>(meta::NameReq{parent, name}).status();
}

Status Client::rmdir(InodeId parent, const std::string& name) {
  return meta_call<meta::Rmdir>(meta::NameReq{parent, name}).status();
}

Status Client::rename(InodeId parent, const std::string& name, InodeId new_parent, const std::string& new_name,
                      uint32_t flags) {
  return meta_call<meta::Rename>(meta::RenameReq{parent, name, new_parent, new_name, flags}).status();
}

Result<proto::InodeAttr> Client::link(InodeId ino, InodeId new_parent, const std::string& new_name) {
  return merged(meta_call<meta::Link>(meta::LinkReq{ino, new_parent, new_name}));
}

Result<proto::InodeAttr> Client::symlink(InodeId parent, const std::string& name, const std::string& target,
                                         const proto::Caller& caller) {
  return merged(meta_call<meta::Symlink>(meta::SymlinkReq{parent, name, target, caller}));
}

Result<std::string> Client::readlink(InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::Readlink>(meta::InodeReq{ino}));
  return std::move(resp.target);
}

Result<meta::ReadDirResp> Client::readdir(InodeId ino, const std::string& after, uint32_t max_entries,
                                          bool plus) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::ReadDir>(meta::ReadDirReq{ino, after, max_entries, plus}));
  for (auto& e : resp.entries) {
    if (e.attr) merge_local_size(&*e.attr);
  }
  return resp;
}

Result<meta::StatFsResp> Client::statfs() { return meta_call<meta::StatFs>(proto::Empty{}); }

Result<std::string> Client::getxattr(InodeId ino, const std::string& name) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::GetXattr>(meta::GetXattrReq{ino, name}));
  return std::move(resp.value);
}

Status Client::setxattr(InodeId ino, const std::string& name, const std::string& value, uint32_t flags) {
  return meta_call<meta::SetXattr>(meta::SetXattrReq{ino, name, value, flags}).status();
}

Result<std::vector<std::string>> Client::listxattr(InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::ListXattr>(meta::InodeReq{ino}));
  return std::move(resp.names);
}

Status Client::removexattr(InodeId ino, const std::string& name) {
  return meta_call<meta::RemoveXattr>(meta::GetXattrReq{ino, name}).status();
}

Result<proto::InodeAttr> Client::open(InodeId ino, uint32_t flags) {
  return merged(meta_call<meta::Open>(meta::OpenReq{ino, session(), flags}));
}

Result<proto::Layout> Client::get_layout(InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto resp, meta_call<meta::GetLayout>(meta::InodeReq{ino}));
  return std::move(resp.layout);
}

Status Client::set_layout(InodeId dir, uint32_t chunk_size, uint32_t stripe_count) {
  return meta_call<meta::SetLayout>(meta::SetLayoutReq{dir, chunk_size, stripe_count}).status();
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
    // Issue all at once, then wait for every completion (the buffers stay alive until then).
    auto completion = std::make_shared<Completion>(pending.size());
    for (size_t k = 0; k < pending.size(); ++k) {
      issue(pending[k], resolved[k], *clients[k], [completion, k](Status st) { completion->set(k, std::move(st)); });
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

Result<size_t> Client::read(InodeId ino, const proto::Layout& layout, uint64_t size_hint, uint64_t offset,
                            std::span<uint8_t> buf) {
  if (buf.empty()) return size_t{0};
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
  auto plan_r = plan_chunk_io(layout, offset, n);
  if (!plan_r.has_value()) return plan_r.error().with_context("read inode " + ino.to_string());
  const std::vector<ChunkIo>& plan = *plan_r;
  std::vector<DataTask> tasks(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    tasks[i].chain = plan[i].chain;
    tasks[i].to_tail = true;
    tasks[i].what = "read chunk " + std::to_string(plan[i].chunk_index) + " of inode " + ino.to_string();
  }
  std::vector<uint32_t> received(plan.size(), 0);
  Status st = fan_out(tasks, [&](size_t i, const Route& route, rpc::RpcClient& rpc, std::function<void(Status)> done) {
    data::ReadReq req;
    req.key = data::ChunkKey{route.chain, route.target, ino, plan[i].chunk_index, layout.chunk_size};
    req.offset = plan[i].offset_in_chunk;
    req.length = plan[i].length;
    rpc::CallOptions opts;
    opts.bulk_in = buf.subspan(plan[i].buf_offset, plan[i].length);
    opts.bulk_received = &received[i];
    rpc.call_async<data::Read>(req, opts, [done = std::move(done)](Result<data::ReadResp> r) { done(r.status()); });
  });
  if (!st.is_ok()) return st;
  for (size_t i = 0; i < plan.size(); ++i) {
    Status fill = zero_fill_tail(buf.subspan(plan[i].buf_offset, plan[i].length), received[i]);
    if (!fill.is_ok()) return fill.with_context(tasks[i].what);
  }
  return static_cast<size_t>(n);
}

Status Client::write(InodeId ino, const proto::Layout& layout, uint64_t offset, std::span<const uint8_t> bytes) {
  if (bytes.empty()) return Status::ok();
  auto plan_r = plan_chunk_io(layout, offset, bytes.size());
  if (!plan_r.has_value()) return plan_r.error().with_context("write inode " + ino.to_string());
  const std::vector<ChunkIo>& plan = *plan_r;
  std::vector<DataTask> tasks(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    tasks[i].chain = plan[i].chain;
    tasks[i].what = "write chunk " + std::to_string(plan[i].chunk_index) + " of inode " + ino.to_string();
  }
  {
    // A new write makes any flush that started before it stale (see flush()).
    std::lock_guard<std::mutex> lock(files_mu_);
    FileState& fs = files_[ino];
    ++fs.seq;
  }
  Status st = fan_out(tasks, [&](size_t i, const Route& route, rpc::RpcClient& rpc, std::function<void(Status)> done) {
    data::WriteReq req;
    req.key = data::ChunkKey{route.chain, route.target, ino, plan[i].chunk_index, layout.chunk_size};
    req.offset = plan[i].offset_in_chunk;
    rpc::CallOptions opts;
    opts.bulk_out = bytes.subspan(plan[i].buf_offset, plan[i].length);
    rpc.call_async<data::Write>(req, opts, [done = std::move(done)](Result<data::WriteResp> r) { done(r.status()); });
  });
  if (!st.is_ok()) return st;
  std::lock_guard<std::mutex> lock(files_mu_);
  FileState& fs = files_[ino];
  fs.written_end = std::max(fs.written_end, offset + bytes.size());
  fs.mtime_ns = std::max(fs.mtime_ns, now_ns());
  ++fs.seq;
  return Status::ok();
}

Status Client::flush(InodeId ino) {
  uint64_t written_end = 0;
  int64_t mtime = 0;
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(files_mu_);
    auto it = files_.find(ino);
    if (it == files_.end()) return Status::ok();
    written_end = it->second.written_end;
    mtime = it->second.mtime_ns;
    seq = it->second.seq;
  }
  // Writes are already on the data servers (visible to every reader); what close-to-open still
  // needs is the size at the meta server.
  if (mtime != 0) {
    auto r = meta_call<meta::ReportSize>(meta::ReportSizeReq{ino, written_end, mtime});
    if (!r.has_value()) return r.error().with_context("report size of inode " + ino.to_string());
  }
  std::lock_guard<std::mutex> lock(files_mu_);
  auto it = files_.find(ino);
  // The meta server now knows the size; forget ours unless another write came in meanwhile.
  if (it != files_.end() && it->second.seq == seq) files_.erase(it);
  return Status::ok();
}

Status Client::fsync(InodeId ino, const proto::Layout& layout) {
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
  PENSTOCK_RETURN_IF_ERROR(fan_out(tasks, [&](size_t, const Route& route, rpc::RpcClient& rpc,
                                               std::function<void(Status)> done) {
    rpc.call_async<data::Sync>(data::SyncReq{route.target, ino}, {},
                               [done = std::move(done)](Result<proto::Empty> r) { done(r.status()); });
  }));
  return flush(ino);
}

Status Client::release(InodeId ino) {
  Status flushed = flush(ino);
  auto r = meta_call<meta::Release>(meta::ReleaseReq{ino, session()});
  if (!flushed.is_ok()) return flushed;
  if (!r.has_value()) return r.error().with_context("release inode " + ino.to_string());
  return Status::ok();
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
  PENSTOCK_RETURN_IF_ERROR(fan_out(tasks, [&](size_t, const Route& route, rpc::RpcClient& rpc,
                                               std::function<void(Status)> done) {
    rpc.call_async<data::Truncate>(data::TruncateReq{route.target, ino, size, chunk_size}, {},
                                   [done = std::move(done)](Result<proto::Empty> r) { done(r.status()); });
  }));
  meta::SetAttrReq req;
  req.ino = ino;
  req.valid = meta::kSetSize;
  req.size = size;
  req.caller = caller;
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
  return merged(std::move(r));
}

}  // namespace penstock::client
