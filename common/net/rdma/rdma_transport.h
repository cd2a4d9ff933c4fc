// The RDMA transport (libibverbs + librdmacm): reliable-connected queue pairs set up through
// rdma_cm, the same frames as TCP (docs/wire-format.md, section "RDMA").
//
// Control messages (frame header + message + an RDMA descriptor) travel as SEND/RECV; the client
// never has more requests in flight on a queue pair than the server has receive buffers posted
// (the window agreed at connect time), and every response returns one credit, so neither side is
// ever overrun. Bulk moves one-sided: the server RDMA-READs a request's bulk out of the client's
// buffer and RDMA-WRITEs a response's bulk into the buffer the request named, then SENDs the
// response. Both sides stage bulk through a pool registered once per connection (client) or per
// device (server): nothing is registered on the hot path (docs/architecture.md, "Transports").
// Completions are waited for on a completion channel and then drained in bursts: an idle
// connection costs no CPU.
//
// Client side: make_rdma_channel() gives a net::Channel (transport.h), one thread per queue pair.
// Server side: RdmaListener accepts connections and hands each request to a callback; the
// callback's owner replies through RdmaRequest::reply() from any thread (common/rpc/server.cc
// dispatches them to the same handlers as TCP).
// Thread-safety: every public function and method is thread-safe.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/net/transport.h"
#include "common/proto/frame.h"

namespace penstock::net {

// True when this host has at least one RDMA device (cheap: lists devices, opens nothing).
bool rdma_device_present();

// True when rdma_cm can resolve an address and a route to `server` through a local RDMA device
// (so an RDMA connection could be attempted). Waits at most `timeout`. False on any failure.
bool rdma_can_reach(const Endpoint& server, std::chrono::milliseconds timeout);

struct RdmaOptions {
  std::chrono::milliseconds connect_timeout{3000};
  uint32_t window = 64;  // requests in flight per queue pair (capped by the server's)
  uint32_t control_bytes =
      16384;  // one control message buffer (frame header + message + descriptor)
  size_t pool_bytes = 32u << 20;  // registered staging memory per queue pair
  size_t slot_bytes = 64u << 10;  // allocation granule of the staging pool
};

// An RDMA channel. Connects lazily on the first call (or in connect_now()) and again after a
// connection is lost; calls in flight on a lost connection fail with kUnavailable naming the
// server. Requests whose message does not fit a control buffer fail with kInvalid.
class RdmaChannel : public Channel {
 public:
  // Connects now if not connected: ok, or kUnavailable with the reason (no route, rejected, timed
  // out). Used by transport selection to fall back to TCP.
  virtual Status connect_now() = 0;
};

std::shared_ptr<RdmaChannel> make_rdma_channel(Endpoint server, RdmaOptions options);

// ---- server side ----

struct RdmaServerOptions {
  Endpoint listen{"0.0.0.0", 0};  // port 0: pick one (see RdmaListener::port())
  uint32_t recv_depth = 128;  // receive buffers per queue pair: the most a client may send ahead
  uint32_t control_bytes = 16384;
  size_t pool_bytes = 64u << 20;  // registered bulk memory per device, shared by its connections
  size_t slot_bytes = 64u << 10;
  uint32_t max_connections = 1024;
};

// One request received on an RDMA connection. Its bulk (already read from the client) stays valid
// until reply() ran or the object is destroyed.
class RdmaRequest {
 public:
  virtual ~RdmaRequest() = default;
  virtual const proto::FrameHeader& header() const = 0;
  virtual std::span<const uint8_t> message() const = 0;
  virtual std::span<const uint8_t> bulk() const = 0;
  virtual const std::string& peer() const = 0;
  // Sends the response once: `status` 0 with `message` and `bulk` (RDMA-written into the client's
  // buffer first), or an error code with its text as message and no bulk. close_after closes the
  // connection once it was sent. A response bulk larger than the client's buffer becomes a
  // kProtocol error response. Dropped silently when the connection is gone.
  virtual void reply(uint32_t status, std::string message, ByteBuffer bulk,
                     bool close_after) = 0;
};

using RdmaRequestHandler = std::function<void(std::shared_ptr<RdmaRequest>)>;

class RdmaListener {
 public:
  // Binds, listens and starts the event thread. kUnavailable naming the address when no RDMA
  // device serves it or the port is taken. `handler` runs on the event thread and must not block.
  static Result<std::unique_ptr<RdmaListener>> start(const RdmaServerOptions& options,
                                                     RdmaRequestHandler handler);
  virtual ~RdmaListener() = default;  // stops
  virtual uint16_t port() const = 0;
  // Stops accepting, disconnects every client and joins the event thread. Requests still being
  // handled may reply afterwards (their replies are dropped). Idempotent.
  virtual void stop() = 0;
};

}  // namespace penstock::net
