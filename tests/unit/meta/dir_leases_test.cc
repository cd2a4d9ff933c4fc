// Directory leases for creates behind: the table (one holder, others wait the term plus grace out
// and then take over, contention, changes in progress, the restart guard, inode numbers), and the
// same through MetaService (DirLease, CreateBatch, and every other operation on the leased
// directory's names) with a fake clock.
#include "server/meta/dir_leases.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "server/meta/namespace.h"
#include "server/meta/schema.h"
#include "server/meta/store.h"

namespace penstock::meta {
namespace {

constexpr int64_t kTerm = 250'000'000;
constexpr int64_t kGrace = 100'000'000;
constexpr int64_t kContended = 10'000'000'000;
constexpr int64_t kT0 = 5'000'000'000'000;

const InodeId kDir{7};
const SessionId kA{1}, kB{2};

class DirLeasesTest : public ::testing::Test {
 protected:
  DirLeaseOptions options(int64_t term = kTerm) {
    DirLeaseOptions o;
    o.term_ns = term;
    o.grace_ns = kGrace;
    o.contended_ns = kContended;
    o.max_inodes_per_session = 8;
    o.clock = [this] { return now_; };
    return o;
  }
  // A table past its restart guard.
  DirLeases& fresh(int64_t term = kTerm) {
    leases_ = std::make_unique<DirLeases>(options(term));
    now_ += term + kGrace + 1;
    return *leases_;
  }
  int64_t now_ = kT0;
  std::unique_ptr<DirLeases> leases_;
};

TEST_F(DirLeasesTest, OneHolderOthersWaitItsTermAndGraceOutThenItIsGone) {
  DirLeases& l = fresh();
  DirLeases::Grant g = l.grant(kDir, kA, false);
  ASSERT_EQ(g.lease_ns, kTerm);
  EXPECT_TRUE(g.fresh);
  ASSERT_TRUE(l.confirm(kDir, kA));
  EXPECT_EQ(l.check(kDir, kA), 0) << "the holder's own operations never wait";
  EXPECT_EQ(l.check(kDir, kB), kTerm + kGrace);
  EXPECT_EQ(l.check(kDir, SessionId()), kTerm + kGrace) << "no session counts as another session";
  EXPECT_EQ(l.grant(kDir, kB, false).lease_ns, 0) << "held by A";
  EXPECT_EQ(l.check(InodeId{8}, kB), 0) << "other directories are not affected";
  now_ += kTerm;
  EXPECT_EQ(l.check(kDir, kB), kGrace);
  EXPECT_TRUE(l.holds(kDir, kA)) << "past its term, nobody took it yet";
  now_ += kGrace;
  EXPECT_EQ(l.check(kDir, kB), 0);
  EXPECT_FALSE(l.holds(kDir, kA)) << "B's operation ended A's hold";
  EXPECT_EQ(l.renew(kDir, kA), 0);
  EXPECT_EQ(l.grant(kDir, kA, true).lease_ns, 0) << "contended: no new grant";
  now_ += kContended;
  EXPECT_EQ(l.grant(kDir, kA, true).lease_ns, kTerm) << "the contention is over";
}

TEST_F(DirLeasesTest, RenewalsKeepTheNamesUntilAnotherSessionWaits) {
  DirLeases& l = fresh();
  ASSERT_TRUE(l.grant(kDir, kA, false).fresh);
  DirLeases::Grant again = l.grant(kDir, kA, true);
  EXPECT_EQ(again.lease_ns, kTerm);
  EXPECT_FALSE(again.fresh) << "the holder keeps its names";
  EXPECT_TRUE(l.grant(kDir, kA, false).fresh) << "a holder that lost its names gets them listed";
  now_ += kTerm / 2;
  EXPECT_EQ(l.renew(kDir, kA), kTerm);
  EXPECT_GT(l.check(kDir, kB), kTerm) << "the renewal moved the expiry";
  EXPECT_EQ(l.renew(kDir, kA), 0) << "B waits: no more renewals";
  EXPECT_EQ(l.grant(kDir, kA, true).lease_ns, 0);
  EXPECT_TRUE(l.holds(kDir, kA)) << "what A answered meanwhile may still be sent";
}

TEST_F(DirLeasesTest, NoGrantDuringAnotherSessionsChangeButTheAskersOwnChangesMayRun) {
  DirLeases& l = fresh();
  {
    DirLeases::Change c(l, kDir, kB);
    ASSERT_EQ(c.wait_ns(), 0);
    EXPECT_EQ(l.grant(kDir, kA, false).lease_ns, 0) << "B's change of the names is in progress";
    DirLeases::Change own(l, kDir, kA);
    ASSERT_EQ(own.wait_ns(), 0);
    EXPECT_EQ(l.grant(kDir, kA, false).lease_ns, 0) << "A's own change does not hide B's";
  }
  {
    // A's own creates go on while it asks: its mount lists what it adds itself, so the listing
    // may miss them.
    DirLeases::Change own(l, kDir, kA);
    ASSERT_EQ(own.wait_ns(), 0);
    DirLeases::Grant g = l.grant(kDir, kA, false);
    ASSERT_EQ(g.lease_ns, kTerm);
    { DirLeases::Change another(l, kDir, kA); }  // one more of A's, between grant and confirm
    EXPECT_TRUE(l.confirm(kDir, kA));
    EXPECT_EQ(l.check(kDir, kB), kTerm + kGrace) << "B waits for A's hold";
  }
  EXPECT_TRUE(l.holds(kDir, kA));
  DirLeases::Change other(l, kDir, kB);
  EXPECT_EQ(other.wait_ns(), kTerm + kGrace) << "another session's change waits and is not counted";
}

TEST_F(DirLeasesTest, ABatchBeingAppliedKeepsTheHoldPastItsTerm) {
  DirLeases& l = fresh();
  ASSERT_EQ(l.grant(kDir, kA, false).lease_ns, kTerm);
  DirLeases::Change batch(l, kDir, kA);
  ASSERT_EQ(batch.wait_ns(), 0);
  now_ += kTerm + kGrace + 1;
  EXPECT_GT(l.check(kDir, kB), 0) << "B waits for the batch to finish";
  EXPECT_TRUE(l.holds(kDir, kA));
}

TEST_F(DirLeasesTest, TheHoldersOwnChangesDoNotKeepOthersWaitingOnceItsTermIsOver) {
  DirLeases& l = fresh();
  ASSERT_EQ(l.grant(kDir, kA, false).lease_ns, kTerm);
  EXPECT_GT(l.check(kDir, kB), 0);  // B waits: contended
  now_ += kTerm + kGrace;
  {
    DirLeases::Change own(l, kDir, kA);
    EXPECT_EQ(own.wait_ns(), 0);
    EXPECT_FALSE(l.holds(kDir, kA)) << "A goes on without the hold";
    EXPECT_EQ(l.check(kDir, kB), 0) << "B is not kept waiting by A's change in progress";
  }
}

TEST_F(DirLeasesTest, ANewTableWaitsForNothing) {
  DirLeases l(options(kTerm));  // no earlier run: restart_guard_ns 0
  EXPECT_EQ(l.check(kDir, kA), 0);
  EXPECT_EQ(l.grant(kDir, kA, false).lease_ns, kTerm);
}

TEST_F(DirLeasesTest, ARestartedTableMakesEveryOperationWaitAndGrantsNothing) {
  DirLeaseOptions o = options(kTerm);
  o.restart_guard_ns = 4 * kTerm;
  DirLeases l(o);
  EXPECT_EQ(l.check(kDir, kA), 4 * kTerm + kGrace);
  EXPECT_EQ(DirLeases::Change(l, kDir, kA).wait_ns(), 4 * kTerm + kGrace);
  EXPECT_EQ(l.grant(kDir, kA, false).lease_ns, 0);
  now_ += 4 * kTerm + kGrace;
  EXPECT_EQ(l.check(kDir, kA), 0);
  EXPECT_EQ(l.grant(kDir, kA, false).lease_ns, kTerm);
}

TEST_F(DirLeasesTest, OffGrantsNothingAndNeverWaits) {
  DirLeases& l = fresh(0);
  EXPECT_EQ(l.grant(kDir, kA, false).lease_ns, 0);
  EXPECT_EQ(l.check(kDir, kB), 0);
}

TEST_F(DirLeasesTest, InodeNumbersAreUsedOnceAndOnlyByTheirSession) {
  DirLeases& l = fresh();
  l.give_inodes(kA, {InodeId{100}, InodeId{101}});
  EXPECT_EQ(l.inodes_held(kA), 2u);
  EXPECT_FALSE(l.take_inode(kB, InodeId{100}));
  EXPECT_TRUE(l.take_inode(kA, InodeId{100}));
  EXPECT_FALSE(l.take_inode(kA, InodeId{100})) << "used already";
  EXPECT_FALSE(l.take_inode(kA, InodeId{102})) << "never given";
  ASSERT_EQ(l.grant(kDir, kA, false).lease_ns, kTerm);
  l.drop_session(kA);
  EXPECT_FALSE(l.take_inode(kA, InodeId{101}));
  EXPECT_FALSE(l.holds(kDir, kA));
  EXPECT_EQ(l.check(kDir, kB), 0) << "a session that ended holds nothing";
}

TEST_F(DirLeasesTest, SweepForgetsWhatNobodyNeeds) {
  DirLeases& l = fresh();
  ASSERT_EQ(l.grant(kDir, kA, false).lease_ns, kTerm);
  { DirLeases::Change c(l, InodeId{8}, kB); }
  EXPECT_EQ(l.size(), 2u);
  l.sweep();
  EXPECT_EQ(l.size(), 1u) << "the finished change's record goes, the hold stays";
  now_ += kTerm + kGrace + kContended;
  l.sweep();
  EXPECT_EQ(l.size(), 0u);
}

// ---- through MetaService ----

// The fixture's store: a MemoryStore whose writes of granted inode numbers (u/ keys) can be made
// to fail, as a full disk would.
class GrantFaultStore : public Store {
 public:
  explicit GrantFaultStore(MemoryStore* inner) : inner_(inner) {}
  Result<std::optional<std::string>> get(std::string_view key) override {
    auto r = inner_->get(key);
    if (after_read && key == after_read_key) std::exchange(after_read, nullptr)();
    return r;
  }
  Status apply(const WriteBatch& batch) override {
    const bool grants = std::any_of(batch.ops().begin(), batch.ops().end(), [](const WriteBatch::Op& op) {
      return !op.is_delete && op.key.starts_with(schema::kGrantPrefix);
    });
    if (fail_grants && grants) return Status(Code::kIo, "injected: no space left on device");
    return inner_->apply(batch);
  }
  Status sync() override { return inner_->sync(); }
  Status scan(std::string_view prefix, std::string_view seek, const ScanFn& fn) override {
    return inner_->scan(prefix, seek, fn);
  }
  std::string describe() const override { return "memory (grant faults)"; }
  bool fail_grants = false;
  // Runs once, right after the next read of `after_read_key`: a change that commits between two
  // steps of the call being made.
  std::string after_read_key;
  std::function<void()> after_read;

 private:
  MemoryStore* inner_;
};

class MetaDirLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    open_service();
    a_ = svc_->register_session(pm::RegisterSessionReq{"a", "host-a"})->session;
    b_ = svc_->register_session(pm::RegisterSessionReq{"b", "host-b"})->session;
    ASSERT_TRUE(svc_->register_node(pm::RegisterNodeReq{"node-a", "127.0.0.1:7700", {{"t1", "/a", 10, 5}}}).has_value());
    auto d = svc_->mkdir(pm::MkdirReq{kRootInode, "d", 0755, proto::Caller{0, 0}});
    ASSERT_TRUE(d.has_value()) << d.error().to_string();
    dir_ = d->attr.ino;
    ASSERT_TRUE(svc_->create(pm::CreateReq{dir_, "old", 0644, proto::Caller{0, 0}}).has_value());
  }
  void open_service() {
    MetaOptions o;
    o.seed = 1;
    o.dir_leases.term_ns = kTerm;
    o.dir_leases.grace_ns = kGrace;
    o.dir_leases.contended_ns = kContended;
    o.node_report_wait_ns = node_report_wait_ns_;
    o.dir_leases.clock = [this] {
      if (fire_after_ > 0 && --fire_after_ == 0) std::exchange(on_clock_, nullptr)();
      return now_;
    };
    svc_.reset();
    auto s = MetaService::open(&faults_, o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    now_ += kTerm + kGrace + 1;  // past any restart guard
  }
  // A restart of penstock-meta with its data server back (nodes are offline until they report).
  void restart() {
    open_service();
    ASSERT_TRUE(svc_->register_node(pm::RegisterNodeReq{"node-a", "127.0.0.1:7700", {{"t1", "/a", 10, 5}}}).has_value());
  }
  pm::DirLeaseResp lease(SessionId s, uint32_t want = 4) {
    auto r = svc_->dir_lease(pm::DirLeaseReq{s, dir_, false, want});
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? *r : pm::DirLeaseResp{};
  }
  pm::CreateBatchReq batch(SessionId s, const std::vector<std::pair<std::string, InodeId>>& files) {
    pm::CreateBatchReq req{s, dir_, {}, 0};
    for (const auto& [name, ino] : files) req.entries.push_back(pm::CreateBehind{name, ino, 0640, proto::Caller{5, 6}});
    return req;
  }
  int64_t now_ = kT0;
  int64_t node_report_wait_ns_ = 0;  // real time (MetaOptions::now)
  GrantFaultStore faults_{&store_};  // what the service writes to (store_ underneath)
  // Runs on_clock_ inside the fire_after_-th reading of the lease table's clock from now: another
  // call slipped in between two steps of the call being made.
  int fire_after_ = 0;
  std::function<void()> on_clock_;
  MemoryStore store_;
  std::unique_ptr<MetaService> svc_;
  SessionId a_, b_;
  InodeId dir_;
};

TEST_F(MetaDirLeaseTest, TheGrantListsTheNamesAndGivesFreshNumbers) {
  pm::DirLeaseResp r = lease(a_, 3);
  ASSERT_EQ(r.lease_ns, kTerm);
  EXPECT_TRUE(r.fresh);
  EXPECT_EQ(r.names, std::vector<std::string>{"old"});
  EXPECT_EQ(r.dir_attr.ino, dir_);
  ASSERT_EQ(r.inos.size(), 3u);
  std::set<uint64_t> seen;
  for (InodeId i : r.inos) {
    EXPECT_TRUE(seen.insert(i.value).second);
    EXPECT_EQ(svc_->get_attr(pm::InodeReq{i}).status().code(), Code::kNotFound) << "not in use";
  }
  EXPECT_EQ(svc_->dir_lease(pm::DirLeaseReq{a_, InodeId{9999}, false, 0}).status().code(), Code::kNotFound);
  EXPECT_EQ(svc_->dir_lease(pm::DirLeaseReq{SessionId{77}, dir_, false, 0}).status().code(), Code::kBadHandle);
  EXPECT_EQ(lease(b_).lease_ns, 0) << "held by A";
}

TEST_F(MetaDirLeaseTest, CreatesBehindAreAppliedAndOtherSessionsWaitUntilTheLeaseIsOver) {
  pm::DirLeaseResp r = lease(a_, 4);
  ASSERT_EQ(r.inos.size(), 4u);
  auto done = svc_->create_batch(batch(a_, {{"f1", r.inos[0]}, {"f2", r.inos[1]}}));
  ASSERT_TRUE(done.has_value()) << done.error().to_string();
  ASSERT_EQ(done->results.size(), 2u);
  for (const pm::CreateResult& res : done->results) {
    EXPECT_EQ(res.code, 0u) << res.message;
    ASSERT_TRUE(res.attr.has_value());
    EXPECT_EQ(res.attr->uid, 5u);
    EXPECT_EQ(res.attr->mode, S_IFREG | 0640u);
    EXPECT_FALSE(res.attr->layout.chains.empty()) << "the server picks the chains";
  }
  EXPECT_EQ(done->results[0].attr->ino, r.inos[0]);
  EXPECT_EQ(done->lease_ns, kTerm) << "renewed";
  // The holder sees its files at once; every other session's operation on the names waits.
  EXPECT_EQ(svc_->lookup(pm::LookupReq{dir_, "f1", a_})->attr.ino, r.inos[0]);
  EXPECT_EQ(svc_->lookup(pm::LookupReq{dir_, "f1", b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->read_dir(pm::ReadDirReq{dir_, "", 0, false, b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->create(pm::CreateReq{dir_, "x", 0644, proto::Caller{0, 0}, b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->mkdir(pm::MkdirReq{dir_, "x", 0755, proto::Caller{0, 0}, b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->mknod(pm::MknodReq{dir_, "x", S_IFIFO | 0644, 0, proto::Caller{0, 0}, b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->symlink(pm::SymlinkReq{dir_, "x", "t", proto::Caller{0, 0}, b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->link(pm::LinkReq{r.inos[0], dir_, "x", b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->unlink(pm::NameReq{dir_, "f1", b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->rename(pm::RenameReq{dir_, "f1", kRootInode, "x", 0, b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->rename(pm::RenameReq{kRootInode, "d", dir_, "x", 0, b_}).status().code(), Code::kBusy)
      << "into the leased directory";
  EXPECT_TRUE(svc_->get_attr(pm::InodeReq{r.inos[1]}).has_value()) << "inodes are not leased";
  // After the term and grace, B goes on and sees both files. A's next batch comes too late: it is
  // applied all the same (A's applications were told the file exists), and renews nothing.
  now_ += kTerm + kGrace;
  auto seen = svc_->read_dir(pm::ReadDirReq{dir_, "", 0, false, b_});
  ASSERT_TRUE(seen.has_value()) << seen.error().to_string();
  EXPECT_EQ(seen->entries.size(), 3u);
  auto late = svc_->create_batch(batch(a_, {{"f3", r.inos[2]}}));
  ASSERT_TRUE(late.has_value()) << late.error().to_string();
  ASSERT_EQ(late->results.size(), 1u);
  EXPECT_EQ(late->results[0].code, 0u) << late->results[0].message;
  EXPECT_EQ(late->lease_ns, 0) << "not held any more";
  auto f3 = svc_->lookup(pm::LookupReq{dir_, "f3", b_});
  ASSERT_TRUE(f3.has_value()) << f3.error().to_string();
  EXPECT_EQ(f3->attr.ino, r.inos[2]);
  EXPECT_EQ(lease(a_).lease_ns, 0) << "contended";
}

TEST_F(MetaDirLeaseTest, ABatchSentAgainAfterALostReplyIsAnsweredAsBeforeAndOneInAnotherSessionsHoldWaits) {
  pm::DirLeaseResp r = lease(a_, 3);
  ASSERT_EQ(r.inos.size(), 3u);
  const pm::CreateBatchReq req = batch(a_, {{"f1", r.inos[0]}, {"f2", r.inos[1]}});
  auto first = svc_->create_batch(req);
  ASSERT_TRUE(first.has_value()) << first.error().to_string();
  auto again = svc_->create_batch(req);  // the first reply was lost on the way
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  ASSERT_EQ(again->results.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again->results[i].code, 0u) << again->results[i].message;
    ASSERT_TRUE(again->results[i].attr.has_value());
    EXPECT_EQ(again->results[i].attr->ino, req.entries[i].ino);
    EXPECT_EQ(again->results[i].attr->layout.chains, first->results[i].attr->layout.chains);
  }
  // The number of f1 under another name, or another number under f1, is not a resend; an entry
  // refused because its name exists is refused the same way when it is sent again (not kInvalid,
  // which would make the mount drop every number it holds).
  const pm::CreateBatchReq clash = batch(a_, {{"f9", r.inos[0]}, {"f1", r.inos[2]}});
  for (int i = 0; i < 2; ++i) {
    auto reused = svc_->create_batch(clash);
    ASSERT_TRUE(reused.has_value());
    EXPECT_EQ(reused->results[0].code, static_cast<uint32_t>(Code::kInvalid)) << "try " << i;
    EXPECT_EQ(reused->results[1].code, static_cast<uint32_t>(Code::kExists)) << "try " << i;
  }
  // B's batch for a directory A holds waits as a whole until A's hold is over.
  pm::DirLeaseResp rb = svc_->dir_lease(pm::DirLeaseReq{b_, kRootInode, false, 1}).value();
  ASSERT_EQ(rb.inos.size(), 1u);
  pm::CreateBatchReq from_b = batch(b_, {{"g", rb.inos[0]}});
  auto busy = svc_->create_batch(from_b);
  EXPECT_EQ(busy.status().code(), Code::kBusy) << busy.status().to_string();
  now_ += kTerm + kGrace;
  auto later = svc_->create_batch(from_b);
  ASSERT_TRUE(later.has_value()) << later.error().to_string();
  EXPECT_EQ(later->results[0].code, 0u) << later->results[0].message << ": the number was not used up by the wait";
  auto g = svc_->lookup(pm::LookupReq{dir_, "g", a_});
  ASSERT_TRUE(g.has_value()) << g.error().to_string();
  EXPECT_EQ(g->attr.ino, rb.inos[0]);
}

TEST_F(MetaDirLeaseTest, AFileSentClosedHasNoOpenToOutliveItsUnlink) {
  pm::DirLeaseResp r = lease(a_, 2);
  pm::CreateBatchReq req = batch(a_, {{"open", r.inos[0]}, {"closed", r.inos[1]}});
  req.entries[1].open = false;
  auto done = svc_->create_batch(req);
  ASSERT_TRUE(done.has_value()) << done.error().to_string();
  ASSERT_TRUE(svc_->unlink(pm::NameReq{dir_, "open", a_}).has_value());
  ASSERT_TRUE(svc_->unlink(pm::NameReq{dir_, "closed", a_}).has_value());
  auto gc = svc_->gc_pending(InodeId{0}, 10);
  ASSERT_TRUE(gc.has_value()) << gc.error().to_string();
  ASSERT_EQ(gc->size(), 1u) << "only the closed file is collected at once";
  EXPECT_EQ((*gc)[0].ino, r.inos[1]);
  EXPECT_TRUE(svc_->get_attr(pm::InodeReq{r.inos[0]}).has_value()) << "still open for A";
}

TEST_F(MetaDirLeaseTest, ABatchUsesOnlyItsOwnNumbersOnceAndNamesOnce) {
  pm::DirLeaseResp ra = lease(a_, 4);
  ASSERT_EQ(ra.inos.size(), 4u);
  auto done = svc_->create_batch(batch(a_, {{"f1", ra.inos[0]},
                                           {"f2", ra.inos[0]},         // used by f1
                                           {"f3", InodeId{424242}},    // never given
                                           {"f1", ra.inos[1]},         // twice in the batch
                                           {"old", ra.inos[2]},        // exists
                                           {"a/b", ra.inos[3]}}));     // bad name
  ASSERT_TRUE(done.has_value()) << done.error().to_string();
  ASSERT_EQ(done->results.size(), 6u);
  EXPECT_EQ(done->results[0].code, 0u);
  EXPECT_EQ(done->results[1].code, static_cast<uint32_t>(Code::kInvalid));
  EXPECT_EQ(done->results[2].code, static_cast<uint32_t>(Code::kInvalid));
  EXPECT_EQ(done->results[3].code, static_cast<uint32_t>(Code::kExists));
  EXPECT_EQ(done->results[4].code, static_cast<uint32_t>(Code::kExists));
  EXPECT_EQ(done->results[5].code, static_cast<uint32_t>(Code::kInvalid));
  EXPECT_EQ(svc_->lookup(pm::LookupReq{dir_, "f1", a_})->attr.ino, ra.inos[0]);
  // Another session's numbers.
  pm::DirLeaseResp rb = svc_->dir_lease(pm::DirLeaseReq{b_, kRootInode, false, 2}).value();
  auto other = svc_->create_batch(batch(a_, {{"g", rb.inos[0]}}));
  ASSERT_TRUE(other.has_value());
  EXPECT_EQ(other->results[0].code, static_cast<uint32_t>(Code::kInvalid));
  pm::CreateBatchReq huge{a_, dir_, std::vector<pm::CreateBehind>(pm::kMaxCreateBatch + 1), 0};
  EXPECT_EQ(svc_->create_batch(huge).status().code(), Code::kInvalid);
}

TEST_F(MetaDirLeaseTest, ALargeDirectoryIsNotLeasedAndAClosedSessionHoldsNothing) {
  for (size_t i = 0; i < pm::kMaxLeasedNames; ++i) {
    ASSERT_TRUE(svc_->create(pm::CreateReq{dir_, "n" + std::to_string(i), 0644, proto::Caller{0, 0}}).has_value());
  }
  pm::DirLeaseResp r = lease(a_, 0);
  EXPECT_EQ(r.lease_ns, 0) << "over kMaxLeasedNames names";
  EXPECT_TRUE(r.names.empty());
  EXPECT_TRUE(svc_->lookup(pm::LookupReq{dir_, "old", b_}).has_value()) << "not held";
  ASSERT_TRUE(svc_->unlink(pm::NameReq{dir_, "n0", a_}).has_value());
  ASSERT_TRUE(svc_->unlink(pm::NameReq{dir_, "n1", a_}).has_value());
  ASSERT_EQ(lease(a_, 0).lease_ns, kTerm);
  ASSERT_TRUE(svc_->close_session(pm::SessionReq{a_}).is_ok());
  EXPECT_TRUE(svc_->lookup(pm::LookupReq{dir_, "old", b_}).has_value()) << "A's session ended";
}

TEST_F(MetaDirLeaseTest, RemovingALeasedDirectoryWaitsLikeAChangeOfItsNames) {
  // Empty in the store, but its holder may have answered creates not applied yet.
  auto e = svc_->mkdir(pm::MkdirReq{kRootInode, "empty", 0755, proto::Caller{0, 0}});
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  ASSERT_EQ(svc_->dir_lease(pm::DirLeaseReq{a_, e->attr.ino, false, 0})->lease_ns, kTerm);
  EXPECT_EQ(svc_->rmdir(pm::NameReq{kRootInode, "empty", b_}).status().code(), Code::kBusy);
  ASSERT_TRUE(svc_->mkdir(pm::MkdirReq{kRootInode, "other", 0755, proto::Caller{0, 0}}).has_value());
  EXPECT_EQ(svc_->rename(pm::RenameReq{kRootInode, "other", kRootInode, "empty", 0, b_}).status().code(), Code::kBusy)
      << "a rename that would replace it";
  now_ += kTerm + kGrace;
  EXPECT_TRUE(svc_->rmdir(pm::NameReq{kRootInode, "empty", b_}).is_ok());
}

// An rmdir that commits between the lease's look at the directory and its grant: no lease comes
// back, so the mount answers no create behind it for a directory that is gone (every one of them
// would be refused later, after the application was told its file exists).
TEST_F(MetaDirLeaseTest, NoLeaseOnADirectoryRemovedWhileTheLeaseIsGranted) {
  ASSERT_TRUE(svc_->unlink(pm::NameReq{dir_, "old", b_}).has_value());
  faults_.after_read_key = schema::inode_key(dir_);
  faults_.after_read = [&] { ASSERT_TRUE(svc_->rmdir(pm::NameReq{kRootInode, "d", b_}).is_ok()); };
  auto r = svc_->dir_lease(pm::DirLeaseReq{a_, dir_, false, 4});
  ASSERT_FALSE(faults_.after_read) << "the rmdir ran";
  ASSERT_FALSE(r.has_value() && r->lease_ns > 0) << "a lease on a removed directory";
  if (!r.has_value()) {
    EXPECT_EQ(r.error().code(), Code::kNotFound) << r.error().to_string();
  }
}

TEST_F(MetaDirLeaseTest, ADirectoryRenamedOverTheOneAnRmdirCheckedIsNotRemoved) {
  auto v = svc_->mkdir(pm::MkdirReq{kRootInode, "v", 0755, proto::Caller{0, 0}});
  auto w = svc_->mkdir(pm::MkdirReq{kRootInode, "w", 0755, proto::Caller{0, 0}});
  ASSERT_TRUE(v.has_value() && w.has_value());
  ASSERT_EQ(svc_->dir_lease(pm::DirLeaseReq{a_, w->attr.ino, false, 0})->lease_ns, kTerm);  // A creates in w
  // B's rmdir of v checks v's lease (none); before it removes v, a rename puts w in v's place.
  fire_after_ = 2;  // the first reading is rmdir's change of the parent, the second its check of v
  on_clock_ = [&] {
    ASSERT_TRUE(svc_->rename(pm::RenameReq{kRootInode, "w", kRootInode, "v", 0, b_}).is_ok());
  };
  Status st = svc_->rmdir(pm::NameReq{kRootInode, "v", b_}).status();
  ASSERT_FALSE(on_clock_) << "the rename ran";
  EXPECT_EQ(st.code(), Code::kBusy) << st.to_string();
  auto still = svc_->lookup(pm::LookupReq{kRootInode, "v", a_});
  ASSERT_TRUE(still.has_value()) << "A's leased directory was removed: " << still.error().to_string();
  EXPECT_EQ(still->attr.ino, w->attr.ino);
  // The client retries: now the check sees w, leased to A, and waits it out.
  EXPECT_EQ(svc_->rmdir(pm::NameReq{kRootInode, "v", b_}).status().code(), Code::kBusy);
  now_ += kTerm + kGrace;
  EXPECT_TRUE(svc_->rmdir(pm::NameReq{kRootInode, "v", b_}).is_ok());
}

TEST_F(MetaDirLeaseTest, ARestartWaitsOutTheTermAnEarlierRunGranted) {
  ASSERT_EQ(lease(a_).lease_ns, kTerm);
  const int64_t before = now_;
  open_service();
  now_ = before;  // just restarted: A may still answer from its lease
  EXPECT_EQ(svc_->lookup(pm::LookupReq{dir_, "old", b_}).status().code(), Code::kBusy);
  EXPECT_EQ(svc_->dir_lease(pm::DirLeaseReq{b_, dir_, false, 0})->lease_ns, 0);
  now_ += kTerm + kGrace;
  EXPECT_TRUE(svc_->lookup(pm::LookupReq{dir_, "old", b_}).has_value());
}

// A batch is committed before its refill of numbers is taken: a refill that fails leaves the
// batch's answer as it is (else the mount would count its files as lost), with no numbers in it.
TEST_F(MetaDirLeaseTest, ARefillThatFailsDoesNotFailTheBatchBeforeIt) {
  const pm::DirLeaseResp r = lease(a_, 2);
  ASSERT_EQ(r.inos.size(), 2u);
  faults_.fail_grants = true;
  pm::CreateBatchReq req = batch(a_, {{"x", r.inos[0]}});
  req.want_inodes = 8;
  auto done = svc_->create_batch(req);
  ASSERT_TRUE(done.has_value()) << done.error().to_string();
  EXPECT_EQ(done->results[0].code, 0u) << done->results[0].message;
  EXPECT_TRUE(done->inos.empty());
  EXPECT_TRUE(svc_->lookup(pm::LookupReq{dir_, "x", a_}).has_value());
  // Asked for with a lease, the failure is the answer; once the disk has room, numbers come again.
  auto refused = svc_->dir_lease(pm::DirLeaseReq{a_, dir_, true, 4});
  EXPECT_EQ(refused.status().code(), Code::kIo) << refused.status().to_string();
  faults_.fail_grants = false;
  req = batch(a_, {{"y", r.inos[1]}});
  req.want_inodes = 8;
  auto refilled = svc_->create_batch(req);
  ASSERT_TRUE(refilled.has_value()) << refilled.error().to_string();
  EXPECT_EQ(refilled->inos.size(), 8u);
}

// Every data server is offline after a start until it reports again: creates wait for them (a
// layout chosen before would leave them out), a batch of creates behind as a whole.
TEST_F(MetaDirLeaseTest, ARestartedServerHoldsCreatesUntilItsDataServersReport) {
  const pm::DirLeaseResp r = lease(a_, 1);
  ASSERT_EQ(r.inos.size(), 1u);
  node_report_wait_ns_ = 60'000'000'000;
  open_service();  // past the lease term, within the minute the server waits for data servers
  auto early = svc_->create(pm::CreateReq{dir_, "early", 0644, proto::Caller{0, 0}});
  EXPECT_EQ(early.status().code(), Code::kBusy) << early.status().to_string();
  auto batch_early = svc_->create_batch(batch(a_, {{"b", r.inos[0]}}));
  EXPECT_EQ(batch_early.status().code(), Code::kBusy) << batch_early.status().to_string();
  ASSERT_TRUE(svc_->register_node(pm::RegisterNodeReq{"node-a", "127.0.0.1:7700", {{"t1", "/a", 10, 5}}}).has_value());
  EXPECT_TRUE(svc_->create(pm::CreateReq{dir_, "early", 0644, proto::Caller{0, 0}}).has_value());
  auto applied = svc_->create_batch(batch(a_, {{"b", r.inos[0]}}));
  ASSERT_TRUE(applied.has_value()) << applied.error().to_string();
  EXPECT_EQ(applied->results[0].code, 0u) << applied->results[0].message;
  // A data server that does not come back is waited for that long only.
  node_report_wait_ns_ = 1'000'000;
  open_service();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto late = svc_->create(pm::CreateReq{dir_, "late", 0644, proto::Caller{0, 0}});
  EXPECT_EQ(late.status().code(), Code::kUnavailable) << late.status().to_string();
}

// A mount may hold files made with its numbers for a flush interval, or resend a batch a restart
// cut off: the numbers outlive the restart, and go with the session that had them.
TEST_F(MetaDirLeaseTest, NumbersGivenBeforeARestartStillMakeFilesAndGoWithTheirSession) {
  auto stored = [this](SessionId s) {
    size_t n = 0;
    const std::string prefix = schema::grant_prefix(s);
    EXPECT_TRUE(store_.scan(prefix, prefix, [&](std::string_view, std::string_view) {
                        ++n;
                        return true;
                      }).is_ok());
    return n;
  };
  const pm::DirLeaseResp r = lease(a_, 4);
  ASSERT_EQ(r.inos.size(), 4u);
  pm::DirLeaseResp rb = svc_->dir_lease(pm::DirLeaseReq{b_, kRootInode, false, 2}).value();
  ASSERT_EQ(rb.inos.size(), 2u);
  EXPECT_EQ(stored(a_), 4u);
  restart();
  const pm::CreateBatchReq req = batch(a_, {{"x", r.inos[0]}, {"y", r.inos[1]}});
  auto made = svc_->create_batch(req);
  ASSERT_TRUE(made.has_value()) << made.error().to_string();
  for (const pm::CreateResult& res : made->results) EXPECT_EQ(res.code, 0u) << res.message;
  auto x = svc_->lookup(pm::LookupReq{dir_, "x", b_});
  ASSERT_TRUE(x.has_value()) << x.error().to_string();
  EXPECT_EQ(x->attr.ino, r.inos[0]);
  EXPECT_EQ(stored(a_), 2u) << "a used number stays stored";

  // Sent again across a second restart: answered as applied, the other numbers still good.
  restart();
  auto again = svc_->create_batch(req);
  ASSERT_TRUE(again.has_value()) << again.error().to_string();
  for (const pm::CreateResult& res : again->results) EXPECT_EQ(res.code, 0u) << res.message;
  auto z = svc_->create_batch(batch(a_, {{"z", r.inos[2]}}));
  ASSERT_TRUE(z.has_value()) << z.error().to_string();
  EXPECT_EQ(z->results[0].code, 0u) << z->results[0].message;

  // A closed session's numbers are deleted with it and are good for nobody after a restart.
  EXPECT_EQ(stored(b_), 2u);
  ASSERT_TRUE(svc_->close_session(pm::SessionReq{b_}).is_ok());
  EXPECT_EQ(stored(b_), 0u);
  restart();
  auto refused = svc_->create_batch(batch(a_, {{"w", rb.inos[0]}}));
  ASSERT_TRUE(refused.has_value()) << refused.error().to_string();
  EXPECT_EQ(refused->results[0].code, static_cast<uint32_t>(Code::kInvalid));
  EXPECT_EQ(stored(a_), 1u);

  // Numbers of a session the database no longer has (its close was cut short) go at the start.
  const SessionId gone{9999};
  WriteBatch stale;
  stale.put(schema::grant_key(gone, InodeId{r.inos[3].value + 100}), "");
  ASSERT_TRUE(store_.apply(stale).is_ok());
  EXPECT_EQ(stored(gone), 1u);
  restart();
  EXPECT_EQ(stored(gone), 0u);
  EXPECT_EQ(stored(a_), 1u);
}

}  // namespace
}  // namespace penstock::meta
