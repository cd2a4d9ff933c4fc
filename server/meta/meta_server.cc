#include "server/meta/meta_server.h"

#include "common/base/log.h"
#include "common/proto/meta_service.h"

namespace penstock::meta {

namespace {

// Adapts a MetaService method returning Status into a handler returning Result<Empty>.
Result<proto::Empty> empty_or(Status st) {
  if (!st.is_ok()) return st;
  return proto::Empty{};
}

rpc::ServerOptions with_waiting_pool(rpc::ServerOptions options) {
  if (options.waiting_threads == 0) options.waiting_threads = kLeaseWaitThreads;
  return options;
}

}  // namespace

void register_meta_handlers(rpc::RpcServer& server, MetaService& svc) {
  using rpc::RequestContext;
  // Reads, opens, releases and a close's size report answer from memory or the memtable without
  // waiting for a WAL sync: they run on the connection's I/O thread (two thread hops fewer each). Everything that waits for
  // a group commit runs on the worker pool. (An open of an already unlinked file syncs inline; it is
  // rare.)
  constexpr rpc::Dispatch kInline = rpc::Dispatch::kInline;
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
  server.handle<pm::SetAttr>([&svc](const pm::SetAttrReq& r, RequestContext&) { return svc.set_attr(r); });
  server.handle<pm::Create>([&svc](const pm::CreateReq& r, RequestContext&) { return svc.create(r); });
  server.handle<pm::Mknod>([&svc](const pm::MknodReq& r, RequestContext&) { return svc.mknod(r); });
  server.handle<pm::Mkdir>([&svc](const pm::MkdirReq& r, RequestContext&) { return svc.mkdir(r); });
  server.handle<pm::Unlink>([&svc](const pm::NameReq& r, RequestContext&) { return empty_or(svc.unlink(r)); });
  // rmdir and rename may sleep until other mounts' entry leases on their names ended (up to the
  // lease term plus grace): they run on the waiting pool, so that they never hold the workers.
  server.handle<pm::Rmdir>([&svc](const pm::NameReq& r, RequestContext&) { return empty_or(svc.rmdir(r)); },
                           rpc::Dispatch::kWaiting);
  server.handle<pm::Rename>([&svc](const pm::RenameReq& r, RequestContext&) { return empty_or(svc.rename(r)); },
                            rpc::Dispatch::kWaiting);
  server.handle<pm::Link>([&svc](const pm::LinkReq& r, RequestContext&) { return svc.link(r); });
  server.handle<pm::Symlink>([&svc](const pm::SymlinkReq& r, RequestContext&) { return svc.symlink(r); });
  server.handle<pm::Readlink>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.readlink(r); },
                 kInline);
  server.handle<pm::ReadDir>([&svc](const pm::ReadDirReq& r, RequestContext&) { return svc.read_dir(r); },
                 kInline);
  server.handle<pm::StatFs>([&svc](const proto::Empty&, RequestContext&) { return svc.stat_fs(); },
                 kInline);
  server.handle<pm::GetXattr>([&svc](const pm::GetXattrReq& r, RequestContext&) { return svc.get_xattr(r); },
                 kInline);
  server.handle<pm::SetXattr>(
      [&svc](const pm::SetXattrReq& r, RequestContext&) { return empty_or(svc.set_xattr(r)); });
  server.handle<pm::ListXattr>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.list_xattr(r); },
                 kInline);
  server.handle<pm::RemoveXattr>(
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
  server.handle<pm::ReportSize>([&svc](const pm::ReportSizeReq& r, RequestContext&) { return svc.report_size(r); });
  server.handle<pm::ReportSizeAtClose>(
      [&svc](const pm::ReportSizeReq& r, RequestContext&) { return svc.report_size_at_close(r); }, kInline);
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
  server.handle<pm::DirLease>([&svc](const pm::DirLeaseReq& r, RequestContext&) { return svc.dir_lease(r); });
  server.handle<pm::CreateBatch>(
      [&svc](const pm::CreateBatchReq& r, RequestContext&) { return svc.create_batch(r); });
  server.handle<pm::GetLayout>([&svc](const pm::InodeReq& r, RequestContext&) { return svc.get_layout(r); },
                 kInline);
  server.handle<pm::SetLayout>(
      [&svc](const pm::SetLayoutReq& r, RequestContext&) { return empty_or(svc.set_layout(r)); });
  server.handle<pm::GetClusterMap>([&svc](const proto::Empty&, RequestContext&) { return svc.get_cluster_map(); },
                 kInline);
  server.handle<pm::RegisterNode>(
      [&svc](const pm::RegisterNodeReq& r, RequestContext&) { return svc.register_node(r); });
  server.handle<pm::NodeHeartbeat>(
      [&svc](const pm::NodeHeartbeatReq& r, RequestContext&) { return svc.node_heartbeat(r); });
}

MetaServer::MetaServer(MetaService& service, rpc::ServerOptions options)
    : server_(std::make_unique<rpc::RpcServer>(with_waiting_pool(std::move(options)))) {
  register_meta_handlers(*server_, service);
}

Status MetaServer::start() { return server_->start(); }
uint16_t MetaServer::port() const { return server_->port(); }
void MetaServer::stop() { server_->stop(); }

}  // namespace penstock::meta
