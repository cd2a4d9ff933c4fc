// Status: the error value of Penstock. A code from one fixed table (the numbers cross the wire and
// never change) plus a human context message. Cheap to copy when ok (no allocation).
// Thread-safety: a value type; distinct objects may be used from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace penstock {

// Fixed numbers: they are sent in response frames. Append only; never renumber.
// POSIX-shaped codes exist where a caller (in the end the FUSE adapter) must give a distinct errno.
enum class Code : uint32_t {
  kOk = 0,
  kNotFound = 1,         // ENOENT
  kExists = 2,           // EEXIST
  kNotDir = 3,           // ENOTDIR
  kIsDir = 4,            // EISDIR
  kNotEmpty = 5,         // ENOTEMPTY
  kInvalid = 6,          // EINVAL: a bad argument from the caller
  kNameTooLong = 7,      // ENAMETOOLONG
  kNoSpace = 8,          // ENOSPC
  kIo = 9,               // EIO: a disk or device error
  kCorrupt = 10,         // EIO: a checksum did not match; never returned as data
  kPermission = 11,      // EACCES
  kNotPermitted = 12,    // EPERM
  kTimeout = 13,         // ETIMEDOUT: a deadline passed
  kUnavailable = 14,     // a server could not be reached (connect refused, closed): retry later
  kProtocol = 15,        // malformed frame or message from a peer
  kNoData = 16,          // ENODATA (missing xattr)
  kRange = 17,           // ERANGE (buffer too small, value too large)
  kNotSupported = 18,    // EOPNOTSUPP
  kTooManyLinks = 19,    // EMLINK
  kCrossDevice = 20,     // EXDEV
  kBusy = 21,            // EBUSY
  kStale = 22,           // ESTALE: the inode no longer exists
  kInternal = 23,        // a bug on the other side; details in the message
  kFileTooBig = 24,      // EFBIG
  kBadHandle = 25,       // EBADF
  kTooManyOpen = 26,     // EMFILE-like resource exhaustion (bounded tables)
  kCancelled = 27,       // ECANCELED: the operation was abandoned (shutdown)
};

// A call that failed on the way (the server was unreachable, or the deadline passed): whether the
// server acted on it is unknown, and asking again later may succeed.
inline bool failed_in_transit(Code code) { return code == Code::kTimeout || code == Code::kUnavailable; }

// Name of a code, e.g. "NotFound". Unknown numbers give "Unknown".
std::string_view code_name(Code code);

// True when `raw` is a number of the table above (used when decoding peer frames).
bool code_is_known(uint32_t raw);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == Code::kOk; }
  explicit operator bool() const = delete;  // say is_ok() at call sites
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // "NotFound: lookup 'a' in inode 1". Ok gives "OK".
  std::string to_string() const;

  // Returns this status with `context` prepended ("context: message"); ok stays ok.
  Status with_context(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status make_error(Code code, std::string message) { return Status(code, std::move(message)); }

}  // namespace penstock

// Early return of a non-ok Status (or the error of a Result) from the enclosing function.
#define PENSTOCK_RETURN_IF_ERROR(expr)                          \
  do {                                                          \
    auto penstock_status_ = ::penstock::detail::to_status(expr); \
    if (!penstock_status_.is_ok()) return penstock_status_;     \
  } while (0)

#define PENSTOCK_CONCAT_INNER(a, b) a##b
#define PENSTOCK_CONCAT(a, b) PENSTOCK_CONCAT_INNER(a, b)

// auto x = ...; from a Result<T>, returning its error from the enclosing function on failure.
#define PENSTOCK_ASSIGN_OR_RETURN(lhs, expr)                                 \
  auto PENSTOCK_CONCAT(penstock_result_, __LINE__) = (expr);                 \
  if (!PENSTOCK_CONCAT(penstock_result_, __LINE__).has_value())              \
    return std::move(PENSTOCK_CONCAT(penstock_result_, __LINE__)).error();   \
  lhs = std::move(PENSTOCK_CONCAT(penstock_result_, __LINE__)).value()

// Always-on invariant check: a broken invariant is a bug. Never use it for peer or disk input.
#define PENSTOCK_CHECK(cond)                                                   \
  do {                                                                         \
    if (!(cond)) ::penstock::detail::check_failed(#cond, __FILE__, __LINE__);  \
  } while (0)

namespace penstock::detail {
[[noreturn]] void check_failed(const char* cond, const char* file, int line);
inline const Status& to_status(const Status& s) { return s; }
}  // namespace penstock::detail
