// Group commit: GroupCommitter over a fake write-ahead log, RocksDbStore's apply/sync, and the
// namespace's use of it (a mutation is acknowledged only after a sync that covers it, and the
// namespace mutex is not held while it waits).
#include "server/meta/group_commit.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/meta/namespace.h"
#include "server/meta/rocksdb_store.h"
#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

// A fake log: appends get consecutive positions; a sync makes durable every position appended
// before the sync started (like fdatasync of the WAL). Independent of GroupCommitter's own
// bookkeeping, so the tests check the real invariant: acknowledged => covered by a finished sync.
class FakeLog {
 public:
  // Appends one record and tells the committer; returns (position, ticket).
  std::pair<uint64_t, uint64_t> append(GroupCommitter& gc) {
    std::lock_guard lock(append_mu_);  // the log's own write lock, as RocksDB's write path
    uint64_t pos = ++appended_;
    return {pos, gc.note_applied()};
  }
  Status sync() {
    uint64_t upto = appended_.load();
    syncs_started_.fetch_add(1);
    if (gate_) gate_();
    if (fail_.load()) return Status(Code::kIo, "disk on fire");
    uint64_t prev = durable_.load();
    while (prev < upto && !durable_.compare_exchange_weak(prev, upto)) {
    }
    return Status::ok();
  }
  uint64_t durable() const { return durable_.load(); }
  std::function<void()> gate_;
  std::atomic<bool> fail_{false};
  std::atomic<uint64_t> syncs_started_{0};

 private:
  std::mutex append_mu_;
  std::atomic<uint64_t> appended_{0};
  std::atomic<uint64_t> durable_{0};
};

// Opens once release() was called; wait() gives up after 20 s so a bug fails instead of hanging.
class Gate {
 public:
  bool wait() {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return open_; });
  }
  void release() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Spins (yielding, no sleep) until pred holds; false after 20 s.
template <class P>
bool eventually(P pred) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(GroupCommitTest, NothingToSyncReturnsAtOnce) {
  FakeLog log;
  GroupCommitter gc([&] { return log.sync(); });
  ASSERT_OK(gc.sync_all());
  EXPECT_EQ(gc.syncs(), 0u);
  auto [pos, ticket] = log.append(gc);
  ASSERT_OK(gc.wait_durable(ticket));
  EXPECT_EQ(gc.syncs(), 1u);
  EXPECT_GE(log.durable(), pos);
  ASSERT_OK(gc.wait_durable(ticket));  // already durable: no second sync
  EXPECT_EQ(gc.syncs(), 1u);
}

TEST(GroupCommitTest, FollowersQueuedBehindASyncShareTheNextOne) {
  FakeLog log;
  Gate first_sync;
  std::atomic<int> calls{0};
  log.gate_ = [&] {
    if (calls.fetch_add(1) == 0) {
      EXPECT_TRUE(first_sync.wait());
    }
  };
  GroupCommitter gc([&] { return log.sync(); });

  constexpr int kFollowers = 7;
  std::atomic<int> acked{0};
  // The leader appends and starts a sync that blocks.
  std::thread leader([&] {
    auto [pos, ticket] = log.append(gc);
    EXPECT_TRUE(gc.wait_durable(ticket).is_ok());
    EXPECT_GE(log.durable(), pos);
    acked.fetch_add(1);
  });
  ASSERT_TRUE(eventually([&] { return calls.load() == 1; }));
  // Followers append while it runs: that sync does not cover them, so nobody may be acknowledged.
  std::vector<std::thread> followers;
  for (int i = 0; i < kFollowers; ++i) {
    followers.emplace_back([&] {
      auto [pos, ticket] = log.append(gc);
      EXPECT_TRUE(gc.wait_durable(ticket).is_ok());
      EXPECT_GE(log.durable(), pos) << "acknowledged before a sync covered it";
      acked.fetch_add(1);
    });
  }
  ASSERT_TRUE(eventually([&] { return gc.followers() == kFollowers; }));
  EXPECT_EQ(acked.load(), 0);
  first_sync.release();
  leader.join();
  for (auto& t : followers) t.join();
  EXPECT_EQ(acked.load(), kFollowers + 1);
  // One sync for the leader, one shared by all seven followers.
  EXPECT_EQ(gc.syncs(), 2u);
  EXPECT_EQ(gc.durable(), static_cast<uint64_t>(kFollowers + 1));
}

TEST(GroupCommitTest, ManyConcurrentCommittersAreEachCoveredBySync) {
  FakeLog log;
  GroupCommitter gc([&] { return log.sync(); });
  constexpr int kThreads = 8, kCommits = 500;
  std::atomic<int> early{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kCommits; ++i) {
        auto [pos, ticket] = log.append(gc);
        Status st = gc.wait_durable(ticket);
        EXPECT_TRUE(st.is_ok()) << st.to_string();
        if (log.durable() < pos) early.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(early.load(), 0) << "commits acknowledged before a sync covered them";
  EXPECT_LE(gc.syncs(), static_cast<uint64_t>(kThreads * kCommits));
  EXPECT_EQ(gc.durable(), static_cast<uint64_t>(kThreads * kCommits));
}

TEST(GroupCommitTest, FailedSyncIsStickyForEveryone) {
  FakeLog log;
  GroupCommitter gc([&] { return log.sync(); });
  auto [pos, ticket] = log.append(gc);
  (void)pos;
  log.fail_ = true;
  Status st = gc.wait_durable(ticket);
  EXPECT_EQ(st.code(), Code::kIo);
  EXPECT_NE(st.message().find("until the database is opened again"), std::string::npos) << st.message();
  EXPECT_TRUE(gc.failed());
  log.fail_ = false;  // even when the disk "recovers", nothing is acknowledged any more
  auto [pos2, ticket2] = log.append(gc);
  (void)pos2;
  EXPECT_EQ(gc.wait_durable(ticket2).code(), Code::kIo);
  EXPECT_EQ(gc.wait_durable(0).code(), Code::kIo);
}

TEST(RocksDbGroupCommitTest, ConcurrentWritesShareSyncsAndSurviveReopen) {
  testing::TempDir dir;
  constexpr int kThreads = 8, kWrites = 200;
  {
    auto s = RocksDbStore::open(dir.path() + "/db");
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    RocksDbStore& store = **s;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kWrites; ++i) {
          WriteBatch b;
          b.put("k/" + std::to_string(t) + "/" + std::to_string(i), "v");
          Status st = store.write(b);
          EXPECT_TRUE(st.is_ok()) << st.to_string();
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_GE(store.wal_syncs(), 1u);
    EXPECT_LE(store.wal_syncs(), static_cast<uint64_t>(kThreads * kWrites));
  }
  auto s = RocksDbStore::open(dir.path() + "/db");
  ASSERT_TRUE(s.has_value());
  size_t n = 0;
  ASSERT_OK((*s)->scan("k/", "", [&](std::string_view, std::string_view) {
    ++n;
    return true;
  }));
  EXPECT_EQ(n, static_cast<size_t>(kThreads * kWrites));
}

TEST(RocksDbGroupCommitTest, ApplyIsVisibleBeforeSync) {
  testing::TempDir dir;
  auto s = RocksDbStore::open(dir.path() + "/db");
  ASSERT_TRUE(s.has_value());
  WriteBatch b;
  b.put("a", "1");
  ASSERT_OK((*s)->apply(b));
  EXPECT_EQ(**(*s)->get("a"), "1");
  uint64_t before = (*s)->wal_syncs();
  ASSERT_OK((*s)->sync());
  EXPECT_EQ((*s)->wal_syncs(), before + 1);
  ASSERT_OK((*s)->sync());  // nothing new: no second fsync
  EXPECT_EQ((*s)->wal_syncs(), before + 1);
}

// sync_soon() syncs what was applied before it within the store's delay, without the caller
// waiting.
TEST(RocksDbGroupCommitTest, SyncSoonSyncsWithinItsDelay) {
  testing::TempDir dir;
  RocksDbOptions options;
  options.sync_soon_delay = std::chrono::milliseconds(20);
  auto s = RocksDbStore::open(dir.path() + "/db", options);
  ASSERT_TRUE(s.has_value()) << s.error().to_string();
  RocksDbStore& store = **s;
  const uint64_t before = store.wal_syncs();
  WriteBatch b;
  b.put("a", "1");
  ASSERT_OK(store.apply(b));
  ASSERT_OK(store.sync_soon());
  ASSERT_OK(store.sync_soon());
  EXPECT_TRUE(eventually([&] { return store.wal_syncs() > before; })) << "no sync after sync_soon()";
  const uint64_t after = store.wal_syncs();
  ASSERT_OK(store.sync());  // nothing applied since: the delayed sync covered the batch
  EXPECT_EQ(store.wal_syncs(), after);
}

// A MemoryStore that logs apply/sync and can hold a sync until a condition holds.
class RecordingStore final : public Store {
 public:
  Result<std::optional<std::string>> get(std::string_view key) override { return mem_.get(key); }
  Status apply(const WriteBatch& batch) override {
    std::lock_guard lock(mu_);
    PENSTOCK_RETURN_IF_ERROR(mem_.apply(batch));
    ++applied_;
    return Status::ok();
  }
  Status sync() override {
    uint64_t upto;
    {
      std::lock_guard lock(mu_);
      upto = applied_;
      ++syncs_;
    }
    if (hold_) hold_();
    std::lock_guard lock(mu_);
    durable_ = std::max(durable_, upto);
    return Status::ok();
  }
  Status sync_soon() override {
    std::lock_guard lock(mu_);
    ++soon_;
    return fail_soon_ ? Status(Code::kIo, "write: No space left on device") : Status::ok();
  }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return mem_.scan(prefix, seek, fn);
  }
  std::string describe() const override { return "recording"; }
  uint64_t applied_ticket() const override {
    std::lock_guard lock(mu_);
    return applied_;
  }
  bool covered_by_sync(uint64_t ticket) const override {
    std::lock_guard lock(mu_);
    return durable_ >= ticket;
  }

  uint64_t syncs() {
    std::lock_guard lock(mu_);
    return syncs_;
  }
  uint64_t sync_soon_calls() {
    std::lock_guard lock(mu_);
    return soon_;
  }

  uint64_t applied() {
    std::lock_guard lock(mu_);
    return applied_;
  }
  uint64_t durable() {
    std::lock_guard lock(mu_);
    return durable_;
  }
  std::function<void()> hold_;
  bool fail_soon_ = false;  // sync_soon() fails (the WAL could not be handed to the kernel)

 private:
  MemoryStore mem_;
  mutable std::mutex mu_;
  uint64_t applied_ = 0, durable_ = 0, syncs_ = 0, soon_ = 0;
};

class NamespaceGroupCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MetaOptions o;
    o.seed = 7;
    auto s = MetaService::open(&store_, o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    pm::RegisterNodeReq req;
    req.node_uuid = "n";
    req.address = "127.0.0.1:7700";
    req.targets.push_back(pm::TargetReport{"t", "/data/t", 1000, 400});
    ASSERT_TRUE(svc_->register_node(req).has_value());
  }
  Result<pm::AttrResp> create(const std::string& name) {
    pm::CreateReq req;
    req.parent = kRootInode;
    req.name = name;
    req.mode = 0644;
    req.caller = proto::Caller{1000, 100};
    return svc_->create(req);
  }

  RecordingStore store_;
  std::unique_ptr<MetaService> svc_;
};

TEST_F(NamespaceGroupCommitTest, MutationIsAcknowledgedOnlyAfterASyncCoveringIt) {
  uint64_t before = store_.applied();
  // A create takes a number the start's synced reservation covers: answered before a sync.
  ASSERT_TRUE(create("a").has_value());
  EXPECT_GT(store_.applied(), before);
  EXPECT_LT(store_.durable(), store_.applied());
  // A rename waits for a sync that covers it (and the create before it).
  ASSERT_OK(svc_->rename(pm::RenameReq{kRootInode, "a", kRootInode, "c", 0, SessionId()}));
  EXPECT_EQ(store_.durable(), store_.applied());
  // A later create and an unlink are handed to the WAL (sync_soon) and answered before a sync.
  const uint64_t soon = store_.sync_soon_calls();
  ASSERT_TRUE(create("b").has_value());
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "c"}));
  EXPECT_LT(store_.durable(), store_.applied());
  EXPECT_EQ(store_.sync_soon_calls(), soon + 2);
  // Errors wait for the sync: kExists must not reveal a create a crash could still undo.
  EXPECT_EQ(create("b").status().code(), Code::kExists);
  EXPECT_EQ(store_.durable(), store_.applied());
}

// Opens and releases answer without a sync. The unlink that makes the file an orphan does not
// wait for one either, but it is in the WAL after every open applied before it, so a crash that
// keeps the unlink keeps those opens (the WAL is replayed as a prefix); an open of the orphan
// itself is synced.
TEST_F(NamespaceGroupCommitTest, OpenAndReleaseSkipTheSyncUntilTheFileIsAnOrphan) {
  auto sess = svc_->register_session(pm::RegisterSessionReq{"c", "h"});
  ASSERT_TRUE(sess.has_value()) << sess.error().to_string();
  auto a = create("a");
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  const InodeId ino = a->attr.ino;
  const uint64_t synced = store_.durable();
  ASSERT_TRUE(svc_->open_file(pm::OpenReq{ino, sess->session, 0}).has_value());
  EXPECT_GT(store_.applied(), synced);
  EXPECT_EQ(store_.durable(), synced) << "an open of a linked file waited for a sync";
  ASSERT_OK(svc_->release(pm::ReleaseReq{ino, sess->session}));
  EXPECT_EQ(store_.durable(), synced) << "a release waited for a sync";

  ASSERT_TRUE(svc_->open_file(pm::OpenReq{ino, sess->session, 0}).has_value());
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "a"}));
  const uint64_t after_unlink = store_.durable();
  EXPECT_LT(after_unlink, store_.applied()) << "an unlink waited for a sync";
  ASSERT_TRUE(svc_->open_file(pm::OpenReq{ino, sess->session, 0}).has_value());
  EXPECT_GT(store_.durable(), after_unlink) << "an open of an orphan must be synced";
  EXPECT_EQ(store_.durable(), store_.applied());
}

// A close's size report is applied (every client sees the size at once) and only asks the store
// to sync soon; fsync's report waits for the sync, and SyncLog makes an earlier close's durable.
TEST_F(NamespaceGroupCommitTest, SizeReportedAtCloseIsVisibleAtOnceAndSyncedSoon) {
  auto a = create("a");
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  const InodeId ino = a->attr.ino;
  const uint64_t synced = store_.durable();
  const uint64_t soon = store_.sync_soon_calls();
  auto r = svc_->report_size_at_close(pm::ReportSizeReq{ino, 5000, 77});
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->attr.size, 5000u);
  EXPECT_GT(r->attr.generation, a->attr.generation);
  auto seen = svc_->get_attr(pm::InodeReq{ino});
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->attr.size, 5000u);
  EXPECT_EQ(store_.durable(), synced) << "a close's report waited for a sync";
  EXPECT_EQ(store_.sync_soon_calls(), soon + 1);
  ASSERT_OK(svc_->sync_log());
  EXPECT_EQ(store_.durable(), store_.applied()) << "SyncLog left the report unsynced";
  ASSERT_TRUE(svc_->report_size(pm::ReportSizeReq{ino, 6000, 78}).has_value());
  EXPECT_EQ(store_.durable(), store_.applied()) << "fsync's report must be synced";
  EXPECT_EQ(store_.sync_soon_calls(), soon + 1);
}

// A change that could not be handed to the kernel (the WAL write failed) is not acknowledged:
// the create, the unlink and the close's report answer kIo.
TEST_F(NamespaceGroupCommitTest, AChangeTheStoreCouldNotHandOverIsAnError) {
  auto a = create("a");
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  store_.fail_soon_ = true;
  EXPECT_EQ(svc_->report_size_at_close(pm::ReportSizeReq{a->attr.ino, 5000, 77}).status().code(), Code::kIo);
  EXPECT_EQ(create("b").status().code(), Code::kIo);
  EXPECT_EQ(svc_->unlink(pm::NameReq{kRootInode, "a"}).status().code(), Code::kIo);
  store_.fail_soon_ = false;
  EXPECT_TRUE(create("c").has_value());
}

TEST_F(NamespaceGroupCommitTest, NamespaceLockIsFreeWhileASyncRuns) {
  // A rename's sync is held until a create has applied its batch. Were the namespace mutex held
  // across the sync, the create could never apply (the hold gives up after 20 s and the test
  // fails).
  ASSERT_TRUE(create("zero").has_value());
  std::atomic<bool> first{true};
  std::atomic<bool> saw_second{false};
  store_.hold_ = [&] {
    if (!first.exchange(false)) return;
    uint64_t at = store_.applied();
    saw_second = eventually([&] { return store_.applied() > at; });
  };
  std::thread t1([&] { ASSERT_OK(svc_->rename(pm::RenameReq{kRootInode, "zero", kRootInode, "one", 0, SessionId()})); });
  ASSERT_TRUE(eventually([&] { return !first.load(); }));
  std::thread t2([&] { EXPECT_TRUE(create("two").has_value()); });
  t1.join();
  t2.join();
  EXPECT_TRUE(saw_second.load());
}

// A fixture of the inode-reservation tests: a MetaService over a RecordingStore that reserves
// `batch` numbers at a time.
class NamespaceInodeReservation : public ::testing::Test {
 protected:
  void open(uint64_t batch) {
    MetaOptions o;
    o.seed = 7;
    o.inode_batch = batch;
    auto opened = MetaService::open(&store_, o);
    ASSERT_TRUE(opened.has_value()) << opened.error().to_string();
    svc_ = std::move(opened).value();
  }
  Result<pm::AttrResp> mkdir(const std::string& name) {
    return svc_->mkdir(pm::MkdirReq{kRootInode, name, 0755, proto::Caller{1000, 100}});
  }

  RecordingStore store_;
  std::unique_ptr<MetaService> svc_;
};

// Inode numbers: a create is applied (visible to every client) only with a number whose
// reservation a completed sync covers, so a crash never hands out again a number some client
// has seen. When the synced numbers run out, the next create syncs the reservation first and
// applies its own batch after; meanwhile its name is not visible.
TEST_F(NamespaceInodeReservation, NoCreateIsVisibleBeforeTheReservationOfItsNumberIsSynced) {
  open(2);
  RecordingStore& store = store_;
  MetaService& svc = *svc_;
  // The start synced a reservation of 2 numbers; the second create applies the next one ahead.
  ASSERT_TRUE(mkdir("a").has_value());
  ASSERT_TRUE(mkdir("b").has_value());
  const uint64_t durable_before = store.durable();
  EXPECT_LT(durable_before, store.applied()) << "the creates waited for a sync";
  // "c" needs a number beyond the synced reservation: the sync comes before its batch.
  std::atomic<int> holds{0};
  store.hold_ = [&] {
    if (holds.fetch_add(1) != 0) return;
    EXPECT_CODE(svc.lookup(pm::LookupReq{kRootInode, "c", SessionId()}), Code::kNotFound)
        << "a create was visible before the reservation of its number was synced";
  };
  auto c = mkdir("c");
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  EXPECT_EQ(holds.load(), 1);
  EXPECT_TRUE(svc.lookup(pm::LookupReq{kRootInode, "c", SessionId()}).has_value());
  EXPECT_LT(store.durable(), store.applied()) << "c's own batch is handed over, not synced";
  // Every number handed out is distinct and lies below the synced reservation.
  std::set<uint64_t> numbers;
  for (const char* name : {"a", "b", "c"}) {
    auto r = svc.lookup(pm::LookupReq{kRootInode, name, SessionId()});
    ASSERT_TRUE(r.has_value());
    numbers.insert(r->attr.ino.value);
  }
  EXPECT_EQ(numbers.size(), 3u);
}

// The early reservation is counted synced once any sync covered it (here one the store ran on
// its own, as its delayed sync does): a create-only stream never waits for a sync of its own.
TEST_F(NamespaceInodeReservation, AnEarlyReservationSomeSyncCoveredNeedsNoSyncOfItsOwn) {
  open(4);
  const uint64_t syncs = store_.syncs();
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(mkdir(name).has_value());
  EXPECT_EQ(store_.syncs(), syncs) << "creates within the start's reservation waited for a sync";
  ASSERT_OK(store_.sync());  // the store's own delayed sync covers the early reservation
  for (const char* name : {"d", "e", "f", "g"}) ASSERT_TRUE(mkdir(name).has_value());
  EXPECT_EQ(store_.syncs(), syncs + 1) << "a create beyond the start's reservation synced although a sync covered the next";
}

}  // namespace
}  // namespace penstock::meta
