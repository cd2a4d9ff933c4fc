// Backoff: the pause between tries of something that may come back soon (a restarting server, a
// directory lease that ends, a lost batch): `first`, then twice as long after each pause, up to
// `most`. One object per retry loop; not thread-safe.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace penstock {

class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  Backoff(std::chrono::milliseconds first, std::chrono::milliseconds most) : pause_(first), most_(most) {}

  std::chrono::milliseconds pause() const { return pause_; }
  // True when the next pause would end before `deadline`.
  bool fits(Clock::time_point deadline) const { return Clock::now() + pause_ < deadline; }
  // Sleeps the pause, then doubles it, up to `most` (the constructor's, or this call's).
  void sleep() { sleep(most_); }
  void sleep(std::chrono::milliseconds most) {
    std::this_thread::sleep_for(pause_);
    grow(most);
  }
  // Doubles the pause, up to `most`, without sleeping (for a caller that waits on a timer).
  void grow() { grow(most_); }
  void grow(std::chrono::milliseconds most) { pause_ = std::min(pause_ * 2, most); }
  // sleep() when the pause fits before `deadline`; otherwise false, at once.
  bool sleep_before(Clock::time_point deadline) {
    if (!fits(deadline)) return false;
    sleep();
    return true;
  }

 private:
  std::chrono::milliseconds pause_;
  std::chrono::milliseconds most_;
};

}  // namespace penstock
