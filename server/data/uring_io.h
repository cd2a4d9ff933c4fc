// Disk I/O for the chunk store: batches of positional reads, writes and fsyncs, run with io_uring.
//
// Each thread that calls run_io() gets its own ring (thread_local, created on first use, torn down
// at thread exit), so callers on different worker threads never contend on a ring. A batch is
// submitted with one io_uring_enter(); with `ordered` the ops are linked (IOSQE_IO_LINK) so each
// starts only after the previous one completed: a checksum-table write and the data write it
// covers go down together but in order. If io_uring cannot be set up (kernel without it,
// io_uring_disabled, seccomp) the same calls fall back to preadv/pwritev/fsync with a one-time Warn.
// Thread-safety: run_io() may be called from any thread at once; an IoOp belongs to one call.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>

#include "common/base/status.h"

namespace penstock::data {

// One positional transfer (or an fsync) with up to kMaxIov gathered buffers. The buffers are owned
// by the caller and must stay alive until run_io() returns.
class IoOp {
 public:
  enum class Kind : uint8_t { kRead, kWrite, kFsync };
  static constexpr int kMaxIov = 4;

  // REQUIRES: at most kMaxIov buffers.
  static IoOp read(int fd, uint64_t offset, std::initializer_list<std::span<uint8_t>> bufs);
  static IoOp write(int fd, uint64_t offset, std::initializer_list<std::span<const uint8_t>> bufs);
  static IoOp fsync(int fd);

  Kind kind() const { return kind_; }
  int fd() const { return fd_; }
  size_t total() const { return total_; }
  bool complete() const { return done_ >= total_ && (kind_ != Kind::kFsync || fsynced_); }

  // Internal to run_io(): the not yet transferred part.
  const iovec* pending_iov() const { return iov_ + first_iov_; }
  int pending_iovcnt() const { return iovcnt_ - first_iov_; }
  uint64_t pending_offset() const { return offset_ + done_; }
  // Records `n` bytes transferred (or a finished fsync).
  void advance(size_t n);

 private:
  Kind kind_ = Kind::kRead;
  int fd_ = -1;
  uint64_t offset_ = 0;
  iovec iov_[kMaxIov] = {};
  int iovcnt_ = 0;
  int first_iov_ = 0;
  size_t total_ = 0;
  size_t done_ = 0;
  bool fsynced_ = false;
};

// Runs every op of `ops` to its full length: short transfers are continued, -EINTR and -EAGAIN are
// retried. With `ordered`, op i+1 starts only after op i completed and ops after a failed one are
// not run; without it ops may run in any order and in parallel, and all are attempted.
// Returns the first failure: kNoSpace for ENOSPC/EDQUOT, kIo for any other error (strerror in the
// message) and kIo "unexpected end of file" for a read past the end of a file. The caller adds
// which file and chunk it was.
Status run_io(std::span<IoOp> ops, bool ordered);

// Which engine this thread uses: true for io_uring (sets up this thread's ring if needed).
bool io_uring_active();

// Tests: force the pread/pwrite fallback (true) or go back to io_uring (false) for every thread.
void force_posix_io_for_test(bool force);

}  // namespace penstock::data
