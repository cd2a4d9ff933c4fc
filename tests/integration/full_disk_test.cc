// Full disks, end to end through a real mount, on small tmpfs mounts at local-cluster's
// state/dataK (data targets) or state/meta (the metadata database), so this needs root (it skips
// otherwise).
// - Full data targets: a file that does not fit fails with ENOSPC (at a write, at fsync or at
//   close; never EIO, never a silent success), the file written before it reads back intact from
//   the data servers, every daemon keeps running, and once the big file is removed (its chunks
//   collected) the space is used again.
// - A full metadata disk: changes fail with ENOSPC, reads go on, and what was acknowledged before
//   is all there after penstock-meta's restart on a disk with room again (a failed write-ahead-log
//   sync leaves the database's state on disk unknown, so the daemon asks to be restarted).
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
constexpr const char* kMetaOptions = "size=3m";     // the metadata database
constexpr size_t kMiB = 1 << 20;

// Mounts a tmpfs with `options` at `path`. A failure names the reason.
::testing::AssertionResult mount_small_tmpfs(const std::string& path, const char* options) {
  if (::mount("tmpfs", path.c_str(), "tmpfs", 0, options) != 0) {
    return ::testing::AssertionFailure() << "mount tmpfs at " << path << ": " << errno_name(errno);
  }
  return ::testing::AssertionSuccess();
}

// `Small` names what gets a small tmpfs: the data targets or the metadata database.
template <bool kSmallMeta>
class FullDiskFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (local_only()) GTEST_SKIP() << "needs the Penstock binaries (PENSTOCK_TEST_DIR is set)";
    if (::geteuid() != 0) GTEST_SKIP() << "mounting small tmpfs targets needs root";
    // Containers without CAP_SYS_ADMIN cannot mount: find out before starting a cluster.
    std::string probe = std::string(std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp") +
                        "/penstock-full-disk-probe-XXXXXX";
    ASSERT_NE(::mkdtemp(probe.data()), nullptr) << errno_name(errno);
    const bool can_mount = mount_small_tmpfs(probe, kTargetOptions);
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
      std::vector<std::pair<std::string, const char*>> small;
      if (kSmallMeta) {
        small.emplace_back(state + "/meta", kMetaOptions);
      } else {
        for (int k = 1; k <= kDataServers; ++k) small.emplace_back(state + "/data" + std::to_string(k), kTargetOptions);
      }
      for (const auto& [path, options] : small) {
        if (::mkdir(path.c_str(), 0755) != 0) {
          return ::testing::AssertionFailure() << "mkdir " << path << ": " << errno_name(errno);
        }
        ::testing::AssertionResult m = mount_small_tmpfs(path, options);
        if (!m) return m;
        mounted_.push_back(path);
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

using FullDataTargetsTest = FullDiskFixture<false>;
using FullMetaDiskTest = FullDiskFixture<true>;

TEST_F(FullDataTargetsTest, AFileThatDoesNotFitFailsWithEnospcAndLosesNothingElse) {
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

TEST_F(FullMetaDiskTest, ChangesFailWithEnospcAndNothingAcknowledgedIsLost) {
  const std::string dir = make_test_dir(cluster_.mount_path());
  const std::string value(60000, 'v');
  // Files with a large xattr each until the 3 MiB database disk is full.
  int made = 0;
  std::string failure;
  for (int i = 0; i < 400 && failure.empty(); ++i) {
    const std::string path = dir + "/f" + std::to_string(i);
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.ok()) {
      failure = "create f" + std::to_string(i) + ": " + errno_name(errno);
    } else if (::setxattr(path.c_str(), "user.big", value.data(), value.size(), 0) != 0) {
      failure = "setxattr f" + std::to_string(i) + ": " + errno_name(errno);
    } else {
      ++made;
    }
  }
  ASSERT_FALSE(failure.empty()) << "400 x 60 KB of xattrs fit in a 3 MiB database";
  EXPECT_NE(failure.find("ENOSPC"), std::string::npos) << failure;
  ASSERT_GT(made, 0);
  // Reads go on while changes are refused.
  std::string got(value.size(), '\0');
  EXPECT_EQ(::getxattr((dir + "/f0").c_str(), "user.big", got.data(), got.size()), static_cast<ssize_t>(value.size()))
      << errno_name(errno);
  EXPECT_TRUE(got == value) << "f0's xattr came back changed";
  const int failed_create = ::mkdir((dir + "/refused").c_str(), 0755) == 0 ? 0 : errno;
  EXPECT_EQ(failed_create, ENOSPC) << errno_name(failed_create);
  for (const std::string role : {"meta", "data1", "data2", "mount1"}) {
    EXPECT_TRUE(daemon_running(role)) << role << " stopped on a full disk\n" << cluster_.log_tails();
  }

  // Room again, and a restart of penstock-meta: every acknowledged change is there, and new ones work.
  ASSERT_EQ(::mount("tmpfs", mounted_.at(0).c_str(), "tmpfs", MS_REMOUNT, "size=64m"), 0) << errno_name(errno);
  ASSERT_TRUE(cluster_.restart_meta(false)) << cluster_.log_tails();
  for (int i = 0; i < made; ++i) {
    const std::string path = dir + "/f" + std::to_string(i);
    ASSERT_EQ(::getxattr(path.c_str(), "user.big", got.data(), got.size()), static_cast<ssize_t>(value.size()))
        << path << ": " << errno_name(errno);
    ASSERT_TRUE(got == value) << path << "'s xattr came back changed";
  }
  ASSERT_EQ(::mkdir((dir + "/after").c_str(), 0755), 0) << errno_name(errno);
  ASSERT_TRUE(write_file(dir + "/after/file", "written after the restart"));
}

}  // namespace
}  // namespace penstock::testing
