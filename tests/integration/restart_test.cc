// Durability across restarts: a whole tree (files of several sizes on two layouts, directories,
// symlinks, hard links, modes, times, xattrs) is found again byte for byte after the whole
// cluster is stopped and started on the same state; and mutations acknowledged just before the
// metadata server is killed with SIGKILL are present after it restarts.
#include <dirent.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

// Everything observable about one entry of a tree, to compare before and after a restart.
struct Entry {
  mode_t mode = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  off_t size = 0;
  nlink_t nlink = 0;
  ino_t ino = 0;
  struct timespec mtime {};
  std::string data;  // file bytes or symlink target
  std::map<std::string, std::string> xattrs;
};

std::string describe(const Entry& e) {
  std::ostringstream out;
  out << "mode " << std::oct << e.mode << std::dec << " uid " << e.uid << " gid " << e.gid
      << " size " << e.size << " nlink " << e.nlink << " ino " << e.ino << " mtime "
      << e.mtime.tv_sec << "." << e.mtime.tv_nsec << " data " << e.data.size() << " bytes, "
      << e.xattrs.size() << " xattrs";
  return out.str();
}

bool same(const Entry& x, const Entry& y) {
  return x.mode == y.mode && x.uid == y.uid && x.gid == y.gid && x.size == y.size &&
         x.nlink == y.nlink && x.ino == y.ino && x.mtime.tv_sec == y.mtime.tv_sec &&
         x.mtime.tv_nsec == y.mtime.tv_nsec && x.data == y.data && x.xattrs == y.xattrs;
}

std::map<std::string, Entry>* g_walk_out = nullptr;
std::string g_walk_root;

std::map<std::string, std::string> xattrs_of(const char* path) {
  std::map<std::string, std::string> out;
  ssize_t size = llistxattr(path, nullptr, 0);
  if (size <= 0) {
    return out;
  }
  std::string names(static_cast<size_t>(size), '\0');
  size = llistxattr(path, names.data(), names.size());
  for (size_t pos = 0; size > 0 && pos < static_cast<size_t>(size);) {
    std::string name(names.c_str() + pos);
    pos += name.size() + 1;
    std::string value(65536, '\0');
    ssize_t n = lgetxattr(path, name.c_str(), value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      out[name] = value;
    } else {
      out[name] = "<error " + errno_name(errno) + ">";
    }
  }
  return out;
}

int walk_one(const char* path, const struct stat* st, int /*type*/, struct FTW* /*ftw*/) {
  Entry e;
  e.mode = st->st_mode;
  e.uid = st->st_uid;
  e.gid = st->st_gid;
  e.size = st->st_size;
  e.nlink = st->st_nlink;
  e.ino = st->st_ino;
  e.mtime = st->st_mtim;
  if (S_ISREG(st->st_mode)) {
    EXPECT_TRUE(read_file(path, &e.data));
  } else if (S_ISLNK(st->st_mode)) {
    char buf[4096];
    ssize_t n = readlink(path, buf, sizeof(buf));
    EXPECT_GE(n, 0) << path << ": " << errno_name(errno);
    e.data.assign(buf, n > 0 ? static_cast<size_t>(n) : 0);
  }
  if (!S_ISLNK(st->st_mode)) {
    e.xattrs = xattrs_of(path);
  }
  // Directory mtimes change with their contents and are not part of the comparison.
  if (S_ISDIR(st->st_mode)) {
    e.mtime = {};
    e.size = 0;
  }
  (*g_walk_out)[std::string(path).substr(g_walk_root.size())] = std::move(e);
  return 0;
}

std::map<std::string, Entry> snapshot(const std::string& root) {
  std::map<std::string, Entry> out;
  g_walk_out = &out;
  g_walk_root = root;
  EXPECT_EQ(nftw(root.c_str(), walk_one, 16, FTW_PHYS), 0) << root << ": " << errno_name(errno);
  g_walk_out = nullptr;
  return out;
}

void expect_same_tree(const std::map<std::string, Entry>& before,
                      const std::map<std::string, Entry>& after) {
  EXPECT_EQ(before.size(), after.size());
  for (const auto& [path, e] : before) {
    auto it = after.find(path);
    if (it == after.end()) {
      ADD_FAILURE() << path << " is missing after the restart";
      continue;
    }
    if (!same(e, it->second)) {
      ADD_FAILURE() << path << " changed across the restart:\n  before: " << describe(e)
                    << "\n  after:  " << describe(it->second)
                    << (e.data != it->second.data ? "\n  " + std::string(same_bytes(e.data, it->second.data).message()) : "");
    }
  }
  for (const auto& [path, e] : after) {
    if (!before.count(path)) {
      ADD_FAILURE() << path << " appeared after the restart: " << describe(e);
    }
  }
}

class RestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* d = std::getenv("PENSTOCK_TEST_DIR");
    if (d != nullptr && *d != '\0') {
      GTEST_SKIP() << "restarts need a real cluster (PENSTOCK_TEST_DIR is set)";
    }
    umask(022);
    cluster_ = std::make_unique<Cluster>();
    ASSERT_TRUE(cluster_->up());
    root_ = cluster_->mount_path();
  }

  void TearDown() override {
    if (cluster_) {
      if (HasFailure()) {
        std::cerr << cluster_->log_tails(40);
      }
      EXPECT_TRUE(cluster_->down());
      cluster_.reset();
    }
  }

  std::string p(const std::string& name) const { return root_ + "/" + name; }

  std::unique_ptr<Cluster> cluster_;
  std::string root_;
};

TEST_F(RestartTest, WholeTreeSurvivesDownAndUp) {
  ASSERT_EQ(mkdir(p("tree").c_str(), 0755), 0) << errno_name(errno);
  ASSERT_EQ(mkdir(p("tree/small").c_str(), 0755), 0);
  std::string layout = "chunk_size=65536 stripe_count=3";
  ASSERT_EQ(setxattr(p("tree/small").c_str(), "user.penstock.layout", layout.data(),
                     layout.size(), 0), 0)
      << errno_name(errno);
  std::map<std::string, std::string> written;
  uint32_t seed = 100;
  for (size_t size : {size_t{0}, size_t{1}, size_t{4096}, size_t{65537}, size_t{300000}}) {
    std::string path = "tree/small/f" + std::to_string(size);
    written[path] = pattern(size, 0, seed++);
    ASSERT_TRUE(write_file(p(path), written[path]));
  }
  written["tree/big"] = pattern((5 << 20) + 17, 0, seed++);  // > the default 4 MiB chunk
  ASSERT_TRUE(write_file(p("tree/big"), written["tree/big"]));
  ASSERT_EQ(mkdir(p("tree/a").c_str(), 0700), 0);
  ASSERT_EQ(mkdir(p("tree/a/b").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(p("tree/a/b/c").c_str(), 0711), 0);
  ASSERT_EQ(mkdir(p("tree/empty").c_str(), 0755), 0);
  for (int i = 0; i < 20; ++i) {
    std::string path = "tree/a/b/c/n" + std::to_string(i);
    written[path] = pattern(static_cast<size_t>(i) * 1000, 0, seed++);
    ASSERT_TRUE(write_file(p(path), written[path]));
  }
  ASSERT_EQ(symlink("small/f65537", p("tree/rel-link").c_str()), 0);
  ASSERT_EQ(symlink("/absolute/dangling/target", p("tree/a/abs-link").c_str()), 0);
  ASSERT_EQ(link(p("tree/small/f4096").c_str(), p("tree/a/hard").c_str()), 0);
  ASSERT_EQ(mkfifo(p("tree/a/fifo").c_str(), 0640), 0);
  ASSERT_EQ(chmod(p("tree/small/f1").c_str(), 0600), 0);
  ASSERT_EQ(chown(p("tree/small/f0").c_str(), 4242, 4343), 0);
  struct timespec times[2] = {{1300000000, 11}, {1400000000, 22}};
  ASSERT_EQ(utimensat(AT_FDCWD, p("tree/big").c_str(), times, 0), 0);
  ASSERT_EQ(setxattr(p("tree/big").c_str(), "user.origin", "restart-test", 12, 0), 0);
  ASSERT_EQ(setxattr(p("tree/a").c_str(), "user.dir-note", "on a directory", 14, 0), 0);
  // A file that was renamed and one that was overwritten: only the final state must return.
  ASSERT_TRUE(write_file(p("tree/renamed-from"), "first name"));
  ASSERT_EQ(rename(p("tree/renamed-from").c_str(), p("tree/renamed-to").c_str()), 0);
  ASSERT_TRUE(write_file(p("tree/overwritten"), pattern(200000, 0, 1)));
  written["tree/overwritten"] = pattern(150000, 0, 2);
  ASSERT_TRUE(write_file(p("tree/overwritten"), written["tree/overwritten"]));
  ASSERT_TRUE(write_file(p("tree/deleted"), "gone"));
  ASSERT_EQ(unlink(p("tree/deleted").c_str()), 0);

  for (const auto& [path, data] : written) {
    std::string back;
    ASSERT_TRUE(read_file(p(path), &back));
    ASSERT_TRUE(same_bytes(data, back)) << path << " before the restart";
  }
  auto before = snapshot(p("tree"));
  ASSERT_GT(before.size(), 30u);

  ASSERT_TRUE(cluster_->restart());

  auto after = snapshot(p("tree"));
  expect_same_tree(before, after);
  for (const auto& [path, data] : written) {
    std::string back;
    EXPECT_TRUE(read_file(p(path), &back));
    EXPECT_TRUE(same_bytes(data, back)) << path << " after the restart";
  }
  struct stat st {};
  EXPECT_NE(lstat(p("tree/deleted").c_str(), &st), 0);
  EXPECT_NE(lstat(p("tree/renamed-from").c_str(), &st), 0);
  // The restarted cluster takes new writes next to the old data.
  ASSERT_TRUE(write_file(p("tree/after-restart"), pattern(70000, 0, 9)));
  std::string back;
  ASSERT_TRUE(read_file(p("tree/after-restart"), &back));
  EXPECT_TRUE(same_bytes(pattern(70000, 0, 9), back));
  // And a second restart changes nothing either.
  auto again_before = snapshot(p("tree"));
  ASSERT_TRUE(cluster_->restart());
  expect_same_tree(again_before, snapshot(p("tree")));
}

bool process_gone(pid_t pid) {
  if (kill(pid, 0) != 0) {
    return true;
  }
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  size_t paren = line.rfind(')');
  return paren == std::string::npos || (paren + 2 < line.size() && line[paren + 2] == 'Z');
}

TEST_F(RestartTest, AcknowledgedMutationsSurviveKill9OfMeta) {
  ASSERT_EQ(mkdir(p("ack").c_str(), 0755), 0) << errno_name(errno);
  ASSERT_TRUE(write_file(p("ack/to-rename"), "renamed before the crash"));
  const std::string file = p("ack/synced");
  const std::string data = pattern((1 << 20) + 5, 0, 77);
  // A child process creates, writes and fsyncs, reports, and then holds the file open (as an
  // application would at the moment of the crash).
  int report[2];
  ASSERT_EQ(pipe(report), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(report[0]);
    int fd = open(file.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0640);
    bool ok = fd >= 0 && write_all(fd, data) && fsync(fd) == 0;
    char c = ok ? 'y' : 'n';
    ssize_t w = write(report[1], &c, 1);
    (void)w;
    for (;;) {
      pause();
    }
  }
  close(report[1]);
  char c = 0;
  ASSERT_EQ(read(report[0], &c, 1), 1);
  close(report[0]);
  // Namespace mutations are acknowledged when their system call returns.
  bool ns_ok = mkdir(p("ack/dir-before-crash").c_str(), 0755) == 0 &&
               rename(p("ack/to-rename").c_str(), p("ack/renamed").c_str()) == 0 &&
               symlink("synced", p("ack/link").c_str()) == 0;
  int ns_errno = errno;

  pid_t meta = cluster_->pid_of("meta");
  ASSERT_GT(meta, 0) << "no meta pid recorded";
  ASSERT_EQ(kill(meta, SIGKILL), 0) << errno_name(errno);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!process_gone(meta) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(process_gone(meta)) << "meta pid " << meta << " survived SIGKILL";
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_EQ(c, 'y') << "create+write+fsync failed in the child before the crash";
  ASSERT_TRUE(ns_ok) << "namespace mutation before the crash failed: " << errno_name(ns_errno);

  ASSERT_TRUE(cluster_->restart());

  struct stat st {};
  ASSERT_EQ(stat(file.c_str(), &st), 0) << "fsync'd file lost: " << errno_name(errno);
  EXPECT_EQ(st.st_size, static_cast<off_t>(data.size()));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  std::string back;
  ASSERT_TRUE(read_file(file, &back));
  EXPECT_TRUE(same_bytes(data, back));
  EXPECT_EQ(stat(p("ack/dir-before-crash").c_str(), &st), 0) << errno_name(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_NE(lstat(p("ack/to-rename").c_str(), &st), 0);
  ASSERT_TRUE(read_file(p("ack/renamed"), &back));
  EXPECT_EQ(back, "renamed before the crash");
  char buf[64];
  ssize_t n = readlink(p("ack/link").c_str(), buf, sizeof(buf));
  ASSERT_EQ(n, 6) << errno_name(errno);
  EXPECT_EQ(std::string(buf, 6), "synced");
}

// Whether a listing of `dir` (asked of the meta server: the kernel caches no FUSE directory
// listing here, while a stat() could be answered from a dentry the kernel still holds) has `name`.
bool listed(const std::string& dir, const std::string& name) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return false;
  bool found = false;
  while (dirent* e = readdir(d)) found = found || name == e->d_name;
  closedir(d);
  return found;
}

// Kills penstock-meta with SIGKILL and waits until it is gone.
::testing::AssertionResult kill_meta(Cluster& cluster) {
  const pid_t meta = cluster.pid_of("meta");
  if (meta <= 0) return ::testing::AssertionFailure() << "no meta pid recorded";
  if (kill(meta, SIGKILL) != 0) return ::testing::AssertionFailure() << "kill: " << errno_name(errno);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!process_gone(meta) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!process_gone(meta)) return ::testing::AssertionFailure() << "meta pid " << meta << " survived SIGKILL";
  return ::testing::AssertionSuccess();
}

// A close() reports the size without waiting for the meta server's WAL sync (visible to every
// mount at once, fsynced within --close-sync-ms, as its unsynced data is written back later too),
// and creates and unlinks are answered the same way, but each is in the kernel before the reply:
// a kill -9 of penstock-meta right after them loses nothing. (Whether fsync() waits for the sync is checked in
// client_read_test.cc, ClientDurabilityTest.)
TEST(CloseSizeTest, SurvivesAKillOfTheMetaServerRightAfterTheClose) {
  if (const char* d = std::getenv("PENSTOCK_TEST_DIR"); d != nullptr && *d != '\0') {
    GTEST_SKIP() << "restarts need a real cluster (PENSTOCK_TEST_DIR is set)";
  }
  ClusterOptions options;
  options.meta_args = "--close-sync-ms 60000";  // no delayed sync during the test
  Cluster cluster(options);
  ASSERT_TRUE(cluster.up());
  // The first create after a start syncs (its inode-number batch); later ones, unlinks and a
  // close's report are answered before a sync. Each kind is the last before a kill once (a later
  // one would hand the earlier to the kernel too).
  const std::string m = cluster.mount_path();
  struct stat st {};
  ASSERT_EQ(mkdir((m + "/first").c_str(), 0755), 0) << errno_name(errno);
  // A symlink: unlinking a file would queue its chunks for collection, and the collector syncs.
  ASSERT_EQ(symlink("target", (m + "/gone").c_str()), 0) << errno_name(errno);
  ASSERT_EQ(mkdir((m + "/made").c_str(), 0755), 0) << errno_name(errno);
  ASSERT_TRUE(kill_meta(cluster));
  ASSERT_TRUE(cluster.restart());
  EXPECT_TRUE(listed(m, "made")) << "a mkdir was lost with penstock-meta";
  ASSERT_EQ(mkdir((m + "/first-again").c_str(), 0755), 0) << errno_name(errno);
  ASSERT_EQ(unlink((m + "/gone").c_str()), 0) << errno_name(errno);
  ASSERT_TRUE(kill_meta(cluster));
  ASSERT_TRUE(cluster.restart());
  EXPECT_FALSE(listed(m, "gone")) << "an unlink was lost with penstock-meta";
  const std::string file = m + "/closed";
  const std::string data = pattern(5000, 0, 91);
  ASSERT_TRUE(write_file(file, data));
  ASSERT_TRUE(kill_meta(cluster));
  ASSERT_TRUE(cluster.restart());
  ASSERT_EQ(stat(file.c_str(), &st), 0) << errno_name(errno);
  EXPECT_EQ(st.st_size, static_cast<off_t>(data.size())) << "the size close() reported was lost with penstock-meta";
  std::string back;
  ASSERT_TRUE(read_file(file, &back));
  EXPECT_TRUE(same_bytes(data, back));
  EXPECT_TRUE(cluster.down());
}

// A change on its way to penstock-meta when it dies is sent again by the mount (same reply slot,
// same number) and applied by the restarted server, instead of failing with EIO. Here the server
// is stopped (SIGSTOP) with an rmdir and a rename in its socket, then killed: it never read them.
// (A change applied whose reply was lost: ClientReplayTest in client_read_test.cc.) Both name
// only directories this mount holds entry leases on, so the kernel sends them without a LOOKUP
// first (a LOOKUP, which changes nothing, was always sent again).
TEST_F(RestartTest, ChangesInFlightWhenMetaIsKilledAreAppliedAfterItsRestart) {
  ASSERT_EQ(mkdir(p("inflight").c_str(), 0755), 0) << errno_name(errno);
  for (const char* d : {"inflight/gone", "inflight/dir-a", "inflight/dir-b"}) {
    ASSERT_EQ(mkdir(p(d).c_str(), 0755), 0) << d << ": " << errno_name(errno);
  }
  ASSERT_TRUE(write_file(p("inflight/dir-a/f"), "moved while penstock-meta died"));
  struct stat st {};
  for (const char* d : {"inflight/gone", "inflight/dir-a", "inflight/dir-b"}) {
    ASSERT_EQ(stat(p(d).c_str(), &st), 0) << d << ": " << errno_name(errno);  // looked up: leased
  }
  const pid_t meta = cluster_->pid_of("meta");
  ASSERT_GT(meta, 0) << "no meta pid recorded";
  ASSERT_EQ(kill(meta, SIGSTOP), 0) << errno_name(errno);
  int removed = -1, moved = -1, removed_errno = 0, moved_errno = 0;
  std::thread rmdir_thread([&] {
    removed = rmdir(p("inflight/gone").c_str());
    removed_errno = errno;
  });
  std::thread rename_thread([&] {
    moved = rename(p("inflight/dir-a").c_str(), p("inflight/dir-b").c_str());
    moved_errno = errno;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // both wait in the stopped server's socket
  const bool restarted = cluster_->restart_meta(/*crash=*/true);
  kill(meta, SIGCONT);  // in case the kill did not happen
  rmdir_thread.join();
  rename_thread.join();
  ASSERT_TRUE(restarted);
  EXPECT_EQ(removed, 0) << "rmdir: " << errno_name(removed_errno);
  EXPECT_EQ(moved, 0) << "rename: " << errno_name(moved_errno);
  EXPECT_FALSE(listed(p("inflight"), "gone"));
  EXPECT_FALSE(listed(p("inflight"), "dir-a"));
  std::string back;
  EXPECT_TRUE(read_file(p("inflight/dir-b/f"), &back));
  EXPECT_EQ(back, "moved while penstock-meta died");
}

// A checkpoint shard's close() reports the size it wrote to penstock-meta (ReportSizeAtClose, sent
// as ReplayInline). When penstock-meta is killed with that report in its socket, the mount sends it
// again to the restarted server: close() returns 0, and the file has every byte.
TEST_F(RestartTest, ACloseInFlightWhenMetaIsKilledReportsItsSizeAfterTheRestart) {
  const std::string file = p("shard-at-close");
  const int fd = open(file.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  ASSERT_GE(fd, 0) << errno_name(errno);
  const std::string first = pattern(1 << 20, 0, 21), second = pattern(3 << 20, 1 << 20, 22);
  ASSERT_TRUE(pwrite_all(fd, first, 0));
  ASSERT_EQ(fsync(fd), 0) << errno_name(errno);  // the create and the first MiB are at penstock-meta
  ASSERT_TRUE(pwrite_all(fd, second, first.size()));
  const pid_t meta = cluster_->pid_of("meta");
  ASSERT_GT(meta, 0) << "no meta pid recorded";
  ASSERT_EQ(kill(meta, SIGSTOP), 0) << errno_name(errno);
  int closed = -1, close_errno = 0;
  std::thread closer([&] {
    closed = close(fd);
    close_errno = errno;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the report waits in the stopped server's socket
  const bool restarted = cluster_->restart_meta(/*crash=*/true);
  kill(meta, SIGCONT);  // in case the kill did not happen
  closer.join();
  ASSERT_TRUE(restarted);
  EXPECT_EQ(closed, 0) << "close: " << errno_name(close_errno);
  struct stat st {};
  ASSERT_EQ(stat(file.c_str(), &st), 0) << errno_name(errno);
  EXPECT_EQ(static_cast<size_t>(st.st_size), first.size() + second.size());
  std::string back;
  ASSERT_TRUE(read_file(file, &back));
  EXPECT_TRUE(same_bytes(first + second, back));
  // It was the size report that waited in the socket, and it went again in its reply slot.
  std::string log;
  ASSERT_TRUE(read_file(cluster_->state_dir() + "/logs/mount1.log", &log));
  EXPECT_NE(log.find("ReportSizeAtClose got no answer from penstock-meta"), std::string::npos);
}

// Through the mount: when the data servers are gone, a write that was buffered (write-behind)
// fails at close for every descriptor that was open at the time, also one that wrote nothing,
// and not for one opened after the failure was reported (Linux's writeback-error semantics).
TEST_F(RestartTest, LostWriteIsReportedAtCloseOfEveryDescriptorOpenAtTheTime) {
  const std::string file = p("lost-write");
  const int writer = open(file.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
  ASSERT_GE(writer, 0) << errno_name(errno);
  const int other = open(file.c_str(), O_WRONLY);
  ASSERT_GE(other, 0) << errno_name(errno);
  for (const char* role : {"data1", "data2", "data3"}) {
    const pid_t pid = cluster_->pid_of(role);
    ASSERT_GT(pid, 0) << "no pid recorded for " << role;
    ASSERT_EQ(kill(pid, SIGKILL), 0) << role << ": " << errno_name(errno);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!process_gone(pid) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_TRUE(process_gone(pid)) << role << " survived SIGKILL";
  }
  const std::string data = pattern(1 << 20, 0, 5);
  ASSERT_EQ(write(writer, data.data(), data.size()), static_cast<ssize_t>(data.size()))
      << "expected the write to be buffered: " << errno_name(errno);
  EXPECT_EQ(close(other), -1) << "the other descriptor was open when the bytes were lost";
  const int later = open(file.c_str(), O_WRONLY);
  ASSERT_GE(later, 0) << errno_name(errno);
  EXPECT_EQ(close(writer), -1) << "the writer's own close must report it too";
  EXPECT_EQ(close(later), 0) << "opened after the failure was reported: " << errno_name(errno);
  ASSERT_TRUE(cluster_->restart());
}

// A forked child running `body`; the int it returns comes back through `fd` (finish_child).
struct Child {
  pid_t pid = -1;
  int fd = -1;
};
Child start_child(const std::function<int()>& body) {
  int p[2];
  if (pipe(p) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    close(p[0]);
    const int v = body();
    _exit(write(p[1], &v, sizeof v) == sizeof v ? 0 : 1);
  }
  close(p[1]);
  if (pid < 0) close(p[0]);
  return {pid, pid < 0 ? -1 : p[0]};
}
// Waits for the child's value and its exit; -1 when it sent none.
int finish_child(const Child& c) {
  int v = -1;
  if (read(c.fd, &v, sizeof v) != static_cast<ssize_t>(sizeof v)) v = -1;
  close(c.fd);
  int status = 0;
  waitpid(c.pid, &status, 0);
  return v;
}

// Files the mount created behind a directory lease (client/lib/create_behind.h) whose batch never
// reached penstock-meta before it crashed are applied by the restarted one: the inode numbers it
// gave the mount are kept in its database, and the mount sends the batch again.
TEST(MetaFailoverTest, FilesCreatedBehindSurviveAMetaCrashBeforeTheirBatchIsApplied) {
  if (local_only()) GTEST_SKIP() << "restarts need a real cluster (PENSTOCK_TEST_DIR is set)";
  ClusterOptions options;
  // A 2 s term: the mount trusts its lease for 1.5 s after the last batch, time enough for the
  // creates below on a loaded machine (with 250 ms, 187 ms).
  options.meta_args = "--dir-lease-ms 2000";
  Cluster cluster(options);
  ASSERT_TRUE(cluster.up());
  const std::string dir = cluster.mount_path() + "/behind";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << errno_name(errno);
  auto create = [&](const std::string& name) {
    const int fd = open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0640);
    return fd >= 0 && close(fd) == 0;
  };
  for (int i = 0; i < 64; ++i) ASSERT_TRUE(create("f" + std::to_string(i))) << i << ": " << errno_name(errno);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // every batch answered
  // penstock-meta stops answering; the mount, holding the directory, still answers creates there.
  const pid_t meta = cluster.pid_of("meta");
  ASSERT_GT(meta, 0) << "no meta pid recorded";
  ASSERT_EQ(kill(meta, SIGSTOP), 0) << errno_name(errno);
  // A lookup on its way to penstock-meta when it dies is sent again to the restarted one.
  const Child looker = start_child([&] {
    struct stat st {};
    return stat((cluster.mount_path() + "/nope").c_str(), &st) == 0 ? 0 : errno;
  });
  ASSERT_GE(looker.pid, 0) << errno_name(errno);
  constexpr int kBehind = 8;
  const Child creator = start_child([&] {
    for (int i = 0; i < kBehind; ++i) {
      if (!create("late" + std::to_string(i))) return errno;
    }
    return 0;
  });
  ASSERT_GE(creator.pid, 0) << errno_name(errno);
  pollfd pfd{creator.fd, POLLIN, 0};
  const bool answered = poll(&pfd, 1, 3000) == 1;  // by the mount alone: penstock-meta is stopped
  EXPECT_TRUE(answered) << "the creates waited for penstock-meta: they were not made behind a lease";
  ASSERT_TRUE(cluster.restart_meta(/*crash=*/true));
  // Made right after the restart, before the data servers reported: it waits for them.
  EXPECT_TRUE(create("after")) << errno_name(errno);
  const int created = finish_child(creator);
  EXPECT_EQ(created, 0) << "a create failed: " << errno_name(created);
  const int looked = finish_child(looker);
  EXPECT_EQ(looked, ENOENT) << "the lookup cut off by the crash: " << errno_name(looked);
  for (int i = 0; i < kBehind; ++i) {
    const std::string name = "late" + std::to_string(i);
    struct stat st {};
    EXPECT_EQ(stat((dir + "/" + name).c_str(), &st), 0) << name << " was lost with penstock-meta: " << errno_name(errno);
    EXPECT_TRUE(listed(dir, name)) << name << " is missing from the directory";
  }
  EXPECT_TRUE(listed(dir, "f63"));
  const std::string logs = cluster.log_tails(300);
  EXPECT_EQ(logs.find("may be lost"), std::string::npos) << "the mount gave a batch up";
  EXPECT_EQ(logs.find("was refused by penstock-meta"), std::string::npos);
  if (HasFailure()) std::cerr << logs;
  EXPECT_TRUE(cluster.down());
}

// An open penstock-meta had not written to its store yet when it crashed (server/meta/open_table.h)
// is sent again by the mount when it sees the restarted server (ReclaimOpens); until then the
// server finalizes no unlinked file. So a file unlinked right after the restart keeps its data for
// the descriptor that had it open, as POSIX promises.
TEST(MetaFailoverTest, AFileOpenAcrossAMetaCrashKeepsItsDataWhenUnlinked) {
  if (local_only()) GTEST_SKIP() << "restarts need a real cluster (PENSTOCK_TEST_DIR is set)";
  ClusterOptions options;
  // A 3 s session lease: the mount heartbeats, and so sends its opens, every second, and a
  // restarted server holds unlinked files back for 3 s at most.
  options.meta_args = "--session-lease-s 3";
  Cluster cluster(options);
  ASSERT_TRUE(cluster.up());
  const std::string file = cluster.mount_path() + "/held";
  const std::string data = pattern(3 << 20, 0, 23);
  ASSERT_TRUE(write_file(file, data));
  const int fd = open(file.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << errno_name(errno);
  ASSERT_TRUE(cluster.restart_meta(/*crash=*/true));  // the open is milliseconds old: in memory only
  ASSERT_EQ(unlink(file.c_str()), 0) << errno_name(errno);
  // Past the longest wait for the mount's opens; without them the collector would have removed
  // the chunks by now (it starts on the unlink's sync).
  std::this_thread::sleep_for(std::chrono::seconds(5));
  // Read from the data servers: the mount's cache and the kernel's pages dropped first.
  ASSERT_EQ(setxattr(cluster.mount_path().c_str(), "user.penstock.drop_caches", "1", 1, 0), 0) << errno_name(errno);
  ASSERT_EQ(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
  std::string back(data.size(), '\0');
  size_t got = 0;
  while (got < back.size()) {
    const ssize_t n = pread(fd, back.data() + got, back.size() - got, static_cast<off_t>(got));
    ASSERT_GT(n, 0) << "read at " << got << ": " << (n < 0 ? errno_name(errno) : "end of file");
    got += static_cast<size_t>(n);
  }
  EXPECT_TRUE(same_bytes(data, back)) << "the unlinked file's data was removed while it was open";
  EXPECT_EQ(close(fd), 0) << errno_name(errno);
  const std::string logs = cluster.log_tails(300);
  if (HasFailure()) std::cerr << logs;
  EXPECT_TRUE(cluster.down());
}

}  // namespace
}  // namespace penstock::testing
