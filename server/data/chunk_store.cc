#include "server/data/chunk_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/base/log.h"
#include "common/checksum/checksum.h"
#include "common/layout/layout.h"
#include "common/proto/data_service.h"
#include "server/data/chunk_format.h"
#include "server/data/uring_io.h"

namespace penstock::data {
namespace {

constexpr uint64_t kB = kBlockSize;
static_assert(kBlockSize == proto::data::kChecksumBlock, "clients verify unread ranges in blocks of this size");
// How long DropCaches waits for pages still referenced (by a reply in a socket) to be released.
constexpr std::chrono::milliseconds kHeldPagesWait{1000};

// Closes the descriptor it owns.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(-1); }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

std::string chunk_name(InodeId ino, uint64_t index) {
  return "chunk " + std::to_string(ino.value) + "/" + std::to_string(index);
}

// Pages of the open file `fd` in the page cache (0 when that cannot be told).
uint64_t cached_pages(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return 0;
  const size_t len = static_cast<size_t>(st.st_size);
  void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((len + page - 1) / page);
  uint64_t n = 0;
  if (::mincore(map, len, vec.data()) == 0) {
    for (unsigned char v : vec) n += v & 1;
  }
  ::munmap(map, len);
  return n;
}

// cachestat(2) (Linux 6.5), which Debian 12's headers do not declare yet: 451 in the table x86-64,
// arm64 and most other architectures share.
#ifdef __NR_cachestat
constexpr long kSysCachestat = __NR_cachestat;
#else
constexpr long kSysCachestat = 451;
#endif
struct CachestatRange {
  uint64_t off;
  uint64_t len;
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};
std::atomic<bool> g_cachestat_works{true};

// The page-cache state of [offset, offset + length) of `fd`: whether every page is there (a page
// still being read in counts: cachestat counts the pages present, read or not), and how many are
// dirty or under writeback (an O_DIRECT read of them writes them back and waits first). `known`
// false, and nothing cached, when the kernel cannot tell (an older kernel, a seccomp filter).
struct PageState {
  bool known = false;
  bool all_cached = false;
  uint64_t unwritten = 0;
};
PageState page_state(int fd, uint64_t offset, uint64_t length) {
  if (length == 0) return PageState{true, true, 0};
  if (!g_cachestat_works.load(std::memory_order_relaxed)) return {};
  CachestatRange range{offset, length};
  Cachestat cs{};
  if (::syscall(kSysCachestat, fd, &range, &cs, 0) != 0) {
    if (errno == ENOSYS || errno == EPERM) g_cachestat_works.store(false, std::memory_order_relaxed);
    return {};
  }
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return PageState{true, cs.nr_cache >= (offset + length + page - 1) / page - offset / page,
                   cs.nr_dirty + cs.nr_writeback};
}

// Whether cachestat(2) answers for a fresh file in `dir`; false also marks it missing for
// page_state(). Failing to make the file says nothing about it: assume it works.
bool probe_cachestat(const std::string& dir) {
  const std::string probe = dir + "/.cachestat-probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return g_cachestat_works.load();
  page_state(fd, 0, 4096);
  ::close(fd);
  ::unlink(probe.c_str());
  return g_cachestat_works.load();
}

// The names in `dir` but "." and "..", and but every other dot-name too unless `all`; std::nullopt,
// with errno set, when it cannot be opened.
std::optional<std::vector<std::string>> entry_names(const std::string& dir, bool all = false) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return std::nullopt;
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    const std::string_view name(e->d_name);
    if (name == "." || name == ".." || (!all && name.front() == '.')) continue;
    names.emplace_back(name);
  }
  ::closedir(d);
  return names;
}

Status errno_error(int err, const std::string& what) {
  Code code = (err == ENOSPC || err == EDQUOT) ? Code::kNoSpace : Code::kIo;
  return Status(code, what + ": " + std::strerror(err));
}

// A 4 KiB-aligned buffer that only grows: the bounce buffer of O_DIRECT transfers, one per thread.
class AlignedBuffer {
 public:
  ~AlignedBuffer() { std::free(data_); }
  // At least `n` bytes, aligned to kDataAlignment. Contents are not kept across calls.
  std::span<uint8_t> get(size_t n) {
    if (n > size_) {
      std::free(data_);
      size_t want = (n + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
      data_ = static_cast<uint8_t*>(std::aligned_alloc(kDataAlignment, want));
      PENSTOCK_CHECK(data_ != nullptr);  // out of memory
      size_ = want;
    }
    return std::span<uint8_t>(data_, n);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

thread_local AlignedBuffer t_bounce;

uint64_t round_down(uint64_t v) { return v / kB * kB; }

std::atomic<bool> g_fallocate_warned{false};

Status validate_common(InodeId ino, uint32_t chunk_size) {
  if (!ino.valid()) return Status(Code::kInvalid, "inode 0 is not a file");
  return layout::validate_chunk_size(chunk_size);
}

}  // namespace

// An open chunk file: the buffered descriptor (header, table, everything when direct I/O is off),
// the O_DIRECT one for aligned data blocks (-1 when off), and the header verified at open.
// `header_pending`: opened by a cold read whose data moves with O_DIRECT, and the header not read
// yet; `header` then holds what it must be (the request's chunk size), and the file is not cached
// until the header on disk is read and found to be that (settle_header).
struct ChunkStore::ChunkFile {
  Fd fd;
  Fd direct;
  ChunkHeader header;
  bool readahead_off = false;  // on `fd` (ready_direct_reads)
  bool header_pending = false;
};

namespace {

using ChunkFile = ChunkStore::ChunkFile;

// A chunk file and its length at the start of this request.
struct OpenChunk {
  std::shared_ptr<ChunkFile> file;
  uint64_t length = 0;
  int fd() const { return file->fd.get(); }
  const ChunkHeader& header() const { return file->header; }
};

// Reads one block's table entry range [first, first + n) of an open chunk.
IoOp table_read(const OpenChunk& c, uint64_t first_block, std::vector<uint8_t>* buf) {
  return IoOp::read(c.fd(), c.header().table_offset + first_block * kTableEntrySize, {std::span<uint8_t>(*buf)});
}

// Which slot of `e` matches `sum`: 1 current, 2 previous, 0 neither.
int match_slot(const TableEntry& e, uint64_t sum) {
  if (e.current == sum) return 1;
  if (e.previous == sum) return 2;
  return 0;
}

Status corrupt_block(const Target& t, InodeId ino, uint64_t index, uint64_t block) {
  return Status(Code::kCorrupt, chunk_name(ino, index) + " block " + std::to_string(block) +
                                    " fails its checksum on target " + t.path() +
                                    "; the bytes are not returned (read another replica)");
}

// fsyncs a directory (the names it holds). A directory removed meanwhile is fine.
Status sync_dir(const std::string& dir) {
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return errno == ENOENT ? Status::ok() : errno_error(errno, "cannot open " + dir);
  IoOp op = IoOp::fsync(dfd.get());
  return run_io(std::span<IoOp>(&op, 1), false).with_context("syncing " + dir);
}

// Starts reading from disk what a read of [offset, offset + length) of a chunk of `chunk_size`
// will touch in a file just opened: the header with the table entries of its blocks, and its
// blocks. Issued before the header is read, so a cold read waits for the disk once instead of for
// the header first and the data after it (a chunk written from offset 0 holds header, table and
// data in one extent, create_chunk, so that is one disk request). A short gap between the table
// and the data is read along rather than splitting the request.
void start_cold_read(int fd, uint32_t chunk_size, uint64_t offset, uint64_t length) {
  constexpr uint64_t kMaxGap = 64 * 1024;
  const ChunkHeader h = make_chunk_header(0, 0, chunk_size);
  const uint64_t first_b = offset / kB;
  const uint64_t end_b = (offset + std::max<uint64_t>(length, 1) + kB - 1) / kB;
  const uint64_t table_end = h.table_offset + end_b * kTableEntrySize;
  const uint64_t data_begin = h.data_offset + first_b * kB;
  const uint64_t data_end = h.data_offset + end_b * kB;
  if (data_begin <= table_end + kMaxGap) {
    ::readahead(fd, 0, data_end);
  } else {
    ::readahead(fd, 0, table_end);
    ::readahead(fd, static_cast<off64_t>(data_begin), data_end - data_begin);
  }
}

// The header of chunk (ino, index) from the first kChunkHeaderSize bytes of its file at `path`.
// kNotFound when they are all zero (a crash between create and the first fsync), kCorrupt when
// they do not decode or name another chunk.
Result<ChunkHeader> check_header(const std::string& path, InodeId ino, uint64_t index, std::span<const uint8_t> hdr) {
  if (std::all_of(hdr.begin(), hdr.end(), [](uint8_t b) { return b == 0; })) {
    return Status(Code::kNotFound, chunk_name(ino, index) + " was never written");
  }
  auto h = decode_chunk_header(hdr);
  if (!h.has_value()) return h.error().with_context(path);
  if (h->ino != ino.value || h->chunk_index != index) {
    return Status(Code::kCorrupt, path + " holds the header of chunk " + std::to_string(h->ino) + "/" +
                                      std::to_string(h->chunk_index));
  }
  return *h;
}

// Reads the first kChunkHeaderSize bytes of the chunk file `fd` (at `path`) into `hdr`.
Status read_header_bytes(int fd, const std::string& path, std::span<uint8_t, kChunkHeaderSize> hdr) {
  IoOp op = IoOp::read(fd, 0, {std::span<uint8_t>(hdr)});
  Status st = run_io(std::span<IoOp>(&op, 1), false);
  if (!st.is_ok()) return st.with_context("reading the header of " + path);
  return Status::ok();
}

// Opens an existing chunk and validates its header. kNotFound when there is none: a missing file,
// or one whose header was never written (a crash between create and the first fsync). `cold`,
// when given, is the read that opens it (start_cold_read); when the chunk is at least `direct_from`
// bytes long (0: never), its data will be read with O_DIRECT, so only the header and the checksum
// table are read ahead, and the header is left to be read with that data (header_pending): one
// wait for the disk instead of one for the header and one for the data after it. *size_out: the
// file's size.
Result<std::shared_ptr<ChunkFile>> open_chunk_file(const Target& t, InodeId ino, uint64_t index,
                                                   const ChunkStore::ReadRange* cold, uint64_t direct_from,
                                                   uint64_t* size_out) {
  std::string path = t.chunk_path(ino, index);
  int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return Status(Code::kNotFound, chunk_name(ino, index) + " is not on this target");
    return errno_error(errno, "cannot open " + path);
  }
  auto file = std::make_shared<ChunkFile>();
  file->fd.reset(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return errno_error(errno, "cannot stat " + path);
  uint64_t size = static_cast<uint64_t>(st.st_size);
  *size_out = size;
  if (size < kChunkHeaderSize) {
    if (size == 0) return Status(Code::kNotFound, chunk_name(ino, index) + " was never written");
    return Status(Code::kCorrupt, path + " is shorter than a chunk header");
  }
  if (cold != nullptr) {
    const ChunkHeader expected = make_chunk_header(ino.value, index, cold->chunk_size);
    if (direct_from > 0 && size >= expected.data_offset + direct_from) {
      ::readahead(fd, 0, expected.data_offset);  // the header and the whole table
      file->header = expected;
      file->header_pending = true;
      return file;
    }
    start_cold_read(fd, cold->chunk_size, cold->offset, cold->length);
  }
  std::array<uint8_t, kChunkHeaderSize> hdr{};
  PENSTOCK_RETURN_IF_ERROR(read_header_bytes(fd, path, hdr));
  PENSTOCK_ASSIGN_OR_RETURN(file->header, check_header(path, ino, index, hdr));
  return file;
}

// The chunk's length now (file size minus the data offset), checked against its header. `known`:
// the file's size when the caller has just read it (a fresh open), else it is read here.
Result<OpenChunk> with_length(const Target& t, InodeId ino, uint64_t index, std::shared_ptr<ChunkFile> file,
                              std::optional<uint64_t> known = std::nullopt) {
  uint64_t size = 0;
  if (known.has_value()) {
    size = *known;
  } else {
    struct stat st {};
    if (::fstat(file->fd.get(), &st) != 0) return errno_error(errno, "cannot stat " + t.chunk_path(ino, index));
    size = static_cast<uint64_t>(st.st_size);
  }
  const ChunkHeader& h = file->header;
  if (size < h.data_offset || size - h.data_offset > h.chunk_size) {
    return Status(Code::kCorrupt, t.chunk_path(ino, index) + " has a size (" + std::to_string(size) +
                                      ") that no chunk of " + std::to_string(h.chunk_size) + " bytes can have");
  }
  OpenChunk c;
  c.length = size - h.data_offset;
  c.file = std::move(file);
  return c;
}

Status chunk_size_mismatch(InodeId ino, uint64_t index, uint32_t stored, uint32_t asked) {
  return Status(Code::kInvalid, chunk_name(ino, index) + " was created with chunk size " + std::to_string(stored) +
                                    ", request says " + std::to_string(asked));
}

Status check_chunk_size(const OpenChunk& c, InodeId ino, uint64_t index, uint32_t chunk_size) {
  if (c.header().chunk_size != chunk_size) return chunk_size_mismatch(ino, index, c.header().chunk_size, chunk_size);
  return Status::ok();
}

// fallocate with the given mode; EOPNOTSUPP is not an error (logged once): the file system then
// cannot promise space ahead and ENOSPC may surface from the write itself.
Status reserve(int fd, int mode, uint64_t offset, uint64_t length, const std::string& what) {
  if (length == 0) return Status::ok();
  int rc = 0;
  do {
    rc = ::fallocate(fd, mode, static_cast<off_t>(offset), static_cast<off_t>(length));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return Status::ok();
  if (errno == EOPNOTSUPP) {
    if (!g_fallocate_warned.exchange(true)) {
      PENSTOCK_LOG(Warn) << "fallocate is not supported here (" << what
                         << "); a full disk may then fail a write midway. Put targets on ext4 or xfs";
    }
    return Status::ok();
  }
  return errno_error(errno, what);
}

// Creates a chunk file: header and zeroed table are written to "<index>.tmp", space for them is
// reserved, then it is renamed into place, so a chunk file always starts with a complete header.
// `first_write_end` > 0 (a first write that starts at offset 0 and ends there) reserves the data
// blocks of that write in the same fallocate, so header, table and data lie in one extent and a
// cold read of them is one disk request (the file system would otherwise place the data wherever
// the write-out finds room, often far from the header when many chunks are created at once).
Result<std::shared_ptr<ChunkFile>> create_chunk(const Target& t, InodeId ino, uint64_t index, uint32_t chunk_size,
                                                uint64_t first_write_end) {
  if (index > 0) {  // chunk 0 lies in the bucket itself
    std::string dir = t.inode_dir(ino);
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return errno_error(errno, "cannot create " + dir);
  }
  std::string path = t.chunk_path(ino, index);
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno_error(errno, "cannot create " + tmp);
  auto file = std::make_shared<ChunkFile>();
  file->fd.reset(fd);
  file->header = make_chunk_header(ino.value, index, chunk_size);
  std::vector<uint8_t> head(file->header.data_offset, 0);
  auto encoded = encode_chunk_header(file->header);
  std::copy(encoded.begin(), encoded.end(), head.begin());
  // KEEP_SIZE: the size comes from the header write, so the data blocks reserved past it stay
  // outside the chunk's length until written.
  const uint64_t reserve_end = head.size() + (first_write_end + kB - 1) / kB * kB;
  Status st = reserve(fd, FALLOC_FL_KEEP_SIZE, 0, reserve_end, "reserving the header of " + tmp);
  if (st.is_ok()) {
    IoOp op = IoOp::write(fd, 0, {std::span<const uint8_t>(head)});
    st = run_io(std::span<IoOp>(&op, 1), false);
  }
  if (st.is_ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = errno_error(errno, "cannot rename " + tmp);
  if (!st.is_ok()) {
    ::unlink(tmp.c_str());
    return st.with_context("creating " + chunk_name(ino, index) + " on " + t.path());
  }
  return file;
}

// The bytes [pos, pos + len) of a virtual buffer made of consecutive pieces, copied to dst.
void gather(std::span<const std::span<const uint8_t>> pieces, uint64_t pos, uint64_t len, uint8_t* dst) {
  uint64_t base = 0;
  for (auto p : pieces) {
    uint64_t pend = base + p.size();
    if (pos < pend && len > 0) {
      uint64_t from = pos - base;
      uint64_t n = std::min<uint64_t>(len, p.size() - from);
      std::memcpy(dst, p.data() + from, n);
      dst += n;
      pos += n;
      len -= n;
    }
    base = pend;
  }
}

// Whether a fresh file in `dir` can be opened with O_DIRECT (tmpfs and some FUSE file systems say
// EINVAL). Other failures (a read-only directory) say nothing about O_DIRECT: assume it works and
// let each open decide.
bool probe_direct(const std::string& dir, std::string* why) {
  std::string probe = dir + "/.direct-io-probe";
  int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EINVAL) {
    *why = std::strerror(errno);
    ::unlink(probe.c_str());
    return false;
  }
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return true;
}

}  // namespace

std::string ChunkStoreOptions::describe_io() const {
  if (!any_direct()) return "the page cache for all chunk data";
  std::string mode;
  if (direct_io) {
    mode = "O_DIRECT for all chunk data";
  } else {
    mode = "O_DIRECT for ";
    if (direct_write_min > 0) mode += "writes of " + std::to_string(direct_write_min) + " bytes or more";
    if (direct_write_min > 0 && direct_read_min > 0) mode += " and for ";
    if (direct_read_min > 0) {
      mode += "reads of chunks of " + std::to_string(direct_read_min) + " bytes or more not in the page cache";
      if (buffered_streams) mode += " outside a client's streams";
    }
    mode += ", the page cache for the rest";
  }
  if (write_piece_while_reading > 0) {
    mode += "; while reads run, direct writes go in pieces of " + std::to_string(write_piece_while_reading) + " bytes";
  }
  return mode;
}

ChunkStore::ChunkStore(std::shared_ptr<Target> target, ChunkStoreOptions options)
    : target_(std::move(target)), options_(options) {
  if (options_.any_direct()) {
    std::string why;
    if (probe_direct(target_->path(), &why)) {
      direct_ = true;
    } else {
      direct_warned_ = true;
      PENSTOCK_LOG(Warn) << "target " << target_->path() << " refuses O_DIRECT (" << why
                         << "; tmpfs does): direct I/O is off for it and chunk data goes through the page cache. "
                         << "Put the target on ext4 or xfs for direct I/O";
    }
  }
  if (options_.direct_read_min > 0 && direct_.load()) {
    if (probe_cachestat(target_->path())) {
      direct_read_min_ = options_.direct_read_min;
    } else if (!options_.direct_io) {
      PENSTOCK_LOG(Warn) << "cachestat(2) is missing here (Linux 6.5 has it) or refused, so target " << target_->path()
                         << " cannot tell cached ranges from cold ones: --direct-read-min is off for it and "
                         << "reads go through the page cache. Use --direct-io to read every chunk with O_DIRECT";
    }
  }
}

ChunkStore::~ChunkStore() = default;

bool ChunkStore::direct_reads_on() const {
  // cachestat may also fail later (a seccomp filter): reads then stay buffered.
  return direct_read_min_ > 0 && g_cachestat_works.load(std::memory_order_relaxed);
}

bool ChunkStore::wants_direct_reads(uint64_t chunk_length) const {
  return direct_reads_on() && chunk_length >= direct_read_min_;
}

ChunkStore::ReadPlan ChunkStore::plan_read(const ChunkFile& file, uint64_t chunk_length, uint64_t file_offset,
                                           uint64_t length, bool opened_cold, bool buffered_stream) const {
  // A file may hold an O_DIRECT descriptor for its large writes alone (direct_write_min); a short
  // chunk's reads, and cached ranges of a long one, still come from the page cache (and may be
  // spliced).
  ReadPlan plan;
  const bool has_direct = file.direct.get() >= 0;
  if (has_direct && options_.direct_io) {
    plan.direct = true;
    return plan;
  }
  // Under buffered_streams a stream's reads stay buffered, for the page cache's read-ahead and
  // splicing (docs/architecture.md).
  const bool may_go_direct = has_direct && !buffered_stream && wants_direct_reads(chunk_length);
  if (!may_go_direct && opened_cold) return plan;
  const PageState whole = page_state(file.fd.get(), file_offset, length);
  plan.cached = whole.all_cached;
  // The range's aligned part goes direct, a partial last block of the chunk buffered: a range of
  // that block alone reads buffered (the same I/O, and it may be spliced).
  // (read_blocks: round_down(span_end); file_offset is block-aligned, as every data offset is.)
  const uint64_t aligned = round_down(length);
  if (!may_go_direct || !whole.known || plan.cached || aligned == 0) return plan;
  // Pages not yet written back (a buffered write under direct_write_min) are read from the page
  // cache, as an O_DIRECT read would write them and wait; a dirty partial last block (the
  // buffered tail of a direct write, the usual case) leaves the aligned part direct.
  if (whole.unwritten == 0) {
    plan.direct = true;
  } else if (aligned < length) {
    const PageState head = page_state(file.fd.get(), file_offset, aligned);
    plan.direct = head.known && head.unwritten == 0;
  }
  return plan;
}

void ChunkStore::open_direct(ChunkFile& file, const std::string& path) {
  if (!direct_.load() || file.direct.get() >= 0) return;
  int fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
  if (fd >= 0) {
    file.direct.reset(fd);
    return;
  }
  // Not fatal: the buffered descriptor does the same I/O. EINVAL means the file system refuses it.
  if (errno == EINVAL) direct_ = false;
  if (!direct_warned_.exchange(true)) {
    PENSTOCK_LOG(Warn) << "cannot open " << path << " with O_DIRECT (" << std::strerror(errno)
                       << "); chunk data of target " << target_->path() << " goes through the page cache";
  }
}

Result<std::shared_ptr<ChunkFile>> ChunkStore::acquire(InodeId ino, uint64_t chunk_index, const ReadRange* cold,
                                                        std::optional<uint64_t>* opened_size) {
  const Key key{ino.value, chunk_index};
  if (options_.fd_cache > 0) {
    std::lock_guard<std::mutex> g(fd_mu_);
    auto it = fds_.find(key);
    if (it != fds_.end()) {
      fd_lru_.splice(fd_lru_.begin(), fd_lru_, it->second.lru);
      return it->second.file;
    }
  }
  uint64_t size = 0;
  // Only a target that takes O_DIRECT skips reading a long chunk's data ahead, and under
  // direct_read_min only for a read outside a stream (plan_read).
  const bool stream = cold != nullptr && cold->buffered_stream;
  const uint64_t direct_from = !direct_.load()     ? 0
                               : options_.direct_io ? 1
                               : direct_reads_on() && !stream ? direct_read_min_
                                                               : 0;
  PENSTOCK_ASSIGN_OR_RETURN(std::shared_ptr<ChunkFile> file,
                            open_chunk_file(*target_, ino, chunk_index, cold, direct_from, &size));
  if (opened_size != nullptr) *opened_size = size;
  if (options_.direct_io || wants_direct_reads(size - std::min<uint64_t>(size, file->header.data_offset))) {
    ready_direct_reads(*file, target_->chunk_path(ino, chunk_index));
  }
  if (!file->header_pending) remember(ino, chunk_index, file);  // else settle_header() does
  return file;
}

Status ChunkStore::settle_header(InodeId ino, uint64_t chunk_index, const std::shared_ptr<ChunkFile>& file,
                                 std::span<const uint8_t> hdr) {
  PENSTOCK_ASSIGN_OR_RETURN(const ChunkHeader h, check_header(target_->chunk_path(ino, chunk_index), ino, chunk_index, hdr));
  // check_header's decode checks the offsets against the chunk size, so an equal chunk size means
  // the header the read assumed.
  if (h.chunk_size != file->header.chunk_size) return chunk_size_mismatch(ino, chunk_index, h.chunk_size, file->header.chunk_size);
  file->header_pending = false;
  remember(ino, chunk_index, file);
  return Status::ok();
}

Status ChunkStore::read_header_now(InodeId ino, uint64_t chunk_index, const std::shared_ptr<ChunkFile>& file) {
  std::array<uint8_t, kChunkHeaderSize> hdr{};
  PENSTOCK_RETURN_IF_ERROR(read_header_bytes(file->fd.get(), target_->chunk_path(ino, chunk_index), hdr));
  return settle_header(ino, chunk_index, file, hdr);
}

void ChunkStore::ready_direct_reads(ChunkFile& file, const std::string& path) {
  open_direct(file, path);
  // The buffered descriptor then reads only the header, the table and a partial last block: no
  // read-ahead, which would pull in data the O_DIRECT one reads again.
  if (file.direct.get() >= 0 && !file.readahead_off) {
    ::posix_fadvise(file.fd.get(), 0, 0, POSIX_FADV_RANDOM);
    file.readahead_off = true;
  }
}

void ChunkStore::remember(InodeId ino, uint64_t chunk_index, std::shared_ptr<ChunkFile> file) {
  if (options_.fd_cache == 0) return;
  const Key key{ino.value, chunk_index};
  std::vector<std::shared_ptr<ChunkFile>> closing;  // closed after fd_mu_ is released
  std::lock_guard<std::mutex> g(fd_mu_);
  auto it = fds_.find(key);
  if (it != fds_.end()) {
    // Two readers of one chunk opened it at once: keep the first, this one closes with its request.
    fd_lru_.splice(fd_lru_.begin(), fd_lru_, it->second.lru);
    return;
  }
  while (fds_.size() >= options_.fd_cache && !fd_lru_.empty()) {
    auto victim = fds_.find(fd_lru_.back());
    closing.push_back(std::move(victim->second.file));
    fds_.erase(victim);
    fd_lru_.pop_back();
  }
  fd_lru_.push_front(key);
  fds_.emplace(key, FdEntry{std::move(file), fd_lru_.begin()});
}

void ChunkStore::forget(InodeId ino, uint64_t chunk_index) {
  std::shared_ptr<ChunkFile> closing;
  std::lock_guard<std::mutex> g(fd_mu_);
  auto it = fds_.find(Key{ino.value, chunk_index});
  if (it == fds_.end()) return;
  closing = std::move(it->second.file);
  fd_lru_.erase(it->second.lru);
  fds_.erase(it);
}

void ChunkStore::forget_inode(InodeId ino) {
  std::vector<std::shared_ptr<ChunkFile>> closing;
  std::lock_guard<std::mutex> g(fd_mu_);
  auto it = fds_.lower_bound(Key{ino.value, 0});
  while (it != fds_.end() && it->first.first == ino.value) {
    closing.push_back(std::move(it->second.file));
    fd_lru_.erase(it->second.lru);
    it = fds_.erase(it);
  }
}

proto::data::TargetCounters ChunkStore::counters_now() const {
  proto::data::TargetCounters now;
  counters_.visit_fields([&](const auto&... live) {
    now.visit_fields([&](auto&... out) { ((out = live.load(std::memory_order_relaxed)), ...); });
  });
  return now;
}

size_t ChunkStore::cached_files() const {
  std::lock_guard<std::mutex> g(fd_mu_);
  return fds_.size();
}

Result<uint64_t> ChunkStore::write(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint32_t offset,
                                   std::span<const uint8_t> data) {
  PENSTOCK_RETURN_IF_ERROR(validate_common(ino, chunk_size));
  if (data.empty()) return Status(Code::kInvalid, "write of 0 bytes to " + chunk_name(ino, chunk_index));
  if (static_cast<uint64_t>(offset) + data.size() > chunk_size) {
    return Status(Code::kInvalid, "write [" + std::to_string(offset) + ", +" + std::to_string(data.size()) +
                                      ") does not fit a chunk of " + std::to_string(chunk_size) + " bytes");
  }
  auto inode_guard = inode_locks_.lock_shared(ino.value);
  auto chunk_guard = chunk_locks_.lock({ino.value, chunk_index});

  bool created = false;
  std::optional<uint64_t> opened_size;
  auto file = acquire(ino, chunk_index, nullptr, &opened_size);
  if (!file.has_value() && file.error().code() == Code::kNotFound) {
    file = create_chunk(*target_, ino, chunk_index, chunk_size, offset == 0 ? data.size() : 0);
    created = true;
  }
  if (!file.has_value()) return file.error();
  const std::string path = target_->chunk_path(ino, chunk_index);
  const bool direct_write =
      options_.direct_io || (options_.direct_write_min > 0 && data.size() >= options_.direct_write_min);
  PENSTOCK_ASSIGN_OR_RETURN(OpenChunk c, with_length(*target_, ino, chunk_index, *file, opened_size));
  PENSTOCK_RETURN_IF_ERROR(check_chunk_size(c, ino, chunk_index, chunk_size));
  // Under the exclusive chunk lock: no reader of this chunk looks at the descriptors meanwhile. A
  // chunk this write makes long enough gets the descriptor its later reads use.
  if (direct_write) open_direct(*c.file, path);
  if (options_.direct_io || wants_direct_reads(std::max<uint64_t>(c.length, uint64_t{offset} + data.size()))) {
    ready_direct_reads(*c.file, path);
  }
  const int fd = c.fd();

  const uint64_t cur_len = c.length;
  const uint64_t off = offset;
  const uint64_t end = off + data.size();
  const uint64_t new_len = std::max(cur_len, end);
  // Blocks whose checksum changes: from the one holding min(offset, old end) (a partial old last
  // block is re-summed over the zeros that now follow it) to the one holding the write's end.
  const uint64_t first_b = std::min(off, cur_len) / kB;
  const uint64_t last_b = (end - 1) / kB;
  const uint64_t nb = last_b - first_b + 1;

  // Blocks with old bytes that the write does not cover must be read and verified.
  auto old_end_of = [&](uint64_t b) { return std::min(b * kB + kB, cur_len); };
  auto needs_old = [&](uint64_t b) {
    uint64_t bstart = b * kB;
    uint64_t oend = old_end_of(b);
    return oend > bstart && !(off <= bstart && end >= oend);
  };
  std::vector<uint64_t> old_blocks;
  if (needs_old(first_b)) old_blocks.push_back(first_b);
  if (last_b != first_b && needs_old(last_b)) old_blocks.push_back(last_b);

  std::vector<uint8_t> table(nb * kTableEntrySize);
  std::vector<std::vector<uint8_t>> old_bytes(old_blocks.size());
  std::vector<IoOp> reads;
  reads.push_back(table_read(c, first_b, &table));
  for (size_t i = 0; i < old_blocks.size(); ++i) {
    uint64_t bstart = old_blocks[i] * kB;
    old_bytes[i].resize(old_end_of(old_blocks[i]) - bstart);
    // Partial blocks are few and small: read through the buffered descriptor, no alignment needed.
    reads.push_back(IoOp::read(fd, c.header().data_offset + bstart, {std::span<uint8_t>(old_bytes[i])}));
  }
  Status st = run_io(reads, false);
  if (!st.is_ok()) return st.with_context("reading " + path);

  std::vector<TableEntry> entries(nb);
  for (uint64_t i = 0; i < nb; ++i) entries[i] = decode_table_entry(table.data() + i * kTableEntrySize);
  std::vector<uint64_t> old_sum(old_blocks.size());
  for (size_t i = 0; i < old_blocks.size(); ++i) {
    uint64_t sum = checksum::xxh3(old_bytes[i]);
    const TableEntry& e = entries[old_blocks[i] - first_b];
    if (match_slot(e, sum) == 0) return corrupt_block(*target_, ino, chunk_index, old_blocks[i]);
    old_sum[i] = sum;
  }

  // New table entries: `current` = the block's new contents, `previous` = what is on disk now.
  std::vector<uint8_t> new_table(nb * kTableEntrySize);
  std::vector<uint8_t> block(kB);
  for (uint64_t b = first_b; b <= last_b; ++b) {
    uint64_t bstart = b * kB;
    uint64_t bend = std::min(bstart + kB, new_len);
    uint64_t sum = 0;
    if (bstart >= off && bend <= end) {
      sum = checksum::xxh3(data.subspan(bstart - off, bend - bstart));
    } else if (bstart >= cur_len && bend <= off && bend - bstart == kB) {
      sum = zero_block_checksum();
    } else {
      std::fill(block.begin(), block.end(), 0);
      for (size_t i = 0; i < old_blocks.size(); ++i) {
        if (old_blocks[i] == b) std::memcpy(block.data(), old_bytes[i].data(), old_bytes[i].size());
      }
      uint64_t from = std::max(bstart, off);
      uint64_t to = std::min(bend, end);
      if (to > from) std::memcpy(block.data() + (from - bstart), data.data() + (from - off), to - from);
      sum = checksum::xxh3(std::span<const uint8_t>(block.data(), bend - bstart));
    }
    TableEntry e = entries[b - first_b];
    uint64_t previous = e.current;
    for (size_t i = 0; i < old_blocks.size(); ++i) {
      if (old_blocks[i] == b) previous = old_sum[i];
    }
    encode_table_entry(TableEntry{sum, previous}, new_table.data() + (b - first_b) * kTableEntrySize);
  }

  // Reserve the data blocks first: ENOSPC arrives here, before any byte of the chunk changed. A
  // chunk's first write at offset 0 had its blocks reserved with the header (create_chunk).
  const uint64_t alloc_start = c.header().data_offset + off / kB * kB;
  const uint64_t alloc_end = c.header().data_offset + (end + kB - 1) / kB * kB;
  const bool reserved_at_create = created && off == 0;
  if (!reserved_at_create) {
    st = reserve(fd, FALLOC_FL_KEEP_SIZE, alloc_start, alloc_end - alloc_start, "reserving space in " + path);
  }
  if (!st.is_ok()) {
    // Give back what a partial reservation took past the end of the file (KEEP_SIZE leaves the
    // file's bytes as they were; this only returns blocks no byte of the chunk lives in).
    uint64_t file_end = (c.header().data_offset + cur_len + kB - 1) / kB * kB;
    uint64_t from = std::max(alloc_start, file_end);
    if (alloc_end > from) {
      (void)::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(from),
                        static_cast<off_t>(alloc_end - from));
    }
    if (created) {
      forget(ino, chunk_index);
      ::unlink(path.c_str());
    }
    return st.with_context("write to " + chunk_name(ino, chunk_index) + " on " + target_->path());
  }

  const IoOp table_write =
      IoOp::write(fd, c.header().table_offset + first_b * kTableEntrySize, {std::span<const uint8_t>(new_table)});
  if (!direct_write || c.file->direct.get() < 0) {
    // Table before data, linked in one submit: until the data lands the old bytes match `previous`.
    IoOp ops[2] = {table_write, IoOp::write(fd, c.header().data_offset + off, {data})};
    st = run_io(ops, true);
  } else {
    // O_DIRECT moves whole aligned blocks: the blocks [off, end) touches are assembled in the
    // aligned buffer (old bytes kept, zeros in a gap) and written whole; only a partial block at the
    // new end of the chunk goes through the buffered descriptor, so the file size stays exact.
    const uint64_t a = round_down(off);
    const uint64_t content_end = std::min(round_down(end - 1) + kB, new_len);
    const uint64_t direct_end = std::max(a, round_down(content_end));
    // A write that starts on a block and needs no bytes after its end is those blocks as they are:
    // from an aligned buffer (the RPC server's ByteBuffer) it goes to O_DIRECT without the copy.
    const bool as_is = off == a && content_end == end &&
                       reinterpret_cast<uintptr_t>(data.data()) % kDataAlignment == 0;
    std::span<const uint8_t> buf = data;
    if (!as_is) {
      std::span<uint8_t> bounce = t_bounce.get(content_end - a);
      // Zeros only where neither old bytes nor the write land: before `off` and after `end`.
      std::fill(bounce.begin(), bounce.begin() + static_cast<ptrdiff_t>(off - a), 0);
      if (content_end > end) std::fill(bounce.begin() + static_cast<ptrdiff_t>(end - a), bounce.end(), 0);
      for (size_t i = 0; i < old_blocks.size(); ++i) {
        const uint64_t bstart = old_blocks[i] * kB;
        if (bstart < a) continue;  // an old partial last block before a gap: not rewritten
        std::memcpy(bounce.data() + (bstart - a), old_bytes[i].data(), old_bytes[i].size());
      }
      std::memcpy(bounce.data() + (off - a), data.data(), data.size());
      buf = bounce;
    }
    ++(as_is ? unbounced_writes_ : bounced_writes_);
    // The aligned blocks go down whole, or in pieces one after another while reads of this target
    // are recent (write_piece_while_reading); the table goes with the first part, linked before
    // it, and the buffered tail after the last.
    const uint64_t piece = options_.write_piece_while_reading / kB * kB;  // whole blocks, as O_DIRECT moves them
    uint64_t done = a;
    bool first = true;
    bool split = false;
    uint64_t parts = 0;
    while (st.is_ok() && (first || done < direct_end)) {
      uint64_t n = direct_end - done;
      if (piece > 0 && n > piece && recent_reads_->recent()) {
        n = piece;
        split = true;
      }
      std::vector<IoOp> ops;
      if (first) ops.push_back(table_write);
      if (n > 0) {
        ops.push_back(IoOp::write(c.file->direct.get(), c.header().data_offset + done,
                                  {std::span<const uint8_t>(buf.data() + (done - a), n)}));
        ++parts;
      }
      st = run_io(ops, true);
      first = false;
      done += n;
    }
    if (split) write_pieces_ += parts;
    if (st.is_ok() && content_end > direct_end) {
      IoOp tail = IoOp::write(fd, c.header().data_offset + direct_end,
                              {std::span<const uint8_t>(buf.data() + (direct_end - a), content_end - direct_end)});
      st = run_io(std::span<IoOp>(&tail, 1), false);
    }
  }
  if (!st.is_ok()) return st.with_context("writing " + path);
  if (created) remember(ino, chunk_index, std::move(c.file));
  return new_len;
}

// The start of every read: checks the range and opens the chunk; an empty file (no ChunkFile) when
// there is no chunk. REQUIRES: the caller holds the inode and chunk locks shared.
Result<std::shared_ptr<ChunkFile>> ChunkStore::open_for_read(InodeId ino, uint64_t chunk_index, const ReadRange& range,
                                                             uint64_t* chunk_length, bool* read_started) {
  const uint32_t chunk_size = range.chunk_size;
  PENSTOCK_RETURN_IF_ERROR(validate_common(ino, chunk_size));
  if (range.offset + range.length > chunk_size) {
    return Status(Code::kInvalid, "read [" + std::to_string(range.offset) + ", +" + std::to_string(range.length) +
                                      ") does not fit a chunk of " + std::to_string(chunk_size) + " bytes");
  }
  // A chunk whose data is read with O_DIRECT gets only its table read ahead (open_chunk_file).
  std::optional<uint64_t> opened_size;
  auto file = acquire(ino, chunk_index, &range, &opened_size);
  if (read_started != nullptr) *read_started = opened_size.has_value();
  if (!file.has_value()) {
    if (file.error().code() == Code::kNotFound) return std::shared_ptr<ChunkFile>();
    return file.error();
  }
  auto c = with_length(*target_, ino, chunk_index, *file, opened_size);
  if (!c.has_value() && (*file)->header_pending) {
    // A size no chunk of the request's chunk size can have: the header says why (another chunk
    // size, damage, never written), and is read now.
    Status st = read_header_now(ino, chunk_index, *file);
    if (st.code() == Code::kNotFound) return std::shared_ptr<ChunkFile>();
    PENSTOCK_RETURN_IF_ERROR(st);
  }
  if (!c.has_value()) return c.error();
  PENSTOCK_RETURN_IF_ERROR(check_chunk_size(*c, ino, chunk_index, chunk_size));
  *chunk_length = c->length;
  return std::move(c->file);
}

// One read, under the inode and chunk locks held shared: the chunk opened, the range's whole
// blocks, how they are read (plan_read) and the read counted in recent_reads_ from before the
// open (a cold one reads the header from disk) until its bytes are read or, for a range sent
// unread, staged. Cancelled when the file was open and the range is in the page cache, and for a
// hole.
struct ChunkStore::ReadRequest {
  ReadRequest(ChunkStore& store, InodeId ino, uint64_t chunk_index)
      : ino(ino),
        chunk_index(chunk_index),
        inode_guard(store.inode_locks_.lock_shared(ino.value)),
        chunk_guard(store.chunk_locks_.lock_shared({ino.value, chunk_index})),
        reading(store.recent_reads_->start()) {}
  const InodeId ino;
  const uint64_t chunk_index;
  LockTable<uint64_t>::Guard inode_guard;
  LockTable<std::pair<uint64_t, uint64_t>, PairHash>::Guard chunk_guard;
  RecentReads::Scope reading;
  std::shared_ptr<ChunkFile> file;  // null: no chunk
  uint64_t chunk_len = 0;
  bool read_started = false;  // the open started reading the range from disk (start_cold_read)
  uint64_t n = 0;             // bytes of the chunk the range holds; 0: a hole
  uint64_t span_start = 0;    // the whole blocks that hold them, in the chunk's data
  uint64_t span_end = 0;
  ReadPlan plan;
};

Status ChunkStore::start_read(ReadRequest& r, const ReadRange& range) {
  PENSTOCK_ASSIGN_OR_RETURN(r.file, open_for_read(r.ino, r.chunk_index, range, &r.chunk_len, &r.read_started));
  const uint64_t offset = range.offset;
  const uint64_t length = range.length;
  if (r.file != nullptr && offset < r.chunk_len && length > 0) {
    r.n = std::min<uint64_t>(length, r.chunk_len - offset);
    r.span_start = round_down(offset);
    r.span_end = std::min(round_down(offset + r.n - 1) + kB, r.chunk_len);
    const uint64_t data_offset = r.file->header.data_offset;
    r.plan = plan_read(*r.file, r.chunk_len, data_offset + r.span_start, r.span_end - r.span_start, r.read_started,
                       range.buffered_stream);
  }
  // A header left to the O_DIRECT read of the data (open_chunk_file) is read now when no such read
  // follows: the range is cached, has pages to be written back, or is past the end.
  if (r.file != nullptr && r.file->header_pending && !(r.n > 0 && r.plan.direct)) {
    Status st = read_header_now(r.ino, r.chunk_index, r.file);
    if (st.code() == Code::kNotFound) {
      r.file = nullptr;
      r.n = 0;
    } else if (!st.is_ok()) {
      return st;
    }
  }
  if (r.n == 0) {
    if (!r.read_started) r.reading.cancel();  // a hole: nothing read
    return Status::ok();
  }
  // A cold open has already asked for the range (start_cold_read), and pages being read in look
  // cached to cachestat: that read waits for the disk whatever it says.
  if (!r.read_started && !r.plan.direct && r.plan.cached) r.reading.cancel();
  return Status::ok();
}

bool ChunkStore::sendable_unread(const ReadRequest& r, uint32_t offset) {
  // The receiver can verify only whole blocks; O_DIRECT data is not in the page cache to send.
  return r.n == 0 || (r.span_start == offset && r.span_end == offset + r.n && !r.plan.direct);
}

Result<ChunkStore::UnreadRange> ChunkStore::unread_range(ReadRequest& r) {
  UnreadRange range;
  if (r.n == 0) return range;  // a hole
  const OpenChunk c{r.file, r.chunk_len};
  const uint64_t first_b = r.span_start / kB;
  const uint64_t nb = (r.n + kB - 1) / kB;
  const uint64_t file_offset = c.header().data_offset + r.span_start;
  // Start reading the bytes from disk now, so a cold read waits for the table and the data at
  // once rather than one after the other (the splice comes later); a no-op when they are cached,
  // and already done when this read opened the file.
  if (!r.read_started) ::readahead(c.fd(), static_cast<off64_t>(file_offset), r.n);
  std::vector<uint8_t> table(nb * kTableEntrySize);
  IoOp op = table_read(c, first_b, &table);
  Status st = run_io(std::span<IoOp>(&op, 1), false);
  if (!st.is_ok()) return st.with_context("reading the checksums of " + target_->chunk_path(r.ino, r.chunk_index));
  range.block_sums.reserve(nb * 2);
  for (uint64_t b = 0; b < nb; ++b) {
    const TableEntry e = decode_table_entry(table.data() + b * kTableEntrySize);
    range.block_sums.push_back(e.current);
    range.block_sums.push_back(e.previous);
  }
  range.fd = c.fd();
  range.file_offset = file_offset;
  range.length = static_cast<uint32_t>(r.n);
  // The staging comes later: the range's keep holds the read's count (and the locks' release
  // comes now, as a write may change the bytes after this returns: the receiver re-reads on a
  // mismatch). Members end in reverse: the read's count first, then its counter, then the file.
  struct Keep {
    std::shared_ptr<ChunkFile> file;
    std::shared_ptr<RecentReads> counter;
    RecentReads::Scope reading;
  };
  range.keep = std::make_shared<const Keep>(Keep{std::move(r.file), recent_reads_, std::move(r.reading)});
  return range;
}

Result<uint32_t> ChunkStore::read_blocks(const ReadRequest& r, uint32_t offset, std::span<uint8_t> out) {
  if (r.n == 0) return 0u;
  const InodeId ino = r.ino;
  const uint64_t chunk_index = r.chunk_index;
  const OpenChunk c{r.file, r.chunk_len};
  const uint64_t off = offset;
  const uint64_t n = r.n;
  const uint64_t first_b = r.span_start / kB;
  const uint64_t last_b = (off + n - 1) / kB;
  const uint64_t nb = last_b - first_b + 1;
  const uint64_t span_start = r.span_start;
  const uint64_t span_end = r.span_end;
  std::vector<uint8_t> table(nb * kTableEntrySize);
  std::span<uint8_t> body = out.first(n);

  if (r.plan.direct) {
    // O_DIRECT: whole blocks into an aligned buffer, a partial last block of the chunk through the
    // buffered descriptor (an aligned read would stop short at the end of the file), verify. The
    // aligned buffer is `out` itself when it is those blocks (aligned memory, starting on a block,
    // ending on one or at the end of the chunk: a reply's ByteBuffer, bytes.h), else the bounce
    // buffer, copied from after the check.
    const uint64_t direct_end = round_down(span_end);
    const bool as_is = off == span_start && off + n == span_end &&
                       reinterpret_cast<uintptr_t>(body.data()) % kDataAlignment == 0;
    std::span<uint8_t> span = as_is ? body : t_bounce.get(span_end - span_start);
    counters_.direct_reads.fetch_add(1, std::memory_order_relaxed);
    if (as_is) ++unbounced_reads_;
    std::vector<IoOp> ops{table_read(c, first_b, &table)};
    // A cold open's header is read in this batch (header_pending): checked before any byte is used.
    std::array<uint8_t, kChunkHeaderSize> hdr{};
    const bool with_header = c.file->header_pending;
    if (with_header) ops.push_back(IoOp::read(c.fd(), 0, {std::span<uint8_t>(hdr)}));
    if (direct_end > span_start) {
      ops.push_back(IoOp::read(c.file->direct.get(), c.header().data_offset + span_start,
                               {span.first(direct_end - span_start)}));
    }
    if (span_end > direct_end) {
      ops.push_back(IoOp::read(c.fd(), c.header().data_offset + direct_end, {span.subspan(direct_end - span_start)}));
    }
    Status st = run_io(ops, false);
    if (!st.is_ok()) return st.with_context("reading " + target_->chunk_path(ino, chunk_index));
    if (with_header) {
      st = settle_header(ino, chunk_index, c.file, hdr);
      if (st.code() == Code::kNotFound) return 0u;  // never written: a hole, as open_chunk_file says
      PENSTOCK_RETURN_IF_ERROR(st);
      ++joined_header_reads_;
    }
    for (uint64_t b = first_b; b <= last_b; ++b) {
      const uint64_t bstart = b * kB;
      const uint64_t bend = std::min(bstart + kB, c.length);
      const uint64_t sum = checksum::xxh3(span.subspan(bstart - span_start, bend - bstart));
      TableEntry e = decode_table_entry(table.data() + (b - first_b) * kTableEntrySize);
      if (match_slot(e, sum) == 0) return corrupt_block(*target_, ino, chunk_index, b);
    }
    if (!as_is) std::memcpy(body.data(), span.data() + (off - span_start), n);
    return static_cast<uint32_t>(n);
  }

  // The caller's buffer receives its bytes directly; only the parts of the first and last block
  // outside it land in small side buffers (needed to verify those blocks).
  std::vector<uint8_t> head(off - span_start);
  std::vector<uint8_t> tail(span_end - (off + n));
  IoOp ops[2] = {
      table_read(c, first_b, &table),
      IoOp::read(c.fd(), c.header().data_offset + span_start, {std::span<uint8_t>(head), body, std::span<uint8_t>(tail)}),
  };
  Status st = run_io(ops, false);
  if (!st.is_ok()) return st.with_context("reading " + target_->chunk_path(ino, chunk_index));

  const std::span<const uint8_t> pieces[3] = {head, body, tail};
  std::vector<uint8_t> block(kB);
  for (uint64_t b = first_b; b <= last_b; ++b) {
    uint64_t bstart = b * kB;
    uint64_t bend = std::min(bstart + kB, c.length);
    uint64_t sum = 0;
    if (bstart >= off && bend <= off + n) {
      sum = checksum::xxh3(body.subspan(bstart - off, bend - bstart));
    } else {
      gather(pieces, bstart - span_start, bend - bstart, block.data());
      sum = checksum::xxh3(std::span<const uint8_t>(block.data(), bend - bstart));
    }
    TableEntry e = decode_table_entry(table.data() + (b - first_b) * kTableEntrySize);
    if (match_slot(e, sum) == 0) return corrupt_block(*target_, ino, chunk_index, b);
  }
  return static_cast<uint32_t>(n);
}

Result<std::optional<ChunkStore::UnreadRange>> ChunkStore::read_unverified(InodeId ino, uint64_t chunk_index,
                                                                         uint32_t chunk_size, uint32_t offset,
                                                                         uint32_t length) {
  ReadRequest r(*this, ino, chunk_index);
  PENSTOCK_RETURN_IF_ERROR(start_read(r, ReadRange{chunk_size, offset, length}));
  if (!sendable_unread(r, offset)) {
    if (!r.read_started) r.reading.cancel();  // read() reads it, and counts itself
    return std::optional<UnreadRange>();
  }
  PENSTOCK_ASSIGN_OR_RETURN(UnreadRange range, unread_range(r));
  return std::optional<UnreadRange>(std::move(range));
}

Result<uint32_t> ChunkStore::read(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint32_t offset,
                                  std::span<uint8_t> out) {
  ReadRequest r(*this, ino, chunk_index);
  PENSTOCK_RETURN_IF_ERROR(start_read(r, ReadRange{chunk_size, offset, out.size()}));
  return read_blocks(r, offset, out);
}

Result<ChunkStore::ReplyRead> ChunkStore::read_for_reply(InodeId ino, uint64_t chunk_index, uint32_t chunk_size,
                                                         uint32_t offset, uint32_t length, bool unread_ok,
                                                         ByteBuffer* out, bool sequential) {
  out->clear();
  ReadRequest r(*this, ino, chunk_index);
  const bool stream = sequential && options_.buffered_streams;
  PENSTOCK_RETURN_IF_ERROR(start_read(r, ReadRange{chunk_size, offset, length, stream}));
  ReplyRead reply;
  if (unread_ok && sendable_unread(r, offset)) {
    PENSTOCK_ASSIGN_OR_RETURN(UnreadRange range, unread_range(r));
    reply.unread = std::move(range);
    return reply;
  }
  out->resize(r.n);
  auto n = read_blocks(r, offset, std::span<uint8_t>(out->data(), out->size()));
  if (!n.has_value()) {
    out->clear();
    return n.error();
  }
  out->resize(*n);  // fewer only for a chunk found never written (a hole)
  reply.length = *n;
  return reply;
}

Status ChunkStore::cut_chunk(InodeId ino, uint64_t chunk_index, uint32_t chunk_size, uint64_t keep) {
  auto chunk_guard = chunk_locks_.lock({ino.value, chunk_index});
  std::optional<uint64_t> opened_size;
  auto file = acquire(ino, chunk_index, nullptr, &opened_size);
  if (!file.has_value()) return file.error().code() == Code::kNotFound ? Status::ok() : file.error();
  PENSTOCK_ASSIGN_OR_RETURN(OpenChunk c, with_length(*target_, ino, chunk_index, std::move(*file), opened_size));
  PENSTOCK_RETURN_IF_ERROR(check_chunk_size(c, ino, chunk_index, chunk_size));
  if (keep >= c.length) return Status::ok();
  const std::string path = target_->chunk_path(ino, chunk_index);
  if (keep % kB != 0) {
    // The new last block shrinks: verify what it holds now, then store the checksum of the part
    // kept (old one as `previous`, valid until the ftruncate below lands).
    uint64_t b = keep / kB;
    uint64_t bstart = b * kB;
    std::vector<uint8_t> old(std::min(bstart + kB, c.length) - bstart);
    std::vector<uint8_t> table(kTableEntrySize);
    IoOp reads[2] = {table_read(c, b, &table),
                     IoOp::read(c.fd(), c.header().data_offset + bstart, {std::span<uint8_t>(old)})};
    Status st = run_io(reads, false);
    if (!st.is_ok()) return st.with_context("reading " + path);
    TableEntry e = decode_table_entry(table.data());
    uint64_t old_sum = checksum::xxh3(old);
    if (match_slot(e, old_sum) == 0) return corrupt_block(*target_, ino, chunk_index, b);
    uint64_t new_sum = checksum::xxh3(std::span<const uint8_t>(old.data(), keep - bstart));
    encode_table_entry(TableEntry{new_sum, old_sum}, table.data());
    IoOp w = IoOp::write(c.fd(), c.header().table_offset + b * kTableEntrySize, {std::span<const uint8_t>(table)});
    st = run_io(std::span<IoOp>(&w, 1), true);
    if (!st.is_ok()) return st.with_context("writing " + path);
  }
  if (::ftruncate(c.fd(), static_cast<off_t>(c.header().data_offset + keep)) != 0) {
    return errno_error(errno, "cannot cut " + path);
  }
  return Status::ok();
}

Status ChunkStore::truncate(InodeId ino, uint64_t file_size, uint32_t chunk_size) {
  PENSTOCK_RETURN_IF_ERROR(validate_common(ino, chunk_size));
  if (file_size > static_cast<uint64_t>(INT64_MAX)) {
    return Status(Code::kInvalid, "Truncate: size " + std::to_string(file_size) +
                                      " is past the largest file (2^63 - 1 bytes); nothing was cut");
  }
  auto inode_guard = inode_locks_.lock(ino.value);
  PENSTOCK_ASSIGN_OR_RETURN(std::vector<uint64_t> chunks, target_->list_chunks(ino));
  const uint64_t keep_count = layout::chunk_count(file_size, chunk_size);
  std::vector<std::string> changed_dirs;  // the directories that named a removed chunk
  for (uint64_t index : chunks) {
    if (index >= keep_count) {
      forget(ino, index);  // no request of this inode runs: the inode lock is exclusive
      std::string path = target_->chunk_path(ino, index);
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_error(errno, "cannot remove " + path);
      std::string dir = target_->chunk_dir(ino, index);
      if (std::find(changed_dirs.begin(), changed_dirs.end(), dir) == changed_dirs.end()) changed_dirs.push_back(dir);
    } else if (index == keep_count - 1) {
      uint64_t keep = file_size - index * static_cast<uint64_t>(chunk_size);
      PENSTOCK_RETURN_IF_ERROR(cut_chunk(ino, index, chunk_size, keep));
    }
  }
  for (const std::string& dir : changed_dirs) PENSTOCK_RETURN_IF_ERROR(sync_dir(dir));
  return Status::ok();
}

Status ChunkStore::remove(InodeId ino) {
  if (!ino.valid()) return Status(Code::kInvalid, "inode 0 is not a file");
  auto inode_guard = inode_locks_.lock(ino.value);
  forget_inode(ino);  // before the unlinks: a cached descriptor would keep a removed file alive
  bool changed = false;
  const std::string first = target_->chunk_path(ino, 0);
  for (const std::string& path : {first, first + ".tmp"}) {
    if (::unlink(path.c_str()) == 0) {
      changed = true;
    } else if (errno != ENOENT) {
      return errno_error(errno, "cannot remove " + path);
    }
  }
  std::string dir = target_->inode_dir(ino);
  std::optional<std::vector<std::string>> names = entry_names(dir, /*all=*/true);  // rmdir needs all gone
  if (names.has_value()) {
    for (const auto& name : *names) {
      std::string path = dir + "/" + name;
      if (::unlink(path.c_str()) != 0 && errno != ENOENT) return errno_error(errno, "cannot remove " + path);
    }
    if (::rmdir(dir.c_str()) != 0 && errno != ENOENT) return errno_error(errno, "cannot remove " + dir);
    changed = true;
  } else if (errno != ENOENT) {
    return errno_error(errno, "cannot list " + dir);
  }
  if (!changed) return Status::ok();
  return sync_dir(target_->bucket_dir(ino));
}

Status ChunkStore::sync(InodeId ino) {
  if (!ino.valid()) return Status(Code::kInvalid, "inode 0 is not a file");
  auto inode_guard = inode_locks_.lock_shared(ino.value);
  PENSTOCK_ASSIGN_OR_RETURN(std::vector<uint64_t> chunks, target_->list_chunks(ino));
  if (chunks.empty()) return Status::ok();
  // fsync in batches (bounded open descriptors); within a batch the fsyncs run in parallel.
  constexpr size_t kBatch = 64;
  for (size_t start = 0; start < chunks.size(); start += kBatch) {
    std::vector<Fd> fds;
    std::vector<IoOp> ops;
    for (size_t i = start; i < std::min(chunks.size(), start + kBatch); ++i) {
      std::string path = target_->chunk_path(ino, chunks[i]);
      Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0) {
        if (errno == ENOENT) continue;
        return errno_error(errno, "cannot open " + path);
      }
      ops.push_back(IoOp::fsync(fd.get()));
      fds.push_back(std::move(fd));
    }
    if (start == 0) {
      // The directory entries: chunk 0's name and the inode dir's (bucket dir), the names of
      // chunks 1 and up (inode dir, when there are any).
      std::vector<std::string> dirs{target_->bucket_dir(ino)};
      if (chunks.back() > 0) dirs.push_back(target_->inode_dir(ino));
      for (const std::string& dir : dirs) {
        Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (fd.get() < 0) return errno_error(errno, "cannot open " + dir);
        ops.push_back(IoOp::fsync(fd.get()));
        fds.push_back(std::move(fd));
      }
    }
    Status st = run_io(ops, false);
    if (!st.is_ok()) return st.with_context("syncing inode " + std::to_string(ino.value) + " on " + target_->path());
  }
  return Status::ok();
}

Result<uint64_t> ChunkStore::chunk_length(InodeId ino, uint64_t chunk_index) {
  auto inode_guard = inode_locks_.lock_shared(ino.value);
  auto chunk_guard = chunk_locks_.lock_shared({ino.value, chunk_index});
  std::optional<uint64_t> opened_size;
  PENSTOCK_ASSIGN_OR_RETURN(std::shared_ptr<ChunkFile> file, acquire(ino, chunk_index, nullptr, &opened_size));
  PENSTOCK_ASSIGN_OR_RETURN(OpenChunk c, with_length(*target_, ino, chunk_index, std::move(file), opened_size));
  return c.length;
}

Result<ChunkStore::DropStats> ChunkStore::drop_caches() {
  DropStats stats;
  {
    std::vector<std::shared_ptr<ChunkFile>> closing;  // closed after fd_mu_ is released
    std::lock_guard<std::mutex> g(fd_mu_);
    for (auto& [key, entry] : fds_) closing.push_back(std::move(entry.file));
    stats.fds_closed = fds_.size();
    fds_.clear();
    fd_lru_.clear();
  }
  // The page cache: every chunk file under chunks/<bucket>/ (chunk 0) and chunks/<bucket>/<inode>/.
  // No chunk lock is needed: sync_file_range and DONTNEED never change a byte, and a file removed
  // meanwhile is skipped.
  const std::string chunks = target_->path() + "/chunks";
  std::vector<std::string> held;  // files with pages DONTNEED could not drop yet
  std::optional<std::vector<std::string>> buckets = entry_names(chunks);
  if (!buckets.has_value()) return errno_error(errno, "cannot list " + chunks);
  // Writes out and drops the pages of one file; false when it is no regular file (or is gone).
  auto drop_file = [&](const std::string& path) -> Result<bool> {
    Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (fd.get() < 0) return false;  // removed meanwhile
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    // Dirty pages are not dropped by DONTNEED: write them out first (data only, no journal).
    if (::sync_file_range(fd.get(), 0, 0,
                          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER) != 0) {
      return errno_error(errno, "cannot write back " + path + " before dropping its cache");
    }
    if (int rc = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED); rc != 0) {
      return errno_error(rc, "cannot drop the page cache of " + path);
    }
    ++stats.files;
    if (cached_pages(fd.get()) > 0) held.push_back(path);
    return true;
  };
  for (const std::string& bucket : *buckets) {
    const std::string bdir = chunks + "/" + bucket;
    // A bucket or inode directory that cannot be listed is not a directory, or was removed meanwhile.
    for (const std::string& entry : entry_names(bdir).value_or(std::vector<std::string>())) {
      const std::string path = bdir + "/" + entry;
      PENSTOCK_ASSIGN_OR_RETURN(bool was_file, drop_file(path));
      if (was_file) continue;
      for (const std::string& name : entry_names(path).value_or(std::vector<std::string>())) {
        PENSTOCK_RETURN_IF_ERROR(drop_file(path + "/" + name).status());
      }
    }
  }
  // DONTNEED skips pages something still references: a read sent a moment ago can hold its pages
  // in a socket until the peer acknowledges them (spliced replies, file_bulk.h). Drop those again
  // once released, for a bounded time.
  const auto give_up = std::chrono::steady_clock::now() + kHeldPagesWait;
  while (!held.empty() && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::vector<std::string> still;
    for (const std::string& path : held) {
      Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (fd.get() < 0) continue;
      ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
      if (cached_pages(fd.get()) > 0) still.push_back(path);
    }
    held = std::move(still);
  }
  if (!held.empty()) {
    PENSTOCK_LOG(Info) << "DropCaches: " << held.size() << " chunk file(s) of " << target_->path()
                       << " keep pages in use after " << kHeldPagesWait.count() << " ms (I/O running?)";
  }
  return stats;
}

}  // namespace penstock::data
