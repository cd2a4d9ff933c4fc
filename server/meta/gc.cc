#include "server/meta/gc.h"

#include <algorithm>

#include "common/base/log.h"
#include "common/net/transport.h"
#include "common/proto/data_service.h"
#include "common/rpc/client.h"

namespace penstock::meta {

// ---- RpcDataNodes ----

namespace {
constexpr std::chrono::milliseconds kListTimeout{60'000};
}  // namespace

RpcDataNodes::RpcDataNodes(net::IoRuntime& runtime, std::chrono::milliseconds timeout)
    : runtime_(runtime), timeout_(timeout) {}

RpcDataNodes::~RpcDataNodes() = default;

Result<std::shared_ptr<rpc::RpcClient>> RpcDataNodes::client_for(const std::string& address) {
  std::lock_guard lock(mu_);
  auto it = clients_.find(address);
  if (it != clients_.end()) return it->second;
  auto ep = net::Endpoint::parse(address);
  if (!ep.has_value()) return std::move(ep).error().with_context("data server address");
  auto client = std::make_shared<rpc::RpcClient>(net::make_tcp_channel(runtime_, *ep, net::TcpOptions{}), timeout_);
  clients_[address] = client;
  return client;
}

Status RpcDataNodes::remove(const std::string& address, TargetId target, InodeId ino) {
  PENSTOCK_ASSIGN_OR_RETURN(auto client, client_for(address));
  proto::data::RemoveReq req;
  req.target = target;
  req.ino = ino;
  auto r = client->call<proto::data::Remove>(req);
  if (!r.has_value()) {
    return std::move(r).error().with_context("remove chunks of inode " + ino.to_string() + " on target " +
                                             target.to_string() + " at " + address);
  }
  return Status::ok();
}

Result<proto::data::ListInodesResp> RpcDataNodes::list_inodes(const std::string& address,
                                                              const proto::data::ListInodesReq& req) {
  PENSTOCK_ASSIGN_OR_RETURN(auto client, client_for(address));
  // A page reads a whole bucket directory, cold after a restart: more than a removal's deadline.
  rpc::CallOptions opts;
  opts.timeout = std::max(timeout_, kListTimeout);
  auto r = client->call<proto::data::ListInodes>(req, opts);
  if (!r.has_value()) {
    return std::move(r).error().with_context("list the inodes of bucket " + std::to_string(req.bucket) +
                                             " of target " + req.target.to_string() + " at " + address);
  }
  return r;
}

// ---- GarbageCollector ----

GarbageCollector::GarbageCollector(MetaService& service, ChunkRemover& remover, GcOptions options)
    : service_(service), remover_(remover), options_(options) {}

GarbageCollector::~GarbageCollector() { stop(); }

Result<size_t> GarbageCollector::run_once() {
  size_t collected = 0;
  std::set<uint64_t> seen;
  InodeId after;
  for (;;) {
    PENSTOCK_ASSIGN_OR_RETURN(auto tasks, service_.gc_pending(after, options_.batch));
    if (tasks.empty()) break;
    after = tasks.back().ino;
    for (const auto& task : tasks) {
      seen.insert(task.ino.value);
      Progress& p = progress_[task.ino.value];
      int64_t now = service_.options().now();
      if (p.next_try_ns > now) continue;
      bool all_ok = true;
      for (TargetId t : task.targets) {
        if (p.done.count(t.value) != 0) continue;
        auto address = service_.target_address(t);
        Status st = address.has_value() ? remover_.remove(*address, t, task.ino) : address.error();
        if (st.is_ok()) {
          p.done.insert(t.value);
        } else {
          all_ok = false;
          PENSTOCK_LOG(Warn) << "GC of inode " << task.ino.value << " on target " << t.value
                             << " failed, will retry: " << st.to_string();
        }
      }
      if (all_ok) {
        Status st = service_.gc_done(task.ino);
        if (!st.is_ok()) {
          PENSTOCK_LOG(Error) << "cannot dequeue collected inode " << task.ino.value << ": " << st.to_string();
          return st;
        }
        progress_.erase(task.ino.value);
        ++collected;
        PENSTOCK_LOG(Debug) << "collected the chunks of inode " << task.ino.value;
      } else {
        p.backoff_ns = p.backoff_ns == 0 ? options_.min_backoff_ns : std::min(p.backoff_ns * 2, options_.max_backoff_ns);
        p.next_try_ns = now + p.backoff_ns;
      }
    }
    if (tasks.size() < options_.batch) break;
  }
  // Forget progress of jobs no longer queued.
  for (auto it = progress_.begin(); it != progress_.end();) {
    it = seen.count(it->first) == 0 ? progress_.erase(it) : std::next(it);
  }
  return collected;
}

void GarbageCollector::start() {
  std::lock_guard lock(mu_);
  if (thread_.joinable()) return;
  stop_requested_ = false;
  service_.set_gc_wakeup([this] { wake(); });
  thread_ = std::thread([this] { loop(); });
}

void GarbageCollector::stop() {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    stop_requested_ = true;
  }
  cv_.notify_all();
  thread_.join();
  service_.set_gc_wakeup(nullptr);
}

void GarbageCollector::wake() {
  {
    std::lock_guard lock(mu_);
    woken_ = true;
  }
  cv_.notify_all();
}

void GarbageCollector::loop() {
  for (;;) {
    auto r = run_once();
    if (!r.has_value()) {
      PENSTOCK_LOG(Error) << "GC pass failed: " << r.error().to_string();
    }
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, options_.idle_poll, [this] { return stop_requested_ || woken_; });
    if (stop_requested_) return;
    woken_ = false;
  }
}

}  // namespace penstock::meta
