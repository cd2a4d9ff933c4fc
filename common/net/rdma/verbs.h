// Shared pieces of the RDMA transport over libibverbs/librdmacm: registered memory (the bulk
// staging pool and the control message rings), address resolution and rdma_cm event waits.
// Private to common/net/rdma. Thread-safety: BufferPool is thread-safe; the rest is owned by one
// thread at a time.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/net/rdma/slot_allocator.h"

namespace penstock::net::rdma {

// Work-request ids: the top two bits say what kind of request completed, the rest is a slot index.
inline constexpr uint64_t kTagRecv = 1ull << 62;
inline constexpr uint64_t kTagSend = 2ull << 62;
inline constexpr uint64_t kTagRead = 3ull << 62;  // the server's RDMA READ of a request's bulk
inline constexpr uint64_t kTagMask = 3ull << 62;

// Registered memory for bulk: one region registered once, handed out in contiguous runs. A
// request larger than the whole region gets a region of its own, registered for it (rare: bulk
// over the pool size) and deregistered when released.
class BufferPool {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t len = 0;
    uint32_t lkey = 0;
    uint32_t rkey = 0;
    size_t first_slot = 0;
    ibv_mr* own_mr = nullptr;  // the dedicated region of an oversized buffer
    bool valid() const { return data != nullptr; }
  };

  // Registers `bytes` (rounded up to slots) on `pd` with local write, remote read and remote write.
  static Result<std::unique_ptr<BufferPool>> create(ibv_pd* pd, size_t bytes, size_t slot_bytes);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A buffer of `len` (>= 1) bytes, nullopt when the pool is busy now (retry after a release);
  // kInternal when an oversized buffer cannot be registered. `force`: never busy; when the pool
  // cannot serve now, register a region for this buffer (for a caller with nothing in flight,
  // which would otherwise wait for a release that never comes).
  Result<std::optional<Buffer>> allocate(size_t len, bool force = false);
  void release(Buffer& b);  // clears b; no-op on an invalid buffer
  size_t capacity() const { return alloc_.capacity_bytes(); }

 private:
  BufferPool(ibv_pd* pd, uint8_t* base, ibv_mr* mr, size_t slots, size_t slot_bytes)
      : pd_(pd), base_(base), mr_(mr), alloc_(slots, slot_bytes) {}
  ibv_pd* pd_;
  uint8_t* base_;
  ibv_mr* mr_;
  std::mutex mu_;        // leaf
  SlotAllocator alloc_;  // guarded by mu_
};

// A registered array of `count` buffers of `bytes` each (control message rings).
class Ring {
 public:
  static Result<std::unique_ptr<Ring>> create(ibv_pd* pd, uint32_t count, uint32_t bytes);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  uint8_t* at(uint32_t i) const { return base_ + static_cast<size_t>(i) * bytes_; }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t bytes() const { return bytes_; }
  uint32_t count() const { return count_; }

 private:
  Ring(uint8_t* base, ibv_mr* mr, uint32_t count, uint32_t bytes)
      : base_(base), mr_(mr), count_(count), bytes_(bytes) {}
  uint8_t* base_;
  ibv_mr* mr_;
  uint32_t count_;
  uint32_t bytes_;
};

// Resolves a host (numeric or a name) and port to a socket address. kUnavailable on failure.
Status resolve_sockaddr(const Endpoint& ep, sockaddr_storage* out);

// Waits for the next event on `channel` up to `deadline`; nullptr with `*timed_out` set, or with
// errno text in `*error`.
rdma_cm_event* wait_cm_event(rdma_event_channel* channel,
                             std::chrono::steady_clock::time_point deadline, bool* timed_out,
                             std::string* error);

// "errno text" for the last failed verbs/cm call.
std::string errno_text(int err);

// Posts one receive of ring buffer `index`; wr_id = tag | index.
int post_ring_recv(ibv_qp* qp, const Ring& ring, uint32_t index, uint64_t tag);

// A send-queue work request over the one buffer `sge` (which must live until it is posted):
// `wr_id` (a tag | slot), `opcode`, signaled or not, and for RDMA READ/WRITE the peer's buffer.
inline ibv_send_wr make_send_wr(uint64_t wr_id, ibv_sge* sge, ibv_wr_opcode opcode, bool signaled,
                                uint64_t remote_addr = 0, uint32_t rkey = 0) {
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.opcode = opcode;
  wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
  wr.wr.rdma.remote_addr = remote_addr;
  wr.wr.rdma.rkey = rkey;
  return wr;
}

// Makes `fd` non-blocking. False on failure.
bool set_nonblocking(int fd);

}  // namespace penstock::net::rdma
