#include "client/lib/read_ahead.h"

#include <algorithm>
#include <iterator>

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
    // Belongs to the stream: starts at most `slack` past where it ended and does not lie wholly
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
    victim->prefetched_end = end;
    victim->last_use = clock_;
    victim->recent_ends[0] = end;
    victim->ends_at = 1;
    // A read from the very start of the file is the start of a sequential read in practice (and
    // for a small file the only read): fetch ahead at once.
    if (offset == 0) {
      victim->confirmed = true;
      victim->window = std::min(options_.initial_window, options_.max_window);
    }
    match = victim;
  } else {
    Stream& s = *match;
    // Continues the stream only when it starts where one of its recent reads ended: concurrent
    // FUSE reads of one stream arrive reordered, but each starts on another one's end.
    const bool continues = offset == s.next || std::find(std::begin(s.recent_ends), std::end(s.recent_ends),
                                                         offset) != std::end(s.recent_ends);
    s.last_use = clock_;
    s.next = std::max(s.next, end);
    s.recent_ends[s.ends_at++ % kRecentEnds] = end;
    if (continues && !s.confirmed && ++s.continued >= kConfirmations) s.confirmed = true;
    if (continues && s.confirmed) {
      s.window = s.window == 0 ? std::min(options_.initial_window, options_.max_window)
                               : std::min(options_.max_window, s.window * 2);
    }
  }
  advice.sequential = match->confirmed;
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
