#include "server/meta/gc.h"

#include <condition_variable>
#include <mutex>
#include <set>
#include <tuple>

#include <gtest/gtest.h>

#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

using testing::MemoryBackend;
using testing::CachedRocksBackend;
using testing::RocksBackend;

// Records every Remove; fails the targets listed in fail_targets.
class FakeRemover final : public ChunkRemover {
 public:
  Status remove(const std::string& address, TargetId target, InodeId ino) override {
    std::lock_guard lock(mu_);
    calls.emplace_back(address, target.value, ino.value);
    cv_.notify_all();
    if (fail_targets.count(target.value) != 0) return Status(Code::kUnavailable, "fake: target down");
    return Status::ok();
  }
  size_t count() {
    std::lock_guard lock(mu_);
    return calls.size();
  }
  // Waits (bounded) until at least n calls were made; used only by the background-thread test.
  bool wait_for_calls(size_t n) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return calls.size() >= n; });
  }

  std::vector<std::tuple<std::string, uint64_t, uint64_t>> calls;
  std::set<uint64_t> fail_targets;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
};

template <class B>
class GcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store_ = backend_.open();
    MetaOptions o;
    o.now = [this] { return now_; };
    o.seed = 7;
    auto s = MetaService::open(store_.get(), o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    pm::RegisterNodeReq req{"node-a", "127.0.0.1:7700", {{"t1", "/a", 10, 5}, {"t2", "/b", 10, 5}}};
    ASSERT_OK(svc_->register_node(req));
    req = pm::RegisterNodeReq{"node-b", "127.0.0.1:7701", {{"t3", "/c", 10, 5}}};
    ASSERT_OK(svc_->register_node(req));
    GcOptions g;
    g.min_backoff_ns = 1'000'000'000;
    gc_ = std::make_unique<GarbageCollector>(*svc_, remover_, g);
  }
  void TearDown() override { gc_.reset(); }

  InodeId create(const std::string& name, SessionId session = SessionId()) {
    auto r = svc_->create(pm::CreateReq{kRootInode, name, 0644, {}, session});
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr.ino : InodeId();
  }
  size_t pass() {
    auto r = gc_->run_once();
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? *r : 0;
  }

  B backend_;
  std::shared_ptr<Store> store_;
  std::unique_ptr<MetaService> svc_;
  FakeRemover remover_;
  std::unique_ptr<GarbageCollector> gc_;
  int64_t now_ = 1'000'000'000'000;
};

using Backends = ::testing::Types<MemoryBackend, RocksBackend, CachedRocksBackend>;
TYPED_TEST_SUITE(GcTest, Backends);

TYPED_TEST(GcTest, ChunksAreRemovedOnceAfterTheLastClose) {
  auto& s = *this->svc_;
  SessionId a = s.register_session(pm::RegisterSessionReq{"a", "h"})->session;
  SessionId b = s.register_session(pm::RegisterSessionReq{"b", "h"})->session;
  InodeId f = this->create("f", a);
  ASSERT_OK(s.open_file(pm::OpenReq{f, b, 0}));
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "f"}));
  EXPECT_EQ(this->pass(), 0u);
  ASSERT_OK(s.release(pm::ReleaseReq{f, a}));
  EXPECT_EQ(this->pass(), 0u);
  EXPECT_EQ(this->remover_.count(), 0u);  // b still has it open
  ASSERT_OK(s.release(pm::ReleaseReq{f, b}));
  EXPECT_EQ(this->pass(), 1u);
  std::set<std::tuple<std::string, uint64_t, uint64_t>> got(this->remover_.calls.begin(), this->remover_.calls.end());
  std::set<std::tuple<std::string, uint64_t, uint64_t>> want = {
      {"127.0.0.1:7700", 1, f.value}, {"127.0.0.1:7700", 2, f.value}, {"127.0.0.1:7701", 3, f.value}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(this->remover_.calls.size(), 3u);
  EXPECT_EQ(this->pass(), 0u);
  EXPECT_EQ(this->remover_.calls.size(), 3u);  // exactly once
  EXPECT_TRUE(s.gc_pending(InodeId(), 10)->empty());
}

TYPED_TEST(GcTest, FailedTargetsAreRetriedWithBackoffOnly) {
  auto& s = *this->svc_;
  InodeId f = this->create("f");
  this->remover_.fail_targets = {3};
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "f"}));
  EXPECT_EQ(this->pass(), 0u);
  EXPECT_EQ(this->remover_.calls.size(), 3u);
  EXPECT_EQ(this->pass(), 0u);  // backoff not over
  EXPECT_EQ(this->remover_.calls.size(), 3u);
  this->now_ += 1'000'000'000;
  EXPECT_EQ(this->pass(), 0u);  // still failing; only target 3 asked again
  ASSERT_EQ(this->remover_.calls.size(), 4u);
  EXPECT_EQ(std::get<1>(this->remover_.calls[3]), 3u);
  this->now_ += 1'000'000'000;
  EXPECT_EQ(this->pass(), 0u);  // backoff doubled to 2 s
  EXPECT_EQ(this->remover_.calls.size(), 4u);
  this->remover_.fail_targets.clear();
  this->now_ += 1'000'000'000;
  EXPECT_EQ(this->pass(), 1u);
  EXPECT_EQ(this->remover_.calls.size(), 5u);
  EXPECT_EQ(std::get<2>(this->remover_.calls[4]), f.value);
  EXPECT_TRUE(s.gc_pending(InodeId(), 10)->empty());
}

TYPED_TEST(GcTest, SessionExpiryReleasesOpensForGc) {
  auto& s = *this->svc_;
  SessionId a = s.register_session(pm::RegisterSessionReq{"a", "h"})->session;
  InodeId f = this->create("f", a);
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "f"}));
  this->now_ += 29'000'000'000;
  ASSERT_OK(s.expire());
  EXPECT_EQ(this->pass(), 0u);
  ASSERT_TRUE(s.get_attr(pm::InodeReq{f}).has_value());
  this->now_ += 2'000'000'000;
  ASSERT_OK(s.expire());
  EXPECT_EQ(this->pass(), 1u);
  EXPECT_EQ(this->remover_.calls.size(), 3u);
}

TYPED_TEST(GcTest, FilesWithoutChunksAndDirectoriesNeedNoGc) {
  auto& s = *this->svc_;
  ASSERT_OK(s.mkdir(pm::MkdirReq{kRootInode, "d", 0755, {}}));
  ASSERT_OK(s.symlink(pm::SymlinkReq{kRootInode, "l", "x", {}}));
  ASSERT_OK(s.mknod(pm::MknodReq{kRootInode, "p", S_IFIFO | 0644, 0, {}}));
  ASSERT_OK(s.rmdir(pm::NameReq{kRootInode, "d"}));
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "l"}));
  ASSERT_OK(s.unlink(pm::NameReq{kRootInode, "p"}));
  EXPECT_EQ(this->pass(), 0u);
  EXPECT_EQ(this->remover_.calls.size(), 0u);
}

TYPED_TEST(GcTest, BackgroundThreadIsWokenByUnlink) {
  this->gc_->start();
  this->create("f");
  ASSERT_OK(this->svc_->unlink(pm::NameReq{kRootInode, "f"}));
  EXPECT_TRUE(this->remover_.wait_for_calls(3));
  this->gc_->stop();
  this->gc_->stop();  // idempotent
}

}  // namespace
}  // namespace penstock::meta
