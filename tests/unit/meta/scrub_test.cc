#include "server/meta/scrub.h"

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

using testing::CachedRocksBackend;
using testing::MemoryBackend;

// Data servers as the scrub sees them: the inodes with chunks on each target, listed a page at a
// time as ListInodes does (by bucket, ascending, after a cursor); Remove takes an inode's chunks
// off its target.
class FakeDataNodes final : public ChunkLister, public ChunkRemover {
 public:
  Result<proto::data::ListInodesResp> list_inodes(const std::string& address,
                                                  const proto::data::ListInodesReq& req) override {
    if (on_list) on_list();
    std::lock_guard lock(mu_);
    ++list_calls;
    if (fail_list.count(req.target.value) != 0) return Status(Code::kUnavailable, "fake: " + address + " is down");
    proto::data::ListInodesResp resp;
    if (hostile == 1) {  // says more follow, lists nothing
      resp.more = true;
      return resp;
    }
    if (hostile == 2) {  // lists the same inode again and again
      resp.inodes = {InodeId(req.bucket == 0 ? 256 : req.bucket)};
      resp.more = true;
      return resp;
    }
    for (uint64_t ino : chunks[req.target.value]) {
      if (ino <= req.after.value || ino % proto::data::kListBuckets != req.bucket) continue;
      if (resp.inodes.size() == req.max) {
        resp.more = true;
        break;
      }
      resp.inodes.emplace_back(ino);
    }
    return resp;
  }
  Status remove(const std::string& address, TargetId target, InodeId ino) override {
    std::lock_guard lock(mu_);
    removed.emplace_back(address, target.value, ino.value);
    if (on_remove) on_remove();
    if (fail_remove.count(target.value) != 0) return Status(Code::kUnavailable, "fake: remove failed");
    chunks[target.value].erase(ino.value);
    return Status::ok();
  }

  size_t removed_count() {
    std::lock_guard lock(mu_);
    return removed.size();
  }

  std::map<uint64_t, std::set<uint64_t>> chunks;  // by target
  std::set<uint64_t> fail_list;
  std::set<uint64_t> fail_remove;
  std::vector<std::tuple<std::string, uint64_t, uint64_t>> removed;
  std::function<void()> on_remove;
  std::function<void()> on_list;  // called before each listing, outside the lock
  size_t list_calls = 0;
  int hostile = 0;  // 1: empty pages that promise more; 2: a page that repeats itself

 private:
  std::mutex mu_;
};

// A store that counts its syncs, to see that removals come after one.
class SyncCountingStore final : public Store {
 public:
  Result<std::optional<std::string>> get(std::string_view key) override { return inner_.get(key); }
  Status apply(const WriteBatch& batch) override { return inner_.apply(batch); }
  Status sync() override {
    ++syncs;
    return inner_.sync();
  }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return inner_.scan(prefix, seek, fn);
  }
  std::string describe() const override { return "sync-counting memory"; }

  std::atomic<int> syncs{0};

 private:
  MemoryStore inner_;
};

constexpr const char* kNodeA = "127.0.0.1:7700";
constexpr const char* kNodeB = "127.0.0.1:7701";

// What a power loss leaves of a create whose WAL never reached the disk: no record of the file
// `name` in the root (its number stays used: a restart starts past its reservation).
Status lose_create(Store* store, const std::string& name, InodeId ino) {
  WriteBatch b;
  b.del(schema::dentry_key(kRootInode, name));
  b.del(schema::inode_key(ino));
  return store->apply(b);
}

// A service over `store` with one data server (target 1 at kNodeA) that holds the chunks of one
// file whose create was lost (its records gone, its number used): one orphan for the scrub.
std::unique_ptr<MetaService> service_with_one_orphan(Store* store, FakeDataNodes* nodes) {
  auto s = MetaService::open(store, MetaOptions{});
  EXPECT_TRUE(s.has_value()) << s.error().to_string();
  if (!s.has_value()) return nullptr;
  std::unique_ptr<MetaService> svc = std::move(s).value();
  auto node = svc->register_node(pm::RegisterNodeReq{"node-a", kNodeA, {{"t1", "/a", 10, 5}}});
  EXPECT_TRUE(node.has_value()) << node.error().to_string();
  auto f = svc->create(pm::CreateReq{kRootInode, "f", 0644, {}, SessionId()});
  EXPECT_TRUE(f.has_value());
  if (!f.has_value()) return nullptr;
  Status applied = lose_create(store, "f", f->attr.ino);
  EXPECT_TRUE(applied.is_ok()) << applied.to_string();
  nodes->chunks[1] = {f->attr.ino.value};
  return svc;
}

template <class B>
class ScrubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = backend_.open();
    open_service(store_.get());
  }
  void TearDown() override { scrubber_.reset(); }

  void open_service(Store* store) {
    scrubber_.reset();
    MetaOptions o;
    o.seed = 7;
    auto s = MetaService::open(store, o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    pm::RegisterNodeReq req{"node-a", kNodeA, {{"t1", "/a", 10, 5}, {"t2", "/b", 10, 5}}};
    ASSERT_OK(svc_->register_node(req));
    req = pm::RegisterNodeReq{"node-b", kNodeB, {{"t3", "/c", 10, 5}}};
    ASSERT_OK(svc_->register_node(req));
    scrubber_ = std::make_unique<Scrubber>(*svc_, nodes_, nodes_, options_);
  }
  InodeId create(const std::string& name) {
    auto r = svc_->create(pm::CreateReq{kRootInode, name, 0644, {}, SessionId()});
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr.ino : InodeId();
  }
  pm::ScrubResp scrub(bool dry_run) {
    auto r = scrubber_->run(dry_run);
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? *r : pm::ScrubResp{};
  }

  B backend_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<MetaService> svc_;
  FakeDataNodes nodes_;
  ScrubOptions options_;
  std::unique_ptr<Scrubber> scrubber_;
};

using Backends = ::testing::Types<MemoryBackend, CachedRocksBackend>;
TYPED_TEST_SUITE(ScrubTest, Backends);

TYPED_TEST(ScrubTest, RemovesOnlyChunksOfInodesTheNamespaceLacks) {
  auto& s = *this->svc_;
  InodeId live = this->create("live");
  InodeId unlinked = this->create("unlinked");
  InodeId lost = this->create("lost");
  // Unlinked while a session has it open: no name, but alive until the last close.
  InodeId open_unlinked = this->create("open-unlinked");
  SessionId session = s.register_session(pm::RegisterSessionReq{"a", "h"})->session;
  ASSERT_OK(s.open_file(pm::OpenReq{open_unlinked, session, 0}));
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "open-unlinked"}));
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "unlinked"}));  // queued for the collector, not run
  ASSERT_OK(lose_create(this->store_.get(), "lost", lost));
  // A number past every reservation: not this namespace's.
  const uint64_t foreign = uint64_t{1} << 40;
  this->nodes_.chunks[1] = {live.value, lost.value, foreign};
  this->nodes_.chunks[2] = {unlinked.value, lost.value};
  this->nodes_.chunks[3] = {live.value, open_unlinked.value};

  // The pass reads past the record cache (and RocksDB's block cache): it must not evict what
  // clients use.
  auto* cache = dynamic_cast<CachedStore*>(this->store_.get());
  const uint64_t cache_lookups = cache == nullptr ? 0 : cache->hits() + cache->misses();
  pm::ScrubResp r = this->scrub(/*dry_run=*/false);
  if (cache != nullptr) {
    EXPECT_EQ(cache->hits() + cache->misses(), cache_lookups);
  }
  EXPECT_EQ(r.targets, 3u);
  EXPECT_EQ(r.targets_failed, 0u);
  EXPECT_EQ(r.inodes, 7u);
  EXPECT_EQ(r.orphans, 2u);
  EXPECT_EQ(r.removed, 2u);
  EXPECT_EQ(r.unknown, 1u);
  EXPECT_TRUE(r.errors.empty());
  std::set<std::tuple<std::string, uint64_t, uint64_t>> got(this->nodes_.removed.begin(), this->nodes_.removed.end());
  std::set<std::tuple<std::string, uint64_t, uint64_t>> want = {{kNodeA, 1, lost.value}, {kNodeA, 2, lost.value}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(this->nodes_.removed.size(), 2u);
  EXPECT_EQ(this->nodes_.chunks[1], (std::set<uint64_t>{live.value, foreign}));
  EXPECT_EQ(this->nodes_.chunks[2], (std::set<uint64_t>{unlinked.value}));  // the collector's job
  EXPECT_EQ(this->nodes_.chunks[3], (std::set<uint64_t>{live.value, open_unlinked.value}));
  // Every record a client uses is still there.
  EXPECT_TRUE(s.lookup(pm::LookupReq{kRootInode, "live", SessionId()}).has_value());

  r = this->scrub(false);
  EXPECT_EQ(r.orphans, 0u);
  EXPECT_EQ(r.removed, 0u);
  EXPECT_EQ(this->nodes_.removed.size(), 2u);
}

TYPED_TEST(ScrubTest, DryRunCountsAndRemovesNothing) {
  InodeId lost = this->create("lost");
  ASSERT_OK(lose_create(this->store_.get(), "lost", lost));
  this->nodes_.chunks[3] = {lost.value};
  pm::ScrubResp r = this->scrub(/*dry_run=*/true);
  EXPECT_EQ(r.orphans, 1u);
  EXPECT_EQ(r.removed, 0u);
  EXPECT_TRUE(this->nodes_.removed.empty());
  EXPECT_EQ(this->nodes_.chunks[3].size(), 1u);
}

TYPED_TEST(ScrubTest, TargetsThatFailAreReportedAndTheRestScrubbed) {
  InodeId lost = this->create("lost");
  ASSERT_OK(lose_create(this->store_.get(), "lost", lost));
  this->nodes_.chunks[1] = {lost.value};
  this->nodes_.chunks[3] = {lost.value};
  this->nodes_.fail_list = {1};
  this->nodes_.fail_remove = {3};
  pm::ScrubResp r = this->scrub(false);
  EXPECT_EQ(r.targets, 2u);
  EXPECT_EQ(r.targets_failed, 1u);
  EXPECT_EQ(r.orphans, 1u);  // found on target 3; target 1 was not listed
  EXPECT_EQ(r.removed, 0u);  // and its removal failed
  ASSERT_EQ(r.errors.size(), 2u);
  EXPECT_NE(r.errors[0].find("not scrubbed to the end"), std::string::npos) << r.errors[0];
  EXPECT_NE(r.errors[1].find("remove failed"), std::string::npos) << r.errors[1];
  this->nodes_.fail_list.clear();
  this->nodes_.fail_remove.clear();
  r = this->scrub(false);
  EXPECT_EQ(r.targets, 3u);
  EXPECT_EQ(r.removed, 2u);
  EXPECT_TRUE(this->nodes_.chunks[1].empty());
  EXPECT_TRUE(this->nodes_.chunks[3].empty());
}

TYPED_TEST(ScrubTest, AListingThatNeverEndsFailsItsTargetNotThePass) {
  for (int mode : {1, 2}) {
    this->nodes_.hostile = mode;
    this->nodes_.list_calls = 0;
    pm::ScrubResp r = this->scrub(false);
    EXPECT_EQ(r.targets, 0u) << "mode " << mode;
    EXPECT_EQ(r.targets_failed, 3u) << "mode " << mode;
    EXPECT_EQ(this->nodes_.list_calls, mode == 1 ? 3u : 6u) << "mode " << mode;  // one page (two) per target
    ASSERT_EQ(r.errors.size(), 3u);
    EXPECT_NE(r.errors[0].find("not scrubbed to the end"), std::string::npos) << r.errors[0];
    EXPECT_TRUE(this->nodes_.removed.empty());
  }
}

TEST(ScrubPaging, EveryInodeOfABucketIsSeenAcrossPages) {
  MemoryStore store;
  MetaOptions o;
  auto s = MetaService::open(&store, o);
  ASSERT_TRUE(s.has_value()) << s.error().to_string();
  MetaService& svc = **s;
  ASSERT_OK(svc.register_node(pm::RegisterNodeReq{"node-a", kNodeA, {{"t1", "/a", 10, 5}}}));
  // More than a bucket's worth of numbers, so that several land in one bucket.
  std::vector<InodeId> lost;
  for (int i = 0; i < 3 * static_cast<int>(proto::data::kListBuckets); ++i) {
    auto r = svc.create(pm::CreateReq{kRootInode, testing::numbered("f", i), 0644, {}, SessionId()});
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    if (i % 2 == 0) lost.push_back(r->attr.ino);
  }
  FakeDataNodes nodes;
  for (size_t i = 0; i < lost.size(); ++i) {
    ASSERT_OK(lose_create(&store, testing::numbered("f", static_cast<long>(2 * i)), lost[i]));
    nodes.chunks[1].insert(lost[i].value);
  }
  // One page per inode, or one for an empty bucket.
  std::map<uint64_t, size_t> per_bucket;
  for (uint64_t ino : nodes.chunks[1]) ++per_bucket[ino % proto::data::kListBuckets];
  ASSERT_LT(per_bucket.size(), nodes.chunks[1].size());  // some bucket holds several
  const size_t want_calls = nodes.chunks[1].size() + (proto::data::kListBuckets - per_bucket.size());
  ScrubOptions opts;
  opts.page = 1;
  Scrubber scrubber(svc, nodes, nodes, opts);
  auto r = scrubber.run(false);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->inodes, lost.size());
  EXPECT_EQ(r->removed, lost.size());
  EXPECT_TRUE(nodes.chunks[1].empty());
  EXPECT_EQ(nodes.list_calls, want_calls);
}

TEST(ScrubDurability, RemovalsWaitForASyncOfTheNamespace) {
  // A file whose unlink is applied but not yet synced has no record: a crash could still bring it
  // back, so its chunks must not go before a sync.
  SyncCountingStore store;
  FakeDataNodes nodes;
  std::unique_ptr<MetaService> svc = service_with_one_orphan(&store, &nodes);
  ASSERT_NE(svc, nullptr);
  const int before = store.syncs.load();
  int at_remove = -1;
  nodes.on_remove = [&] { at_remove = store.syncs.load(); };
  Scrubber scrubber(*svc, nodes, nodes);
  auto r = scrubber.run(false);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->removed, 1u);
  EXPECT_GT(at_remove, before);
}

TEST(ScrubBackground, PassesRunOnTheirOwnWithAnInterval) {
  MemoryStore store;
  FakeDataNodes nodes;
  std::unique_ptr<MetaService> svc = service_with_one_orphan(&store, &nodes);
  ASSERT_NE(svc, nullptr);
  ScrubOptions opts;
  opts.first_delay = std::chrono::milliseconds(10);
  opts.interval = std::chrono::milliseconds(20);
  Scrubber scrubber(*svc, nodes, nodes, opts);
  scrubber.start();
  for (int i = 0; i < 1000 && nodes.removed_count() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  scrubber.stop();
  EXPECT_EQ(nodes.removed_count(), 1u);
}

TEST(ScrubStop, StopEndsARunningPassAndRefusesNewOnes) {
  MemoryStore store;
  FakeDataNodes nodes;
  std::unique_ptr<MetaService> svc = service_with_one_orphan(&store, &nodes);
  ASSERT_NE(svc, nullptr);
  ASSERT_OK(svc->register_node(pm::RegisterNodeReq{"node-b", kNodeB, {{"t2", "/b", 10, 5}}}));
  Scrubber scrubber(*svc, nodes, nodes);
  scrubber.start();
  nodes.on_list = [&] { scrubber.stop(); };  // penstock-meta stops during the first listing
  auto r = scrubber.run(false);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(nodes.list_calls, 1u);  // not one bucket more
  EXPECT_EQ(r->targets, 0u);
  EXPECT_EQ(r->targets_failed, 2u);
  EXPECT_TRUE(nodes.removed.empty());
  nodes.on_list = nullptr;
  EXPECT_EQ(scrubber.run(false).status().code(), Code::kUnavailable);
  EXPECT_EQ(svc->scrub(pm::ScrubReq{}).status().code(), Code::kNotSupported);
}

TEST(ScrubStop, StopEndsAPageOfRemovals) {
  MemoryStore store;
  auto opened = MetaService::open(&store, MetaOptions{});
  ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
  MetaService& svc = **opened;
  ASSERT_OK(svc.register_node(pm::RegisterNodeReq{"node-a", kNodeA, {{"t1", "/a", 10, 5}}}));
  // Two lost creates in one bucket: one page, two removals.
  std::vector<InodeId> inos;
  for (int i = 0; i <= static_cast<int>(proto::data::kListBuckets); ++i) {
    auto r = svc.create(pm::CreateReq{kRootInode, testing::numbered("f", i), 0644, {}, SessionId()});
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    inos.push_back(r->attr.ino);
  }
  FakeDataNodes nodes;
  for (int i : {0, static_cast<int>(proto::data::kListBuckets)}) {
    ASSERT_OK(lose_create(&store, testing::numbered("f", i), inos[i]));
    nodes.chunks[1].insert(inos[i].value);
  }
  ASSERT_EQ(inos[0].value % proto::data::kListBuckets, inos.back().value % proto::data::kListBuckets);
  Scrubber scrubber(svc, nodes, nodes);
  nodes.on_remove = [&] { scrubber.stop(); };  // penstock-meta stops during the first removal
  scrubber.start();
  auto r = scrubber.run(false);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->orphans, 2u);
  EXPECT_EQ(nodes.removed_count(), 1u);  // the page's second removal never started
  EXPECT_EQ(r->targets_failed, 1u);
}

TEST(ScrubRpc, ACallDuringAPassIsBusy) {
  MemoryStore store;
  FakeDataNodes nodes;
  std::unique_ptr<MetaService> svc = service_with_one_orphan(&store, &nodes);
  ASSERT_NE(svc, nullptr);
  Scrubber scrubber(*svc, nodes, nodes);
  scrubber.start();
  std::mutex mu;
  std::condition_variable cv;
  bool listing = false, release = false;
  nodes.on_list = [&] {
    std::unique_lock lock(mu);
    listing = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  Result<pm::ScrubResp> first = Status(Code::kInternal, "not run");
  std::thread caller([&] { first = svc->scrub(pm::ScrubReq{}); });
  bool started = false;
  {
    std::unique_lock lock(mu);
    started = cv.wait_for(lock, std::chrono::seconds(30), [&] { return listing; });
  }
  EXPECT_TRUE(started);  // EXPECT, not ASSERT: the caller thread is joined below either way
  if (started) {
    EXPECT_EQ(svc->scrub(pm::ScrubReq{}).status().code(), Code::kBusy);
  }
  {
    std::lock_guard lock(mu);
    release = true;
  }
  cv.notify_all();
  caller.join();
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  EXPECT_EQ(first->removed, 1u);
}

TEST(ScrubRpc, TheServiceRunsTheInstalledScrubber) {
  MemoryStore store;
  auto s = MetaService::open(&store, MetaOptions{});
  ASSERT_TRUE(s.has_value()) << s.error().to_string();
  MetaService& svc = **s;
  EXPECT_EQ(svc.scrub(pm::ScrubReq{}).status().code(), Code::kNotSupported);
  FakeDataNodes nodes;
  {
    Scrubber scrubber(svc, nodes, nodes);
    scrubber.start();
    auto r = svc.scrub(pm::ScrubReq{true});
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    EXPECT_EQ(r->targets, 0u);  // no data server registered
  }
  EXPECT_EQ(svc.scrub(pm::ScrubReq{}).status().code(), Code::kNotSupported);
}

}  // namespace
}  // namespace penstock::meta
