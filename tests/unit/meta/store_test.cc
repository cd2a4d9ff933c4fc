#include <filesystem>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include "server/meta/cached_store.h"
#include "server/meta/rocksdb_store.h"
#include "server/meta/schema.h"
#include "server/meta/store.h"
#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

using testing::MemoryBackend;
using testing::CachedRocksBackend;
using testing::RocksBackend;

template <class B>
class StoreTest : public ::testing::Test {
 protected:
  B backend_;
  std::shared_ptr<Store> store_ = backend_.open();
};

using Backends = ::testing::Types<MemoryBackend, RocksBackend, CachedRocksBackend>;
TYPED_TEST_SUITE(StoreTest, Backends);

std::vector<std::string> scan_keys(Store& s, std::string_view prefix, std::string_view seek, size_t limit = SIZE_MAX) {
  std::vector<std::string> out;
  Status st = s.scan(prefix, seek, [&](std::string_view k, std::string_view) {
    out.emplace_back(k);
    return out.size() < limit;
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  return out;
}

TYPED_TEST(StoreTest, GetPutDelete) {
  auto& s = *this->store_;
  auto v = s.get("a");
  ASSERT_TRUE(v.has_value());
  EXPECT_FALSE(v->has_value());
  WriteBatch b;
  b.put("a", "1");
  b.put("b", std::string("x\0y", 3));
  ASSERT_OK(s.write(b));
  EXPECT_EQ(**s.get("a"), "1");
  EXPECT_EQ(**s.get("b"), std::string("x\0y", 3));
  WriteBatch d;
  d.del("a");
  d.put("b", "2");
  d.del("missing");
  ASSERT_OK(s.write(d));
  EXPECT_FALSE(s.get("a")->has_value());
  EXPECT_EQ(**s.get("b"), "2");
}

TYPED_TEST(StoreTest, LaterOperationInBatchWins) {
  auto& s = *this->store_;
  WriteBatch b;
  b.put("k", "1");
  b.del("k");
  b.put("j", "1");
  b.put("j", "2");
  ASSERT_OK(s.write(b));
  EXPECT_FALSE(s.get("k")->has_value());
  EXPECT_EQ(**s.get("j"), "2");
}

TYPED_TEST(StoreTest, ScanStaysInPrefixInOrderFromSeek) {
  auto& s = *this->store_;
  WriteBatch b;
  for (const char* k : {"a/1", "d/a", "d/b", "d/c", "d0", "e/1", "d/", "d/bb"}) b.put(k, "v");
  ASSERT_OK(s.write(b));
  EXPECT_EQ(scan_keys(s, "d/", ""), (std::vector<std::string>{"d/", "d/a", "d/b", "d/bb", "d/c"}));
  EXPECT_EQ(scan_keys(s, "d/", "d/b"), (std::vector<std::string>{"d/b", "d/bb", "d/c"}));
  EXPECT_EQ(scan_keys(s, "d/", "d/ba"), (std::vector<std::string>{"d/bb", "d/c"}));
  EXPECT_EQ(scan_keys(s, "d/", "d/", 2), (std::vector<std::string>{"d/", "d/a"}));
  EXPECT_TRUE(scan_keys(s, "z/", "").empty());
  EXPECT_TRUE(scan_keys(s, "d/", "d/d").empty());
}

TYPED_TEST(StoreTest, ScanOverManyEntriesAllowsReentrantGets) {
  auto& s = *this->store_;
  WriteBatch b;
  for (int i = 0; i < 1000; ++i) b.put(schema::key1("p/", static_cast<uint64_t>(i)), std::to_string(i));
  ASSERT_OK(s.write(b));
  uint64_t expect = 0;
  Status st = s.scan("p/", "", [&](std::string_view k, std::string_view v) {
    EXPECT_EQ(schema::read_be64(k.substr(2)), expect);
    auto again = s.get(k);  // the callback may read the same store
    EXPECT_TRUE(again.has_value() && again->has_value() && **again == v);
    ++expect;
    return true;
  });
  ASSERT_OK(st);
  EXPECT_EQ(expect, 1000u);
}

TEST(RocksDbStoreTest, SecondOpenOfSameDirectorySaysWhoHoldsTheLock) {
  testing::TempDir dir;
  auto first = RocksDbStore::open(dir.path() + "/db");
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  auto second = RocksDbStore::open(dir.path() + "/db");
  ASSERT_FALSE(second.has_value());
  EXPECT_EQ(second.error().code(), Code::kBusy);
  EXPECT_NE(second.error().message().find("another penstock-meta holds the lock"), std::string::npos)
      << second.error().message();
  EXPECT_NE(second.error().message().find("--db"), std::string::npos);
}

TEST(RocksDbStoreTest, UnopenableDirectoryIsAClearError) {
  testing::TempDir dir;
  std::string file = dir.path() + "/not-a-dir";
  WriteBatch b;
  {
    FILE* f = fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fclose(f);
  }
  auto s = RocksDbStore::open(file + "/db");
  ASSERT_FALSE(s.has_value());
  EXPECT_NE(s.error().message().find("cannot open the metadata database"), std::string::npos) << s.error().message();
}

TEST(RocksDbStoreTest, EveryWriteIsSyncedByDefault) {
  // penstock-meta opens its store with default options: acknowledged writes must survive kill -9.
  EXPECT_TRUE(RocksDbOptions{}.sync);
}

// Opens a RocksDbStore at `path`, writes k=v (synced) and closes it.
void write_k_and_close(const std::string& path) {
  auto s = RocksDbStore::open(path);
  ASSERT_TRUE(s.has_value());
  WriteBatch b;
  b.put("k", "v");
  ASSERT_OK((*s)->write(b));
}

TEST(RocksDbStoreTest, WritesSurviveReopen) {
  testing::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(write_k_and_close(dir.path() + "/db"));
  auto s = RocksDbStore::open(dir.path() + "/db");
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(**(*s)->get("k"), "v");
}

// RocksDB's messages go to penstock-meta's log, never to a LOG file of its own in the database
// directory: on a full disk that file's writer fails and RocksDB's next message trips an assertion
// (Debian's librocksdb keeps them), which aborted the daemon (tests/integration/full_disk_test.cc).
TEST(RocksDbStoreTest, RocksDbWritesNoLogFileOfItsOwn) {
  testing::TempDir dir;
  ASSERT_NO_FATAL_FAILURE(write_k_and_close(dir.path() + "/db"));
  auto again = RocksDbStore::open(dir.path() + "/db");  // a reopen logs recovery and the options too
  ASSERT_TRUE(again.has_value());
  again->reset();
  for (const auto& entry : std::filesystem::directory_iterator(dir.path() + "/db")) {
    const std::string name = entry.path().filename().string();
    EXPECT_FALSE(name == "LOG" || name.rfind("LOG.old", 0) == 0) << "RocksDB wrote " << entry.path();
  }
}

TEST(RocksDbStoreTest, DropCachesKeepsEveryRecord) {
  testing::TempDir dir;
  auto s = RocksDbStore::open(dir.path() + "/db");
  ASSERT_TRUE(s.has_value());
  WriteBatch b;
  for (int i = 0; i < 100; ++i) b.put(testing::numbered("i/", i), std::string(100, 'v'));
  ASSERT_OK((*s)->write(b));
  EXPECT_TRUE((*s)->get("i/7")->has_value());
  (void)(*s)->drop_caches();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(**(*s)->get(testing::numbered("i/", i)), std::string(100, 'v'));
}

TEST(SchemaTest, BigEndianKeysSortNumerically) {
  EXPECT_LT(schema::inode_key(InodeId(255)), schema::inode_key(InodeId(256)));
  EXPECT_LT(schema::dentry_key(InodeId(1), "zzz"), schema::dentry_key(InodeId(2), "a"));
  EXPECT_EQ(schema::read_be64(schema::inode_key(InodeId(0x0102030405060708)).substr(2)), 0x0102030405060708u);
}

TEST(SchemaTest, DamagedRecordIsCorruptNotACrash) {
  auto r = schema::decode_record<schema::InodeRecord>(std::string("\x01\x02", 2), "i/x");
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kCorrupt);
  auto r2 = schema::decode_record<schema::U64Record>("", "c/x");
  EXPECT_FALSE(r2.has_value());
  auto ok = schema::decode_record<schema::U64Record>(schema::encode_record(schema::U64Record{7}), "c/x");
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->value, 7u);
}

// ---- CachedStore ----

// A MemoryStore that counts gets and runs a hook inside get (after the read) and apply (before
// the write), so a test can hold either one while another thread acts.
class HookedStore final : public Store {
 public:
  Result<std::optional<std::string>> get(std::string_view key) override {
    ++gets;
    auto r = mem.get(key);
    if (after_get) after_get();
    return r;
  }
  Status apply(const WriteBatch& batch) override {
    if (before_apply) before_apply();
    return mem.apply(batch);
  }
  Status sync() override { return mem.sync(); }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return mem.scan(prefix, seek, fn);
  }
  std::string describe() const override { return "hooked memory"; }

  MemoryStore mem;
  std::atomic<int> gets{0};
  std::function<void()> after_get;
  std::function<void()> before_apply;
};

CachedStoreOptions cache_options(size_t capacity = 1 << 20) {
  CachedStoreOptions o;
  o.capacity_bytes = capacity;
  o.prefixes = {"i/", "d/"};
  return o;
}

Status put(Store& s, const std::string& key, const std::string& value) {
  WriteBatch b;
  b.put(key, value);
  return s.apply(b);
}

std::optional<std::string> value_of(Store& s, std::string_view key) {
  auto r = s.get(key);
  EXPECT_TRUE(r.has_value());
  return r.has_value() ? *r : std::nullopt;
}

TEST(CachedStoreTest, ReadsARecordOnceThenFromMemoryAbsentOnesToo) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options());
  ASSERT_OK(put(cache, "i/1", "one"));
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(value_of(cache, "d/free"), std::nullopt);
  EXPECT_EQ(value_of(cache, "d/free"), std::nullopt);
  EXPECT_EQ(inner.gets.load(), 2);
  EXPECT_EQ(cache.hits(), 2u);
  EXPECT_EQ(cache.misses(), 2u);
  EXPECT_GT(cache.bytes(), 0u);
}

TEST(CachedStoreTest, AWriteReplacesWhatWasCached) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options());
  ASSERT_OK(put(cache, "i/1", "one"));
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(value_of(cache, "d/x"), std::nullopt);
  WriteBatch b;
  b.put("i/1", "two");
  b.put("d/x", "now here");
  ASSERT_OK(cache.apply(b));
  EXPECT_EQ(value_of(cache, "i/1"), "two");
  EXPECT_EQ(value_of(cache, "d/x"), "now here");
  WriteBatch d;
  d.del("i/1");
  ASSERT_OK(cache.apply(d));
  EXPECT_EQ(value_of(cache, "i/1"), std::nullopt);
  EXPECT_EQ(value_of(cache, "d/x"), "now here");
}

TEST(CachedStoreTest, KeysOutsideThePrefixesAreNotCached) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options());
  ASSERT_OK(put(cache, "o/1", "open"));
  EXPECT_EQ(value_of(cache, "o/1"), "open");
  EXPECT_EQ(value_of(cache, "o/1"), "open");
  EXPECT_EQ(inner.gets.load(), 2);
  EXPECT_EQ(cache.hits() + cache.misses(), 0u);
}

TEST(CachedStoreTest, ZeroCapacityCachesNothing) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options(0));
  ASSERT_OK(put(cache, "i/1", "one"));
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(inner.gets.load(), 2);
  EXPECT_EQ(cache.bytes(), 0u);
}

// A miss that read the old value before a write landed must not cache it after the write.
TEST(CachedStoreTest, AReadOvertakenByAWriteCachesNothingStale) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options());
  ASSERT_OK(put(cache, "i/1", "old"));
  std::atomic<bool> held{true}, read_done{false}, write_done{false};
  inner.after_get = [&] {
    if (!held.exchange(false)) return;  // only the reader's get waits
    read_done = true;
    while (!write_done) std::this_thread::yield();
  };
  std::thread reader([&] { EXPECT_EQ(value_of(cache, "i/1"), "old"); });
  while (!read_done) std::this_thread::yield();
  ASSERT_OK(put(cache, "i/1", "new"));
  write_done = true;
  reader.join();
  inner.after_get = nullptr;
  EXPECT_EQ(value_of(cache, "i/1"), "new");
}

// A read while a write of the same key is in flight (not yet in the inner store) must not cache
// what it read: the write lands right after.
TEST(CachedStoreTest, AReadDuringAWriteOfItsKeyCachesNothing) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options());
  ASSERT_OK(put(cache, "i/1", "old"));
  EXPECT_EQ(value_of(cache, "i/1"), "old");
  std::atomic<bool> writing{false}, read_done{false};
  inner.before_apply = [&] {
    writing = true;
    while (!read_done) std::this_thread::yield();
  };
  std::thread writer([&] { ASSERT_OK(put(cache, "i/1", "new")); });
  while (!writing) std::this_thread::yield();
  EXPECT_EQ(value_of(cache, "i/1"), "old");  // the write has not reached the inner store yet
  read_done = true;
  writer.join();
  inner.before_apply = nullptr;
  EXPECT_EQ(value_of(cache, "i/1"), "new");
}

TEST(CachedStoreTest, DropCachesEmptiesItAndKeepsEveryRecord) {
  HookedStore inner;
  CachedStore cache(&inner, cache_options());
  ASSERT_OK(put(cache, "i/1", "one"));
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(value_of(cache, "d/none"), std::nullopt);
  const size_t held = cache.bytes();
  ASSERT_GT(held, 0u);
  EXPECT_EQ(cache.drop_caches(), held);
  EXPECT_EQ(cache.bytes(), 0u);
  const int gets = inner.gets.load();
  EXPECT_EQ(value_of(cache, "i/1"), "one");
  EXPECT_EQ(value_of(cache, "d/none"), std::nullopt);
  EXPECT_EQ(inner.gets.load(), gets + 2) << "the reads after the drop came from the cache";
}

TEST(CachedStoreTest, StaysWithinItsCapacityAndStillAnswersRight) {
  HookedStore inner;
  const size_t capacity = 16 * 1024;
  CachedStore cache(&inner, cache_options(capacity));
  WriteBatch b;
  for (int i = 0; i < 2000; ++i) b.put(testing::numbered("i/", i), std::string(100, static_cast<char>('a' + i % 26)));
  ASSERT_OK(cache.apply(b));
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 2000; ++i) {
      ASSERT_EQ(value_of(cache, testing::numbered("i/", i)), std::string(100, static_cast<char>('a' + i % 26)));
    }
  }
  EXPECT_LE(cache.bytes(), capacity);
  EXPECT_GT(cache.bytes(), capacity / 4);
  EXPECT_GT(inner.gets.load(), 2000);  // the second round missed what was evicted
  // The last key read is the most recently used one: still cached.
  const int before = inner.gets.load();
  EXPECT_TRUE(value_of(cache, testing::numbered("i/", 1999)).has_value());
  EXPECT_EQ(inner.gets.load(), before);
}

}  // namespace
}  // namespace penstock::meta
