#include "server/data/uring_io.h"

#include <liburing.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "common/base/log.h"

namespace penstock::data {
namespace {

constexpr unsigned kRingDepth = 64;

std::atomic<bool> g_force_posix{false};
std::once_flag g_warn_once;

// One ring per thread; torn down when the thread exits.
struct ThreadRing {
  io_uring ring{};
  bool tried = false;
  bool ok = false;

  ~ThreadRing() {
    if (ok) io_uring_queue_exit(&ring);
  }

  io_uring* get() {
    if (g_force_posix.load(std::memory_order_relaxed)) return nullptr;
    if (!tried) {
      tried = true;
      int rc = io_uring_queue_init(kRingDepth, &ring, 0);
      ok = rc == 0;
      if (!ok) {
        std::call_once(g_warn_once, [rc] {
          PENSTOCK_LOG(Warn) << "io_uring is not available (" << std::strerror(-rc)
                             << "); chunk I/O falls back to preadv/pwritev, which is slower. "
                                "Check /proc/sys/kernel/io_uring_disabled and seccomp policy";
        });
      }
    }
    return ok ? &ring : nullptr;
  }
};

thread_local ThreadRing t_ring;

const char* kind_name(IoOp::Kind kind) {
  switch (kind) {
    case IoOp::Kind::kRead: return "read";
    case IoOp::Kind::kWrite: return "write";
    case IoOp::Kind::kFsync: return "fsync";
  }
  return "io";
}

Status errno_status(const IoOp& op, int err) {
  Code code = (err == ENOSPC || err == EDQUOT) ? Code::kNoSpace : Code::kIo;
  return Status(code, std::string(kind_name(op.kind())) + " failed: " + std::strerror(err));
}

Status eof_status() { return Status(Code::kIo, "read failed: unexpected end of file"); }

bool retryable(int err) { return err == EINTR || err == EAGAIN; }

// Applies one completion result to `op`. Sets *again when the op must be continued or retried.
Status apply_result(IoOp& op, int res, bool* again) {
  *again = false;
  if (res < 0) {
    if (retryable(-res)) {
      *again = true;
      return Status::ok();
    }
    return errno_status(op, -res);
  }
  if (op.kind() == IoOp::Kind::kFsync) {
    op.advance(0);
    return Status::ok();
  }
  if (res == 0 && op.total() > 0) {
    // A write that moves no bytes would loop forever; a read that does is the end of the file.
    return op.kind() == IoOp::Kind::kRead ? eof_status() : errno_status(op, EIO);
  }
  op.advance(static_cast<size_t>(res));
  *again = !op.complete();
  return Status::ok();
}

void prep(io_uring_sqe* sqe, const IoOp& op) {
  switch (op.kind()) {
    case IoOp::Kind::kRead:
      io_uring_prep_readv(sqe, op.fd(), op.pending_iov(), static_cast<unsigned>(op.pending_iovcnt()),
                          op.pending_offset());
      break;
    case IoOp::Kind::kWrite:
      io_uring_prep_writev(sqe, op.fd(), op.pending_iov(), static_cast<unsigned>(op.pending_iovcnt()),
                           op.pending_offset());
      break;
    case IoOp::Kind::kFsync:
      io_uring_prep_fsync(sqe, op.fd(), 0);
      break;
  }
}

// Submits what is queued and waits for `count` completions, storing res by user_data. One
// io_uring_enter submits the batch and waits for all of it (a submit and then a wait took two
// whenever the batch did not complete inline: every read from disk). The kernel waits only when
// it took every queued entry, and `count` completions fit the completion queue (twice the ring),
// so a partial submit comes back at once and the rest goes in the next round.
Status submit_and_reap(io_uring* ring, unsigned count, std::vector<int>* results) {
  unsigned submitted = 0;
  while (submitted < count) {
    int rc = io_uring_submit_and_wait(ring, count);
    if (rc < 0) {
      if (retryable(-rc)) continue;
      // Nothing more can be submitted; reap what is in flight before giving up.
      for (unsigned i = 0; i < submitted; ++i) {
        io_uring_cqe* cqe = nullptr;
        while (io_uring_wait_cqe(ring, &cqe) == -EINTR) {
        }
        if (cqe != nullptr) io_uring_cqe_seen(ring, cqe);
      }
      return Status(Code::kIo, std::string("io_uring submit failed: ") + std::strerror(-rc));
    }
    submitted += static_cast<unsigned>(rc);
  }
  for (unsigned i = 0; i < count; ++i) {
    io_uring_cqe* cqe = nullptr;
    int rc = 0;
    do {
      rc = io_uring_wait_cqe(ring, &cqe);
    } while (rc == -EINTR || rc == -EAGAIN);
    if (rc < 0) return Status(Code::kIo, std::string("io_uring wait failed: ") + std::strerror(-rc));
    (*results)[cqe->user_data] = cqe->res;
    io_uring_cqe_seen(ring, cqe);
  }
  return Status::ok();
}

// Runs one op to completion, alone, on the ring or with the POSIX calls.
Status run_one(io_uring* ring, IoOp& op) {
  while (!op.complete()) {
    int res = 0;
    if (ring != nullptr) {
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      PENSTOCK_CHECK(sqe != nullptr);  // the ring is empty between batches
      prep(sqe, op);
      sqe->user_data = 0;
      std::vector<int> results(1, 0);
      PENSTOCK_RETURN_IF_ERROR(submit_and_reap(ring, 1, &results));
      res = results[0];
    } else {
      ssize_t n = 0;
      switch (op.kind()) {
        case IoOp::Kind::kRead:
          n = ::preadv(op.fd(), op.pending_iov(), op.pending_iovcnt(), static_cast<off_t>(op.pending_offset()));
          break;
        case IoOp::Kind::kWrite:
          n = ::pwritev(op.fd(), op.pending_iov(), op.pending_iovcnt(), static_cast<off_t>(op.pending_offset()));
          break;
        case IoOp::Kind::kFsync:
          n = ::fsync(op.fd());
          break;
      }
      res = n < 0 ? -errno : static_cast<int>(n);
    }
    bool again = false;
    PENSTOCK_RETURN_IF_ERROR(apply_result(op, res, &again));
  }
  return Status::ok();
}

Status run_batch_on_ring(io_uring* ring, std::span<IoOp> ops, bool ordered) {
  size_t queued = 0;
  std::vector<size_t> index;  // sqe slot -> op index
  index.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].complete()) continue;
    index.push_back(i);
  }
  for (size_t k = 0; k < index.size(); ++k) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    PENSTOCK_CHECK(sqe != nullptr);
    prep(sqe, ops[index[k]]);
    sqe->user_data = k;
    if (ordered && k + 1 < index.size()) sqe->flags |= IOSQE_IO_LINK;
    ++queued;
  }
  if (queued == 0) return Status::ok();
  std::vector<int> by_slot(queued, 0);
  PENSTOCK_RETURN_IF_ERROR(submit_and_reap(ring, static_cast<unsigned>(queued), &by_slot));
  Status first_error;
  for (size_t k = 0; k < index.size(); ++k) {
    IoOp& op = ops[index[k]];
    int res = by_slot[k];
    if (!first_error.is_ok()) {
      if (ordered) break;
    }
    bool again = false;
    // In a linked batch a short or failed op cancels the ones after it; those are run again below,
    // in order, once the op before them is complete.
    if (ordered && res == -ECANCELED) {
      again = true;
    } else {
      Status st = apply_result(op, res, &again);
      if (!st.is_ok()) {
        if (first_error.is_ok()) first_error = st;
        continue;
      }
    }
    if (again) {
      Status st = run_one(ring, op);
      if (!st.is_ok() && first_error.is_ok()) first_error = st;
    }
  }
  return first_error;
}

}  // namespace

IoOp IoOp::read(int fd, uint64_t offset, std::initializer_list<std::span<uint8_t>> bufs) {
  PENSTOCK_CHECK(bufs.size() <= static_cast<size_t>(kMaxIov));
  IoOp op;
  op.kind_ = Kind::kRead;
  op.fd_ = fd;
  op.offset_ = offset;
  for (auto b : bufs) {
    if (b.empty()) continue;
    op.iov_[op.iovcnt_++] = iovec{b.data(), b.size()};
    op.total_ += b.size();
  }
  return op;
}

IoOp IoOp::write(int fd, uint64_t offset, std::initializer_list<std::span<const uint8_t>> bufs) {
  PENSTOCK_CHECK(bufs.size() <= static_cast<size_t>(kMaxIov));
  IoOp op;
  op.kind_ = Kind::kWrite;
  op.fd_ = fd;
  op.offset_ = offset;
  for (auto b : bufs) {
    if (b.empty()) continue;
    op.iov_[op.iovcnt_++] = iovec{const_cast<uint8_t*>(b.data()), b.size()};
    op.total_ += b.size();
  }
  return op;
}

IoOp IoOp::fsync(int fd) {
  IoOp op;
  op.kind_ = Kind::kFsync;
  op.fd_ = fd;
  return op;
}

void IoOp::advance(size_t n) {
  if (kind_ == Kind::kFsync) {
    fsynced_ = true;
    return;
  }
  done_ += n;
  while (n > 0 && first_iov_ < iovcnt_) {
    iovec& v = iov_[first_iov_];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      v.iov_len = 0;
      ++first_iov_;
    } else {
      v.iov_base = static_cast<uint8_t*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
}

Status run_io(std::span<IoOp> ops, bool ordered) {
  io_uring* ring = t_ring.get();
  if (ring == nullptr) {
    Status first_error;
    for (IoOp& op : ops) {
      Status st = run_one(nullptr, op);
      if (!st.is_ok()) {
        if (first_error.is_ok()) first_error = st;
        if (ordered) break;
      }
    }
    return first_error;
  }
  // Batches larger than the ring go in ring-sized slices; an ordered batch keeps its order because
  // each slice completes before the next is submitted.
  Status first_error;
  for (size_t start = 0; start < ops.size(); start += kRingDepth) {
    size_t n = std::min<size_t>(kRingDepth, ops.size() - start);
    Status st = run_batch_on_ring(ring, ops.subspan(start, n), ordered);
    if (!st.is_ok()) {
      if (first_error.is_ok()) first_error = st;
      if (ordered) break;
    }
  }
  return first_error;
}

bool io_uring_active() { return t_ring.get() != nullptr; }

void force_posix_io_for_test(bool force) { g_force_posix.store(force, std::memory_order_relaxed); }

}  // namespace penstock::data
