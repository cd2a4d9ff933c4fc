#include "server/data/chunk_service.h"

#include <fstream>
#include <optional>

#include <gtest/gtest.h>

#include "tests/unit/data/test_util.h"

namespace penstock::data {
namespace {

using testing::pattern;
using testing::TempDir;
namespace pd = proto::data;

class ChunkServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = Target::open(dir_.path());
    ASSERT_TRUE(t.has_value()) << t.status().to_string();
    store_ = std::make_shared<ChunkStore>(std::shared_ptr<Target>(std::move(*t)));
  }
  void serve() { service_.set_served({{TargetId(7), store_}}); }
  pd::ChunkKey key(uint32_t chunk_size = 1u << 20) {
    return pd::ChunkKey{ChainId(1), TargetId(7), InodeId(55), 0, chunk_size};
  }

  TempDir dir_;
  std::shared_ptr<ChunkStore> store_;
  ChunkService service_;
};

TEST_F(ChunkServiceTest, RefusesEverythingUntilTargetsAreServed) {
  auto d = pattern(10, 1);
  auto w = service_.write(pd::WriteReq{key(), 0}, d);
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.status().code(), Code::kNotFound);
  EXPECT_EQ(w.status().message(), "target 7 is not served here");
  EXPECT_EQ(service_.sync(pd::SyncReq{TargetId(7), InodeId(55)}, {}).code(), Code::kNotFound);
  serve();
  EXPECT_TRUE(service_.write(pd::WriteReq{key(), 0}, d).has_value());
  auto other = key();
  other.target = TargetId(8);
  ByteBuffer out;
  auto r = service_.read(pd::ReadReq{other, 0, 10}, {}, &out);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.status().message(), "target 8 is not served here");
  EXPECT_EQ(service_.remove(pd::RemoveReq{TargetId(9), InodeId(55)}, {}).code(), Code::kNotFound);
  EXPECT_EQ(service_.truncate(pd::TruncateReq{TargetId(9), InodeId(55), 0, 1u << 20}, {}).code(), Code::kNotFound);
}

TEST_F(ChunkServiceTest, RoundTripFillsBulkOutExactly) {
  serve();
  auto d = pattern(5000, 2);
  auto w = service_.write(pd::WriteReq{key(), 100}, d);
  ASSERT_TRUE(w.has_value()) << w.status().to_string();
  EXPECT_EQ(w->chunk_length, 5100u);
  ByteBuffer out;
  auto r = service_.read(pd::ReadReq{key(), 100, 10000}, {}, &out);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->length, 5000u);
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), d);
  ASSERT_TRUE(service_.sync(pd::SyncReq{TargetId(7), InodeId(55)}, {}).is_ok());
  ASSERT_TRUE(service_.truncate(pd::TruncateReq{TargetId(7), InodeId(55), 1000, 1u << 20}, {}).is_ok());
  r = service_.read(pd::ReadReq{key(), 0, 10000}, {}, &out);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->length, 1000u);
  EXPECT_EQ(out.size(), 1000u);
  ASSERT_TRUE(service_.remove(pd::RemoveReq{TargetId(7), InodeId(55)}, {}).is_ok());
  r = service_.read(pd::ReadReq{key(), 0, 10000}, {}, &out);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->length, 0u);
  EXPECT_TRUE(out.empty());
}

TEST_F(ChunkServiceTest, ValidatesRequests) {
  serve();
  auto d = pattern(10, 3);
  ByteBuffer out;
  EXPECT_EQ(service_.write(pd::WriteReq{key(), 0}, {}).status().code(), Code::kInvalid);  // no bytes
  EXPECT_EQ(service_.write(pd::WriteReq{key(1000), 0}, d).status().code(), Code::kInvalid);
  EXPECT_EQ(service_.write(pd::WriteReq{key(), (1u << 20) - 5}, d).status().code(), Code::kInvalid);
  auto no_ino = key();
  no_ino.ino = InodeId(0);
  EXPECT_EQ(service_.write(pd::WriteReq{no_ino, 0}, d).status().code(), Code::kInvalid);
  EXPECT_EQ(service_.read(pd::ReadReq{key(), 0, 10}, d, &out).status().code(), Code::kInvalid);  // bulk on read
  EXPECT_EQ(service_.read(pd::ReadReq{key(), 1u << 20, 1}, {}, &out).status().code(), Code::kInvalid);
  EXPECT_EQ(service_.read(pd::ReadReq{key(3u << 20), 0, 1}, {}, &out).status().code(), Code::kInvalid);
  // Huge offset + length must not wrap around.
  EXPECT_EQ(service_.read(pd::ReadReq{key(), 0xffffffffu, 0xffffffffu}, {}, &out).status().code(), Code::kInvalid);
  EXPECT_EQ(service_.truncate(pd::TruncateReq{TargetId(7), InodeId(55), 0, 1u << 20}, d).code(), Code::kInvalid);
  EXPECT_EQ(service_.truncate(pd::TruncateReq{TargetId(7), InodeId(55), 0, 100}, {}).code(), Code::kInvalid);
  EXPECT_EQ(service_.remove(pd::RemoveReq{TargetId(7), InodeId(55)}, d).code(), Code::kInvalid);
  EXPECT_EQ(service_.sync(pd::SyncReq{TargetId(7), InodeId(55)}, d).code(), Code::kInvalid);
  EXPECT_EQ(service_.sync(pd::SyncReq{TargetId(7), InodeId(0)}, {}).code(), Code::kInvalid);
}

TEST_F(ChunkServiceTest, DropCachesCoversServedTargets) {
  // Before registration nothing is served: nothing to drop, no error.
  auto none = service_.drop_caches(pd::DropCachesReq{}, {});
  ASSERT_TRUE(none.has_value()) << none.status().to_string();
  EXPECT_EQ(none->targets, 0u);
  serve();
  auto d = pattern(5000, 3);
  ASSERT_TRUE(service_.write(pd::WriteReq{key(), 0}, d).has_value());
  auto all = service_.drop_caches(pd::DropCachesReq{}, {});
  ASSERT_TRUE(all.has_value()) << all.status().to_string();
  EXPECT_EQ(all->targets, 1u);
  EXPECT_EQ(all->files, 1u);
  EXPECT_EQ(all->fds_closed, 1u);  // the write left its chunk file open in the cache
  auto named = service_.drop_caches(pd::DropCachesReq{{TargetId(7)}}, {});
  ASSERT_TRUE(named.has_value());
  EXPECT_EQ(named->fds_closed, 0u);
  EXPECT_EQ(service_.drop_caches(pd::DropCachesReq{{TargetId(8)}}, {}).status().code(), Code::kNotFound);
  std::vector<uint8_t> bulk{1};
  EXPECT_EQ(service_.drop_caches(pd::DropCachesReq{}, bulk).status().code(), Code::kInvalid);
  ByteBuffer out;
  auto r = service_.read(pd::ReadReq{key(), 0, 5000}, {}, &out);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(std::vector<uint8_t>(out.begin(), out.end()), d);
}

TEST_F(ChunkServiceTest, ListInodesPagesThroughABucket) {
  serve();
  auto d = pattern(100, 4);
  const uint32_t kChunk = 1u << 20;
  // Bucket 5 (ino % 256): one inode with chunk 0 only, one with chunks 0 and 3, one with chunk 2
  // only (its directory alone), one with only a crash's leftover "<ino>.0.tmp"; one inode in
  // bucket 6 and a stray name in bucket 5 that must not show.
  const uint64_t a = 5, b = 256 + 5, c = 2 * 256 + 5, e = 3 * 256 + 5, other = 6;
  for (auto [ino, chunk] : std::vector<std::pair<uint64_t, uint64_t>>{{a, 0}, {b, 0}, {b, 3}, {c, 2}, {other, 0}}) {
    ASSERT_TRUE(service_.write(pd::WriteReq{pd::ChunkKey{ChainId(1), TargetId(7), InodeId(ino), chunk, kChunk}, 0}, d)
                    .has_value());
  }
  const std::string bucket = dir_.path() + "/chunks/05/";
  { std::ofstream(bucket + std::to_string(e) + ".0.tmp") << "x"; }
  { std::ofstream(bucket + "notes.txt") << "x"; }
  { std::ofstream(bucket + "6.0") << "x"; }  // a number of another bucket

  auto all = service_.list_inodes(pd::ListInodesReq{TargetId(7), 5, InodeId(), 0}, {});
  ASSERT_TRUE(all.has_value()) << all.status().to_string();
  EXPECT_EQ(all->inodes, (std::vector<InodeId>{InodeId(a), InodeId(b), InodeId(c), InodeId(e)}));
  EXPECT_FALSE(all->more);
  auto first = service_.list_inodes(pd::ListInodesReq{TargetId(7), 5, InodeId(), 2}, {});
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->inodes, (std::vector<InodeId>{InodeId(a), InodeId(b)}));
  EXPECT_TRUE(first->more);
  auto rest = service_.list_inodes(pd::ListInodesReq{TargetId(7), 5, InodeId(b), 2}, {});
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->inodes, (std::vector<InodeId>{InodeId(c), InodeId(e)}));
  EXPECT_FALSE(rest->more);
  auto six = service_.list_inodes(pd::ListInodesReq{TargetId(7), 6, InodeId(), 0}, {});
  ASSERT_TRUE(six.has_value());
  EXPECT_EQ(six->inodes, (std::vector<InodeId>{InodeId(other)}));
  // Removing an inode takes it off the list.
  ASSERT_TRUE(service_.remove(pd::RemoveReq{TargetId(7), InodeId(b)}, {}).is_ok());
  all = service_.list_inodes(pd::ListInodesReq{TargetId(7), 5, InodeId(), 0}, {});
  ASSERT_TRUE(all.has_value());
  EXPECT_EQ(all->inodes, (std::vector<InodeId>{InodeId(a), InodeId(c), InodeId(e)}));

  EXPECT_EQ(service_.list_inodes(pd::ListInodesReq{TargetId(7), 256, InodeId(), 0}, {}).status().code(),
            Code::kInvalid);
  EXPECT_EQ(service_.list_inodes(pd::ListInodesReq{TargetId(8), 5, InodeId(), 0}, {}).status().code(),
            Code::kNotFound);
  std::vector<uint8_t> bulk{1};
  EXPECT_EQ(service_.list_inodes(pd::ListInodesReq{TargetId(7), 5, InodeId(), 0}, bulk).status().code(),
            Code::kInvalid);
}

// `penstock stats`: each request counts in its target's counters once the target is found, with
// its bytes, how a read went, and its error (corrupt and full-disk ones apart).
TEST_F(ChunkServiceTest, StatsCountEachTargetsRequestsBytesAndErrors) {
  auto before = service_.stats({});
  ASSERT_TRUE(before.has_value());
  EXPECT_TRUE(before->targets.empty()) << "a target listed before any is served";
  serve();
  auto d = pattern(5000, 4);
  ASSERT_TRUE(service_.write(pd::WriteReq{key(), 0}, d).has_value());
  ASSERT_TRUE(service_.write(pd::WriteReq{key(), 5000}, d).has_value());
  EXPECT_EQ(service_.write(pd::WriteReq{key(), 0}, {}).status().code(), Code::kInvalid);  // no bytes: an error
  ByteBuffer out;
  pd::ReadReq stream{key(), 0, 4096};
  stream.sequential = true;
  ASSERT_TRUE(service_.read(stream, {}, &out).has_value());
  ASSERT_TRUE(service_.read(pd::ReadReq{key(), 4096, 100000}, {}, &out).has_value());  // to the end: 5904 bytes
  // Sent unread where the caller can send a file range and the client verifies.
  std::optional<ChunkStore::UnreadRange> unread;
  pd::ReadReq verify{key(), 0, 8192};
  verify.verify_at_client = true;
  ASSERT_TRUE(service_.read(verify, {}, &out, &unread).has_value());
  ASSERT_TRUE(unread.has_value());
  unread.reset();
  ASSERT_TRUE(service_.sync(pd::SyncReq{TargetId(7), InodeId(55)}, {}).is_ok());
  ASSERT_TRUE(service_.truncate(pd::TruncateReq{TargetId(7), InodeId(55), 9000, 1u << 20}, {}).is_ok());
  // Past the chunk's end: nothing to send, so not counted as sent unread.
  pd::ReadReq past{key(), 9000, 4096};
  past.verify_at_client = true;
  ASSERT_TRUE(service_.read(past, {}, &out, &unread).has_value());
  EXPECT_TRUE(!unread.has_value() || unread->length == 0);
  unread.reset();
  // A request for a target not served here counts under no target.
  auto other = key();
  other.target = TargetId(8);
  EXPECT_FALSE(service_.read(pd::ReadReq{other, 0, 10}, {}, &out).has_value());

  // The last data byte flipped on disk: the read of its block fails its checksum.
  {
    const std::string path = store_->target().chunk_path(InodeId(55), 0);
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.is_open()) << path;
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x5a);
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  auto bad = service_.read(pd::ReadReq{key(), 8192, 808}, {}, &out);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.status().code(), Code::kCorrupt);
  ASSERT_TRUE(service_.remove(pd::RemoveReq{TargetId(7), InodeId(55)}, {}).is_ok());

  auto s = service_.stats({});
  ASSERT_TRUE(s.has_value());
  ASSERT_EQ(s->targets.size(), 1u);
  EXPECT_EQ(s->targets[0].target, TargetId(7));
  const pd::TargetCounters& c = s->targets[0].counters;
  EXPECT_EQ(c.writes, 3u);
  EXPECT_EQ(c.write_bytes, 10000u);
  EXPECT_EQ(c.reads, 5u);
  EXPECT_EQ(c.read_bytes, 4096u + 5904u + 8192u);
  EXPECT_EQ(c.sequential_reads, 1u);
  EXPECT_EQ(c.unread_reads, 1u);
  EXPECT_EQ(c.direct_reads, 0u);  // no O_DIRECT option
  EXPECT_EQ(c.syncs, 1u);
  EXPECT_EQ(c.truncates, 1u);
  EXPECT_EQ(c.removes, 1u);
  EXPECT_EQ(c.errors, 2u);
  EXPECT_EQ(c.corrupt, 1u);
  EXPECT_EQ(c.no_space, 0u);
  EXPECT_EQ(service_.stats(d).status().code(), Code::kInvalid) << "Stats carries no bulk";
}

}  // namespace
}  // namespace penstock::data
