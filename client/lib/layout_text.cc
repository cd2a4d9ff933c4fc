#include "client/lib/layout_text.h"

#include <cctype>
#include <limits>
#include <vector>

#include "common/layout/layout.h"

namespace penstock::client {
namespace {

std::vector<std::string_view> split_ws(std::string_view text) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t start = i;
    while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    if (i > start) out.push_back(text.substr(start, i - start));
  }
  return out;
}

Status invalid(std::string msg) { return Status(Code::kInvalid, std::move(msg)); }

}  // namespace

std::string format_layout(const proto::Layout& layout) {
  std::string out = "chunk_size=" + std::to_string(layout.chunk_size) +
                    " stripe_count=" + std::to_string(layout.stripe_count);
  if (!layout.chains.empty()) {
    out += " chains=";
    for (size_t i = 0; i < layout.chains.size(); ++i) {
      if (i > 0) out += ',';
      out += layout.chains[i].to_string();
    }
  }
  return out;
}

std::string format_counters(std::span<const Counter> counters) {
  std::string out;
  for (const Counter& c : counters) {
    out.append(c.name);
    out.push_back(' ');
    out.append(std::to_string(c.value));
    out.push_back('\n');
  }
  return out;
}

size_t max_counters_size(std::span<const Counter> counters) {
  constexpr size_t kMaxDigits = 20;  // UINT64_MAX
  size_t n = 0;
  for (const Counter& c : counters) n += c.name.size() + 1 + kMaxDigits + 1;
  return n;
}

Result<std::vector<ParsedCounter>> parse_counters(std::string_view text) {
  std::vector<ParsedCounter> out;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == std::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (line.empty()) continue;
    auto bad = [&](const char* why) {
      return invalid("counter line " + std::to_string(line_no) + " '" + std::string(line.substr(0, 80)) + "': " + why);
    };
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string_view::npos || space + 1 == line.size()) return bad("not NAME VALUE");
    const std::string_view name = line.substr(0, space);
    const std::string_view digits = line.substr(space + 1);
    for (const char c : name) {
      if (!(std::islower(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) || c == '_')) {
        return bad("a name is made of a-z, 0-9 and _");
      }
    }
    uint64_t value = 0;
    for (const char c : digits) {
      if (!std::isdigit(static_cast<unsigned char>(c))) return bad("the value is not a decimal number");
      const uint64_t digit = static_cast<uint64_t>(c - '0');
      if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return bad("the value passes 2^64-1");
      value = value * 10 + digit;
    }
    out.push_back({std::string(name), value});
  }
  return out;
}

bool is_level_counter(std::string_view name) {
  return name == "cache_bytes" || name == "cache_blocks" || name == "fuse_places";
}

Result<uint64_t> parse_size(std::string_view text) {
  const std::string shown(text);
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) {
      return invalid("size '" + shown + "' does not fit in 64 bits");
    }
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return invalid("size '" + shown + "' does not start with a number (e.g. 4M, 65536)");
  std::string suffix;
  for (; i < text.size(); ++i) suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  int shift = 0;
  if (!suffix.empty()) {
    switch (suffix[0]) {
      case 'k': shift = 10; break;
      case 'm': shift = 20; break;
      case 'g': shift = 30; break;
      default: return invalid("size '" + shown + "' has an unknown suffix (use K, M or G)");
    }
    std::string_view rest = std::string_view(suffix).substr(1);
    if (!(rest.empty() || rest == "b" || rest == "ib")) {
      return invalid("size '" + shown + "' has an unknown suffix (use K, M or G)");
    }
  }
  if (shift > 0 && value > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return invalid("size '" + shown + "' does not fit in 64 bits");
  }
  return value << shift;
}

Result<LayoutSpec> parse_layout_spec(std::string_view text) {
  LayoutSpec spec;
  const auto tokens = split_ws(text);
  if (tokens.empty()) {
    return invalid("empty layout: give chunk_size=SIZE and/or stripe_count=N");
  }
  for (std::string_view tok : tokens) {
    const size_t eq = tok.find('=');
    if (eq == std::string_view::npos) {
      return invalid("layout item '" + std::string(tok) + "' is not key=value");
    }
    const std::string_view key = tok.substr(0, eq);
    const std::string_view val = tok.substr(eq + 1);
    if (key == "chunk_size") {
      if (spec.chunk_size) return invalid("chunk_size given twice");
      PENSTOCK_ASSIGN_OR_RETURN(uint64_t size, parse_size(val));
      if (size > std::numeric_limits<uint32_t>::max()) {
        return invalid("chunk size " + std::string(val) + " is larger than 64 MiB");
      }
      PENSTOCK_RETURN_IF_ERROR(layout::validate_chunk_size(static_cast<uint32_t>(size)));
      spec.chunk_size = static_cast<uint32_t>(size);
    } else if (key == "stripe_count") {
      if (spec.stripe_count) return invalid("stripe_count given twice");
      if (val.empty()) return invalid("stripe_count has no value");
      uint64_t n = 0;
      for (char c : val) {
        if (!std::isdigit(static_cast<unsigned char>(c))) {
          return invalid("stripe_count '" + std::string(val) + "' is not a whole number (0 = all chains)");
        }
        n = n * 10 + static_cast<uint64_t>(c - '0');
        if (n > std::numeric_limits<uint32_t>::max()) {
          return invalid("stripe_count '" + std::string(val) + "' is too large");
        }
      }
      spec.stripe_count = static_cast<uint32_t>(n);
    } else if (key == "chains") {
      return invalid("chains cannot be set: they are chosen when a file is created");
    } else {
      return invalid("unknown layout key '" + std::string(key) + "' (use chunk_size, stripe_count)");
    }
  }
  return spec;
}

}  // namespace penstock::client
