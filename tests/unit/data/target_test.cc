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
  EXPECT_EQ((*t)->chunk_path(InodeId(0x1234), 0), tmp.path() + "/chunks/34/4660.0");
  EXPECT_EQ((*t)->chunk_dir(InodeId(0x1234), 0), tmp.path() + "/chunks/34");
  EXPECT_EQ((*t)->chunk_dir(InodeId(0x1234), 1), tmp.path() + "/chunks/34/4660");
  EXPECT_EQ((*t)->inode_dir(InodeId(255)), tmp.path() + "/chunks/ff/255");
  auto layout = daemon::read_small_file(tmp.path() + "/layout");
  ASSERT_TRUE(layout.has_value());
  EXPECT_EQ(*layout, std::to_string(Target::kLayoutVersion));
}

// A target written before layouts were numbered (every chunk in its inode's directory) is moved
// to the current layout at open: chunk 0 into the bucket, an inode directory left empty removed,
// later chunks and other inodes' files untouched, a leftover "0.tmp" dropped. Opening again
// changes nothing.
TEST(Target, LayoutOneIsMovedOnOpen) {
  TempDir tmp;
  namespace fs = std::filesystem;
  fs::create_directories(tmp.path() + "/chunks/05");
  ASSERT_TRUE(daemon::write_small_file_durably(tmp.path() + "/target.uuid", std::string(32, 'a')).is_ok());
  const std::string bucket = tmp.path() + "/chunks/05";
  fs::create_directories(bucket + "/5");    // one chunk
  fs::create_directories(bucket + "/261");  // chunks 0 and 3
  fs::create_directories(bucket + "/517");  // only chunk 2, and a leftover creation of chunk 0
  std::ofstream(bucket + "/5/0") << "five";
  std::ofstream(bucket + "/261/0") << "zero";
  std::ofstream(bucket + "/261/3") << "three";
  std::ofstream(bucket + "/517/2") << "two";
  std::ofstream(bucket + "/517/0.tmp") << "half";
  for (int round = 0; round < 2; ++round) {
    auto t = Target::open(tmp.path());
    ASSERT_TRUE(t.has_value()) << t.status().to_string();
    EXPECT_EQ((*t)->uuid(), std::string(32, 'a'));
    EXPECT_FALSE(fs::exists(bucket + "/5"));
    EXPECT_EQ(*daemon::read_small_file(bucket + "/5.0"), "five");
    EXPECT_EQ(*daemon::read_small_file(bucket + "/261.0"), "zero");
    EXPECT_EQ(*daemon::read_small_file(bucket + "/261/3"), "three");
    EXPECT_FALSE(fs::exists(bucket + "/261/0"));
    EXPECT_FALSE(fs::exists(bucket + "/517.0"));
    EXPECT_FALSE(fs::exists(bucket + "/517/0.tmp"));
    EXPECT_EQ(*daemon::read_small_file(bucket + "/517/2"), "two");
    EXPECT_EQ(*(*t)->list_chunks(InodeId(261)), (std::vector<uint64_t>{0, 3}));
    EXPECT_EQ(*(*t)->list_chunks(InodeId(5)), (std::vector<uint64_t>{0}));
    EXPECT_EQ(*(*t)->list_chunks(InodeId(517)), (std::vector<uint64_t>{2}));
    EXPECT_EQ(*daemon::read_small_file(tmp.path() + "/layout"), std::to_string(Target::kLayoutVersion));
  }
}

TEST(Target, NewerOrGarbledLayoutIsRefused) {
  TempDir tmp;
  ASSERT_TRUE(Target::open(tmp.path()).has_value());
  std::ofstream(tmp.path() + "/layout") << Target::kLayoutVersion + 1 << "\n";
  auto newer = Target::open(tmp.path());
  ASSERT_FALSE(newer.has_value());
  EXPECT_EQ(newer.error().code(), Code::kInvalid);
  EXPECT_NE(newer.error().message().find("newer than this penstock-data"), std::string::npos) << newer.error().to_string();
  std::ofstream(tmp.path() + "/layout") << "two\n";
  auto garbled = Target::open(tmp.path());
  ASSERT_FALSE(garbled.has_value());
  EXPECT_EQ(garbled.error().code(), Code::kCorrupt);
  EXPECT_NE(garbled.error().message().find("/layout"), std::string::npos) << garbled.error().to_string();
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
  std::ofstream((*t)->chunk_path(ino, 0) + ".tmp") << "x";
  auto got = (*t)->list_chunks(ino);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, (std::vector<uint64_t>{2, 10}));
  std::ofstream((*t)->chunk_path(ino, 0)) << "x";
  got = (*t)->list_chunks(ino);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, (std::vector<uint64_t>{0, 2, 10}));
}

TEST(Target, BelongsToOneFileSystem) {
  TempDir tmp;
  const std::string a(32, 'a'), b(32, 'b');
  {
    auto t = Target::open(tmp.path());
    ASSERT_TRUE(t.has_value()) << t.status().to_string();
    EXPECT_EQ((*t)->fs_id(), "");  // never registered
    ASSERT_TRUE((*t)->claim(a).is_ok());
    EXPECT_EQ((*t)->fs_id(), a);
    EXPECT_TRUE((*t)->claim(a).is_ok());
    Status other = (*t)->claim(b);
    EXPECT_EQ(other.code(), Code::kInvalid);
    EXPECT_NE(other.message().find("belongs to file system " + a), std::string::npos) << other.message();
    EXPECT_EQ((*t)->claim("not-an-id").code(), Code::kInvalid);
  }
  auto again = Target::open(tmp.path());  // the stamp is on disk
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ((*again)->fs_id(), a);
  EXPECT_EQ((*again)->claim(b).code(), Code::kInvalid);
  {
    std::ofstream(tmp.path() + "/filesystem.id") << "garbage";
  }
  EXPECT_EQ(Target::open(tmp.path()).status().code(), Code::kCorrupt);
}

TEST(Target, HasChunksSeesAnyBucketEntry) {
  TempDir tmp;
  auto t = Target::open(tmp.path());
  ASSERT_TRUE(t.has_value());
  EXPECT_FALSE((*t)->has_chunks());
  { std::ofstream(tmp.path() + "/chunks/ff/255.0.tmp") << "x"; }
  EXPECT_TRUE((*t)->has_chunks());
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
