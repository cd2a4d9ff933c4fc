// The transport interface: how a client moves one RPC to a server and back.
//
// A Channel is a client's connection(s) to one server. An outgoing call names two caller-owned
// buffers: bulk_out, whose bytes go to the server after the message, and bulk_in, where the
// response's bulk bytes land. Naming the buffers in the call (instead of handing bytes to the
// transport) is what lets the RDMA transport move bulk one-sided later: it registers these
// buffers and sends their addresses and keys so the server can RDMA READ/WRITE them directly.
// The TCP transport reads response bulk straight from the socket into bulk_in: no copy.
//
// Thread-safety: a Channel may be used from any number of threads at once; callbacks run on the
// transport's I/O threads and must not block.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/proto/frame.h"

namespace penstock::net {

using Clock = std::chrono::steady_clock;

struct OutgoingCall {
  proto::ServiceId service = proto::ServiceId::kMeta;
  uint16_t method = 0;
  std::string message;                // the encoded request
  std::span<const uint8_t> bulk_out;  // REQUIRES: alive until the callback ran
  std::span<uint8_t> bulk_in;         // REQUIRES: alive until the callback ran
  Clock::time_point deadline;         // the call fails with kTimeout once this passes
};

struct CallReply {
  std::string message;    // the encoded response (status was ok)
  uint32_t bulk_len = 0;  // bytes written at the start of bulk_in
};

// Runs exactly once per call: with the reply, or with the response's error status (code and the
// server's message), kTimeout, kUnavailable (cannot connect, connection lost) or kProtocol (the
// peer sent a malformed frame or more bulk than bulk_in holds; the connection is then closed).
using CallCallback = std::function<void(Result<CallReply>)>;

class Channel {
 public:
  virtual ~Channel() = default;
  virtual void start_call(OutgoingCall call, CallCallback done) = 0;
  // start_call() for a caller that waits: returns what the callback would get. The default waits
  // for start_call(); TCP lets the calling thread send and read its own response on a connection
  // of its own (tcp/blocking_call.h), which saves the I/O thread's two wake-ups per call.
  virtual Result<CallReply> call_sync(OutgoingCall call);
  // "tcp 127.0.0.1:7000": for status output and logs.
  virtual std::string describe() const = 0;
  // Turns TcpOptions::wait_while_refused off (a client shutting down must not wait for a server
  // that is gone). Channels that never wait ignore it.
  virtual void stop_waiting_while_refused() {}
};

class IoPool;

// I/O threads shared by every channel of a process. Thread-safe. Stops and joins on destruction;
// REQUIRES: every Channel made on it is destroyed first.
class IoRuntime {
 public:
  explicit IoRuntime(int threads);
  ~IoRuntime();
  IoRuntime(const IoRuntime&) = delete;
  IoRuntime& operator=(const IoRuntime&) = delete;

  // An asio::io_context for a new connection (opaque here so that headers do not pull in Asio).
  // Each I/O thread runs one context of its own; successive calls hand them out round-robin.
  void* native_context();

 private:
  std::unique_ptr<IoPool> pool_;  // io_pool.h (Asio, so not included here)
};

struct TcpOptions {
  std::chrono::milliseconds connect_timeout{3000};
  int connections = 2;  // sockets per server; calls are spread over them, many in flight on each
  // Sockets per server for call_sync(), each used by one waiting caller at a time and kept for the
  // next (made as needed, up to this many; callers beyond wait through the shared connections).
  // 0: call_sync() always goes through the shared connections.
  int blocking_connections = 8;
  // A blocking call whose connection is refused (nothing listens: the server is restarting) tries
  // to connect again, with a growing pause, until its deadline: the request was never sent, so it
  // may be retried whatever it does. false: it fails at once with kUnavailable.
  bool wait_while_refused = false;
};

// A TCP channel (Boost.Asio). Connects lazily on the first call and again after a connection is
// lost; calls in flight on a lost connection fail with kUnavailable.
std::shared_ptr<Channel> make_tcp_channel(IoRuntime& runtime, Endpoint server, TcpOptions options);

}  // namespace penstock::net
