// Settings of penstock-mount and the "-o opt1,opt2" option list of the mount-helper form
// (`penstock-mount META_ADDR MOUNTPOINT -o ...`, exec'd by /sbin/mount.fuse.penstock for
// `mount -t fuse.penstock` and fstab). Pure parsing. Thread-safety: pure.
#pragma once

#include <string>
#include <string_view>

#include "common/base/result.h"
#include "common/base/status.h"

namespace penstock::fuse {

struct MountSettings {
  std::string meta = "127.0.0.1:7600";  // penstock-meta host:port
  std::string mountpoint;
  int threads = 16;            // most FUSE worker threads (fuse_loop_config max_threads)
  bool clone_fd = false;       // one /dev/fuse fd per worker thread
  bool foreground = false;     // stay in the foreground (no daemonizing)
  bool read_only = false;      // mount read-only ("ro")
  std::string log_level = "info";
  std::string log_file;        // where logs go once daemonized (default: discarded)
  std::string transport = "auto";  // to data servers: auto | rdma | tcp (metadata always TCP)
  // Data path (client/lib ClientOptions); sizes in bytes, 0 turns each off.
  uint64_t cache_size = 1ull << 30;      // client data cache shared by all files
  uint64_t readahead_max = 64ull << 20;  // largest read-ahead window per sequential stream
  uint64_t dirty_limit = 256ull << 20;   // write-behind bytes not yet on the data servers
};

// Applies a comma-separated option list to `s`. Penstock options: meta=HOST:PORT, threads=N,
// clone_fd, log_level=LEVEL, log_file=PATH, foreground, ro, transport=auto|rdma|tcp,
// cache_size=SIZE, readahead_max=SIZE, dirty_limit=SIZE (SIZE: bytes with an optional K, M, G or
// T suffix, powers of 1024). Accepted and
// ignored (mount(8) and fstab pass them; their effect is built in or handled by mount(8)): rw,
// defaults, nodev, nosuid, dev, suid, exec, noexec, noatime, relatime, atime, auto, noauto, user,
// nouser, users, nofail, _netdev, allow_other, default_permissions, x-* (systemd). kInvalid names
// an unknown option or a bad value.
Status apply_mount_options(std::string_view list, MountSettings* s);

// Parses a byte size: digits with an optional K, M, G or T suffix (powers of 1024; "KiB" etc.
// too). kInvalid otherwise, or on overflow.
Result<uint64_t> parse_byte_size(std::string_view text);

}  // namespace penstock::fuse
