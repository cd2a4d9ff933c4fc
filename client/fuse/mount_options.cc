#include "client/fuse/mount_options.h"

#include <array>
#include <charconv>

#include "common/base/log.h"

namespace penstock::fuse {
namespace {

constexpr std::array<std::string_view, 20> kIgnored = {
    "rw", "defaults", "nodev", "nosuid", "dev", "suid", "exec", "noexec", "noatime", "relatime",
    "atime", "auto", "noauto", "user", "nouser", "users", "nofail", "_netdev", "allow_other",
    "default_permissions"};

Status bad(std::string msg) { return Status(Code::kInvalid, std::move(msg)); }

}  // namespace

Result<uint64_t> parse_byte_size(std::string_view text) {
  // Messages are appended piecewise (GCC 12 warns falsely on "lit" + std::string chains here).
  auto fail = [&](const char* why) {
    std::string msg = "size '";
    msg.append(text);
    msg.append("' ");
    msg.append(why);
    return Status(Code::kInvalid, std::move(msg));
  };
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || ptr == text.data()) {
    return fail("is not a size (digits with an optional K, M, G or T suffix)");
  }
  const std::string_view suffix = text.substr(static_cast<size_t>(ptr - text.data()));
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K" || suffix == "KiB" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "MiB") {
    shift = 20;
  } else if (suffix == "G" || suffix == "GiB") {
    shift = 30;
  } else if (suffix == "T" || suffix == "TiB") {
    shift = 40;
  } else {
    return fail("has an unknown suffix (use K, M, G or T)");
  }
  if (shift > 0 && n > (UINT64_MAX >> shift)) return fail("is too large");
  return n << shift;
}

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
    } else if (key == "threads") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      int n = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc() || ptr != value.data() + value.size() || n < 1 || n > 1024) {
        return bad("mount option threads=" + std::string(value) + " is not a number from 1 to 1024");
      }
      s->threads = n;
    } else if (key == "clone_fd") {
      PENSTOCK_RETURN_IF_ERROR(no_value());
      s->clone_fd = true;
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
    } else if (key == "cache_size" || key == "readahead_max" || key == "dirty_limit") {
      PENSTOCK_RETURN_IF_ERROR(need_value());
      auto size = parse_byte_size(value);
      if (!size.has_value()) return bad("mount option " + std::string(key) + ": " + size.error().message());
      if (key == "cache_size") s->cache_size = *size;
      if (key == "readahead_max") s->readahead_max = *size;
      if (key == "dirty_limit") s->dirty_limit = *size;
    } else if (key.starts_with("x-")) {
      continue;
    } else {
      bool ignored = false;
      for (std::string_view known : kIgnored) ignored = ignored || key == known;
      if (!ignored) {
        return bad("unknown mount option '" + std::string(opt) +
                   "' (penstock options: meta=, threads=, clone_fd, log_level=, log_file=, ro, transport=, "
                   "cache_size=, readahead_max=, dirty_limit=)");
      }
      if (key == "rw") s->read_only = false;
    }
  }
  return Status::ok();
}

}  // namespace penstock::fuse
