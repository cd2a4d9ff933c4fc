#include "common/rpc/file_bulk.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/base/log.h"

namespace penstock::rpc {

bool fits_one_pipe(uint64_t offset, uint64_t length, uint64_t page_size) {
  return page_size > 0 && length <= PipePool::kCapacity && offset % page_size == 0;
}

Pipe::~Pipe() {
  ::close(r_);
  ::close(w_);
}

Result<std::unique_ptr<Pipe>> PipePool::take() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (unsizable_) return Status(Code::kUnavailable, "pipes cannot be sized for splicing here");
    if (!idle_.empty()) {
      std::unique_ptr<Pipe> p = std::move(idle_.back());
      idle_.pop_back();
      return p;
    }
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    return Status(Code::kUnavailable, std::string("cannot make a pipe: ") + std::strerror(errno));
  }
  auto pipe = std::make_unique<Pipe>(fds[0], fds[1], kCapacity);
  const int got = ::fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(kCapacity));
  if (got < static_cast<int>(kCapacity)) {
    Status st(Code::kUnavailable, "cannot size a pipe to " + std::to_string(kCapacity) + " bytes: " +
                                      (got < 0 ? std::strerror(errno) : std::to_string(got) + " granted") +
                                      " (see /proc/sys/fs/pipe-max-size and pipe-user-pages-soft)");
    std::lock_guard<std::mutex> lock(mu_);
    if (!unsizable_) {
      unsizable_ = true;
      PENSTOCK_LOG(Warn) << st.message() << "; reads are copied instead of spliced from now on";
    }
    return st;
  }
  return pipe;
}

void PipePool::give_back(std::unique_ptr<Pipe> pipe) {
  std::lock_guard<std::mutex> lock(mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(pipe));
}

namespace {

// Splices f into a fresh pipe. False (nothing usable staged) when splicing is not possible.
bool stage_in_pipe(const FileBulk& f, PipePool& pool, StagedBulk* out) {
  static const uint64_t page_size = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (!fits_one_pipe(f.offset, f.length, page_size)) return false;
  auto pipe = pool.take();
  if (!pipe.has_value()) return false;
  loff_t off = static_cast<loff_t>(f.offset);
  size_t left = f.length;
  while (left > 0) {
    const ssize_t n = ::splice(f.fd, &off, (*pipe)->write_fd(), nullptr, left, SPLICE_F_MOVE);
    if (n > 0) {
      left -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) break;  // the file ends here
    if (errno == EINTR) continue;
    // Nothing spliced (the file system cannot splice): the pipe is still empty and reusable.
    // Part of the range in it: the pipe is closed. Either way the caller reads instead.
    if (left == f.length) pool.give_back(std::move(*pipe));
    return false;
  }
  out->pipe = std::move(*pipe);
  out->bytes = static_cast<uint32_t>(f.length - left);
  return true;
}

}  // namespace

Result<StagedBulk> stage_file_bulk(const FileBulk& f, PipePool& pool) {
  StagedBulk out;
  if (f.length == 0) return out;
  if (stage_in_pipe(f, pool, &out)) return out;
  out.memory.resize(f.length);
  size_t got = 0;
  while (got < f.length) {
    const ssize_t n = ::pread(f.fd, out.memory.data() + got, f.length - got, static_cast<off_t>(f.offset + got));
    if (n > 0) {
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) break;
    if (errno == EINTR) continue;
    return Status(Code::kIo, "reading " + std::to_string(f.length) + " bytes at offset " + std::to_string(f.offset) +
                                 " for a response: " + std::strerror(errno));
  }
  out.memory.resize(got);
  out.bytes = static_cast<uint32_t>(got);
  return out;
}

}  // namespace penstock::rpc
