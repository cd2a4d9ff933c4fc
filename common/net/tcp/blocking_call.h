// BlockingConnection: a TCP connection on which the calling thread sends one request and reads its
// own response, with no I/O thread between. The TCP channel keeps a few of these per server for
// blocking calls (RpcClient::call: every metadata call of a FUSE request): an I/O thread that
// receives the reply and wakes the caller costs two thread wake-ups per call, ~20 µs each between
// the cores of a VM, as much as the round trip itself; here the socket wakes the caller directly.
//
// One call at a time, and a connection whose call did not end cleanly (timeout, lost connection,
// malformed reply) is broken: its owner drops it, so a late reply can never be taken for the next
// call's. The frames are those of every other connection (docs/wire-format.md).
// Thread-safety: none; one thread uses a connection at a time (TcpChannel's pool hands them out).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>

#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/net/transport.h"

namespace penstock::net {

class BlockingConnection {
 public:
  // Connects to `server` (a numeric address or a host name) within `timeout`. kUnavailable
  // "cannot connect to HOST:PORT: <reason>" on failure.
  // `refused` (if set) says whether the failure was ECONNREFUSED: nothing listens there.
  static Result<std::unique_ptr<BlockingConnection>> connect(const Endpoint& server, std::chrono::milliseconds timeout,
                                                             bool* refused = nullptr);
  // A connection that was never made: broken(), for a pool's placeholders.
  BlockingConnection() : fd_(-1), broken_(true) {}
  ~BlockingConnection();
  BlockingConnection(const BlockingConnection&) = delete;
  BlockingConnection& operator=(const BlockingConnection&) = delete;

  // Sends `call` as request `id` and waits for its response until call.deadline. The response's
  // bulk lands in call.bulk_in. Errors, as a Channel reports them: the response's error status;
  // kTimeout; kUnavailable (connection lost); kProtocol (a malformed frame, a response to another
  // request, more bulk than bulk_in holds). After any error but a response's status (kProtocol
  // excepted: the server closes the connection after it) the connection is broken(): drop it.
  Result<CallReply> call(uint64_t id, OutgoingCall& call);

  // Whether the connection can carry no more calls: a call failed on it, or, checked now without
  // waiting, the peer closed it or sent bytes nobody asked for while it sat idle.
  bool broken();
  // Whether a call failed on it (broken() without looking at the socket).
  bool failed() const { return broken_; }
  // Whether the server reset it before answering any call on it: a server over its connection
  // limit accepts and closes at once (RpcServer), and a socket closed with bytes unread sends a
  // reset, so the request was not (wholly) read and did not run. A server that read the request
  // and then went away (a crash mid-call) closes with a FIN instead: not refused.
  bool refused() const { return broken_ && reset_by_peer_ && !used_ && !answered_; }

 private:
  BlockingConnection(int fd, std::string address) : fd_(fd), address_(std::move(address)) {}
  // Waits until the socket is readable (`events` POLLIN) or writable (POLLOUT), or the deadline.
  Status wait(short events, Clock::time_point deadline);
  // Reads exactly `n` bytes into `dst` before the deadline: what in_ holds first, then the socket.
  Status read_exact(uint8_t* dst, size_t n, Clock::time_point deadline);
  // Reads `n` bytes and drops them.
  Status skip(size_t n, Clock::time_point deadline);
  // `why`, marking the connection broken unless it is ok.
  Status fail(Status why);
  // kUnavailable "connection to ADDRESS lost: <errno text>" (err 0: closed by the peer); notes
  // a reset by the peer (ECONNRESET, EPIPE).
  Status lost(int err);

  int fd_;
  std::string address_;
  bool broken_ = false;
  bool used_ = false;            // a call completed on it
  bool answered_ = false;        // the current call received a byte of its response
  bool reset_by_peer_ = false;   // a call saw ECONNRESET or EPIPE
  // Bytes received but not yet consumed: [in_pos_, in_len_) of in_. A response header usually
  // arrives with its message in one recv into here.
  std::array<uint8_t, 4096> in_{};
  size_t in_pos_ = 0;
  size_t in_len_ = 0;
};

}  // namespace penstock::net
