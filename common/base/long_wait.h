// Long waits on pooled threads. Code about to block for long (write-behind back-pressure, say)
// calls before_long_wait(); a pool whose threads take turns at a few places (the mount's FUSE
// workers, client/fuse/worker_pool.h) installs a hook on each of its threads that hands the
// thread's place to another, so one slow request does not hold up the requests behind it.
// Thread-safety: the hook is per thread; both calls act on the calling thread only.
#pragma once

namespace penstock {

using LongWaitHook = void (*)(void* arg);

// Installs `hook` (called with `arg`) for this thread; nullptr removes it.
void set_long_wait_hook(LongWaitHook hook, void* arg);

// Runs this thread's hook, if it has one; does nothing elsewhere. Cheap: one thread-local load.
void before_long_wait();

}  // namespace penstock
