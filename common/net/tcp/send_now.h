// send_now: writes a frame from the calling thread instead of handing it to a connection's I/O
// thread, which saves a thread wake-up per message (the TCP channel's requests, the RPC server's
// responses). One non-blocking sendmsg: the socket takes all, part or none of it, and the caller's
// I/O thread writes what is left (unsent_rest). Stateless; the caller must be the socket's only
// writer while it runs.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <span>
#include <vector>

namespace penstock::net {

struct SendNow {
  size_t sent = 0;  // bytes the socket took (0 when it was full)
  int error = 0;    // errno of a failed sendmsg (EAGAIN is not a failure), else 0
};

// Writes `parts` in order with one sendmsg(MSG_DONTWAIT | MSG_NOSIGNAL), retried once on EINTR.
// REQUIRES: `fd` is a connected stream socket.
SendNow send_now(int fd, std::span<const iovec> parts);

// The bytes of `parts` after the first `sent`, in order, as pointers into the same memory (empty
// parts dropped). REQUIRES: sent <= the parts' total size.
std::vector<iovec> unsent_rest(std::span<const iovec> parts, size_t sent);

}  // namespace penstock::net
