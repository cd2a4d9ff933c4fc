// The TCP channel (Boost.Asio): K connections per server, many calls in flight on each, matched by
// request id.
//
// Per connection, everything that touches the socket runs on one strand: the connect, the writer
// (frames gathered header + message + bulk_out into one scatter/gather write, up to kMaxBatch
// frames per write), the reader coroutine and the deadline sweep. The pending-call table and the
// write queue are guarded by Connection::mu_ because start_call() inserts from any thread.
//
// Buffer ownership rule: a caller may free bulk_out/bulk_in as soon as its callback ran. So a call is
// never completed while an I/O operation may still touch its buffers: the sweep skips calls marked
// in_write (their frame is inside the current async_write) or receiving (their bulk is being read
// into bulk_in). Such a call completes when its operation ends (with the response when that was the
// read, with kTimeout at the next sweep when it was the write); if it is still stuck kStallGrace
// past its deadline, the connection is closed, which aborts the operation synchronously on the
// strand, and the call completes with kTimeout. A response
// whose call is gone (timed out) has its bulk read into a scratch buffer and dropped. A response
// that arrives while its own request is still being written is held until the write completed.
// A server that stops in the middle of a frame (part of a header or message sent, the rest never)
// leaves every later response on this socket behind that frame: once a call expired while the
// reader waited inside a frame and no byte of it came for kStallGrace, the connection is closed,
// so later calls get a fresh one instead of timing out one after another (as a Lustre import
// reconnects after a timeout). A server that answers nothing at all keeps its connection.
//
// Inline send: a small request (kInlineSendMax) submitted while the connection is idle (connected,
// nothing queued, no write in progress) is written by the calling thread itself (send_now.h) under
// mu_, instead of being handed to the I/O thread. That saves a thread
// wake-up per call, which on a VM costs as much as the round trip itself (~20 µs each way between
// cores here). Whoever writes holds the wire (wire_busy_); the rest of a partial inline write is
// finished by the strand's writer like any batch. The socket is closed only under mu_'s
// closed_locked_, so an inline sender never writes to a closed (or reused) descriptor.
//
// Lock order: TcpChannel::mu_ before Connection::mu_. Callbacks never run under either lock.
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "common/base/backoff.h"
#include "common/base/log.h"
#include "common/net/tcp/blocking_call.h"
#include "common/net/tcp/send_now.h"
#include "common/net/transport.h"
#include "common/proto/frame.h"

namespace penstock::net {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Strand = asio::strand<asio::io_context::executor_type>;

constexpr size_t kMaxBatch = 64;                         // frames per gathered write
constexpr auto kSweepPeriod = std::chrono::milliseconds(5);  // deadline resolution
// While the server refuses connections (a restart), calls wait for it this way.
constexpr auto kRefusedFirstPause = std::chrono::milliseconds(5);
constexpr auto kRefusedMostPause = std::chrono::milliseconds(200);
constexpr size_t kScratchBytes = 64 << 10;               // discarding late bulk
// The largest request (header + message + bulk) a submitting thread writes itself (see above):
// metadata calls and small data calls; larger bulk goes through the I/O thread, which overlaps it.
constexpr size_t kInlineSendMax = 64 << 10;
// How long past its deadline a call may wait for the write or bulk read it is part of before the
// connection is declared stalled and closed.
constexpr auto kStallGrace = std::chrono::seconds(1);
// How long a channel makes no new blocking connection after the server refused one.
constexpr auto kRefusedPause = std::chrono::seconds(10);

// Shared by a channel and its connections: whether calls wait while the server refuses connections
// (TcpOptions::wait_while_refused, until stop_waiting_while_refused()), and whether a connect was
// refused with none made since, so that an outage is logged once, not once per connection.
struct RefusedState {
  explicit RefusedState(bool wait_while_refused) : wait(wait_while_refused) {}

  void note_refused(const std::string& server) {
    if (!refused_since.exchange(true)) {
      PENSTOCK_LOG(Warn) << server << " refuses connections (restarting?); calls to it wait for it until their deadline";
    }
  }
  void note_accepted(const std::string& server) {
    if (refused_since.exchange(false)) {
      PENSTOCK_LOG(Info) << server << " accepts connections again";
    }
  }

  std::atomic<bool> wait;
  std::atomic<bool> refused_since{false};
};

struct Pending {
  CallCallback done;
  std::span<uint8_t> bulk_in;
  Clock::time_point deadline;
  bool in_write = false;   // its frame is part of the async_write in progress
  bool receiving = false;  // its response bulk is being read into bulk_in
  // A response that arrived while the request was still being written (only a misbehaving server
  // answers before it read the whole request): held until the write no longer uses bulk_out.
  std::optional<Result<CallReply>> early;
};

struct WriteItem {
  uint64_t id = 0;
  std::array<uint8_t, proto::kFrameHeaderSize> header{};
  std::string message;
  std::span<const uint8_t> bulk_out;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(asio::io_context& io, const Endpoint& server, const TcpOptions& options,
             std::shared_ptr<RefusedState> refused)
      : strand_(asio::make_strand(io)),
        socket_(strand_),
        resolver_(strand_),
        connect_timer_(strand_),
        retry_timer_(strand_),
        sweep_timer_(strand_),
        server_(server),
        address_(server.to_string()),
        options_(options),
        refused_(std::move(refused)) {}

  bool is_closed() const { return closed_.load(std::memory_order_acquire); }

  // Queues a call. False (the call untouched) when the connection is already closed.
  bool submit(uint64_t id, OutgoingCall& call, CallCallback& done) {
    bool kick = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_locked_) return false;
      WriteItem item;
      item.id = id;
      item.header = proto::encode_request_header(call.service, call.method, id, static_cast<uint32_t>(call.message.size()),
                                                 static_cast<uint32_t>(call.bulk_out.size()));
      item.message = std::move(call.message);
      item.bulk_out = call.bulk_out;
      earliest_deadline_ = std::min(earliest_deadline_, call.deadline);
      auto& pending = pending_.emplace(id, Pending{std::move(done), call.bulk_in, call.deadline}).first->second;
      if (connected_locked_ && !wire_busy_ && queue_.empty() &&
          kFrameBytes(item) <= kInlineSendMax) {
        send_inline_locked(std::move(item), pending);
        return true;
      }
      queue_.push_back(std::move(item));
      if (!kick_posted_) kick = kick_posted_ = true;
    }
    if (kick) asio::post(strand_, [self = shared_from_this()] { self->kick(); });
    return true;
  }

  // Begins connecting. Call once, after the first submit.
  void start() {
    asio::post(strand_, [self = shared_from_this()] { self->do_connect(); });
  }

  // Closes the connection, failing its calls with `why`. Safe from any thread.
  void shutdown(Status why) {
    asio::post(strand_, [self = shared_from_this(), why = std::move(why)] { self->close_with(why); });
  }

 private:
  // ---- connect (strand) ----
  void do_connect() {
    if (is_closed()) return;
    // A connect refused while the server restarts is made again (wait_or_close_refused): an
    // expiry of an earlier attempt's timer, queued before it was cancelled, must not cut this one.
    const uint64_t attempt = ++connect_attempt_;
    connect_timed_out_ = false;
    connect_timer_.expires_after(options_.connect_timeout);
    connect_timer_.async_wait([self = shared_from_this(), attempt](error_code ec) {
      if (ec || attempt != self->connect_attempt_ || self->connected_ || self->is_closed()) return;
      self->connect_timed_out_ = true;
      error_code ignored;
      self->resolver_.cancel();
      self->socket_.close(ignored);
    });
    kick_sweep();
    error_code ec;
    auto addr = asio::ip::make_address(server_.host, ec);
    if (!ec) {
      tcp::endpoint ep(addr, server_.port);
      socket_.async_connect(ep, [self = shared_from_this()](error_code cec) { self->on_connected(cec); });
      return;
    }
    resolver_.async_resolve(server_.host, std::to_string(server_.port),
                            [self = shared_from_this()](error_code rec, tcp::resolver::results_type results) {
                              if (rec) {
                                self->on_connected(rec);
                                return;
                              }
                              asio::async_connect(self->socket_, results,
                                                  [self](error_code cec, const tcp::endpoint&) { self->on_connected(cec); });
                            });
  }

  void on_connected(error_code ec) {
    if (is_closed()) return;
    if (ec) {
      if (ec == asio::error::connection_refused && !connect_timed_out_ && refused_->wait.load()) {
        wait_or_close_refused(ec);
        return;
      }
      std::string reason = connect_timed_out_
                               ? "timed out after " + std::to_string(options_.connect_timeout.count()) + " ms"
                               : ec.message();
      close_with(Status(Code::kUnavailable, "cannot connect to " + address_ + ": " + reason));
      return;
    }
    connected_ = true;
    waiting_refused_ = false;
    refused_->note_accepted(address_);
    connect_timer_.cancel();
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);
    asio::co_spawn(strand_, read_loop(shared_from_this()), asio::detached);
    {
      std::lock_guard<std::mutex> lock(mu_);
      connected_locked_ = true;
    }
    do_write();
  }

  // The server refused the connect (nothing listens: a restart) and calls may wait for it. While
  // a pending call has time left, connects again after a pause (5 ms, doubling up to 200 ms, the
  // last one cut to end at the latest deadline): the requests were never sent, so they may go later
  // whatever they do; calls whose deadline passes meanwhile fail with refused_status(). Otherwise
  // closes, in the same critical section that found no call waiting, so none can slip in between.
  void wait_or_close_refused(error_code ec) {
    const auto now = Clock::now();
    auto latest = Clock::time_point::min();
    std::unordered_map<uint64_t, Pending> failed;
    bool give_up = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [id, p] : pending_) latest = std::max(latest, p.deadline);
      give_up = latest <= now + std::chrono::milliseconds(1);
      if (give_up) failed = mark_closed_locked();
    }
    if (give_up) {
      finish_close(std::move(failed), Status(Code::kUnavailable, "cannot connect to " + address_ + ": " + ec.message()));
      return;
    }
    const auto pause = std::min<Clock::duration>(refused_backoff_.pause(), latest - now);
    refused_backoff_.grow();
    refused_->note_refused(address_);
    waiting_refused_ = true;
    connect_timer_.cancel();
    error_code ignored;
    socket_.close(ignored);
    retry_timer_.expires_after(pause);
    retry_timer_.async_wait([self = shared_from_this()](error_code tec) {
      if (!tec && !self->is_closed()) self->do_connect();
    });
  }

  // ---- inline send (the submitting thread, under mu_) ----
  static size_t kFrameBytes(const WriteItem& item) {
    return item.header.size() + item.message.size() + item.bulk_out.size();
  }

  static std::vector<iovec> frame_parts(WriteItem& item) {
    return {iovec{item.header.data(), item.header.size()}, iovec{item.message.data(), item.message.size()},
            iovec{const_cast<uint8_t*>(item.bulk_out.data()), item.bulk_out.size()}};
  }

  // Writes `item` (its call already in pending_) from this thread (send_now). A partial write
  // keeps the wire and hands the rest to the strand; an error closes the connection there, which
  // fails the call. REQUIRES: mu_ held, connected, wire idle, queue empty.
  void send_inline_locked(WriteItem item, Pending& pending) {
    const SendNow r = send_now(socket_.native_handle(), frame_parts(item));
    if (r.error != 0) {
      const error_code ec(r.error, boost::system::system_category());
      asio::post(strand_, [self = shared_from_this(), ec] { self->close_with(self->lost(ec)); });
      return;
    }
    ensure_sweep_locked();
    if (r.sent == kFrameBytes(item)) return;  // no response can have come: the reader needs mu_
    wire_busy_ = true;  // until the strand wrote the rest
    pending.in_write = true;
    asio::post(strand_, [self = shared_from_this(), item = std::move(item), sent = r.sent]() mutable {
      self->finish_inline(std::move(item), sent);
    });
  }

  // ---- writer (strand) ----
  // The rest of a partial inline write, `sent` bytes of `item` already on the wire.
  void finish_inline(WriteItem item, size_t sent) {
    if (is_closed()) return;  // close_with() failed the call
    batch_.clear();
    buffers_.clear();
    batch_.push_back(std::move(item));
    for (const iovec& part : unsent_rest(frame_parts(batch_.front()), sent)) {
      buffers_.emplace_back(part.iov_base, part.iov_len);
    }
    write_batch();
  }

  void kick() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      kick_posted_ = false;
    }
    if (is_closed()) return;
    kick_sweep();
    if (connected_) do_write();
  }

  // Takes the wire and writes the next batch of queued frames, unless someone holds the wire (its
  // holder calls do_write() again when it lets go) or nothing is queued.
  void do_write() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (wire_busy_) return;  // batch_ and buffers_ may be in use by the write in progress
      batch_.clear();
      buffers_.clear();
      while (!queue_.empty() && batch_.size() < kMaxBatch) {
        WriteItem item = std::move(queue_.front());
        queue_.pop_front();
        auto it = pending_.find(item.id);
        if (it == pending_.end()) continue;  // timed out before it was sent: its bulk may be gone
        it->second.in_write = true;
        batch_.push_back(std::move(item));
      }
      if (batch_.empty()) return;
      wire_busy_ = true;
    }
    for (const auto& item : batch_) {
      buffers_.emplace_back(item.header.data(), item.header.size());
      if (!item.message.empty()) buffers_.emplace_back(item.message.data(), item.message.size());
      if (!item.bulk_out.empty()) buffers_.emplace_back(item.bulk_out.data(), item.bulk_out.size());
    }
    write_batch();
  }

  // Writes buffers_ (the frames of batch_). REQUIRES: the wire is ours.
  void write_batch() {
    asio::async_write(socket_, buffers_,
                      asio::bind_executor(strand_, [self = shared_from_this()](error_code ec, size_t) {
                        self->on_written(ec);
                      }));
  }

  void on_written(error_code ec) {
    std::vector<std::pair<CallCallback, Result<CallReply>>> early;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& item : batch_) {
        auto it = pending_.find(item.id);
        if (it == pending_.end()) continue;
        it->second.in_write = false;
        if (it->second.early.has_value()) {
          early.emplace_back(std::move(it->second.done), std::move(*it->second.early));
          pending_.erase(it);
        }
      }
      wire_busy_ = false;
    }
    batch_.clear();
    for (auto& [done, reply] : early) done(std::move(reply));
    if (is_closed()) return;
    if (ec) {
      close_with(lost(ec));
      return;
    }
    do_write();
  }

  // ---- reader (strand) ----
  static asio::awaitable<void> read_loop(std::shared_ptr<Connection> self) {
    co_await self->read_frames();
  }

  // async_read's completion condition, reading everything (as transfer_all) and noting that a
  // frame has begun and when its last bytes came, for the sweep.
  auto noting_progress() {
    return [this](const error_code& ec, std::size_t n) -> std::size_t {
      if (n > 0) {
        in_frame_ = true;
        frame_progress_ = Clock::now();
      }
      return asio::transfer_all()(ec, n);
    };
  }

  asio::awaitable<void> read_frames() {
    std::array<uint8_t, proto::kFrameHeaderSize> hbuf{};
    std::string message;
    for (;;) {
      error_code ec;
      in_frame_ = false;
      expired_in_frame_ = false;
      co_await asio::async_read(socket_, asio::buffer(hbuf), noting_progress(),
                                asio::redirect_error(asio::use_awaitable, ec));
      if (is_closed()) co_return;
      if (ec) {
        close_with(lost(ec));
        co_return;
      }
      auto header = proto::decode_header(hbuf);
      if (!header.has_value()) {
        close_with(protocol(header.error().message()));
        co_return;
      }
      if (header->kind != proto::FrameKind::kResponse) {
        close_with(protocol("request frame received on a client connection"));
        co_return;
      }
      message.resize(header->message_len);
      if (!message.empty()) {
        co_await asio::async_read(socket_, asio::buffer(message.data(), message.size()), noting_progress(),
                                  asio::redirect_error(asio::use_awaitable, ec));
        if (is_closed()) co_return;
        if (ec) {
          close_with(lost(ec));
          co_return;
        }
      }
      const uint64_t id = header->request_id;
      const uint32_t bulk_len = header->bulk_len;
      std::span<uint8_t> target;
      bool known = false;
      bool too_big = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(id);
        if (it != pending_.end()) {
          known = true;
          if (header->status == 0 && bulk_len > 0) {
            if (bulk_len > it->second.bulk_in.size()) {
              too_big = true;
            } else {
              it->second.receiving = true;  // the sweep must not complete it while bulk_in is in use
              target = it->second.bulk_in.first(bulk_len);
            }
          }
        }
      }
      if (too_big) {
        close_with(protocol("response to request " + std::to_string(id) + " carries " + std::to_string(bulk_len) +
                            " bulk bytes, more than the caller's buffer holds"));
        co_return;
      }
      if (!target.empty()) {
        co_await asio::async_read(socket_, asio::buffer(target.data(), target.size()), noting_progress(),
                                  asio::redirect_error(asio::use_awaitable, ec));
        if (is_closed()) co_return;  // close_with() completed the call after the read was aborted
        if (ec) {
          close_with(lost(ec));
          co_return;
        }
      } else if (bulk_len > 0) {
        // Late response (the call timed out), or bulk on an error response: drain and drop.
        if (!scratch_) scratch_ = std::make_unique<uint8_t[]>(kScratchBytes);
        uint32_t left = bulk_len;
        while (left > 0) {
          size_t n = std::min<size_t>(left, kScratchBytes);
          co_await asio::async_read(socket_, asio::buffer(scratch_.get(), n), noting_progress(),
                                    asio::redirect_error(asio::use_awaitable, ec));
          if (is_closed()) co_return;
          if (ec) {
            close_with(lost(ec));
            co_return;
          }
          left -= static_cast<uint32_t>(n);
        }
      }
      if (!known) continue;
      Result<CallReply> reply = header->status != 0
                                    ? Result<CallReply>(Status(static_cast<Code>(header->status), std::move(message)))
                                    : Result<CallReply>(CallReply{std::move(message), bulk_len});
      message = std::string();
      CallCallback done;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = pending_.find(id);
        if (it == pending_.end()) continue;  // cannot happen for a receiving call; harmless otherwise
        it->second.receiving = false;
        if (it->second.in_write) {
          if (it->second.early.has_value()) continue;  // a duplicate response: the first one wins
          it->second.early.emplace(std::move(reply));
          continue;
        }
        done = std::move(it->second.done);
        pending_.erase(it);
      }
      done(std::move(reply));
    }
  }

  // ---- deadlines (strand) ----
  void kick_sweep() {
    if (is_closed()) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (sweeping_ && sweep_armed_) return;
      sweeping_ = sweep_armed_ = true;
    }
    arm_sweep();
  }

  // The sweep stops while no call is pending; a call that bypasses kick() restarts it.
  // REQUIRES: mu_ held.
  void ensure_sweep_locked() {
    if (sweeping_) return;
    sweeping_ = true;
    asio::post(strand_, [self = shared_from_this()] { self->kick_sweep(); });
  }

  // While the connection is not up (connecting, or waiting out a refusing server), requests of
  // calls that expired meanwhile leave the write queue: nothing else takes them out before a
  // connect succeeds, and calls go on arriving, each holding its encoded message.
  // REQUIRES: mu_ held.
  void drop_unsent_expired_locked() {
    if (connected_locked_) return;  // the writer skips them (do_write) and pops the queue itself
    std::erase_if(queue_, [this](const WriteItem& w) { return !pending_.contains(w.id); });
  }

  void arm_sweep() {
    sweep_timer_.expires_after(kSweepPeriod);
    sweep_timer_.async_wait([self = shared_from_this()](error_code ec) { self->on_sweep(ec); });
  }

  void on_sweep(error_code ec) {
    if (ec || is_closed()) {
      std::lock_guard<std::mutex> lock(mu_);
      sweeping_ = sweep_armed_ = false;
      return;
    }
    const auto now = Clock::now();
    bool stuck = false;
    expired_.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.empty() && !expired_in_frame_) {
        drop_unsent_expired_locked();
        sweeping_ = sweep_armed_ = false;
        earliest_deadline_ = Clock::time_point::max();
        return;
      }
      if (now >= earliest_deadline_) {
        auto earliest = Clock::time_point::max();
        for (auto it = pending_.begin(); it != pending_.end();) {
          Pending& p = it->second;
          if (now >= p.deadline) {
            if (p.in_write || p.receiving) {
              // Cannot complete while the socket may touch its buffers. Usually the operation ends
              // within moments (and the call then completes normally); a peer that stalls it is
              // cut off once the grace period passed.
              if (now >= p.deadline + kStallGrace) stuck = true;
            } else {
              expired_.push_back(std::move(p.done));
              it = pending_.erase(it);
              continue;
            }
          }
          earliest = std::min(earliest, p.deadline);
          ++it;
        }
        earliest_deadline_ = earliest;
        drop_unsent_expired_locked();
      }
    }
    if (!expired_.empty() && in_frame_) expired_in_frame_ = true;
    for (auto& done : expired_) done(waiting_refused_ ? refused_status() : timed_out());
    expired_.clear();
    if (stuck) {
      close_with(Status(Code::kUnavailable, "connection to " + address_ + " stalled past a call deadline"));
      return;
    }
    if (expired_in_frame_ && in_frame_ && now - frame_progress_ >= kStallGrace) {
      PENSTOCK_LOG(Warn) << address_ << " stopped sending in the middle of a response for "
                         << std::chrono::duration_cast<std::chrono::milliseconds>(now - frame_progress_).count()
                         << " ms while calls timed out; closing the connection, later calls use a new one";
      close_with(Status(Code::kUnavailable, "connection to " + address_ + " stalled in the middle of a response"));
      return;
    }
    arm_sweep();
  }

  // ---- closing (strand) ----
  // Closes the socket (which aborts any read or write in progress before returning) and fails every
  // pending call: overdue ones with kTimeout, the rest with `why`.
  void close_with(const Status& why) {
    std::unordered_map<uint64_t, Pending> failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_locked_) return;
      failed = mark_closed_locked();
    }
    finish_close(std::move(failed), why);
  }

  // Marks the connection closed (submit() refuses calls from now on) and hands over its pending
  // calls. REQUIRES: mu_ held, not closed yet.
  std::unordered_map<uint64_t, Pending> mark_closed_locked() {
    closed_locked_ = true;
    closed_.store(true, std::memory_order_release);
    queue_.clear();
    std::unordered_map<uint64_t, Pending> failed;
    failed.swap(pending_);
    return failed;
  }

  // close_with()'s rest, after mark_closed_locked().
  void finish_close(std::unordered_map<uint64_t, Pending> failed, const Status& why) {
    error_code ignored;
    socket_.close(ignored);
    resolver_.cancel();
    connect_timer_.cancel();
    retry_timer_.cancel();
    sweep_timer_.cancel();
    if (!why.is_ok() && why.code() == Code::kProtocol) {
      PENSTOCK_LOG(Warn) << "closing connection: " << why.to_string();
    }
    const auto now = Clock::now();
    for (auto& [id, p] : failed) {
      if (now >= p.deadline) {
        p.done(waiting_refused_ ? refused_status() : timed_out());
      } else {
        p.done(why);
      }
    }
  }

  Status lost(error_code ec) const {
    return Status(Code::kUnavailable, "connection to " + address_ + " lost: " + ec.message());
  }
  Status protocol(const std::string& what) const {
    return Status(Code::kProtocol, "from " + address_ + ": " + what);
  }
  Status timed_out() const { return Status(Code::kTimeout, "no response from " + address_ + " before the deadline"); }
  Status refused_status() const {
    return Status(Code::kUnavailable, "cannot connect to " + address_ +
                                          ": connection refused until the call's deadline (is the server running?)");
  }

  Strand strand_;
  tcp::socket socket_;
  tcp::resolver resolver_;
  asio::steady_timer connect_timer_;
  asio::steady_timer retry_timer_;  // the next connect while the server refuses
  asio::steady_timer sweep_timer_;
  const Endpoint server_;
  const std::string address_;
  const TcpOptions options_;
  const std::shared_ptr<RefusedState> refused_;

  std::atomic<bool> closed_{false};

  std::mutex mu_;  // after TcpChannel::mu_
  bool closed_locked_ = false;                          // guarded by mu_ (mirrored in closed_)
  bool kick_posted_ = false;                            // guarded by mu_
  bool connected_locked_ = false;                       // guarded by mu_: the strand's connected_
  bool wire_busy_ = false;                              // guarded by mu_: a writer holds the socket
  bool sweeping_ = false;                               // guarded by mu_: a sweep runs or is posted
  bool sweep_armed_ = false;                            // guarded by mu_: its timer is set
  std::unordered_map<uint64_t, Pending> pending_;       // guarded by mu_
  std::deque<WriteItem> queue_;                         // guarded by mu_
  Clock::time_point earliest_deadline_ = Clock::time_point::max();  // guarded by mu_; a lower bound

  // Strand-only state.
  bool connected_ = false;
  bool connect_timed_out_ = false;  // the current connect attempt's timer expired
  uint64_t connect_attempt_ = 0;     // which connect the timer belongs to
  bool waiting_refused_ = false;  // the last connect was refused and another one is due
  Backoff refused_backoff_{kRefusedFirstPause, kRefusedMostPause};
  std::vector<WriteItem> batch_;
  std::vector<asio::const_buffer> buffers_;
  std::vector<CallCallback> expired_;
  std::unique_ptr<uint8_t[]> scratch_;
  // The reader is inside a frame (some of it arrived), frame_progress_ is when its last bytes
  // came, and expired_in_frame_ says a call timed out meanwhile. Strand-only: the reader's
  // completion conditions and the sweep both run on the strand.
  bool in_frame_ = false;
  bool expired_in_frame_ = false;
  Clock::time_point frame_progress_{};
};

class TcpChannel : public Channel {
 public:
  TcpChannel(IoRuntime& runtime, Endpoint server, TcpOptions options)
      : runtime_(runtime), server_(std::move(server)), options_(options) {
    if (options_.connections < 1) options_.connections = 1;
    slots_.resize(static_cast<size_t>(options_.connections));
  }

  ~TcpChannel() override {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : slots_) {
      if (c) c->shutdown(Status(Code::kCancelled, "channel to " + server_.to_string() + " destroyed"));
    }
  }

  void start_call(OutgoingCall call, CallCallback done) override {
    if (Status st = check_limits(call); !st.is_ok()) {
      asio::post(context(), [done = std::move(done), st = std::move(st)] { done(st); });
      return;
    }
    const uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    for (;;) {
      std::shared_ptr<Connection> conn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto& slot = slots_[next_slot_++ % slots_.size()];
        if (!slot || slot->is_closed()) {
          // A fresh connection accepts calls until it is started, so this cannot fail.
          slot = std::make_shared<Connection>(context(), server_, options_, refused_);
          bool ok = slot->submit(id, call, done);
          PENSTOCK_CHECK(ok);
          slot->start();
          return;
        }
        conn = slot;
      }
      if (conn->submit(id, call, done)) return;
    }
  }

  Result<CallReply> call_sync(OutgoingCall call) override {
    PENSTOCK_RETURN_IF_ERROR(check_limits(call));
    std::unique_ptr<BlockingConnection> conn = take_blocking();
    // All in use: the shared path, which also waits while the server refuses (wait_while_refused).
    if (conn == nullptr) return Channel::call_sync(std::move(call));
    if (conn->failed()) {
      // A placeholder: make the connection now (counted in blocking_open_ already, so concurrent
      // callers cannot pass the bound).
      auto made = connect_blocking(call.deadline);
      if (!made.has_value()) {
        give_back_blocking(nullptr);
        return std::move(made).error();
      }
      conn = std::move(*made);
    }
    Result<CallReply> r = conn->call(next_id_.fetch_add(1, std::memory_order_relaxed), call);
    const bool refused = conn->refused();
    give_back_blocking(std::move(conn));
    if (!refused) return r;
    // Reset before it answered anything: the server is at its connection limit and did not read
    // the request. This call goes the shared way, and no new blocking connection is made for a while.
    PENSTOCK_LOG(Warn) << "penstock server at " << server_.to_string()
                       << " refused a further connection (at its max_connections?); calls to it share "
                       << options_.connections << " connection(s) for " << kRefusedPause.count() << " s";
    {
      std::lock_guard<std::mutex> lock(mu_);
      blocking_paused_until_ = Clock::now() + kRefusedPause;
    }
    return Channel::call_sync(std::move(call));
  }

  std::string describe() const override { return "tcp " + server_.to_string(); }
  void stop_waiting_while_refused() override { refused_->wait.store(false); }

 private:
  // An idle blocking connection that is still usable, or, when fewer than the bound are open, a
  // placeholder (broken(), to be replaced by a new connection; counted as open); null when every
  // one is in use.
  std::unique_ptr<BlockingConnection> take_blocking() {
    for (;;) {
      std::unique_ptr<BlockingConnection> conn;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (idle_blocking_.empty()) {
          if (blocking_open_ >= options_.blocking_connections || Clock::now() < blocking_paused_until_) return nullptr;
          ++blocking_open_;
          return std::make_unique<BlockingConnection>();
        }
        conn = std::move(idle_blocking_.back());
        idle_blocking_.pop_back();
      }
      if (!conn->broken()) return conn;  // a server restart closes idle ones: those are dropped
      give_back_blocking(nullptr);
    }
  }

  // A new blocking connection; while the server refuses (options_.wait_while_refused) it tries
  // again until `deadline`, pausing 5 ms, then twice as long each time up to 200 ms.
  Result<std::unique_ptr<BlockingConnection>> connect_blocking(Clock::time_point deadline) {
    Backoff backoff(kRefusedFirstPause, kRefusedMostPause);
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      bool refused = false;
      auto made = BlockingConnection::connect(
          server_, std::clamp(left, std::chrono::milliseconds(1), options_.connect_timeout), &refused);
      if (made.has_value()) {
        refused_->note_accepted(server_.to_string());
        return made;
      }
      if (!refused || !refused_->wait.load() || !backoff.fits(deadline)) return made;
      refused_->note_refused(server_.to_string());
      backoff.sleep();
    }
  }

  // Returns a connection taken with take_blocking(): kept for the next call unless a call failed
  // on it (or it is null: closed, no longer counted).
  void give_back_blocking(std::unique_ptr<BlockingConnection> conn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (conn != nullptr && !conn->failed()) {
      idle_blocking_.push_back(std::move(conn));
    } else {
      --blocking_open_;
    }
  }

  Status check_limits(const OutgoingCall& call) const {
    if (call.message.size() > proto::kMaxMessageBytes || call.bulk_out.size() > proto::kMaxBulkBytes) {
      return Status(Code::kInvalid, "request to " + server_.to_string() + " is over the frame limits (message " +
                                        std::to_string(call.message.size()) + " bytes, bulk " +
                                        std::to_string(call.bulk_out.size()) + " bytes)");
    }
    return Status::ok();
  }

  // Each connection lives on the context of one I/O thread; a channel's connections spread over them.
  asio::io_context& context() { return *static_cast<asio::io_context*>(runtime_.native_context()); }

  IoRuntime& runtime_;
  const Endpoint server_;
  TcpOptions options_;
  std::atomic<uint64_t> next_id_{1};
  std::mutex mu_;  // before Connection::mu_
  size_t next_slot_ = 0;                             // guarded by mu_
  std::vector<std::shared_ptr<Connection>> slots_;   // guarded by mu_
  std::vector<std::unique_ptr<BlockingConnection>> idle_blocking_;  // guarded by mu_
  int blocking_open_ = 0;  // blocking connections idle, in use or being made; guarded by mu_
  Clock::time_point blocking_paused_until_{};  // no new blocking connection before; guarded by mu_
  const std::shared_ptr<RefusedState> refused_ = std::make_shared<RefusedState>(options_.wait_while_refused);
};

}  // namespace

std::shared_ptr<Channel> make_tcp_channel(IoRuntime& runtime, Endpoint server, TcpOptions options) {
  return std::make_shared<TcpChannel>(runtime, std::move(server), options);
}

}  // namespace penstock::net
