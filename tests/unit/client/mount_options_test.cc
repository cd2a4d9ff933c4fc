#include "client/fuse/mount_options.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace penstock::fuse {
namespace {

TEST(MountOptions, PenstockOptions) {
  MountSettings s;
  EXPECT_FALSE(s.direct_io);
  EXPECT_FALSE(s.direct_writes);
  ASSERT_TRUE(apply_mount_options(
                  "meta=10.0.0.1:7600,threads=32,active_threads=6,clone_fd,direct_io,direct_writes,log_level=debug,log_file=/tmp/m.log", &s)
                  .is_ok());
  EXPECT_EQ(s.meta, "10.0.0.1:7600");
  EXPECT_EQ(s.threads, 32);
  EXPECT_EQ(s.active_threads, 6);
  EXPECT_TRUE(s.clone_fd);
  EXPECT_TRUE(s.direct_io);
  EXPECT_TRUE(s.direct_writes);
  EXPECT_EQ(s.log_level, "debug");
  EXPECT_EQ(s.log_file, "/tmp/m.log");
  EXPECT_FALSE(s.read_only);
}

TEST(MountOptions, CreateBehindIsOnUnlessTurnedOff) {
  MountSettings s;
  EXPECT_TRUE(s.create_behind);
  ASSERT_TRUE(apply_mount_options("no_create_behind", &s).is_ok());
  EXPECT_FALSE(s.create_behind);
  ASSERT_TRUE(apply_mount_options("create_behind", &s).is_ok());
  EXPECT_TRUE(s.create_behind);
}

TEST(MountOptions, SpliceWritesIsOffUnlessTurnedOn) {
  MountSettings s;
  EXPECT_FALSE(s.splice_writes);
  ASSERT_TRUE(apply_mount_options("splice_writes", &s).is_ok());
  EXPECT_TRUE(s.splice_writes);
  ASSERT_TRUE(apply_mount_options("no_splice_writes", &s).is_ok());
  EXPECT_FALSE(s.splice_writes);
  EXPECT_FALSE(apply_mount_options("splice_writes=1", &s).is_ok());
}

// direct_writes only where the kernel drops cached pages on a direct write: FUSE 7.39 (Linux 6.6).
TEST(MountOptions, DirectWritesNeedFuse739) {
  EXPECT_FALSE(direct_writes_supported(31));
  EXPECT_FALSE(direct_writes_supported(38));
  EXPECT_TRUE(direct_writes_supported(39));
  EXPECT_TRUE(direct_writes_supported(45));  // this machine's kernel 6.18
}

TEST(MountOptions, GenericOptionsAreAccepted) {
  MountSettings s;
  const MountSettings before = s;
  ASSERT_TRUE(apply_mount_options(
                  "rw,nodev,nosuid,noatime,defaults,_netdev,allow_other,default_permissions,nofail,"
                  "x-systemd.automount,,relatime",
                  &s)
                  .is_ok());
  EXPECT_EQ(s.meta, before.meta);
  EXPECT_EQ(s.threads, before.threads);
  EXPECT_FALSE(s.clone_fd);
  EXPECT_EQ(s.kernel_flags, (std::vector<std::string>{"nodev", "nosuid", "noatime"}));
}

TEST(MountOptions, FuseConfAllowsOtherOnlyWithItsOwnLine) {
  EXPECT_FALSE(fuse_conf_allows_other(""));
  EXPECT_FALSE(fuse_conf_allows_other("# mount_max = 1000\n#user_allow_other\n"));  // Debian's default
  EXPECT_TRUE(fuse_conf_allows_other("mount_max = 1000\n  user_allow_other  # shared mounts\n"));
  EXPECT_TRUE(fuse_conf_allows_other("user_allow_other"));
  EXPECT_FALSE(fuse_conf_allows_other("user_allow_others\n"));
}

// noexec, nosuid, nodev and their opposites go to the kernel as given (an fstab's noexec was
// accepted and dropped, so the mount let files be executed).
TEST(MountOptions, MountFlagsReachTheKernelInOrder) {
  MountSettings s;
  ASSERT_TRUE(apply_mount_options("noexec,_netdev,suid,exec", &s).is_ok());
  EXPECT_EQ(s.kernel_flags, (std::vector<std::string>{"noexec", "suid", "exec"}));
  EXPECT_FALSE(apply_mount_options("noexec=1", &s).is_ok());
}

TEST(MountOptions, ReadOnlyAndRwLastWins) {
  MountSettings s;
  ASSERT_TRUE(apply_mount_options("ro", &s).is_ok());
  EXPECT_TRUE(s.read_only);
  ASSERT_TRUE(apply_mount_options("rw", &s).is_ok());
  EXPECT_FALSE(s.read_only);
}

TEST(MountOptions, RejectsUnknownAndBadValues) {
  for (const char* bad : {"bogus", "threads=0", "threads=x", "threads=2000", "threads=", "active_threads=0", "active_threads=", "meta", "meta=",
                          "clone_fd=1", "direct_io=yes", "direct_writes=yes", "create_behind=1", "no_create_behind=0", "log_level=loud", "ro=yes", "rw,colour=blue", "cache_size=",
                          "cache_size=lots", "dirty_limit=5X", "readahead_max=99999999999999999999G"}) {
    MountSettings s;
    Status st = apply_mount_options(bad, &s);
    EXPECT_EQ(st.code(), Code::kInvalid) << bad;
  }
}

TEST(MountOptions, DataPathSizes) {
  MountSettings s;
  ASSERT_TRUE(apply_mount_options("cache_size=2G,readahead_max=16M,dirty_limit=0", &s).is_ok());
  EXPECT_EQ(s.cache_size, 2ull << 30);
  EXPECT_EQ(s.readahead_max, 16ull << 20);
  EXPECT_EQ(s.dirty_limit, 0u);
  auto v = parse_byte_size("64KiB");
  ASSERT_TRUE(v.has_value());
  EXPECT_EQ(*v, 65536u);
  EXPECT_EQ(*parse_byte_size("123"), 123u);
  EXPECT_FALSE(parse_byte_size("1P").has_value());
  EXPECT_FALSE(parse_byte_size("20000000T").has_value());
}

TEST(MountOptions, KernelReadahead) {
  MountSettings s;
  EXPECT_EQ(s.kernel_readahead, MountSettings::kDefaultKernelReadahead);
  ASSERT_TRUE(apply_mount_options("kernel_readahead=16M", &s).is_ok());
  EXPECT_EQ(s.kernel_readahead, 16ull << 20);
  ASSERT_TRUE(apply_mount_options("kernel_readahead=0", &s).is_ok());
  EXPECT_EQ(s.kernel_readahead, 0u);
  ASSERT_TRUE(apply_mount_options("kernel_readahead=1G", &s).is_ok());
  for (const char* bad : {"kernel_readahead=", "kernel_readahead=1000", "kernel_readahead=2G", "kernel_readahead=x"}) {
    MountSettings t;
    Status st = apply_mount_options(bad, &t);
    EXPECT_EQ(st.code(), Code::kInvalid) << bad;
    EXPECT_EQ(t.kernel_readahead, MountSettings::kDefaultKernelReadahead) << bad;
  }
  EXPECT_TRUE(check_kernel_readahead(4096, "x").is_ok());
  EXPECT_EQ(check_kernel_readahead(1500, "--kernel-readahead").code(), Code::kInvalid);
}

TEST(MountOptions, SchedPolicy) {
  MountSettings s;
  EXPECT_EQ(s.sched, "batch");
  ASSERT_TRUE(apply_mount_options("sched=normal", &s).is_ok());
  EXPECT_EQ(s.sched, "normal");
  ASSERT_TRUE(apply_mount_options("sched=batch", &s).is_ok());
  EXPECT_EQ(s.sched, "batch");
  for (const char* bad : {"sched=", "sched", "sched=fifo", "sched=BATCH"}) {
    MountSettings t;
    t.sched = "normal";
    EXPECT_EQ(apply_mount_options(bad, &t).code(), Code::kInvalid) << bad;
    EXPECT_EQ(t.sched, "normal") << bad;
  }
}

TEST(MountOptions, FuseUring) {
  MountSettings s;
  EXPECT_EQ(s.fuse_uring, "auto");
  for (const char* mode : {"on", "off", "auto"}) {
    ASSERT_TRUE(apply_mount_options(std::string("fuse_uring=") + mode, &s).is_ok()) << mode;
    EXPECT_EQ(s.fuse_uring, mode);
  }
  for (const char* bad : {"fuse_uring", "fuse_uring=", "fuse_uring=yes", "fuse_uring=ON"}) {
    MountSettings t;
    t.fuse_uring = "off";
    Status st = apply_mount_options(bad, &t);
    EXPECT_EQ(st.code(), Code::kInvalid) << bad;
    EXPECT_EQ(t.fuse_uring, "off") << bad;
  }
}

TEST(MountOptions, CountCpuList) {
  EXPECT_EQ(count_cpu_list("0-1\n"), 2);
  EXPECT_EQ(count_cpu_list("0"), 1);
  EXPECT_EQ(count_cpu_list("0-3,8"), 5);
  EXPECT_EQ(count_cpu_list("0-3,8-11,16"), 9);
  for (const char* bad : {"", "\n", "-", "0-", "3-1", "a", "0,,1", "0-1,", "1234567"}) {
    EXPECT_EQ(count_cpu_list(bad), 0) << bad;
  }
}

// The policy is the calling thread's and is inherited by threads it starts afterwards; the test
// runs it on a thread of its own so the test process's main thread keeps its policy.
TEST(MountOptions, ApplySchedPolicyIsInheritedByNewThreads) {
  std::thread([] {
    ASSERT_TRUE(apply_sched_policy("batch").is_ok());
    EXPECT_EQ(sched_getscheduler(0), SCHED_BATCH);
    int child = -1;
    std::thread([&child] { child = sched_getscheduler(0); }).join();
    EXPECT_EQ(child, SCHED_BATCH);
    ASSERT_TRUE(apply_sched_policy("normal").is_ok());
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
    std::thread([&child] { child = sched_getscheduler(0); }).join();
    EXPECT_EQ(child, SCHED_OTHER);
    EXPECT_EQ(apply_sched_policy("fifo").code(), Code::kInvalid);
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
  }).join();
}

TEST(MountOptions, FuseMountDevFromMountinfo) {
  const std::string info =
      "22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n"
      "43 22 0:40 / /tmp/mnt rw,nosuid,nodev,relatime - fuse.penstock penstock:127.0.0.1:7600 rw,user_id=0\n"
      "44 22 0:41 / /tmp/with\\040space rw,relatime shared:7 master:2 - fuse.penstock penstock:x rw\n"
      "45 22 0:42 / /tmp/notfuse rw - tmpfs tmpfs rw\n"
      "46 43 0:47 / /tmp/mnt rw - fuse.penstock penstock:127.0.0.1:7700 rw\n";
  auto a = fuse_mount_dev(info, "/tmp/mnt");
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  EXPECT_EQ(bdi_name(*a), "0:47");  // the mount on top wins
  auto b = fuse_mount_dev(info, "/tmp/with space");
  ASSERT_TRUE(b.has_value()) << b.error().to_string();
  EXPECT_EQ(bdi_name(*b), "0:41");
  EXPECT_EQ(fuse_mount_dev(info, "/tmp/notfuse").error().code(), Code::kNotFound);
  EXPECT_EQ(fuse_mount_dev(info, "/tmp/none").error().code(), Code::kNotFound);
  EXPECT_EQ(fuse_mount_dev("", "/").error().code(), Code::kNotFound);
}

TEST(MountOptions, SetBdiReadAheadWritesKiBAndReturnsTheOldValue) {
  char tmpl[] = "/tmp/penstock-bdi-test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;
  const dev_t dev = makedev(0, 57);
  ASSERT_EQ(mkdir((root + "/0:57").c_str(), 0755), 0);
  const std::string file = root + "/0:57/read_ahead_kb";
  {
    std::ofstream out(file);
    out << "128\n";
  }
  auto old = set_bdi_read_ahead(root, dev, 4u << 20);
  ASSERT_TRUE(old.has_value()) << old.error().to_string();
  EXPECT_EQ(*old, 128u);
  std::ifstream in(file);
  std::string text;
  std::getline(in, text);
  EXPECT_EQ(text, "4096");
  auto missing = set_bdi_read_ahead(root, makedev(0, 58), 1u << 20);
  ASSERT_FALSE(missing.has_value());
  EXPECT_EQ(missing.error().code(), Code::kNotFound);
  EXPECT_NE(missing.error().message().find("0:58/read_ahead_kb"), std::string::npos);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace penstock::fuse
