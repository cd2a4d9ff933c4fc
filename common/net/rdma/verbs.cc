#include "common/net/rdma/verbs.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/base/log.h"

namespace penstock::net::rdma {
namespace {

constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;

uint8_t* alloc_pages(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}
void free_pages(uint8_t* p, size_t bytes) {
  if (p != nullptr) munmap(p, bytes);
}

}  // namespace

std::string errno_text(int err) { return std::string(std::strerror(err)); }

Result<std::unique_ptr<BufferPool>> BufferPool::create(ibv_pd* pd, size_t bytes,
                                                       size_t slot_bytes) {
  if (slot_bytes == 0) slot_bytes = 64u << 10;
  const size_t slots = std::max<size_t>(1, (bytes + slot_bytes - 1) / slot_bytes);
  const size_t total = slots * slot_bytes;
  uint8_t* base = alloc_pages(total);
  if (base == nullptr) {
    return Status(Code::kInternal, "cannot allocate a " + std::to_string(total) +
                                       "-byte RDMA pool: " + errno_text(errno));
  }
  ibv_mr* mr = ibv_reg_mr(pd, base, total, kAccess);
  if (mr == nullptr) {
    int err = errno;
    free_pages(base, total);
    return Status(Code::kInternal, "cannot register a " + std::to_string(total) +
                                       "-byte RDMA pool: " + errno_text(err) +
                                       " (is the locked-memory limit, ulimit -l, high enough?)");
  }
  return std::unique_ptr<BufferPool>(new BufferPool(pd, base, mr, slots, slot_bytes));
}

BufferPool::~BufferPool() {
  const size_t total = alloc_.capacity_bytes();
  ibv_dereg_mr(mr_);
  free_pages(base_, total);
}

Result<std::optional<BufferPool::Buffer>> BufferPool::allocate(size_t len, bool force) {
  if (len == 0) len = 1;
  if (len <= alloc_.capacity_bytes()) {
    std::lock_guard<std::mutex> lock(mu_);
    auto first = alloc_.allocate(len);
    if (first.has_value()) {
      return std::optional<Buffer>(
          Buffer{base_ + *first * alloc_.slot_bytes(), len, mr_->lkey, mr_->rkey, *first, nullptr});
    }
    if (!force) return std::optional<Buffer>();
  }
  {
    // Larger than the whole pool: a region of its own (the one registration off the pool).
    uint8_t* p = alloc_pages(len);
    if (p == nullptr)
      return Status(Code::kInternal,
                    "cannot allocate " + std::to_string(len) + " bytes for RDMA bulk");
    ibv_mr* mr = ibv_reg_mr(pd_, p, len, kAccess);
    if (mr == nullptr) {
      int err = errno;
      free_pages(p, len);
      return Status(Code::kInternal, "cannot register " + std::to_string(len) +
                                         " bytes for RDMA bulk: " + errno_text(err));
    }
    PENSTOCK_LOG(Debug) << "RDMA bulk of " << len << " bytes does not fit the free part of the "
                        << alloc_.capacity_bytes() << "-byte pool; registered a region for it";
    return std::optional<Buffer>(Buffer{p, len, mr->lkey, mr->rkey, 0, mr});
  }
}

void BufferPool::release(Buffer& b) {
  if (!b.valid()) return;
  if (b.own_mr != nullptr) {
    ibv_dereg_mr(b.own_mr);
    free_pages(b.data, b.len);
  } else {
    std::lock_guard<std::mutex> lock(mu_);
    alloc_.release(b.first_slot, b.len);
  }
  b = Buffer{};
}

Result<std::unique_ptr<Ring>> Ring::create(ibv_pd* pd, uint32_t count, uint32_t bytes) {
  const size_t total = static_cast<size_t>(count) * bytes;
  uint8_t* base = alloc_pages(total);
  if (base == nullptr)
    return Status(Code::kInternal, "cannot allocate RDMA control buffers: " + errno_text(errno));
  ibv_mr* mr = ibv_reg_mr(pd, base, total, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) {
    int err = errno;
    free_pages(base, total);
    return Status(Code::kInternal, "cannot register RDMA control buffers: " + errno_text(err) +
                                       " (is the locked-memory limit, ulimit -l, high enough?)");
  }
  return std::unique_ptr<Ring>(new Ring(base, mr, count, bytes));
}

Ring::~Ring() {
  ibv_dereg_mr(mr_);
  free_pages(base_, static_cast<size_t>(count_) * bytes_);
}

Status resolve_sockaddr(const Endpoint& ep, sockaddr_storage* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(ep.port);
  int rc = getaddrinfo(ep.host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Status(Code::kUnavailable, "cannot resolve " + ep.to_string() + ": " + gai_strerror(rc));
  }
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out, res->ai_addr, std::min<size_t>(res->ai_addrlen, sizeof(*out)));
  freeaddrinfo(res);
  return Status::ok();
}

rdma_cm_event* wait_cm_event(rdma_event_channel* channel,
                             std::chrono::steady_clock::time_point deadline, bool* timed_out,
                             std::string* error) {
  *timed_out = false;
  for (;;) {
    rdma_cm_event* ev = nullptr;
    if (rdma_get_cm_event(channel, &ev) == 0) return ev;
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      *error = errno_text(errno);
      return nullptr;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      *timed_out = true;
      return nullptr;
    }
    pollfd p{channel->fd, POLLIN, 0};
    ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count() + 1, 1000)));
  }
}

int post_ring_recv(ibv_qp* qp, const Ring& ring, uint32_t index, uint64_t tag) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(ring.at(index));
  sge.length = ring.bytes();
  sge.lkey = ring.lkey();
  ibv_recv_wr wr{};
  wr.wr_id = tag | index;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_recv(qp, &wr, &bad);
}

bool set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  return flags >= 0 && fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

}  // namespace penstock::net::rdma
