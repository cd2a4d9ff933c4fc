#include "common/base/log.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <ctime>
#include <mutex>
#include <string>

namespace penstock {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
std::mutex g_component_mu;
std::string g_component = "penstock";  // guarded by g_component_mu

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO ";
    case LogLevel::kWarn: return "WARN ";
    case LogLevel::kError: return "ERROR";
  }
  return "?";
}
}  // namespace

bool parse_log_level(std::string_view text, LogLevel* out) {
  if (text == "debug") *out = LogLevel::kDebug;
  else if (text == "info") *out = LogLevel::kInfo;
  else if (text == "warn") *out = LogLevel::kWarn;
  else if (text == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_component(std::string_view component) {
  std::lock_guard<std::mutex> lock(g_component_mu);
  g_component = std::string(component);
}

namespace detail {
LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  std::string component;
  {
    std::lock_guard<std::mutex> lock(g_component_mu);
    component = g_component;
  }
  char prefix[160];
  std::snprintf(prefix, sizeof(prefix), "%s.%03dZ %s %-7s %s:%d] ", stamp, static_cast<int>(ms),
                level_name(level_), component.c_str(), base ? base + 1 : file, line);
  out_ << prefix;
}

LogLine::~LogLine() {
  out_ << '\n';
  std::string text = out_.str();
  ssize_t rc = ::write(STDERR_FILENO, text.data(), text.size());
  (void)rc;
}
}  // namespace detail

}  // namespace penstock
