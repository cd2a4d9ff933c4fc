// The signal that wakes a mount thread blocked in a system call when the mount stops: a worker
// waiting in read() on /dev/fuse (worker_pool.cc) or a ring thread in io_uring_enter (fuse_ring.cc).
// Its handler does nothing and is installed without SA_RESTART, so the call returns EINTR and the
// thread looks at its stop flag.
#pragma once

#include <signal.h>

namespace penstock::fuse {

inline constexpr int kWakeSignal = SIGUSR2;

// Installs the no-op handler of kWakeSignal for the whole process (idempotent).
void install_wake_signal();

}  // namespace penstock::fuse
