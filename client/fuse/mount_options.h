// Settings of penstock-mount and the "-o opt1,opt2" option list of the mount-helper form
// (`penstock-mount META_ADDR MOUNTPOINT -o ...`, exec'd by /sbin/mount.fuse.penstock for
// `mount -t fuse.penstock` and fstab), and the kernel read-ahead setting of a mount's bdi (sysfs).
// Parsing is pure; set_bdi_read_ahead writes one sysfs file. Thread-safety: no shared state.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>
#include <string_view>

#include "common/base/byte_size.h"  // parse_byte_size, for the size options
#include "common/base/result.h"
#include "common/base/status.h"

namespace penstock::fuse {

struct MountSettings {
  std::string meta = "127.0.0.1:7600";  // penstock-meta host:port
  std::string mountpoint;
  int threads = 16;            // most FUSE worker threads
  // FUSE worker threads taking requests at once (worker_pool.h); 0: four per CPU, at least 8
  // and at most `threads`. A thread whose request waits long gives its place to another.
  int active_threads = 0;
  bool clone_fd = false;       // one /dev/fuse fd per worker thread
  // Every open bypasses the kernel page cache (FOPEN_DIRECT_IO): reads and writes go straight
  // between the application's buffer and Penstock's own cache and write-behind, one copy and no
  // page-cache bookkeeping fewer. For checkpoint mounts: ckpt-restore 1.26x, ckpt-write 1.13x
  // here. Costs: no shared writable mmap (MAP_SHARED fails with ENODEV; libfuse 3.14 cannot ask
  // for the kernel's direct-io mmap), and repeated small reads always cross FUSE.
  bool direct_io = false;
  // Write-only opens (O_WRONLY: a checkpoint shard, a dataset file being written) bypass the page
  // cache (FOPEN_DIRECT_IO) on Linux 6.6+, where the kernel keeps other descriptors' cached pages
  // right (direct_writes_supported below, with its limits). Saves the writer's copy into the page cache
  // and the pages' bookkeeping (an O_WRONLY descriptor neither reads nor maps): ckpt-write at
  // 0.77-0.87x the CPU per GiB. Off by default because the writer is then no longer paced by its own
  // copy: a checkpoint burst through it ran 1.7x faster beside training readers on the same two
  // cores and tripled their p99 (docs/performance.md, round 14). For hosts whose cores are not
  // shared with readers during a checkpoint.
  bool direct_writes = false;
  // Many files created in one directory by this mount alone are answered here and sent to the meta
  // server in batches, under a lease on the directory's names (client/lib/create_behind.h): 4
  // processes creating empty files in one directory went from 3.1k to 9.1k/s. Another mount's first
  // use of such a directory waits up to the lease term (penstock-meta --dir-lease-ms, 250 ms) plus
  // 100 ms. Off ("no_create_behind"): every create is a meta round trip.
  bool create_behind = true;
  // WRITE data is spliced from /dev/fuse (SPLICE_READ, when the kernel offers it and a pipe can
  // hold a whole WRITE) and read from the pipe straight into the write-behind buffer: one copy per
  // byte written fewer than reading /dev/fuse into libfuse's buffer and copying from there
  // (ckpt-write 4-10 % less CPU per GiB, 2-6 % faster). Off by default because libfuse then
  // splices every request, and a splice plus a read of the pipe made creates and unlinks 20 %
  // slower (docs/performance.md, round 30): for mounts that mostly write checkpoints.
  bool splice_writes = false;
  bool foreground = false;     // stay in the foreground (no daemonizing)
  bool read_only = false;      // mount read-only ("ro")
  // Mount flags handed to the kernel as given, in order (the last of a pair wins): noexec/exec,
  // nosuid/suid, nodev/dev, noatime. libfuse mounts nosuid,nodev unless told otherwise.
  std::vector<std::string> kernel_flags;
  std::string log_level = "info";
  std::string log_file;        // where logs go once daemonized (default: discarded)
  std::string transport = "auto";  // to data servers: auto | rdma | tcp (metadata always TCP)
  // Data path (client/lib ClientOptions); sizes in bytes, 0 turns each off.
  uint64_t cache_size = 1ull << 30;      // client data cache shared by all files
  uint64_t readahead_max = 64ull << 20;  // largest read-ahead window per sequential stream
  uint64_t dirty_limit = 256ull << 20;   // write-behind bytes not yet on the data servers
  // Kernel read-ahead of the mount (its bdi's read_ahead_kb), set once after mounting. The kernel
  // starts every FUSE mount at 128 KiB, which splits each large read into 128 KiB FUSE requests.
  // Bytes, whole KiB, at most kMaxKernelReadahead; 0 leaves the kernel default. Needs root.
  uint64_t kernel_readahead = kDefaultKernelReadahead;
  // CPU scheduling policy of every thread of the mount: "batch" (SCHED_BATCH) or "normal"
  // (SCHED_OTHER). Batch threads get the same CPU share but do not preempt the thread running
  // when they wake, so the mount's many short wake-ups (each FUSE request, each server reply) do
  // not cut into the application's own threads: a training reader's p99 during a checkpoint
  // burst through the same mount went 7.9x -> 2.1x of its idle p99 (docs/performance.md).
  std::string sched = "batch";
  // FUSE over io_uring (client/fuse/fuse_ring.h): "auto" uses it when the kernel offers it (Linux
  // 6.14+, /sys/module/fuse/parameters/enable_uring = Y), "on" also switches that parameter on
  // (root), "off" keeps /dev/fuse. The kernel then queues each request on its caller's CPU and
  // threads pinned there answer it: 4 processes creating files in one directory went from 5.6-8.5k
  // to 14-23k/s here; restores pay one more copy (docs/performance.md, round 19).
  std::string fuse_uring = "auto";

  static constexpr uint64_t kDefaultKernelReadahead = 1ull << 20;
  static constexpr uint64_t kMaxKernelReadahead = 1ull << 30;
};

// Applies a comma-separated option list to `s`. Penstock options: meta=HOST:PORT, threads=N,
// active_threads=N, clone_fd, direct_io, direct_writes, create_behind, no_create_behind, splice_writes, no_splice_writes, log_level=LEVEL, log_file=PATH, foreground, ro, transport=auto|rdma|tcp,
// cache_size=SIZE, readahead_max=SIZE, dirty_limit=SIZE, kernel_readahead=SIZE (SIZE: bytes with
// an optional K, M, G or T suffix, powers of 1024; kernel_readahead: whole KiB, at most 1G),
// sched=batch|normal, fuse_uring=auto|on|off.
// Accepted and
// ignored (mount(8) and fstab pass them; their effect is built in or handled by mount(8)): rw,
// defaults, nodev, nosuid, dev, suid, exec, noexec, noatime, relatime, atime, auto, noauto, user,
// nouser, users, nofail, _netdev, allow_other, default_permissions, x-* (systemd). kInvalid names
// an unknown option or a bad value.
Status apply_mount_options(std::string_view list, MountSettings* s);

// Whether a kernel speaking FUSE 7.`fuse_minor` keeps other descriptors' cached pages right under
// a direct write (MountSettings::direct_writes): from 7.39 (Linux 6.6) it drops the written range
// from the page cache before sending the write, writing dirty pages of the range back first
// (invalidate_inode_pages2_range). Limits there: a read or page fault racing with the write may
// cache the old bytes again (later kernels drop the range after the write too), and a page that is
// dirtied again while it is being dropped fails the write with EBUSY.
inline constexpr uint32_t kMinorDirectWriteDropsCache = 39;
constexpr bool direct_writes_supported(uint32_t fuse_minor) { return fuse_minor >= kMinorDirectWriteDropsCache; }

// kInvalid unless `bytes` is a valid kernel_readahead value (whole KiB, at most 1 GiB; 0 = keep
// the kernel default). `what` names the option in the message.
Status check_kernel_readahead(uint64_t bytes, std::string_view what);

// Whether /etc/fuse.conf's text (`conf`) lets an unprivileged user mount with allow_other: a line
// that is `user_allow_other` (blanks around it allowed; `#` starts a comment).
bool fuse_conf_allows_other(std::string_view conf);

// Sets the calling thread's scheduling policy to `policy` ("batch" or "normal", see
// MountSettings::sched); threads it starts afterwards inherit it. kInvalid for another name,
// kIo (with the errno) when the kernel refuses.
Status apply_sched_policy(std::string_view policy);

// The name of the bdi (backing device info) of a file system whose st_dev is `dev`: "MAJ:MIN",
// the directory under /sys/class/bdi (FUSE mounts have major 0: "0:NN").
std::string bdi_name(dev_t dev);

// The device number (st_dev) of the FUSE mount at `mountpoint` (an absolute, resolved path), found
// in the text of /proc/self/mountinfo; the last matching line wins (the mount on top). Read from
// mountinfo because stat() of a FUSE mountpoint asks the FUSE daemon, which may not serve yet.
// kNotFound when no FUSE mount is at `mountpoint`.
Result<dev_t> fuse_mount_dev(std::string_view mountinfo, std::string_view mountpoint);

// Sets the read-ahead of the bdi `dev` to `bytes` (rounded down to KiB) by writing
// SYSFS_BDI_DIR/MAJ:MIN/read_ahead_kb; `sysfs_bdi_dir` is "/sys/class/bdi" outside tests. Returns
// the value (KiB) the file held before. kNotFound when there is no such bdi, kNotPermitted when
// the file may not be written (not root), kIo for other failures; the file is then unchanged.
Result<uint64_t> set_bdi_read_ahead(const std::string& sysfs_bdi_dir, dev_t dev, uint64_t bytes);

// How many CPUs a kernel CPU list names ("0-3,8" -> 5; the format of
// /sys/devices/system/cpu/possible): the FUSE ring has one queue per possible CPU. 0 for text that
// is not such a list.
int count_cpu_list(std::string_view list);

}  // namespace penstock::fuse
