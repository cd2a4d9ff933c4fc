// POSIX behaviour of one Penstock mount, checked system call by system call with exact errnos:
// the namespace (create, lookup errors, rename variants, links, special files, attributes,
// xattrs, large directories, statfs) and data (round trips, holes, truncation across chunk
// boundaries, random writes against a model, O_APPEND, concurrent writers, unlinked-but-open
// files, a 64 MiB stream).
//
// Runs against a real cluster (deploy/local-cluster, one per binary) or, with
// PENSTOCK_TEST_DIR=/some/dir, against a local directory: the same expectations must hold there,
// which is how they were validated.
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <grp.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

constexpr size_t kSmallChunk = 65536;

// One cluster for every test in this binary (or PENSTOCK_TEST_DIR), torn down after the last.
[[maybe_unused]] ::testing::Environment* const g_env =
    ::testing::AddGlobalTestEnvironment(new SharedClusterEnvironment);
constexpr char kLayoutXattr[] = "user.penstock.layout";

class PosixTest : public ::testing::Test {
 protected:
  void SetUp() override {
    umask(022);
    dir_ = make_test_dir(SharedClusterEnvironment::root());
    ASSERT_FALSE(dir_.empty());
  }

  void TearDown() override {
    if (HasFailure() && SharedClusterEnvironment::cluster() != nullptr) {
      std::cerr << SharedClusterEnvironment::cluster()->log_tails(40);
    }
    if (!SharedClusterEnvironment::on_penstock() && !dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
    }
  }

  std::string p(const std::string& name) const { return dir_ + "/" + name; }

  // Makes `name` a directory whose new files get 64 KiB chunks striped over 3 chains, so that
  // tests cross chunk and stripe boundaries with little data. A no-op on a local directory.
  std::string small_chunk_dir(const std::string& name) {
    std::string d = p(name);
    EXPECT_EQ(mkdir(d.c_str(), 0755), 0) << errno_name(errno);
    if (SharedClusterEnvironment::on_penstock()) {
      std::string v = "chunk_size=65536 stripe_count=3";
      EXPECT_EQ(setxattr(d.c_str(), kLayoutXattr, v.data(), v.size(), 0), 0)
          << "setting the layout of " << d << ": " << errno_name(errno);
    }
    return d;
  }

  // On Penstock, checks that `file` got the small-chunk layout of its directory.
  void expect_small_layout(const std::string& file) {
    if (!SharedClusterEnvironment::on_penstock()) {
      return;
    }
    char buf[512];
    ssize_t n = getxattr(file.c_str(), kLayoutXattr, buf, sizeof(buf));
    ASSERT_GT(n, 0) << "getxattr layout of " << file << ": " << errno_name(errno);
    std::string layout(buf, static_cast<size_t>(n));
    EXPECT_EQ(layout.rfind("chunk_size=65536 stripe_count=3 chains=", 0), 0u)
        << "layout of " << file << " is '" << layout << "'";
  }

  std::string dir_;
};

struct stat stat_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << "lstat " << path << ": " << errno_name(errno);
  return st;
}

bool exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

std::string read_whole(const std::string& path) {
  std::string out;
  EXPECT_TRUE(read_file(path, &out));
  return out;
}

// ============================================================================================
// Namespace

using NamespaceTest = PosixTest;

TEST_F(NamespaceTest, CreateExclusive) {
  UniqueFd fd(open(p("f").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0640));
  ASSERT_TRUE(fd.ok()) << errno_name(errno);
  struct stat st = stat_of(p("f"));
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_EQ(st.st_uid, geteuid());
  PENSTOCK_EXPECT_ERRNO(EEXIST, open(p("f").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0640));
  ASSERT_EQ(mkdir(p("d").c_str(), 0755), 0);
  PENSTOCK_EXPECT_ERRNO(EEXIST, open(p("d").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0640));
  PENSTOCK_EXPECT_ERRNO(EEXIST, mkdir(p("d").c_str(), 0755));
  PENSTOCK_EXPECT_ERRNO(EEXIST, mkdir(p("f").c_str(), 0755));
  // O_CREAT without O_EXCL opens the existing file.
  UniqueFd again(open(p("f").c_str(), O_CREAT | O_WRONLY, 0600));
  EXPECT_TRUE(again.ok()) << errno_name(errno);
}

TEST_F(NamespaceTest, MissingPathsGiveEnoent) {
  struct stat st {};
  PENSTOCK_EXPECT_ERRNO(ENOENT, open(p("missing").c_str(), O_RDONLY));
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(p("missing").c_str(), &st));
  PENSTOCK_EXPECT_ERRNO(ENOENT, open(p("missing/f").c_str(), O_CREAT | O_WRONLY, 0644));
  PENSTOCK_EXPECT_ERRNO(ENOENT, mkdir(p("missing/sub").c_str(), 0755));
  PENSTOCK_EXPECT_ERRNO(ENOENT, unlink(p("missing").c_str()));
  PENSTOCK_EXPECT_ERRNO(ENOENT, rmdir(p("missing").c_str()));
  PENSTOCK_EXPECT_ERRNO(ENOENT, rename(p("missing").c_str(), p("other").c_str()));
  PENSTOCK_EXPECT_ERRNO(ENOENT, link(p("missing").c_str(), p("other").c_str()));
  PENSTOCK_EXPECT_ERRNO(ENOENT, truncate(p("missing").c_str(), 0));
  PENSTOCK_EXPECT_ERRNO(ENOENT, chmod(p("missing").c_str(), 0644));
  char buf[16];
  PENSTOCK_EXPECT_ERRNO(ENOENT, readlink(p("missing").c_str(), buf, sizeof(buf)));
  PENSTOCK_EXPECT_ERRNO(ENOENT, getxattr(p("missing").c_str(), "user.x", buf, sizeof(buf)));
  // Repeated lookups of a missing name must not be cached as present, nor the reverse.
  ASSERT_TRUE(write_file(p("missing"), "now here"));
  EXPECT_EQ(read_whole(p("missing")), "now here");
  ASSERT_EQ(unlink(p("missing").c_str()), 0);
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(p("missing").c_str(), &st));
}

TEST_F(NamespaceTest, PathThroughFileGivesEnotdir) {
  ASSERT_TRUE(write_file(p("file"), "x"));
  struct stat st {};
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, open(p("file/x").c_str(), O_RDONLY));
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, open(p("file/x").c_str(), O_CREAT | O_WRONLY, 0644));
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, stat(p("file/x").c_str(), &st));
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, mkdir(p("file/x").c_str(), 0755));
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, rmdir(p("file").c_str()));
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, open(p("file").c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_EQ(mkdir(p("dir").c_str(), 0755), 0);
  // rename(dir, file): the target must be a directory too.
  PENSTOCK_EXPECT_ERRNO(ENOTDIR, rename(p("dir").c_str(), p("file").c_str()));
}

TEST_F(NamespaceTest, DirectoryWhereFileExpectedGivesEisdir) {
  ASSERT_EQ(mkdir(p("dir").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(p("file"), "x"));
  PENSTOCK_EXPECT_ERRNO(EISDIR, open(p("dir").c_str(), O_WRONLY));
  PENSTOCK_EXPECT_ERRNO(EISDIR, open(p("dir").c_str(), O_RDWR));
  PENSTOCK_EXPECT_ERRNO(EISDIR, unlink(p("dir").c_str()));
  PENSTOCK_EXPECT_ERRNO(EISDIR, rename(p("file").c_str(), p("dir").c_str()));
  EXPECT_TRUE(exists(p("file")));
  EXPECT_TRUE(S_ISDIR(stat_of(p("dir")).st_mode));
  UniqueFd dfd(open(p("dir").c_str(), O_RDONLY | O_DIRECTORY));
  EXPECT_TRUE(dfd.ok()) << errno_name(errno);
  char c;
  PENSTOCK_EXPECT_ERRNO(EISDIR, read(dfd.get(), &c, 1));
  // fsync of a directory (fsyncdir: the meta server syncs the creates it answered early) works.
  EXPECT_EQ(fsync(dfd.get()), 0) << errno_name(errno);
}

TEST_F(NamespaceTest, RmdirOfNonEmptyDirGivesEnotempty) {
  ASSERT_EQ(mkdir(p("d").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(p("d/f"), "x"));
  PENSTOCK_EXPECT_ERRNO(ENOTEMPTY, rmdir(p("d").c_str()));
  ASSERT_EQ(mkdir(p("e").c_str(), 0755), 0);
  PENSTOCK_EXPECT_ERRNO(ENOTEMPTY, rename(p("e").c_str(), p("d").c_str()));
  ASSERT_EQ(unlink(p("d/f").c_str()), 0);
  EXPECT_EQ(rmdir(p("d").c_str()), 0) << errno_name(errno);
  EXPECT_FALSE(exists(p("d")));
  ASSERT_EQ(mkdir(p("d").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(p("d/sub").c_str(), 0755), 0);
  PENSTOCK_EXPECT_ERRNO(ENOTEMPTY, rmdir(p("d").c_str()));
}

TEST_F(NamespaceTest, NameLongerThan255BytesGivesEnametoolong) {
  std::string ok_name(255, 'a');
  std::string long_name(256, 'b');
  ASSERT_TRUE(write_file(p(ok_name), "fits"));
  EXPECT_EQ(read_whole(p(ok_name)), "fits");
  struct stat st {};
  PENSTOCK_EXPECT_ERRNO(ENAMETOOLONG, open(p(long_name).c_str(), O_CREAT | O_WRONLY, 0644));
  PENSTOCK_EXPECT_ERRNO(ENAMETOOLONG, mkdir(p(long_name).c_str(), 0755));
  PENSTOCK_EXPECT_ERRNO(ENAMETOOLONG, stat(p(long_name).c_str(), &st));
  PENSTOCK_EXPECT_ERRNO(ENAMETOOLONG, rename(p(ok_name).c_str(), p(long_name).c_str()));
  PENSTOCK_EXPECT_ERRNO(ENAMETOOLONG, symlink("target", p(long_name).c_str()));
  EXPECT_TRUE(exists(p(ok_name)));
}

// A process running as nobody (uid/gid 65534) is refused what the mode bits deny, and allowed
// what they grant: the kernel checks permissions on the mount (default_permissions), and other
// users can use it at all (allow_other).
TEST_F(NamespaceTest, ModeBitsDenyOtherUsersWithEacces) {
  if (geteuid() != 0) {
    GTEST_SKIP() << "needs root to run a child as uid 65534";
  }
  ASSERT_TRUE(write_file(p("secret"), "root only", 0600));
  ASSERT_EQ(chmod(p("secret").c_str(), 0600), 0);
  ASSERT_TRUE(write_file(p("public"), "everyone", 0644));
  ASSERT_EQ(mkdir(p("rootdir").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(p("opendir").c_str(), 0777), 0);
  ASSERT_EQ(chmod(p("opendir").c_str(), 0777), 0);

  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    char report[2048];
    size_t len = 0;
    auto note = [&](const char* what, long r) {
      int e = r == -1 ? errno : 0;
      int n = snprintf(report + len, sizeof(report) - len, "%s=%d\n", what, e);
      if (n > 0 && len + static_cast<size_t>(n) < sizeof(report)) {
        len += static_cast<size_t>(n);
      }
    };
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
      _exit(3);
    }
    std::string secret = p("secret"), pub = p("public"), rootdir = p("rootdir"),
                opendir = p("opendir");
    std::string in_root = rootdir + "/new", in_open = opendir + "/mine";
    struct stat st {};
    long r = open(secret.c_str(), O_RDONLY);
    note("open_secret_rdonly", r);
    r = open(pub.c_str(), O_WRONLY);
    note("open_public_wronly", r);
    r = open(in_root.c_str(), O_CREAT | O_WRONLY, 0644);
    note("create_in_rootdir", r);
    r = mkdir((rootdir + "/sub").c_str(), 0755);
    note("mkdir_in_rootdir", r);
    r = unlink(pub.c_str());
    note("unlink_public", r);
    r = chmod(pub.c_str(), 0666);
    note("chmod_public", r);
    // Granted by the mode bits:
    r = stat(rootdir.c_str(), &st);
    note("stat_rootdir", r);
    int fd = open(pub.c_str(), O_RDONLY);
    note("open_public_rdonly", fd);
    char buf[32] = {};
    r = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
    note("read_public", r >= 0 ? 0 : -1);
    note(buf[0] == 'e' ? "read_content_ok" : "read_content_bad", 0);
    fd = open(in_open.c_str(), O_CREAT | O_WRONLY, 0600);
    note("create_in_opendir", fd);
    r = fd >= 0 ? fstat(fd, &st) : -1;
    note(r == 0 && st.st_uid == 65534 && st.st_gid == 65534 ? "owner_ok" : "owner_bad", 0);
    ssize_t w = write(STDOUT_FILENO, "", 0);
    (void)w;
    w = write(fds[1], report, len);
    (void)w;
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) {
    report.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  std::map<std::string, int> got;
  size_t pos = 0;
  while (pos < report.size()) {
    size_t eol = report.find('\n', pos);
    std::string line = report.substr(pos, eol - pos);
    size_t eq = line.find('=');
    got[line.substr(0, eq)] = std::atoi(line.substr(eq + 1).c_str());
    pos = eol + 1;
  }
  std::map<std::string, int> want = {
      {"open_secret_rdonly", EACCES}, {"open_public_wronly", EACCES},
      {"create_in_rootdir", EACCES},  {"mkdir_in_rootdir", EACCES},
      {"unlink_public", EACCES},      {"chmod_public", EPERM},
      {"stat_rootdir", 0},            {"open_public_rdonly", 0},
      {"read_public", 0},             {"read_content_ok", 0},
      {"create_in_opendir", 0},       {"owner_ok", 0},
  };
  for (const auto& [what, e] : want) {
    auto it = got.find(what);
    ASSERT_NE(it, got.end()) << what << " missing from the child's report:\n" << report;
    EXPECT_EQ(it->second, e) << what << ": got " << (it->second ? errno_name(it->second) : "0")
                             << ", expected " << (e ? errno_name(e) : "success");
  }
  EXPECT_TRUE(exists(p("public")));
  EXPECT_FALSE(exists(p("rootdir/new")));
}

// A directory's attributes follow this mount's own changes at once, through a path and through a
// descriptor held open (the mount answers the kernel's GETATTR of a directory from the attributes
// the meta server sent with the change, client/lib/dir_attr_cache.h).
TEST_F(NamespaceTest, DirectoryAttributesFollowOwnChangesAtOnce) {
  auto ns = [](const struct stat& st) { return st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec; };
  ASSERT_EQ(mkdir(p("attrs").c_str(), 0755), 0);
  UniqueFd dir(open(p("attrs").c_str(), O_RDONLY | O_DIRECTORY));
  ASSERT_TRUE(dir.ok()) << errno_name(errno);
  struct stat before {}, held {};
  ASSERT_EQ(fstat(dir.get(), &before), 0);
  EXPECT_EQ(before.st_nlink, 2u);
  ASSERT_TRUE(write_file(p("attrs/f"), "x"));
  ASSERT_EQ(fstat(dir.get(), &held), 0);
  EXPECT_GT(ns(held), ns(before)) << "fstat of the directory missed the create in it";
  ASSERT_EQ(mkdir(p("attrs/sub").c_str(), 0755), 0);
  ASSERT_EQ(fstat(dir.get(), &held), 0);
  EXPECT_EQ(held.st_nlink, 3u) << "the new subdirectory's \"..\" link";
  EXPECT_EQ(stat_of(p("attrs")).st_nlink, 3u);
  const int64_t after_mkdir = ns(held);
  ASSERT_EQ(rmdir(p("attrs/sub").c_str()), 0);
  ASSERT_EQ(fstat(dir.get(), &held), 0);
  EXPECT_EQ(held.st_nlink, 2u);
  EXPECT_GT(ns(held), after_mkdir);
  const int64_t after_rmdir = ns(held);
  ASSERT_EQ(unlink(p("attrs/f").c_str()), 0);
  EXPECT_GT(ns(stat_of(p("attrs"))), after_rmdir);
  ASSERT_EQ(symlink("f", p("attrs/l").c_str()), 0);
  ASSERT_EQ(chmod(p("attrs").c_str(), 0700), 0);
  ASSERT_EQ(fstat(dir.get(), &held), 0);
  EXPECT_EQ(held.st_mode & 07777, 0700u);
}

TEST_F(NamespaceTest, MkdirRmdirUnlink) {
  ASSERT_EQ(mkdir(p("a").c_str(), 0750), 0);
  struct stat st = stat_of(p("a"));
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  ASSERT_EQ(mkdir(p("a/b").c_str(), 0777), 0);
  EXPECT_EQ(stat_of(p("a/b")).st_mode & 07777, 0755u) << "umask 022 applies";
  ASSERT_TRUE(write_file(p("a/b/f"), "data"));
  EXPECT_EQ(unlink(p("a/b/f").c_str()), 0);
  EXPECT_FALSE(exists(p("a/b/f")));
  PENSTOCK_EXPECT_ERRNO(ENOENT, unlink(p("a/b/f").c_str()));
  EXPECT_EQ(rmdir(p("a/b").c_str()), 0);
  EXPECT_EQ(rmdir(p("a").c_str()), 0);
  EXPECT_FALSE(exists(p("a")));
  // A name can be reused as the other type at once.
  ASSERT_TRUE(write_file(p("a"), "now a file"));
  EXPECT_TRUE(S_ISREG(stat_of(p("a")).st_mode));
  EXPECT_EQ(read_whole(p("a")), "now a file");
}

TEST_F(NamespaceTest, RenameVariants) {
  // Plain rename.
  ASSERT_TRUE(write_file(p("a"), "A"));
  ASSERT_EQ(rename(p("a").c_str(), p("b").c_str()), 0) << errno_name(errno);
  EXPECT_FALSE(exists(p("a")));
  EXPECT_EQ(read_whole(p("b")), "A");
  // Replacing an existing file: the target's old content is gone.
  ASSERT_TRUE(write_file(p("c"), "C-old-content"));
  ino_t b_ino = stat_of(p("b")).st_ino;
  ASSERT_EQ(rename(p("b").c_str(), p("c").c_str()), 0) << errno_name(errno);
  EXPECT_FALSE(exists(p("b")));
  EXPECT_EQ(read_whole(p("c")), "A");
  EXPECT_EQ(stat_of(p("c")).st_ino, b_ino);
  // Replacing an empty directory with a directory.
  ASSERT_EQ(mkdir(p("d1").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(p("d1/inner"), "inner"));
  ASSERT_EQ(mkdir(p("d2").c_str(), 0755), 0);
  ASSERT_EQ(rename(p("d1").c_str(), p("d2").c_str()), 0) << errno_name(errno);
  EXPECT_FALSE(exists(p("d1")));
  EXPECT_EQ(read_whole(p("d2/inner")), "inner");
  // Across directories.
  ASSERT_EQ(mkdir(p("x").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(p("y").c_str(), 0755), 0);
  ASSERT_TRUE(write_file(p("x/f"), "moved"));
  ASSERT_EQ(rename(p("x/f").c_str(), p("y/g").c_str()), 0) << errno_name(errno);
  EXPECT_FALSE(exists(p("x/f")));
  EXPECT_EQ(read_whole(p("y/g")), "moved");
  ASSERT_EQ(rename(p("d2").c_str(), p("y/d2").c_str()), 0) << errno_name(errno);
  EXPECT_EQ(read_whole(p("y/d2/inner")), "inner");
  EXPECT_FALSE(exists(p("d2")));
  // Renaming onto itself (or a hard link of itself) changes nothing.
  ASSERT_EQ(rename(p("y/g").c_str(), p("y/g").c_str()), 0);
  EXPECT_EQ(read_whole(p("y/g")), "moved");
  // RENAME_NOREPLACE refuses an existing target.
  ASSERT_TRUE(write_file(p("n1"), "one"));
  ASSERT_TRUE(write_file(p("n2"), "two"));
  PENSTOCK_EXPECT_ERRNO(EEXIST, renameat2(AT_FDCWD, p("n1").c_str(), AT_FDCWD,
                                          p("n2").c_str(), RENAME_NOREPLACE));
  EXPECT_EQ(read_whole(p("n1")), "one");
  EXPECT_EQ(read_whole(p("n2")), "two");
  EXPECT_EQ(renameat2(AT_FDCWD, p("n1").c_str(), AT_FDCWD, p("n3").c_str(), RENAME_NOREPLACE), 0)
      << errno_name(errno);
  EXPECT_EQ(read_whole(p("n3")), "one");
  // RENAME_EXCHANGE swaps two names, even a file and a directory.
  ASSERT_EQ(renameat2(AT_FDCWD, p("n2").c_str(), AT_FDCWD, p("n3").c_str(), RENAME_EXCHANGE), 0)
      << errno_name(errno);
  EXPECT_EQ(read_whole(p("n2")), "one");
  EXPECT_EQ(read_whole(p("n3")), "two");
  ASSERT_EQ(renameat2(AT_FDCWD, p("n2").c_str(), AT_FDCWD, p("x").c_str(), RENAME_EXCHANGE), 0)
      << errno_name(errno);
  EXPECT_TRUE(S_ISDIR(stat_of(p("n2")).st_mode));
  EXPECT_EQ(read_whole(p("x")), "one");
  PENSTOCK_EXPECT_ERRNO(ENOENT, renameat2(AT_FDCWD, p("n3").c_str(), AT_FDCWD,
                                          p("nothing").c_str(), RENAME_EXCHANGE));
  // A directory cannot move into its own subtree.
  ASSERT_EQ(mkdir(p("top").c_str(), 0755), 0);
  ASSERT_EQ(mkdir(p("top/mid").c_str(), 0755), 0);
  PENSTOCK_EXPECT_ERRNO(EINVAL, rename(p("top").c_str(), p("top/mid/top").c_str()));
  PENSTOCK_EXPECT_ERRNO(EINVAL, rename(p("top").c_str(), p("top/inside").c_str()));
  EXPECT_TRUE(S_ISDIR(stat_of(p("top/mid")).st_mode));
}

TEST_F(NamespaceTest, HardLinks) {
  ASSERT_TRUE(write_file(p("f"), "shared data"));
  ASSERT_EQ(link(p("f").c_str(), p("g").c_str()), 0) << errno_name(errno);
  struct stat sf = stat_of(p("f")), sg = stat_of(p("g"));
  EXPECT_EQ(sf.st_ino, sg.st_ino);
  EXPECT_EQ(sf.st_nlink, 2u);
  EXPECT_EQ(sg.st_nlink, 2u);
  EXPECT_EQ(read_whole(p("g")), "shared data");
  // A write through one name is read through the other.
  {
    UniqueFd fd(open(p("g").c_str(), O_WRONLY));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(pwrite_all(fd.get(), "SHARED", 0));
  }
  EXPECT_EQ(read_whole(p("f")), "SHARED data");
  PENSTOCK_EXPECT_ERRNO(EEXIST, link(p("f").c_str(), p("g").c_str()));
  ASSERT_EQ(mkdir(p("d").c_str(), 0755), 0);
  PENSTOCK_EXPECT_ERRNO(EPERM, link(p("d").c_str(), p("d2").c_str()));
  ASSERT_EQ(link(p("f").c_str(), p("d/h").c_str()), 0);
  EXPECT_EQ(stat_of(p("f")).st_nlink, 3u);
  ASSERT_EQ(unlink(p("f").c_str()), 0);
  EXPECT_EQ(stat_of(p("g")).st_nlink, 2u);
  ASSERT_EQ(unlink(p("d/h").c_str()), 0);
  EXPECT_EQ(stat_of(p("g")).st_nlink, 1u);
  EXPECT_EQ(read_whole(p("g")), "SHARED data");
}

TEST_F(NamespaceTest, Symlinks) {
  ASSERT_TRUE(write_file(p("target"), "pointed at"));
  ASSERT_EQ(symlink("target", p("rel").c_str()), 0) << errno_name(errno);
  ASSERT_EQ(symlink(p("target").c_str(), p("abs").c_str()), 0);
  ASSERT_EQ(symlink("does/not/exist", p("dangling").c_str()), 0);
  char buf[4096];
  ssize_t n = readlink(p("rel").c_str(), buf, sizeof(buf));
  ASSERT_GT(n, 0) << errno_name(errno);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "target");
  n = readlink(p("abs").c_str(), buf, sizeof(buf));
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), p("target"));
  struct stat st = stat_of(p("rel"));
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(st.st_size, 6);
  struct stat via {};
  ASSERT_EQ(stat(p("rel").c_str(), &via), 0);
  EXPECT_TRUE(S_ISREG(via.st_mode));
  EXPECT_EQ(via.st_ino, stat_of(p("target")).st_ino);
  EXPECT_EQ(read_whole(p("rel")), "pointed at");
  EXPECT_EQ(read_whole(p("abs")), "pointed at");
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(p("dangling").c_str(), &via));
  PENSTOCK_EXPECT_ERRNO(EINVAL, readlink(p("target").c_str(), buf, sizeof(buf)));
  PENSTOCK_EXPECT_ERRNO(EEXIST, symlink("x", p("rel").c_str()));
  // A long target (1000 bytes) survives intact.
  std::string long_target(1000, 'z');
  ASSERT_EQ(symlink(long_target.c_str(), p("long").c_str()), 0) << errno_name(errno);
  n = readlink(p("long").c_str(), buf, sizeof(buf));
  ASSERT_EQ(n, 1000);
  EXPECT_EQ(std::string(buf, 1000), long_target);
  // Removing the link leaves the target.
  ASSERT_EQ(unlink(p("rel").c_str()), 0);
  EXPECT_TRUE(exists(p("target")));
}

TEST_F(NamespaceTest, MknodFifo) {
  ASSERT_EQ(mknod(p("fifo").c_str(), S_IFIFO | 0640, 0), 0) << errno_name(errno);
  struct stat st = stat_of(p("fifo"));
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  ASSERT_EQ(mkfifo(p("fifo2").c_str(), 0600), 0) << errno_name(errno);
  EXPECT_TRUE(S_ISFIFO(stat_of(p("fifo2")).st_mode));
  PENSTOCK_EXPECT_ERRNO(EEXIST, mkfifo(p("fifo").c_str(), 0600));
  EXPECT_EQ(unlink(p("fifo").c_str()), 0);
  EXPECT_FALSE(exists(p("fifo")));
}

TEST_F(NamespaceTest, ChmodChownUtimensAreReflectedInStat) {
  ASSERT_TRUE(write_file(p("f"), "attrs"));
  ASSERT_EQ(chmod(p("f").c_str(), 0751), 0) << errno_name(errno);
  EXPECT_EQ(stat_of(p("f")).st_mode & 07777, 0751u);
  ASSERT_EQ(chmod(p("f").c_str(), 04755), 0);
  EXPECT_EQ(stat_of(p("f")).st_mode & 07777, 04755u);
  if (geteuid() == 0) {
    ASSERT_EQ(chown(p("f").c_str(), 1234, 5678), 0) << errno_name(errno);
    struct stat st = stat_of(p("f"));
    EXPECT_EQ(st.st_uid, 1234u);
    EXPECT_EQ(st.st_gid, 5678u);
    EXPECT_EQ(st.st_mode & 07000, 0u) << "chown clears set-user-ID";
    ASSERT_EQ(chown(p("f").c_str(), static_cast<uid_t>(-1), 42), 0);
    st = stat_of(p("f"));
    EXPECT_EQ(st.st_uid, 1234u);
    EXPECT_EQ(st.st_gid, 42u);
  }
  struct timespec times[2];
  times[0].tv_sec = 1000000000;
  times[0].tv_nsec = 123456789;
  times[1].tv_sec = 1500000000;
  times[1].tv_nsec = 987654321;
  ASSERT_EQ(utimensat(AT_FDCWD, p("f").c_str(), times, 0), 0) << errno_name(errno);
  struct stat st = stat_of(p("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1000000000);
  EXPECT_EQ(st.st_atim.tv_nsec, 123456789);
  EXPECT_EQ(st.st_mtim.tv_sec, 1500000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 987654321);
  // UTIME_OMIT leaves one alone.
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = 1600000000;
  times[1].tv_nsec = 5;
  ASSERT_EQ(utimensat(AT_FDCWD, p("f").c_str(), times, 0), 0);
  st = stat_of(p("f"));
  EXPECT_EQ(st.st_atim.tv_sec, 1000000000);
  EXPECT_EQ(st.st_mtim.tv_sec, 1600000000);
  EXPECT_EQ(st.st_mtim.tv_nsec, 5);
  // A write moves mtime forward to about now.
  time_t before = time(nullptr);
  {
    UniqueFd fd(open(p("f").c_str(), O_WRONLY));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(pwrite_all(fd.get(), "new", 0));
  }
  st = stat_of(p("f"));
  EXPECT_GE(st.st_mtim.tv_sec, before - 2);
  // Directories too.
  ASSERT_EQ(mkdir(p("d").c_str(), 0700), 0);
  ASSERT_EQ(chmod(p("d").c_str(), 0711), 0);
  EXPECT_EQ(stat_of(p("d")).st_mode & 07777, 0711u);
}

// `cp -p` writes, sets the source's times on the descriptor, then closes: the close's size report
// must not put the write's time back. Likewise a truncate after writes: its (later) time stays.
TEST_F(NamespaceTest, AnMtimeSetBeforeCloseSurvivesTheClose) {
  for (int64_t sec : {int64_t{1500000000}, int64_t{0}}) {
    SCOPED_TRACE(sec);
    UniqueFd fd(open(p("copy").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    ASSERT_TRUE(fd.ok()) << errno_name(errno);
    ASSERT_TRUE(pwrite_all(fd.get(), "copied bytes", 0));
    struct timespec times[2];
    times[0].tv_sec = 1000000000;
    times[0].tv_nsec = 0;
    times[1].tv_sec = sec;
    times[1].tv_nsec = sec == 0 ? 0 : 42;
    ASSERT_EQ(futimens(fd.get(), times), 0) << errno_name(errno);
    struct stat st{};
    ASSERT_EQ(fstat(fd.get(), &st), 0);
    EXPECT_EQ(st.st_mtim.tv_sec, sec) << "right after futimens";
    fd.reset();
    st = stat_of(p("copy"));
    EXPECT_EQ(st.st_mtim.tv_sec, sec) << "after close";
    EXPECT_EQ(st.st_mtim.tv_nsec, times[1].tv_nsec);
    EXPECT_EQ(st.st_size, 12);
  }
  UniqueFd fd(open(p("cut").c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644));
  ASSERT_TRUE(fd.ok());
  ASSERT_TRUE(pwrite_all(fd.get(), std::string(10000, 'x'), 0));
  ASSERT_EQ(ftruncate(fd.get(), 100), 0) << errno_name(errno);
  struct stat cut{};
  ASSERT_EQ(fstat(fd.get(), &cut), 0);
  fd.reset();
  struct stat st = stat_of(p("cut"));
  EXPECT_EQ(st.st_size, 100);
  EXPECT_GE(st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec, cut.st_mtim.tv_sec * 1000000000LL + cut.st_mtim.tv_nsec)
      << "the close moved mtime back behind the truncate";
}

TEST_F(NamespaceTest, ExtendedAttributes) {
  ASSERT_TRUE(write_file(p("f"), "x"));
  const std::string f = p("f");
  char buf[256];
  PENSTOCK_EXPECT_ERRNO(ENODATA, getxattr(f.c_str(), "user.missing", buf, sizeof(buf)));
  ASSERT_EQ(setxattr(f.c_str(), "user.a", "alpha", 5, 0), 0) << errno_name(errno);
  ASSERT_EQ(setxattr(f.c_str(), "user.b", "", 0, XATTR_CREATE), 0) << errno_name(errno);
  std::string binary("\0\1\2\xff", 4);
  ASSERT_EQ(setxattr(f.c_str(), "user.bin", binary.data(), binary.size(), 0), 0);
  EXPECT_EQ(getxattr(f.c_str(), "user.a", nullptr, 0), 5) << "size query";
  ssize_t n = getxattr(f.c_str(), "user.a", buf, sizeof(buf));
  ASSERT_EQ(n, 5);
  EXPECT_EQ(std::string(buf, 5), "alpha");
  EXPECT_EQ(getxattr(f.c_str(), "user.b", buf, sizeof(buf)), 0);
  n = getxattr(f.c_str(), "user.bin", buf, sizeof(buf));
  ASSERT_EQ(n, 4);
  EXPECT_EQ(std::string(buf, 4), binary);
  PENSTOCK_EXPECT_ERRNO(ERANGE, getxattr(f.c_str(), "user.a", buf, 2));
  PENSTOCK_EXPECT_ERRNO(EEXIST, setxattr(f.c_str(), "user.a", "x", 1, XATTR_CREATE));
  PENSTOCK_EXPECT_ERRNO(ENODATA, setxattr(f.c_str(), "user.none", "x", 1, XATTR_REPLACE));
  ASSERT_EQ(setxattr(f.c_str(), "user.a", "replaced", 8, XATTR_REPLACE), 0) << errno_name(errno);
  n = getxattr(f.c_str(), "user.a", buf, sizeof(buf));
  ASSERT_EQ(n, 8);
  EXPECT_EQ(std::string(buf, 8), "replaced");
  // listxattr: size query, then the names, each NUL-terminated. Penstock may add its own
  // virtual names (user.penstock.*), which are left out of the comparison.
  ssize_t size = listxattr(f.c_str(), nullptr, 0);
  ASSERT_GT(size, 0) << errno_name(errno);
  std::string names(static_cast<size_t>(size), '\0');
  n = listxattr(f.c_str(), names.data(), names.size());
  ASSERT_EQ(n, size);
  std::set<std::string> listed;
  for (size_t pos = 0; pos < names.size();) {
    std::string name(names.c_str() + pos);
    pos += name.size() + 1;
    if (name.rfind("user.penstock.", 0) != 0 && name.rfind("security.", 0) != 0) {
      listed.insert(name);
    }
  }
  EXPECT_EQ(listed, (std::set<std::string>{"user.a", "user.b", "user.bin"}));
  if (size > 1) {
    PENSTOCK_EXPECT_ERRNO(ERANGE, listxattr(f.c_str(), buf, 1));
  }
  ASSERT_EQ(removexattr(f.c_str(), "user.a"), 0) << errno_name(errno);
  PENSTOCK_EXPECT_ERRNO(ENODATA, getxattr(f.c_str(), "user.a", buf, sizeof(buf)));
  PENSTOCK_EXPECT_ERRNO(ENODATA, removexattr(f.c_str(), "user.a"));
  // On directories, and a large value.
  ASSERT_EQ(mkdir(p("d").c_str(), 0755), 0);
  std::string big = pattern(3000, 0, 7);
  ASSERT_EQ(setxattr(p("d").c_str(), "user.big", big.data(), big.size(), 0), 0)
      << errno_name(errno);
  std::string back(4096, '\0');
  n = getxattr(p("d").c_str(), "user.big", back.data(), back.size());
  ASSERT_EQ(n, 3000);
  back.resize(3000);
  EXPECT_TRUE(same_bytes(big, back));
}

TEST_F(NamespaceTest, ReaddirOf3000EntriesListsEachNameOnce) {
  constexpr int kEntries = 3000;
  ASSERT_EQ(mkdir(p("big").c_str(), 0755), 0);
  std::set<std::string> want;
  for (int i = 0; i < kEntries; ++i) {
    char name[32];
    snprintf(name, sizeof(name), "entry-%05d%s", i, i % 10 == 0 ? ".dir" : "");
    std::string path = p("big/") + name;
    if (i % 10 == 0) {
      ASSERT_EQ(mkdir(path.c_str(), 0755), 0) << path << ": " << errno_name(errno);
    } else {
      int fd = open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
      ASSERT_GE(fd, 0) << path << ": " << errno_name(errno);
      close(fd);
    }
    want.insert(name);
  }
  DIR* d = opendir(p("big").c_str());
  ASSERT_NE(d, nullptr) << errno_name(errno);
  std::map<std::string, int> seen;
  int dots = 0;
  errno = 0;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") {
      ++dots;
      continue;
    }
    ++seen[name];
    if (e->d_type != DT_UNKNOWN) {
      bool is_dir = name.size() > 4 && name.compare(name.size() - 4, 4, ".dir") == 0;
      EXPECT_EQ(e->d_type, is_dir ? DT_DIR : DT_REG) << name;
    }
    errno = 0;
  }
  EXPECT_EQ(errno, 0) << "readdir: " << errno_name(errno);
  closedir(d);
  EXPECT_EQ(dots, 2) << "'.' and '..'";
  EXPECT_EQ(seen.size(), want.size());
  int dup = 0, extra = 0;
  for (const auto& [name, count] : seen) {
    if (count != 1) {
      ++dup;
      ADD_FAILURE() << name << " listed " << count << " times";
    }
    if (!want.count(name)) {
      ++extra;
      ADD_FAILURE() << "unexpected entry " << name;
    }
    if (dup + extra > 10) {
      break;
    }
  }
  int missing = 0;
  for (const auto& name : want) {
    if (!seen.count(name) && ++missing <= 10) {
      ADD_FAILURE() << "missing entry " << name;
    }
  }
  EXPECT_EQ(missing, 0);
  EXPECT_EQ(stat_of(p("big")).st_nlink, 2u + kEntries / 10) << "a directory's link count";
}

TEST_F(NamespaceTest, StatfsReportsCapacity) {
  struct statvfs sv {};
  ASSERT_EQ(statvfs(dir_.c_str(), &sv), 0) << errno_name(errno);
  EXPECT_GT(sv.f_bsize, 0u);
  EXPECT_GT(sv.f_frsize, 0u);
  EXPECT_GT(sv.f_blocks, 0u);
  EXPECT_LE(sv.f_bfree, sv.f_blocks);
  EXPECT_LE(sv.f_bavail, sv.f_blocks);
  EXPECT_GE(sv.f_namemax, 255u);
}

// ============================================================================================
// Data

using DataTest = PosixTest;

TEST_F(DataTest, WriteReadRoundTrips) {
  std::string d = small_chunk_dir("small");
  std::vector<size_t> sizes = {0,     1,     4095,  4096,   4097,  65535, 65536,
                               65537, 196608, 196609, (1u << 20) + 3};
  for (size_t size : sizes) {
    std::string path = d + "/f" + std::to_string(size);
    std::string data = pattern(size, 0, static_cast<uint32_t>(size));
    ASSERT_TRUE(write_file(path, data));
    EXPECT_EQ(stat_of(path).st_size, static_cast<off_t>(size));
    std::string back;
    ASSERT_TRUE(read_file(path, &back));
    EXPECT_TRUE(same_bytes(data, back)) << path;
  }
  expect_small_layout(d + "/f1");
  // Overwrite a range straddling two chunks and read pieces back at odd offsets.
  std::string path = d + "/f" + std::to_string((1u << 20) + 3);
  std::string model = pattern((1u << 20) + 3, 0, static_cast<uint32_t>((1u << 20) + 3));
  UniqueFd fd(open(path.c_str(), O_RDWR));
  ASSERT_TRUE(fd.ok());
  std::string patch = pattern(10000, 0, 99);
  ASSERT_TRUE(pwrite_all(fd.get(), patch, kSmallChunk - 5000));
  model.replace(kSmallChunk - 5000, patch.size(), patch);
  for (off_t off : {off_t{0}, off_t{1}, off_t{65530}, off_t{65536}, off_t{131071}, off_t{1000000}}) {
    bool ok = false;
    std::string got = pread_all(fd.get(), 70000, off, &ok);
    ASSERT_TRUE(ok) << errno_name(errno);
    EXPECT_TRUE(same_bytes(model.substr(static_cast<size_t>(off), 70000), got)) << "offset " << off;
  }
  fd.reset();
  EXPECT_TRUE(same_bytes(model, read_whole(path)));
}

TEST_F(DataTest, HolesReadAsZeros) {
  const std::string path = p("sparse");
  constexpr off_t kTen = 10 << 20;
  std::string tail = pattern(4096, kTen, 3);
  {
    UniqueFd fd(open(path.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644));
    ASSERT_TRUE(fd.ok());
    ASSERT_TRUE(pwrite_all(fd.get(), tail, kTen));
    ASSERT_EQ(fd.close(), 0);
  }
  EXPECT_EQ(stat_of(path).st_size, kTen + 4096);
  UniqueFd fd(open(path.c_str(), O_RDONLY));
  ASSERT_TRUE(fd.ok());
  const std::string zeros(1 << 20, '\0');
  for (off_t off = 0; off < kTen; off += 1 << 20) {
    bool ok = false;
    std::string got = pread_all(fd.get(), 1 << 20, off, &ok);
    ASSERT_TRUE(ok) << errno_name(errno);
    ASSERT_TRUE(same_bytes(zeros, got)) << "hole at offset " << off;
  }
  bool ok = false;
  EXPECT_TRUE(same_bytes(tail, pread_all(fd.get(), 8192, kTen, &ok)));
  // Reads past the end return nothing.
  EXPECT_EQ(pread_all(fd.get(), 100, kTen + 4096, &ok), "");
  EXPECT_TRUE(ok);
}

TEST_F(DataTest, TruncateAcrossChunkBoundaries) {
  std::string d = small_chunk_dir("trunc");
  const std::string path = d + "/f";
  std::string model = pattern(200000, 0, 11);
  ASSERT_TRUE(write_file(path, model));
  expect_small_layout(path);
  auto check = [&](const char* step) {
    EXPECT_EQ(stat_of(path).st_size, static_cast<off_t>(model.size())) << step;
    EXPECT_TRUE(same_bytes(model, read_whole(path))) << step;
  };
  check("written");
  auto do_truncate = [&](size_t size, const char* step) {
    ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(size)), 0) << step << ": " << errno_name(errno);
    model.resize(size, '\0');
    check(step);
  };
  do_truncate(100000, "down to the middle of chunk 1");
  do_truncate(kSmallChunk, "down to a chunk boundary");
  do_truncate(300000, "up across three chunks (zeros)");
  {
    UniqueFd fd(open(path.c_str(), O_WRONLY));
    ASSERT_TRUE(fd.ok());
    std::string patch = pattern(20000, 250000, 12);
    ASSERT_TRUE(pwrite_all(fd.get(), patch, 250000));
    model.replace(250000, patch.size(), patch);
  }
  check("written into the extension");
  do_truncate(260000, "down in the middle of the written range");
  do_truncate(70000, "down past the written range");
  do_truncate(kSmallChunk * 5 + 1, "up again: old bytes must not come back");
  do_truncate(0, "to zero");
  {
    UniqueFd fd(open(path.c_str(), O_RDWR));
    ASSERT_TRUE(fd.ok());
    ASSERT_EQ(ftruncate(fd.get(), 1 << 20), 0) << errno_name(errno);
    model.resize(1 << 20, '\0');
    std::string patch = pattern(100, 5, 13);
    ASSERT_TRUE(pwrite_all(fd.get(), patch, 5));
    model.replace(5, 100, patch);
  }
  check("ftruncate up then write");
  // O_TRUNC on open.
  {
    UniqueFd fd(open(path.c_str(), O_WRONLY | O_TRUNC));
    ASSERT_TRUE(fd.ok());
    model.clear();
  }
  check("O_TRUNC");
  do_truncate(kSmallChunk * 3, "up from empty");
}

TEST_F(DataTest, RandomWritesMatchModel) {
  std::string d = small_chunk_dir("random");
  const std::string path = d + "/f";
  uint32_t seed = static_cast<uint32_t>(std::random_device{}());
  if (const char* s = std::getenv("PENSTOCK_TEST_SEED")) {
    seed = static_cast<uint32_t>(std::strtoul(s, nullptr, 10));
  }
  std::cout << "[seed] RandomWritesMatchModel PENSTOCK_TEST_SEED=" << seed << std::endl;
  RecordProperty("seed", std::to_string(seed));
  std::mt19937 rng(seed);
  const size_t kSpan = 3 * kSmallChunk * 10;  // larger than stripe_count x chunk_size
  std::string model;
  UniqueFd fd(open(path.c_str(), O_CREAT | O_RDWR, 0644));
  ASSERT_TRUE(fd.ok());
  expect_small_layout(path);
  for (int i = 0; i < 300; ++i) {
    size_t size = 1 + rng() % (i % 10 == 0 ? 200000 : 9000);
    size_t off = rng() % kSpan;
    std::string data = pattern(size, off, seed + i);
    ASSERT_TRUE(pwrite_all(fd.get(), data, static_cast<off_t>(off)))
        << "write " << i << " of " << size << " at " << off << ": " << errno_name(errno)
        << " (seed " << seed << ")";
    if (model.size() < off + size) {
      model.resize(off + size, '\0');
    }
    model.replace(off, size, data);
    if (i % 25 == 0) {
      size_t roff = rng() % model.size();
      size_t rsize = 1 + rng() % 150000;
      bool ok = false;
      std::string got = pread_all(fd.get(), rsize, static_cast<off_t>(roff), &ok);
      ASSERT_TRUE(ok) << errno_name(errno);
      std::string want = model.substr(roff, rsize);
      ASSERT_TRUE(same_bytes(want, got))
          << "read " << rsize << " at " << roff << " after write " << i << " (seed " << seed << ")";
    }
  }
  struct stat st {};
  ASSERT_EQ(fstat(fd.get(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(model.size())) << "seed " << seed;
  ASSERT_EQ(fsync(fd.get()), 0) << errno_name(errno);
  ASSERT_EQ(fd.close(), 0) << errno_name(errno);
  EXPECT_TRUE(same_bytes(model, read_whole(path))) << "after reopen (seed " << seed << ")";
}

TEST_F(DataTest, AppendFromTwoDescriptors) {
  const std::string path = p("log");
  ASSERT_TRUE(write_file(path, "head\n"));
  UniqueFd a(open(path.c_str(), O_WRONLY | O_APPEND));
  UniqueFd b(open(path.c_str(), O_WRONLY | O_APPEND));
  ASSERT_TRUE(a.ok() && b.ok()) << errno_name(errno);
  std::string model = "head\n";
  for (int i = 0; i < 60; ++i) {
    std::string rec = (i % 2 ? "B" : "A") + std::to_string(i) + std::string(i * 37 % 500, '.') + "\n";
    ASSERT_TRUE(write_all((i % 2 ? b : a).get(), rec)) << errno_name(errno);
    model += rec;
  }
  struct stat st {};
  ASSERT_EQ(fstat(a.get(), &st), 0);
  EXPECT_EQ(st.st_size, static_cast<off_t>(model.size()));
  ASSERT_EQ(a.close(), 0);
  ASSERT_EQ(b.close(), 0);
  EXPECT_TRUE(same_bytes(model, read_whole(path)));
}

TEST_F(DataTest, TwoProcessesWriteDisjointRanges) {
  std::string d = small_chunk_dir("procs");
  const std::string path = d + "/f";
  constexpr size_t kBlock = 10000;  // not chunk-aligned: both writers share most chunks
  constexpr size_t kBlocks = 200;
  {
    UniqueFd fd(open(path.c_str(), O_CREAT | O_WRONLY, 0644));
    ASSERT_TRUE(fd.ok());
  }
  auto write_blocks = [&](int parity) -> bool {
    int fd = open(path.c_str(), O_WRONLY);
    if (fd < 0) {
      return false;
    }
    bool ok = true;
    for (size_t k = static_cast<size_t>(parity); k < kBlocks && ok; k += 2) {
      ok = pwrite_all(fd, pattern(kBlock, k * kBlock, 21), static_cast<off_t>(k * kBlock));
    }
    return close(fd) == 0 && ok;
  };
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    _exit(write_blocks(1) ? 0 : 1);
  }
  bool parent_ok = write_blocks(0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(parent_ok) << errno_name(errno);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child writer failed: " << status;
  EXPECT_TRUE(same_bytes(pattern(kBlock * kBlocks, 0, 21), read_whole(path)));
}

// A descriptor that caches (opened and read before) and a shared mapping see what a write-only
// descriptor of the same file writes, at once, and bytes dirtied through the mapping before that
// write do not land over it later (mount_test checks the same under -o direct_writes).
TEST_F(DataTest, ReaderAndMappingSeeWritesOfAWriteOnlyDescriptorAtOnce) {
  const std::string path = p("shared-shard");
  std::string model = pattern(3u << 20, 0, 41);
  ASSERT_TRUE(write_file(path, model));
  UniqueFd reader(open(path.c_str(), O_RDONLY));
  ASSERT_TRUE(reader.ok()) << errno_name(errno);
  bool ok = false;
  ASSERT_TRUE(same_bytes(model, pread_all(reader.get(), model.size(), 0, &ok)));  // now cached
  UniqueFd rw(open(path.c_str(), O_RDWR));
  ASSERT_TRUE(rw.ok()) << errno_name(errno);
  void* map = mmap(nullptr, model.size(), PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0);
  ASSERT_NE(map, MAP_FAILED) << errno_name(errno);
  char* bytes = static_cast<char*>(map);
  // Dirty pages through the mapping, partly under the write below and partly not.
  const std::string dirty = pattern(20000, 90000, 44);
  std::memcpy(bytes + 90000, dirty.data(), dirty.size());
  model.replace(90000, dirty.size(), dirty);
  UniqueFd writer(open(path.c_str(), O_WRONLY));
  ASSERT_TRUE(writer.ok()) << errno_name(errno);
  // Unaligned, across pages and a MiB boundary; then past the end.
  const std::string patch = pattern(1300000, 100001, 42);
  ASSERT_TRUE(pwrite_all(writer.get(), patch, 100001)) << errno_name(errno);
  model.replace(100001, patch.size(), patch);
  EXPECT_TRUE(same_bytes(model, pread_all(reader.get(), model.size(), 0, &ok)));
  EXPECT_TRUE(same_bytes(model, std::string_view(bytes, model.size()))) << "the mapping shows old bytes";
  const std::string tail = pattern(70000, model.size(), 43);
  ASSERT_TRUE(pwrite_all(writer.get(), tail, static_cast<off_t>(model.size()))) << errno_name(errno);
  const size_t mapped = model.size();
  model += tail;
  EXPECT_TRUE(same_bytes(model, pread_all(reader.get(), model.size() + 10, 0, &ok)));
  // Whatever the mapping still holds reaches the file now: it must be the new bytes.
  EXPECT_EQ(msync(map, mapped, MS_SYNC), 0) << errno_name(errno);
  EXPECT_EQ(munmap(map, mapped), 0);
  EXPECT_EQ(rw.close(), 0) << errno_name(errno);
  EXPECT_EQ(writer.close(), 0) << errno_name(errno);
  EXPECT_TRUE(same_bytes(model, pread_all(reader.get(), model.size(), 0, &ok)));
  EXPECT_TRUE(same_bytes(model, read_whole(path)));
}

TEST_F(DataTest, UnlinkedFileStaysReadableThroughOpenDescriptor) {
  const std::string path = p("doomed");
  std::string data = pattern(300000, 0, 31);
  ASSERT_TRUE(write_file(path, data));
  UniqueFd fd(open(path.c_str(), O_RDWR));
  ASSERT_TRUE(fd.ok());
  ASSERT_EQ(unlink(path.c_str()), 0) << errno_name(errno);
  struct stat st {};
  PENSTOCK_EXPECT_ERRNO(ENOENT, stat(path.c_str(), &st));
  ASSERT_EQ(fstat(fd.get(), &st), 0) << errno_name(errno);
  EXPECT_EQ(st.st_nlink, 0u);
  EXPECT_EQ(st.st_size, 300000);
  bool ok = false;
  EXPECT_TRUE(same_bytes(data, pread_all(fd.get(), data.size(), 0, &ok)));
  std::string more = pattern(5000, 300000, 32);
  ASSERT_TRUE(pwrite_all(fd.get(), more, 300000)) << errno_name(errno);
  EXPECT_TRUE(same_bytes(more, pread_all(fd.get(), 5000, 300000, &ok)));
  // A new file under the same name is a different file.
  ASSERT_TRUE(write_file(path, "new"));
  EXPECT_EQ(read_whole(path), "new");
  EXPECT_TRUE(same_bytes(data, pread_all(fd.get(), data.size(), 0, &ok)));
  EXPECT_EQ(fd.close(), 0) << errno_name(errno);
}

TEST_F(DataTest, SixtyFourMiBSequential) {
  const std::string path = p("big");
  constexpr size_t kMiB = 1 << 20;
  constexpr size_t kTotal = 64 * kMiB;
  {
    UniqueFd fd(open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644));
    ASSERT_TRUE(fd.ok());
    for (size_t off = 0; off < kTotal; off += kMiB) {
      ASSERT_TRUE(write_all(fd.get(), pattern(kMiB, off, 41))) << "at " << off << ": "
                                                               << errno_name(errno);
    }
    ASSERT_EQ(fsync(fd.get()), 0) << errno_name(errno);
    ASSERT_EQ(fd.close(), 0) << errno_name(errno);
  }
  EXPECT_EQ(stat_of(path).st_size, static_cast<off_t>(kTotal));
  UniqueFd fd(open(path.c_str(), O_RDONLY));
  ASSERT_TRUE(fd.ok());
  std::string buf(kMiB, '\0');
  for (size_t off = 0; off < kTotal; off += kMiB) {
    size_t got = 0;
    while (got < kMiB) {
      ssize_t n = read(fd.get(), buf.data() + got, kMiB - got);
      ASSERT_GT(n, 0) << "read at " << off + got << ": " << (n < 0 ? errno_name(errno) : "EOF");
      got += static_cast<size_t>(n);
    }
    ASSERT_TRUE(same_bytes(pattern(kMiB, off, 41), buf)) << "MiB at " << off;
  }
  char extra;
  EXPECT_EQ(read(fd.get(), &extra, 1), 0) << "EOF after 64 MiB";
}

}  // namespace
}  // namespace penstock::testing

