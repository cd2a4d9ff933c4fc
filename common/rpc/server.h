// RpcServer: accepts TCP (and, when asked, RDMA) connections and dispatches requests to typed
// handlers. Both transports carry the same frames and reach the same handlers.
//
// Each connection reads frames in a loop (many requests in flight per connection); each request
// runs on a worker pool, so a handler may block on disk or RocksDB; responses are written back as
// they complete, matched by request id, gathering header + message + bulk in one write.
// Peer bytes are hostile: a malformed header or an undecodable message gets a kProtocol response
// (when the request id is known) and the connection is closed; the server stays up. An unknown
// method gets kNotSupported and the connection stays open.
// Thread-safety: register handlers before start(); after that every method is thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/proto/codec.h"
#include "common/proto/method.h"
#include "common/proto/types.h"
#include "common/rpc/file_bulk.h"

namespace penstock::rpc {

// Per-request context handed to a handler.
class RequestContext {
 public:
  RequestContext(std::span<const uint8_t> bulk_in, std::string peer, bool can_send_file = false)
      : bulk_in_(bulk_in), peer_(std::move(peer)), can_send_file_(can_send_file) {}
  // The request's bulk bytes (valid during the handler call).
  std::span<const uint8_t> bulk_in() const { return bulk_in_; }
  // Bytes to send as the response's bulk segment; the handler fills it (no copy is made after).
  ByteBuffer& bulk_out() { return bulk_out_; }
  const std::string& peer() const { return peer_; }

  // Whether the response may carry a file range instead: TCP connections, handlers on the worker
  // pool (staging may read the disk); RDMA replies carry bytes only.
  bool can_send_file() const { return can_send_file_; }
  // Makes a range of an open file the response's bulk (file_bulk.h: spliced, not copied). Used
  // only when the handler succeeds. REQUIRES: can_send_file(), bulk_out() left empty.
  void send_file(FileBulk f) {
    PENSTOCK_CHECK(can_send_file_);
    file_ = std::move(f);
  }
  std::optional<FileBulk>& file_bulk() { return file_; }

 private:
  std::span<const uint8_t> bulk_in_;
  ByteBuffer bulk_out_;
  std::string peer_;
  bool can_send_file_ = false;
  std::optional<FileBulk> file_;
};

// Whether an RpcServer also listens for RDMA (common/net/rdma) beside TCP.
enum class RdmaMode {
  kOff,   // TCP only
  kAuto,  // RDMA too when this host has an RDMA device; a failure to listen is logged, TCP goes on
  kOn,    // RDMA required: start() fails when it cannot listen for RDMA
};

struct ServerOptions {
  net::Endpoint listen{"127.0.0.1", 0};  // port 0: pick a free port (see port())
  int io_threads = 1;
  int worker_threads = 4;
  // Threads for Dispatch::kWaiting handlers, a pool of their own; 0: they share the workers.
  int waiting_threads = 0;
  // Connections served at once; more are accepted and closed at once (a client then uses the
  // connections it has). A mount holds up to 2 shared and 8 blocking ones per server (TcpOptions).
  uint32_t max_connections = 16384;
  RdmaMode rdma = RdmaMode::kOff;
  // The RDMA listener's port on the same host; 0: the TCP port's number (rdma_cm ports are a space
  // of their own, so one address serves both transports).
  uint16_t rdma_port = 0;
};

// Where a handler runs. kWorker (the default): on the worker pool, so it may block on disk, on
// RocksDB or on a group commit. kInline: on the connection's I/O thread as soon as the request is
// read, saving two thread hops per request (worth ~2x on small metadata RPCs with 2 cores); only
// for handlers that finish in microseconds and block rarely (an in-memory or memtable read), since
// the connection reads nothing else meanwhile. kWaiting: on a pool of their own
// (ServerOptions::waiting_threads), for handlers that may sleep for a long while (penstock-meta's
// rmdir and rename waiting out entry leases), so that they never hold the workers every other
// request needs. Requests arriving over RDMA use the worker or the waiting pool too.
enum class Dispatch { kWorker, kInline, kWaiting };

class RpcServer {
 public:
  // A raw handler: the encoded request in, the encoded response (or an error) out.
  using RawHandler = std::function<Result<std::string>(std::span<const uint8_t> message, RequestContext& ctx)>;

  explicit RpcServer(ServerOptions options);
  ~RpcServer();  // stops
  RpcServer(const RpcServer&) = delete;
  RpcServer& operator=(const RpcServer&) = delete;

  template <proto::RpcMethod M>
  using TypedHandler = std::function<Result<typename M::Response>(const typename M::Request&, RequestContext&)>;

  // The most bulk bytes the response to an encoded request may carry (0 when it cannot be decoded).
  using ReplyBound = std::function<uint64_t(std::span<const uint8_t> message)>;

  template <proto::RpcMethod M>
  void handle(TypedHandler<M> fn, Dispatch dispatch = Dispatch::kWorker) {
    add_handler(M::kService, M::kId, std::string(M::kName), dispatch, raw<M>(std::move(fn)), reply_bound<M>());
  }

  // For a method whose request declares `reply_bulk_bound(const Request&)` (found by argument-
  // dependent lookup; data_service.h's Read): the server counts that many bytes against the
  // connection's in-flight bytes from the moment it reads the request, not only once the response
  // exists, so a peer cannot have 128 reads of 64 MiB each answered into memory while it reads
  // nothing. Other methods: none (their responses count once made).
  template <proto::RpcMethod M>
  static ReplyBound reply_bound() {
    if constexpr (requires(const typename M::Request& r) {
                    { reply_bulk_bound(r) } -> std::convertible_to<uint64_t>;
                  }) {
      return [](std::span<const uint8_t> msg) -> uint64_t {
        auto req = proto::decode<typename M::Request>(msg);
        return req.has_value() ? reply_bulk_bound(*req) : 0;
      };
    } else {
      return {};
    }
  }

  // `fn` as a raw handler: decodes the request, encodes the response.
  template <proto::RpcMethod M>
  static RawHandler raw(TypedHandler<M> fn) {
    return [fn = std::move(fn)](std::span<const uint8_t> msg, RequestContext& ctx) -> Result<std::string> {
      auto req = proto::decode<typename M::Request>(msg);
      if (!req.has_value()) return std::move(req).error().with_context(std::string(M::kName) + " request");
      auto resp = fn(*req, ctx);
      if (!resp.has_value()) return std::move(resp).error();
      return proto::encode(*resp);
    };
  }

  // Binds and starts serving. kUnavailable naming the address when it cannot bind.
  Status start();
  // The bound port (useful with port 0). REQUIRES: start() succeeded.
  uint16_t port() const;
  // The RDMA listener's port, 0 when not listening for RDMA. REQUIRES: start() succeeded.
  uint16_t rdma_port() const;
  // Stops accepting, closes connections, waits for running handlers. Idempotent.
  void stop();

  // Every method called at least once since construction, by name: calls, errors, handler time
  // (penstock stats). A call counts once its handler returns: a response that fails after that
  // (staging a file bulk, the frame limits) counts as the handler's outcome, and sending it is not
  // in the time. Safe from any thread once start() ran, a handler's included; the counters are
  // read one by one.
  std::vector<proto::MethodStats> method_stats() const;
  // Milliseconds since construction.
  uint64_t uptime_ms() const;
  // A random non-zero number drawn at construction: two answers with the same one come from one
  // run of the server (penstock stats tells a restart by it).
  uint64_t instance() const;
  // Counts a call of (service, method) that a handler of another method ran itself (penstock-meta's
  // Replay runs the change it carries): in method_stats() under that method's name. Nothing when
  // the method has no handler. REQUIRES: start() ran (handlers are registered before).
  void count_call(proto::ServiceId service, uint16_t method, bool ok, std::chrono::nanoseconds busy);

 private:
  void add_handler(proto::ServiceId service, uint16_t method, std::string name, Dispatch dispatch,
                   RawHandler handler, ReplyBound reply_bound = {});
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace penstock::rpc
