// MetaServer: binds every method of common/proto/meta_service.h to a MetaService on an
// rpc::RpcServer. Nothing but decoding-free glue lives here (the RPC layer decodes and encodes).
// Ownership: borrows the MetaService (must outlive the server); owns the RpcServer.
// Thread-safety: construct, then start(); start/stop/port from any thread after that.
#pragma once

#include <memory>

#include "common/rpc/server.h"
#include "server/meta/namespace.h"

namespace penstock::meta {

// Which exactly-once envelopes (common/proto/meta_service.h) a server answers. Anything but kAll
// serves as an older penstock-meta did, for tests of newer clients against it: kNoInline as round
// 22's (Replay and ReplayWaiting, no ReplayInline), kNone as round 21's (no Replay at all). Those
// calls then get kNotSupported "unknown method", as from a server built before them.
enum class Envelopes { kAll, kNoInline, kNone };

// Registers one handler per meta RPC on `server`, all calling into `service`.
// REQUIRES: server not started yet; service outlives server.
void register_meta_handlers(rpc::RpcServer& server, MetaService& service, Envelopes envelopes = Envelopes::kAll);

// Threads for rmdir and rename, which may wait out other mounts' entry leases (up to the lease
// term plus grace each): a pool apart from the workers, so that a burst of such changes delays
// only other renames and rmdirs, never creates, writes or opens. Sleeping threads cost no CPU.
// Used when the server options name no waiting_threads of their own.
constexpr int kLeaseWaitThreads = 16;

class MetaServer {
 public:
  MetaServer(MetaService& service, rpc::ServerOptions options, Envelopes envelopes = Envelopes::kAll);
  // Binds and serves. kUnavailable naming the address when it cannot bind.
  Status start();
  uint16_t port() const;
  void stop();

 private:
  std::unique_ptr<rpc::RpcServer> server_;
};

}  // namespace penstock::meta
