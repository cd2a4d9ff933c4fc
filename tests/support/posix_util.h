// Small POSIX helpers for tests that drive a file system through system calls: an owning fd,
// whole-buffer read/write loops, deterministic byte patterns, page-cache residency, errno
// assertions that print the errno's name, and a Penstock mount's counters. Header-only; every
// function is thread-compatible (no shared state).
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::testing {

// "ENOENT" for ENOENT; the number when glibc has no name for it.
inline std::string errno_name(int e) {
  const char* n = strerrorname_np(e);
  return n != nullptr ? std::string(n) : std::to_string(e);
}

// An owned file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset(o.release());
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool ok() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) {
      ::close(fd_);
    }
    fd_ = fd;
  }
  // Closes now and returns close()'s result (0, or -1 with errno), for tests that check it.
  int close() {
    int f = release();
    return f >= 0 ? ::close(f) : 0;
  }

 private:
  int fd_ = -1;
};

// Deterministic bytes for position `offset` of a stream named by `seed`: any byte can be
// recomputed from its offset alone, so a reader can verify ranges without keeping the data.
inline uint8_t pattern_byte(uint64_t offset, uint32_t seed) {
  uint64_t x = offset * 0x9E3779B97F4A7C15ull + seed * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

inline std::string pattern(size_t size, uint64_t offset, uint32_t seed) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    out[i] = static_cast<char>(pattern_byte(offset + i, seed));
  }
  return out;
}

// pwrite()s all of `data` at `offset`; false (errno set) on the first failure.
inline bool pwrite_all(int fd, std::string_view data, off_t offset) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done,
                         offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// write()s all of `data` at the current position (or the end, with O_APPEND).
inline bool write_all(int fd, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return false;
    }
    if (n == 0) {
      errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// Reads up to `size` bytes at `offset` (fewer only at end of file). Sets *ok=false on error.
inline std::string pread_all(int fd, size_t size, off_t offset, bool* ok = nullptr) {
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::pread(fd, out.data() + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      if (ok != nullptr) {
        *ok = false;
      }
      out.resize(done);
      return out;
    }
    if (n == 0) {
      break;
    }
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  if (ok != nullptr) {
    *ok = true;
  }
  return out;
}

// Creates (or truncates) `path` with `data`; the assertion says which step failed.
inline ::testing::AssertionResult write_file(const std::string& path, std::string_view data,
                                             mode_t mode = 0644) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd.ok()) {
    return ::testing::AssertionFailure() << "open " << path << ": " << errno_name(errno);
  }
  if (!write_all(fd.get(), data)) {
    return ::testing::AssertionFailure() << "write " << path << ": " << errno_name(errno);
  }
  if (fd.close() != 0) {
    return ::testing::AssertionFailure() << "close " << path << ": " << errno_name(errno);
  }
  return ::testing::AssertionSuccess();
}

// Reads the whole file into *out.
inline ::testing::AssertionResult read_file(const std::string& path, std::string* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) {
    return ::testing::AssertionFailure() << "open " << path << ": " << errno_name(errno);
  }
  out->clear();
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) {
        continue;
      }
      return ::testing::AssertionFailure() << "read " << path << ": " << errno_name(errno);
    }
    if (n == 0) {
      break;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  if (fd.close() != 0) {
    return ::testing::AssertionFailure() << "close " << path << ": " << errno_name(errno);
  }
  return ::testing::AssertionSuccess();
}

// Which 4 KiB pages of the file at `path` are in the page cache (one entry per page of its whole
// length), from mincore over a fresh read-only mapping, which itself loads nothing. The assertion
// says which step failed.
inline ::testing::AssertionResult page_residency(const std::string& path, std::vector<bool>* resident) {
  resident->clear();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.ok()) return ::testing::AssertionFailure() << "open " << path << ": " << errno_name(errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return ::testing::AssertionFailure() << "fstat " << path << ": " << errno_name(errno);
  const size_t len = static_cast<size_t>(st.st_size);
  if (len == 0) return ::testing::AssertionSuccess();
  void* map = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (map == MAP_FAILED) return ::testing::AssertionFailure() << "mmap " << path << ": " << errno_name(errno);
  std::vector<unsigned char> in_core((len + 4095) / 4096);
  const int rc = ::mincore(map, len, in_core.data());
  const int err = errno;
  ::munmap(map, len);
  if (rc != 0) return ::testing::AssertionFailure() << "mincore " << path << ": " << errno_name(err);
  for (unsigned char r : in_core) resident->push_back((r & 1) != 0);
  return ::testing::AssertionSuccess();
}

// page_residency() counted: *resident of the file's *pages_out pages are cached.
inline ::testing::AssertionResult resident_pages(const std::string& path, uint64_t* resident,
                                                 uint64_t* pages_out = nullptr) {
  std::vector<bool> pages;
  auto r = page_residency(path, &pages);
  *resident = static_cast<uint64_t>(std::count(pages.begin(), pages.end(), true));
  if (pages_out != nullptr) *pages_out = pages.size();
  return r;
}

// Compares two buffers and names the first differing offset instead of dumping megabytes.
inline ::testing::AssertionResult same_bytes(std::string_view expected, std::string_view actual) {
  if (expected.size() != actual.size()) {
    size_t n = std::min(expected.size(), actual.size());
    size_t first = 0;
    while (first < n && expected[first] == actual[first]) {
      ++first;
    }
    return ::testing::AssertionFailure()
           << "size " << actual.size() << ", expected " << expected.size()
           << " (first difference at offset " << first << ")";
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != actual[i]) {
      size_t j = i;
      while (j < expected.size() && expected[j] != actual[j]) {
        ++j;
      }
      return ::testing::AssertionFailure()
             << "bytes differ at offset " << i << " (first differing run is " << (j - i)
             << " bytes; expected 0x" << std::hex
             << static_cast<int>(static_cast<uint8_t>(expected[i])) << ", got 0x"
             << static_cast<int>(static_cast<uint8_t>(actual[i])) << std::dec << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// The mount's counters from its virtual xattr user.penstock.stats ("name value" lines), read as
// getfattr does: a size probe, then the value into a buffer of that size.
inline std::map<std::string, uint64_t> mount_counters(const std::string& path) {
  std::map<std::string, uint64_t> out;
  const ssize_t probe = ::getxattr(path.c_str(), "user.penstock.stats", nullptr, 0);
  EXPECT_GT(probe, 0) << errno_name(errno);
  if (probe <= 0) return out;
  std::string text(static_cast<size_t>(probe), '\0');
  const ssize_t n = ::getxattr(path.c_str(), "user.penstock.stats", text.data(), text.size());
  EXPECT_GT(n, 0) << errno_name(errno);
  if (n <= 0) return out;
  text.resize(static_cast<size_t>(n));
  std::istringstream lines(text);
  std::string name;
  uint64_t value = 0;
  while (lines >> name >> value) out[name] = value;
  EXPECT_TRUE(lines.eof()) << "not a \"name value\" line in: " << text;
  return out;
}

}  // namespace penstock::testing

// Expects `call` to fail with -1 and errno == `expected`, and says what happened instead.
#define PENSTOCK_EXPECT_ERRNO(expected, call)                                                 \
  do {                                                                                        \
    errno = 0;                                                                                \
    long penstock_r_ = static_cast<long>(call);                                               \
    int penstock_e_ = errno;                                                                  \
    EXPECT_EQ(penstock_r_, -1) << #call << " succeeded; expected "                            \
                               << ::penstock::testing::errno_name(expected);                 \
    if (penstock_r_ == -1) {                                                                  \
      EXPECT_EQ(penstock_e_, expected)                                                        \
          << #call << " failed with " << ::penstock::testing::errno_name(penstock_e_)         \
          << ", expected " << ::penstock::testing::errno_name(expected);                      \
    }                                                                                         \
  } while (0)

// Expects `call` to succeed (not -1) and names the errno otherwise.
#define PENSTOCK_EXPECT_OK(call)                                                              \
  do {                                                                                        \
    errno = 0;                                                                                \
    long penstock_r_ = static_cast<long>(call);                                               \
    EXPECT_NE(penstock_r_, -1) << #call << " failed with "                                    \
                               << ::penstock::testing::errno_name(errno);                    \
  } while (0)

#define PENSTOCK_ASSERT_OK(call)                                                              \
  do {                                                                                        \
    errno = 0;                                                                                \
    long penstock_r_ = static_cast<long>(call);                                               \
    ASSERT_NE(penstock_r_, -1) << #call << " failed with "                                    \
                               << ::penstock::testing::errno_name(errno);                    \
  } while (0)
