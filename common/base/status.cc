#include "common/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace penstock {

std::string_view code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kNotFound: return "NotFound";
    case Code::kExists: return "Exists";
    case Code::kNotDir: return "NotDir";
    case Code::kIsDir: return "IsDir";
    case Code::kNotEmpty: return "NotEmpty";
    case Code::kInvalid: return "Invalid";
    case Code::kNameTooLong: return "NameTooLong";
    case Code::kNoSpace: return "NoSpace";
    case Code::kIo: return "Io";
    case Code::kCorrupt: return "Corrupt";
    case Code::kPermission: return "Permission";
    case Code::kNotPermitted: return "NotPermitted";
    case Code::kTimeout: return "Timeout";
    case Code::kUnavailable: return "Unavailable";
    case Code::kProtocol: return "Protocol";
    case Code::kNoData: return "NoData";
    case Code::kRange: return "Range";
    case Code::kNotSupported: return "NotSupported";
    case Code::kTooManyLinks: return "TooManyLinks";
    case Code::kCrossDevice: return "CrossDevice";
    case Code::kBusy: return "Busy";
    case Code::kStale: return "Stale";
    case Code::kInternal: return "Internal";
    case Code::kFileTooBig: return "FileTooBig";
    case Code::kBadHandle: return "BadHandle";
    case Code::kTooManyOpen: return "TooManyOpen";
    case Code::kCancelled: return "Cancelled";
  }
  return "Unknown";
}

bool code_is_known(uint32_t raw) { return raw <= static_cast<uint32_t>(Code::kCancelled); }

std::string Status::to_string() const {
  if (is_ok()) return "OK";
  std::string out(code_name(code_));
  if (!message_.empty()) {
    out += ": ";
    out += message_;
  }
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (is_ok()) return *this;
  std::string msg(context);
  if (!message_.empty()) {
    msg += ": ";
    msg += message_;
  }
  return Status(code_, std::move(msg));
}

namespace detail {
void check_failed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "penstock: invariant broken: %s at %s:%d\n", cond, file, line);
  std::fflush(stderr);
  std::abort();
}
}  // namespace detail

}  // namespace penstock
