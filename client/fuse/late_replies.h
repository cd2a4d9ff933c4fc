// LateReplies: FUSE replies sent after their op returned, by another thread (op_read's deferred
// reads, answered by the thread their block arrives on; client.h, ReadLater). The session's
// /dev/fuse descriptor closes at unmount and its number may be reused at once (a new socket), so
// the mount waits for these replies first and sends none after (main.cc). No FUSE dependency.
// Thread-safety: every method may be called from any thread at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace penstock::fuse {

class LateReplies {
 public:
  // An op will leave its reply to another thread: false once closing (it must answer itself).
  bool owe();
  // The op answered itself after all.
  void answered_in_op();
  // The thread holding an owed reply: true when it may send it now (then call sent() after);
  // false when the session is closing (no reply; the kernel aborts the request at unmount).
  bool may_send();
  void sent();
  // Waits up to `grace` for the owed replies, then refuses the rest and waits for those being
  // sent. Returns how many got no reply. Call once, after the FUSE loop ended, before unmounting.
  uint64_t close(std::chrono::milliseconds grace);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t owed_ = 0;     // guarded by mu_
  uint64_t sending_ = 0;  // guarded by mu_
  bool closed_ = false;   // guarded by mu_
};

}  // namespace penstock::fuse
