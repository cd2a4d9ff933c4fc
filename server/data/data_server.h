// DataServer: the penstock-data process minus main(): opens the targets, serves the data service
// (common/proto/data_service.h) on an RpcServer, registers the node with penstock-meta and keeps
// heartbeating it with each target's capacity and free space.
//
// Registration runs on a background thread: start() returns once the RPC listener is up; until
// the meta server has answered RegisterNode every chunk request is refused ("target T is not
// served here"), because requests name TargetIds and only the meta server assigns them. If the
// meta server is unreachable the thread retries with backoff (logging "waiting for penstock-meta
// at X" every few seconds); if a heartbeat says the node is unknown (kNotFound, e.g. after the
// meta database was wiped) it stops serving and registers again.
// Thread-safety: start()/stop() from one thread; the accessors from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/net/transport.h"
#include "common/proto/meta_service.h"
#include "common/rpc/client.h"
#include "common/rpc/server.h"
#include "server/data/chunk_service.h"
#include "server/data/chunk_store.h"

namespace penstock::data {

struct DataServerOptions {
  net::Endpoint listen{"127.0.0.1", 7700};  // also the address registered for clients
  net::Endpoint meta{"127.0.0.1", 7600};
  std::vector<std::string> targets;         // REQUIRES: at least one; the first keeps node.uuid
  std::chrono::milliseconds heartbeat{2000};
  int workers = 8;     // RPC handler threads (each does blocking chunk I/O on its own io_uring)
  int io_threads = 2;  // socket threads of the RPC server
  std::chrono::milliseconds meta_timeout{5000};  // per RegisterNode / NodeHeartbeat call
  // RDMA listener beside TCP, same host and port number: kAuto when this host has an RDMA device.
  rpc::RdmaMode rdma = rpc::RdmaMode::kAuto;
  // Open-file cache size and O_DIRECT, for every target; large writes direct as in the daemon.
  ChunkStoreOptions store{.direct_write_min = kDefaultDirectWriteMin,
                          .write_piece_while_reading = kDefaultWritePieceWhileReading};
};

class DataServer {
 public:
  explicit DataServer(DataServerOptions options);
  ~DataServer();  // stops
  DataServer(const DataServer&) = delete;
  DataServer& operator=(const DataServer&) = delete;

  // Opens every target (kInvalid / kPermission / kIo / kCorrupt naming the directory), reads or
  // creates node.uuid, starts the RPC listener (kUnavailable when it cannot bind) and the meta
  // registration thread. On error nothing keeps running.
  Status start();
  // Stops heartbeats and the listener, waiting for running handlers. Idempotent.
  void stop();

  // The bound port (useful with listen port 0). REQUIRES: start() succeeded.
  uint16_t port() const;
  const std::string& node_uuid() const { return node_uuid_; }
  // True once RegisterNode succeeded (and not since invalidated by an unknown-node heartbeat).
  bool registered() const { return registered_.load(); }
  // Waits up to `timeout` for registered(); true if it happened (tests, tools).
  bool wait_registered(std::chrono::milliseconds timeout);
  ChunkService& service() { return service_; }

 private:
  void meta_loop();
  Status register_node();
  Status send_heartbeat();
  std::vector<proto::meta::TargetReport> reports() const;
  // Waits up to `d` unless stopping; false when stopping.
  bool wait_for(std::chrono::milliseconds d);

  DataServerOptions options_;
  std::string address_;  // host:port registered with the meta server
  std::string node_uuid_;
  std::vector<std::shared_ptr<ChunkStore>> stores_;  // in options_.targets order
  ChunkService service_;
  std::unique_ptr<rpc::RpcServer> server_;
  std::unique_ptr<net::IoRuntime> runtime_;
  std::unique_ptr<rpc::RpcClient> meta_;
  NodeId node_;  // written only by the meta thread
  std::atomic<bool> registered_{false};

  std::mutex mu_;  // guards stopping_; leaf lock
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread meta_thread_;
};

}  // namespace penstock::data
