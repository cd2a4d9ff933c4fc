// The consistency contract across two mounts of one cluster (two "hosts"): namespace operations
// on mount A are visible on mount B at once (no negative dentries; file dentries are asked for
// again; a directory dentry B trusts is leased, so A's rmdir or rename of it waits the lease out),
// and close-to-open holds for data: after close() on A, open() on B sees the data and the size.
#include <dirent.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

class TwoMountsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (local_only()) {
      return;
    }
    cluster_ = std::make_unique<Cluster>();
    auto r = cluster_->up();
    if (!r) {
      setup_error_ = r.message();
      return;
    }
    r = cluster_->add_mount(&b_root_);
    if (!r) {
      setup_error_ = r.message();
    }
  }

  static void TearDownTestSuite() {
    if (cluster_) {
      EXPECT_TRUE(cluster_->down());
      cluster_.reset();
    }
  }

  static bool local_only() {
    const char* d = std::getenv("PENSTOCK_TEST_DIR");
    return d != nullptr && *d != '\0';
  }

  void SetUp() override {
    if (local_only()) {
      GTEST_SKIP() << "two mounts need a real cluster (PENSTOCK_TEST_DIR is set)";
    }
    ASSERT_TRUE(setup_error_.empty()) << setup_error_;
    umask(022);
    a_ = make_test_dir(cluster_->mount_path());
    ASSERT_FALSE(a_.empty());
    b_ = b_root_ + a_.substr(cluster_->mount_path().size());
  }

  void TearDown() override {
    if (HasFailure() && cluster_) {
      std::cerr << cluster_->log_tails(40);
    }
  }

  std::string a(const std::string& name) const { return a_ + "/" + name; }
  std::string b(const std::string& name) const { return b_ + "/" + name; }

  static std::unique_ptr<Cluster> cluster_;
  static std::string b_root_;
  static std::string setup_error_;
  std::string a_, b_;  // the same directory seen through mount A and mount B
};

std::unique_ptr<Cluster> TwoMountsTest::cluster_;
std::string TwoMountsTest::b_root_;
std::string TwoMountsTest::setup_error_;

std::string contents(const std::string& path) {
  std::string out;
  EXPECT_TRUE(read_file(path, &out));
  return out;
}

std::set<std::string> list_dir(const std::string& path) {
  std::set<std::string> names;
  DIR* d = opendir(path.c_str());
  EXPECT_NE(d, nullptr) << path << ": " << errno_name(errno);
  if (d == nullptr) {
    return names;
  }
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") {
      names.insert(n);
    }
  }
  closedir(d);
  return names;
}

// Chunk files of inode `ino` on every data server of the cluster: target/chunks/XX/INO.0 (chunk 0)
// and the files of target/chunks/XX/INO/ (chunks 1 and up).
int chunk_files_of(const std::string& state_dir, uint64_t ino) {
  namespace fs = std::filesystem;
  const std::string name = std::to_string(ino);
  int n = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(state_dir, fs::directory_options::skip_permission_denied, ec), end;
       !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    const fs::path& p = it->path();
    const bool first = p.filename() == name + ".0" && p.parent_path().parent_path().filename() == "chunks";
    const bool later = p.parent_path().filename() == name &&
                       p.parent_path().parent_path().parent_path().filename() == "chunks";
    if (first || later) ++n;
  }
  return n;
}

// Many creates in one directory make mount A take the directory's lease and answer creates itself
// (client/lib/create_behind.h). B's first look waits until A's lease is over and sees every file;
// the files A created behind hold data written right after their create; both mounts then go on.
TEST_F(TwoMountsTest, FilesCreatedBehindALeaseAreSeenByTheOtherMountAtItsFirstLook) {
  constexpr int kFiles = 200;
  const std::string dir = a("many");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << errno_name(errno);
  for (int i = 0; i < kFiles; ++i) {
    const std::string p = dir + "/f" + std::to_string(i);
    const int fd = open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0640);
    ASSERT_GE(fd, 0) << p << ": " << errno_name(errno);
    if (i % 50 == 49) {
      ASSERT_TRUE(write_all(fd, "data of " + std::to_string(i))) << p;  // writes need the chains
    }
    ASSERT_EQ(close(fd), 0) << p << ": " << errno_name(errno);
  }
  // A's own view: a name it created is there, one it did not is not (answered from the lease).
  struct stat st {};
  EXPECT_EQ(stat((dir + "/f7").c_str(), &st), 0) << errno_name(errno);
  EXPECT_EQ(stat((dir + "/nope").c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
  const auto t0 = std::chrono::steady_clock::now();
  const std::set<std::string> seen = list_dir(b("many"));
  const double waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(seen.size(), static_cast<size_t>(kFiles));
  EXPECT_LT(waited_s, 5.0) << "B waits at most the lease term plus grace";
  for (int i = 49; i < kFiles; i += 50) {
    EXPECT_EQ(contents(b("many/f" + std::to_string(i))), "data of " + std::to_string(i));
  }
  ASSERT_EQ(stat(b("many/f0").c_str(), &st), 0) << errno_name(errno);
  EXPECT_EQ(st.st_mode, S_IFREG | 0640u);
  EXPECT_EQ(st.st_uid, geteuid());
  // B changes the directory; A, whose lease is over, sees it at once.
  ASSERT_TRUE(write_file(b("many/fromB"), "b"));
  ASSERT_EQ(unlink(b("many/f1").c_str()), 0) << errno_name(errno);
  EXPECT_EQ(contents(a("many/fromB")), "b");
  EXPECT_EQ(stat(a("many/f1").c_str(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
  ASSERT_TRUE(write_file(a("many/fromA"), "a"));
  EXPECT_EQ(contents(b("many/fromA")), "a");
  EXPECT_EQ(list_dir(a("many")).size(), static_cast<size_t>(kFiles + 1));
}

TEST_F(TwoMountsTest, FileUnlinkedOnBStaysReadableOnAAndIsCollectedAfterClose) {
  const std::string data = pattern((3u << 20) + 5, 0, 41);
  ASSERT_TRUE(write_file(a("f"), data));
  const int fd = open(a("f").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0) << errno_name(errno);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  EXPECT_GT(chunk_files_of(cluster_->state_dir(), st.st_ino), 0);
  ASSERT_EQ(unlink(b("f").c_str()), 0) << errno_name(errno);
  bool ok = false;
  EXPECT_TRUE(same_bytes(data, pread_all(fd, data.size(), 0, &ok)));
  EXPECT_TRUE(ok);
  ASSERT_EQ(close(fd), 0);
  // The close's release reaches the meta server in a batch within milliseconds; the collector then
  // removes the chunks from every data server.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (chunk_files_of(cluster_->state_dir(), st.st_ino) > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(chunk_files_of(cluster_->state_dir(), st.st_ino), 0) << "chunks of the closed orphan were not collected";
}

TEST_F(TwoMountsTest, MkdirOnAIsVisibleOnBAtOnce) {
  ASSERT_EQ(mkdir(a("d").c_str(), 0755), 0) << errno_name(errno);
  struct stat sa {}, sb {};
  ASSERT_EQ(stat(b("d").c_str(), &sb), 0) << errno_name(errno);
  ASSERT_EQ(stat(a("d").c_str(), &sa), 0);
  EXPECT_TRUE(S_ISDIR(sb.st_mode));
  EXPECT_EQ(sa.st_ino, sb.st_ino);
  EXPECT_EQ(list_dir(b_), (std::set<std::string>{"d"}));
  // A chain of directories made on A, used at once on B (the checkpoint-directory pattern).
  ASSERT_EQ(mkdir(a("d/e").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(a("d/e/f").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(b("d/e/f/from-b"), "written on B"));
  EXPECT_EQ(contents(a("d/e/f/from-b")), "written on B");
  // rmdir on B is seen on A.
  ASSERT_EQ(unlink(b("d/e/f/from-b").c_str()), 0);
  ASSERT_EQ(rmdir(b("d/e/f").c_str()), 0) << errno_name(errno);
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(a("d/e/f").c_str(), &sa));
}

TEST_F(TwoMountsTest, NoNegativeCaching) {
  struct stat st {};
  for (int i = 0; i < 3; ++i) {
    PENSTOCK_EXPECT_ERRNO(ENOENT, stat(b("late").c_str(), &st));
  }
  ASSERT_TRUE(write_file(a("late"), "arrived"));
  ASSERT_EQ(stat(b("late").c_str(), &st), 0) << "B cached the negative lookup: " << errno_name(errno);
  EXPECT_EQ(contents(b("late")), "arrived");
  ASSERT_EQ(mkdir(a("late-dir").c_str(), 0755), 0);
  EXPECT_EQ(stat(b("late-dir").c_str(), &st), 0) << errno_name(errno);
}

// Every rank opening one shared file with O_CREAT (a log, a marker file): the kernel of each host
// looks the name up, finds nothing, and sends CREATE; the host that comes second must open the file
// the first made, not fail with EEXIST. With O_EXCL exactly one of them wins. Both threads start
// each open together; a name whose two opens did not overlap still checks the plain case.
TEST_F(TwoMountsTest, OpensWithOCreatRacingOnTwoMountsBothOpenTheOneFile) {
  constexpr int kNames = 150;
  std::atomic<int> ready{0};
  auto racer = [&](const std::string& root, int round, int flags, int* fd, int* err) {
    ready.fetch_add(1);
    while (ready.load() < 2 * (round + 1)) {
    }
    // A directory of its own per 8 names: 16 files created and closed in one directory would make a
    // mount take its lease, and the race is between two mounts creating without one.
    const std::string path = root + "/d" + std::to_string(round / 8) + "/f" + std::to_string(round);
    *fd = open(path.c_str(), flags, 0644);
    *err = *fd < 0 ? errno : 0;
  };
  for (int pass = 0; pass < 2; ++pass) {
    const bool excl = pass == 1;
    const std::string sub = excl ? "excl" : "shared";
    ASSERT_EQ(mkdir(a(sub).c_str(), 0755), 0) << errno_name(errno);
    for (int d = 0; d < kNames / 8 + 1; ++d) {
      ASSERT_EQ(mkdir(a(sub + "/d" + std::to_string(d)).c_str(), 0755), 0) << errno_name(errno);
    }
    ready.store(0);
    int both_opened = 0, one_opened = 0;
    std::vector<std::string> failures;
    for (int i = 0; i < kNames; ++i) {
      const int flags = O_CREAT | O_WRONLY | O_APPEND | (excl ? O_EXCL : 0);
      int fd_a = -1, fd_b = -1, err_a = 0, err_b = 0;
      std::thread ta(racer, a(sub), i, flags, &fd_a, &err_a);
      std::thread tb(racer, b(sub), i, flags, &fd_b, &err_b);
      ta.join();
      tb.join();
      UniqueFd ua(fd_a), ub(fd_b);
      if (ua.ok() && ub.ok()) {
        ++both_opened;
        struct stat sa {}, sb {};
        ASSERT_EQ(fstat(ua.get(), &sa), 0);
        ASSERT_EQ(fstat(ub.get(), &sb), 0);
        EXPECT_EQ(sa.st_ino, sb.st_ino) << "name " << i << ": two mounts opened two files";
      } else if (ua.ok() || ub.ok()) {
        ++one_opened;
        const int err = ua.ok() ? err_b : err_a;
        if (!excl || err != EEXIST) failures.push_back("name " + std::to_string(i) + ": " + errno_name(err));
      } else {
        failures.push_back("name " + std::to_string(i) + ": both failed, " + errno_name(err_a) + " / " +
                           errno_name(err_b));
      }
    }
    EXPECT_TRUE(failures.empty()) << (excl ? "O_EXCL" : "O_CREAT") << ": " << failures.size()
                                  << " opens failed, the first: " << failures.front();
    if (excl) {
      EXPECT_EQ(one_opened, kNames) << "O_CREAT|O_EXCL: both mounts created one name " << both_opened << " times";
    } else {
      EXPECT_EQ(both_opened, kNames);
    }
  }
}

// Attributes: a stat() by path on B sees A's change at once (every path lookup asks the meta
// server); fstat() on a descriptor B already holds may reuse its attributes for at most the 1 s
// attribute timeout, then sees the change too.
// fstat(fd)'s size, polled for up to 3 s until it is `want` (-1 when fstat fails).
off_t fstat_size_once_it_is(int fd, off_t want) {
  struct stat st {};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  do {
    if (fstat(fd, &st) != 0) return -1;
    if (st.st_size == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < deadline);
  return st.st_size;
}

TEST_F(TwoMountsTest, StatByPathIsFreshAndAnOpenDescriptorCatchesUpWithinASecond) {
  ASSERT_TRUE(write_file(a("grow"), "0123456789"));
  UniqueFd held(open(b("grow").c_str(), O_RDONLY));
  ASSERT_TRUE(held.ok()) << errno_name(errno);
  struct stat st {};
  ASSERT_EQ(fstat(held.get(), &st), 0);
  EXPECT_EQ(st.st_size, 10);
  ASSERT_TRUE(write_file(a("grow"), std::string(25, 'x')));
  // The held descriptor first (a path lookup would refresh the same inode's attributes).
  EXPECT_EQ(fstat_size_once_it_is(held.get(), 25), 25) << "fstat on B's open descriptor did not catch up within the timeout";
  ASSERT_TRUE(write_file(a("grow"), std::string(40, 'y')));
  ASSERT_EQ(chmod(a("grow").c_str(), 0600), 0);
  ASSERT_EQ(stat(b("grow").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 40) << "stat by path on B did not see the size A reported at close";
  EXPECT_EQ(st.st_mode & 07777, 0600u);
}

// `tail -f` on B of a file A appends to: B's descriptor, opened before the append, reads the new
// bytes once it sees the new size. B's cache holds the file's last page as it was (zeros past the
// old end); an append that stays within that page must be read from the data servers, not as the
// cached zeros.
TEST_F(TwoMountsTest, BytesAppendedWithinTheLastPageAreReadNotZeros) {
  const std::string first = pattern(5000, 0, 7);
  ASSERT_TRUE(write_file(a("log"), first));
  UniqueFd held(open(b("log").c_str(), O_RDONLY));
  ASSERT_TRUE(held.ok()) << errno_name(errno);
  bool ok = false;
  ASSERT_TRUE(same_bytes(first, pread_all(held.get(), 8192, 0, &ok)));
  ASSERT_TRUE(ok) << errno_name(errno);
  const std::string more = pattern(1000, 5000, 8);
  {
    UniqueFd fd(open(a("log").c_str(), O_WRONLY | O_APPEND));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(write_all(fd.get(), more));
  }
  ASSERT_EQ(fstat_size_once_it_is(held.get(), 6000), 6000) << "fstat on B's open descriptor did not catch up";
  const std::string got = pread_all(held.get(), 8192, 0, &ok);
  ASSERT_TRUE(ok) << errno_name(errno);
  EXPECT_TRUE(same_bytes(first + more, got)) << "B read the appended bytes as its cached zeros";
}

TEST_F(TwoMountsTest, CloseToOpenSeesDataAndSize) {
  ASSERT_EQ(mkdir(a("small").c_str(), 0755), 0);
  std::string v = "chunk_size=65536 stripe_count=3";
  ASSERT_EQ(setxattr(a("small").c_str(), "user.penstock.layout", v.data(), v.size(), 0), 0)
      << errno_name(errno);
  const size_t kSize = (1 << 20) + 123;
  std::string v1 = pattern(kSize, 0, 1);
  ASSERT_TRUE(write_file(a("small/f"), v1));
  struct stat st {};
  ASSERT_EQ(stat(b("small/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(kSize));
  EXPECT_TRUE(same_bytes(v1, contents(b("small/f"))));
  // Same size, new bytes: B must not serve its cached pages from the first open.
  std::string v2 = pattern(kSize, 0, 2);
  ASSERT_TRUE(write_file(a("small/f"), v2));
  EXPECT_TRUE(same_bytes(v2, contents(b("small/f")))) << "stale data on B after close on A";
  // A partial overwrite in the middle of a chunk.
  {
    UniqueFd fd(open(a("small/f").c_str(), O_WRONLY));
    ASSERT_TRUE(fd.ok());
    std::string patch = pattern(1000, 0, 3);
    ASSERT_TRUE(pwrite_all(fd.get(), patch, 70000));
    v2.replace(70000, patch.size(), patch);
    ASSERT_EQ(fd.close(), 0) << errno_name(errno);
  }
  EXPECT_TRUE(same_bytes(v2, contents(b("small/f"))));
  // Growing on A: B sees the new size; shrinking too.
  {
    UniqueFd fd(open(a("small/f").c_str(), O_WRONLY | O_APPEND));
    ASSERT_TRUE(fd.ok());
    std::string more = pattern(5000, kSize, 4);
    ASSERT_TRUE(write_all(fd.get(), more));
    v2 += more;
    ASSERT_EQ(fsync(fd.get()), 0) << errno_name(errno);
    // fsync alone publishes the data too.
    EXPECT_TRUE(same_bytes(v2, contents(b("small/f")))) << "after fsync on A";
  }
  ASSERT_EQ(truncate(a("small/f").c_str(), 4000), 0);
  ASSERT_EQ(stat(b("small/f").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 4000);
  EXPECT_TRUE(same_bytes(v2.substr(0, 4000), contents(b("small/f"))));
  // And the other direction, with the default layout.
  std::string v3 = pattern(3 << 20, 0, 5);
  ASSERT_TRUE(write_file(b("from-b"), v3));
  EXPECT_TRUE(same_bytes(v3, contents(a("from-b"))));
}

// A small file (one cache block) is fetched while its open is on the way to the meta server
// (Client::prefetch_small_file); what B reads is always the current version: after another host
// rewrote the file, while B has it open for writing with bytes the meta server does not know yet,
// and after B truncated it.
TEST_F(TwoMountsTest, SmallFileReadsStayFresh) {
  const size_t kSize = 100 * 1024 + 7;
  std::string v1 = pattern(kSize, 0, 11);
  ASSERT_TRUE(write_file(a("small-fresh"), v1));
  EXPECT_TRUE(same_bytes(v1, contents(b("small-fresh"))));
  // Rewritten on A, same size: B's next open reads the new bytes, not its old pages.
  std::string v2 = pattern(kSize, 0, 12);
  ASSERT_TRUE(write_file(a("small-fresh"), v2));
  EXPECT_TRUE(same_bytes(v2, contents(b("small-fresh")))) << "stale bytes on B after close on A";
  // Rewritten on A again, then written on B through a descriptor that stays open: a read-only open
  // on B meanwhile must see B's write, not the version the meta server has.
  std::string v3 = pattern(kSize, 0, 13);
  ASSERT_TRUE(write_file(a("small-fresh"), v3));
  {
    UniqueFd w(open(b("small-fresh").c_str(), O_RDWR));
    ASSERT_TRUE(w.ok()) << errno_name(errno);
    std::string patch = pattern(3000, 0, 14);
    ASSERT_TRUE(pwrite_all(w.get(), patch, 5000));
    v3.replace(5000, patch.size(), patch);
    EXPECT_TRUE(same_bytes(v3, contents(b("small-fresh")))) << "B's own write was lost";
    ASSERT_EQ(w.close(), 0) << errno_name(errno);
  }
  EXPECT_TRUE(same_bytes(v3, contents(b("small-fresh"))));
  EXPECT_TRUE(same_bytes(v3, contents(a("small-fresh"))));
  // Truncated on B by path: B's next open sees the shorter file.
  ASSERT_EQ(truncate(b("small-fresh").c_str(), 40000), 0) << errno_name(errno);
  EXPECT_TRUE(same_bytes(v3.substr(0, 40000), contents(b("small-fresh"))));
  EXPECT_TRUE(same_bytes(v3.substr(0, 40000), contents(a("small-fresh"))));
}

// Small files B has not read yet: each open starts the file's fetch, and the READ that follows is
// answered by the thread the bytes arrive on (client.h, read_pieces' `later`). Four threads read
// them at once, then A rewrites them all and B reads the new bytes the same way.
TEST_F(TwoMountsTest, SmallFilesReadOnBInParallelGetTheirBytesFromTheFetchesTheirOpensStarted) {
  constexpr int kFiles = 32;
  constexpr int kThreads = 4;
  for (uint32_t version = 1; version <= 2; ++version) {
    SCOPED_TRACE(version);
    std::vector<std::string> want(kFiles);
    for (int i = 0; i < kFiles; ++i) {
      want[i] = pattern(60 * 1024 + 997 * i, 0, 100 * version + i);
      ASSERT_TRUE(write_file(a("parallel-small-" + std::to_string(i)), want[i]));
    }
    std::vector<std::string> got(kFiles * kThreads);
    std::vector<std::thread> readers;
    for (int t = 0; t < kThreads; ++t) {
      readers.emplace_back([&, t] {
        // Each thread its own order, so opens of one file overlap now and then.
        for (int k = 0; k < kFiles; ++k) {
          const int i = (k * (2 * t + 1) + 7 * t) % kFiles;
          std::string out;
          if (read_file(b("parallel-small-" + std::to_string(i)), &out)) got[t * kFiles + i] = std::move(out);
        }
      });
    }
    for (auto& r : readers) r.join();
    for (int t = 0; t < kThreads; ++t) {
      for (int i = 0; i < kFiles; ++i) {
        EXPECT_TRUE(same_bytes(want[i], got[t * kFiles + i])) << "file " << i << ", reader " << t;
      }
    }
  }
}

TEST_F(TwoMountsTest, UnlinkOnAGivesEnoentOnB) {
  ASSERT_TRUE(write_file(a("f"), "soon gone"));
  struct stat st {};
  ASSERT_EQ(stat(b("f").c_str(), &st), 0);
  EXPECT_EQ(contents(b("f")), "soon gone");
  ASSERT_EQ(unlink(a("f").c_str()), 0);
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(b("f").c_str(), &st));
  PENSTOCK_EXPECT_ERRNO(ENOENT, open(b("f").c_str(), O_RDONLY));
  EXPECT_EQ(list_dir(b_).count("f"), 0u);
  ASSERT_EQ(mkdir(a("d").c_str(), 0755), 0);
  ASSERT_EQ(stat(b("d").c_str(), &st), 0);
  ASSERT_EQ(rmdir(a("d").c_str()), 0);
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(b("d").c_str(), &st));
}

TEST_F(TwoMountsTest, RenameOnAIsSeenOnB) {
  ASSERT_TRUE(write_file(a("old"), "renamed content"));
  ASSERT_EQ(mkdir(a("dir").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(a("dir/inner"), "inner"));
  struct stat st {};
  ASSERT_EQ(stat(b("old").c_str(), &st), 0);
  ASSERT_EQ(stat(b("dir/inner").c_str(), &st), 0);
  ASSERT_EQ(rename(a("old").c_str(), a("new").c_str()), 0) << errno_name(errno);
  ASSERT_EQ(rename(a("dir").c_str(), a("moved").c_str()), 0) << errno_name(errno);
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(b("old").c_str(), &st));
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(b("dir/inner").c_str(), &st));
  EXPECT_EQ(contents(b("new")), "renamed content");
  EXPECT_EQ(contents(b("moved/inner")), "inner");
  EXPECT_EQ(list_dir(b_), (std::set<std::string>{"new", "moved"}));
  // A renames a directory only A has used: its kernel moves the dentry it trusts to the new name
  // and keeps trusting it there. B's rename of the new name must still be seen on A at once (A's
  // lease moved with the name, so B's rename waits it out).
  ASSERT_EQ(mkdir(a("m1").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(a("m1/f"), "m"));
  ASSERT_EQ(stat(a("m1/f").c_str(), &st), 0);
  ASSERT_EQ(rename(a("m1").c_str(), a("m2").c_str()), 0) << errno_name(errno);
  ASSERT_EQ(stat(a("m2/f").c_str(), &st), 0);
  ASSERT_EQ(rename(b("m2").c_str(), b("again").c_str()), 0) << errno_name(errno);
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(a("m2/f").c_str(), &st));
  EXPECT_EQ(contents(a("again/f")), "m");
  // Replacing rename: B opens the new file under the old target name.
  ASSERT_TRUE(write_file(a("target"), "old target"));
  EXPECT_EQ(contents(b("target")), "old target");
  ASSERT_EQ(rename(a("new").c_str(), a("target").c_str()), 0);
  EXPECT_EQ(contents(b("target")), "renamed content");
  EXPECT_EQ(list_dir(a_), (std::set<std::string>{"target", "moved", "again"}));
}

TEST_F(TwoMountsTest, AttributesLinksAndXattrsOnAAreSeenOnB) {
  ASSERT_TRUE(write_file(a("f"), "x"));
  ASSERT_EQ(chmod(a("f").c_str(), 0604), 0);
  struct timespec times[2] = {{1111111111, 1}, {1222222222, 2}};
  ASSERT_EQ(utimensat(AT_FDCWD, a("f").c_str(), times, 0), 0);
  struct stat st {};
  ASSERT_EQ(stat(b("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0604u);
  EXPECT_EQ(st.st_mtim.tv_sec, 1222222222);
  EXPECT_EQ(st.st_mtim.tv_nsec, 2);
  ASSERT_EQ(link(a("f").c_str(), a("g").c_str()), 0);
  ASSERT_EQ(stat(b("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_nlink, 2u);
  ASSERT_EQ(symlink("f", a("s").c_str()), 0);
  char buf[64];
  ssize_t n = readlink(b("s").c_str(), buf, sizeof(buf));
  ASSERT_EQ(n, 1);
  EXPECT_EQ(buf[0], 'f');
  ASSERT_EQ(setxattr(a("f").c_str(), "user.tag", "v1", 2, 0), 0);
  n = getxattr(b("f").c_str(), "user.tag", buf, sizeof(buf));
  ASSERT_EQ(n, 2) << errno_name(errno);
  EXPECT_EQ(std::string(buf, 2), "v1");
  ASSERT_EQ(removexattr(a("f").c_str(), "user.tag"), 0);
  PENSTOCK_EXPECT_ERRNO(ENODATA, getxattr(b("f").c_str(), "user.tag", buf, sizeof(buf)));
}

}  // namespace
}  // namespace penstock::testing
