// RecentReads: whether reads of one target are in progress, or ended a moment ago.
//
// The chunk store asks it before each part of an O_DIRECT write: while reads are recent, a write
// goes to the disk in pieces, one after another, instead of whole (ChunkStoreOptions::
// write_piece_while_reading). The chunk store counts a read from before its open until its bytes
// are in memory (copied, or staged in a pipe for the socket), and cancels it when the bytes turn
// out to be in the page cache or there are none to read. The `hold` after the last read is
// there because a training job's reads come one after another with short gaps (each reader is in
// its mount or at another data server between two of them); a write that starts in such a gap
// would otherwise go down whole.
//
// Ownership: a Scope points at its RecentReads, which must outlive it; ChunkStore holds its one by
// shared_ptr and gives a copy to every range it returns with a Scope in it.
// Thread-safety: every method may be called from any thread at once (atomics only).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace penstock::data {

class RecentReads {
 public:
  explicit RecentReads(std::chrono::nanoseconds hold) : hold_ns_(hold.count()) {}
  RecentReads(const RecentReads&) = delete;
  RecentReads& operator=(const RecentReads&) = delete;

  // Counts one read until destroyed (or moved from); an empty one counts nothing.
  class Scope {
   public:
    Scope() = default;
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    Scope(Scope&& o) noexcept : owner_(o.owner_) { o.owner_ = nullptr; }
    Scope& operator=(Scope&& o) noexcept;
    ~Scope() { end(); }
    // Ends it as a read that did not wait for the disk after all: the hold does not start.
    void cancel();

   private:
    friend class RecentReads;
    explicit Scope(RecentReads* owner) : owner_(owner) {}
    void end();

    RecentReads* owner_ = nullptr;
  };

  // A read starts.
  Scope start();
  // Whether a read is in progress or one ended less than `hold` ago.
  bool recent() const;
  // Reads in progress (tests).
  int in_progress() const { return reads_.load(std::memory_order_relaxed); }

 private:
  static int64_t now_ns();

  const int64_t hold_ns_;
  std::atomic<int> reads_{0};
  std::atomic<int64_t> last_end_ns_{INT64_MIN / 2};  // steady clock; "long ago" until a read ends
};

}  // namespace penstock::data
