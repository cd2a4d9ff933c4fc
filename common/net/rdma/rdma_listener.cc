// The server side of the RDMA transport: one event thread for the listener and every accepted
// queue pair.
//
// The event thread owns the rdma_cm listener, every connection's verbs objects, and one completion
// channel per device (all of that device's completion queues report to it). It sleeps in poll()
// on those channels, the rdma_cm channel and an eventfd that workers write when they reply.
// Per request it copies the control message out of the receive buffer and reposts the buffer,
// RDMA-READs the request bulk (if any) into the device's registered pool, and hands the request
// to the handler. A reply (any thread) stages its bulk into the pool, queues itself on its
// connection and wakes the thread, which posts RDMA WRITE (bulk, unsignaled) + SEND (the response)
// in one chain: on a reliable connection the SEND is delivered after the WRITE's data is placed.
//
// Credits: the client sends at most min(its window, our recv_depth) requests ahead and counts one
// back per response; a request beyond recv_depth unanswered is a protocol violation and closes
// the connection. Peer bytes are hostile: a malformed control message closes its connection only.
// Lock order: ServerConn::mu_ and Shared::mu are leaves; BufferPool's lock is a leaf.
#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/log.h"
#include "common/net/rdma/control.h"
#include "common/net/rdma/rdma_transport.h"
#include "common/net/rdma/verbs.h"

namespace penstock::net {
namespace {

using rdma::BufferPool;
using rdma::RemoteBuffer;
using rdma::Ring;

using rdma::kTagMask;
using rdma::kTagRead;
using rdma::kTagRecv;
using rdma::kTagSend;
constexpr int kBurst = 32;
constexpr size_t kMaxErrorText = 4096;
constexpr int kRetryMs = 5;  // re-check work stalled on pool space this often

// Verbs objects shared by every connection on one device. Outlives them (they and every pending
// request hold it).
struct Device {
  ibv_context* verbs = nullptr;
  ibv_pd* pd = nullptr;
  ibv_comp_channel* comp = nullptr;
  int max_rd_atom = 1;
  int max_init_rd_atom = 1;
  std::unique_ptr<BufferPool> pool;
  ~Device() {
    pool.reset();
    if (comp != nullptr) ibv_destroy_comp_channel(comp);
    if (pd != nullptr) ibv_dealloc_pd(pd);
  }
};

struct Shared;
class ServerConn;

struct Outgoing {
  proto::FrameHeader header;
  std::string message;
  BufferPool::Buffer staged;      // bulk in registered memory
  ByteBuffer unstaged;         // bulk still to be staged (the pool was busy at reply time)
  RemoteBuffer dest;              // the client's buffer for the bulk
  bool close_after = false;
};

class RequestImpl;

class ServerConn : public std::enable_shared_from_this<ServerConn> {
 public:
  ServerConn(std::shared_ptr<Shared> shared, std::shared_ptr<Device> dev, rdma_cm_id* id)
      : shared_(std::move(shared)), dev_(std::move(dev)), id_(id) {}

  // Worker side: queue a response. False when the connection is closed.
  bool queue_reply(Outgoing o);
  const std::string& peer() const { return peer_; }
  const std::shared_ptr<Device>& device() const { return dev_; }
  uint32_t peer_control_bytes() const { return peer_ctrl_; }

  // ---- event thread ----
  Status setup(const rdma::ConnectParams& peer, const RdmaServerOptions& o);
  void established();
  void describe_peer();
  void drain_cq(const std::function<void(std::shared_ptr<RdmaRequest>)>& handler);
  void flush_outgoing();  // posts queued responses while send slots and pool space last
  void retry_reads(const std::function<void(std::shared_ptr<RdmaRequest>)>& handler);
  bool has_stalled_work();
  void close();
  bool closed_on_thread() const { return closed_thread_; }
  rdma_cm_id* id() const { return id_; }
  ibv_cq* cq() const { return cq_; }

 private:
  void on_completion(const ibv_wc& wc,
                     const std::function<void(std::shared_ptr<RdmaRequest>)>& handler);
  bool post_read(const std::shared_ptr<RequestImpl>& req);
  void fail(const std::string& why, bool warn);

  std::shared_ptr<Shared> shared_;
  std::shared_ptr<Device> dev_;
  rdma_cm_id* id_;
  std::string peer_ = "unknown rdma peer";

  std::mutex mu_;                  // leaf
  bool closed_ = false;            // guarded by mu_
  std::deque<Outgoing> outgoing_;  // guarded by mu_

  // Event-thread state.
  bool closed_thread_ = false;
  bool connected_ = false;
  ibv_cq* cq_ = nullptr;
  bool qp_created_ = false;
  std::unique_ptr<Ring> recv_;
  std::unique_ptr<Ring> send_;
  uint32_t recv_depth_ = 0;
  uint32_t peer_ctrl_ = 0;    // the most bytes one response SEND may take
  uint32_t outstanding_ = 0;  // requests received and not yet answered
  std::vector<uint32_t> free_sends_;
  std::vector<Outgoing> sends_;  // by send slot: in flight until its SEND completes
  std::vector<uint32_t> free_reads_;
  std::vector<std::shared_ptr<RequestImpl>> reads_;         // by read slot
  std::deque<std::shared_ptr<RequestImpl>> waiting_reads_;  // the pool was busy
  std::deque<Outgoing> stalled_;  // responses waiting for a send slot or pool space (event thread)
};

struct Shared {
  int wake_fd = -1;
  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd, &one, sizeof(one));
    (void)n;
  }
};

class RequestImpl : public RdmaRequest {
 public:
  RequestImpl(std::shared_ptr<ServerConn> conn, const rdma::ControlMessage& m)
      : conn_(std::move(conn)),
        header_(m.header),
        message_(m.message.begin(), m.message.end()),
        source_(m.bulk_out),
        dest_(m.bulk_in) {}
  ~RequestImpl() override { conn_->device()->pool->release(bulk_); }

  const proto::FrameHeader& header() const override { return header_; }
  std::span<const uint8_t> message() const override { return message_; }
  std::span<const uint8_t> bulk() const override {
    return bulk_.valid() ? std::span<const uint8_t>(bulk_.data, header_.bulk_len)
                         : std::span<const uint8_t>();
  }
  const std::string& peer() const override { return conn_->peer(); }

  void reply(uint32_t status, std::string message, ByteBuffer bulk,
             bool close_after) override {
    if (replied_.exchange(true)) return;
    conn_->device()->pool->release(bulk_);  // the handler is done with the request bulk
    Outgoing o;
    o.header.kind = proto::FrameKind::kResponse;
    o.header.service = header_.service;
    o.header.method = header_.method;
    o.header.request_id = header_.request_id;
    o.close_after = close_after;
    if (status == 0 && bulk.size() > dest_.len) {
      status = static_cast<uint32_t>(Code::kProtocol);
      message = "response bulk of " + std::to_string(bulk.size()) + " bytes is larger than the " +
                std::to_string(dest_.len) + "-byte buffer the request named";
      o.close_after = false;
    }
    const size_t room = conn_->peer_control_bytes() - proto::kFrameHeaderSize;
    if (status == 0 && message.size() > room) {
      status = static_cast<uint32_t>(Code::kInternal);
      message = "response message of " + std::to_string(message.size()) +
                " bytes does not fit the client's RDMA control buffer";
    }
    if (status != 0) {
      bulk.clear();
      message.resize(std::min({message.size(), room, kMaxErrorText}));
    }
    o.header.status = status;
    o.header.message_len = static_cast<uint32_t>(message.size());
    o.header.bulk_len = static_cast<uint32_t>(bulk.size());
    o.message = std::move(message);
    o.dest = dest_;
    if (!bulk.empty()) {
      auto b = conn_->device()->pool->allocate(bulk.size());
      if (b.has_value() && b->has_value()) {
        o.staged = **b;
        std::memcpy(o.staged.data, bulk.data(), bulk.size());
      } else if (!b.has_value()) {
        o.header.status = static_cast<uint32_t>(Code::kInternal);
        o.message = b.error().message().substr(0, std::min(room, kMaxErrorText));
        o.header.message_len = static_cast<uint32_t>(o.message.size());
        o.header.bulk_len = 0;
      } else {
        o.unstaged = std::move(bulk);  // staged by the event thread once pool space frees
      }
    }
    if (!conn_->queue_reply(std::move(o))) {
      // Connection gone: the queue_reply dropped it (and released its staging).
    }
  }

  // Event thread.
  BufferPool::Buffer& bulk_buffer() { return bulk_; }
  const RemoteBuffer& source() const { return source_; }

 private:
  std::shared_ptr<ServerConn> conn_;
  proto::FrameHeader header_;
  std::vector<uint8_t> message_;
  RemoteBuffer source_;
  RemoteBuffer dest_;
  BufferPool::Buffer bulk_;
  std::atomic<bool> replied_{false};
};

bool ServerConn::queue_reply(Outgoing o) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) {
      outgoing_.push_back(std::move(o));
      o.staged = BufferPool::Buffer{};
    }
  }
  if (o.staged.valid()) {  // not queued
    dev_->pool->release(o.staged);
    return false;
  }
  // Only a wake-up: the event thread visits every connection on each pass. (Keeping a list of
  // ready connections here made a cycle Shared -> ServerConn -> Shared when a reply raced stop().)
  shared_->wake();
  return true;
}

Status ServerConn::setup(const rdma::ConnectParams& peer, const RdmaServerOptions& o) {
  recv_depth_ = std::clamp<uint32_t>(o.recv_depth, 1, rdma::kMaxRecvDepth);
  const uint32_t ctrl =
      std::clamp<uint32_t>(o.control_bytes, rdma::kMinControlBytes, rdma::kMaxControlBytes);
  peer_ctrl_ =
      std::min(ctrl, peer.control_bytes);  // our send buffers and the client's receive buffers
  const uint32_t sends = 2 * recv_depth_;
  cq_ = ibv_create_cq(id_->verbs, static_cast<int>(recv_depth_ + recv_depth_ + sends + 16), this,
                      dev_->comp, 0);
  if (cq_ == nullptr) return Status(Code::kInternal, "ibv_create_cq: " + rdma::errno_text(errno));
  if (ibv_req_notify_cq(cq_, 0) != 0)
    return Status(Code::kInternal, "ibv_req_notify_cq: " + rdma::errno_text(errno));
  ibv_qp_init_attr qa{};
  qa.send_cq = cq_;
  qa.recv_cq = cq_;
  qa.qp_type = IBV_QPT_RC;
  qa.cap.max_send_wr = recv_depth_ + 2 * sends + 8;
  qa.cap.max_recv_wr = recv_depth_;
  qa.cap.max_send_sge = 1;
  qa.cap.max_recv_sge = 1;
  if (rdma_create_qp(id_, dev_->pd, &qa) != 0)
    return Status(Code::kInternal, "rdma_create_qp: " + rdma::errno_text(errno));
  qp_created_ = true;
  PENSTOCK_ASSIGN_OR_RETURN(recv_, Ring::create(dev_->pd, recv_depth_, ctrl));
  PENSTOCK_ASSIGN_OR_RETURN(send_, Ring::create(dev_->pd, sends, peer_ctrl_));
  for (uint32_t i = 0; i < recv_depth_; ++i) {
    if (rdma::post_ring_recv(id_->qp, *recv_, i, kTagRecv) != 0) {
      return Status(Code::kInternal, "ibv_post_recv: " + rdma::errno_text(errno));
    }
  }
  sends_.resize(sends);
  for (uint32_t i = 0; i < sends; ++i) free_sends_.push_back(sends - 1 - i);
  reads_.resize(recv_depth_);
  for (uint32_t i = 0; i < recv_depth_; ++i) free_reads_.push_back(recv_depth_ - 1 - i);
  return Status::ok();
}

void ServerConn::established() {
  connected_ = true;
  // Closed before the connection was fully up (a hostile first message can arrive before the
  // ESTABLISHED event): the disconnect request could not be sent then; send it now.
  if (closed_thread_) rdma_disconnect(id_);
}

void ServerConn::describe_peer() {
  sockaddr* sa = rdma_get_peer_addr(id_);
  char buf[INET6_ADDRSTRLEN] = {};
  if (sa != nullptr && sa->sa_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    peer_ = std::string(buf) + ":" + std::to_string(ntohs(in->sin_port));
  } else if (sa != nullptr && sa->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, buf, sizeof(buf));
    peer_ = "[" + std::string(buf) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
}

void ServerConn::fail(const std::string& why, bool warn) {
  if (warn) {
    PENSTOCK_LOG(Warn) << "closing rdma connection from " << peer_ << ": " << why;
  } else {
    PENSTOCK_LOG(Debug) << "rdma connection from " << peer_ << " closed: " << why;
  }
  close();
}

void ServerConn::drain_cq(const std::function<void(std::shared_ptr<RdmaRequest>)>& handler) {
  ibv_wc wc[kBurst];
  while (!closed_thread_) {
    int n = ibv_poll_cq(cq_, kBurst, wc);
    if (n <= 0) {
      if (n < 0) fail("ibv_poll_cq failed", false);
      return;
    }
    for (int i = 0; i < n && !closed_thread_; ++i) on_completion(wc[i], handler);
  }
}

void ServerConn::on_completion(const ibv_wc& wc,
                               const std::function<void(std::shared_ptr<RdmaRequest>)>& handler) {
  if (wc.status != IBV_WC_SUCCESS) {
    fail(std::string(ibv_wc_status_str(wc.status)) + " (client gone, or it named a bad buffer)",
         wc.status != IBV_WC_WR_FLUSH_ERR);
    return;
  }
  const uint64_t tag = wc.wr_id & kTagMask;
  const uint32_t idx = static_cast<uint32_t>(wc.wr_id & ~kTagMask);
  if (tag == kTagSend) {
    Outgoing& o = sends_[idx];
    dev_->pool->release(o.staged);
    const bool close_now = o.close_after;
    o = Outgoing{};
    free_sends_.push_back(idx);
    if (close_now) fail("closed after a protocol error response", false);
    return;
  }
  if (tag == kTagRead) {
    std::shared_ptr<RequestImpl> req = std::move(reads_[idx]);
    free_reads_.push_back(idx);
    handler(std::move(req));
    return;
  }
  // A request.
  auto m = rdma::decode_control(std::span<const uint8_t>(recv_->at(idx), wc.byte_len),
                                proto::FrameKind::kRequest);
  if (!m.has_value()) {
    fail(m.error().message(), true);
    return;
  }
  if (outstanding_ >= recv_depth_) {
    fail("client sent more than " + std::to_string(recv_depth_) + " requests ahead (its credits)",
         true);
    return;
  }
  ++outstanding_;
  auto req = std::make_shared<RequestImpl>(shared_from_this(), *m);
  if (rdma::post_ring_recv(id_->qp, *recv_, idx, kTagRecv) != 0) {
    fail("ibv_post_recv: " + rdma::errno_text(errno), false);
    return;
  }
  if (req->source().len == 0) {
    handler(std::move(req));
    return;
  }
  if (!waiting_reads_.empty() || !post_read(req)) waiting_reads_.push_back(std::move(req));
}

// Reads the request bulk into pool memory. False when the pool (or a read slot) is busy.
bool ServerConn::post_read(const std::shared_ptr<RequestImpl>& req) {
  if (free_reads_.empty()) return false;
  auto b = dev_->pool->allocate(req->source().len);
  if (!b.has_value()) {
    req->reply(static_cast<uint32_t>(Code::kInternal), b.error().message(), {}, false);
    return true;
  }
  if (!b->has_value()) return false;
  req->bulk_buffer() = **b;
  const uint32_t slot = free_reads_.back();
  free_reads_.pop_back();
  reads_[slot] = req;
  ibv_sge sge{reinterpret_cast<uint64_t>(req->bulk_buffer().data), req->source().len,
              req->bulk_buffer().lkey};
  ibv_send_wr wr = rdma::make_send_wr(kTagRead | slot, &sge, IBV_WR_RDMA_READ, true, req->source().addr,
                                      req->source().rkey);
  ibv_send_wr* bad = nullptr;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0)
    fail("ibv_post_send (RDMA READ): " + rdma::errno_text(errno), false);
  return true;
}

void ServerConn::retry_reads(const std::function<void(std::shared_ptr<RdmaRequest>)>& handler) {
  (void)handler;
  while (!closed_thread_ && !waiting_reads_.empty()) {
    if (!post_read(waiting_reads_.front())) return;
    waiting_reads_.pop_front();
  }
}

bool ServerConn::has_stalled_work() {
  return !closed_thread_ && (!waiting_reads_.empty() || !stalled_.empty());
}

void ServerConn::flush_outgoing() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    while (!outgoing_.empty()) {
      stalled_.push_back(std::move(outgoing_.front()));
      outgoing_.pop_front();
    }
  }
  while (!closed_thread_ && !stalled_.empty() && !free_sends_.empty()) {
    Outgoing& o = stalled_.front();
    if (!o.unstaged.empty()) {
      auto b = dev_->pool->allocate(o.unstaged.size());
      if (b.has_value() && !b->has_value()) return;  // still busy: retried later
      if (!b.has_value()) {
        o.header.status = static_cast<uint32_t>(Code::kInternal);
        o.message = b.error().message().substr(
            0, std::min<size_t>(peer_ctrl_ - proto::kFrameHeaderSize, kMaxErrorText));
        o.header.message_len = static_cast<uint32_t>(o.message.size());
        o.header.bulk_len = 0;
      } else {
        o.staged = **b;
        std::memcpy(o.staged.data, o.unstaged.data(), o.unstaged.size());
      }
      o.unstaged = {};
    }
    const uint32_t slot = free_sends_.back();
    free_sends_.pop_back();
    sends_[slot] = std::move(o);
    stalled_.pop_front();
    Outgoing& s = sends_[slot];
    const size_t n = rdma::encode_control(
        s.header,
        bytes_of(s.message),
        {}, {}, std::span<uint8_t>(send_->at(slot), send_->bytes()));
    ibv_sge ctl{reinterpret_cast<uint64_t>(send_->at(slot)), static_cast<uint32_t>(n),
                send_->lkey()};
    ibv_send_wr send_wr = rdma::make_send_wr(kTagSend | slot, &ctl, IBV_WR_SEND, true);
    ibv_send_wr write_wr{};
    ibv_sge data{};
    ibv_send_wr* first = &send_wr;
    if (s.staged.valid() && s.header.bulk_len > 0) {
      data = ibv_sge{reinterpret_cast<uint64_t>(s.staged.data), s.header.bulk_len, s.staged.lkey};
      write_wr = rdma::make_send_wr(kTagSend | slot, &data, IBV_WR_RDMA_WRITE, false, s.dest.addr, s.dest.rkey);
      write_wr.next = &send_wr;
      first = &write_wr;
    }
    if (outstanding_ > 0) --outstanding_;  // the client may send its next request once this arrives
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(id_->qp, first, &bad) != 0) {
      fail("ibv_post_send (response): " + rdma::errno_text(errno), false);
      return;
    }
  }
}

void ServerConn::close() {
  if (closed_thread_) return;
  closed_thread_ = true;
  std::deque<Outgoing> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    dropped.swap(outgoing_);
  }
  // Before ESTABLISHED a disconnect request cannot be sent yet; established() sends it.
  if (connected_) rdma_disconnect(id_);
  if (qp_created_) rdma_destroy_qp(id_);  // no remote access to any pool buffer after this
  qp_created_ = false;
  for (auto& o : dropped) dev_->pool->release(o.staged);
  for (auto& o : stalled_) dev_->pool->release(o.staged);
  for (auto& o : sends_) dev_->pool->release(o.staged);
  stalled_.clear();
  sends_.clear();
  reads_.clear();  // their requests release their buffers when the last reference goes
  waiting_reads_.clear();
  if (cq_ != nullptr) ibv_destroy_cq(cq_);
  cq_ = nullptr;
  recv_.reset();
  send_.reset();
}

class ListenerImpl : public RdmaListener {
 public:
  ListenerImpl(RdmaServerOptions options, RdmaRequestHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        shared_(std::make_shared<Shared>()) {}

  ~ListenerImpl() override {
    stop();
    if (shared_->wake_fd >= 0) ::close(shared_->wake_fd);
  }

  Status init() {
    shared_->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (shared_->wake_fd < 0) return Status(Code::kInternal, "eventfd: " + rdma::errno_text(errno));
    const std::string where = "rdma " + options_.listen.to_string();
    sockaddr_storage addr{};
    PENSTOCK_RETURN_IF_ERROR(
        rdma::resolve_sockaddr(options_.listen, &addr).with_context("cannot listen on " + where));
    ec_ = rdma_create_event_channel();
    if (ec_ == nullptr)
      return Status(Code::kUnavailable, "cannot listen on " + where + ": no RDMA support (" +
                                            rdma::errno_text(errno) + ")");
    rdma::set_nonblocking(ec_->fd);
    if (rdma_create_id(ec_, &listen_id_, nullptr, RDMA_PS_TCP) != 0) {
      listen_id_ = nullptr;
      return Status(Code::kUnavailable,
                    "cannot listen on " + where + ": rdma_create_id: " + rdma::errno_text(errno));
    }
    if (rdma_bind_addr(listen_id_, reinterpret_cast<sockaddr*>(&addr)) != 0) {
      return Status(Code::kUnavailable,
                    "cannot listen on " + where + ": bind: " + rdma::errno_text(errno) +
                        " (is the port taken, or does no RDMA device serve this address?)");
    }
    if (rdma_listen(listen_id_, 128) != 0) {
      return Status(Code::kUnavailable,
                    "cannot listen on " + where + ": " + rdma::errno_text(errno));
    }
    port_ = ntohs(rdma_get_src_port(listen_id_));
    thread_ = std::thread([this] { loop(); });
    PENSTOCK_LOG(Info) << "RDMA listener on " << options_.listen.host << ":" << port_;
    return Status::ok();
  }

  uint16_t port() const override { return port_; }

  void stop() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    if (thread_.joinable()) {
      shared_->wake();
      thread_.join();
    }
    cleanup();
  }

 private:
  void cleanup() {
    for (auto& [id, conn] : conns_) {
      conn->close();
      rdma_destroy_id(id);
    }
    conns_.clear();
    if (listen_id_ != nullptr) rdma_destroy_id(listen_id_);
    listen_id_ = nullptr;
    devices_.clear();
    if (ec_ != nullptr) rdma_destroy_event_channel(ec_);
    ec_ = nullptr;
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stopped_;
  }

  void loop() {
    while (!stopping()) {
      std::vector<pollfd> fds;
      fds.push_back({shared_->wake_fd, POLLIN, 0});
      fds.push_back({ec_->fd, POLLIN, 0});
      for (auto& d : devices_) fds.push_back({d->comp->fd, POLLIN, 0});
      bool stalled = false;
      for (auto& [id, c] : conns_) stalled = stalled || c->has_stalled_work();
      ::poll(fds.data(), fds.size(), stalled ? kRetryMs : -1);
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        ssize_t n = read(shared_->wake_fd, &v, sizeof(v));
        (void)n;
      }
      if (fds[1].revents & POLLIN) handle_cm_events();
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!(fds[i].revents & POLLIN)) continue;
        ibv_comp_channel* comp = nullptr;
        for (auto& d : devices_) {
          if (d->comp->fd == fds[i].fd) comp = d->comp;
        }
        if (comp == nullptr) continue;
        ibv_cq* cq = nullptr;
        void* ctx = nullptr;
        while (ibv_get_cq_event(comp, &cq, &ctx) == 0) {
          ibv_ack_cq_events(cq, 1);
          ibv_req_notify_cq(cq, 0);
        }
      }
      // Drain every connection's queue (cheap when empty), then post replies and stalled reads.
      for (auto& [id, c] : conns_) {
        if (!c->closed_on_thread()) c->drain_cq(handler_);
        if (!c->closed_on_thread()) c->retry_reads(handler_);
        if (!c->closed_on_thread()) c->flush_outgoing();
        if (!c->closed_on_thread()) c->drain_cq(handler_);
      }
    }
  }

  std::shared_ptr<Device> device_for(ibv_context* verbs) {
    for (auto& d : devices_) {
      if (d->verbs == verbs) return d;
    }
    auto d = std::make_shared<Device>();
    d->verbs = verbs;
    d->pd = ibv_alloc_pd(verbs);
    if (d->pd == nullptr) return nullptr;
    d->comp = ibv_create_comp_channel(verbs);
    if (d->comp == nullptr) return nullptr;
    rdma::set_nonblocking(d->comp->fd);
    ibv_device_attr da{};
    if (ibv_query_device(verbs, &da) == 0) {
      d->max_rd_atom = std::max(1, std::min(da.max_qp_rd_atom, 16));
      d->max_init_rd_atom = std::max(1, std::min(da.max_qp_init_rd_atom, 16));
    }
    auto pool = BufferPool::create(d->pd, options_.pool_bytes, options_.slot_bytes);
    if (!pool.has_value()) {
      PENSTOCK_LOG(Error) << "RDMA listener: " << pool.error().to_string();
      return nullptr;
    }
    d->pool = std::move(pool).value();
    devices_.push_back(d);
    return d;
  }

  void handle_cm_events() {
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ec_, &ev) != 0) return;
      const rdma_cm_event_type type = ev->event;
      rdma_cm_id* id = ev->id;
      if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
        auto params = rdma::decode_connect_params(
            std::span<const uint8_t>(static_cast<const uint8_t*>(ev->param.conn.private_data),
                                     ev->param.conn.private_data_len));
        const uint8_t their_initiator = ev->param.conn.initiator_depth;
        const uint8_t their_responder = ev->param.conn.responder_resources;
        rdma_ack_cm_event(ev);
        accept(id, params, their_initiator, their_responder);
        continue;
      }
      rdma_ack_cm_event(ev);
      if (id == listen_id_) {
        if (type == RDMA_CM_EVENT_DEVICE_REMOVAL) device_removed();
        continue;
      }
      auto it = conns_.find(id);
      if (it == conns_.end()) continue;
      if (type == RDMA_CM_EVENT_ESTABLISHED) {
        it->second->established();
        continue;
      }
      // DISCONNECTED, TIMEWAIT_EXIT, DEVICE_REMOVAL, CONNECT_ERROR, UNREACHABLE, REJECTED.
      PENSTOCK_LOG(Debug) << "rdma connection from " << it->second->peer() << ": "
                          << rdma_event_str(type);
      it->second->close();
      conns_.erase(it);
      rdma_destroy_id(id);
    }
  }

  // The device under the listener is going away. The kernel (for rxe: no forced disassociation)
  // waits until every object on it is released, so release them all now: every connection, the
  // listener's id, and our per-device objects (the last request still being handled drops them).
  void device_removed() {
    PENSTOCK_LOG(Error) << "RDMA listener on port " << port_
                        << ": device removed; no more RDMA connections (TCP goes on)";
    for (auto& [id, conn] : conns_) {
      conn->close();
      rdma_destroy_id(id);
    }
    conns_.clear();
    devices_.clear();
    rdma_destroy_id(listen_id_);
    listen_id_ = nullptr;
  }

  void accept(rdma_cm_id* id, const Result<rdma::ConnectParams>& params, uint8_t their_initiator,
              uint8_t their_responder) {
    auto reject = [&](const std::string& why) {
      PENSTOCK_LOG(Warn) << "refusing rdma connection: " << why;
      rdma_reject(id, nullptr, 0);
      rdma_destroy_id(id);
    };
    if (!params.has_value()) return reject(params.error().message());
    if (conns_.size() >= options_.max_connections) {
      return reject(std::to_string(conns_.size()) + " connections open (max_connections)");
    }
    std::shared_ptr<Device> dev = device_for(id->verbs);
    if (dev == nullptr) return reject("cannot set up the device: " + rdma::errno_text(errno));
    auto conn = std::make_shared<ServerConn>(shared_, dev, id);
    conn->describe_peer();
    Status st = conn->setup(*params, options_);
    if (!st.is_ok()) {
      conn->close();
      return reject(st.to_string());
    }
    std::array<uint8_t, rdma::kConnectParamsSize> pdata{};
    rdma::encode_connect_params(
        rdma::ConnectParams{std::clamp<uint32_t>(options_.recv_depth, 1, rdma::kMaxRecvDepth),
                            std::clamp<uint32_t>(options_.control_bytes, rdma::kMinControlBytes,
                                                 rdma::kMaxControlBytes)},
        pdata);
    rdma_conn_param cp{};
    cp.private_data = pdata.data();
    cp.private_data_len = static_cast<uint8_t>(pdata.size());
    cp.responder_resources = static_cast<uint8_t>(std::min<int>(their_initiator, dev->max_rd_atom));
    cp.initiator_depth =
        static_cast<uint8_t>(std::min<int>(their_responder, dev->max_init_rd_atom));
    cp.retry_count = 7;
    cp.rnr_retry_count = 7;
    if (rdma_accept(id, &cp) != 0) {
      const std::string err = rdma::errno_text(errno);
      conn->close();
      PENSTOCK_LOG(Warn) << "rdma_accept failed: " << err;
      rdma_destroy_id(id);
      return;
    }
    conns_.emplace(id, std::move(conn));
  }

  const RdmaServerOptions options_;
  const RdmaRequestHandler handler_;
  std::shared_ptr<Shared> shared_;
  rdma_event_channel* ec_ = nullptr;
  rdma_cm_id* listen_id_ = nullptr;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;         // leaf
  bool stopped_ = false;  // guarded by mu_
  // Event-thread state (and stop() after the join).
  std::vector<std::shared_ptr<Device>> devices_;
  std::map<rdma_cm_id*, std::shared_ptr<ServerConn>> conns_;
};

}  // namespace

Result<std::unique_ptr<RdmaListener>> RdmaListener::start(const RdmaServerOptions& options,
                                                          RdmaRequestHandler handler) {
  auto l = std::make_unique<ListenerImpl>(options, std::move(handler));
  Status st = l->init();
  if (!st.is_ok()) {
    l->stop();
    return st;
  }
  return std::unique_ptr<RdmaListener>(std::move(l));
}

}  // namespace penstock::net
