#include "server/meta/meta_server.h"

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>

#include "common/base/log.h"
#include "common/proto/meta_service.h"

namespace penstock::meta {

namespace {

// Adapts a MetaService method returning Status into a handler returning Result<Empty>.
Result<proto::Empty> empty_or(Status st) {
  if (!st.is_ok()) return st;
  return proto::Empty{};
}

// The changes a Replay may carry (common/proto/meta_service.h, "exactly-once changes"), by method
// id, with the pool each runs on.
struct Change {
  rpc::RpcServer::RawHandler handler;
  rpc::Dispatch dispatch;
};
using Changes = std::unordered_map<uint16_t, Change>;

// The envelope each pool's changes come in.
const char* envelope_of(rpc::Dispatch pool) {
  switch (pool) {
    case rpc::Dispatch::kWaiting: return "ReplayWaiting";
    case rpc::Dispatch::kInline: return "ReplayInline";
    default: return "Replay";
  }
}

// Registers `fn` for M, and as a change a Replay may carry (pm::kReplayed), on the pool
// pm::kReplayWaits / pm::kReplayInline name.
template <proto::RpcMethod M>
void handle_change(rpc::RpcServer& server, Changes& changes, rpc::RpcServer::TypedHandler<M> fn) {
  static_assert(pm::kReplayed<M>, "not a change a Replay carries (common/proto/meta_service.h)");
  const rpc::Dispatch dispatch = pm::kReplayWaits<M>    ? rpc::Dispatch::kWaiting
                                 : pm::kReplayInline<M> ? rpc::Dispatch::kInline
                                                        : rpc::Dispatch::kWorker;
  changes[M::kId] = Change{rpc::RpcServer::raw<M>(fn), dispatch};
  server.handle<M>(std::move(fn), dispatch);
}

// The handler of Replay (`pool` kWorker), ReplayWaiting (kWaiting) or ReplayInline (kInline): runs
// the carried change through MetaService::replay(); on an I/O thread without waiting for a repeat.
// The carried change also counts under its own name in `server`'s method stats (besides the
// envelope), when it runs.
rpc::RpcServer::TypedHandler<pm::Replay> replay_handler(rpc::RpcServer& server, MetaService& svc,
                                                         std::shared_ptr<const Changes> changes, rpc::Dispatch pool) {
  return [&server, &svc, changes = std::move(changes), pool](const pm::ReplayReq& r,
                                                             rpc::RequestContext& ctx) -> Result<pm::ReplayResp> {
    auto it = changes->find(r.method);
    if (it == changes->end()) {
      // kInvalid, not kNotSupported: a mount takes that as a server without Replay.
      return Status(Code::kInvalid, "method " + std::to_string(r.method) + " is not a change a Replay may carry");
    }
    if (it->second.dispatch != pool) {
      return Status(Code::kInvalid, "method " + std::to_string(r.method) + " comes in " +
                                        envelope_of(it->second.dispatch) + ", not " + envelope_of(pool));
    }
    const rpc::RpcServer::RawHandler& handler = it->second.handler;
    const bool may_wait = pool != rpc::Dispatch::kInline;
    // Counted where the change runs: a repeat answered from its stored reply runs nothing.
    auto run = [&]() -> Result<std::string> {
      const auto start = std::chrono::steady_clock::now();
      Result<std::string> out = handler(proto::bytes_of(r.message), ctx);
      server.count_call(proto::ServiceId::kMeta, r.method, out.has_value(), std::chrono::steady_clock::now() - start);
      return out;
    };
    PENSTOCK_ASSIGN_OR_RETURN(std::string out, svc.replay(r, run, may_wait));
    return pm::ReplayResp{std::move(out)};
  };
}

rpc::ServerOptions with_waiting_pool(rpc::ServerOptions options) {
  if (options.waiting_threads == 0) options.waiting_threads = kLeaseWaitThreads;
  return options;
}

}  // namespace

void register_meta_handlers(rpc::RpcServer& server, MetaService& svc, Envelopes envelopes) {
  using rpc::RequestContext;
  // Reads, opens, releases and a close's size report answer from memory or the memtable without
  // waiting for a WAL sync: they run on the connection's I/O thread (two thread hops fewer each). Everything that waits for
  // a group commit runs on the worker pool. (An open of an already unlinked file syncs inline; it is
  // rare.)
  constexpr rpc::Dispatch kInline = rpc::Dispatch::kInline;
  auto changes = std::make_shared<Changes>();
  server.handle<pm::RegisterSession>(
      [&svc](const pm::RegisterSessionReq& r, RequestContext&) { return svc.register_session(r); });
  server.handle<pm::Heartbeat>([&svc](const pm::SessionReq& r, RequestContext&) { return svc.heartbeat(r); },
                 kInline);
  server.handle<pm::CloseSession>(
      [&svc](const pm::SessionReq& r, RequestContext&) { return empty_or(svc.close_session(r)); });
  server.handle<pm::Lookup>([&svc](const pm::LookupReq& r, RequestContext&) { return svc.lookup(r); },
                 kInline);
  server.handle<pm::GetAttr>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.get_attr(r); },
                 kInline);
  handle_change<pm::SetAttr>(server, *changes, [&svc](const pm::SetAttrReq& r, RequestContext&) { return svc.set_attr(r); });
  handle_change<pm::Create>(server, *changes, [&svc](const pm::CreateReq& r, RequestContext&) { return svc.create(r); });
  handle_change<pm::Mknod>(server, *changes, [&svc](const pm::MknodReq& r, RequestContext&) { return svc.mknod(r); });
  handle_change<pm::Mkdir>(server, *changes, [&svc](const pm::MkdirReq& r, RequestContext&) { return svc.mkdir(r); });
  handle_change<pm::Unlink>(server, *changes, [&svc](const pm::NameReq& r, RequestContext&) { return svc.unlink(r); });
  // rmdir and rename may sleep until other mounts' entry leases on their names ended (up to the
  // lease term plus grace): pm::kReplayWaits puts them on the waiting pool, so that they never hold the workers.
  handle_change<pm::Rmdir>(server, *changes, [&svc](const pm::NameReq& r, RequestContext&) { return svc.rmdir(r); });
  handle_change<pm::Rename>(server, *changes, [&svc](const pm::RenameReq& r, RequestContext&) { return svc.rename(r); });
  handle_change<pm::Link>(server, *changes, [&svc](const pm::LinkReq& r, RequestContext&) { return svc.link(r); });
  handle_change<pm::Symlink>(server, *changes, [&svc](const pm::SymlinkReq& r, RequestContext&) { return svc.symlink(r); });
  server.handle<pm::Readlink>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.readlink(r); },
                 kInline);
  server.handle<pm::ReadDir>([&svc](const pm::ReadDirReq& r, RequestContext&) { return svc.read_dir(r); },
                 kInline);
  server.handle<pm::StatFs>([&svc](const proto::Empty&, RequestContext&) { return svc.stat_fs(); },
                 kInline);
  server.handle<pm::GetXattr>([&svc](const pm::GetXattrReq& r, RequestContext&) { return svc.get_xattr(r); },
                 kInline);
  handle_change<pm::SetXattr>(server, *changes, 
      [&svc](const pm::SetXattrReq& r, RequestContext&) { return empty_or(svc.set_xattr(r)); });
  server.handle<pm::ListXattr>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.list_xattr(r); },
                 kInline);
  handle_change<pm::RemoveXattr>(server, *changes, 
      [&svc](const pm::GetXattrReq& r, RequestContext&) { return empty_or(svc.remove_xattr(r)); });
  server.handle<pm::LookupOpen>(
      [&svc](const pm::LookupReq& r, RequestContext&) { return svc.lookup_open(r); }, kInline);
  server.handle<pm::Open>([&svc](const pm::OpenReq& r, RequestContext&) { return svc.open_file(r); },
                 kInline);
  server.handle<pm::Release>([&svc](const pm::ReleaseReq& r, RequestContext&) { return empty_or(svc.release(r)); },
                 kInline);
  server.handle<pm::ReclaimOpens>(
      [&svc](const pm::ReclaimOpensReq& r, RequestContext&) { return empty_or(svc.reclaim_opens(r)); });
  server.handle<pm::ReleaseMany>(
      [&svc](const pm::ReleaseManyReq& r, RequestContext&) { return empty_or(svc.release_many(r)); }, kInline);
  handle_change<pm::ReportSize>(server, *changes, [&svc](const pm::ReportSizeReq& r, RequestContext&) { return svc.report_size(r); });
  // A close's report is not synced: on the I/O thread (pm::kReplayInline), also inside a Replay.
  handle_change<pm::ReportSizeAtClose>(
      server, *changes, [&svc](const pm::ReportSizeReq& r, RequestContext&) { return svc.report_size_at_close(r); });
  server.handle<pm::SyncLog>([&svc](const proto::Empty&, RequestContext&) { return empty_or(svc.sync_log()); });
  // A scrub pass lists every target's chunks: minutes on a large file system; the waiting pool
  // keeps it off the workers.
  server.handle<pm::Scrub>([&svc](const pm::ScrubReq& r, RequestContext&) { return svc.scrub(r); },
                           rpc::Dispatch::kWaiting);
  server.handle<pm::DropCaches>([&svc](const proto::Empty&, RequestContext&) -> Result<pm::DropCachesResp> {
    pm::DropCachesResp r = svc.drop_caches();
    PENSTOCK_LOG(Info) << "DropCaches: " << r.bytes << " bytes of cached records and blocks dropped";
    return r;
  });
  // Counters only: on the I/O thread.
  server.handle<pm::ServerStats>(
      [&server](const proto::Empty&, RequestContext& ctx) -> Result<pm::ServerStatsResp> {
        if (!ctx.bulk_in().empty()) return Status(Code::kInvalid, "ServerStats carries no bulk bytes");
        return pm::ServerStatsResp{server.uptime_ms(), server.method_stats(), server.instance()};
      },
      kInline);
  server.handle<pm::DirLease>([&svc](const pm::DirLeaseReq& r, RequestContext&) { return svc.dir_lease(r); });
  server.handle<pm::CreateBatch>(
      [&svc](const pm::CreateBatchReq& r, RequestContext&) { return svc.create_batch(r); });
  server.handle<pm::GetLayout>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.get_layout(r); },
                 kInline);
  handle_change<pm::SetLayout>(server, *changes, 
      [&svc](const pm::SetLayoutReq& r, RequestContext&) { return empty_or(svc.set_layout(r)); });
  server.handle<pm::GetClusterMap>([&svc](const proto::Empty&, RequestContext&) { return svc.get_cluster_map(); },
                 kInline);
  server.handle<pm::RegisterNode>(
      [&svc](const pm::RegisterNodeReq& r, RequestContext&) { return svc.register_node(r); });
  server.handle<pm::NodeHeartbeat>(
      [&svc](const pm::NodeHeartbeatReq& r, RequestContext&) { return svc.node_heartbeat(r); });
  if (envelopes == Envelopes::kNone) return;
  server.handle<pm::Replay>(replay_handler(server, svc, changes, rpc::Dispatch::kWorker));
  server.handle<pm::ReplayWaiting>(replay_handler(server, svc, changes, rpc::Dispatch::kWaiting), rpc::Dispatch::kWaiting);
  if (envelopes == Envelopes::kNoInline) return;
  server.handle<pm::ReplayInline>(replay_handler(server, svc, changes, kInline), kInline);
}

MetaServer::MetaServer(MetaService& service, rpc::ServerOptions options, Envelopes envelopes)
    : server_(std::make_unique<rpc::RpcServer>(with_waiting_pool(std::move(options)))) {
  register_meta_handlers(*server_, service, envelopes);
}

Status MetaServer::start() { return server_->start(); }
uint16_t MetaServer::port() const { return server_->port(); }
void MetaServer::stop() { server_->stop(); }

}  // namespace penstock::meta
