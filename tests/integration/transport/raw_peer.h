// RawPeer: a client that sends arbitrary bytes as one transport message (a TCP write, or one RDMA
// SEND on a queue pair set up through rdma_cm with Penstock's connect data) and watches for the
// server closing the connection. The hostile-peer cases of the transport suite use it.
// Thread-safety: one thread at a time.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "common/base/result.h"
#include "common/net/channel_factory.h"
#include "common/net/endpoint.h"
#include "common/net/rdma/control.h"

namespace penstock::test {

class RawPeer {
 public:
  virtual ~RawPeer() = default;
  virtual Status send(std::span<const uint8_t> bytes) = 0;
  // True once the server closed the connection (within `timeout`).
  virtual bool wait_closed(std::chrono::milliseconds timeout) = 0;
};

class RawTcpPeer : public RawPeer {
 public:
  explicit RawTcpPeer(int fd) : fd_(fd) {}
  ~RawTcpPeer() override { close(fd_); }
  Status send(std::span<const uint8_t> bytes) override {
    size_t off = 0;
    while (off < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return Status(Code::kUnavailable, "send failed");
      off += static_cast<size_t>(n);
    }
    return Status::ok();
  }
  bool wait_closed(std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return true;  // EOF or reset
    }
    return false;
  }

 private:
  int fd_;
};

class RawRdmaPeer : public RawPeer {
 public:
  ~RawRdmaPeer() override {
    if (id_ != nullptr && connected_) rdma_disconnect(id_);
    if (id_ != nullptr && id_->qp != nullptr) rdma_destroy_qp(id_);
    if (mr_ != nullptr) ibv_dereg_mr(mr_);
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    if (id_ != nullptr) rdma_destroy_id(id_);
    if (ec_ != nullptr) rdma_destroy_event_channel(ec_);
  }

  static Result<std::unique_ptr<RawPeer>> connect(const net::Endpoint& ep, bool bad_params) {
    auto p = std::make_unique<RawRdmaPeer>();
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(ep.port);
    if (inet_pton(AF_INET, ep.host.c_str(), &sa.sin_addr) != 1)
      return Status(Code::kInvalid, "need an IPv4 address");
    p->ec_ = rdma_create_event_channel();
    if (p->ec_ == nullptr) return Status(Code::kUnavailable, "rdma_create_event_channel");
    if (rdma_create_id(p->ec_, &p->id_, nullptr, RDMA_PS_TCP) != 0)
      return Status(Code::kUnavailable, "rdma_create_id");
    if (rdma_resolve_addr(p->id_, nullptr, reinterpret_cast<sockaddr*>(&sa), 2000) != 0 ||
        !p->expect(RDMA_CM_EVENT_ADDR_RESOLVED)) {
      return Status(Code::kUnavailable, "resolve addr");
    }
    if (rdma_resolve_route(p->id_, 2000) != 0 || !p->expect(RDMA_CM_EVENT_ROUTE_RESOLVED)) {
      return Status(Code::kUnavailable, "resolve route");
    }
    p->pd_ = ibv_alloc_pd(p->id_->verbs);
    p->cq_ = ibv_create_cq(p->id_->verbs, 1024, nullptr, nullptr, 0);
    if (p->pd_ == nullptr || p->cq_ == nullptr) return Status(Code::kUnavailable, "pd/cq");
    ibv_qp_init_attr qa{};
    qa.send_cq = p->cq_;
    qa.recv_cq = p->cq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 64;
    qa.cap.max_recv_wr = 16;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(p->id_, p->pd_, &qa) != 0) return Status(Code::kUnavailable, "create qp");
    p->buf_.assign(16 * 8192 + 65536, 0);
    p->mr_ = ibv_reg_mr(p->pd_, p->buf_.data(), p->buf_.size(),
                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE);
    if (p->mr_ == nullptr) return Status(Code::kUnavailable, "reg mr");
    for (uint32_t i = 0; i < 16; ++i) {
      ibv_sge sge{reinterpret_cast<uint64_t>(p->buf_.data() + 65536 + i * 8192), 8192,
                  p->mr_->lkey};
      ibv_recv_wr wr{};
      wr.wr_id = i;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      ibv_recv_wr* bad = nullptr;
      if (ibv_post_recv(p->id_->qp, &wr, &bad) != 0) return Status(Code::kUnavailable, "post recv");
    }
    std::array<uint8_t, net::rdma::kConnectParamsSize> pdata{};
    net::rdma::encode_connect_params(net::rdma::ConnectParams{16, 8192}, pdata);
    if (bad_params) pdata[0] ^= 0xff;
    rdma_conn_param cp{};
    cp.private_data = pdata.data();
    cp.private_data_len = static_cast<uint8_t>(pdata.size());
    cp.responder_resources = 1;
    cp.initiator_depth = 1;
    cp.retry_count = 3;
    cp.rnr_retry_count = 3;
    if (rdma_connect(p->id_, &cp) != 0 || !p->expect(RDMA_CM_EVENT_ESTABLISHED)) {
      return Status(Code::kUnavailable, "connect refused");
    }
    p->connected_ = true;
    return std::unique_ptr<RawPeer>(std::move(p));
  }

  Status send(std::span<const uint8_t> bytes) override {
    if (bytes.size() > 65536) return Status(Code::kInvalid, "too long");
    std::memcpy(buf_.data(), bytes.data(), bytes.size());
    ibv_sge sge{reinterpret_cast<uint64_t>(buf_.data()), static_cast<uint32_t>(bytes.size()),
                mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 1000;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(id_->qp, &wr, &bad) != 0) return Status(Code::kUnavailable, "post send");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc{};
      int n = ibv_poll_cq(cq_, 1, &wc);
      if (n < 0) return Status(Code::kUnavailable, "poll cq");
      if (n == 0) {
        usleep(100);
        continue;
      }
      if (wc.status != IBV_WC_SUCCESS) {
        failed_ = true;
        return Status(Code::kUnavailable, ibv_wc_status_str(wc.status));
      }
      if (wc.wr_id == 1000) return Status::ok();
    }
    return Status(Code::kTimeout, "send did not complete");
  }

  bool wait_closed(std::chrono::milliseconds timeout) override {
    if (failed_) return true;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc{};
      if (ibv_poll_cq(cq_, 1, &wc) > 0 && wc.status != IBV_WC_SUCCESS) return true;
      pollfd p{ec_->fd, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ec_, &ev) != 0) continue;
      const auto type = ev->event;
      rdma_ack_cm_event(ev);
      if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_TIMEWAIT_EXIT) {
        connected_ = false;
        return true;
      }
    }
    return false;
  }

 private:
  bool expect(rdma_cm_event_type want) {
    pollfd p{ec_->fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return false;
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(ec_, &ev) != 0) return false;
    const bool ok = ev->event == want;
    rdma_ack_cm_event(ev);
    return ok;
  }

  rdma_event_channel* ec_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_mr* mr_ = nullptr;
  std::vector<uint8_t> buf_;
  bool connected_ = false;
  bool failed_ = false;
};

inline Result<std::unique_ptr<RawPeer>> make_raw_peer(net::TransportKind kind,
                                                      const net::Endpoint& ep,
                                                      bool bad_params = false) {
  if (kind == net::TransportKind::kRdma) return RawRdmaPeer::connect(ep, bad_params);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(ep.port);
  inet_pton(AF_INET, ep.host.c_str(), &sa.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return Status(Code::kUnavailable, "tcp connect to " + ep.to_string() + " failed");
  }
  return std::unique_ptr<RawPeer>(std::make_unique<RawTcpPeer>(fd));
}

}  // namespace penstock::test
