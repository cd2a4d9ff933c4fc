#include "client/fuse/mount_options.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <optional>
#include <vector>

#include "common/base/lines.h"
#include "common/base/log.h"

namespace penstock::fuse {
namespace {

// Generic mount(8) options with nothing to do here: fstab's and systemd's, the access-time policy
// (the meta server keeps atime), and what penstock-mount always asks for.
constexpr std::array<std::string_view, 13> kIgnored = {
    "rw", "defaults", "relatime", "atime", "auto", "noauto", "user", "nouser", "users", "nofail", "_netdev",
    "allow_other", "default_permissions"};
// Mount flags the kernel applies (MountSettings::kernel_flags): dropping them silently would let
// an fstab's noexec or nosuid go unenforced.
constexpr std::array<std::string_view, 7> kKernelFlags = {"nodev", "nosuid", "dev", "suid", "exec", "noexec", "noatime"};

Status bad(std::string msg) { return Status(Code::kInvalid, std::move(msg)); }

}  // namespace

Status apply_mount_options(std::string_view list, MountSettings* s) {
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    if (comma == std::string_view::npos) comma = list.size();
    const std::string_view opt = list.substr(pos, comma - pos);
    pos = comma + 1;
    if (opt.empty()) continue;
    const size_t eq = opt.find('=');
    const std::string_view key = opt.substr(0, eq);
    const bool has_value = eq != std::string_view::npos;
    const std::string_view value = has_value ? opt.substr(eq + 1) : std::string_view();
    auto need_value = [&]() -> Status {
      if (!has_value || value.empty()) return bad("mount option '" + std::string(key) + "' needs a value");
      return Status::ok();
    };
    auto no_value = [&]() -> Status {
      if (has_value) return bad("mount option '" + std::string(key) + "' takes no value");
      return Status::ok();
    };
    if (key == "meta") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      s->meta = std::string(value);
    } else if (key == "threads" || key == "active_threads") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      int n = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || ptr != value.data() + value.size() || n < 1 || n > 1024) {
        return bad("mount option " + std::string(key) + "=" + std::string(value) + " is not a number from 1 to 1024");
      }
      (key == "threads" ? s->threads : s->active_threads) = n;
    } else if (key == "clone_fd") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->clone_fd = true;
    } else if (key == "direct_io") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->direct_io = true;
    } else if (key == "direct_writes") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->direct_writes = true;
    } else if (key == "create_behind" || key == "no_create_behind") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->create_behind = key == "create_behind";
    } else if (key == "splice_writes" || key == "no_splice_writes") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->splice_writes = key == "splice_writes";
    } else if (key == "foreground") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->foreground = true;
    } else if (key == "ro") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->read_only = true;
    } else if (key == "log_level") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      LogLevel level;
      if (!parse_log_level(value, &level)) {
        return bad("mount option log_level=" + std::string(value) + " is not debug, info, warn or error");
      }
      s->log_level = std::string(value);
    } else if (key == "log_file") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      s->log_file = std::string(value);
    } else if (key == "transport") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      if (value != "auto" && value != "rdma" && value != "tcp") {
        return bad("mount option transport=" + std::string(value) + " is not auto, rdma or tcp");
      }
      s->transport = std::string(value);
    } else if (key == "cache_size" || key == "readahead_max" || key == "dirty_limit" || key == "kernel_readahead") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      auto size = parse_byte_size(value);
      if (!size.has_value()) return bad("mount option " + std::string(key) + ": " + size.error().message());
      if (key == "cache_size") s->cache_size = *size;
      if (key == "readahead_max") s->readahead_max = *size;
      if (key == "dirty_limit") s->dirty_limit = *size;
      if (key == "kernel_readahead") {
        PENSTOCK_RETURN_IF_ERROR(check_kernel_readahead(*size, "mount option kernel_readahead"));
        s->kernel_readahead = *size;
      }
    } else if (key == "sched") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      if (value != "batch" && value != "normal") {
        return bad("mount option sched=" + std::string(value) + " is not batch or normal");
      }
      s->sched = std::string(value);
    } else if (key == "fuse_uring") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      if (value != "auto" && value != "on" && value != "off") {
        return bad("mount option fuse_uring=" + std::string(value) + " is not auto, on or off");
      }
      s->fuse_uring = std::string(value);
    } else if (key.starts_with("x-")) {
      continue;
    } else if (std::find(kKernelFlags.begin(), kKernelFlags.end(), key) != kKernelFlags.end()) {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->kernel_flags.emplace_back(key);
    } else {
      bool ignored = false;
      for (std::string_view known : kIgnored) ignored = ignored || key == known;
      if (!ignored) {
        return bad("unknown mount option '" + std::string(opt) +
                   "' (penstock options: meta=, threads=, active_threads=, clone_fd, direct_io, direct_writes, [no_]create_behind, [no_]splice_writes, log_level=, log_file=, ro, transport=, "
                   "cache_size=, readahead_max=, dirty_limit=, kernel_readahead=, sched=, fuse_uring=)");
      }
      if (key == "rw") s->read_only = false;
    }
  }
  return Status::ok();
}

bool fuse_conf_allows_other(std::string_view conf) {
  LineReader lines(conf);
  std::string_view line;
  while (lines.next(&line)) {
    line = line.substr(0, line.find('#'));
    const size_t first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos) continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    if (line == "user_allow_other") return true;
  }
  return false;
}

Status check_kernel_readahead(uint64_t bytes, std::string_view what) {
  if (bytes % 1024 != 0 || bytes > MountSettings::kMaxKernelReadahead) {
    std::string msg(what);
    msg.append(" must be whole KiB and at most 1G (0 keeps the kernel default), not ");
    msg.append(std::to_string(bytes));
    msg.append(" bytes");
    return bad(std::move(msg));
  }
  return Status::ok();
}

Status apply_sched_policy(std::string_view policy) {
  int which;
  if (policy == "batch") {
    which = SCHED_BATCH;
  } else if (policy == "normal") {
    which = SCHED_OTHER;
  } else {
    return bad("scheduling policy '" + std::string(policy) + "' is not batch or normal");
  }
  sched_param param{};
  param.sched_priority = 0;
  if (sched_setscheduler(0, which, &param) != 0) {
    const int err = errno;
    return Status(Code::kIo, "cannot set the scheduling policy " + std::string(policy) + ": " + std::strerror(err));
  }
  return Status::ok();
}

namespace {

// mountinfo escapes space, tab, newline and backslash as \ooo (octal).
std::string unescape_mountinfo(std::string_view field) {
  std::string out;
  out.reserve(field.size());
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      const std::string_view oct = field.substr(i + 1, 3);
      int v = 0;
      auto [ptr, ec] = std::from_chars(oct.data(), oct.data() + oct.size(), v, 8);
      if (ec == std::errc() && ptr == oct.data() + oct.size()) {
        out.push_back(static_cast<char>(v));
        i += 3;
        continue;
      }
    }
    out.push_back(field[i]);
  }
  return out;
}

std::vector<std::string_view> split_spaces(std::string_view line) {
  std::vector<std::string_view> f;
  size_t pos = 0;
  while (pos < line.size()) {
    const size_t sp = line.find(' ', pos);
    const size_t end = sp == std::string_view::npos ? line.size() : sp;
    if (end > pos) f.push_back(line.substr(pos, end - pos));
    pos = end + 1;
  }
  return f;
}

}  // namespace

Result<dev_t> fuse_mount_dev(std::string_view mountinfo, std::string_view mountpoint) {
  std::optional<dev_t> found;
  LineReader lines(mountinfo);
  std::string_view line;
  while (lines.next(&line)) {
    const std::vector<std::string_view> f = split_spaces(line);
    // ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
    if (f.size() < 8 || unescape_mountinfo(f[4]) != mountpoint) continue;
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash + 1 >= f.size()) continue;
    const std::string_view fstype = f[dash + 1];
    if (fstype != "fuse" && !fstype.starts_with("fuse.")) continue;
    const std::string_view devtext = f[2];
    const size_t colon = devtext.find(':');
    if (colon == std::string_view::npos) continue;
    unsigned maj = 0, min = 0;
    auto r1 = std::from_chars(devtext.data(), devtext.data() + colon, maj);
    auto r2 = std::from_chars(devtext.data() + colon + 1, devtext.data() + devtext.size(), min);
    if (r1.ec != std::errc() || r2.ec != std::errc()) continue;
    found = makedev(maj, min);
  }
  if (!found) {
    return Status(Code::kNotFound, "no FUSE mount at " + std::string(mountpoint) + " in /proc/self/mountinfo");
  }
  return *found;
}

std::string bdi_name(dev_t dev) { return std::to_string(major(dev)) + ":" + std::to_string(minor(dev)); }

Result<uint64_t> set_bdi_read_ahead(const std::string& sysfs_bdi_dir, dev_t dev, uint64_t bytes) {
  const std::string path = sysfs_bdi_dir + "/" + bdi_name(dev) + "/read_ahead_kb";
  auto fail = [&](const char* doing, int err) {
    const Code code = err == ENOENT   ? Code::kNotFound
                      : (err == EACCES || err == EPERM || err == EROFS) ? Code::kNotPermitted
                                                                         : Code::kIo;
    return Status(code, std::string(doing) + " " + path + ": " + std::strerror(err));
  };
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) return fail("cannot open", errno);
  char old_text[32] = {};
  const ssize_t got = ::pread(fd, old_text, sizeof old_text - 1, 0);
  if (got < 0) {
    const int err = errno;
    ::close(fd);
    return fail("cannot read", err);
  }
  uint64_t old_kb = 0;
  std::from_chars(old_text, old_text + got, old_kb);
  const std::string text = std::to_string(bytes / 1024) + "\n";
  const ssize_t put = ::pwrite(fd, text.data(), text.size(), 0);
  const int err = errno;
  ::close(fd);
  if (put < 0) return fail("cannot write", err);
  if (static_cast<size_t>(put) != text.size()) return fail("short write to", EIO);
  return old_kb;
}

int count_cpu_list(std::string_view list) {
  while (!list.empty() && (list.back() == '\n' || list.back() == ' ')) list.remove_suffix(1);
  if (list.empty()) return 0;
  int count = 0;
  for (size_t pos = 0; pos <= list.size();) {
    size_t end = list.find(',', pos);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view part = list.substr(pos, end - pos);
    const size_t dash = part.find('-');
    auto number = [](std::string_view text, int* out) {
      if (text.empty() || text.size() > 6 || text.find_first_not_of("0123456789") != std::string_view::npos) {
        return false;
      }
      *out = std::stoi(std::string(text));
      return true;
    };
    int first = 0;
    int last = 0;
    if (!number(part.substr(0, dash), &first)) return 0;
    if (dash == std::string_view::npos) {
      last = first;
    } else if (!number(part.substr(dash + 1), &last) || last < first) {
      return 0;
    }
    count += last - first + 1;
    pos = end + 1;
  }
  return count;
}

}  // namespace penstock::fuse
