#include "common/net/tcp/blocking_call.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/net/tcp/send_now.h"
#include "common/proto/frame.h"

namespace penstock::net {
namespace {

constexpr size_t kDrainChunk = 64 << 10;

int poll_timeout_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60'000));
}

}  // namespace

Result<std::unique_ptr<BlockingConnection>> BlockingConnection::connect(const Endpoint& server,
                                                                        std::chrono::milliseconds timeout,
                                                                        bool* refused) {
  if (refused != nullptr) *refused = false;
  const std::string address = server.to_string();
  const auto deadline = Clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(server.port);
  if (int rc = ::getaddrinfo(server.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return Status(Code::kUnavailable, "cannot connect to " + address + ": " + ::gai_strerror(rc));
  }
  std::string why = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int n = 0;
        do {
          n = ::poll(&p, 1, poll_timeout_ms(deadline));
        } while (n < 0 && errno == EINTR);
        socklen_t len = sizeof(err);
        if (n == 0) {
          err = ETIMEDOUT;
        } else if (n < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
          err = errno;
        }
      }
    }
    if (err != 0) {
      if (refused != nullptr) *refused = err == ECONNREFUSED;
      why = err == ETIMEDOUT ? "timed out after " + std::to_string(timeout.count()) + " ms" : std::strerror(err);
      ::close(fd);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::freeaddrinfo(found);
    return std::unique_ptr<BlockingConnection>(new BlockingConnection(fd, address));
  }
  ::freeaddrinfo(found);
  return Status(Code::kUnavailable, "cannot connect to " + address + ": " + why);
}

BlockingConnection::~BlockingConnection() {
  if (fd_ >= 0) ::close(fd_);
}

bool BlockingConnection::broken() {
  if (!broken_) {
    // Idle, nothing may arrive: readable means closed by the peer (or bytes no call asked for).
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0) broken_ = true;
  }
  return broken_;
}

Status BlockingConnection::lost(int err) {
  if (err == ECONNRESET || err == EPIPE) reset_by_peer_ = true;
  return Status(Code::kUnavailable,
                "connection to " + address_ + " lost: " + (err == 0 ? "closed by the peer" : std::strerror(err)));
}

Status BlockingConnection::fail(Status why) {
  if (!why.is_ok()) broken_ = true;
  return why;
}

Status BlockingConnection::wait(short events, Clock::time_point deadline) {
  pollfd p{fd_, events, 0};
  for (;;) {
    if (Clock::now() >= deadline) {
      return Status(Code::kTimeout, "no response from " + address_ + " before the deadline");
    }
    const int n = ::poll(&p, 1, poll_timeout_ms(deadline));
    if (n > 0) return Status::ok();  // ready, or an error the next send/recv reports
    if (n < 0 && errno != EINTR) {
      return lost(errno);
    }
  }
}

Status BlockingConnection::read_exact(uint8_t* dst, size_t n, Clock::time_point deadline) {
  if (n == 0) return Status::ok();  // dst may be null (an empty span)
  const size_t buffered = std::min(n, in_len_ - in_pos_);
  if (buffered > 0) answered_ = true;
  std::memcpy(dst, in_.data() + in_pos_, buffered);
  in_pos_ += buffered;
  dst += buffered;
  n -= buffered;
  while (n > 0) {
    // Large reads go straight to `dst`; small ones fill the buffer, which often takes the next
    // piece of the frame along (the message with its header).
    const bool direct = n >= in_.size();
    const ssize_t got = direct ? ::recv(fd_, dst, n, MSG_DONTWAIT) : ::recv(fd_, in_.data(), in_.size(), MSG_DONTWAIT);
    if (got > 0) {
      answered_ = true;
      size_t take = static_cast<size_t>(got);
      if (!direct) {
        take = std::min(take, n);
        std::memcpy(dst, in_.data(), take);
        in_pos_ = take;
        in_len_ = static_cast<size_t>(got);
      }
      dst += take;
      n -= take;
      continue;
    }
    if (got == 0) {
      // EOF. A reset that came after the FIN (our request reached a socket already closed, with
      // nothing read) is left as the socket's error: fetch it, so refused() can tell.
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = 0;
      return lost(err == ECONNRESET || err == EPIPE ? err : 0);
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return lost(errno);
    }
    PENSTOCK_RETURN_IF_ERROR(wait(POLLIN, deadline));
  }
  return Status::ok();
}

Status BlockingConnection::skip(size_t n, Clock::time_point deadline) {
  std::vector<uint8_t> scratch(std::min(n, kDrainChunk));
  while (n > 0) {
    const size_t step = std::min(n, scratch.size());
    PENSTOCK_RETURN_IF_ERROR(read_exact(scratch.data(), step, deadline));
    n -= step;
  }
  return Status::ok();
}

Result<CallReply> BlockingConnection::call(uint64_t id, OutgoingCall& call) {
  if (broken_) return Status(Code::kUnavailable, "connection to " + address_ + " is closed");
  answered_ = false;
  const auto header = proto::encode_request_header(call.service, call.method, id, static_cast<uint32_t>(call.message.size()),
                                                   static_cast<uint32_t>(call.bulk_out.size()));
  const iovec parts[3] = {iovec{const_cast<uint8_t*>(header.data()), header.size()},
                          iovec{call.message.data(), call.message.size()},
                          iovec{const_cast<uint8_t*>(call.bulk_out.data()), call.bulk_out.size()}};
  const size_t total = header.size() + call.message.size() + call.bulk_out.size();
  size_t sent = 0;
  while (sent < total) {
    const SendNow r = send_now(fd_, unsent_rest(parts, sent));
    if (r.error != 0) {
      return fail(lost(r.error));
    }
    sent += r.sent;
    if (sent < total) PENSTOCK_RETURN_IF_ERROR(fail(wait(POLLOUT, call.deadline)));
  }
  // The server needs a moment: wait before the first recv rather than trying one that must fail.
  PENSTOCK_RETURN_IF_ERROR(fail(wait(POLLIN, call.deadline)));
  for (;;) {
    std::array<uint8_t, proto::kFrameHeaderSize> hb{};
    PENSTOCK_RETURN_IF_ERROR(fail(read_exact(hb.data(), hb.size(), call.deadline)));
    auto rh = proto::decode_header(hb);
    if (!rh.has_value()) return fail(Status(Code::kProtocol, "from " + address_ + ": " + rh.error().message()));
    if (rh->kind != proto::FrameKind::kResponse) {
      return fail(Status(Code::kProtocol, "from " + address_ + ": request frame received on a client connection"));
    }
    if (rh->request_id != id) {
      // A response nobody here waits for (as on the shared connections): read past it.
      PENSTOCK_RETURN_IF_ERROR(fail(skip(static_cast<size_t>(rh->message_len) + rh->bulk_len, call.deadline)));
      continue;
    }
    const bool ok = rh->status == 0;
    if (ok && rh->bulk_len > call.bulk_in.size()) {
      return fail(Status(Code::kProtocol, "from " + address_ + ": response to request " + std::to_string(id) +
                                              " carries " + std::to_string(rh->bulk_len) +
                                              " bulk bytes, more than the caller's buffer holds"));
    }
    std::string message(rh->message_len, '\0');
    PENSTOCK_RETURN_IF_ERROR(
        fail(read_exact(reinterpret_cast<uint8_t*>(message.data()), message.size(), call.deadline)));
    // Bulk on an error response means nothing and must not touch the caller's buffer.
    PENSTOCK_RETURN_IF_ERROR(fail(ok ? read_exact(call.bulk_in.data(), rh->bulk_len, call.deadline)
                                     : skip(rh->bulk_len, call.deadline)));
    if (in_pos_ != in_len_) {
      return fail(Status(Code::kProtocol, "from " + address_ + ": bytes after the response that no request asked for"));
    }
    used_ = true;
    if (!ok) {
      Status st(static_cast<Code>(rh->status), std::move(message));
      // The server closes the connection after a kProtocol answer (the request did not decode).
      return st.code() == Code::kProtocol ? fail(std::move(st)) : st;
    }
    return CallReply{std::move(message), rh->bulk_len};
  }
}

}  // namespace penstock::net
