// Sequential-stream detection for read-ahead. One StreamDetector belongs to one open file handle
// and keeps a few stream trackers, so that a record reader and a random sampler on the same handle
// do not disturb each other: each read either belongs to a tracked stream (it lies within `slack`
// of where the stream ended) or replaces the least recently used tracker. Only a read that starts
// exactly where one of the stream's recent reads ended continues it (and is matched to that
// stream first): a stream is sequential after two such reads, or once it reads offset 0; its
// window then opens at `initial_window` and doubles on each read that goes forward, up to
// `max_window`. Random reads get no window and no read-ahead, also those that land near each
// other: a sampler's read rarely starts on another read's end, and the kernel turns one that
// overlaps a cached sample into a read from that sample's end, which happens once, not twice.
// Pure logic (no I/O). Thread-safety: not thread-safe; the owner serializes calls (a mutex per
// handle in Client's ReadContext).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace penstock::client {

struct ReadAheadOptions {
  uint64_t initial_window = 1ull << 20;  // first read-ahead of a stream
  uint64_t max_window = 64ull << 20;     // per stream
  uint64_t slack = 1ull << 20;           // out-of-order tolerance (async FUSE reads may reorder)
  int trackers = 4;                      // streams tracked per handle
};

// What to do for one read.
struct ReadAdvice {
  bool sequential = false;  // the read continues a sequential stream
  uint64_t prefetch_offset = 0;  // range to fetch ahead: [prefetch_offset, prefetch_offset + len)
  uint64_t prefetch_length = 0;  // 0: nothing to fetch ahead
  uint64_t window = 0;           // the stream's window after this read
};

class StreamDetector {
 public:
  explicit StreamDetector(ReadAheadOptions options = {});

  // Records a read of [offset, offset + length) and says whether and what to fetch ahead. A range
  // is handed out once: later calls return only what lies past what the stream already prefetched,
  // and only once less than half a window remains ahead of the reader (so fetches are batched).
  ReadAdvice on_read(uint64_t offset, uint64_t length);

  // Forgets every stream (e.g. after a truncate of the file).
  void reset();

  size_t tracked_streams() const;

 private:
  static constexpr size_t kRecentEnds = 8;  // a READ may overtake this many of its stream's others
  static constexpr uint32_t kConfirmations = 2;  // continuing reads before a window opens
  static constexpr uint64_t kNoEnd = UINT64_MAX;
  struct Stream {
    bool used = false;
    uint64_t next = 0;             // the furthest end of the stream's reads
    uint64_t window = 0;
    uint64_t prefetched_end = 0;   // end of what was already handed out for prefetch
    uint64_t last_use = 0;
    bool confirmed = false;        // sequential: read at offset 0, or continued kConfirmations times
    uint32_t continued = 0;        // reads that started on a recent end
    uint64_t recent_ends[kRecentEnds] = {kNoEnd, kNoEnd, kNoEnd, kNoEnd, kNoEnd, kNoEnd, kNoEnd, kNoEnd};
    static_assert(kRecentEnds == 8, "recent_ends' initializer names every slot");
    size_t ends_at = 0;            // next slot of recent_ends (a ring of the latest reads' ends)
    // Whether a read at `offset` starts where one of the stream's recent reads ended.
    bool ends_at_offset(uint64_t offset) const;
  };
  ReadAheadOptions options_;
  std::vector<Stream> streams_;
  uint64_t clock_ = 0;
};

}  // namespace penstock::client
