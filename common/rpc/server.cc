// RpcServer over Boost.Asio.
//
// Threads: `io_threads` each run an io_context of their own (net::IoPool); the accept loop hands
// each new connection to the next one, and its read loop and writer stay on that thread. Handlers
// run on a separate pool of `worker_threads` because they may block on disk or RocksDB.
// Each connection's socket state lives on its own strand: the read loop (a coroutine), the response
// queue and the writer. A worker writes its finished response itself when the connection's socket
// is idle and the response small (net::send_now under the connection's wire_mu_, the rest of a
// partial write finished by the strand), which saves waking the I/O thread for it;
// otherwise it posts the response to the strand's queue. A handler registered with
// Dispatch::kInline runs in the read loop itself and queues its response directly.
// Peer bytes are hostile: every length is checked by decode_header before anything is allocated,
// buffers grow only as bytes actually arrive, and each connection is bounded in requests and bytes
// in flight (the read loop pauses until responses drain).
// With ServerOptions::rdma, an RdmaListener (common/net/rdma) on the same host and port number
// feeds the same handlers: dispatch_rdma() runs on its event thread and posts to the same workers;
// a worker answers through RdmaRequest::reply().
// A handler may return a file range as its bulk (RequestContext::send_file): handle_request stages
// it in a pipe on the handler's thread, and the worker (when the socket is idle) or else the
// strand's writer splices the pipe into the socket after the header and message, so the bytes
// never pass through user space (file_bulk.h).
// Lock order: ServerState::mu and ServerConnection::wire_mu_ are leaf locks (never held while
// calling out).
#include "common/rpc/server.h"

#include <fcntl.h>
#include <sys/uio.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "common/base/log.h"
#include "common/net/io_pool.h"
#include "common/net/tcp/send_now.h"
#include "common/net/rdma/rdma_transport.h"
#include "common/proto/frame.h"

namespace penstock::rpc {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Strand = asio::strand<asio::io_context::executor_type>;

// Per connection, counted until the response is written; reading pauses beyond either.
constexpr uint32_t kMaxInflightRequests = 128;
constexpr uint64_t kMaxInflightBytes = 256ull << 20;  // request and response bytes
constexpr size_t kMaxBatch = 64;                     // responses per gathered write
constexpr size_t kMaxErrorText = 64 << 10;           // error messages are truncated to this
constexpr size_t kGrowStep = 1 << 20;                // buffers grow as bytes arrive, not up front
constexpr size_t kReserveBytes = 8 << 20;            // ...but this much is reserved at once
// The largest response a worker writes itself (header + message + bulk); larger ones are queued
// for the strand, whose writer overlaps them with the next.
constexpr size_t kInlineSendMax = 64 << 10;
// The same for a bulk staged in a pipe (splicing moves page references, no copy): a small file's
// read goes out from its worker, where the saved wake-up is a large share of the request's cost;
// the 1 MiB blocks of a sequential stream stay with the strand, which overlaps them with the
// stream's next disk reads on the workers (one wake-up per MiB is little, and over loopback the
// sender also runs the receiver's TCP processing).
constexpr size_t kInlineSpliceMax = 256 << 10;

uint32_t handler_key(proto::ServiceId service, uint16_t method) {
  return (static_cast<uint32_t>(service) << 16) | method;
}

const char* service_name(proto::ServiceId s) {
  switch (s) {
    case proto::ServiceId::kMeta: return "meta";
    case proto::ServiceId::kData: return "data";
  }
  return "unknown";
}

// What a handler has done (RpcServer::method_stats): relaxed, each counter on its own.
struct MethodCounters {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> errors{0};
  std::atomic<uint64_t> busy_ns{0};
};

struct HandlerEntry {
  std::string name;
  RpcServer::RawHandler fn;
  Dispatch dispatch = Dispatch::kWorker;
  RpcServer::ReplyBound reply_bound;  // may be empty
  std::unique_ptr<MethodCounters> counters = std::make_unique<MethodCounters>();
};

struct Response {
  proto::FrameHeader h;
  std::array<uint8_t, proto::kFrameHeaderSize> header{};
  std::string message;
  ByteBuffer bulk;
  std::unique_ptr<Pipe> pipe;  // or the bulk is h.bulk_len bytes staged in this pipe (file_bulk.h)
  bool close_after = false;    // the request was undecodable: close once the error is sent
  uint64_t inflight_bytes = 0;  // what it counts in ServerConnection::inflight_bytes_ until written
  uint64_t reply_reserved = 0;  // response bytes its request counted when read (HandlerEntry::reply_bound)
};

// The response to `req`. Its bulk: `staged` when given (in its pipe, or in memory), else `bulk`;
// an error response carries none.
Response make_response(const proto::FrameHeader& req, Result<std::string> result, ByteBuffer bulk,
                       StagedBulk* staged = nullptr) {
  std::unique_ptr<Pipe> pipe;
  uint32_t pipe_bytes = 0;
  if (staged != nullptr) {
    bulk = std::move(staged->memory);
    pipe = std::move(staged->pipe);
    pipe_bytes = staged->bytes;
  }
  Response r;
  proto::FrameHeader h;
  h.kind = proto::FrameKind::kResponse;
  h.service = req.service;
  h.method = req.method;
  h.request_id = req.request_id;
  if (result.has_value() && (result->size() > proto::kMaxMessageBytes || bulk.size() > proto::kMaxBulkBytes)) {
    result = Status(Code::kInternal, "response over the frame limits (message " + std::to_string(result->size()) +
                                         " bytes, bulk " + std::to_string(bulk.size()) + " bytes)");
  }
  if (result.has_value()) {
    r.message = std::move(result).value();
    r.bulk = std::move(bulk);
    r.pipe = std::move(pipe);
  } else {
    const Status& st = result.error();
    h.status = static_cast<uint32_t>(st.code());
    r.message = st.message().substr(0, kMaxErrorText);
    r.close_after = st.code() == Code::kProtocol;
  }
  h.message_len = static_cast<uint32_t>(r.message.size());
  h.bulk_len = r.pipe ? pipe_bytes : static_cast<uint32_t>(r.bulk.size());
  r.h = h;
  r.header = proto::encode_header(h);
  return r;
}

// Runs a handler; an exception becomes kInternal (handlers should not throw, but one must not take
// the server down).
Result<std::string> run_handler(const HandlerEntry& entry, std::span<const uint8_t> message, RequestContext& ctx) {
  try {
    return entry.fn(message, ctx);
  } catch (const std::exception& e) {
    return Status(Code::kInternal, "handler " + entry.name + " threw: " + e.what());
  } catch (...) {
    return Status(Code::kInternal, "handler " + entry.name + " threw a non-standard exception");
  }
}

void count_in(MethodCounters& c, bool ok, std::chrono::nanoseconds busy) {
  c.calls.fetch_add(1, std::memory_order_relaxed);
  if (!ok) c.errors.fetch_add(1, std::memory_order_relaxed);
  c.busy_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(busy.count(), 0)), std::memory_order_relaxed);
}

// run_handler, counted in the entry's MethodCounters.
Result<std::string> invoke(const HandlerEntry& entry, std::span<const uint8_t> message, RequestContext& ctx) {
  const auto start = std::chrono::steady_clock::now();
  Result<std::string> r = run_handler(entry, message, ctx);
  count_in(*entry.counters, r.has_value(), std::chrono::steady_clock::now() - start);
  return r;
}

uint64_t random_instance() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return v;
}

}  // namespace

class ServerConnection;

// Everything the server shares with its connections (RpcServer::Impl is this, by another name).
struct ServerState {
  explicit ServerState(ServerOptions o)
      : options(std::move(o)), pool(options.io_threads), accept_strand(asio::make_strand(pool.at(0))), acceptor(accept_strand) {}

  void remove(const std::shared_ptr<ServerConnection>& conn) {
    std::lock_guard<std::mutex> lock(mu);
    conns.erase(conn);
  }
  asio::awaitable<void> accept_loop();
  // RDMA listener thread: looks the handler up and runs it on the worker pool.
  void dispatch_rdma(std::shared_ptr<net::RdmaRequest> req);
  Status start_rdma();
  // Where a request for `entry` runs (not for inline handlers).
  asio::thread_pool& pool_for(const HandlerEntry& entry) {
    return entry.dispatch == Dispatch::kWaiting && waiters ? *waiters : *workers;
  }
  void join_pools() {
    workers->join();
    if (waiters) waiters->join();
  }

  ServerOptions options;
  const std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  const uint64_t instance = random_instance();
  std::unordered_map<uint32_t, HandlerEntry> handlers;  // frozen by start()
  net::IoPool pool;  // the I/O threads, one context each; connections spread over them
  Strand accept_strand;
  tcp::acceptor acceptor;
  std::unique_ptr<asio::thread_pool> workers;
  std::unique_ptr<asio::thread_pool> waiters;  // Dispatch::kWaiting, when options.waiting_threads > 0
  PipePool pipes;  // for responses whose bulk is a file range (file_bulk.h)
  uint16_t port = 0;
  std::unique_ptr<net::RdmaListener> rdma;  // set by start() when listening for RDMA

  std::mutex mu;                 // leaf
  bool started = false;          // guarded by mu
  bool stopped = false;          // guarded by mu
  std::unordered_set<std::shared_ptr<ServerConnection>> conns;  // guarded by mu
};

struct RpcServer::Impl : ServerState {
  using ServerState::ServerState;
};

class ServerConnection : public std::enable_shared_from_this<ServerConnection> {
 public:
  ServerConnection(ServerState* server, Strand strand, tcp::socket socket, std::string peer)
      : server_(server), strand_(std::move(strand)), socket_(std::move(socket)), resume_(strand_), peer_(std::move(peer)) {}

  void start() {
    asio::co_spawn(strand_, read_loop(shared_from_this()), asio::detached);
  }

  void shutdown() {
    asio::post(strand_, [self = shared_from_this()] { self->close(); });
  }

 private:
  struct Incoming {
    proto::FrameHeader header;
    ByteBuffer message;
    ByteBuffer bulk;  // page-aligned: a write payload goes to O_DIRECT as it is (chunk_store.cc)
    uint64_t reply_reserved = 0;  // counted in flight for its response since it was read
  };

  static asio::awaitable<void> read_loop(std::shared_ptr<ServerConnection> self) { co_await self->read_frames(); }

  // Reads `n` bytes into `buf`, growing it as bytes arrive so a lying length costs little memory.
  // Up to kReserveBytes is reserved at once (untouched pages are address space only): growing a
  // 4 MiB write by reallocation copied 3 MiB of it (A/B ckpt-write 1.17x, CPU per GiB 0.83x).
  template <class Buffer>
  asio::awaitable<error_code> read_growing(Buffer& buf, size_t n) {
    buf.clear();
    buf.reserve(std::min(n, kReserveBytes));
    error_code ec;
    while (buf.size() < n) {
      size_t have = buf.size();
      size_t step = std::min(n - have, std::max(kGrowStep, have));
      buf.resize(have + step);
      co_await asio::async_read(socket_, asio::buffer(buf.data() + have, step),
                                asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return ec;
    }
    co_return ec;
  }

  bool over_inflight_limits() const {
    return inflight_.load() >= kMaxInflightRequests || inflight_bytes_.load() >= kMaxInflightBytes;
  }

  asio::awaitable<void> read_frames() {
    std::array<uint8_t, proto::kFrameHeaderSize> hbuf{};
    for (;;) {
      error_code ec;
      while (!closed_ && over_inflight_limits()) {
        resume_.expires_at(asio::steady_timer::time_point::max());
        // Announce the wait before checking again: a worker that writes a response inline lowers
        // the counts first and looks at reader_waiting_ after (both sequentially consistent).
        reader_waiting_.store(true);
        if (!over_inflight_limits()) {
          reader_waiting_.store(false);
          break;
        }
        co_await resume_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        reader_waiting_.store(false);
      }
      if (closed_) co_return;
      co_await asio::async_read(socket_, asio::buffer(hbuf), asio::redirect_error(asio::use_awaitable, ec));
      if (closed_) co_return;
      if (ec) {
        if (ec != asio::error::eof) {
          PENSTOCK_LOG(Debug) << "connection from " << peer_ << " lost: " << ec.message();
        }
        close();
        co_return;
      }
      auto header = proto::decode_header(hbuf);
      if (!header.has_value()) {
        PENSTOCK_LOG(Warn) << "closing connection from " << peer_ << ": " << header.error().to_string();
        close();
        co_return;
      }
      if (header->kind != proto::FrameKind::kRequest) {
        PENSTOCK_LOG(Warn) << "closing connection from " << peer_ << ": a response frame sent to the server";
        close();
        co_return;
      }
      Incoming in;
      in.header = *header;
      ec = co_await read_growing(in.message, header->message_len);
      if (!ec) ec = co_await read_growing(in.bulk, header->bulk_len);
      if (closed_) co_return;
      if (ec) {
        PENSTOCK_LOG(Debug) << "connection from " << peer_ << " lost mid-frame: " << ec.message();
        close();
        co_return;
      }
      auto it = server_->handlers.find(handler_key(header->service, header->method));
      if (it != server_->handlers.end() && it->second.reply_bound) {
        in.reply_reserved = std::min<uint64_t>(it->second.reply_bound(in.message), proto::kMaxBulkBytes);
      }
      // `bytes` stays counted until the response is written; the response adds what it carries
      // beyond the reservation (enqueue).
      const uint64_t bytes = in.message.size() + in.bulk.size() + in.reply_reserved;
      ++inflight_;
      inflight_bytes_ += bytes;
      if (it == server_->handlers.end()) {
        enqueue(make_response(in.header,
                              Status(Code::kNotSupported, "unknown method " + std::to_string(header->method) +
                                                              " of service " + service_name(header->service)),
                              {}),
                bytes);
        continue;
      }
      const HandlerEntry* entry = &it->second;
      if (entry->dispatch == Dispatch::kInline) {
        enqueue(handle_request(*entry, std::move(in)), bytes);
        if (closed_) co_return;
        continue;
      }
      asio::post(server_->pool_for(*entry), [self = shared_from_this(), entry, in = std::move(in), bytes]() mutable {
        self->respond_from_worker(self->handle_request(*entry, std::move(in)), bytes);
      });
    }
  }

  // A worker thread, or the strand for an inline handler. A file bulk is staged here, so a disk
  // read it needs blocks this thread, not the connection's writer.
  Response handle_request(const HandlerEntry& entry, Incoming in) {
    Response resp = respond(entry, in);
    resp.reply_reserved = in.reply_reserved;
    return resp;
  }
  Response respond(const HandlerEntry& entry, Incoming& in) {
    RequestContext ctx(in.bulk, peer_, /*can_send_file=*/entry.dispatch != Dispatch::kInline);
    Result<std::string> result = invoke(entry, in.message, ctx);
    if (!result.has_value() && result.error().code() == Code::kProtocol) {
      PENSTOCK_LOG(Warn) << "closing connection from " << peer_ << " after an undecodable " << entry.name
                         << " request: " << result.error().message();
    }
    if (result.has_value() && ctx.file_bulk().has_value()) {
      Result<StagedBulk> staged = stage_file_bulk(*ctx.file_bulk(), server_->pipes);
      if (!staged.has_value()) {
        return make_response(in.header, std::move(staged).error().with_context(entry.name + " response"), {});
      }
      return make_response(in.header, std::move(result), {}, &*staged);
    }
    return make_response(in.header, std::move(result), std::move(ctx.bulk_out()));
  }

  // ---- worker ----
  static size_t frame_bytes(const Response& r) { return r.header.size() + r.message.size() + r.bulk.size(); }
  static std::vector<iovec> frame_parts(Response& r) {
    return {iovec{r.header.data(), r.header.size()}, iovec{r.message.data(), r.message.size()},
            iovec{r.bulk.data(), r.bulk.size()}};
  }

  // Sends a worker's response: written right here when the socket is idle and the response small
  // or its bulk staged in a pipe (see the file comment), else queued on the strand; what the
  // socket does not take at once is finished by the strand. `bytes`: the request's in-flight bytes.
  void respond_from_worker(Response resp, uint64_t bytes) {
    auto queue_on_strand = [&] {
      asio::post(strand_, [self = shared_from_this(), resp = std::move(resp), bytes]() mutable {
        self->enqueue(std::move(resp), bytes);
      });
    };
    if (resp.close_after || (!resp.pipe && frame_bytes(resp) > kInlineSendMax) ||
        (resp.pipe && resp.h.bulk_len > kInlineSpliceMax)) {
      queue_on_strand();
      return;
    }
    std::unique_lock<std::mutex> lock(wire_mu_);
    if (wire_closed_) return;  // the connection is gone; its counts no longer matter
    if (wire_busy_) {
      lock.unlock();
      queue_on_strand();
      return;
    }
    const net::SendNow r = net::send_now(socket_.native_handle(), frame_parts(resp));
    int err = r.error;
    uint32_t pipe_left = resp.pipe ? resp.h.bulk_len : 0;
    if (err == 0 && r.sent == frame_bytes(resp)) err = splice_now(resp, &pipe_left);
    if (err != 0) {
      lock.unlock();
      asio::post(strand_, [self = shared_from_this(), err] {
        PENSTOCK_LOG(Debug) << "writing to " << self->peer_ << " failed: " << std::strerror(err);
        self->close();
      });
      return;
    }
    if (r.sent < frame_bytes(resp) || pipe_left > 0) {
      wire_busy_ = true;  // kept until the strand wrote the rest
      lock.unlock();
      asio::post(strand_, [self = shared_from_this(), resp = std::move(resp), bytes, sent = r.sent, pipe_left]() mutable {
        self->finish_inline(std::move(resp), bytes, sent, pipe_left);
      });
      return;
    }
    std::unique_ptr<Pipe> drained = std::move(resp.pipe);
    written_by_worker(lock, bytes);  // releases wire_mu_, a leaf lock: the pool's lock comes after
    if (drained) server_->pipes.give_back(std::move(drained));
  }

  // Splices what is left of `resp`'s pipe (*left bytes) into the socket without waiting; *left is
  // what the socket did not take. Returns an errno when the socket failed, else 0.
  // REQUIRES: the wire is held (wire_mu_ or wire_busy_), the header and message are written.
  int splice_now(Response& resp, uint32_t* left) {
    while (*left > 0) {
      const ssize_t n = ::splice(resp.pipe->read_fd(), nullptr, socket_.native_handle(), nullptr, *left,
                                 SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        *left -= static_cast<uint32_t>(n);
      } else if (n < 0 && errno == EAGAIN) {
        return 0;  // the socket is full
      } else if (n == 0 || errno != EINTR) {
        return n == 0 ? EPIPE : errno;  // the pipe holds every byte announced: the socket failed
      }
    }
    return 0;
  }

  // A worker wrote a whole response: the request leaves the in-flight counts, and the strand is
  // woken if it has responses waiting for the wire or its reader waits for room.
  // REQUIRES: `lock` holds wire_mu_; released here.
  void written_by_worker(std::unique_lock<std::mutex>& lock, uint64_t bytes) {
    const bool strand_waits = strand_waits_;
    strand_waits_ = false;
    lock.unlock();
    inflight_.fetch_sub(1);
    inflight_bytes_.fetch_sub(bytes);
    if (strand_waits || reader_waiting_.load()) {
      asio::post(strand_, [self = shared_from_this()] {
        if (self->reader_waiting_.load()) self->resume_.cancel();
        self->do_write();
      });
    }
  }

  // ---- strand ----
  // A request stays in flight (inflight_, inflight_bytes_) until its response is written, and its
  // response's bytes count too: a peer that sends requests but never reads the answers makes the
  // reader pause, instead of the server queueing responses without bound.
  void enqueue(Response resp, uint64_t bytes) {
    if (closed_) return;
    count_response(resp, bytes);
    queue_.push_back(std::move(resp));
    do_write();
  }

  // `resp`'s bytes join its request's `bytes` in flight, less what the request reserved for them.
  void count_response(Response& resp, uint64_t bytes) {
    const uint64_t reply = uint64_t{resp.h.message_len} + resp.h.bulk_len;
    const uint64_t more = reply > resp.reply_reserved ? reply - resp.reply_reserved : 0;
    resp.inflight_bytes = bytes + more;
    inflight_bytes_ += more;
  }

  // The rest of a worker's partial write: `done` bytes of `resp`'s header, message and in-memory
  // bulk are in the socket, and `pipe_left` bytes of a piped bulk are still in its pipe; the wire
  // is still held for it.
  void finish_inline(Response resp, uint64_t bytes, size_t done, uint32_t pipe_left = 0) {
    if (closed_) return;
    count_response(resp, bytes);
    batch_.clear();
    buffers_.clear();
    batch_.push_back(std::move(resp));
    const std::vector<iovec> parts = frame_parts(batch_.front());
    if (done == parts[0].iov_len + parts[1].iov_len + parts[2].iov_len && batch_.front().pipe) {
      pipe_left_ = pipe_left;  // only the pipe is left
      splice_out();
      return;
    }
    for (const iovec& part : net::unsent_rest(parts, done)) {
      buffers_.emplace_back(part.iov_base, part.iov_len);
    }
    write_buffers();
  }

  // The batch was written (or failed): its requests leave the in-flight counts.
  void release_batch() {
    for (const Response& r : batch_) {
      inflight_.fetch_sub(1);
      inflight_bytes_.fetch_sub(r.inflight_bytes);
    }
    if (reader_waiting_.load()) resume_.cancel();
  }

  // Takes the socket's write side and writes the next batch of queued responses; when a worker
  // holds it, the worker calls this again once it lets go.
  void do_write() {
    if (queue_.empty()) return;
    {
      std::lock_guard<std::mutex> lock(wire_mu_);
      if (wire_busy_) {
        strand_waits_ = true;
        return;
      }
      wire_busy_ = true;
    }
    batch_.clear();
    buffers_.clear();
    while (!queue_.empty() && batch_.size() < kMaxBatch) {
      batch_.push_back(std::move(queue_.front()));
      queue_.pop_front();
      if (batch_.back().close_after) break;  // nothing after it will be sent
      if (batch_.back().pipe) break;         // its bulk follows from the pipe (splice_out)
    }
    for (const auto& r : batch_) {
      buffers_.emplace_back(r.header.data(), r.header.size());
      if (!r.message.empty()) buffers_.emplace_back(r.message.data(), r.message.size());
      if (!r.bulk.empty()) buffers_.emplace_back(r.bulk.data(), r.bulk.size());
    }
    write_buffers();
  }

  // Writes buffers_ (the frames of batch_). REQUIRES: the wire is ours.
  void write_buffers() {
    asio::async_write(socket_, buffers_,
                      asio::bind_executor(strand_, [self = shared_from_this()](error_code ec, size_t) {
                        self->on_written(ec);
                      }));
  }

  void on_written(error_code ec) {
    if (!ec && !closed_ && !batch_.empty() && batch_.back().pipe) {
      pipe_left_ = batch_.back().h.bulk_len;
      splice_out();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(wire_mu_);
      wire_busy_ = false;
      strand_waits_ = false;  // the strand itself carries on below
    }
    const bool close_now = !batch_.empty() && batch_.back().close_after;
    release_batch();
    batch_.clear();
    if (closed_) return;
    if (ec) {
      PENSTOCK_LOG(Debug) << "writing to " << peer_ << " failed: " << ec.message();
      close();
      return;
    }
    if (close_now) {
      close();
      return;
    }
    do_write();
  }

  // Moves the last batched response's staged bulk from its pipe into the socket (no copy), waiting
  // for room in the socket when it is full; then carries on like any finished write.
  void splice_out() {
    Response& r = batch_.back();
    if (int err = splice_now(r, &pipe_left_); err != 0) {
      on_written(error_code(err, boost::system::system_category()));
      return;
    }
    if (pipe_left_ > 0) {
      socket_.async_wait(tcp::socket::wait_write, asio::bind_executor(strand_, [self = shared_from_this()](error_code ec) {
                           if (self->closed_) return;
                           if (ec) {
                             self->on_written(ec);
                             return;
                           }
                           self->splice_out();
                         }));
      return;
    }
    server_->pipes.give_back(std::move(r.pipe));  // drained: reusable
    on_written(error_code());
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    {
      std::lock_guard<std::mutex> lock(wire_mu_);  // no worker is inside its sendmsg after this
      wire_closed_ = true;
    }
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    resume_.cancel();
    queue_.clear();
    server_->remove(shared_from_this());
  }

  ServerState* server_;
  Strand strand_;
  tcp::socket socket_;
  asio::steady_timer resume_;
  const std::string peer_;

  // The socket's write side: whoever holds it (the strand's writer, or a worker in its inline
  // write) is the only one writing.
  std::mutex wire_mu_;                  // leaf
  bool wire_busy_ = false;              // guarded by wire_mu_
  bool wire_closed_ = false;            // guarded by wire_mu_: the socket is (being) closed
  bool strand_waits_ = false;           // guarded by wire_mu_: the strand has queued responses

  // Counted by the strand and by workers that write their own responses.
  std::atomic<uint32_t> inflight_{0};
  std::atomic<uint64_t> inflight_bytes_{0};
  std::atomic<bool> reader_waiting_{false};

  // Strand-only state.
  bool closed_ = false;
  uint32_t pipe_left_ = 0;  // bytes of batch_.back().pipe not yet in the socket
  std::deque<Response> queue_;
  std::vector<Response> batch_;
  std::vector<asio::const_buffer> buffers_;
};

asio::awaitable<void> ServerState::accept_loop() {
  for (;;) {
    Strand strand = asio::make_strand(pool.next());
    tcp::socket socket(strand);
    error_code ec;
    co_await acceptor.async_accept(socket, asio::redirect_error(asio::use_awaitable, ec));
    {
      std::lock_guard<std::mutex> lock(mu);
      if (stopped) co_return;
    }
    if (ec) {
      if (ec == asio::error::operation_aborted) co_return;
      PENSTOCK_LOG(Warn) << "accept on port " << port << " failed: " << ec.message() << "; retrying in 100 ms";
      asio::steady_timer pause(accept_strand, std::chrono::milliseconds(100));
      co_await pause.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      continue;
    }
    error_code pec;
    auto remote = socket.remote_endpoint(pec);
    std::string peer = pec ? std::string("unknown peer") : remote.address().to_string() + ":" + std::to_string(remote.port());
    socket.set_option(tcp::no_delay(true), pec);
    std::shared_ptr<ServerConnection> conn;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (conns.size() >= options.max_connections) {
        PENSTOCK_LOG(Warn) << "refusing connection from " << peer << ": " << conns.size()
                           << " connections open (max_connections)";
        socket.close(pec);
        continue;
      }
      conn = std::make_shared<ServerConnection>(this, strand, std::move(socket), std::move(peer));
      conns.insert(conn);
    }
    conn->start();
  }
}

void ServerState::dispatch_rdma(std::shared_ptr<net::RdmaRequest> req) {
  const proto::FrameHeader& h = req->header();
  auto it = handlers.find(handler_key(h.service, h.method));
  if (it == handlers.end()) {
    Response r = make_response(h,
                               Status(Code::kNotSupported, "unknown method " + std::to_string(h.method) +
                                                               " of service " + service_name(h.service)),
                               {});
    req->reply(r.h.status, std::move(r.message), {}, false);
    return;
  }
  const HandlerEntry* entry = &it->second;
  asio::post(pool_for(*entry), [entry, req = std::move(req)] {
    RequestContext ctx(req->bulk(), "rdma " + req->peer());
    Result<std::string> result = invoke(*entry, req->message(), ctx);
    if (!result.has_value() && result.error().code() == Code::kProtocol) {
      PENSTOCK_LOG(Warn) << "closing rdma connection from " << req->peer() << " after an undecodable " << entry->name
                         << " request: " << result.error().message();
    }
    Response r = make_response(req->header(), std::move(result), std::move(ctx.bulk_out()));
    req->reply(r.h.status, std::move(r.message), std::move(r.bulk), r.close_after);
  });
}

Status ServerState::start_rdma() {
  if (options.rdma == RdmaMode::kOff) return Status::ok();
  if (options.rdma == RdmaMode::kAuto && !net::rdma_device_present()) {
    PENSTOCK_LOG(Debug) << "no RDMA device: serving TCP only";
    return Status::ok();
  }
  net::RdmaServerOptions ro;
  ro.listen = net::Endpoint{options.listen.host, options.rdma_port != 0 ? options.rdma_port : port};
  ro.max_connections = options.max_connections;
  auto l = net::RdmaListener::start(ro, [this](std::shared_ptr<net::RdmaRequest> req) { dispatch_rdma(std::move(req)); });
  if (!l.has_value()) {
    if (options.rdma == RdmaMode::kOn) return l.error();
    PENSTOCK_LOG(Warn) << l.error().to_string() << "; serving TCP only";
    return Status::ok();
  }
  rdma = std::move(l).value();
  return Status::ok();
}

RpcServer::RpcServer(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

RpcServer::~RpcServer() { stop(); }

void RpcServer::add_handler(proto::ServiceId service, uint16_t method, std::string name, Dispatch dispatch,
                            RawHandler handler, ReplyBound reply_bound) {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    PENSTOCK_CHECK(!impl_->started);  // handlers are registered before start()
  }
  auto [it, inserted] = impl_->handlers.emplace(handler_key(service, method), HandlerEntry{std::move(name), std::move(handler), dispatch, std::move(reply_bound)});
  PENSTOCK_CHECK(inserted);  // one handler per (service, method)
  (void)it;
}

Status RpcServer::start() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.started || s.stopped) return Status(Code::kInvalid, "RpcServer::start called twice");
  }
  const std::string where = s.options.listen.to_string();
  auto fail = [&](const std::string& what, const error_code& ec) {
    error_code ignored;
    s.acceptor.close(ignored);
    return Status(Code::kUnavailable, "cannot listen on " + where + ": " + what + ": " + ec.message() +
                                          " (is another process using the port?)");
  };
  error_code ec;
  tcp::endpoint ep;
  auto addr = asio::ip::make_address(s.options.listen.host, ec);
  if (!ec) {
    ep = tcp::endpoint(addr, s.options.listen.port);
  } else {
    tcp::resolver resolver(s.pool.at(0));
    auto results = resolver.resolve(s.options.listen.host, std::to_string(s.options.listen.port), ec);
    if (ec || results.empty()) return fail("resolve", ec);
    ep = results.begin()->endpoint();
  }
  s.acceptor.open(ep.protocol(), ec);
  if (ec) return fail("open", ec);
  s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (ec) return fail("SO_REUSEADDR", ec);
  s.acceptor.bind(ep, ec);
  if (ec) return fail("bind", ec);
  s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return fail("listen", ec);
  s.port = s.acceptor.local_endpoint(ec).port();
  if (ec) return fail("local_endpoint", ec);

  s.workers = std::make_unique<asio::thread_pool>(static_cast<size_t>(std::max(1, s.options.worker_threads)));
  if (s.options.waiting_threads > 0) {
    s.waiters = std::make_unique<asio::thread_pool>(static_cast<size_t>(s.options.waiting_threads));
  }
  Status rdma_status = s.start_rdma();
  if (!rdma_status.is_ok()) {
    s.join_pools();
    s.workers.reset();
    s.waiters.reset();
    error_code ignored;
    s.acceptor.close(ignored);
    return rdma_status;
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.started = true;
  }
  asio::co_spawn(s.accept_strand, s.accept_loop(), asio::detached);
  s.pool.start();
  PENSTOCK_LOG(Info) << "RPC server listening on " << ep.address().to_string() << ":" << s.port;
  return Status::ok();
}

uint16_t RpcServer::port() const { return impl_->port; }

std::vector<proto::MethodStats> RpcServer::method_stats() const {
  std::vector<proto::MethodStats> out;
  for (const auto& [key, entry] : impl_->handlers) {
    const MethodCounters& c = *entry.counters;
    const uint64_t calls = c.calls.load(std::memory_order_relaxed);
    if (calls == 0) continue;
    out.push_back(proto::MethodStats{entry.name, calls, c.errors.load(std::memory_order_relaxed),
                                     c.busy_ns.load(std::memory_order_relaxed) / 1000});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

void RpcServer::count_call(proto::ServiceId service, uint16_t method, bool ok, std::chrono::nanoseconds busy) {
  auto it = impl_->handlers.find(handler_key(service, method));
  if (it != impl_->handlers.end()) count_in(*it->second.counters, ok, busy);
}

uint64_t RpcServer::instance() const { return impl_->instance; }

uint64_t RpcServer::uptime_ms() const {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::steady_clock::now() - impl_->created)
                                   .count());
}

uint16_t RpcServer::rdma_port() const { return impl_->rdma ? impl_->rdma->port() : 0; }

void RpcServer::stop() {
  Impl& s = *impl_;
  std::vector<std::shared_ptr<ServerConnection>> conns;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopped) return;
    s.stopped = true;
    if (!s.started) return;
    conns.assign(s.conns.begin(), s.conns.end());
  }
  asio::post(s.accept_strand, [&s] {
    error_code ignored;
    s.acceptor.close(ignored);
  });
  for (auto& c : conns) c->shutdown();
  conns.clear();
  if (s.rdma) s.rdma->stop();  // closes RDMA connections; replies of running handlers are dropped
  // Running handlers finish; their responses are dropped by the closed connections.
  s.join_pools();
  s.rdma.reset();
  s.pool.drain(std::chrono::seconds(5));
  std::lock_guard<std::mutex> lock(s.mu);
  s.conns.clear();
}

}  // namespace penstock::rpc
