// Directory entry leases: grants, the wait of a change, the lookup/change race, the restart guard,
// and the same through MetaService (lookup, rmdir, rename) with a fake clock.
#include "server/meta/entry_leases.h"

#include <sys/stat.h>

#include <vector>

#include <gtest/gtest.h>

#include "server/meta/store.h"
#include "server/meta/namespace.h"

namespace penstock::meta {
namespace {

constexpr int64_t kTerm = 1'000'000'000;
constexpr int64_t kGrace = 100'000'000;
constexpr int64_t kT0 = 5'000'000'000'000;

class FakeTime {
 public:
  EntryLeaseOptions options(int64_t term = kTerm) {
    EntryLeaseOptions o;
    o.term_ns = term;
    o.grace_ns = kGrace;
    o.clock = [this] { return now; };
    o.sleep_until = [this](int64_t until) {
      sleeps.push_back(until);
      if (until > now) now = until;
    };
    return o;
  }
  int64_t now = kT0;
  std::vector<int64_t> sleeps;
};

const InodeId kDir{7};
const SessionId kA{1}, kB{2};

class EntryLeasesTest : public ::testing::Test {
 protected:
  // A table past its restart guard.
  EntryLeases& fresh(int64_t term = kTerm) {
    leases_ = std::make_unique<EntryLeases>(time_.options(term));
    time_.now += term + 1;
    return *leases_;
  }
  FakeTime time_;
  std::unique_ptr<EntryLeases> leases_;
};

TEST_F(EntryLeasesTest, GrantsTheTermToASessionAndNothingWithoutOne) {
  EntryLeases& l = fresh();
  EXPECT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), kTerm);
  EXPECT_EQ(l.grant({kDir, "d"}, SessionId(), l.epoch()), 0);
  EXPECT_EQ(l.size(), 1u);
}

TEST_F(EntryLeasesTest, OffGrantsNothingAndNeverWaits) {
  EntryLeases l(time_.options(0));
  EXPECT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), 0);
  { EntryLeases::Change c(l, {{kDir, "d"}}, kB); EXPECT_EQ(c.waited_ns(), 0); }
  EXPECT_TRUE(time_.sleeps.empty());
}

TEST_F(EntryLeasesTest, AChangeWaitsOutAnotherSessionsLeaseButNotItsOwn) {
  EntryLeases& l = fresh();
  const int64_t granted_at = time_.now;
  ASSERT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), kTerm);
  time_.now += 300'000'000;
  {
    EntryLeases::Change own(l, {{kDir, "d"}}, kA);
    EXPECT_EQ(own.waited_ns(), 0);
  }
  EXPECT_TRUE(time_.sleeps.empty());
  // The epoch moved, so A asks again; B's rmdir must then wait A's new lease out.
  ASSERT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), kTerm);
  const int64_t regranted_at = time_.now;
  {
    EntryLeases::Change other(l, {{kDir, "x"}, {kDir, "d"}}, kB);
    ASSERT_EQ(time_.sleeps.size(), 1u);
    EXPECT_EQ(time_.sleeps[0], regranted_at + kTerm + kGrace);
    EXPECT_GT(regranted_at, granted_at);
    EXPECT_EQ(other.waited_ns(), kTerm + kGrace);
  }
  // An expired lease delays nothing.
  ASSERT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), kTerm);
  time_.now += kTerm;
  { EntryLeases::Change later(l, {{kDir, "d"}}, kB); EXPECT_EQ(later.waited_ns(), 0); }
  EXPECT_EQ(time_.sleeps.size(), 1u);
}

TEST_F(EntryLeasesTest, NoGrantWhileAChangeIsInProgressNorAfterOneFinishedSinceTheRead) {
  EntryLeases& l = fresh();
  const uint64_t before = l.epoch();
  {
    EntryLeases::Change c(l, {{kDir, "d"}}, kB);
    EXPECT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), 0) << "granted during the change";
    EXPECT_EQ(l.grant({kDir, "other"}, kA, l.epoch()), kTerm) << "other names are not affected";
  }
  // A lookup that read the namespace before the change finished must not cache what it read.
  EXPECT_EQ(l.grant({kDir, "d"}, kA, before), 0);
  EXPECT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), kTerm);
}

TEST_F(EntryLeasesTest, ARenameByTheHolderMovesItsLeaseToTheNewName) {
  EntryLeases& l = fresh();
  ASSERT_EQ(l.grant({kDir, "old"}, kA, l.epoch()), kTerm);
  const int64_t expiry = time_.now + kTerm;
  {
    EntryLeases::Change c(l, {{kDir, "old"}, {kDir, "new"}}, kA);
    EXPECT_EQ(c.waited_ns(), 0);
    c.moved({kDir, "old"}, {kDir, "new"});
  }
  // A's kernel keeps trusting the moved dentry under its new name: B's change of it waits.
  { EntryLeases::Change c(l, {{kDir, "new"}}, kB); }
  ASSERT_EQ(time_.sleeps.size(), 1u);
  EXPECT_EQ(time_.sleeps[0], expiry + kGrace);
}

TEST_F(EntryLeasesTest, ARestartedTableMakesEveryChangeWaitOneTerm) {
  EntryLeases l(time_.options());
  const int64_t start = time_.now;
  EXPECT_EQ(l.grant({kDir, "d"}, kA, l.epoch()), kTerm);
  { EntryLeases::Change c(l, {{kDir, "never-leased"}}, kA); }
  ASSERT_EQ(time_.sleeps.size(), 1u);
  EXPECT_EQ(time_.sleeps[0], start + kTerm + kGrace);
}

// An earlier run of the database granted longer leases than this one does, or this one grants none:
// the guard covers the earlier term.
TEST_F(EntryLeasesTest, TheRestartGuardCoversALongerEarlierTerm) {
  EntryLeaseOptions o = time_.options();
  o.restart_guard_ns = 5 * kTerm;
  const int64_t start = time_.now;
  {
    EntryLeases l(o);
    EntryLeases::Change c(l, {{kDir, "d"}}, kA);
    EXPECT_EQ(c.waited_ns(), 5 * kTerm + kGrace);
  }
  o = time_.options(0);  // leases off now
  o.restart_guard_ns = 5 * kTerm;
  EntryLeases off(o);
  const int64_t off_start = time_.now;
  { EntryLeases::Change c(off, {{kDir, "d"}}, kA); }
  ASSERT_EQ(time_.sleeps.size(), 2u);
  EXPECT_EQ(time_.sleeps[0], start + 5 * kTerm + kGrace);
  EXPECT_EQ(time_.sleeps[1], off_start + 5 * kTerm + kGrace) << "leases off must still cover earlier ones";
  EXPECT_EQ(off.grant({kDir, "d"}, kA, off.epoch()), 0);
  time_.now += 5 * kTerm + kGrace;
  { EntryLeases::Change c(off, {{kDir, "d"}}, kA); EXPECT_EQ(c.waited_ns(), 0); }
}

TEST_F(EntryLeasesTest, AFullTableSweepsExpiredNamesAndThenRefuses) {
  EntryLeaseOptions o = time_.options();
  o.max_names = 2;
  EntryLeases l(o);
  time_.now += kTerm + 1;
  EXPECT_EQ(l.grant({kDir, "a"}, kA, l.epoch()), kTerm);
  EXPECT_EQ(l.grant({kDir, "b"}, kA, l.epoch()), kTerm);
  EXPECT_EQ(l.grant({kDir, "c"}, kA, l.epoch()), 0) << "over max_names";
  EXPECT_EQ(l.grant({kDir, "a"}, kB, l.epoch()), kTerm) << "a known name is renewed";
  time_.now += kTerm;
  EXPECT_EQ(l.grant({kDir, "c"}, kA, l.epoch()), kTerm) << "expired names were swept";
  EXPECT_EQ(l.size(), 1u);
}

// ---- through MetaService ----

class MetaLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    MetaOptions o;
    o.seed = 1;
    o.entry_leases = time_.options();
    auto s = MetaService::open(&store_, o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    a_ = svc_->register_session(pm::RegisterSessionReq{"a", "host-a"})->session;
    b_ = svc_->register_session(pm::RegisterSessionReq{"b", "host-b"})->session;
    ASSERT_TRUE(svc_->mkdir(pm::MkdirReq{kRootInode, "d", 0755, proto::Caller{0, 0}}).has_value());
    ASSERT_TRUE(svc_->mkdir(pm::MkdirReq{kRootInode, "e", 0755, proto::Caller{0, 0}}).has_value());
    time_.now += kTerm + kGrace + 1;  // past the restart guard
    time_.sleeps.clear();
  }
  int64_t lease(const std::string& name, SessionId s) {
    auto r = svc_->lookup(pm::LookupReq{kRootInode, name, s});
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->entry_lease_ns : -1;
  }
  FakeTime time_;
  MemoryStore store_;
  std::unique_ptr<MetaService> svc_;
  SessionId a_, b_;
};

TEST_F(MetaLeaseTest, OnlyDirectoriesLookedUpForASessionAreLeased) {
  EXPECT_EQ(lease("d", a_), kTerm);
  EXPECT_EQ(lease("d", SessionId()), 0);
  ASSERT_TRUE(svc_->symlink(pm::SymlinkReq{kRootInode, "f", "d", proto::Caller{0, 0}}).has_value());
  EXPECT_EQ(lease("f", a_), 0) << "only a directory's dentry may be reused without asking";
}

TEST_F(MetaLeaseTest, RmdirAndRenameByAnotherSessionWaitTheLeaseOut) {
  ASSERT_EQ(lease("d", a_), kTerm);
  const int64_t expiry = time_.now + kTerm;
  ASSERT_TRUE(svc_->rmdir(pm::NameReq{kRootInode, "d", b_}).is_ok());
  ASSERT_EQ(time_.sleeps.size(), 1u);
  EXPECT_EQ(time_.sleeps[0], expiry + kGrace);
  // The holder's own rename does not wait, and its lease follows the directory's new name.
  ASSERT_EQ(lease("e", a_), kTerm);
  ASSERT_TRUE(svc_->rename(pm::RenameReq{kRootInode, "e", kRootInode, "e2", 0, a_}).is_ok());
  EXPECT_EQ(time_.sleeps.size(), 1u);
  ASSERT_TRUE(svc_->rename(pm::RenameReq{kRootInode, "e2", kRootInode, "e3", 0, b_}).is_ok());
  EXPECT_EQ(time_.sleeps.size(), 2u) << "B's rename of the name A's kernel now trusts must wait";
  // A failed change waits too (it cannot know in advance), but leaves every lease in place.
  ASSERT_EQ(lease("e3", a_), kTerm);
  EXPECT_EQ(svc_->rmdir(pm::NameReq{kRootInode, "e3x", b_}).status().code(), Code::kNotFound);
  EXPECT_EQ(time_.sleeps.size(), 2u) << "no lease on that name";
  EXPECT_EQ(svc_->rename(pm::RenameReq{kRootInode, "nope", kRootInode, "e3", 0, a_}).status().code(), Code::kNotFound);
  EXPECT_EQ(time_.sleeps.size(), 2u) << "A's own lease does not delay A";
  ASSERT_TRUE(svc_->rmdir(pm::NameReq{kRootInode, "e3", b_}).is_ok());
  EXPECT_EQ(time_.sleeps.size(), 3u) << "A's lease survived A's failed rename";
}

// The term is kept in the database: a restart with a shorter term, or with leases off, still waits
// out leases the earlier, longer-lived run may have granted just before it stopped.
TEST_F(MetaLeaseTest, ARestartWithAShorterTermWaitsOutTheLongerOne) {
  auto reopen = [&](int64_t term) {
    svc_.reset();
    MetaOptions o;
    o.seed = 1;
    o.entry_leases = time_.options(term);
    auto s = MetaService::open(&store_, o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    time_.sleeps.clear();
  };
  reopen(4 * kTerm);
  time_.now += 4 * kTerm + kGrace + 1;
  ASSERT_TRUE(svc_->mkdir(pm::MkdirReq{kRootInode, "x", 0755, proto::Caller{0, 0}}).has_value());
  ASSERT_EQ(svc_->lookup(pm::LookupReq{kRootInode, "x", a_})->entry_lease_ns, 4 * kTerm);
  reopen(kTerm);  // A's kernel may trust "x" for almost 4 terms more
  const int64_t start = time_.now;
  ASSERT_TRUE(svc_->rename(pm::RenameReq{kRootInode, "x", kRootInode, "y", 0, b_}).is_ok());
  ASSERT_EQ(time_.sleeps.size(), 1u);
  EXPECT_EQ(time_.sleeps[0], start + 4 * kTerm + kGrace);
  reopen(0);  // leases off: still not before the longest term is over
  const int64_t off_start = time_.now;
  ASSERT_TRUE(svc_->rmdir(pm::NameReq{kRootInode, "y", b_}).is_ok());
  ASSERT_EQ(time_.sleeps.size(), 1u);
  EXPECT_EQ(time_.sleeps[0], off_start + 4 * kTerm + kGrace);
  EXPECT_EQ(svc_->lookup(pm::LookupReq{kRootInode, "e", a_})->entry_lease_ns, 0);
}

TEST_F(MetaLeaseTest, ExchangeAndReplacingRenamesWaitForEitherName) {
  ASSERT_TRUE(svc_->symlink(pm::SymlinkReq{kRootInode, "f", "x", proto::Caller{0, 0}}).has_value());
  // A trusts "e"; B swaps a symlink with it: A's dentry "e" would point at the wrong inode.
  ASSERT_EQ(lease("e", a_), kTerm);
  ASSERT_TRUE(svc_->rename(pm::RenameReq{kRootInode, "f", kRootInode, "e", pm::kRenameExchange, b_}).is_ok());
  EXPECT_EQ(time_.sleeps.size(), 1u);
  // A trusts "d"; B moves another empty directory over it.
  ASSERT_TRUE(svc_->mkdir(pm::MkdirReq{kRootInode, "g", 0755, proto::Caller{0, 0}}).has_value());
  ASSERT_EQ(lease("d", a_), kTerm);
  ASSERT_TRUE(svc_->rename(pm::RenameReq{kRootInode, "g", kRootInode, "d", 0, b_}).is_ok());
  EXPECT_EQ(time_.sleeps.size(), 2u);
  // Expired leases are swept by the periodic expiry.
  time_.now += kTerm + kGrace;
  ASSERT_TRUE(svc_->expire().is_ok());
  EXPECT_EQ(lease("d", SessionId()), 0);
}

}  // namespace
}  // namespace penstock::meta
