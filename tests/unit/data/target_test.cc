#include "server/data/target.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "server/daemon/daemon.h"
#include "tests/unit/data/test_util.h"

namespace penstock::data {
namespace {

using testing::TempDir;

TEST(Target, FirstOpenWritesUuidAndBuckets) {
  TempDir tmp;
  std::string dir = tmp.path() + "/t0";
  auto t = Target::open(dir);
  ASSERT_TRUE(t.has_value()) << t.status().to_string();
  EXPECT_EQ((*t)->uuid().size(), 32u);
  auto stored = daemon::read_small_file(dir + "/target.uuid");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(*stored, (*t)->uuid());
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/chunks/00"));
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/chunks/ff"));
}

TEST(Target, ReopenKeepsUuid) {
  TempDir tmp;
  std::string uuid;
  {
    auto t = Target::open(tmp.path());
    ASSERT_TRUE(t.has_value());
    uuid = (*t)->uuid();
  }
  auto again = Target::open(tmp.path() + "/");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ((*again)->uuid(), uuid);
  EXPECT_EQ((*again)->path(), tmp.path());
}

TEST(Target, ChunkPathLayout) {
  TempDir tmp;
  auto t = Target::open(tmp.path());
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ((*t)->chunk_path(InodeId(0x1234), 5), tmp.path() + "/chunks/34/4660/5");
  EXPECT_EQ((*t)->inode_dir(InodeId(255)), tmp.path() + "/chunks/ff/255");
}

TEST(Target, ListChunksSkipsLeftoverTempFiles) {
  TempDir tmp;
  auto t = Target::open(tmp.path());
  ASSERT_TRUE(t.has_value());
  InodeId ino(77);
  auto none = (*t)->list_chunks(ino);
  ASSERT_TRUE(none.has_value());
  EXPECT_TRUE(none->empty());
  std::filesystem::create_directories((*t)->inode_dir(ino));
  for (const char* name : {"10", "2", "3.tmp", "junk"}) std::ofstream((*t)->inode_dir(ino) + "/" + name) << "x";
  auto got = (*t)->list_chunks(ino);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, (std::vector<uint64_t>{2, 10}));
}

TEST(Target, GarbageUuidFileIsCorrupt) {
  TempDir tmp;
  std::ofstream(tmp.path() + "/target.uuid") << "not-a-uuid\n";
  auto t = Target::open(tmp.path());
  ASSERT_FALSE(t.has_value());
  EXPECT_EQ(t.error().code(), Code::kCorrupt);
  EXPECT_NE(t.error().message().find("target.uuid"), std::string::npos);
}

TEST(Target, PathThatIsAFileIsRefused) {
  TempDir tmp;
  std::string file = tmp.path() + "/plain";
  std::ofstream(file) << "x";
  auto t = Target::open(file);
  ASSERT_FALSE(t.has_value());
  EXPECT_NE(t.error().message().find(file), std::string::npos) << t.error().to_string();
}

TEST(Target, ReportsSpace) {
  TempDir tmp;
  auto t = Target::open(tmp.path());
  ASSERT_TRUE(t.has_value());
  auto s = (*t)->space();
  ASSERT_TRUE(s.has_value());
  EXPECT_GT(s->capacity_bytes, 0u);
  EXPECT_LE(s->free_bytes, s->capacity_bytes);
}

}  // namespace
}  // namespace penstock::data
