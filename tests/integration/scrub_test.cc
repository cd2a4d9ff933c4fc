// `penstock scrub` on a real cluster: chunks that no file owns are removed from the data servers'
// targets, the chunks of every file stay and read back the same, chunks of numbers the namespace
// never handed out are left alone, and --dry-run only counts.
//
// The orphan is made the way a late write makes one: a file is unlinked and collected, and then
// chunk data for its inode appears on a target again (here a copy of a live chunk file put in
// place on disk; a power loss that takes back a create after its data was written leaves the same).
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

namespace fs = std::filesystem;

// Chunk 0 of `ino` on the target at `target`: chunks/<ino % 256 in hex>/<ino>.0.
fs::path chunk0(const fs::path& target, uint64_t ino) {
  char bucket[8];
  std::snprintf(bucket, sizeof bucket, "%02x", static_cast<unsigned>(ino % 256));
  return target / "chunks" / bucket / (std::to_string(ino) + ".0");
}

// The targets (state/dataK) holding a chunk 0 of `ino`.
std::vector<fs::path> targets_with(const std::string& state, uint64_t ino) {
  std::vector<fs::path> out;
  for (int k = 1; k <= 3; ++k) {
    const fs::path target = fs::path(state) / ("data" + std::to_string(k));
    if (fs::exists(chunk0(target, ino))) out.push_back(target);
  }
  return out;
}

uint64_t inode_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return st.st_ino;
}

class ScrubTest : public ClusterTest {
 protected:
  CommandResult scrub(const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {build_dir() + "/tools/penstock", "scrub", "--meta", cluster_.meta_addr()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return run_command(argv, 120);
  }
};

// Every target took the file system's id at registration (what keeps other file systems' metas
// off it); penstock-meta logs the id when it loads.
TEST_F(ScrubTest, TargetsCarryTheFileSystemId) {
  std::string meta_log;
  ASSERT_TRUE(read_file(cluster_.state_dir() + "/logs/meta.log", &meta_log));
  const std::string key = ", file system ";
  const size_t at = meta_log.find(key);
  ASSERT_NE(at, std::string::npos) << meta_log;
  const std::string id = meta_log.substr(at + key.size(), 32);
  for (int k = 1; k <= 3; ++k) {
    std::string stamp;
    ASSERT_TRUE(read_file(cluster_.state_dir() + "/data" + std::to_string(k) + "/filesystem.id", &stamp));
    EXPECT_EQ(stamp, id + "\n");
  }
}

TEST_F(ScrubTest, RemovesChunksNoFileOwnsAndKeepsEveryFile) {
  const std::string keep = cluster_.mount_path() + "/keep.bin";
  const std::string gone = cluster_.mount_path() + "/gone.bin";
  const std::string data = pattern(200 << 10, 0, 7);
  ASSERT_TRUE(write_file(keep, data));
  ASSERT_TRUE(write_file(gone, pattern(100 << 10, 0, 8)));
  const uint64_t keep_ino = inode_of(keep), gone_ino = inode_of(gone);
  ASSERT_NE(keep_ino, 0u);
  ASSERT_NE(gone_ino, 0u);
  const std::vector<fs::path> keep_targets = targets_with(cluster_.state_dir(), keep_ino);
  ASSERT_EQ(keep_targets.size(), 1u) << "a 200 KiB file is one chunk on one target";
  ASSERT_EQ(::unlink(gone.c_str()), 0) << errno_name(errno);
  // The collector removes the unlinked file's chunks within a few seconds.
  for (int i = 0; i < 300 && !targets_with(cluster_.state_dir(), gone_ino).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(targets_with(cluster_.state_dir(), gone_ino).empty()) << cluster_.log_tails();

  // Chunks of the collected inode show up again (a late write), and chunks of a number the
  // namespace never handed out.
  const fs::path orphan = chunk0(keep_targets[0], gone_ino);
  const uint64_t foreign_ino = (uint64_t{1} << 40) + 3;
  const fs::path foreign = chunk0(keep_targets[0], foreign_ino);
  fs::copy_file(chunk0(keep_targets[0], keep_ino), orphan);
  fs::copy_file(chunk0(keep_targets[0], keep_ino), foreign);

  CommandResult dry = scrub({"--dry-run"});
  ASSERT_EQ(dry.exit_code, 0) << dry.output << cluster_.log_tails();
  EXPECT_NE(dry.output.find("orphans (no such file)  1\n"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("orphans removed         0"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("never handed out        1"), std::string::npos) << dry.output;
  EXPECT_NE(dry.output.find("targets scrubbed        3\n"), std::string::npos) << dry.output;
  EXPECT_TRUE(fs::exists(orphan));

  CommandResult real = scrub({});
  ASSERT_EQ(real.exit_code, 0) << real.output << cluster_.log_tails();
  EXPECT_NE(real.output.find("orphans removed         1\n"), std::string::npos) << real.output;
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_TRUE(fs::exists(foreign));  // not this namespace's: left alone
  EXPECT_TRUE(fs::exists(chunk0(keep_targets[0], keep_ino)));

  // The file's bytes come back the same, from the data server (the mount's caches dropped).
  ASSERT_EQ(::setxattr(cluster_.mount_path().c_str(), "user.penstock.drop_caches", "1", 1, 0), 0)
      << errno_name(errno);
  {
    UniqueFd fd(::open(keep.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(fd.get(), 0) << errno_name(errno);
    ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  }
  std::string got;
  ASSERT_TRUE(read_file(keep, &got));
  EXPECT_TRUE(same_bytes(data, got));

  // The meta server's log names the removal.
  std::string meta_log;
  ASSERT_TRUE(read_file(cluster_.state_dir() + "/logs/meta.log", &meta_log));
  EXPECT_NE(meta_log.find("scrub: removed the chunks of inode " + std::to_string(gone_ino)), std::string::npos)
      << cluster_.log_tails();
}

TEST_F(ScrubTest, ABadAddressOrAnOfflineTargetIsReported) {
  CommandResult r = run_command({build_dir() + "/tools/penstock", "scrub", "--meta", "127.0.0.1:1"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("penstock:"), std::string::npos) << r.output;
  // A data server that is down: its target is not scrubbed, and the command says so.
  const pid_t data2 = cluster_.pid_of("data2");
  ASSERT_GT(data2, 0);
  ASSERT_EQ(::kill(data2, SIGKILL), 0);
  CommandResult partial = scrub({"--timeout-s", "60"});
  EXPECT_NE(partial.exit_code, 0) << partial.output;
  EXPECT_NE(partial.output.find("targets not scrubbed    1"), std::string::npos) << partial.output;
  EXPECT_NE(partial.output.find("scrub incomplete"), std::string::npos) << partial.output;
}

}  // namespace
}  // namespace penstock::testing
