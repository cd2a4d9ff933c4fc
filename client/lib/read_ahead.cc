#include "client/lib/read_ahead.h"

#include <algorithm>

namespace penstock::client {

StreamDetector::StreamDetector(ReadAheadOptions options)
    : options_(options), streams_(static_cast<size_t>(std::max(1, options.trackers))) {}

void StreamDetector::reset() {
  for (Stream& s : streams_) s = Stream{};
}

size_t StreamDetector::tracked_streams() const {
  size_t n = 0;
  for (const Stream& s : streams_) n += s.used ? 1 : 0;
  return n;
}

ReadAdvice StreamDetector::on_read(uint64_t offset, uint64_t length) {
  ++clock_;
  const uint64_t end = offset + length;
  Stream* match = nullptr;
  for (Stream& s : streams_) {
    if (!s.used) continue;
    // Continues the stream: starts at most `slack` past where it ended and does not lie wholly
    // before it by more than `slack` (reordered concurrent reads of one stream).
    const bool after_ok = offset <= s.next + options_.slack;
    const bool before_ok = end + options_.slack >= s.next;
    if (after_ok && before_ok) {
      match = &s;
      break;
    }
  }
  ReadAdvice advice;
  if (match == nullptr) {
    Stream* victim = &streams_[0];
    for (Stream& s : streams_) {
      if (!s.used) {
        victim = &s;
        break;
      }
      if (s.last_use < victim->last_use) victim = &s;
    }
    *victim = Stream{};
    victim->used = true;
    victim->next = end;
    victim->hits = 1;
    victim->prefetched_end = end;
    victim->last_use = clock_;
    // A read from the very start of the file is the start of a sequential read in practice (and
    // for a small file the only read): fetch ahead at once.
    if (offset == 0) victim->window = std::min(options_.initial_window, options_.max_window);
    match = victim;
    advice.sequential = offset == 0;
  } else {
    Stream& s = *match;
    s.last_use = clock_;
    s.next = std::max(s.next, end);
    ++s.hits;
    if (s.window == 0) {
      s.window = std::min(options_.initial_window, options_.max_window);
    } else {
      s.window = std::min(options_.max_window, s.window * 2);
    }
    advice.sequential = true;
  }
  Stream& s = *match;
  advice.window = s.window;
  if (s.window == 0) return advice;
  if (s.prefetched_end < s.next) s.prefetched_end = s.next;
  const uint64_t target = s.next + s.window;
  const uint64_t ahead = s.prefetched_end - s.next;
  if (ahead * 2 <= s.window && target > s.prefetched_end) {
    advice.prefetch_offset = s.prefetched_end;
    advice.prefetch_length = target - s.prefetched_end;
    s.prefetched_end = target;
  }
  return advice;
}

}  // namespace penstock::client
