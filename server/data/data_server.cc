#include "server/data/data_server.h"

#include <algorithm>
#include <filesystem>
#include <unordered_map>

#include "common/base/log.h"
#include "common/proto/data_service.h"
#include "server/daemon/daemon.h"
#include "server/data/uring_io.h"

namespace penstock::data {
namespace {

namespace pd = proto::data;
namespace pm = proto::meta;

Result<std::string> load_node_uuid(const std::string& target_dir) {
  std::string file = target_dir + "/node.uuid";
  auto existing = daemon::read_small_file(file);
  if (existing.has_value()) {
    if (!daemon::is_uuid(*existing)) {
      return Status(Code::kCorrupt, file + " does not hold a node uuid (32 hex digits); remove it only if this "
                                           "node was never registered, else restore it");
    }
    return *existing;
  }
  std::string uuid = daemon::random_uuid();
  PENSTOCK_RETURN_IF_ERROR(daemon::write_small_file_durably(file, uuid));
  PENSTOCK_LOG(Info) << "new node uuid " << uuid << " stored in " << file;
  return uuid;
}

Result<proto::Empty> to_empty(Status st) {
  if (!st.is_ok()) return st;
  return proto::Empty{};
}

}  // namespace

DataServer::DataServer(DataServerOptions options) : options_(std::move(options)) {}

DataServer::~DataServer() { stop(); }

Status DataServer::start() {
  if (options_.targets.empty()) return Status(Code::kInvalid, "no target directory given; pass --target DIR");
  for (const std::string& dir : options_.targets) {
    auto t = Target::open(dir);
    if (!t.has_value()) return t.error().with_context("opening target " + dir);
    stores_.push_back(std::make_shared<ChunkStore>(std::shared_ptr<Target>(std::move(*t)), options_.store));
  }
  PENSTOCK_ASSIGN_OR_RETURN(node_uuid_, load_node_uuid(stores_.front()->target().path()));
  if (!io_uring_active()) {
    PENSTOCK_LOG(Warn) << "chunk I/O runs on preadv/pwritev: io_uring is not available";
  }

  rpc::ServerOptions so;
  so.listen = options_.listen;
  so.worker_threads = std::max(1, options_.workers);
  so.io_threads = std::max(1, options_.io_threads);
  so.rdma = options_.rdma;
  server_ = std::make_unique<rpc::RpcServer>(so);
  server_->handle<pd::Write>([this](const pd::WriteReq& req, rpc::RequestContext& ctx) {
    return service_.write(req, ctx.bulk_in());
  });
  server_->handle<pd::Read>([this](const pd::ReadReq& req, rpc::RequestContext& ctx) -> Result<pd::ReadResp> {
    // Over TCP a verify_at_client read is spliced from the page cache (file_bulk.h), not copied.
    std::optional<ChunkStore::UnreadRange> unread;
    auto resp = service_.read(req, ctx.bulk_in(), &ctx.bulk_out(), ctx.can_send_file() ? &unread : nullptr);
    if (resp.has_value() && unread.has_value() && unread->length > 0) {
      ctx.send_file(rpc::FileBulk{std::move(unread->keep), unread->fd, unread->file_offset, unread->length});
    }
    return resp;
  });
  server_->handle<pd::Truncate>([this](const pd::TruncateReq& req, rpc::RequestContext& ctx) {
    return to_empty(service_.truncate(req, ctx.bulk_in()));
  });
  server_->handle<pd::Remove>([this](const pd::RemoveReq& req, rpc::RequestContext& ctx) {
    return to_empty(service_.remove(req, ctx.bulk_in()));
  });
  server_->handle<pd::Sync>([this](const pd::SyncReq& req, rpc::RequestContext& ctx) {
    return to_empty(service_.sync(req, ctx.bulk_in()));
  });
  server_->handle<pd::DropCaches>([this](const pd::DropCachesReq& req, rpc::RequestContext& ctx) {
    auto r = service_.drop_caches(req, ctx.bulk_in());
    if (r.has_value()) {
      PENSTOCK_LOG(Info) << "DropCaches: " << r->targets << " target(s), page cache of " << r->files
                         << " chunk file(s) dropped, " << r->fds_closed << " cached descriptor(s) closed";
    }
    return r;
  });
  // Counters only: on the I/O thread, as soon as it is read.
  server_->handle<pd::Stats>(
      [this](const proto::Empty&, rpc::RequestContext& ctx) {
        auto r = service_.stats(ctx.bulk_in());
        if (r.has_value()) {
          r->uptime_ms = server_->uptime_ms();
          r->methods = server_->method_stats();
          r->instance = server_->instance();
        }
        return r;
      },
      rpc::Dispatch::kInline);
  // Directory listings: on the workers, never on an I/O thread.
  server_->handle<pd::ListInodes>([this](const pd::ListInodesReq& req, rpc::RequestContext& ctx) {
    return service_.list_inodes(req, ctx.bulk_in());
  });
  Status st = server_->start();
  if (!st.is_ok()) {
    server_.reset();
    return st;
  }
  net::Endpoint advertised = options_.listen;
  advertised.port = server_->port();
  address_ = advertised.to_string();
  if (advertised.host == "0.0.0.0" || advertised.host == "::") {
    PENSTOCK_LOG(Warn) << "registering " << address_ << " with penstock-meta, but clients cannot connect to a "
                       << "wildcard address; pass --listen with this host's address";
  }

  runtime_ = std::make_unique<net::IoRuntime>(1);
  meta_ = std::make_unique<rpc::RpcClient>(net::make_tcp_channel(*runtime_, options_.meta, net::TcpOptions{}),
                                           options_.meta_timeout);
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = false;
  }
  meta_thread_ = std::thread([this] { meta_loop(); });
  PENSTOCK_LOG(Info) << "penstock-data node " << node_uuid_ << " serving " << stores_.size() << " target(s) on "
                     << address_ << " (" << options_.store.describe_io() << ")";
  return Status::ok();
}

void DataServer::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (meta_thread_.joinable()) meta_thread_.join();
  if (server_) server_->stop();
  meta_.reset();
  runtime_.reset();
  registered_ = false;
}

uint16_t DataServer::port() const { return server_->port(); }

bool DataServer::wait_registered(std::chrono::milliseconds timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> g(mu_);
  while (!registered_.load()) {
    if (stopping_ || cv_.wait_until(g, deadline) == std::cv_status::timeout) return registered_.load();
  }
  return true;
}

bool DataServer::wait_for(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> g(mu_);
  return !cv_.wait_for(g, d, [this] { return stopping_; });
}

std::vector<pm::TargetReport> DataServer::reports() const {
  std::vector<pm::TargetReport> out;
  for (const auto& store : stores_) {
    const Target& t = store->target();
    pm::TargetReport r;
    r.uuid = t.uuid();
    r.fs_id = t.fs_id();
    std::error_code ec;
    auto abs = std::filesystem::absolute(t.path(), ec);
    r.path = ec ? t.path() : abs.lexically_normal().string();
    auto space = t.space();
    if (space.has_value()) {
      r.capacity_bytes = space->capacity_bytes;
      r.free_bytes = space->free_bytes;
    } else {
      PENSTOCK_LOG(Warn) << "cannot report space of target " << t.path() << ": " << space.error().to_string();
    }
    out.push_back(std::move(r));
  }
  return out;
}

Status DataServer::register_node() {
  pm::RegisterNodeReq req;
  req.node_uuid = node_uuid_;
  req.address = address_;
  req.targets = reports();
  for (size_t i = 0; i < stores_.size(); ++i) req.targets[i].has_chunks = stores_[i]->target().has_chunks();
  PENSTOCK_ASSIGN_OR_RETURN(pm::RegisterNodeResp resp, meta_->call<pm::RegisterNode>(req));
  if (resp.targets.size() != stores_.size()) {
    return Status(Code::kProtocol, "RegisterNode answered " + std::to_string(resp.targets.size()) +
                                       " target ids for " + std::to_string(stores_.size()) + " targets");
  }
  if (resp.fs_id.empty()) return Status(Code::kProtocol, "RegisterNode answered no file-system id");
  std::unordered_map<TargetId, std::shared_ptr<ChunkStore>> served;
  std::string ids;
  for (size_t i = 0; i < stores_.size(); ++i) {
    if (!resp.targets[i].valid() || served.count(resp.targets[i]) != 0) {
      return Status(Code::kProtocol, "RegisterNode answered an invalid or repeated target id");
    }
    // Stamped before serving: from now on no other file system's meta can claim it. A target
    // that cannot be stamped (a full or read-only disk) is not served; the others are, and the
    // next registration (after a restart of either side) tries it again.
    if (Status claimed = stores_[i]->target().claim(resp.fs_id); !claimed.is_ok()) {
      PENSTOCK_LOG(Error) << "not serving target " << stores_[i]->target().path() << ": " << claimed.to_string();
      continue;
    }
    served[resp.targets[i]] = stores_[i];
    ids += (ids.empty() ? "" : ", ") + resp.targets[i].to_string() + "=" + stores_[i]->target().path();
  }
  service_.set_served(std::move(served));
  node_ = resp.node;
  PENSTOCK_LOG(Info) << "registered with penstock-meta at " << options_.meta.to_string() << " as node "
                     << node_.to_string() << " (map version " << resp.map_version << "), targets " << ids;
  return Status::ok();
}

Status DataServer::send_heartbeat() {
  pm::NodeHeartbeatReq req;
  req.node = node_;
  req.targets = reports();
  return meta_->call<pm::NodeHeartbeat>(req).status();
}

void DataServer::meta_loop() {
  using std::chrono::milliseconds;
  using Clock = std::chrono::steady_clock;
  const milliseconds kMaxBackoff{5000};
  const milliseconds kWaitLogEvery{5000};
  milliseconds backoff{100};
  Clock::time_point last_wait_log{};
  Clock::time_point last_heartbeat_log{};
  const std::string meta = options_.meta.to_string();
  for (;;) {
    if (!registered_.load()) {
      Status st = register_node();
      if (st.is_ok()) {
        {
          std::lock_guard<std::mutex> g(mu_);
          registered_ = true;
        }
        cv_.notify_all();
        backoff = milliseconds{100};
        continue;
      }
      if (Clock::now() - last_wait_log >= kWaitLogEvery) {
        last_wait_log = Clock::now();
        if (failed_in_transit(st.code())) {
          PENSTOCK_LOG(Info) << "waiting for penstock-meta at " << meta << " (" << st.to_string() << ")";
        } else {
          PENSTOCK_LOG(Error) << "penstock-meta at " << meta << " refused registration: " << st.to_string()
                              << "; retrying";
        }
      }
      if (!wait_for(backoff)) return;
      backoff = std::min(backoff * 2, kMaxBackoff);
      continue;
    }
    if (!wait_for(options_.heartbeat)) return;
    Status st = send_heartbeat();
    if (st.is_ok()) continue;
    if (st.code() == Code::kNotFound) {
      PENSTOCK_LOG(Warn) << "penstock-meta at " << meta << " does not know node " << node_.to_string()
                         << " (was its database reset?); registering again";
      service_.set_served({});
      registered_ = false;
      continue;
    }
    if (Clock::now() - last_heartbeat_log >= kWaitLogEvery) {
      last_heartbeat_log = Clock::now();
      PENSTOCK_LOG(Warn) << "heartbeat to penstock-meta at " << meta << " failed: " << st.to_string();
    }
  }
}

}  // namespace penstock::data
