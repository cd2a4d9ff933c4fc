#include "client/fuse/mount_options.h"

#include <gtest/gtest.h>

namespace penstock::fuse {
namespace {

TEST(MountOptions, PenstockOptions) {
  MountSettings s;
  ASSERT_TRUE(apply_mount_options("meta=10.0.0.1:7600,threads=32,clone_fd,log_level=debug,log_file=/tmp/m.log", &s)
                  .is_ok());
  EXPECT_EQ(s.meta, "10.0.0.1:7600");
  EXPECT_EQ(s.threads, 32);
  EXPECT_TRUE(s.clone_fd);
  EXPECT_EQ(s.log_level, "debug");
  EXPECT_EQ(s.log_file, "/tmp/m.log");
  EXPECT_FALSE(s.read_only);
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
}

TEST(MountOptions, ReadOnlyAndRwLastWins) {
  MountSettings s;
  ASSERT_TRUE(apply_mount_options("ro", &s).is_ok());
  EXPECT_TRUE(s.read_only);
  ASSERT_TRUE(apply_mount_options("rw", &s).is_ok());
  EXPECT_FALSE(s.read_only);
}

TEST(MountOptions, RejectsUnknownAndBadValues) {
  for (const char* bad : {"bogus", "threads=0", "threads=x", "threads=2000", "threads=", "meta", "meta=",
                          "clone_fd=1", "log_level=loud", "ro=yes", "rw,colour=blue", "cache_size=",
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

}  // namespace
}  // namespace penstock::fuse
