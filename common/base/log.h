// Logging: one human-readable line per event on stderr,
//   2026-11-22T03:40:01.123Z INFO  meta    server.cc:88] listening on 127.0.0.1:7000
// Each line is written with a single write(2), so lines from many threads never interleave.
// Thread-safety: all functions may be called from any thread.
#pragma once

#include <sstream>
#include <string_view>

namespace penstock {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Parses "debug" | "info" | "warn" | "error"; false on anything else.
bool parse_log_level(std::string_view text, LogLevel* out);
void set_log_level(LogLevel level);
LogLevel log_level();
// A short component name printed on every line ("meta", "data", "mount", ...).
void set_log_component(std::string_view component);

namespace detail {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  std::ostream& stream() { return out_; }

 private:
  LogLevel level_;
  std::ostringstream out_;
};
}  // namespace detail

}  // namespace penstock

#define PENSTOCK_LOG(level)                                                   \
  if (::penstock::LogLevel::k##level < ::penstock::log_level()) {             \
  } else                                                                      \
    ::penstock::detail::LogLine(::penstock::LogLevel::k##level, __FILE__, __LINE__).stream()
