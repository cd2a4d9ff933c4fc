// How the data-path processes (penstock-mount, penstock-data) configure glibc malloc.
// Thread-safety: call from main() before any thread starts.
#pragma once

namespace penstock {

// The data path allocates and frees 1-4 MiB buffers all the time (the mount's cache blocks and
// write-behind buffers, a data server's request and reply buffers). By default glibc serves them
// with fresh mmap()s, gives freed memory back to the kernel, and keeps one arena per thread, so a
// buffer freed by one thread is not reused by the next allocating thread; each new buffer then
// page-faults and zeroes every page again. This keeps them in one heap that is not trimmed below
// 256 MiB: buffers of up to 64 MiB come from the heap, and every thread allocates from the one
// arena (small allocations still go through each thread's cache without a lock).
// docs/performance.md, round 28: page faults took 15-20 % of the mount's CPU in ckpt-restore.
void keep_large_buffers_mapped();

}  // namespace penstock
