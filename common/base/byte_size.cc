#include "common/base/byte_size.h"

#include <charconv>
#include <string>

namespace penstock {

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

}  // namespace penstock
