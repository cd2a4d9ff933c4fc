// The client side of the RDMA transport: one queue pair per connection, driven by one thread.
//
// The connection thread owns every verbs object of its queue pair: it connects through rdma_cm,
// takes calls from the submit queue (filled by start_call() from any thread, guarded by mu_),
// stages bulk_out into the registered pool, SENDs the control message, and turns each received
// response into the caller's reply (copying the response bulk out of the pool into bulk_in). It
// sleeps in poll() on the completion channel, the rdma_cm channel and an eventfd (new calls,
// shutdown), with a timeout at the earliest call deadline; woken, it drains the completion queue in
// bursts.
//
// Buffer ownership: the caller's buffers are never registered: the peer only ever touches pool
// memory. So a call whose deadline passes is answered (kTimeout) at once; its window slot and
// staging stay reserved ("zombie") until the response arrives, because the server may still
// RDMA-WRITE into them. A zombie still unanswered kZombieGrace past its deadline means the server
// is stuck: the connection is closed (and every buffer goes away with the queue pair).
//
// Lock order: RdmaChannelImpl::mu_ before Connection::mu_. Callbacks never run under either lock.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
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
using rdma::kTagRecv;
using rdma::kTagSend;
constexpr auto kZombieGrace = std::chrono::seconds(5);
constexpr int kBurst = 32;

struct QueuedCall {
  uint64_t id = 0;
  OutgoingCall call;
  CallCallback done;
};

struct Slot {
  bool busy = false;
  bool zombie = false;  // answered with kTimeout; the slot waits for the late response
  uint64_t id = 0;
  CallCallback done;
  std::span<uint8_t> bulk_in;
  Clock::time_point deadline;
  BufferPool::Buffer out;
  BufferPool::Buffer in;
};

using Completion = std::pair<CallCallback, Result<CallReply>>;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(const Endpoint& server, const RdmaOptions& options)
      : server_(server), address_(server.to_string()), options_(options) {
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~Connection() {
    if (wake_fd_ >= 0) close(wake_fd_);
  }

  void start() {
    std::thread([self = shared_from_this()] { self->run(); }).detach();
  }

  bool is_closed() const { return closed_.load(std::memory_order_acquire); }

  // Queues a call. False (the call untouched) when the connection is closed.
  bool submit(uint64_t id, OutgoingCall& call, CallCallback& done) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_locked_) return false;
      queue_.push_back(QueuedCall{id, std::move(call), std::move(done)});
    }
    wake();
    return true;
  }

  void shutdown() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    wake();
  }

  // Waits until the connection is established or failed (bounded by the connect timeout).
  Status wait_connected() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return connect_done_; });
    return connect_status_;
  }

  // Waits until the thread released every verbs resource. REQUIRES: not on the connection thread.
  void wait_exited() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return exited_; });
  }
  bool on_own_thread() const { return std::this_thread::get_id() == thread_id_.load(); }

 private:
  void wake() {
    uint64_t one = 1;
    ssize_t n = write(wake_fd_, &one, sizeof(one));
    (void)n;
  }

  // ---- thread ----
  void run() {
    thread_id_.store(std::this_thread::get_id());
    Status st =
        wake_fd_ < 0 ? Status(Code::kInternal, "eventfd: " + rdma::errno_text(errno)) : connect();
    {
      std::lock_guard<std::mutex> lock(mu_);
      connect_status_ = st;
      connect_done_ = true;
    }
    cv_.notify_all();
    if (st.is_ok()) {
      loop();
    } else {
      PENSTOCK_LOG(Debug) << st.to_string();
      close_with(st);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      exited_ = true;
    }
    cv_.notify_all();
  }

  Status fail_connect(const std::string& what) {
    return Status(Code::kUnavailable, "cannot connect to rdma " + address_ + ": " + what);
  }

  // Waits for one rdma_cm event of type `want`; anything else (or the deadline) fails the connect.
  Status expect_event(rdma_cm_event_type want, Clock::time_point deadline,
                      rdma::ConnectParams* peer) {
    bool timed_out = false;
    std::string err;
    rdma_cm_event* ev = wait_connect_event(deadline, &timed_out, &err);
    if (ev == nullptr) {
      return fail_connect(timed_out ? "timed out after " +
                                          std::to_string(options_.connect_timeout.count()) + " ms"
                                    : err);
    }
    const rdma_cm_event_type got = ev->event;
    const int status = ev->status;
    Status result;
    if (got != want) {
      std::string why = rdma_event_str(got);
      if (got == RDMA_CM_EVENT_REJECTED) why += " (no RDMA listener on that port?)";
      if (got == RDMA_CM_EVENT_ADDR_ERROR || got == RDMA_CM_EVENT_ROUTE_ERROR) {
        why += " (no RDMA device reaches " + server_.host + ")";
      }
      if (status != 0) why += ", status " + std::to_string(status);
      result = fail_connect(why);
    } else if (peer != nullptr) {
      auto p = rdma::decode_connect_params(
          std::span<const uint8_t>(static_cast<const uint8_t*>(ev->param.conn.private_data),
                                   ev->param.conn.private_data_len));
      if (!p.has_value()) {
        result = Status(Code::kProtocol, "from rdma " + address_ + ": " + p.error().message());
      } else {
        *peer = *p;
      }
    }
    rdma_ack_cm_event(ev);
    return result;
  }

  // Like rdma::wait_cm_event, for the connect: while it waits, calls queued meanwhile whose
  // deadline passes are answered (kTimeout) at once rather than when the connect ends, which may
  // take the whole connect timeout; a destroyed channel ends the wait.
  rdma_cm_event* wait_connect_event(Clock::time_point deadline, bool* timed_out, std::string* err) {
    *timed_out = false;
    std::vector<Completion> done;
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ec_, &ev) == 0) return ev;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        *err = rdma::errno_text(errno);
        return nullptr;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        *timed_out = true;
        return nullptr;
      }
      expire_queued(now, done);
      run_callbacks(done);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (shutdown_) {
          *err = "the channel was destroyed while connecting";
          return nullptr;
        }
      }
      const auto until = std::min(deadline, earliest_queued_deadline());
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
      pollfd fds[2] = {{ec_->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
      ::poll(fds, 2, static_cast<int>(std::clamp<int64_t>(ms, 1, 1000)));
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        ssize_t n = read(wake_fd_, &v, sizeof(v));
        (void)n;
      }
    }
  }

  Status connect() {
    const Clock::time_point deadline = Clock::now() + options_.connect_timeout;
    const int timeout_ms = static_cast<int>(std::max<int64_t>(1, options_.connect_timeout.count()));
    sockaddr_storage addr{};
    PENSTOCK_RETURN_IF_ERROR(rdma::resolve_sockaddr(server_, &addr));
    ec_ = rdma_create_event_channel();
    if (ec_ == nullptr)
      return fail_connect("rdma_create_event_channel: " + rdma::errno_text(errno));
    rdma::set_nonblocking(ec_->fd);
    if (rdma_create_id(ec_, &id_, nullptr, RDMA_PS_TCP) != 0) {
      id_ = nullptr;
      return fail_connect("rdma_create_id: " + rdma::errno_text(errno));
    }
    if (rdma_resolve_addr(id_, nullptr, reinterpret_cast<sockaddr*>(&addr), timeout_ms) != 0) {
      return fail_connect("rdma_resolve_addr: " + rdma::errno_text(errno));
    }
    PENSTOCK_RETURN_IF_ERROR(expect_event(RDMA_CM_EVENT_ADDR_RESOLVED, deadline, nullptr));
    if (rdma_resolve_route(id_, timeout_ms) != 0)
      return fail_connect("rdma_resolve_route: " + rdma::errno_text(errno));
    PENSTOCK_RETURN_IF_ERROR(expect_event(RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, nullptr));

    const uint32_t window = std::clamp<uint32_t>(options_.window, 1, rdma::kMaxRecvDepth);
    const uint32_t ctrl = std::clamp<uint32_t>(options_.control_bytes, rdma::kMinControlBytes,
                                               rdma::kMaxControlBytes);
    pd_ = ibv_alloc_pd(id_->verbs);
    if (pd_ == nullptr) return fail_connect("ibv_alloc_pd: " + rdma::errno_text(errno));
    comp_ = ibv_create_comp_channel(id_->verbs);
    if (comp_ == nullptr)
      return fail_connect("ibv_create_comp_channel: " + rdma::errno_text(errno));
    rdma::set_nonblocking(comp_->fd);
    cq_ = ibv_create_cq(id_->verbs, static_cast<int>(3 * window + 8), nullptr, comp_, 0);
    if (cq_ == nullptr) return fail_connect("ibv_create_cq: " + rdma::errno_text(errno));
    if (ibv_req_notify_cq(cq_, 0) != 0)
      return fail_connect("ibv_req_notify_cq: " + rdma::errno_text(errno));
    ibv_qp_init_attr qa{};
    qa.send_cq = cq_;
    qa.recv_cq = cq_;
    qa.qp_type = IBV_QPT_RC;
    qa.cap.max_send_wr = 2 * window + 4;
    qa.cap.max_recv_wr = window;
    qa.cap.max_send_sge = 1;
    qa.cap.max_recv_sge = 1;
    if (rdma_create_qp(id_, pd_, &qa) != 0)
      return fail_connect("rdma_create_qp: " + rdma::errno_text(errno));
    qp_created_ = true;

    auto recv = Ring::create(pd_, window, ctrl);
    if (!recv.has_value()) return fail_connect(recv.error().message());
    recv_ = std::move(recv).value();
    auto send = Ring::create(pd_, window, ctrl);
    if (!send.has_value()) return fail_connect(send.error().message());
    send_ = std::move(send).value();
    auto pool = BufferPool::create(pd_, options_.pool_bytes, options_.slot_bytes);
    if (!pool.has_value()) return fail_connect(pool.error().message());
    pool_ = std::move(pool).value();
    for (uint32_t i = 0; i < window; ++i) {
      if (rdma::post_ring_recv(id_->qp, *recv_, i, kTagRecv) != 0) {
        return fail_connect("ibv_post_recv: " + rdma::errno_text(errno));
      }
    }

    ibv_device_attr da{};
    if (ibv_query_device(id_->verbs, &da) != 0)
      return fail_connect("ibv_query_device: " + rdma::errno_text(errno));
    std::array<uint8_t, rdma::kConnectParamsSize> pdata{};
    rdma::encode_connect_params(rdma::ConnectParams{window, ctrl}, pdata);
    rdma_conn_param cp{};
    cp.private_data = pdata.data();
    cp.private_data_len = static_cast<uint8_t>(pdata.size());
    cp.responder_resources = static_cast<uint8_t>(std::min(da.max_qp_rd_atom, 16));
    cp.initiator_depth = static_cast<uint8_t>(std::min(da.max_qp_init_rd_atom, 16));
    cp.retry_count = 7;
    cp.rnr_retry_count = 7;
    if (rdma_connect(id_, &cp) != 0)
      return fail_connect("rdma_connect: " + rdma::errno_text(errno));
    rdma::ConnectParams peer;
    PENSTOCK_RETURN_IF_ERROR(expect_event(RDMA_CM_EVENT_ESTABLISHED, deadline, &peer));
    connected_ = true;
    window_ = std::min(window, peer.recv_depth);
    max_send_ = std::min(ctrl, peer.control_bytes);
    slots_.resize(window_);
    for (uint32_t i = 0; i < window_; ++i) free_slots_.push_back(window_ - 1 - i);
    PENSTOCK_LOG(Debug) << "rdma connection to " << address_ << " established: window " << window_
                        << ", control buffers " << max_send_ << " bytes";
    return Status::ok();
  }

  void loop() {
    std::vector<Completion> done;
    while (!is_closed()) {
      bool stop = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop = shutdown_;
      }
      if (stop) {
        close_with(Status(Code::kCancelled, "channel to rdma " + address_ + " destroyed"));
        return;
      }
      pump(done);
      drain_cq(done);
      pump(done);  // responses drained above freed window slots and pool space
      sweep(done);
      run_callbacks(done);
      if (is_closed()) return;

      int timeout = next_timeout_ms();
      pollfd fds[3] = {{wake_fd_, POLLIN, 0}, {comp_->fd, POLLIN, 0}, {ec_->fd, POLLIN, 0}};
      ::poll(fds, 3, timeout);
      if (fds[0].revents & POLLIN) {
        uint64_t v;
        ssize_t n = read(wake_fd_, &v, sizeof(v));
        (void)n;
      }
      if (fds[1].revents & POLLIN) {
        ibv_cq* ev_cq = nullptr;
        void* ctx = nullptr;
        while (ibv_get_cq_event(comp_, &ev_cq, &ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
        ibv_req_notify_cq(cq_, 0);  // then drain_cq() at the top of the loop catches what raced it
      }
      if (fds[2].revents & POLLIN) handle_cm_events();
    }
  }

  void run_callbacks(std::vector<Completion>& done) {
    for (auto& [cb, r] : done) cb(std::move(r));
    done.clear();
  }

  // Moves queued calls onto the wire while window slots and pool space last.
  void pump(std::vector<Completion>& done) {
    while (!free_slots_.empty() && !is_closed()) {
      QueuedCall* front = nullptr;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (queue_.empty()) return;
        front = &queue_.front();  // only this thread pops, so the element stays put
      }
      OutgoingCall& call = front->call;
      const auto pop = [&]() {
        QueuedCall q;
        std::lock_guard<std::mutex> lock(mu_);
        q = std::move(queue_.front());
        queue_.pop_front();
        return q;
      };
      if (Clock::now() >= call.deadline) {
        QueuedCall q = pop();
        done.emplace_back(std::move(q.done), timed_out());
        continue;
      }
      if (call.message.size() > proto::kMaxMessageBytes ||
          call.bulk_out.size() > proto::kMaxBulkBytes) {
        QueuedCall q = pop();
        done.emplace_back(
            std::move(q.done),
            Status(Code::kInvalid, "request to rdma " + address_ +
                                       " is over the frame limits (message " +
                                       std::to_string(q.call.message.size()) + " bytes, bulk " +
                                       std::to_string(q.call.bulk_out.size()) + " bytes)"));
        continue;
      }
      if (rdma::control_size(proto::FrameKind::kRequest, call.message.size()) > max_send_) {
        QueuedCall q = pop();
        done.emplace_back(
            std::move(q.done),
            Status(Code::kInvalid, "request message of " + std::to_string(q.call.message.size()) +
                                       " bytes does not fit an RDMA control buffer of " +
                                       std::to_string(max_send_) + " bytes (to rdma " + address_ +
                                       ")"));
        continue;
      }
      BufferPool::Buffer out, in;
      Status alloc_error;
      bool busy = false;
      const bool idle =
          free_slots_.size() == slots_.size();  // nothing in flight will free the pool
      if (!call.bulk_out.empty()) {
        auto b = pool_->allocate(call.bulk_out.size(), idle);
        if (!b.has_value())
          alloc_error = b.error();
        else if (!b->has_value())
          busy = true;
        else
          out = **b;
      }
      const size_t in_len = std::min<size_t>(call.bulk_in.size(), proto::kMaxBulkBytes);
      if (alloc_error.is_ok() && !busy && in_len > 0) {
        auto b = pool_->allocate(in_len, idle);
        if (!b.has_value())
          alloc_error = b.error();
        else if (!b->has_value())
          busy = true;
        else
          in = **b;
      }
      if (!alloc_error.is_ok() || busy) {
        pool_->release(out);
        pool_->release(in);
        if (busy) return;  // wait for a response to free pool space
        QueuedCall q = pop();
        done.emplace_back(std::move(q.done), alloc_error);
        continue;
      }
      QueuedCall q = pop();
      const uint32_t s = free_slots_.back();
      free_slots_.pop_back();
      if (!q.call.bulk_out.empty())
        std::memcpy(out.data, q.call.bulk_out.data(), q.call.bulk_out.size());
      proto::FrameHeader h;
      h.kind = proto::FrameKind::kRequest;
      h.service = q.call.service;
      h.method = q.call.method;
      h.request_id = q.id;
      h.message_len = static_cast<uint32_t>(q.call.message.size());
      h.bulk_len = static_cast<uint32_t>(q.call.bulk_out.size());
      RemoteBuffer rout, rin;
      if (out.valid())
        rout = RemoteBuffer{reinterpret_cast<uint64_t>(out.data), out.rkey, h.bulk_len};
      if (in.valid())
        rin = RemoteBuffer{reinterpret_cast<uint64_t>(in.data), in.rkey,
                           static_cast<uint32_t>(in_len)};
      const size_t n = rdma::encode_control(
          h,
          bytes_of(q.call.message),
          rout, rin, std::span<uint8_t>(send_->at(s), send_->bytes()));
      Slot& slot = slots_[s];
      slot.busy = true;
      slot.zombie = false;
      slot.id = q.id;
      slot.done = std::move(q.done);
      slot.bulk_in = q.call.bulk_in;
      slot.deadline = q.call.deadline;
      slot.out = out;
      slot.in = in;
      by_id_[q.id] = s;
      ibv_sge sge{reinterpret_cast<uint64_t>(send_->at(s)), static_cast<uint32_t>(n),
                  send_->lkey()};
      ibv_send_wr wr = rdma::make_send_wr(kTagSend | s, &sge, IBV_WR_SEND, true);
      ibv_send_wr* bad = nullptr;
      if (ibv_post_send(id_->qp, &wr, &bad) != 0) {
        close_with(Status(
            Code::kUnavailable,
            "connection to rdma " + address_ + " lost: ibv_post_send: " + rdma::errno_text(errno)));
        return;
      }
    }
  }

  void drain_cq(std::vector<Completion>& done) {
    ibv_wc wc[kBurst];
    while (!is_closed()) {
      int n = ibv_poll_cq(cq_, kBurst, wc);
      if (n < 0) {
        close_with(Status(Code::kUnavailable,
                          "connection to rdma " + address_ + " lost: ibv_poll_cq failed"));
        return;
      }
      if (n == 0) return;
      for (int i = 0; i < n && !is_closed(); ++i) on_completion(wc[i], done);
      run_callbacks(done);
    }
  }

  void on_completion(const ibv_wc& wc, std::vector<Completion>& done) {
    if (wc.status != IBV_WC_SUCCESS) {
      close_with(Status(Code::kUnavailable, "connection to rdma " + address_ +
                                                " lost: " + ibv_wc_status_str(wc.status) +
                                                " (peer gone or queue pair error)"));
      return;
    }
    if ((wc.wr_id & kTagMask) != kTagRecv) return;  // a SEND completed: nothing to free
    const uint32_t idx = static_cast<uint32_t>(wc.wr_id & ~kTagMask);
    auto msg = rdma::decode_control(std::span<const uint8_t>(recv_->at(idx), wc.byte_len),
                                    proto::FrameKind::kResponse);
    if (!msg.has_value()) {
      close_with(protocol(msg.error().message()));
      return;
    }
    auto it = by_id_.find(msg->header.request_id);
    if (it == by_id_.end()) {
      close_with(protocol("response to request " + std::to_string(msg->header.request_id) +
                          ", which is not in flight"));
      return;
    }
    const uint32_t s = it->second;
    Slot& slot = slots_[s];
    Result<CallReply> reply = CallReply{};
    if (msg->header.status != 0) {
      reply = Status(
          static_cast<Code>(msg->header.status),
          std::string(reinterpret_cast<const char*>(msg->message.data()), msg->message.size()));
    } else {
      const uint32_t bulk_len = msg->header.bulk_len;
      if (bulk_len > (slot.in.valid() ? slot.in.len : 0)) {
        close_with(protocol("response to request " + std::to_string(slot.id) + " carries " +
                            std::to_string(bulk_len) +
                            " bulk bytes, more than the caller's buffer holds"));
        return;
      }
      if (bulk_len > 0 && !slot.zombie) std::memcpy(slot.bulk_in.data(), slot.in.data, bulk_len);
      reply = CallReply{
          std::string(reinterpret_cast<const char*>(msg->message.data()), msg->message.size()),
          bulk_len};
    }
    // The buffer goes back before the slot frees: the server may answer the next request at once.
    if (rdma::post_ring_recv(id_->qp, *recv_, idx, kTagRecv) != 0) {
      close_with(Status(
          Code::kUnavailable,
          "connection to rdma " + address_ + " lost: ibv_post_recv: " + rdma::errno_text(errno)));
      return;
    }
    by_id_.erase(it);
    if (!slot.zombie) done.emplace_back(std::move(slot.done), std::move(reply));
    free_slot(s);
  }

  void free_slot(uint32_t s) {
    Slot& slot = slots_[s];
    pool_->release(slot.out);
    pool_->release(slot.in);
    slot.busy = false;
    slot.zombie = false;
    slot.done = nullptr;
    slot.bulk_in = {};
    free_slots_.push_back(s);
  }

  void sweep(std::vector<Completion>& done) {
    if (is_closed()) return;
    const auto now = Clock::now();
    expire_queued(now, done);
    bool stuck = false;
    for (Slot& slot : slots_) {
      if (!slot.busy || now < slot.deadline) continue;
      if (!slot.zombie) {
        slot.zombie = true;
        done.emplace_back(std::move(slot.done), timed_out());
        slot.done = nullptr;
      } else if (now >= slot.deadline + kZombieGrace) {
        stuck = true;
      }
    }
    if (stuck) {
      run_callbacks(done);
      close_with(Status(Code::kUnavailable,
                        "connection to rdma " + address_ + " stalled past a call deadline"));
    }
  }

  // Answers (kTimeout) the queued calls whose deadline passed.
  void expire_queued(Clock::time_point now, std::vector<Completion>& done) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (now >= it->call.deadline) {
        done.emplace_back(std::move(it->done), timed_out());
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
  }

  Clock::time_point earliest_queued_deadline() {
    auto earliest = Clock::time_point::max();
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& q : queue_) earliest = std::min(earliest, q.call.deadline);
    return earliest;
  }

  int next_timeout_ms() {
    auto earliest = earliest_queued_deadline();
    for (const Slot& slot : slots_) {
      if (!slot.busy) continue;
      earliest = std::min(earliest, slot.zombie ? slot.deadline + kZombieGrace : slot.deadline);
    }
    if (earliest == Clock::time_point::max()) return -1;
    auto ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(earliest - Clock::now()).count() + 1;
    return static_cast<int>(std::clamp<int64_t>(ms, 0, 60000));
  }

  void handle_cm_events() {
    for (;;) {
      rdma_cm_event* ev = nullptr;
      if (rdma_get_cm_event(ec_, &ev) != 0) return;
      const rdma_cm_event_type type = ev->event;
      rdma_ack_cm_event(ev);
      if (type == RDMA_CM_EVENT_DISCONNECTED || type == RDMA_CM_EVENT_DEVICE_REMOVAL ||
          type == RDMA_CM_EVENT_TIMEWAIT_EXIT || type == RDMA_CM_EVENT_CONNECT_ERROR) {
        close_with(Status(Code::kUnavailable,
                          "connection to rdma " + address_ + " lost: " + rdma_event_str(type)));
        return;
      }
    }
  }

  // Fails every call (overdue ones with kTimeout, the rest with `why`) and releases every verbs
  // resource. Connection thread only.
  void close_with(const Status& why) {
    std::deque<QueuedCall> queued;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_locked_) return;
      closed_locked_ = true;
      closed_.store(true, std::memory_order_release);
      queued.swap(queue_);
    }
    if (why.code() == Code::kProtocol) {
      PENSTOCK_LOG(Warn) << "closing rdma connection: " << why.to_string();
    }
    const auto now = Clock::now();
    std::vector<Completion> done;
    for (auto& q : queued) {
      done.emplace_back(std::move(q.done), now >= q.call.deadline ? Result<CallReply>(timed_out())
                                                                  : Result<CallReply>(why));
    }
    for (Slot& slot : slots_) {
      if (slot.busy && !slot.zombie) {
        done.emplace_back(std::move(slot.done), now >= slot.deadline
                                                    ? Result<CallReply>(timed_out())
                                                    : Result<CallReply>(why));
      }
    }
    teardown();
    run_callbacks(done);
  }

  void teardown() {
    if (id_ != nullptr && connected_) rdma_disconnect(id_);
    if (qp_created_) rdma_destroy_qp(id_);  // no more remote access to any buffer after this
    qp_created_ = false;
    for (Slot& slot : slots_) {
      if (pool_) {
        pool_->release(slot.out);
        pool_->release(slot.in);
      }
      slot = Slot{};
    }
    slots_.clear();
    free_slots_.clear();
    by_id_.clear();
    if (cq_ != nullptr) ibv_destroy_cq(cq_);
    cq_ = nullptr;
    if (comp_ != nullptr) ibv_destroy_comp_channel(comp_);
    comp_ = nullptr;
    pool_.reset();
    recv_.reset();
    send_.reset();
    if (pd_ != nullptr) ibv_dealloc_pd(pd_);
    pd_ = nullptr;
    if (id_ != nullptr) rdma_destroy_id(id_);
    id_ = nullptr;
    if (ec_ != nullptr) rdma_destroy_event_channel(ec_);
    ec_ = nullptr;
  }

  Status protocol(const std::string& what) const {
    return Status(Code::kProtocol, "from rdma " + address_ + ": " + what);
  }
  Status timed_out() const {
    return Status(Code::kTimeout, "no response from rdma " + address_ + " before the deadline");
  }

  const Endpoint server_;
  const std::string address_;
  const RdmaOptions options_;
  int wake_fd_ = -1;
  std::atomic<bool> closed_{false};
  std::atomic<std::thread::id> thread_id_{};

  std::mutex mu_;  // after RdmaChannelImpl::mu_
  std::condition_variable cv_;
  bool closed_locked_ = false;    // guarded by mu_ (mirrored in closed_)
  bool shutdown_ = false;         // guarded by mu_
  bool connect_done_ = false;     // guarded by mu_
  bool exited_ = false;           // guarded by mu_
  Status connect_status_;         // guarded by mu_
  std::deque<QueuedCall> queue_;  // guarded by mu_

  // Connection-thread state.
  rdma_event_channel* ec_ = nullptr;
  rdma_cm_id* id_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* comp_ = nullptr;
  ibv_cq* cq_ = nullptr;
  bool qp_created_ = false;
  bool connected_ = false;
  std::unique_ptr<Ring> recv_;
  std::unique_ptr<Ring> send_;
  std::unique_ptr<BufferPool> pool_;
  uint32_t window_ = 0;
  uint32_t max_send_ = 0;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  std::unordered_map<uint64_t, uint32_t> by_id_;
};

class RdmaChannelImpl : public RdmaChannel {
 public:
  RdmaChannelImpl(Endpoint server, RdmaOptions options)
      : server_(std::move(server)), options_(options) {}

  ~RdmaChannelImpl() override {
    std::vector<std::shared_ptr<Connection>> all;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all = std::move(retired_);
      if (current_) all.push_back(current_);
      current_.reset();
    }
    for (auto& c : all) c->shutdown();
    for (auto& c : all) {
      if (!c->on_own_thread()) c->wait_exited();
    }
  }

  void start_call(OutgoingCall call, CallCallback done) override {
    // Over-limit calls are failed by the connection thread (callbacks never run on the caller's).
    const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    for (;;) {
      std::shared_ptr<Connection> conn = current();
      if (conn->submit(id, call, done)) return;
      // Closed between current() and submit(): the next current() replaces it.
    }
  }

  Status connect_now() override { return current()->wait_connected(); }

  std::string describe() const override { return "rdma " + server_.to_string(); }

 private:
  std::shared_ptr<Connection> current() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_ || current_->is_closed()) {
      if (current_) retired_.push_back(std::move(current_));
      // Forget retired connections whose thread already let go of everything.
      retired_.erase(std::remove_if(retired_.begin(), retired_.end(),
                                    [](const std::shared_ptr<Connection>& c) {
                                      return c.use_count() == 1 && c->is_closed();
                                    }),
                     retired_.end());
      current_ = std::make_shared<Connection>(server_, options_);
      current_->start();
    }
    return current_;
  }

  const Endpoint server_;
  const RdmaOptions options_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;                                     // before Connection::mu_
  std::shared_ptr<Connection> current_;               // guarded by mu_
  std::vector<std::shared_ptr<Connection>> retired_;  // guarded by mu_
};

}  // namespace

std::shared_ptr<RdmaChannel> make_rdma_channel(Endpoint server, RdmaOptions options) {
  return std::make_shared<RdmaChannelImpl>(std::move(server), options);
}

}  // namespace penstock::net
