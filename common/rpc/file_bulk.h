// FileBulk: a range of an open file that an RpcServer handler hands back as its response's bulk, so
// the bytes go from the file's page cache to the socket without a copy through user space.
//
// The server stages the range on the handler's thread: splice(2) moves page references from the
// file into a pipe (a disk read blocks that thread, not an I/O thread), and the connection's
// writer later splices the pipe into the socket. Where splicing is not possible (the file system
// cannot splice, the pipe cannot be sized, out of descriptors) the range is read into memory
// instead (pread), so a staged FileBulk always yields its bytes.
//
// A pipe holds references to page-cache pages, not copies: a write to the file after staging may
// show in the bytes sent. Handlers use FileBulk only where the receiver verifies what it got
// (penstock-data's reads, checked against block checksums by the client).
//
// Thread-safety: PipePool is thread-safe; a StagedBulk belongs to one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "common/base/bytes.h"
#include "common/base/result.h"

namespace penstock::rpc {

struct FileBulk {
  std::shared_ptr<const void> keep;  // keeps `fd` open until the range is staged
  int fd = -1;
  uint64_t offset = 0;
  uint32_t length = 0;
};

// An owned pipe (both ends closed on destruction) sized to hold a whole staged range.
class Pipe {
 public:
  Pipe(int read_fd, int write_fd, size_t capacity) : r_(read_fd), w_(write_fd), capacity_(capacity) {}
  ~Pipe();
  Pipe(const Pipe&) = delete;
  Pipe& operator=(const Pipe&) = delete;
  int read_fd() const { return r_; }
  int write_fd() const { return w_; }
  size_t capacity() const { return capacity_; }

 private:
  int r_;
  int w_;
  size_t capacity_;
};

// Empty pipes kept for reuse (a pipe costs four syscalls to make and size).
class PipePool {
 public:
  static constexpr size_t kCapacity = 1 << 20;  // bytes a pooled pipe holds
  // Idle pipes kept: 16 MiB of pipe buffer, a quarter of Linux's default per-user soft limit
  // (/proc/sys/fs/pipe-user-pages-soft) for unprivileged daemons.
  static constexpr size_t kMaxIdle = 16;

  // An empty pipe of kCapacity bytes; an error when none can be made (descriptors, pipe limits).
  // After the first pipe that cannot be sized, every later call fails at once (logged once): the
  // callers then read into memory instead of paying for a pipe per request.
  Result<std::unique_ptr<Pipe>> take();
  // Returns a pipe. REQUIRES: it is empty (everything spliced in was spliced out).
  void give_back(std::unique_ptr<Pipe> pipe);

 private:
  std::mutex mu_;  // leaf
  std::vector<std::unique_ptr<Pipe>> idle_;
  bool unsizable_ = false;  // guarded by mu_: a pipe could not be sized to kCapacity
};

// Whether a range of `length` bytes at file `offset` may be spliced into one pooled pipe with a
// blocking splice: its start lies on a page of `page_size` bytes and it fits the pipe, so it takes
// at most kCapacity / page_size of the pipe's slots (one per page) and the splice never waits for
// the pipe to drain. With 64 KiB pages a 4 KiB-aligned range is refused: it could need one slot
// more than the pipe has.
bool fits_one_pipe(uint64_t offset, uint64_t length, uint64_t page_size);

// A FileBulk made ready to send: either in a pipe (`pipe`, `bytes` of it) or in memory (`memory`).
struct StagedBulk {
  std::unique_ptr<Pipe> pipe;
  ByteBuffer memory;
  uint32_t bytes = 0;  // may be short of the FileBulk's length when the file ended early
};

// Stages `f`: in a pipe from `pool` when f.length fits one and splicing works, else read into
// memory. An error only when the file cannot be read at all (EIO); bytes past the file's end are
// simply not there (StagedBulk::bytes is short).
Result<StagedBulk> stage_file_bulk(const FileBulk& f, PipePool& pool);

}  // namespace penstock::rpc
