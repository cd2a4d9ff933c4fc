// How penstock-mount starts and fails: against a metadata server that is not there it exits
// non-zero within seconds and leaves nothing mounted; through the mount(8) helper
// (deploy/mount.fuse.penstock SOURCE MOUNTPOINT -o OPTIONS) it mounts a running cluster, every
// thread of the mount at SCHED_BATCH unless sched=normal is given; with fuse_uring=on (Linux 6.14+)
// it answers FUSE requests over io_uring from threads pinned to each CPU.
#include <arpa/inet.h>
#include <sched.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

namespace fs = std::filesystem;

std::string mount_binary() { return build_dir() + "/client/fuse/penstock-mount"; }

// A loopback port nothing listens on: bound to learn a free number, then closed.
int closed_port() {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) {
    return 0;
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(s);
  return port;
}

// PIDs of live penstock-mount processes whose command line names `mount_point` (a path unique
// to this test, so these can only be the processes this test started).
std::vector<pid_t> mount_daemons_for(const std::string& mount_point) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) {
      continue;
    }
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmdline.empty()) {
      continue;  // exited, or a zombie
    }
    std::vector<std::string> args;
    size_t pos = 0;
    while (pos < cmdline.size()) {
      size_t end = cmdline.find('\0', pos);
      if (end == std::string::npos) {
        end = cmdline.size();
      }
      args.push_back(cmdline.substr(pos, end - pos));
      pos = end + 1;
    }
    bool is_mount = !args.empty() && fs::path(args[0]).filename() == "penstock-mount";
    bool names_it = false;
    for (const auto& a : args) {
      names_it |= (a == mount_point || a == mount_point + "/");
    }
    if (is_mount && names_it) {
      out.push_back(static_cast<pid_t>(std::stol(name)));
    }
  }
  return out;
}

// The scheduling policy of each thread of process `pid` (-1 for a thread that exited meanwhile).
std::vector<int> thread_policies(pid_t pid) {
  std::vector<int> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    out.push_back(sched_getscheduler(static_cast<pid_t>(std::stol(e.path().filename().string()))));
  }
  return out;
}

// Every thread of the one daemon serving `mount_point` runs under `policy` (its FUSE thread,
// the client's I/O and heartbeat threads: more than two).
void expect_mount_threads_policy(const std::string& mount_point, int policy) {
  std::vector<pid_t> pids = mount_daemons_for(mount_point);
  ASSERT_EQ(pids.size(), 1u) << "penstock-mount processes for " << mount_point;
  std::vector<int> policies = thread_policies(pids[0]);
  EXPECT_GT(policies.size(), 2u);
  for (int p : policies) {
    if (p != -1) {
      EXPECT_EQ(p, policy) << "a thread of penstock-mount pid " << pids[0];
    }
  }
}

// Unmounts `mount_point` if mounted and makes sure the daemon serving it has exited.
void unmount_and_reap(const std::string& mount_point) {
  for (int i = 0; i < 10 && is_mount_point(mount_point); ++i) {
    run_command({"/usr/bin/fusermount3", "-u", mount_point}, 20);
    if (is_mount_point(mount_point)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
    }
  }
  if (is_mount_point(mount_point)) {
    run_command({"/usr/bin/fusermount3", "-u", "-z", mount_point}, 20);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!mount_daemons_for(mount_point).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (pid_t pid : mount_daemons_for(mount_point)) {
    ADD_FAILURE() << "penstock-mount pid " << pid << " for " << mount_point
                  << " still runs 10 s after the unmount; sending SIGKILL";
    kill(pid, SIGKILL);
  }
}

class MountTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (local_only()) {
      GTEST_SKIP() << "mount tests need the Penstock binaries (PENSTOCK_TEST_DIR is set)";
    }
    std::string tmp = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                      "/penstock-mount-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmp.data()), nullptr) << errno_name(errno);
    dir_ = tmp;
    chmod(dir_.c_str(), 0755);
  }

  void TearDown() override {
    for (const auto& m : made_) {
      unmount_and_reap(m);
    }
    if (!dir_.empty() && !is_mount_point(dir_ + "/mnt")) {
      std::error_code ec;
      fs::remove_all(dir_, ec);
    }
  }

  // A second mount of `cluster` at its temp_dir()/NAME with `-o OPTIONS`; *mnt is its path, and
  // *said (when given) what penstock-mount printed before it detached.
  ::testing::AssertionResult mount_with_options(Cluster& cluster, const std::string& name, const std::string& options,
                                                std::string* mnt, std::string* said = nullptr) {
    *mnt = cluster.temp_dir() + "/" + name;
    if (mkdir(mnt->c_str(), 0755) != 0) return ::testing::AssertionFailure() << "mkdir " << *mnt << ": " << errno_name(errno);
    made_.push_back(*mnt);
    if (!cluster.adopt_mount(*mnt)) return ::testing::AssertionFailure() << "cannot adopt " << *mnt;
    CommandResult r = run_command({mount_binary(), cluster.meta_addr(), *mnt, "-o", options}, 60);
    if (said != nullptr) *said = r.output;
    if (r.exit_code != 0 || !is_mount_point(*mnt)) {
      return ::testing::AssertionFailure() << "penstock-mount -o " << options << " exited " << r.exit_code << ":\n"
                                           << r.output;
    }
    return ::testing::AssertionSuccess();
  }

  std::string dir_;
  std::vector<std::string> made_;  // mount points this test may have mounted
};

// The checks one process runs through a mount from one CPU: "" when all pass, else what failed.
// Run in a child pinned to that CPU, so that over FUSE io_uring its requests reach that CPU's queue.
std::string exercise_from_this_cpu(const std::string& dir) {
  auto fail = [](const std::string& what) { return what + ": " + errno_name(errno); };
  if (mkdir(dir.c_str(), 0755) != 0) return fail("mkdir " + dir);
  constexpr int kFiles = 300;
  for (int i = 0; i < kFiles; ++i) {
    const std::string path = dir + "/f-" + std::to_string(i);
    if (!write_file(path, "file " + std::to_string(i))) return "write " + path;
  }
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return fail("opendir " + dir);
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  if (entries != kFiles) return "readdir of " + dir + " listed " + std::to_string(entries) + " names";
  for (int i = 0; i < kFiles; i += 7) {
    std::string back;
    const std::string path = dir + "/f-" + std::to_string(i);
    if (!read_file(path, &back) || back != "file " + std::to_string(i)) return "read back " + path;
  }
  if (rename((dir + "/f-0").c_str(), (dir + "/g-0").c_str()) != 0) return fail("rename");
  if (unlink((dir + "/f-1").c_str()) != 0) return fail("unlink");
  if (symlink("g-0", (dir + "/link").c_str()) != 0) return fail("symlink");
  char target[64] = {};
  if (readlink((dir + "/link").c_str(), target, sizeof(target) - 1) != 3 || std::string(target) != "g-0") {
    return fail("readlink");
  }
  // A file larger than one FUSE request (1 MiB), written in 1 MiB pieces, read whole, then at
  // unaligned offsets (reads the cache serves and reads it does not), then cut short.
  const std::string big = dir + "/big";
  const size_t len = (3u << 20) + 12345;
  const std::string data = pattern(len, 0, 41);
  {
    UniqueFd fd(open(big.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
    if (fd.get() < 0) return fail("create " + big);
    for (size_t off = 0; off < len; off += 1u << 20) {
      if (!pwrite_all(fd.get(), std::string_view(data).substr(off, 1u << 20), static_cast<off_t>(off))) {
        return fail("write " + big);
      }
    }
    if (fsync(fd.get()) != 0) return fail("fsync " + big);
    if (fd.close() != 0) return fail("close " + big);
  }
  std::string back;
  if (!read_file(big, &back) || back != data) return "reading " + big + " back whole gave other bytes";
  UniqueFd fd(open(big.c_str(), O_RDONLY));
  if (fd.get() < 0) return fail("open " + big);
  for (size_t off : {size_t{1}, size_t{777777}, size_t{2u << 20}, len - 5000}) {
    std::string part(70000, '\0');
    const ssize_t n = pread(fd.get(), part.data(), part.size(), static_cast<off_t>(off));
    const size_t want = std::min(part.size(), len - off);
    if (n != static_cast<ssize_t>(want) || part.substr(0, want) != data.substr(off, want)) {
      return "pread of " + big + " at " + std::to_string(off) + " gave other bytes";
    }
  }
  if (truncate(big.c_str(), 1000) != 0) return fail("truncate " + big);
  struct stat st {};
  if (stat(big.c_str(), &st) != 0 || st.st_size != 1000) return fail("stat after truncate");
  return "";
}

// FUSE over io_uring (-o fuse_uring=on, Linux 6.14+): the mount switches the kernel's enable_uring
// on, says so before it detaches, pins its ring threads to every CPU, and answers each CPU's
// queue: a process pinned to each CPU creates, lists, reads, renames, links, writes and reads a
// 3 MiB file back. Unmounting ends the daemon; so does SIGTERM on a second ring mount. The
// parameter is set back to what it was.
TEST_F(MountTest, FuseRingAnswersTheQueueOfEveryCpu) {
  const std::string param = "/sys/module/fuse/parameters/enable_uring";
  std::string before;
  if (!read_file(param, &before)) GTEST_SKIP() << "this kernel has no FUSE over io_uring (" << param << ")";
  struct Restore {
    std::string path, value;
    ~Restore() { std::ofstream(path) << value; }
  } restore{param, before};
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  std::string mnt, said;
  ASSERT_TRUE(mount_with_options(cluster, "ring-mnt", "fuse_uring=on", &mnt, &said));
  if (said.find("FUSE requests come over io_uring") == std::string::npos) {
    if (said.find("io_uring is not available") != std::string::npos) GTEST_SKIP() << said;
    FAIL() << "the mount did not take the ring:\n" << said;
  }
  std::vector<pid_t> pids = mount_daemons_for(mnt);
  ASSERT_EQ(pids.size(), 1u);
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 4; ++c) {
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  }
  // Ring threads pinned to each CPU this test may use.
  std::map<std::string, int> pinned;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pids[0]) + "/task")) {
    std::ifstream in(e.path() / "status");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("Cpus_allowed_list:", 0) == 0) ++pinned[line.substr(line.find_first_not_of(" \t", 18))];
    }
  }
  for (int c : cpus) EXPECT_GE(pinned[std::to_string(c)], 2) << "ring threads pinned to CPU " << c;

  std::vector<pid_t> children;
  std::vector<int> pipes;
  for (int c : cpus) {
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(p[0]);
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(c, &one);
      std::string err = sched_setaffinity(0, sizeof(one), &one) == 0
                            ? exercise_from_this_cpu(mnt + "/cpu" + std::to_string(c))
                            : "sched_setaffinity: " + errno_name(errno);
      if (!err.empty()) (void)!write(p[1], err.data(), err.size());
      _exit(err.empty() ? 0 : 1);
    }
    close(p[1]);
    children.push_back(child);
    pipes.push_back(p[0]);
  }
  for (size_t i = 0; i < children.size(); ++i) {
    std::string err;
    char buf[512];
    for (ssize_t n; (n = read(pipes[i], buf, sizeof(buf))) > 0;) err.append(buf, static_cast<size_t>(n));
    close(pipes[i]);
    int status = 0;
    ASSERT_EQ(waitpid(children[i], &status, 0), children[i]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "from CPU " << cpus[i] << ": " << err;
  }
  // What one mount wrote, another (the cluster's own /dev/fuse or ring mount) reads.
  std::string back;
  ASSERT_TRUE(read_file(cluster.mount_path() + "/cpu" + std::to_string(cpus[0]) + "/f-5", &back));
  EXPECT_EQ(back, "file 5");

  unmount_and_reap(mnt);
  EXPECT_FALSE(is_mount_point(mnt));
  EXPECT_TRUE(mount_daemons_for(mnt).empty());

  std::string mnt2;
  ASSERT_TRUE(mount_with_options(cluster, "ring-mnt2", "fuse_uring=on", &mnt2, &said));
  EXPECT_NE(said.find("FUSE requests come over io_uring"), std::string::npos) << said;
  ASSERT_TRUE(read_file(mnt2 + "/cpu" + std::to_string(cpus[0]) + "/g-0", &back));
  EXPECT_EQ(back, "file 0");
  pids = mount_daemons_for(mnt2);
  ASSERT_EQ(pids.size(), 1u);
  ASSERT_EQ(kill(pids[0], SIGTERM), 0);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((!mount_daemons_for(mnt2).empty() || is_mount_point(mnt2)) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(mount_daemons_for(mnt2).empty()) << "a ring mount did not end within 10 s of SIGTERM";
  EXPECT_FALSE(is_mount_point(mnt2));
}

TEST_F(MountTest, UnreachableMetaExitsNonZeroWithinTenSeconds) {
  int port = closed_port();
  ASSERT_GT(port, 0);
  std::string mnt = dir_ + "/mnt";
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  made_.push_back(mnt);
  std::string meta = "127.0.0.1:" + std::to_string(port);
  // Daemonizing form (the default): the parent must not report success before the mount works.
  CommandResult r = run_command({mount_binary(), "--meta", meta, mnt}, 30);
  EXPECT_NE(r.exit_code, 0) << "penstock-mount against a closed port succeeded:\n" << r.output;
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_LT(r.seconds, 10.0) << "took " << r.seconds << " s:\n" << r.output;
  EXPECT_FALSE(is_mount_point(mnt)) << "left a mount behind";
  EXPECT_FALSE(r.output.empty()) << "exited without saying why";
  std::cout << "penstock-mount said (exit " << r.exit_code << ", " << r.seconds << " s):\n"
            << r.output << std::endl;
  // Foreground form.
  r = run_command({mount_binary(), "--meta", meta, "-f", mnt}, 30);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 10.0) << "took " << r.seconds << " s:\n" << r.output;
  EXPECT_FALSE(is_mount_point(mnt));
  EXPECT_TRUE(mount_daemons_for(mnt).empty()) << "a penstock-mount process stayed behind";
}

TEST_F(MountTest, MountHelperMountsARunningCluster) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  std::string mnt = cluster.temp_dir() + "/helper-mnt";
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  made_.push_back(mnt);
  // Whatever happens below, the cluster's down (and its emergency cleanup) unmounts it too.
  ASSERT_TRUE(cluster.adopt_mount(mnt));
  std::string path_env = "PATH=" + build_dir() + "/client/fuse:" +
                         (std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin");
  CommandResult r = run_command(
      {source_dir() + "/deploy/mount.fuse.penstock", cluster.meta_addr(), mnt, "-o", "allow_other"},
      60, {path_env, "PENSTOCK_BUILD=" + build_dir()});
  ASSERT_EQ(r.exit_code, 0) << "mount.fuse.penstock failed:\n" << r.output;
  EXPECT_LT(r.seconds, 30.0);
  ASSERT_TRUE(is_mount_point(mnt)) << "helper exited 0 but nothing is mounted at " << mnt << ":\n"
                                   << r.output;
  expect_mount_threads_policy(mnt, SCHED_BATCH);  // the default
  struct stat st {};
  ASSERT_EQ(stat(mnt.c_str(), &st), 0) << errno_name(errno);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  // It is the same file system as the cluster's own mount.
  std::string a = cluster.mount_path() + "/via-local-cluster";
  ASSERT_TRUE(write_file(a, "hello through two mounts"));
  std::string back;
  ASSERT_TRUE(read_file(mnt + "/via-local-cluster", &back));
  EXPECT_EQ(back, "hello through two mounts");
  ASSERT_TRUE(write_file(mnt + "/via-helper", "and back"));
  ASSERT_TRUE(read_file(cluster.mount_path() + "/via-helper", &back));
  EXPECT_EQ(back, "and back");
  unmount_and_reap(mnt);
  EXPECT_FALSE(is_mount_point(mnt));
  EXPECT_TRUE(cluster.down());
}


// -o direct_io,sched=normal,noexec: every thread of the mount runs SCHED_OTHER, file data bypasses
// the kernel page cache (FOPEN_DIRECT_IO), and the kernel enforces noexec. Bytes written through
// it are read back exactly through it and through a page-cached mount; a private mapping works; a
// shared mapping is refused with ENODEV, which shows the open really is direct I/O.
TEST_F(MountTest, DirectIoMountKeepsDataExactAndRefusesSharedMmap) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  std::string mnt;
  ASSERT_TRUE(mount_with_options(cluster, "direct-mnt", "direct_io,sched=normal,noexec", &mnt));
  expect_mount_threads_policy(mnt, SCHED_OTHER);
  struct statvfs vfs {};
  ASSERT_EQ(statvfs(mnt.c_str(), &vfs), 0) << errno_name(errno);
  EXPECT_NE(vfs.f_flag & ST_NOEXEC, 0u) << "noexec was not applied";
  EXPECT_NE(vfs.f_flag & ST_NOSUID, 0u) << "libfuse's default nosuid is gone";

  const std::string data = pattern((5u << 20) + 4097, 0, 77);
  const std::string path = mnt + "/shard";
  int fd = open(path.c_str(), O_CREAT | O_RDWR | O_TRUNC, 0644);
  ASSERT_GE(fd, 0) << errno_name(errno);
  // Unaligned pieces, out of order: direct I/O hands each write to Penstock as it is.
  ASSERT_TRUE(pwrite_all(fd, std::string_view(data).substr(1u << 20), 1u << 20));
  ASSERT_TRUE(pwrite_all(fd, std::string_view(data).substr(0, 1u << 20), 0));
  bool ok = false;
  EXPECT_TRUE(same_bytes(data, pread_all(fd, data.size(), 0, &ok)));
  EXPECT_TRUE(ok);
  EXPECT_TRUE(same_bytes(data.substr(12345, 333333), pread_all(fd, 333333, 12345, &ok)));
  void* shared = mmap(nullptr, data.size(), PROT_READ, MAP_SHARED, fd, 0);
  EXPECT_EQ(shared, MAP_FAILED) << "a shared mapping of a direct-io file was allowed";
  if (shared == MAP_FAILED) {
    EXPECT_EQ(errno, ENODEV) << errno_name(errno);
  } else {
    munmap(shared, data.size());
  }
  void* priv = mmap(nullptr, data.size(), PROT_READ, MAP_PRIVATE, fd, 0);
  ASSERT_NE(priv, MAP_FAILED) << errno_name(errno);
  EXPECT_EQ(std::memcmp(priv, data.data(), data.size()), 0);
  munmap(priv, data.size());
  ASSERT_EQ(close(fd), 0);

  std::string back;
  ASSERT_TRUE(read_file(cluster.mount_path() + "/shard", &back));
  EXPECT_TRUE(same_bytes(data, back));

  // A descriptor opened before a truncate through a path or another descriptor reads up to the
  // new end, not zeros up to the size it saw at its open (the kernel does not cut direct reads).
  UniqueFd held(open(path.c_str(), O_RDONLY));
  ASSERT_TRUE(held.ok()) << errno_name(errno);
  EXPECT_EQ(pread_all(held.get(), 4096, 0, &ok).size(), 4096u);
  ASSERT_EQ(truncate(path.c_str(), 100), 0) << errno_name(errno);
  std::string cut = pread_all(held.get(), 4096, 0, &ok);
  EXPECT_TRUE(ok) << errno_name(errno);
  EXPECT_TRUE(same_bytes(data.substr(0, 100), cut)) << "read " << cut.size() << " bytes of a 100-byte file";
  {
    UniqueFd other(open(path.c_str(), O_WRONLY));
    ASSERT_TRUE(other.ok());
    ASSERT_EQ(ftruncate(other.get(), 10), 0) << errno_name(errno);
  }
  EXPECT_EQ(pread_all(held.get(), 4096, 0, &ok).size(), 10u);
  held.reset();
  unmount_and_reap(mnt);
  EXPECT_FALSE(is_mount_point(mnt));
}

// With -o direct_writes, write-only opens bypass the page cache (on Linux 6.6+; the mount's log
// says which); by default they use it. A file is read through a shared mapping (its pages
// cached), then rewritten through an O_WRONLY descriptor: direct, the kernel drops the written
// pages; cached, they hold the new bytes. Either way the mapping reads the new bytes, and bytes
// dirtied through a writable mapping before the write do not land over it later.
TEST_F(MountTest, WriteOnlyOpensBypassThePageCacheWithDirectWrites) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  std::string direct, said;
  // kernel_readahead set: the INIT (and its log line saying which way write-only opens go) is then
  // answered before penstock-mount detaches, so it is in what the command printed.
  ASSERT_TRUE(mount_with_options(cluster, "direct-writes-mnt", "direct_writes,sched=normal,kernel_readahead=1M",
                                 &direct, &said));
  const bool direct_here = said.find("write-only opens direct") != std::string::npos;
  if (!direct_here) std::cout << "note: this kernel keeps write-only opens cached (FUSE < 7.39)" << std::endl;

  constexpr size_t kLen = 4u << 20;
  for (const auto& [mnt, expect_cached] : {std::pair<std::string, bool>{cluster.mount_path(), true}, {direct, !direct_here}}) {
    SCOPED_TRACE(mnt);
    const std::string path = mnt + (expect_cached ? "/shard-cached" : "/shard-direct");
    ASSERT_TRUE(write_file(path, pattern(kLen, 0, 7)));
    const std::string data = pattern(kLen, 0, expect_cached ? 5 : 6);
    int rfd = open(path.c_str(), O_RDONLY);
    ASSERT_GE(rfd, 0) << errno_name(errno);
    void* map = mmap(nullptr, kLen, PROT_READ, MAP_SHARED, rfd, 0);
    ASSERT_NE(map, MAP_FAILED) << errno_name(errno);
    std::vector<unsigned char> in_core(kLen / 4096);
    auto resident = [&] {
      EXPECT_EQ(mincore(map, kLen, in_core.data()), 0) << errno_name(errno);
      size_t n = 0;
      for (unsigned char c : in_core) n += c & 1;
      return n;
    };
    EXPECT_EQ(std::memcmp(map, pattern(kLen, 0, 7).data(), kLen), 0);
    EXPECT_EQ(resident(), in_core.size()) << "reading the mapping did not cache the file";
    int rwfd = open(path.c_str(), O_RDWR);
    ASSERT_GE(rwfd, 0) << errno_name(errno);
    void* wmap = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_SHARED, rwfd, 0);
    ASSERT_NE(wmap, MAP_FAILED) << errno_name(errno);
    std::memset(static_cast<char*>(wmap) + 90000, 'x', 20000);  // dirty pages under the write below
    int wfd = open(path.c_str(), O_WRONLY);
    ASSERT_GE(wfd, 0) << errno_name(errno);
    ASSERT_TRUE(pwrite_all(wfd, data, 0)) << errno_name(errno);
    EXPECT_EQ(msync(wmap, kLen, MS_SYNC), 0) << errno_name(errno);
    munmap(wmap, kLen);
    EXPECT_EQ(close(rwfd), 0);
    if (expect_cached) {
      EXPECT_EQ(resident(), in_core.size()) << "write-through pages stay cached";
    } else {
      EXPECT_EQ(resident(), 0u) << "the direct write left the old pages cached";
    }
    EXPECT_EQ(std::memcmp(map, data.data(), kLen), 0) << "the mapping shows old bytes";
    EXPECT_EQ(close(wfd), 0);
    munmap(map, kLen);
    EXPECT_EQ(close(rfd), 0);
    std::string back;
    ASSERT_TRUE(read_file(path, &back));
    EXPECT_TRUE(same_bytes(data, back)) << "the mapping's dirty bytes landed over the write";
  }
  unmount_and_reap(direct);
  EXPECT_FALSE(is_mount_point(direct));
}

// Write data spliced from /dev/fuse (-o splice_writes) wherever libfuse can grow its
// pipe to a whole 1 MiB WRITE plus header (this test process can exactly when the mount can: same
// user, same capabilities; tests/run-all raises /proc/sys/fs/pipe-max-size for it): the mount says
// which way it reads write data, and both ways leave the same bytes, for aligned 1 MiB writes,
// unaligned ones and small ones (libfuse reads a WRITE of less than a page and its header into
// memory even when splicing).
TEST_F(MountTest, WriteDataIsSplicedWhereAPipeHoldsAWholeWriteAndLandsExactEitherWay) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  const bool can_splice = fcntl(fds[0], F_SETPIPE_SZ, (1 << 20) + 4096) >= 0;
  close(fds[0]);
  close(fds[1]);
  if (!can_splice) std::cout << "note: a pipe cannot hold a whole WRITE here; both mounts read write data" << std::endl;
  // kernel_readahead set: the INIT log line (which names "splice") is answered before the mount
  // detaches. On /dev/fuse: over the FUSE ring (which the ring tests may have left on) requests
  // arrive in the ring's memory and the kernel offers no splice.
  std::string spliced, copied, said_spliced, said_copied;
  ASSERT_TRUE(mount_with_options(cluster, "splice-mnt", "splice_writes,fuse_uring=off,kernel_readahead=1M", &spliced,
                                 &said_spliced));
  ASSERT_TRUE(mount_with_options(cluster, "copy-mnt", "fuse_uring=off,kernel_readahead=1M", &copied, &said_copied));
  EXPECT_NE(said_spliced.find(can_splice ? "splice 1" : "not spliced: a pipe cannot grow"), std::string::npos)
      << said_spliced;
  EXPECT_NE(said_copied.find("splice 0"), std::string::npos) << said_copied;
  constexpr size_t kLen = 9u << 20;
  for (const std::string& mnt : {spliced, copied}) {
    SCOPED_TRACE(mnt);
    const std::string path = mnt + "/shard";
    UniqueFd fd(open(path.c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644));
    ASSERT_TRUE(fd.ok()) << errno_name(errno);
    const std::string data = pattern(kLen, 0, 21);
    // 1 MiB writes from offset 0, then the same bytes again 4097 bytes in (every WRITE unaligned),
    // then a few small ones.
    for (size_t off = 0; off < kLen; off += 1u << 20) {
      ASSERT_TRUE(pwrite_all(fd.get(), std::string_view(data).substr(off, 1u << 20), static_cast<off_t>(off)));
    }
    for (size_t off = 4097; off + (1u << 20) <= kLen; off += 1u << 20) {
      ASSERT_TRUE(pwrite_all(fd.get(), std::string_view(data).substr(off, 1u << 20), static_cast<off_t>(off)));
    }
    for (size_t off : {size_t{10}, size_t{5000}, kLen - 300}) {
      ASSERT_TRUE(pwrite_all(fd.get(), std::string_view(data).substr(off, 200), static_cast<off_t>(off)));
    }
    ASSERT_EQ(close(fd.release()), 0) << errno_name(errno);
    std::string back;
    ASSERT_TRUE(read_file(path, &back));
    EXPECT_TRUE(same_bytes(data, back));
  }
  unmount_and_reap(spliced);
  unmount_and_reap(copied);
}

std::set<std::string> list_xattrs(const std::string& path) {
  std::set<std::string> names;
  std::string buf(64 * 1024, '\0');
  const ssize_t n = ::listxattr(path.c_str(), buf.data(), buf.size());
  EXPECT_GE(n, 0) << errno_name(errno);
  for (size_t at = 0; n > 0 && at < static_cast<size_t>(n);) {
    const std::string name(buf.c_str() + at);
    names.insert(name);
    at += name.size() + 1;
  }
  return names;
}

// open() of a file by path sends LOOKUP and then OPEN as the calling thread: the LOOKUP's open
// ticket is taken, and the OPEN costs no meta round trip (client/lib/client.h, "Open tickets").
// The mount counts them in its virtual xattr user.penstock.stats (also logged at unmount).
TEST_F(MountTest, OpensByPathTakeTheOpenTicketOfTheirLookup) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  constexpr int kFiles = 20;
  for (int i = 0; i < kFiles; ++i) {
    ASSERT_TRUE(write_file(cluster.mount_path() + "/f" + std::to_string(i), pattern(5000 + i, 0, i)));
  }
  const std::map<std::string, uint64_t> before = mount_counters(cluster.mount_path());
  ASSERT_EQ(before.count("open_tickets_taken"), 1u);
  for (int i = 0; i < kFiles; ++i) {
    std::string back;
    ASSERT_TRUE(read_file(cluster.mount_path() + "/f" + std::to_string(i), &back));
    EXPECT_TRUE(same_bytes(pattern(5000 + i, 0, i), back)) << i;
  }
  std::map<std::string, uint64_t> after = mount_counters(cluster.mount_path());
  ASSERT_EQ(after.count("open_tickets_taken"), 1u);
  ASSERT_EQ(after.count("open_tickets_granted"), 1u);
  const uint64_t taken = after["open_tickets_taken"] - before.at("open_tickets_taken");
  // Most, not all: an OPEN later than the window after its LOOKUP (a loaded machine) asks itself.
  EXPECT_GE(taken, static_cast<uint64_t>(kFiles / 2));
  EXPECT_LE(after["open_tickets_taken"], after["open_tickets_granted"]);
  for (const char* name : {"cache_hits", "cache_joined_fetches", "reads_answered_where_their_block_arrived",
                           "cache_misses", "cache_evictions", "cache_bytes", "cache_blocks",
                           "open_tickets_released_unused"}) {
    EXPECT_EQ(after.count(name), 1u) << name;
  }

  // Virtual and read-only: not listed, not settable, not removable.
  const std::string root = cluster.mount_path();
  EXPECT_EQ(list_xattrs(root).count("user.penstock.stats"), 0u);
  PENSTOCK_EXPECT_ERRNO(EPERM, setxattr(root.c_str(), "user.penstock.stats", "0", 1, 0));
  PENSTOCK_EXPECT_ERRNO(EPERM, removexattr(root.c_str(), "user.penstock.stats"));
  ASSERT_TRUE(cluster.down());
  std::ifstream log(cluster.state_dir() + "/logs/mount1.log");
  std::string line;
  bool logged = false;
  while (std::getline(log, line)) logged = logged || line.find("counters at unmount (user.penstock.stats): ") != std::string::npos;
  EXPECT_TRUE(logged) << "no counters in the mount's log at unmount";
}

// A cluster whose mount has two places (--active-threads 2) for up to 8 threads, on /dev/fuse
// whatever enable_uring is (the ring tests may have switched it on), so its WorkerPool serves
// every request.
ClusterOptions two_places() {
  ClusterOptions options;
  options.mount_args = "--active-threads 2 --threads 8 --fuse-uring off";
  return options;
}

// Sends SIGCONT to every process it holds when it goes, so that a test failing halfway leaves no
// server stopped.
struct ResumeOnExit {
  std::vector<pid_t> pids;
  void resume() {
    for (pid_t pid : pids) kill(pid, SIGCONT);
    pids.clear();
  }
  ~ResumeOnExit() { resume(); }
};

// Data servers that stop answering hold only the requests that wait for them: three cold reads
// on stopped data servers, a mount with two places (--active-threads 2), and a mkdir, a stat and a
// listing beside the reads are answered while they wait (a read either gives its place on, the
// FUSE loop's watch, or is answered by the thread its block arrives on); the reads return their
// bytes once the servers go on.
TEST_F(MountTest, ReadsWaitingOnStoppedDataServersLeaveTheMountServing) {
  Cluster cluster(two_places());
  ASSERT_TRUE(cluster.up());
  const std::string root = cluster.mount_path();
  constexpr int kReaders = 3;
  constexpr size_t kFileSize = 4u << 20;  // past one cache block: its open fetches nothing ahead
  constexpr size_t kReadSize = 64u << 10;
  std::vector<std::string> data;
  std::vector<UniqueFd> fds;
  for (int i = 0; i < kReaders; ++i) {
    data.push_back(pattern(kFileSize, 0, 60 + i));
    const std::string path = root + "/cold" + std::to_string(i);
    ASSERT_TRUE(write_file(path, data.back()));
    // O_DIRECT: each pread is one READ of its bytes, never answered from the kernel's pages
    // (which a POSIX_FADV_DONTNEED does not always drop on a busy machine).
    fds.emplace_back(open(path.c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));
    ASSERT_GE(fds.back().get(), 0) << path << ": " << errno_name(errno);
  }
  // Nor from the mount's cache.
  ASSERT_EQ(::setxattr(root.c_str(), "user.penstock.drop_caches", "1", 1, 0), 0) << errno_name(errno);
  std::vector<pid_t> data_servers;
  for (int k = 1; k <= 3; ++k) {
    const pid_t pid = cluster.pid_of("data" + std::to_string(k));
    ASSERT_GT(pid, 0) << "no pid recorded for data" << k;
    data_servers.push_back(pid);
  }
  ResumeOnExit stopped;
  for (pid_t pid : data_servers) {
    stopped.pids.push_back(pid);
    ASSERT_EQ(kill(pid, SIGSTOP), 0) << errno_name(errno);
  }
  std::vector<std::string> got(kReaders, std::string(kReadSize, '\0'));
  std::vector<ssize_t> read_n(kReaders, -1);
  std::vector<int> read_errno(kReaders, 0);
  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) {
    readers.emplace_back([&, i] {
      read_n[i] = pread(fds[i].get(), got[i].data(), kReadSize, 0);
      read_errno[i] = errno;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // every read waits on a stopped server
  std::promise<std::string> beside_done;
  std::future<std::string> beside = beside_done.get_future();
  std::thread meta_ops([&] {
    auto failed = [](const std::string& what) { return what + ": " + errno_name(errno); };
    const std::string dir = root + "/made-while-reads-wait";
    struct stat st {};
    if (mkdir(dir.c_str(), 0755) != 0) return beside_done.set_value(failed("mkdir"));
    if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return beside_done.set_value(failed("stat"));
    DIR* d = opendir(root.c_str());
    if (d == nullptr) return beside_done.set_value(failed("opendir"));
    int names = 0;
    while (dirent* e = readdir(d)) names += e->d_name[0] != '.';
    closedir(d);
    beside_done.set_value(names == kReaders + 1 ? "" : "the listing gave " + std::to_string(names) + " names");
  });
  const bool answered = beside.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  stopped.resume();
  meta_ops.join();
  for (std::thread& t : readers) t.join();
  EXPECT_TRUE(answered) << "a mkdir, a stat and a listing waited behind reads on stopped data servers";
  if (answered) {
    EXPECT_EQ(beside.get(), "");
  }
  for (int i = 0; i < kReaders; ++i) {
    EXPECT_EQ(read_n[i], static_cast<ssize_t>(kReadSize)) << "read " << i << ": " << errno_name(read_errno[i]);
    EXPECT_TRUE(same_bytes(data[i].substr(0, kReadSize), got[i])) << "read " << i;
  }
  fds.clear();  // an open file keeps the mount busy
  ASSERT_TRUE(cluster.down());
}

// Lookups waiting on a stopped penstock-meta hold FUSE worker threads (they wait in the op), and
// give their places on: with two places (--active-threads 2), three of them, and a read of an
// open file and the mount's counters beside them are answered while they wait.
// user.penstock.stats counts the places, the threads started and the hand-offs.
TEST_F(MountTest, LookupsWaitingOnAStoppedMetaServerGiveTheirPlacesOn) {
  Cluster cluster(two_places());
  ASSERT_TRUE(cluster.up());
  const std::string root = cluster.mount_path();
  const std::string data = pattern(256u << 10, 0, 70);
  ASSERT_TRUE(write_file(root + "/open", data));
  // Lookups in a directory this mount creates nothing in: no directory lease answers them here.
  ASSERT_EQ(mkdir((root + "/asked").c_str(), 0755), 0) << errno_name(errno);
  UniqueFd fd(open((root + "/open").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC));  // a READ per pread
  ASSERT_GE(fd.get(), 0) << errno_name(errno);
  const pid_t meta = cluster.pid_of("meta");
  ASSERT_GT(meta, 0) << "no meta pid recorded";
  ResumeOnExit stopped{{meta}};
  ASSERT_EQ(kill(meta, SIGSTOP), 0) << errno_name(errno);
  constexpr int kLookups = 3;
  std::vector<int> looked(kLookups, 0);
  std::vector<std::thread> lookups;
  for (int i = 0; i < kLookups; ++i) {
    lookups.emplace_back([&, i] {
      struct stat st {};
      looked[i] = stat((root + "/asked/never-made-" + std::to_string(i)).c_str(), &st) == 0 ? 0 : errno;
    });
  }
  std::promise<std::string> beside_done;
  std::future<std::string> beside = beside_done.get_future();
  std::map<std::string, uint64_t> counters;
  std::thread beside_ops([&] {
    // Until the lookups are in: two places each given on by a lookup unanswered for 2 ms (the
    // getxattr that asks is served by a place given on, or waits with the rest).
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(4);
    while (mount_counters(root)["fuse_places_handed_on_unanswered"] < 2 && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::string back(data.size(), '\0');
    const ssize_t n = pread(fd.get(), back.data(), back.size(), 0);
    if (n != static_cast<ssize_t>(data.size()) || back != data) {
      return beside_done.set_value("the read gave " + std::to_string(n) + " bytes: " + errno_name(errno));
    }
    counters = mount_counters(root);
    beside_done.set_value("");
  });
  const bool answered = beside.wait_for(std::chrono::seconds(6)) == std::future_status::ready;
  stopped.resume();
  beside_ops.join();
  for (std::thread& t : lookups) t.join();
  EXPECT_TRUE(answered) << "a read and a getxattr waited behind lookups on a stopped penstock-meta";
  EXPECT_EQ(beside.get(), "");
  for (int i = 0; i < kLookups; ++i) EXPECT_EQ(looked[i], ENOENT) << "lookup " << i << ": " << errno_name(looked[i]);
  EXPECT_EQ(counters["lookups_answered_by_dir_lease"], 0u);
  EXPECT_EQ(counters["fuse_places"], 2u);
  // Each of the two places' lookups gave its place on; the third took a new thread's place.
  EXPECT_GE(counters["fuse_places_handed_on_unanswered"], 2u);
  EXPECT_GE(counters["fuse_threads_started"], 3u);
  EXPECT_LE(counters["fuse_threads_started"], 8u);
  fd.reset();  // an open file keeps the mount busy
  ASSERT_TRUE(cluster.down());
}

// keep_cache: the first open after a file changed has the kernel drop its pages, and once that
// open has read (so it completed, Client::note_open_completed), the next open of the unchanged
// file keeps them: the second pass reads from the kernel's pages and sends the mount no READ.
TEST_F(MountTest, AReopenOfAnUnchangedFileReadsFromTheKernelsPages) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  const std::string path = cluster.mount_path() + "/kept";
  const std::string data = pattern(3u << 20, 0, 7);  // past one cache block: no prefetch at open
  ASSERT_TRUE(write_file(path, data));
  auto fetches = [&] {
    std::map<std::string, uint64_t> c = mount_counters(cluster.mount_path());
    return c["cache_hits"] + c["cache_misses"] + c["cache_joined_fetches"];
  };
  std::string back;
  const uint64_t before_first = fetches();
  ASSERT_TRUE(read_file(path, &back));
  EXPECT_TRUE(same_bytes(data, back));
  const uint64_t after_first = fetches();
  EXPECT_GT(after_first, before_first) << "the first open after the write kept the written pages";
  ASSERT_TRUE(read_file(path, &back));
  EXPECT_TRUE(same_bytes(data, back));
  EXPECT_EQ(fetches(), after_first) << "the reopen of an unchanged file did not keep the kernel's pages";
  ASSERT_TRUE(cluster.down());
}

}  // namespace
}  // namespace penstock::testing
