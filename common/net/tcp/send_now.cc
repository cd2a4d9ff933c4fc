#include "common/net/tcp/send_now.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

namespace penstock::net {

SendNow send_now(int fd, std::span<const iovec> parts) {
  msghdr msg{};
  msg.msg_iov = const_cast<iovec*>(parts.data());
  msg.msg_iovlen = parts.size();
  ssize_t n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n < 0 && errno == EINTR) n = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  if (n >= 0) return SendNow{static_cast<size_t>(n), 0};
  if (errno == EAGAIN || errno == EWOULDBLOCK) return SendNow{};
  return SendNow{0, errno};
}

std::vector<iovec> unsent_rest(std::span<const iovec> parts, size_t sent) {
  std::vector<iovec> rest;
  for (const iovec& part : parts) {
    const size_t skip = std::min(sent, part.iov_len);
    sent -= skip;
    if (skip < part.iov_len) rest.push_back(iovec{static_cast<char*>(part.iov_base) + skip, part.iov_len - skip});
  }
  return rest;
}

}  // namespace penstock::net
