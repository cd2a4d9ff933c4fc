// Full data targets, end to end through a real mount: a file that does not fit fails with ENOSPC
// (at a write, at fsync or at close; never EIO, never a silent success), the file written before
// it reads back intact from the data servers, every daemon keeps running, and once the big file is
// removed (its chunks collected) the space is used again. The targets are small tmpfs mounts at
// local-cluster's state/dataK, so this needs root (it skips otherwise).
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

using namespace std::chrono_literals;

constexpr int kDataServers = 2;
constexpr const char* kTargetOptions = "size=24m";  // per data server: 48 MiB in all
constexpr size_t kMiB = 1 << 20;

// Mounts a tmpfs of kTargetOptions at `path`. A failure names the reason.
::testing::AssertionResult mount_small_tmpfs(const std::string& path) {
  if (::mount("tmpfs", path.c_str(), "tmpfs", 0, kTargetOptions) != 0) {
    return ::testing::AssertionFailure() << "mount tmpfs at " << path << ": " << errno_name(errno);
  }
  return ::testing::AssertionSuccess();
}

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (local_only()) GTEST_SKIP() << "needs the Penstock binaries (PENSTOCK_TEST_DIR is set)";
    if (::geteuid() != 0) GTEST_SKIP() << "mounting small tmpfs targets needs root";
    // Containers without CAP_SYS_ADMIN cannot mount: find out before starting a cluster.
    std::string probe = std::string(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp") +
                        "/penstock-full-disk-probe-XXXXXX";
    ASSERT_NE(::mkdtemp(probe.data()), nullptr) << errno_name(errno);
    const bool can_mount = mount_small_tmpfs(probe);
    if (can_mount) ::umount2(probe.c_str(), 0);
    ::rmdir(probe.c_str());
    if (!can_mount) GTEST_SKIP() << "cannot mount a tmpfs here; the full-disk path is not covered";
    ASSERT_TRUE(cluster_.up()) << cluster_.log_tails();
  }

  void TearDown() override {
    if (cluster_.running()) {
      EXPECT_TRUE(cluster_.down());
    }
    for (const std::string& m : mounted_) {
      if (::umount2(m.c_str(), 0) != 0) {
        ADD_FAILURE() << "umount " << m << ": " << errno_name(errno);
        ::umount2(m.c_str(), MNT_DETACH);
      }
    }
  }

  ClusterOptions small_targets() {
    ClusterOptions o;
    o.data_servers = kDataServers;
    o.before_first_up = [this](const std::string& state) -> ::testing::AssertionResult {
      for (int k = 1; k <= kDataServers; ++k) {
        const std::string target = state + "/data" + std::to_string(k);
        if (::mkdir(target.c_str(), 0755) != 0) {
          return ::testing::AssertionFailure() << "mkdir " << target << ": " << errno_name(errno);
        }
        ::testing::AssertionResult m = mount_small_tmpfs(target);
        if (!m) return m;
        mounted_.push_back(target);
      }
      return ::testing::AssertionSuccess();
    };
    return o;
  }

  bool daemon_running(const std::string& role) const {
    const pid_t pid = cluster_.pid_of(role);
    return pid > 0 && ::kill(pid, 0) == 0;
  }

  std::vector<std::string> mounted_;  // before cluster_: its options capture this
  Cluster cluster_{small_targets()};
};

TEST_F(FullDiskTest, AFileThatDoesNotFitFailsWithEnospcAndLosesNothingElse) {
  const std::string dir = make_test_dir(cluster_.mount_path());
  const std::string kept = pattern(8 * kMiB, 0, 1);
  ASSERT_TRUE(write_file(dir + "/kept", kept));

  // Twice what the targets hold, in 1 MiB writes: the error may come from a write (write-behind
  // reports a failed flush at the next write), from fsync or from close, but it must be ENOSPC.
  const std::string piece = pattern(kMiB, 0, 2);
  UniqueFd fd(::open((dir + "/big").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.ok()) << errno_name(errno);
  std::vector<std::string> failures;  // "write of MiB 39: ENOSPC", ...
  for (int i = 0; i < 96 && failures.empty(); ++i) {
    const ssize_t n = ::write(fd.get(), piece.data(), piece.size());
    if (n < 0) {
      failures.push_back("write of MiB " + std::to_string(i) + ": " + errno_name(errno));
    } else {
      ASSERT_EQ(static_cast<size_t>(n), piece.size()) << "short write of MiB " << i;
    }
  }
  if (::fsync(fd.get()) != 0) failures.push_back("fsync: " + errno_name(errno));
  if (fd.close() != 0) failures.push_back("close: " + errno_name(errno));
  ASSERT_FALSE(failures.empty()) << "96 MiB fit on targets of 2 x 24 MiB";
  for (const std::string& f : failures) {
    EXPECT_NE(f.find("ENOSPC"), std::string::npos) << f;
  }

  // Nothing else was lost: the first file reads back from the data servers (caches dropped).
  ASSERT_EQ(::setxattr(dir.c_str(), "user.penstock.drop_caches", "1", 1, 0), 0) << errno_name(errno);
  std::string back;
  ASSERT_TRUE(read_file(dir + "/kept", &back));
  EXPECT_TRUE(same_bytes(kept, back));
  for (const std::string role : {"meta", "data1", "data2", "mount1"}) {
    EXPECT_TRUE(daemon_running(role)) << role << " stopped on a full disk\n" << cluster_.log_tails();
  }

  // Removing the big file gives its space back once its chunks are collected (asynchronously).
  ASSERT_EQ(::unlink((dir + "/big").c_str()), 0) << errno_name(errno);
  const std::string again = pattern(16 * kMiB, 0, 3);
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  ::testing::AssertionResult wrote = ::testing::AssertionFailure();
  while (!(wrote = write_file(dir + "/again", again)) && std::chrono::steady_clock::now() < give_up) {
    ::unlink((dir + "/again").c_str());
    std::this_thread::sleep_for(200ms);
  }
  ASSERT_TRUE(wrote) << "the space of the removed file did not come back within 30 s";
  ASSERT_TRUE(read_file(dir + "/again", &back));
  EXPECT_TRUE(same_bytes(again, back));
}

}  // namespace
}  // namespace penstock::testing
