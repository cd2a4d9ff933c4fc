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

bool StreamDetector::Stream::ends_at_offset(uint64_t offset) const {
  return offset == next || std::find(std::begin(recent_ends), std::end(recent_ends), offset) != std::end(recent_ends);
}

ReadAdvice StreamDetector::on_read(uint64_t offset, uint64_t length) {
  ++clock_;
  const uint64_t end = offset + length;
  // The stream this read continues: it starts where one of the stream's recent reads ended
  // (concurrent FUSE reads of one stream arrive reordered, but each starts on another one's end).
  // A confirmed stream first, when a reordered stream has left two trackers.
  Stream* match = nullptr;
  for (Stream& s : streams_) {
    if (s.used && s.ends_at_offset(offset) && (match == nullptr || (s.confirmed && !match->confirmed))) match = &s;
  }
  const bool continues = match != nullptr;
  for (Stream& s : streams_) {
    if (match != nullptr) break;
    // Else the stream it belongs to: it starts at most `slack` past where the stream ended and
    // does not lie wholly before it by more than `slack`.
    if (s.used && offset <= s.next + options_.slack && end + options_.slack >= s.next) match = &s;
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
    match = victim;
  } else if (end > match->next || continues) {
    match->next = std::max(match->next, end);
    if (continues && !match->confirmed && ++match->continued >= kConfirmations) match->confirmed = true;
    // A confirmed stream's window grows with every read that goes forward, also one that skips
    // bytes (a record format's padding, or pages the kernel had cached).
    if (match->confirmed) {
      match->window = match->window == 0 ? std::min(options_.initial_window, options_.max_window)
                                         : std::min(options_.max_window, match->window * 2);
    }
  }
  Stream& s = *match;
  s.last_use = clock_;
  s.recent_ends[s.ends_at++ % kRecentEnds] = end;
  // A read from the very start of the file is the start of a sequential read in practice (and for
  // a small file the only read): fetch ahead at once, also when it arrives after its successor.
  if (offset == 0 && !s.confirmed) {
    s.confirmed = true;
    s.window = std::max(s.window, std::min(options_.initial_window, options_.max_window));
  }
  advice.sequential = s.confirmed;
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
