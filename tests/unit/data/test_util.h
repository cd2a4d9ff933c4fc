// Helpers for the data module's unit tests: a temporary directory per test, removed afterwards,
// and deterministic byte patterns.
#pragma once

#include <linux/fiemap.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::data::testing {

class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/penstock-data-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    char* made = ::mkdtemp(buf.data());
    EXPECT_NE(made, nullptr) << "mkdtemp " << tmpl;
    path_ = made != nullptr ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Whether cachestat(2) works here (Linux 6.5, and no seccomp filter refusing it): probed on a file
// of `dir`.
inline bool cachestat_works(const std::string& dir) {
  const std::string path = dir + "/.cachestat-probe";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  struct {
    uint64_t off;
    uint64_t len;
  } range{0, 4096};
  uint64_t stat[5] = {};
#ifdef __NR_cachestat
  const bool ok = ::syscall(__NR_cachestat, fd, &range, stat, 0) == 0;
#else
  const bool ok = ::syscall(451, fd, &range, stat, 0) == 0;  // x86-64, arm64 and most others
#endif
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

// Pages of [offset, offset + length) of the file at `path` that are dirty or under writeback
// (cachestat(2)); 0 when it cannot tell.
inline uint64_t dirty_pages(const std::string& path, uint64_t offset, uint64_t length) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct {
    uint64_t off;
    uint64_t len;
  } range{offset, length};
  uint64_t stat[5] = {};  // cache, dirty, writeback, evicted, recently evicted
#ifdef __NR_cachestat
  const bool ok = ::syscall(__NR_cachestat, fd, &range, stat, 0) == 0;
#else
  const bool ok = ::syscall(451, fd, &range, stat, 0) == 0;
#endif
  ::close(fd);
  return ok ? stat[1] + stat[2] : 0;
}

// How many runs of physically contiguous disk blocks hold bytes [0, end) of the open file `fd`
// (FIEMAP); nullopt when the file system cannot say (tmpfs).
inline std::optional<int> physical_runs(int fd, uint64_t end) {
  constexpr int kMax = 64;
  std::vector<uint8_t> buf(sizeof(fiemap) + kMax * sizeof(fiemap_extent));
  auto* fm = reinterpret_cast<fiemap*>(buf.data());
  fm->fm_start = 0;
  fm->fm_length = end;
  fm->fm_flags = FIEMAP_FLAG_SYNC;
  fm->fm_extent_count = kMax;
  if (::ioctl(fd, FS_IOC_FIEMAP, fm) != 0) return std::nullopt;
  int runs = 0;
  uint64_t next_physical = 0;
  for (uint32_t i = 0; i < fm->fm_mapped_extents; ++i) {
    const fiemap_extent& e = fm->fm_extents[i];
    if (e.fe_logical >= end) break;
    if (runs == 0 || e.fe_physical != next_physical) ++runs;
    next_physical = e.fe_physical + e.fe_length;
  }
  return runs;
}

// `n` bytes derived from `seed` (never all zero, so a hole cannot pass for written data).
inline std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> out(n);
  std::mt19937 rng(seed);
  for (auto& b : out) b = static_cast<uint8_t>(rng() | 1);
  return out;
}

// Flips one byte of a file in place.
inline void flip_byte(const std::string& path, uint64_t offset) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
  int c = std::fgetc(f);
  ASSERT_NE(c, EOF);
  ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
  std::fputc(c ^ 0x5a, f);
  std::fclose(f);
}

// Overwrites bytes of a file in place.
inline void poke(const std::string& path, uint64_t offset, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(std::fseek(f, static_cast<long>(offset), SEEK_SET), 0);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
}

}  // namespace penstock::data::testing
