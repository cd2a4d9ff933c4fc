#include "tools/bench/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace penstock::bench {

Result<uint64_t> parse_size(std::string_view text) {
  const std::string original(text);
  auto bad = [&](const std::string& why) {
    return Status(Code::kInvalid, "bad size '" + original + "': " + why +
                                      " (write e.g. 4096, 64K, 1M, 1.5G, 2T)");
  };
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  if (text.empty()) return bad("empty");
  size_t i = 0;
  bool digits = false;
  bool dot = false;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    if (text[i] == '.') {
      if (dot) return bad("two decimal points");
      dot = true;
    } else {
      digits = true;
    }
    ++i;
  }
  if (!digits) return bad("no number");
  const std::string number(text.substr(0, i));
  std::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  double mult = 1;
  if (!unit.empty()) {
    switch (std::toupper(static_cast<unsigned char>(unit.front()))) {
      case 'K': mult = 1024.0; break;
      case 'M': mult = 1024.0 * 1024; break;
      case 'G': mult = 1024.0 * 1024 * 1024; break;
      case 'T': mult = 1024.0 * 1024 * 1024 * 1024; break;
      case 'B': mult = 1; break;
      default: return bad("unknown unit");
    }
    std::string rest;
    for (char c : unit.substr(mult == 1 ? 0 : 1)) rest.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(c))));
    if (!(rest.empty() || rest == "B" || (mult != 1 && rest == "IB"))) return bad("unknown unit");
  }
  const double value = std::strtod(number.c_str(), nullptr) * mult;
  if (!(value >= 0) || value > 9.2e18) return bad("out of range");
  const double whole = std::floor(value);
  if (whole != value) return bad("not a whole number of bytes");
  return static_cast<uint64_t>(whole);
}

std::string format_number(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  std::string s(buf);
  if (s.find('.') != std::string::npos) {
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
  }
  if (s == "-0") return std::string("0");
  return s;
}

std::string format_size(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  return format_number(v, 2) + " " + kUnits[u];
}

}  // namespace penstock::bench
