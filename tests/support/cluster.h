// A real Penstock cluster for integration tests: penstock-meta, N penstock-data and one or more
// penstock-mount processes on loopback, started and stopped through deploy/local-cluster in a
// private temporary directory with its own free ports.
//
// Cleanup is unconditional. Besides Cluster's destructor (and Cluster::down()), every cluster
// registers with
//   - a watchdog process (its own session) that runs `local-cluster down` once the test process
//     is gone, however it died (crash, SIGKILL from the test runner's timeout);
//   - an atexit hook and SIGINT/SIGTERM/SIGHUP handlers that run `local-cluster down` before the
//     process ends.
// So no mount and no daemon outlives the test binary, whether the test passed, failed or crashed.
//
// Ownership: a Cluster owns its temporary directory and every process and mount made through it.
// Thread-safety: a Cluster is used from one thread (the test's); the cleanup registry is
// internally synchronized.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::testing {

// The meson build directory holding the binaries: $PENSTOCK_BUILD, else the one this test was
// built in.
std::string build_dir();
// The repository root (for deploy/*): $PENSTOCK_SOURCE, else the one this test was built from.
std::string source_dir();

struct CommandResult {
  int exit_code = -1;      // exit status, or 128 + signal number when killed by a signal
  bool timed_out = false;  // killed because it ran past the timeout
  double seconds = 0;      // wall time
  std::string output;      // stdout and stderr interleaved
};

// Runs argv[0] (a path) with argv, waits at most timeout_s (then SIGKILLs its process group) and
// captures its output. `extra_env` entries ("NAME=value") are added to this process's
// environment. Never throws; a failed exec gives exit_code 127 and the reason in output.
CommandResult run_command(const std::vector<std::string>& argv, int timeout_s,
                          const std::vector<std::string>& extra_env = {});

// Finds `count` consecutive TCP ports on 127.0.0.1 that nothing listens on (checked by binding),
// below the ephemeral range. Returns the first; 0 if none found.
int find_free_port_base(int count);

// True if `path` (absolute) is a mount point, read from /proc/self/mountinfo (never blocks on a
// hung FUSE daemon).
bool is_mount_point(const std::string& path);

// True when PENSTOCK_TEST_DIR is set: the tests then run against a local directory, and those
// that need the Penstock binaries skip.
bool local_only();

struct ClusterOptions {
  int data_servers = 3;
  std::string meta_args;  // extra penstock-meta flags (local-cluster's PENSTOCK_META_ARGS)
  std::string data_args;  // extra flags of every penstock-data (local-cluster's PENSTOCK_DATA_ARGS)
  // Extra flags of every penstock-mount (local-cluster's PENSTOCK_MOUNT_ARGS); when set, they
  // replace whatever PENSTOCK_MOUNT_ARGS the test runs with (a suite's --fuse-uring, say).
  std::string mount_args;
  // Runs once, before the first up(), with the (empty) state directory already made: e.g. to
  // mount a small file system at state/dataK, local-cluster's target of data server K. Whatever
  // it mounts, the test unmounts after down().
  std::function<::testing::AssertionResult(const std::string& state_dir)> before_first_up;
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions options = {});
  ~Cluster();  // down(), then removes the temporary directory if nothing is mounted in it
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Starts the cluster (first call: new temp dir and ports; later calls: the same state, i.e. a
  // restart) and mounts it at mount_path(). Mounts added with add_mount() before a down() are
  // mounted again. On failure the message holds local-cluster's output and the logs' tails.
  ::testing::AssertionResult up();
  // Unmounts everything and stops every process of this cluster. Idempotent. Fails as well when a
  // daemon's log holds a sanitizer report (ASan, LSan, UBSan) written since the last down().
  ::testing::AssertionResult down();
  // down() + up(): same state, same ports, same mount points. A down() that stopped everything
  // but reported a problem (a sanitizer report in a log) adds a test failure and goes on.
  ::testing::AssertionResult restart();
  // Stops penstock-meta (SIGKILL when `crash`, else SIGTERM) and starts it again on the same
  // port and database; the data servers and mounts go on running.
  ::testing::AssertionResult restart_meta(bool crash);
  // Mounts the cluster a further time; *path receives the new mount point.
  ::testing::AssertionResult add_mount(std::string* path);

  // Records a mount made outside local-cluster (e.g. through deploy/mount.fuse.penstock) in the
  // cluster's state, so that down() and every emergency cleanup unmount it too.
  ::testing::AssertionResult adopt_mount(const std::string& path);

  const std::string& mount_path() const { return mount_; }
  const std::vector<std::string>& extra_mounts() const { return extra_mounts_; }
  const std::string& state_dir() const { return state_; }
  const std::string& temp_dir() const { return dir_; }
  std::string meta_addr() const;
  bool running() const { return running_; }

  // The PID local-cluster recorded for `role` ("meta", "data1", "mount1", ...); -1 if none.
  pid_t pid_of(const std::string& role) const;
  // The last `lines` lines of every log in state/logs, for failure messages.
  std::string log_tails(int lines = 30) const;

 private:
  ::testing::AssertionResult start_mount(const std::string& path);
  // Sanitizer reports in the logs since the last scan; "" if none.
  std::string new_sanitizer_reports();
  // The environment of every local-cluster command: the build and the options' extra flags.
  std::vector<std::string> command_env() const;

  ClusterOptions options_;
  std::string dir_;    // mkdtemp directory owning everything below
  std::string state_;  // dir_/state
  std::string mount_;  // dir_/mnt
  std::vector<std::string> extra_mounts_;
  int port_base_ = 0;
  bool running_ = false;
  int registry_slot_ = -1;
  std::map<std::string, uintmax_t> log_scanned_;  // log path -> bytes already scanned
};

// A fixture with one cluster of its own per test, up before the test body (skipped when
// local_only()) and down after it.
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (local_only()) GTEST_SKIP() << "needs the Penstock binaries (PENSTOCK_TEST_DIR is set)";
    ASSERT_TRUE(cluster_.up());
  }
  void TearDown() override {
    if (cluster_.running()) {
      EXPECT_TRUE(cluster_.down());
    }
  }
  Cluster cluster_;
};

// A gtest environment owning one shared cluster for a whole test binary (tests that only need a
// single mount). When PENSTOCK_TEST_DIR is set, no cluster is started and root() is that
// directory instead, so the same tests validate their POSIX expectations against a local file
// system.
class SharedClusterEnvironment : public ::testing::Environment {
 public:
  void SetUp() override;
  void TearDown() override;

  // The directory the tests work in (a mount of the cluster, or PENSTOCK_TEST_DIR); "" if SetUp
  // failed.
  static const std::string& root();
  // True when running against the real cluster (not PENSTOCK_TEST_DIR).
  static bool on_penstock();
  static Cluster* cluster();
};

// A fresh, empty, world-searchable (0755) directory under `parent` named after the running test.
// Fails the current test if it cannot be made.
std::string make_test_dir(const std::string& parent);

}  // namespace penstock::testing
