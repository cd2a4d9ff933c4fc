// FUSE over io_uring for penstock-mount (Linux 6.14+ with the fuse module parameter enable_uring;
// FUSE protocol 7.42). The kernel then hands each request to a queue of the CPU its caller runs on,
// and this mount serves every queue with threads pinned to that CPU: a request and its reply wake
// threads on the caller's own CPU, where over /dev/fuse they woke an idle CPU (on this VM type that
// cost made 4 processes creating files in one directory 1.8x slower on two CPUs than on one:
// docs/performance.md, round 19).
//
// libfuse 3.14 has no io_uring support, so this file speaks the kernel side itself and lets libfuse
// decode and answer each request: a request from the ring is laid out as /dev/fuse would deliver it
// (header + per-op struct written just in front of the payload, which stays where the kernel put it)
// and given to fuse_session_process_buf(); the reply libfuse writes reaches our fuse_custom_io
// writev, which copies it into the ring entry of the request this thread serves (a thread-local
// pointer: every op of fuse_ops.cc answers on its own thread) before the thread commits it and
// fetches the next. Everything else (FUSE_INIT, FORGET, INTERRUPT, notifications) stays on
// /dev/fuse and libfuse's own loop.
//
// Sequence (client/fuse/main.cc): FuseRing::prepare() before fuse_session_mount() (the kernel
// decides whether to offer the ring when it sends FUSE_INIT, at mount time); attach() after it and
// before the INIT reply: it installs the custom io, whose writev adds FUSE_OVER_IO_URING to the INIT
// reply when the kernel offered it. Then start() registers the entries of every queue; stop() after
// the session ended and the mount is gone, before fuse_session_destroy(). Once the INIT reply
// carried the flag the kernel holds every request until all queues have an entry, so start() turns
// the kernel back to /dev/fuse (a register it must refuse) when it cannot register them all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "client/fuse/fuse_ops.h"  // FUSE_USE_VERSION, fuse_session

namespace penstock::fuse {

class FuseRing {
 public:
  // mode: "auto" (use the ring when the kernel offers it), "on" (also set the fuse module's
  // enable_uring parameter first; needs root) or "off" (nullptr at once). nullptr with `why_not`
  // set when the ring cannot be used; the mount then serves /dev/fuse as before. `threads_per_queue`
  // threads (and ring entries) serve each CPU's queue. Call before fuse_session_mount().
  static std::unique_ptr<FuseRing> prepare(const std::string& mode, int threads_per_queue, std::string* why_not);

  // Installs the custom io on the mounted session `se` (before its INIT request is answered);
  // false with `why_not` when libfuse refuses it.
  bool attach(fuse_session* se, std::string* why_not);

  ~FuseRing();
  FuseRing(const FuseRing&) = delete;
  FuseRing& operator=(const FuseRing&) = delete;

  // After the INIT request was answered. True when requests now come through the ring; false with
  // `why_not` when the kernel did not take it (it then keeps using /dev/fuse).
  bool start(std::string* why_not);

  // Waits for the serving threads, which end when the kernel ends the connection (unmount).
  // REQUIRES: the session loop has returned and fuse_session_unmount() was called.
  void stop();

  // The number of queues (possible CPUs) and threads serving them, for the log.
  int queues() const;
  int threads() const;

  struct Impl;

 private:
  explicit FuseRing(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The payload buffer of the FUSE_READ the calling ring thread serves, when it holds `size` bytes:
// a reply built there (op_read's direct reads) is not copied again. nullptr on other threads and
// for other requests (a WRITE's data lies there).
uint8_t* ring_reply_buffer(size_t size);

// Whether the calling thread serves a ring request now: its reply must come from this thread,
// within the op (a /dev/fuse request may be answered later, from any thread).
bool on_ring_thread();

// Runs `fn` once the reply of the request the calling thread serves has reached the kernel, on a
// notifier thread (notifier.h): after the commit on a ring thread (the reply is only captured
// while the op runs), at once on a /dev/fuse thread (fuse_reply_* wrote it). For notifications the
// kernel would otherwise wait on with the caller's locks held; run on the request thread, they
// could wait for requests no free thread reads.
void after_reply(std::function<void()> fn);
// Runs what /dev/fuse threads handed to after_reply and ends its thread: once the loop has ended
// and the session is unmounted (a notification then fails at once), before it is destroyed.
void stop_after_reply();

}  // namespace penstock::fuse
