// DiskReserve: the ballast file penstock-meta holds for a full disk, and when a reopen fits.
// The free space is injected, so each rule is checked on whatever disk the test runs on.
#include "server/meta/disk_reserve.h"

#include <sys/stat.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

struct Fixture {
  testing::TempDir dir;
  uint64_t free = 0;  // what the injected statvfs says
  uint64_t free_inodes = 1000;
  bool space_fails = false;

  DiskReserve reserve(uint64_t bytes) {
    DiskReserveOptions o;
    o.dir = dir.path();
    o.bytes = bytes;
    o.space = [this](const std::string& path) -> Result<daemon::DiskSpace> {
      if (space_fails) return Status(Code::kIo, "statvfs failed");
      (void)path;
      return daemon::DiskSpace{uint64_t{1} << 40, free, free_inodes};
    };
    return DiskReserve(o);
  }
  void write(const std::string& name, size_t bytes) { std::ofstream(dir.path() + "/" + name) << std::string(bytes, 'x'); }
};

off_t size_of(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

TEST(DiskReserveTest, DefaultIs256MiBOrFivePercentOfASmallerFileSystem) {
  EXPECT_EQ(DiskReserve::default_bytes(uint64_t{1} << 40), 256 * kMiB);
  EXPECT_EQ(DiskReserve::default_bytes(100 * kMiB), 5 * kMiB);
  EXPECT_EQ(DiskReserve::default_bytes(0), 0u);
}

TEST(DiskReserveTest, TheBallastIsMadeOnlyWhenTwiceItsSizeIsFree) {
  Fixture f;
  DiskReserve r = f.reserve(kMiB);
  bool made = true;
  f.free = 2 * kMiB - 1;
  ASSERT_TRUE(r.ensure(&made).is_ok());
  EXPECT_FALSE(made);
  EXPECT_FALSE(r.held());
  f.free = 2 * kMiB;
  ASSERT_TRUE(r.ensure(&made).is_ok());
  EXPECT_TRUE(made);
  EXPECT_TRUE(r.held());
  EXPECT_EQ(size_of(r.ballast_path()), static_cast<off_t>(kMiB));
  EXPECT_EQ(size_of(r.ballast_path() + ".tmp"), -1) << "the file it was made under is left behind";
  // Held already: nothing more is made.
  ASSERT_TRUE(r.ensure(&made).is_ok());
  EXPECT_FALSE(made);
}

TEST(DiskReserveTest, NoBallastWhenItsSizeIsZero) {
  Fixture f;
  f.free = uint64_t{1} << 40;
  DiskReserve r = f.reserve(0);
  bool made = true;
  ASSERT_TRUE(r.ensure(&made).is_ok());
  EXPECT_FALSE(made);
  EXPECT_FALSE(r.held());
  EXPECT_EQ(r.release(), 0u);
}


TEST(DiskReserveTest, AnUnknownFreeSpaceMakesNoBallastAndNoReopen) {
  Fixture f;
  f.space_fails = true;
  DiskReserve r = f.reserve(kMiB);
  bool made = true;
  EXPECT_EQ(r.ensure(&made).code(), Code::kIo);
  EXPECT_FALSE(made);
  EXPECT_FALSE(r.held());
  uint64_t need = 0;
  uint64_t free = 0;
  EXPECT_FALSE(r.ready_to_reopen(&need, &free).has_value());
}

TEST(DiskReserveTest, ReleaseRemovesTheBallastAndSaysWhatItFreed) {
  Fixture f;
  f.free = 8 * kMiB;
  DiskReserve r = f.reserve(2 * kMiB);
  bool made = false;
  ASSERT_TRUE(r.ensure(&made).is_ok());
  ASSERT_TRUE(made);
  (void)r.release();  // what it freed depends on the file system (compressed ones keep zeros in none)
  EXPECT_FALSE(r.held());
  EXPECT_EQ(r.release(), 0u);
}

TEST(DiskReserveTest, AReopenNeedsTheLiveLogsTheLiveManifestAMarginAndInodes) {
  Fixture f;
  f.write("000007.log", 3000);
  f.write("000009.log", 1000);
  f.write("MANIFEST-000004", 20000);  // only the live (largest) manifest is written anew
  f.write("MANIFEST-000005", 50000);
  f.write("000008.sst", 70000);       // tables stay as they are
  f.write("OPTIONS-000006", 9000);
  DiskReserve r = f.reserve(kMiB);
  const uint64_t want = 4000 + 50000 + DiskReserve::kReopenMargin;
  EXPECT_EQ(r.reopen_bytes(), want);
  uint64_t need = 0;
  uint64_t free = 0;
  f.free = want - 1;
  auto ready = r.ready_to_reopen(&need, &free);
  ASSERT_TRUE(ready.has_value());
  EXPECT_FALSE(*ready);
  EXPECT_EQ(need, want);
  EXPECT_EQ(free, f.free);
  f.free = want;
  ready = r.ready_to_reopen(&need, &free);
  ASSERT_TRUE(ready.has_value());
  EXPECT_TRUE(*ready);
  // Room in bytes but no inodes left (ENOSPC for a new file): not yet.
  f.free_inodes = DiskReserve::kReopenInodes - 1;
  ready = r.ready_to_reopen(&need, &free);
  ASSERT_TRUE(ready.has_value());
  EXPECT_FALSE(*ready);
}

TEST(DiskReserveTest, ALeftoverOfACrashWhileMakingTheBallastGoes) {
  Fixture f;
  DiskReserve r = f.reserve(kMiB);
  f.write(std::string(DiskReserve::kBallastName) + ".tmp", 5000);
  f.free = 0;  // no room for a ballast: the leftover goes all the same
  bool made = true;
  ASSERT_TRUE(r.ensure(&made).is_ok());
  EXPECT_FALSE(made);
  EXPECT_EQ(size_of(r.ballast_path() + ".tmp"), -1);
  f.write(std::string(DiskReserve::kBallastName) + ".tmp", 5000);
  EXPECT_GT(r.release(), 0u) << "release() left the leftover's room behind";
  EXPECT_EQ(size_of(r.ballast_path() + ".tmp"), -1);
}

TEST(DiskReserveTest, ABallastOfAnotherSizeIsMadeAgainAndSizeZeroRemovesIt) {
  Fixture f;
  f.free = 64 * kMiB;
  bool made = false;
  {
    DiskReserve r = f.reserve(kMiB);
    ASSERT_TRUE(r.ensure(&made).is_ok());
    ASSERT_TRUE(made);
  }
  DiskReserve bigger = f.reserve(2 * kMiB);
  ASSERT_TRUE(bigger.ensure(&made).is_ok());
  EXPECT_TRUE(made);
  EXPECT_EQ(size_of(bigger.ballast_path()), static_cast<off_t>(2 * kMiB));
  DiskReserve none = f.reserve(0);
  ASSERT_TRUE(none.ensure(&made).is_ok());
  EXPECT_FALSE(made);
  EXPECT_FALSE(none.held());
}

TEST(DiskReserveTest, TheRealFreeSpaceOfTheTempDirectoryIsRead) {
  testing::TempDir dir;
  auto space = daemon::disk_space(dir.path());
  ASSERT_TRUE(space.has_value()) << space.error().to_string();
  EXPECT_GT(space->total, 0u);
  EXPECT_LE(space->free, space->total);
  EXPECT_FALSE(daemon::disk_space(dir.path() + "/missing").has_value());
}

}  // namespace
}  // namespace penstock::meta
