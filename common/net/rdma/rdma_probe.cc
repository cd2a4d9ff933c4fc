// rdma_device_present() and rdma_can_reach(): what transport selection asks before it tries RDMA.
#include <algorithm>

#include "common/net/rdma/rdma_transport.h"
#include "common/net/rdma/verbs.h"

namespace penstock::net {

bool rdma_device_present() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return false;
  ibv_free_device_list(list);
  return n > 0;
}

bool rdma_can_reach(const Endpoint& server, std::chrono::milliseconds timeout) {
  if (!rdma_device_present()) return false;
  sockaddr_storage addr{};
  if (!rdma::resolve_sockaddr(server, &addr).is_ok()) return false;
  rdma_event_channel* ec = rdma_create_event_channel();
  if (ec == nullptr) return false;
  rdma::set_nonblocking(ec->fd);
  rdma_cm_id* id = nullptr;
  bool ok = false;
  if (rdma_create_id(ec, &id, nullptr, RDMA_PS_TCP) == 0) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    const int ms = static_cast<int>(std::max<int64_t>(1, timeout.count()));
    auto step = [&](rdma_cm_event_type want) {
      bool timed_out = false;
      std::string err;
      rdma_cm_event* ev = rdma::wait_cm_event(ec, deadline, &timed_out, &err);
      if (ev == nullptr) return false;
      const bool good = ev->event == want;
      rdma_ack_cm_event(ev);
      return good;
    };
    ok = rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&addr), ms) == 0 &&
         step(RDMA_CM_EVENT_ADDR_RESOLVED) && rdma_resolve_route(id, ms) == 0 &&
         step(RDMA_CM_EVENT_ROUTE_RESOLVED);
    rdma_destroy_id(id);
  }
  rdma_destroy_event_channel(ec);
  return ok;
}

}  // namespace penstock::net
