// The client library's read path against an in-process cluster (penstock-meta on an in-memory
// store, three penstock-data servers, TCP on 127.0.0.1; no FUSE): Client::read_pieces hands cache
// hits out as spans of the pinned cached blocks (no copy into the caller's scratch buffer), reads
// that miss the cache land in the scratch buffer, and every semantic of Client::read holds (EOF
// clipping, own buffered writes drained first, holes as zeros, generations); and the remembered
// absence of security.capability (asked before every write); and renames that wait out entry
// leases beside creates.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/lib/client.h"
#include "common/net/transport.h"
#include "common/proto/codec.h"
#include "common/rpc/client.h"
#include "server/data/chunk_format.h"
#include "tests/support/inproc_cluster.h"

namespace penstock {
namespace {

using namespace std::chrono_literals;

constexpr uint8_t kSentinel = 0xCC;

std::vector<uint8_t> concat(const client::ReadPieces& p) {
  std::vector<uint8_t> out;
  for (auto s : p.spans) out.insert(out.end(), s.begin(), s.end());
  return out;
}

// True when no span of `p` points into `scratch`.
bool none_in(const client::ReadPieces& p, const std::vector<uint8_t>& scratch) {
  for (auto s : p.spans) {
    if (s.data() >= scratch.data() && s.data() < scratch.data() + scratch.size()) return false;
  }
  return true;
}

class ClientReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    testing::InProcessClusterOptions o;
    o.temp_prefix = "penstock-client-read";
    o.client.transport = net::TransportKind::kTcp;
    o.client.call_timeout = 60s;
    o.client.cache_size = 64ull << 20;
    o.client.readahead_max = 4ull << 20;
    adjust(o);
    ASSERT_TRUE(cluster_.start(o));
    client_ = &cluster_.client();
  }
  // A derived fixture's changes to the cluster's options.
  virtual void adjust(testing::InProcessClusterOptions&) {}

  // A client of its own (a second mount), with default options.
  std::unique_ptr<client::Client> second_client() {
    client::ClientOptions o;
    o.meta_address = cluster_.meta_address();
    o.transport = net::TransportKind::kTcp;
    o.call_timeout = 60s;
    auto c = client::Client::connect(o);
    EXPECT_TRUE(c.has_value()) << c.error().to_string();
    return c.has_value() ? std::move(*c) : nullptr;
  }

  void TearDown() override { cluster_.stop(); }

  // Creates `name` in the root holding `data`, closed (size reported): the create's attributes.
  proto::InodeAttr write_closed(const std::string& name, const std::vector<uint8_t>& data) {
    const proto::Caller root{0, 0};
    auto attr = client_->create(InodeId{1}, name, S_IFREG | 0644, root);
    EXPECT_TRUE(attr.has_value()) << attr.error().to_string();
    if (!attr.has_value()) return {};
    EXPECT_TRUE(client_->write(attr->ino, attr->layout, 0, data).is_ok());
    EXPECT_TRUE(client_->release(attr->ino).is_ok());
    return *attr;
  }

  // Creates `name` holding `data`, closed (size reported) and opened again: the attributes of that
  // open (size, generation) and its layout.
  proto::InodeAttr make_file(const std::string& name, const std::vector<uint8_t>& data) {
    const proto::InodeAttr attr = write_closed(name, data);
    if (attr.ino.value == 0) return {};
    auto opened = client_->open(attr.ino, 0);
    EXPECT_TRUE(opened.has_value()) << opened.error().to_string();
    return opened.has_value() ? *opened : proto::InodeAttr{};
  }

  // Flips one byte of chunk 0 of `a` on disk, at `offset` in the chunk's data.
  void damage_first_chunk(const proto::InodeAttr& a, uint64_t offset) {
    std::string chunk;
    for (const auto& e : std::filesystem::recursive_directory_iterator(cluster_.dir())) {
      if (e.is_regular_file() && e.path().filename() == std::to_string(a.ino.value) + ".0") {
        chunk = e.path().string();
      }
    }
    ASSERT_FALSE(chunk.empty()) << "no chunk file of inode " << a.ino.value << " under " << cluster_.dir();
    const uint64_t at = data::make_chunk_header(a.ino.value, 0, a.layout.chunk_size).data_offset + offset;
    std::FILE* f = std::fopen(chunk.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fseek(f, static_cast<long>(at), SEEK_SET), 0);
    const int c = std::fgetc(f);
    ASSERT_EQ(std::fseek(f, static_cast<long>(at), SEEK_SET), 0);
    std::fputc(c ^ 0x5a, f);
    std::fclose(f);
  }

  testing::InProcessCluster cluster_;
  client::Client* client_ = nullptr;
};

TEST_F(ClientReadTest, SequentialCacheHitsAreServedFromPinnedBlocksWithoutCopy) {
  const size_t size = (3u << 20) + 12345;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 1);
  const proto::InodeAttr a = make_file("seq", data);
  ASSERT_EQ(a.size, size);
  auto ctx = client_->make_read_context(a.generation);
  std::vector<uint8_t> scratch(1u << 20);
  client::ReadPieces pieces;
  // The first read starts a stream at 0: it fetches its block into the cache (and reads ahead).
  for (uint64_t off = 0; off < size; off += scratch.size()) {
    SCOPED_TRACE(off);
    std::fill(scratch.begin(), scratch.end(), kSentinel);
    auto n = client_->read_pieces(a.ino, a.layout, a.size, off, scratch, ctx.get(), &pieces);
    ASSERT_TRUE(n.has_value()) << n.error().to_string();
    const size_t want = std::min<size_t>(scratch.size(), size - off);
    ASSERT_EQ(*n, want);
    EXPECT_EQ(pieces.bytes, want);
    EXPECT_FALSE(pieces.pins.empty());
    EXPECT_TRUE(none_in(pieces, scratch)) << "a cached read was copied into the scratch buffer";
    EXPECT_TRUE(std::all_of(scratch.begin(), scratch.end(), [](uint8_t b) { return b == kSentinel; }));
    const std::vector<uint8_t> got = concat(pieces);
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + static_cast<long>(off)));
  }
  // An unaligned read across a block boundary: two pieces, still no copy.
  auto n = client_->read_pieces(a.ino, a.layout, a.size, (1u << 20) - 100, std::span<uint8_t>(scratch.data(), 300),
                                ctx.get(), &pieces);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, 300u);
  EXPECT_EQ(pieces.spans.size(), 2u);
  EXPECT_TRUE(none_in(pieces, scratch));
  const std::vector<uint8_t> got = concat(pieces);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin() + (1 << 20) - 100));
  EXPECT_GT(client_->cache_stats().hits, 0u);
}

// Reading a small file is lookup, open, one read: a read-only open of a file the last lookup saw
// as one cache block starts its fetch before the meta open returns, and the read joins it.
TEST_F(ClientReadTest, SmallFileOpenedAfterALookupIsFetchedDuringTheOpen) {
  const size_t size = (100u << 10) + 77;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 11);
  const proto::InodeAttr created = write_closed("small", data);
  ASSERT_NE(created.ino.value, 0u);

  auto looked = client_->lookup_entry(InodeId{1}, "small");
  ASSERT_TRUE(looked.has_value()) << looked.error().to_string();
  ASSERT_EQ(looked->attr.size, size);
  const client::CacheStats before = client_->cache_stats();
  auto a = client_->open(created.ino, O_RDONLY);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  const client::CacheStats opened = client_->cache_stats();
  EXPECT_EQ(opened.misses, before.misses + 1) << "the open started no fetch";

  auto ctx = client_->make_read_context(a->generation);
  std::vector<uint8_t> scratch(size + 1, kSentinel);
  client::ReadPieces pieces;
  auto n = client_->read_pieces(a->ino, a->layout, a->size, 0, scratch, ctx.get(), &pieces);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, size);
  const client::CacheStats read = client_->cache_stats();
  EXPECT_EQ(read.misses, opened.misses) << "the read fetched the file again";
  EXPECT_EQ(read.hits + read.waits, opened.hits + opened.waits + 1);
  EXPECT_TRUE(none_in(pieces, scratch));
  const std::vector<uint8_t> got = concat(pieces);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin(), data.end()));
  pieces.clear();
  EXPECT_TRUE(client_->release(a->ino).is_ok());

  // Cached here already, or opened for writing, or with no lookup since: no fetch at open.
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "small").has_value());
  ASSERT_TRUE(client_->open(created.ino, O_RDONLY).has_value());
  ASSERT_TRUE(client_->release(created.ino).is_ok());
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "small").has_value());
  ASSERT_TRUE(client_->open(created.ino, O_RDWR).has_value());
  ASSERT_TRUE(client_->release(created.ino).is_ok());
  EXPECT_EQ(client_->cache_stats().misses, read.misses);
}

// Open tickets (client.h): a lookup for a caller thread opens the regular file it finds, and that
// thread's read-only open of it takes the ticket instead of asking the meta server again.
class ClientOpenTicketTest : public ClientReadTest {
 protected:
  static constexpr uint64_t kThread = 4242;  // a caller thread id, as a FUSE request carries it
  // Long enough for another client's synced unlink between a lookup and its open (sanitizers,
  // slow disks); the tests that let a ticket expire sleep past it.
  static constexpr auto kWindow = 500ms;

  void adjust(testing::InProcessClusterOptions& o) override { o.client.open_ticket_window = kWindow; }

  // Whether the meta server still has inode `ino`, asked until it has not or 5 s passed.
  bool gone_within_5s(InodeId ino) {
    for (int i = 0; i < 500; ++i) {
      if (client_->getattr(ino).status().code() == Code::kNotFound) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }
};

// The ticket is an open at the meta server from the lookup on: a file another host unlinks between
// this thread's lookup and its open still opens, and reads back whole (POSIX: the open came first).
TEST_F(ClientOpenTicketTest, TheOpenAfterTheLookupTakesItsTicketAndHoldsAFileUnlinkedInBetween) {
  const std::vector<uint8_t> data = testing::seeded_bytes(70u << 10, 31);
  const proto::InodeAttr created = write_closed("held", data);
  ASSERT_NE(created.ino.value, 0u);
  auto other = second_client();
  ASSERT_NE(other, nullptr);

  auto looked = client_->lookup_entry(InodeId{1}, "held", kThread);
  ASSERT_TRUE(looked.has_value()) << looked.error().to_string();
  EXPECT_TRUE(looked->opened);
  ASSERT_TRUE(other->unlink(InodeId{1}, "held").is_ok());
  auto a = client_->open(created.ino, O_RDONLY, nullptr, kThread);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  EXPECT_EQ(a->size, data.size());
  const client::OpenTicketStats st = client_->open_ticket_stats();
  EXPECT_EQ(st.granted, 1u);
  EXPECT_EQ(st.taken, 1u);
  EXPECT_EQ(st.dropped, 0u);

  auto ctx = client_->make_read_context(a->generation);
  std::vector<uint8_t> got(data.size() + 1, kSentinel);
  auto n = client_->read(a->ino, a->layout, a->size, 0, got, ctx.get());
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, data.size());
  EXPECT_TRUE(std::equal(data.begin(), data.end(), got.begin()));
  // Its last release lets the unlinked file go.
  ASSERT_TRUE(client_->release(created.ino).is_ok());
  EXPECT_TRUE(gone_within_5s(created.ino));
}

// A ticket nobody takes (a stat(), an open of another thread, a write open, an open too late) is
// released: the file it held goes once unlinked, and every such open asks the meta server itself.
TEST_F(ClientOpenTicketTest, TicketsNotTakenAreReleasedAndTheirOpensAskTheServer) {
  const proto::InodeAttr stat_only = write_closed("stat-only", testing::seeded_bytes(1000, 1));
  const proto::InodeAttr other_thread = write_closed("other-thread", testing::seeded_bytes(1000, 2));
  const proto::InodeAttr for_write = write_closed("for-write", testing::seeded_bytes(1000, 3));
  const proto::InodeAttr late = write_closed("late", testing::seeded_bytes(1000, 4));
  auto other = second_client();
  ASSERT_NE(other, nullptr);

  // A stat(): nothing follows; the releaser drops the ticket, and the unlink then removes the file.
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "stat-only", kThread).has_value());
  ASSERT_TRUE(other->unlink(InodeId{1}, "stat-only").is_ok());
  EXPECT_TRUE(gone_within_5s(stat_only.ino)) << "an unused ticket kept an unlinked file";

  // Another thread's open, a write open, an open past the window: no ticket taken, all open fine.
  ASSERT_TRUE(client_->open(stat_only.ino, O_RDONLY, nullptr, kThread).status().code() == Code::kNotFound);
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "other-thread", kThread).has_value());
  ASSERT_TRUE(client_->open(other_thread.ino, O_RDONLY, nullptr, kThread + 1).has_value());
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "late", kThread).has_value());
  std::this_thread::sleep_for(kWindow + 300ms);
  ASSERT_TRUE(client_->open(late.ino, O_RDONLY, nullptr, kThread).has_value());
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "for-write", kThread).has_value());
  ASSERT_TRUE(client_->open(for_write.ino, O_WRONLY, nullptr, kThread).has_value());
  EXPECT_EQ(client_->open_ticket_stats().taken, 0u);
  EXPECT_EQ(client_->open_ticket_stats().granted, 4u) << "each of the four lookups asked for a ticket";

  // Each of those files is open exactly once now: after the releases and the unlinks all go.
  for (const proto::InodeAttr* f : {&other_thread, &for_write, &late}) ASSERT_TRUE(client_->release(f->ino).is_ok());
  for (const char* name : {"other-thread", "for-write", "late"}) ASSERT_TRUE(other->unlink(InodeId{1}, name).is_ok());
  for (const proto::InodeAttr* f : {&other_thread, &for_write, &late}) {
    EXPECT_TRUE(gone_within_5s(f->ino)) << "inode " << f->ino.to_string() << " is still open somewhere";
  }
  const client::OpenTicketStats st = client_->open_ticket_stats();
  EXPECT_EQ(st.taken, 0u);
  EXPECT_EQ(st.dropped, st.granted) << "every ticket granted was released";
}

// A thread that only looks files up (a tree walk, stat() after stat()) stops asking for tickets
// after its first unused one, until it opens a file again; stat() and then open() of one file
// keeps one ticket, which the open takes.
TEST_F(ClientOpenTicketTest, AThreadThatOnlyLooksUpStopsAskingAndStatThenOpenTakesOne) {
  for (int i = 0; i < 6; ++i) write_closed("walk-" + std::to_string(i), testing::seeded_bytes(100, i));
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "walk-" + std::to_string(i), kThread).has_value());
  }
  EXPECT_LE(client_->open_ticket_stats().granted, 2u) << "a walking thread kept asking for opens";

  // An open without a ticket turns asking back on; stat() then open() of one file takes a ticket.
  auto w0 = client_->lookup_entry(InodeId{1}, "walk-0", kThread);
  ASSERT_TRUE(w0.has_value());
  ASSERT_TRUE(client_->open(w0->attr.ino, O_RDONLY, nullptr, kThread).has_value());
  ASSERT_TRUE(client_->release(w0->attr.ino).is_ok());
  const client::OpenTicketStats before = client_->open_ticket_stats();
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "walk-1", kThread).has_value());  // stat()
  auto w1 = client_->lookup_entry(InodeId{1}, "walk-1", kThread);                 // open()'s lookup
  ASSERT_TRUE(w1.has_value());
  ASSERT_TRUE(client_->open(w1->attr.ino, O_RDONLY, nullptr, kThread).has_value());
  const client::OpenTicketStats after = client_->open_ticket_stats();
  EXPECT_EQ(after.taken, before.taken + 1);
  ASSERT_TRUE(client_->release(w1->attr.ino).is_ok());
}

// A small file opened before at its generation and not read from us then (the kernel served it
// from its pages, keep_cache) is not fetched at the next open: the kernel likely still holds it.
// One the kernel did read from us at its last open is fetched again (its pages went: a data set
// larger than the page cache, read every epoch).
TEST_F(ClientReadTest, SmallFileIsFetchedAtOpenOnlyWhenTheKernelReadItFromUsLastTime) {
  const std::vector<uint8_t> data = testing::seeded_bytes(30u << 10, 23);
  const proto::InodeAttr created = write_closed("epochs", data);
  ASSERT_NE(created.ino.value, 0u);
  auto open_after_lookup = [&]() -> client::CacheStats {
    const client::CacheStats before = client_->cache_stats();
    EXPECT_TRUE(client_->lookup_entry(InodeId{1}, "epochs").has_value());
    auto a = client_->open(created.ino, O_RDONLY);
    EXPECT_TRUE(a.has_value());
    const client::CacheStats after = client_->cache_stats();
    return client::CacheStats{after.hits - before.hits, after.waits - before.waits, after.misses - before.misses};
  };
  client::CacheStats first = open_after_lookup();  // a new generation: fetched
  EXPECT_EQ(first.misses, 1u);
  ASSERT_TRUE(client_->release(created.ino).is_ok());
  client::CacheStats second = open_after_lookup();  // not read from us last time: nothing asked
  EXPECT_EQ(second.hits + second.waits + second.misses, 0u) << "fetched a file the kernel may hold";
  // This open is read from us (offset 0, as the kernel's first read): the next open fetches.
  auto ctx = client_->make_read_context(created.generation);
  std::vector<uint8_t> buf(data.size());
  auto attr = client_->getattr(created.ino);
  ASSERT_TRUE(attr.has_value());
  ASSERT_TRUE(client_->read(created.ino, attr->layout, attr->size, 0, buf, ctx.get()).has_value());
  ASSERT_TRUE(client_->release(created.ino).is_ok());
  client::CacheStats third = open_after_lookup();
  EXPECT_EQ(third.hits + third.waits + third.misses, 1u) << "the open did not fetch what the kernel had to read";
  ASSERT_TRUE(client_->release(created.ino).is_ok());
}

// Close-to-open with opens that race: after another host changed a file, every open of the new
// version tells the kernel to drop its pages (reports it changed) until one such open has
// completed (a request came on its handle), since the kernel drops them only when an open
// completes and a second open could otherwise keep pages the first has yet to drop.
TEST_F(ClientReadTest, OpensAfterAChangeDropTheKernelsPagesUntilOneOfThemCompleted) {
  const proto::InodeAttr created = write_closed("raced", testing::seeded_bytes(40u << 10, 41));
  ASSERT_NE(created.ino.value, 0u);
  auto open_unchanged = [&]() -> std::pair<bool, proto::InodeAttr> {
    bool unchanged = true;
    auto a = client_->open(created.ino, O_RDONLY, &unchanged);
    EXPECT_TRUE(a.has_value()) << a.error().to_string();
    EXPECT_TRUE(client_->release(created.ino).is_ok());
    return {unchanged, a.has_value() ? *a : proto::InodeAttr{}};
  };
  auto [first, v1] = open_unchanged();
  EXPECT_FALSE(first) << "the first open of a file reported it unchanged";
  EXPECT_FALSE(open_unchanged().first) << "an open before the first one completed kept the pages";
  client_->note_open_completed(created.ino, v1.generation, v1.mtime_ns);
  EXPECT_TRUE(open_unchanged().first) << "an unchanged file is never kept in the kernel's cache";

  auto other = second_client();
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(other->write(created.ino, created.layout, 0, testing::seeded_bytes(40u << 10, 42)).is_ok());
  ASSERT_TRUE(other->release(created.ino).is_ok());
  auto [changed, v2] = open_unchanged();
  EXPECT_FALSE(changed) << "another host's change kept the old pages";
  ASSERT_NE(v2.generation, v1.generation);
  client_->note_open_completed(created.ino, v1.generation, v1.mtime_ns);  // a late one of the old version
  EXPECT_FALSE(open_unchanged().first) << "a second open of the new version kept pages the first may not have dropped";
  client_->note_open_completed(created.ino, v2.generation, v2.mtime_ns);
  EXPECT_TRUE(open_unchanged().first);
}

// A lookup that finds a file past one cache block forgets what an earlier lookup saw of it, so the
// open that follows fetches nothing of the old, small version (it would be dropped unread).
TEST_F(ClientReadTest, SmallFileThatGrewIsNotFetchedAtOpen) {
  const std::vector<uint8_t> small = testing::seeded_bytes(50u << 10, 17);
  const proto::InodeAttr created = write_closed("grows", small);
  ASSERT_NE(created.ino.value, 0u);
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "grows").has_value());  // seen small
  const std::vector<uint8_t> more = testing::seeded_bytes(3u << 20, 18);
  ASSERT_TRUE(client_->write(created.ino, created.layout, small.size(), more).is_ok());
  ASSERT_TRUE(client_->flush(created.ino).is_ok());
  auto looked = client_->lookup_entry(InodeId{1}, "grows");
  ASSERT_TRUE(looked.has_value()) << looked.error().to_string();
  ASSERT_EQ(looked->attr.size, small.size() + more.size());
  const client::CacheStats before = client_->cache_stats();
  ASSERT_TRUE(client_->open(created.ino, O_RDONLY).has_value());
  EXPECT_EQ(client_->cache_stats().misses, before.misses) << "the open fetched the file's old small version";
  EXPECT_TRUE(client_->release(created.ino).is_ok());
}

// A first read elsewhere than at offset 0 (a footer, as Parquet readers do) is a random read; it
// uses the block the open is fetching (joined in flight, or found complete), not a second fetch.
TEST_F(ClientReadTest, SmallFileReadFirstAtItsEndUsesTheFetchOfTheOpen) {
  const size_t size = (200u << 10) + 5;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 16);
  const proto::InodeAttr created = write_closed("footer", data);
  ASSERT_NE(created.ino.value, 0u);
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "footer").has_value());
  auto a = client_->open(created.ino, O_RDONLY);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  const client::CacheStats opened = client_->cache_stats();
  auto ctx = client_->make_read_context(a->generation);
  const size_t tail = 4000;
  std::vector<uint8_t> scratch(tail, kSentinel);
  client::ReadPieces pieces;
  auto n = client_->read_pieces(a->ino, a->layout, a->size, size - tail, scratch, ctx.get(), &pieces);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, tail);
  const client::CacheStats read = client_->cache_stats();
  EXPECT_EQ(read.misses, opened.misses);
  EXPECT_EQ(read.hits + read.waits, opened.hits + opened.waits + 1) << "the read did not use the open's fetch";
  const std::vector<uint8_t> got = concat(pieces);
  EXPECT_TRUE(std::equal(got.begin(), got.end(), data.end() - static_cast<std::ptrdiff_t>(tail), data.end()));
  pieces.clear();
  EXPECT_TRUE(client_->release(a->ino).is_ok());
}

// The lookup's generation is older than the open's (the file changed in between): the block
// fetched for it is dropped at the open and the read sees the new bytes.
TEST_F(ClientReadTest, SmallFileFetchedForAnOlderGenerationIsNotServed) {
  const size_t size = 64u << 10;
  const std::vector<uint8_t> first = testing::seeded_bytes(size, 12);
  const std::vector<uint8_t> second = testing::seeded_bytes(size, 13);
  const proto::InodeAttr created = write_closed("changing", first);
  ASSERT_NE(created.ino.value, 0u);
  auto looked = client_->lookup_entry(InodeId{1}, "changing");
  ASSERT_TRUE(looked.has_value()) << looked.error().to_string();
  // Another writer's close (here through the same client's data path) moves the generation on.
  ASSERT_TRUE(client_->write(created.ino, created.layout, 0, second).is_ok());
  ASSERT_TRUE(client_->release(created.ino).is_ok());
  auto a = client_->open(created.ino, O_RDONLY);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  ASSERT_GT(a->generation, looked->attr.generation);
  const client::CacheStats opened = client_->cache_stats();
  auto ctx = client_->make_read_context(a->generation);
  std::vector<uint8_t> buf(size, kSentinel);
  auto n = client_->read(a->ino, a->layout, a->size, 0, buf, ctx.get());
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, size);
  EXPECT_EQ(buf, second);
  EXPECT_EQ(client_->cache_stats().misses, opened.misses + 1) << "the read used the older generation's block";
  EXPECT_TRUE(client_->release(a->ino).is_ok());
}

// A read given `later` that finds its block still being fetched returns at once (deferred) and
// gets its bytes from the thread that completes the block; a failed fetch reaches it as its error.
TEST_F(ClientReadTest, AReadWaitingForASmallFilesFetchIsAnsweredByWhoeverCompletesIt) {
  struct Outcome {
    std::mutex mu;
    std::condition_variable cv;
    bool called = false;
    std::thread::id thread;
    Result<size_t> n = Status(Code::kInternal, "not called");
    std::vector<uint8_t> bytes;
  };
  // Lookup, open (which starts the fetch), then read at once with `later`: the outcome either way.
  auto read_after_open = [&](const proto::InodeAttr& created, const std::string& name, size_t size,
                             bool* deferred) -> std::pair<Result<size_t>, std::vector<uint8_t>> {
    EXPECT_TRUE(client_->lookup_entry(InodeId{1}, name).has_value());
    auto a = client_->open(created.ino, O_RDONLY);
    EXPECT_TRUE(a.has_value()) << a.error().to_string();
    if (!a.has_value()) return {a.error(), {}};
    auto ctx = client_->make_read_context(a->generation);
    // Exactly the file's size: a longer read would first ask penstock-meta for the size, and the
    // fetch could arrive meanwhile.
    std::vector<uint8_t> scratch(size, kSentinel);
    auto out = std::make_shared<Outcome>();
    const client::ReadLater later = [out](Result<size_t> n, client::ReadPieces& got) {
      std::lock_guard<std::mutex> lock(out->mu);
      out->thread = std::this_thread::get_id();
      out->n = std::move(n);
      out->bytes = concat(got);
      out->called = true;
      out->cv.notify_all();
    };
    client::ReadPieces pieces;
    auto n = client_->read_pieces(a->ino, a->layout, a->size, 0, scratch, ctx.get(), &pieces, &later);
    *deferred = n.has_value() && pieces.deferred;
    std::pair<Result<size_t>, std::vector<uint8_t>> result{n, concat(pieces)};
    if (*deferred) {
      EXPECT_EQ(*n, 0u);
      EXPECT_TRUE(pieces.spans.empty() && pieces.pins.empty());
      std::unique_lock<std::mutex> lock(out->mu);
      EXPECT_TRUE(out->cv.wait_for(lock, 20s, [&] { return out->called; })) << "a deferred read was never answered";
      EXPECT_NE(out->thread, std::this_thread::get_id());
      result = {out->n, out->bytes};
    } else {
      EXPECT_FALSE(out->called) << "an answered read also called `later`";
    }
    EXPECT_TRUE(std::all_of(scratch.begin(), scratch.end(), [](uint8_t b) { return b == kSentinel; }))
        << "a read served by the open's fetch wrote into the scratch buffer";
    pieces.clear();
    EXPECT_TRUE(client_->release(a->ino).is_ok());
    return result;
  };

  int deferred_reads = 0;
  for (int i = 0; i < 12; ++i) {
    SCOPED_TRACE(i);
    const size_t size = (100u << 10) + 13 * i;
    const std::vector<uint8_t> data = testing::seeded_bytes(size, 40 + i);
    const std::string name = "deferred-" + std::to_string(i);
    const proto::InodeAttr created = write_closed(name, data);
    ASSERT_NE(created.ino.value, 0u);
    bool deferred = false;
    auto [n, got] = read_after_open(created, name, size, &deferred);
    deferred_reads += deferred ? 1 : 0;
    ASSERT_TRUE(n.has_value()) << n.error().to_string();
    EXPECT_EQ(*n, size);
    EXPECT_TRUE(got == data) << "the bytes differ";
  }
  // The fetch needs a round trip to a data server and its disk; the read is issued right after
  // the open sent it, so nearly every read here finds it in flight.
  EXPECT_GT(deferred_reads, 0) << "no read found its block in flight";

  // A fetch that fails (a damaged block: the re-read on the pool fails too) reaches the read.
  const size_t size = 40u << 10;
  const proto::InodeAttr created = write_closed("deferred-damaged", testing::seeded_bytes(size, 39));
  ASSERT_NE(created.ino.value, 0u);
  ASSERT_NO_FATAL_FAILURE(damage_first_chunk(created, 4096 + 3));
  bool deferred = false;
  auto [n, got] = read_after_open(created, "deferred-damaged", size, &deferred);
  ASSERT_FALSE(n.has_value());
  EXPECT_EQ(n.error().code(), Code::kCorrupt) << n.error().to_string();
  EXPECT_TRUE(got.empty());
}

// The fetch started at open checks the block sums itself; a failure goes the way of every read
// (re-read, then the server's verdict): the damaged block is kCorrupt, never cached data.
TEST_F(ClientReadTest, DamagedSmallFileFetchedDuringTheOpenIsCorrupt) {
  const size_t size = 40u << 10;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 14);
  const proto::InodeAttr created = write_closed("damaged-small", data);
  ASSERT_NE(created.ino.value, 0u);
  ASSERT_NO_FATAL_FAILURE(damage_first_chunk(created, 2 * 4096 + 10));
  ASSERT_TRUE(client_->lookup_entry(InodeId{1}, "damaged-small").has_value());
  auto a = client_->open(created.ino, O_RDONLY);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  auto ctx = client_->make_read_context(a->generation);
  std::vector<uint8_t> buf(size);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    auto r = client_->read(a->ino, a->layout, a->size, 0, buf, ctx.get());
    ASSERT_FALSE(r.has_value());
    EXPECT_EQ(r.error().code(), Code::kCorrupt) << r.error().to_string();
    EXPECT_NE(r.error().message().find("block 2 fails its checksum on target"), std::string::npos)
        << r.error().message();
  }
  EXPECT_TRUE(client_->release(a->ino).is_ok());
}

TEST_F(ClientReadTest, RandomMissesLandInScratchAndReadCopiesCachedPieces) {
  const size_t size = 8u << 20;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 2);
  const proto::InodeAttr a = make_file("rand", data);
  auto ctx = client_->make_read_context(a.generation);
  std::vector<uint8_t> scratch(128u << 10, kSentinel);
  client::ReadPieces pieces;
  // Not at 0 and not sequential: a random read that misses reads exactly its range directly.
  const uint64_t off = (5u << 20) + 4096;
  auto n = client_->read_pieces(a.ino, a.layout, a.size, off, scratch, ctx.get(), &pieces);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, scratch.size());
  ASSERT_EQ(pieces.spans.size(), 1u);
  EXPECT_EQ(pieces.spans[0].data(), scratch.data());
  EXPECT_TRUE(pieces.pins.empty());
  EXPECT_TRUE(std::equal(scratch.begin(), scratch.end(), data.begin() + static_cast<long>(off)));
  // read() (which copies pinned pieces into the caller's buffer) gives the same bytes as
  // read_pieces, whether the bytes come from the cache or not; past EOF is clipped.
  auto ctx2 = client_->make_read_context(a.generation);
  std::vector<uint8_t> buf((3u << 20) + 5);
  for (uint64_t o : {uint64_t{0}, uint64_t{3u << 20} + 5, uint64_t{6u << 20} + 7}) {
    SCOPED_TRACE(o);
    std::fill(buf.begin(), buf.end(), kSentinel);
    auto r = client_->read(a.ino, a.layout, a.size, o, buf, ctx2.get());
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    const size_t want = std::min<size_t>(buf.size(), size - o);
    ASSERT_EQ(*r, want);
    EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + static_cast<long>(want), data.begin() + static_cast<long>(o)));
  }
  auto eof = client_->read_pieces(a.ino, a.layout, a.size, size, scratch, ctx.get(), &pieces);
  ASSERT_TRUE(eof.has_value()) << eof.error().to_string();
  EXPECT_EQ(*eof, 0u);
  EXPECT_TRUE(pieces.spans.empty());
}

TEST_F(ClientReadTest, PinnedPiecesOutliveInvalidationAndOwnWritesAreReadFirst) {
  const size_t size = 2u << 20;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 3);
  const proto::InodeAttr a = make_file("pinned", data);
  auto ctx = client_->make_read_context(a.generation);
  std::vector<uint8_t> scratch(1u << 20, kSentinel);
  client::ReadPieces held;
  auto n = client_->read_pieces(a.ino, a.layout, a.size, 0, scratch, ctx.get(), &held);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, scratch.size());
  ASSERT_FALSE(held.pins.empty());
  // Our own write over the range: buffered (write-behind), invalidates the cached block. A read
  // drains it first and sees the new bytes; the pieces handed out before keep the old bytes alive
  // (under ASan a freed block would be a use-after-free here).
  const std::vector<uint8_t> fresh = testing::seeded_bytes(4096, 4);
  ASSERT_TRUE(client_->write(a.ino, a.layout, 8192, fresh).is_ok());
  client::ReadPieces now;
  std::vector<uint8_t> scratch2(16384, kSentinel);
  auto m = client_->read_pieces(a.ino, a.layout, a.size, 4096, scratch2, ctx.get(), &now);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  ASSERT_EQ(*m, scratch2.size());
  const std::vector<uint8_t> got = concat(now);
  EXPECT_TRUE(std::equal(fresh.begin(), fresh.end(), got.begin() + 4096)) << "own write not visible";
  EXPECT_TRUE(std::equal(got.begin(), got.begin() + 4096, data.begin() + 4096));
  const std::vector<uint8_t> old = concat(held);
  EXPECT_TRUE(std::equal(old.begin(), old.end(), data.begin())) << "pinned bytes changed";
  held.clear();
  EXPECT_TRUE(held.pins.empty());
  EXPECT_TRUE(client_->release(a.ino).is_ok());
}

// Writes whose bytes come from a pipe (a FUSE WRITE spliced by the kernel: penstock-mount with
// --splice-writes) go through write-behind as memory ones do: pieces of 256 KiB, across chunk
// boundaries, read back exact after the close. A pipe that ends early fails that write with kIo;
// the bytes it gave are written, and the file's size covers them.
TEST_F(ClientReadTest, WritesFromAPipeAreGatheredAndReadBackExact) {
  const proto::Caller root{0, 0};
  auto f = client_->create(InodeId{1}, "from-pipe", S_IFREG | 0644, root);
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  constexpr size_t kPiece = 256u << 10;
  const std::vector<uint8_t> data = testing::seeded_bytes(5 * (1u << 20) + 3 * kPiece + 123, 31);
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  ASSERT_GE(fcntl(fds[1], F_SETPIPE_SZ, static_cast<int>(kPiece)), static_cast<int>(kPiece));
  for (size_t off = 0; off < data.size(); off += kPiece) {
    const size_t n = std::min(kPiece, data.size() - off);
    ASSERT_EQ(write(fds[1], data.data() + off, n), static_cast<ssize_t>(n));
    client::WriteSource src(fds[0], n);
    ASSERT_TRUE(client_->write(f->ino, f->layout, off, src).is_ok()) << off;
    EXPECT_EQ(src.taken(), n);
  }
  // The last piece: the pipe holds 1000 of its 4096 bytes and its write end is closed.
  const std::vector<uint8_t> tail = testing::seeded_bytes(1000, 32);
  ASSERT_EQ(write(fds[1], tail.data(), tail.size()), static_cast<ssize_t>(tail.size()));
  close(fds[1]);
  client::WriteSource short_src(fds[0], 4096);
  const Status st = client_->write(f->ino, f->layout, data.size(), short_src);
  close(fds[0]);
  EXPECT_EQ(st.code(), Code::kIo) << st.to_string();
  EXPECT_NE(st.message().find("the pipe ended early"), std::string::npos) << st.message();
  ASSERT_TRUE(client_->release(f->ino).is_ok());
  auto a = client_->open(f->ino, O_RDONLY);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  // The short piece was taken in one go (it fits the chunk), so nothing of it counts.
  ASSERT_EQ(a->size, data.size());
  std::vector<uint8_t> got(data.size());
  auto n = client_->read(a->ino, a->layout, a->size, 0, got, nullptr);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  ASSERT_EQ(*n, data.size());
  EXPECT_TRUE(got == data);
  EXPECT_TRUE(client_->release(a->ino).is_ok());
}

// A data server sends block-aligned reads unread (spliced from its page cache) and the client
// checks them against the block checksums it got with them; other reads the server verifies. A
// byte damaged on disk is kCorrupt either way (after two failed client checks the client asks the
// server to verify), and the undamaged blocks around it still read.
TEST_F(ClientReadTest, DamagedChunkIsCorruptWhoeverVerifies) {
  const size_t size = 64u << 10;
  const std::vector<uint8_t> data = testing::seeded_bytes(size, 7);
  const proto::InodeAttr a = make_file("damaged", data);
  ASSERT_NO_FATAL_FAILURE(damage_first_chunk(a, 2 * 4096 + 10));
  std::vector<uint8_t> buf(size);
  auto aligned = client_->read(a.ino, a.layout, a.size, 0, buf, nullptr);
  ASSERT_FALSE(aligned.has_value());
  EXPECT_EQ(aligned.error().code(), Code::kCorrupt);
  // Two client-verified reads fail; the third, verified by the server, is its verdict.
  EXPECT_NE(aligned.error().message().find("block 2 fails its checksum on target"), std::string::npos)
      << aligned.error().message();
  auto unaligned = client_->read(a.ino, a.layout, a.size, 2 * 4096 + 1, std::span<uint8_t>(buf).first(100), nullptr);
  ASSERT_FALSE(unaligned.has_value());
  EXPECT_EQ(unaligned.error().code(), Code::kCorrupt) << unaligned.error().to_string();
  for (auto [off, len] : {std::pair<uint64_t, size_t>{0, 8192}, {3 * 4096, 4096}, {3 * 4096 + 7, 500}}) {
    std::span<uint8_t> part = std::span<uint8_t>(buf).first(len);
    auto r = client_->read(a.ino, a.layout, a.size, off, part, nullptr);
    ASSERT_TRUE(r.has_value()) << off << ": " << r.error().to_string();
    ASSERT_EQ(*r, len);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), data.begin() + static_cast<ptrdiff_t>(off))) << off;
  }
  EXPECT_TRUE(client_->release(a.ino).is_ok());
}

// A write-behind error belongs to the writer's close: releasing a read-only handle of the same
// file (FOPEN_NOFLUSH in the mount) neither waits for the buffered bytes nor takes their error.
TEST_F(ClientReadTest, ReadOnlyReleaseLeavesTheWriteErrorToTheWriter) {
  const proto::Caller root{0, 0};
  auto attr = client_->create(InodeId{1}, "lost", S_IFREG | 0644, root);
  ASSERT_TRUE(attr.has_value()) << attr.error().to_string();
  ASSERT_TRUE(client_->open(attr->ino, 0).has_value());  // a second, read-only handle
  cluster_.stop_data_servers();
  const std::vector<uint8_t> data = testing::seeded_bytes(1u << 20, 9);
  Status w = client_->write(attr->ino, attr->layout, 0, data);  // buffered, or failing at once
  EXPECT_TRUE(client_->release(attr->ino, /*flush_writes=*/false).is_ok());
  Status f = client_->flush(attr->ino);
  EXPECT_FALSE(w.is_ok() && f.is_ok()) << "the writer never saw the failed write";
  if (w.is_ok()) {
    EXPECT_FALSE(f.is_ok()) << "the read-only release took the writer's error";
  }
}


// Linux errseq semantics across handles: a send that fails is reported by every handle open at the
// time (not only by the one whose close came first), each once; a handle opened after it was
// reported does not see it.
TEST_F(ClientReadTest, AWriteErrorReachesEveryHandleOpenAtTheFailureOnce) {
  const proto::Caller root{0, 0};
  auto attr = client_->create(InodeId{1}, "shared", S_IFREG | 0644, root);
  ASSERT_TRUE(attr.has_value()) << attr.error().to_string();
  client::WriteCursor a = client_->write_cursor(attr->ino);
  client::WriteCursor b = client_->write_cursor(attr->ino);
  cluster_.stop_data_servers();
  const std::vector<uint8_t> data = testing::seeded_bytes(1u << 20, 9);
  ASSERT_TRUE(client_->write(attr->ino, attr->layout, 0, data, &a).is_ok()) << "expected a buffered write";
  EXPECT_FALSE(client_->flush(attr->ino, &b).is_ok()) << "b was open when a's bytes were lost";
  client::WriteCursor c = client_->write_cursor(attr->ino);  // opened after b reported it
  EXPECT_FALSE(client_->flush(attr->ino, &a).is_ok()) << "the writer's own close must report it too";
  EXPECT_TRUE(client_->flush(attr->ino, &a).is_ok()) << "reported twice to one handle";
  EXPECT_TRUE(client_->flush(attr->ino, &c).is_ok()) << "reported to a handle opened afterwards";
  EXPECT_TRUE(client_->flush(attr->ino).is_ok()) << "reported again to a caller without a handle";
}

// security.capability, which the kernel asks for before every write(): its absence is remembered
// for the ttl (a second host's setcap shows after it), this client's own set is seen at once,
// other names are never remembered, and a file this client creates is known to have none.
TEST(ClientXattrTest, CapabilityAbsenceIsRememberedForTheTtlOnly) {
  testing::InProcessCluster cluster;
  testing::InProcessClusterOptions o;
  o.temp_prefix = "penstock-client-xattr";
  o.client.transport = net::TransportKind::kTcp;
  o.client.absent_xattr_ttl = std::chrono::milliseconds(300);
  ASSERT_TRUE(cluster.start(o));
  client::Client& c1 = cluster.client();
  client::ClientOptions o2 = o.client;
  o2.meta_address = cluster.meta_address();
  auto c2 = client::Client::connect(o2);
  ASSERT_TRUE(c2.has_value()) << c2.error().to_string();
  const proto::Caller root{0, 0};
  auto f = c1.create(InodeId{1}, "bin", S_IFREG | 0755, root);
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  const InodeId ino = f->ino;
  const std::string caps = "security.capability";

  EXPECT_EQ(c1.getxattr(ino, caps).status().code(), Code::kNoData);
  ASSERT_TRUE((*c2)->setxattr(ino, caps, "v1", 0).is_ok());
  EXPECT_EQ(c1.getxattr(ino, caps).status().code(), Code::kNoData) << "the absence was not remembered";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  auto v = c1.getxattr(ino, caps);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(*v, "v1");

  ASSERT_TRUE(c1.removexattr(ino, caps).is_ok());
  EXPECT_EQ(c1.getxattr(ino, caps).status().code(), Code::kNoData);
  ASSERT_TRUE(c1.setxattr(ino, caps, "v2", 0).is_ok());
  v = c1.getxattr(ino, caps);
  ASSERT_TRUE(v.has_value()) << "own set hidden by the remembered absence: " << v.error().to_string();
  EXPECT_EQ(*v, "v2");

  EXPECT_EQ(c1.getxattr(ino, "user.tag").status().code(), Code::kNoData);
  ASSERT_TRUE((*c2)->setxattr(ino, "user.tag", "t", 0).is_ok());
  v = c1.getxattr(ino, "user.tag");
  ASSERT_TRUE(v.has_value()) << "an ordinary xattr was cached: " << v.error().to_string();
  EXPECT_EQ(*v, "t");

  // A file this client creates has no xattrs: the question before its first write() is answered
  // without a meta call (the absence is known from the create, for the ttl like any other).
  auto g = c1.create(InodeId{1}, "fresh", S_IFREG | 0644, root);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  ASSERT_TRUE((*c2)->setxattr(g->ino, caps, "v0", 0).is_ok());
  EXPECT_EQ(c1.getxattr(g->ino, caps).status().code(), Code::kNoData) << "the create did not note the absence";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  v = c1.getxattr(g->ino, caps);
  ASSERT_TRUE(v.has_value()) << v.error().to_string();
  EXPECT_EQ(*v, "v0");
  c2->reset();
}

// close() reports the size without waiting for a WAL sync at the meta server; fsync() waits for
// one, also when a close already reported and nothing is left to report (SyncLog). The same for
// a create, and fsyncdir's sync_namespace syncs. The data
// servers heartbeat rarely here: each heartbeat is a synced mutation of its own.
TEST(ClientDurabilityTest, CloseReportsWithoutASyncAndFsyncWaitsForOne) {
  testing::InProcessCluster cluster;
  testing::InProcessClusterOptions o;
  o.temp_prefix = "penstock-client-durability";
  o.client.transport = net::TransportKind::kTcp;
  o.data_heartbeat = std::chrono::milliseconds(60000);
  ASSERT_TRUE(cluster.start(o));
  client::Client& c = cluster.client();
  const proto::Caller root{0, 0};
  auto f = c.create(InodeId{1}, "reported", S_IFREG | 0644, root);
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  const std::vector<uint8_t> data = testing::seeded_bytes(5000, 19);
  ASSERT_TRUE(c.write(f->ino, f->layout, 0, data).is_ok());
  const uint64_t before = cluster.meta_store().syncs();
  ASSERT_TRUE(c.flush(f->ino).is_ok());  // close()
  EXPECT_EQ(cluster.meta_store().syncs(), before) << "close's size report waited for a sync";
  auto seen = c.getattr(f->ino);
  ASSERT_TRUE(seen.has_value()) << seen.error().to_string();
  EXPECT_EQ(seen->size, data.size());
  ASSERT_TRUE(c.fsync(f->ino, f->layout).is_ok());
  EXPECT_GT(cluster.meta_store().syncs(), before) << "fsync after a close did not sync the meta server";
  ASSERT_TRUE(c.release(f->ino).is_ok());

  // A create is answered before the meta server's WAL sync (its number batch is synced: the
  // first create above took care of that); fsync of the new, unwritten file syncs, and so does
  // sync_namespace (fsyncdir).
  const uint64_t before_create = cluster.meta_store().syncs();
  auto g = c.create(InodeId{1}, "created", S_IFREG | 0644, root);
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_EQ(cluster.meta_store().syncs(), before_create) << "a create waited for a sync";
  ASSERT_TRUE(c.fsync(g->ino, g->layout).is_ok());
  EXPECT_GT(cluster.meta_store().syncs(), before_create) << "fsync of a new file did not sync its create";
  ASSERT_TRUE(c.release(g->ino).is_ok());
  const uint64_t before_dirsync = cluster.meta_store().syncs();
  ASSERT_TRUE(c.sync_namespace().is_ok());
  EXPECT_GT(cluster.meta_store().syncs(), before_dirsync) << "sync_namespace did not sync";
}

// Client A creates behind a directory lease (client/lib/create_behind.h); B, an ordinary client,
// waits at its first look until A's lease is over and then sees every file with the number A gave
// it; A's files created behind get their chains from the server at first use.
TEST_F(ClientReadTest, FilesCreatedBehindALeaseAreAppliedInOrderAndSeenByAnotherClient) {
  const proto::Caller root{0, 0};
  client::ClientOptions oa;
  oa.meta_address = cluster_.meta_address();
  oa.transport = net::TransportKind::kTcp;
  oa.call_timeout = 60s;
  oa.create_behind = true;
  oa.create_behind_options.creates_before_lease = 4;
  auto a = client::Client::connect(oa);
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  client::Client& ca = **a;
  auto dir = ca.mkdir(InodeId{1}, "many", S_IFDIR | 0755, root);
  ASSERT_TRUE(dir.has_value()) << dir.error().to_string();
  std::vector<proto::InodeAttr> made;
  for (int i = 0; i < 300; ++i) {
    auto f = ca.create(dir->ino, "f" + std::to_string(i), S_IFREG | 0644, root);
    ASSERT_TRUE(f.has_value()) << i << ": " << f.error().to_string();
    made.push_back(*f);
    ASSERT_TRUE(ca.release(f->ino).is_ok());
  }
  EXPECT_EQ(ca.lookup_entry(dir->ino, "nope").status().code(), Code::kNotFound);
  const client::CreateBehindStats st = ca.create_behind_stats();
  EXPECT_EQ(st.leases, 1u);
  EXPECT_GE(st.created, 290u) << "after the first few, creates are answered by the client";
  EXPECT_GE(st.absent, 1u);
  ASSERT_TRUE(made.back().layout.chains.empty()) << "the last one was created behind";
  // A's own write to a file created behind: its chains come with the server's answer.
  auto layout = ca.created_layout(made.back().ino);
  ASSERT_TRUE(layout.has_value()) << layout.error().to_string();
  ASSERT_FALSE(layout->chains.empty());
  const std::vector<uint8_t> data(1000, 0x5a);
  ASSERT_TRUE(ca.write(made.back().ino, *layout, 0, data).is_ok());
  ASSERT_TRUE(ca.flush(made.back().ino).is_ok());
  // B: its first look (as a FUSE lookup, which asks for an open ticket too) waits until A's lease
  // is over, then sees all 300 with A's numbers.
  auto last_entry = client_->lookup_entry(dir->ino, "f299", /*caller=*/77);
  ASSERT_TRUE(last_entry.has_value()) << last_entry.error().to_string();
  const proto::InodeAttr* last = &last_entry->attr;
  EXPECT_EQ(last->ino, made.back().ino);
  EXPECT_EQ(last->size, data.size());
  EXPECT_TRUE(last_entry->opened);
  auto listed = client_->readdir(dir->ino, "", 1000, false);
  ASSERT_TRUE(listed.has_value()) << listed.error().to_string();
  EXPECT_EQ(listed->entries.size(), 300u);
  // Both go on: B's create is seen by A, whose lease is over.
  ASSERT_TRUE(client_->create(dir->ino, "fromB", S_IFREG | 0644, root).has_value());
  EXPECT_TRUE(ca.lookup(dir->ino, "fromB").has_value());
  EXPECT_EQ(ca.create_behind_stats().failed, 0u);
  a->reset();
}

// rmdir and rename of a directory another client looked up wait until its entry lease ends (about
// a second). They run on penstock-meta's waiting pool: more of them at once than the server has
// workers must not hold up a create, which finishes while every one of them still waits.
TEST_F(ClientReadTest, RenamesWaitingOutLeasesDoNotHoldUpCreates) {
  constexpr int kRenames = 8;  // twice the in-process meta server's workers
  const proto::Caller root{0, 0};
  auto c2 = second_client();
  ASSERT_NE(c2, nullptr);
  for (int i = 0; i < kRenames; ++i) {
    const std::string name = "leased-" + std::to_string(i);
    ASSERT_TRUE(client_->mkdir(InodeId{1}, name, S_IFDIR | 0755, root).has_value());
    auto e = c2->lookup_entry(InodeId{1}, name);  // the second client now holds a lease on it
    ASSERT_TRUE(e.has_value()) << e.error().to_string();
    ASSERT_GT(e->trust_s, 0.0) << "no lease granted: the renames below would not wait";
  }
  std::atomic<int> renamed{0};
  std::vector<std::thread> renames;
  for (int i = 0; i < kRenames; ++i) {
    renames.emplace_back([&, i] {
      const std::string name = "leased-" + std::to_string(i);
      EXPECT_TRUE(client_->rename(InodeId{1}, name, InodeId{1}, "moved-" + std::to_string(i), 0).is_ok());
      renamed.fetch_add(1);
    });
  }
  std::this_thread::sleep_for(100ms);  // every rename has reached the server and waits
  auto f = client_->create(InodeId{1}, "not-held-up", S_IFREG | 0644, root);
  const int renamed_when_created = renamed.load();
  ASSERT_TRUE(f.has_value()) << f.error().to_string();
  EXPECT_EQ(renamed_when_created, 0) << "the create waited for renames that wait out leases";
  for (auto& t : renames) t.join();
  EXPECT_EQ(renamed.load(), kRenames);
  for (int i = 0; i < kRenames; ++i) {
    EXPECT_TRUE(client_->lookup(InodeId{1}, "moved-" + std::to_string(i)).has_value()) << i;
  }
  c2.reset();
}

// A change whose reply a restart of penstock-meta lost is sent again with its reply slot and
// number, and the restarted server answers it from the reply it stored with the change instead of
// running it again. Here an rmdir waits out another client's entry lease at the server when the
// server stops: it is applied as the server finishes its handlers, and its reply goes nowhere.
// Sent again as a new rmdir it would fail (the directory is gone); not sent again at all, EIO.
class ClientReplayTest : public ClientReadTest {
 protected:
  void adjust(testing::InProcessClusterOptions& o) override {
    // The server's lease waits say when they start (then sleep as usual).
    o.adjust_meta = [this](meta::MetaOptions& mo) {
      mo.entry_leases.sleep_until = [this](int64_t until_ns) {
        lease_waits_.fetch_add(1);
        const int64_t left = until_ns - meta::steady_now_ns();
        if (left > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(left));
      };
    };
  }
  std::atomic<int> lease_waits_{0};
};

// A mount against an older penstock-meta (meta_server.h, Envelopes): round 22's answers Replay but
// not ReplayInline, round 21's neither. Each envelope it lacks is answered kNotSupported once, and
// from then on the changes (and a close's size report) go as themselves: all of them still apply,
// once. Twice each, so both the first send (which finds out) and a later one are covered.
class ClientAgainstOlderMetaTest : public ClientReadTest, public ::testing::WithParamInterface<meta::Envelopes> {
 protected:
  void adjust(testing::InProcessClusterOptions& o) override { o.meta_envelopes = GetParam(); }
};

TEST_P(ClientAgainstOlderMetaTest, ChangesAndCloseReportsGoAsThemselvesAndApplyOnce) {
  const proto::Caller root{0, 0};
  auto dir = client_->mkdir(InodeId{1}, "older", S_IFDIR | 0755, root);
  ASSERT_TRUE(dir.has_value()) << dir.error().to_string();
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const std::string name = "f" + std::to_string(i);
    auto f = client_->create(dir->ino, name, S_IFREG | 0644, root);
    ASSERT_TRUE(f.has_value()) << f.error().to_string();
    const std::vector<uint8_t> data = testing::seeded_bytes((300u << 10) + 11 * i, 60 + i);
    ASSERT_TRUE(client_->write(f->ino, f->layout, 0, data).is_ok());
    Status closed = client_->release(f->ino);  // the size report goes at the close
    ASSERT_TRUE(closed.is_ok()) << closed.to_string();
    auto attr = client_->getattr(f->ino);
    ASSERT_TRUE(attr.has_value()) << attr.error().to_string();
    EXPECT_EQ(attr->size, data.size()) << "the close's size report did not arrive";
    std::vector<uint8_t> back(data.size());
    auto n = client_->read(f->ino, f->layout, attr->size, 0, back);
    ASSERT_TRUE(n.has_value()) << n.error().to_string();
    EXPECT_EQ(*n, data.size());
    EXPECT_TRUE(back == data);
    Status renamed = client_->rename(dir->ino, name, dir->ino, "g" + std::to_string(i), 0);
    ASSERT_TRUE(renamed.is_ok()) << renamed.to_string();
  }
  for (int i = 0; i < 2; ++i) {
    Status gone = client_->unlink(dir->ino, "g" + std::to_string(i));
    EXPECT_TRUE(gone.is_ok()) << gone.to_string();
  }
  Status removed = client_->rmdir(InodeId{1}, "older");
  ASSERT_TRUE(removed.is_ok()) << removed.to_string();
  EXPECT_EQ(client_->lookup_entry(InodeId{1}, "older").status().code(), Code::kNotFound);
}

INSTANTIATE_TEST_SUITE_P(OlderServers, ClientAgainstOlderMetaTest,
                         ::testing::Values(meta::Envelopes::kNoInline, meta::Envelopes::kNone),
                         [](const ::testing::TestParamInfo<meta::Envelopes>& p) {
                           return p.param == meta::Envelopes::kNone ? std::string("WithoutReplay")
                                                                    : std::string("WithoutReplayInline");
                         });

TEST_F(ClientReplayTest, AChangeWhoseReplyARestartLostIsAnsweredOnce) {
  const proto::Caller root{0, 0};
  auto c2 = second_client();
  ASSERT_NE(c2, nullptr);
  ASSERT_TRUE(client_->mkdir(InodeId{1}, "victim", S_IFDIR | 0755, root).has_value());
  auto e = c2->lookup_entry(InodeId{1}, "victim");  // the second client now holds a lease on it
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  ASSERT_GT(e->trust_s, 0.0) << "no lease granted: the rmdir below would not wait";
  Status removed(Code::kInternal, "the rmdir did not return");
  std::thread rmdir([&] { removed = client_->rmdir(InodeId{1}, "victim"); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (lease_waits_.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  ASSERT_GT(lease_waits_.load(), 0) << "the rmdir never waited at the server";
  ASSERT_TRUE(cluster_.restart_meta());
  rmdir.join();
  EXPECT_TRUE(removed.is_ok()) << removed.to_string();
  EXPECT_EQ(cluster_.meta_service().replies_repeated(), 1u) << "the restarted server did not answer from the stored reply";
  auto gone = client_->lookup(InodeId{1}, "victim");
  ASSERT_FALSE(gone.has_value());
  EXPECT_EQ(gone.error().code(), Code::kNotFound) << gone.error().to_string();
  // Changes after the restart go on in the same slots with higher numbers.
  EXPECT_TRUE(client_->mkdir(InodeId{1}, "victim", S_IFDIR | 0755, root).has_value());
  EXPECT_TRUE(client_->rmdir(InodeId{1}, "victim").is_ok());
  c2.reset();
}

// Shuts down (SHUT_RDWR) every TCP connection this process accepted on `port`: its peers see the
// server go away (FIN) after it read what they sent, as when penstock-meta crashes or stops to
// open its database again (server/meta/main.cc) with a call in hand.
// Returns how many it shut.
int cut_connections_accepted_on(uint16_t port) {
  int cut = 0;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    int fd = -1;
    try {
      fd = std::stoi(e.path().filename().string());
    } catch (const std::exception&) {
      continue;
    }
    sockaddr_in local{}, peer{};
    socklen_t n = sizeof local, m = sizeof peer;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n) != 0 || local.sin_family != AF_INET) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &m) != 0) continue;  // the listener
    if (ntohs(local.sin_port) == port && shutdown(fd, SHUT_RDWR) == 0) ++cut;
  }
  return cut;
}

// An Open whose connection is lost after the server read it is sent again instead of failing the
// open (EIO); a repeat can count it once too often, never once too few (client.cc,
// kRepeatMayCountTwice).
class ClientLostOpenTest : public ClientReadTest {
 protected:
  void adjust(testing::InProcessClusterOptions& o) override {
    o.adjust_meta = [this](meta::MetaOptions& mo) {
      mo.on_open = [this] {
        if (!cut_next_.exchange(false)) return;
        cuts_.fetch_add(cut_connections_accepted_on(meta_port_.load()));
      };
    };
  }
  std::atomic<bool> cut_next_{false};
  std::atomic<uint16_t> meta_port_{0};
  std::atomic<int> cuts_{0};
};

TEST_F(ClientLostOpenTest, AnOpenWhoseConnectionIsLostAfterTheServerReadItIsSentAgain) {
  const std::vector<uint8_t> data = testing::seeded_bytes(200000, 71);
  const proto::InodeAttr f = write_closed("opened-again", data);
  ASSERT_NE(f.ino.value, 0u);
  auto endpoint = net::Endpoint::parse(cluster_.meta_address());
  ASSERT_TRUE(endpoint.has_value());
  meta_port_.store(endpoint->port);
  cut_next_.store(true);
  auto opened = client_->open(f.ino, O_RDONLY);
  EXPECT_GE(cuts_.load(), 1) << "the Open never reached the server, or no connection was cut";
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  EXPECT_EQ(opened->size, data.size());
  std::vector<uint8_t> back(data.size());
  auto n = client_->read(f.ino, opened->layout, opened->size, 0, back);
  ASSERT_TRUE(n.has_value()) << n.error().to_string();
  EXPECT_EQ(*n, data.size());
  EXPECT_TRUE(back == data);
  EXPECT_TRUE(client_->release(f.ino).is_ok());
}

// What penstock-meta does with Replay requests from the wire: it answers a repeat with the bytes it
// answered first and runs nothing else than a change of the matching pool, saying what is wrong.
TEST_F(ClientReadTest, PenstockMetaAnswersARepeatedReplayWithTheSameBytes) {
  namespace pm = proto::meta;
  net::IoRuntime runtime(1);
  auto endpoint = net::Endpoint::parse(cluster_.meta_address());
  ASSERT_TRUE(endpoint.has_value());
  rpc::RpcClient meta(net::make_tcp_channel(runtime, *endpoint, net::TcpOptions{1000ms, 1}), 10s);
  auto reg = meta.call<pm::RegisterSession>(pm::RegisterSessionReq{"replay-test", "localhost"});
  ASSERT_TRUE(reg.has_value()) << reg.error().to_string();
  const SessionId sess = reg->session;
  const std::string mkdir_raw = proto::encode(pm::MkdirReq{InodeId{1}, "raw", 0755, proto::Caller{0, 0}, sess});
  const pm::ReplayReq first{sess, 5, 1, pm::Mkdir::kId, mkdir_raw};
  auto made = meta.call<pm::Replay>(first);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  auto again = meta.call<pm::Replay>(first);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  EXPECT_EQ(again->message, made->message);
  auto attr = proto::decode<pm::AttrResp>(proto::bytes_of(made->message));
  ASSERT_TRUE(attr.has_value()) << attr.error().to_string();
  auto found = client_->lookup(InodeId{1}, "raw");
  ASSERT_TRUE(found.has_value()) << found.error().to_string();
  EXPECT_EQ(found->ino, attr->attr.ino);

  auto code_of = [](const auto& r) { return r.has_value() ? Code::kOk : r.error().code(); };
  // The same number with another request runs nothing; the same slot's next number runs (and
  // fails: the name exists); an older number runs nothing.
  const std::string other_raw = proto::encode(pm::MkdirReq{InodeId{1}, "other", 0755, proto::Caller{0, 0}, sess});
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 5, 1, pm::Mkdir::kId, other_raw})), Code::kInvalid);
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 5, 2, pm::Mkdir::kId, mkdir_raw})), Code::kExists);
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 5, 0, pm::Mkdir::kId, mkdir_raw})), Code::kInvalid);
  // Not a change, a change of the other pool, an undecodable change, an unknown session.
  const std::string lookup_raw = proto::encode(pm::LookupReq{InodeId{1}, "raw", sess});
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 6, 1, pm::Lookup::kId, lookup_raw})), Code::kInvalid);
  EXPECT_EQ(code_of(meta.call<pm::ReplayWaiting>(pm::ReplayReq{sess, 6, 1, pm::Mkdir::kId, mkdir_raw})), Code::kInvalid);
  const std::string rmdir_raw = proto::encode(pm::NameReq{InodeId{1}, "raw", sess});
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 6, 1, pm::Rmdir::kId, rmdir_raw})), Code::kInvalid);
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 6, 1, pm::Mkdir::kId, "\x01\x02"})), Code::kProtocol);
  const std::string never_raw = proto::encode(pm::MkdirReq{InodeId{1}, "never", 0755, proto::Caller{0, 0}, sess});
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{SessionId(1u << 30), 0, 1, pm::Mkdir::kId, never_raw})),
            Code::kBadHandle);
  EXPECT_FALSE(client_->lookup(InodeId{1}, "never").has_value());
  // The directory is still there once, and the rmdir of the right pool removes it.
  EXPECT_TRUE(client_->lookup(InodeId{1}, "raw").has_value());
  auto removed = meta.call<pm::ReplayWaiting>(pm::ReplayReq{sess, 6, 2, pm::Rmdir::kId, rmdir_raw});
  EXPECT_TRUE(removed.has_value()) << removed.error().to_string();
  EXPECT_FALSE(client_->lookup(InodeId{1}, "raw").has_value());

  // A close's size report comes in ReplayInline (answered on the I/O thread), not in Replay.
  auto file = client_->create(InodeId{1}, "reported", 0644, proto::Caller{0, 0});
  ASSERT_TRUE(file.has_value()) << file.error().to_string();
  const std::string report_raw = proto::encode(pm::ReportSizeReq{file->ino, 12345, 1});
  EXPECT_EQ(code_of(meta.call<pm::Replay>(pm::ReplayReq{sess, 7, 1, pm::ReportSizeAtClose::kId, report_raw})),
            Code::kInvalid);
  const pm::ReplayReq report{sess, 7, 1, pm::ReportSizeAtClose::kId, report_raw};
  auto reported = meta.call<pm::ReplayInline>(report);
  ASSERT_TRUE(reported.has_value()) << reported.error().to_string();
  auto reported_again = meta.call<pm::ReplayInline>(report);
  ASSERT_TRUE(reported_again.has_value()) << reported_again.error().to_string();
  EXPECT_EQ(reported_again->message, reported->message);
  auto size = client_->getattr(file->ino);
  ASSERT_TRUE(size.has_value()) << size.error().to_string();
  EXPECT_EQ(size->size, 12345u);
}

}  // namespace
}  // namespace penstock
