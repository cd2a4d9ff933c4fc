// Open records: which opens reach the store, and that the ones a crash must keep are kept
// (server/meta/open_table.h).
#include "server/meta/open_table.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "server/meta/namespace.h"
#include "tests/unit/meta/test_env.h"

namespace penstock::meta {
namespace {

constexpr int64_t kStart = 1'700'000'000'000'000'000;
constexpr int64_t kDelay = 100'000'000;
const SessionId kA(7);
const SessionId kB(8);
const InodeId kF(100);
const InodeId kG(101);

// The keys a batch puts ("+key") and deletes ("-key"), in order; keys shown as prefix/session/ino.
std::vector<std::string> ops_of(const WriteBatch& b) {
  std::vector<std::string> out;
  for (const auto& op : b.ops()) {
    const std::string prefix = op.key.substr(0, 2);
    const uint64_t first = schema::read_be64(std::string_view(op.key).substr(2));
    const uint64_t second = schema::read_be64(std::string_view(op.key).substr(10));
    out.push_back((op.is_delete ? "-" : "+") + prefix + std::to_string(first) + "/" + std::to_string(second));
  }
  return out;
}

TEST(OpenTable, AnOpenClosedWithinTheDelayNeverReachesTheStore) {
  OpenTable t;
  EXPECT_EQ(t.add(kA, kF, kStart), 1u);
  EXPECT_EQ(t.add(kA, kF, kStart), 2u);
  EXPECT_EQ(t.size(), 1u);
  EXPECT_TRUE(t.has_other(kF, kB));
  EXPECT_FALSE(t.has_other(kF, kA));
  EXPECT_EQ(t.drop(kA, kF, 2, kStart + 1), 0u);
  EXPECT_EQ(t.size(), 0u);
  EXPECT_FALSE(t.has_other(kF, SessionId()));
  WriteBatch b;
  EXPECT_FALSE(t.flush_aged(kStart + 10 * kDelay, kDelay, &b));
  EXPECT_TRUE(b.empty());
  EXPECT_EQ(t.drop(kA, kF, 1, kStart), 0u) << "a close without an open is nothing";
}

TEST(OpenTable, AnOpenHeldPastTheDelayIsWrittenAndItsCloseDeletedAfterTheDelay) {
  OpenTable t;
  t.add(kA, kF, kStart);
  WriteBatch early;
  EXPECT_FALSE(t.flush_aged(kStart + kDelay - 1, kDelay, &early)) << "younger than the delay";
  WriteBatch b;
  EXPECT_TRUE(t.flush_aged(kStart + kDelay, kDelay, &b));
  EXPECT_EQ(ops_of(b), (std::vector<std::string>{"+o/7/100", "+p/100/7"}));
  // The batch failed: the open is still due, and is written again by the next flush.
  t.written_dropped();
  WriteBatch retry;
  EXPECT_TRUE(t.flush_aged(kStart + kDelay, kDelay, &retry));
  EXPECT_EQ(ops_of(retry), (std::vector<std::string>{"+o/7/100", "+p/100/7"}));
  t.written_applied();
  // A second open writes the new count; the stored close of both deletes both keys.
  t.add(kA, kF, kStart + 2 * kDelay);
  WriteBatch c;
  EXPECT_TRUE(t.flush_aged(kStart + 3 * kDelay, kDelay, &c));
  EXPECT_EQ(ops_of(c), (std::vector<std::string>{"+o/7/100", "+p/100/7"}));
  t.written_applied();
  EXPECT_EQ(t.drop(kA, kF, 5, kStart + 4 * kDelay), 0u);
  EXPECT_FALSE(t.has_other(kF, SessionId())) << "closed, though the store still has it";
  WriteBatch d;
  EXPECT_TRUE(t.flush_aged(kStart + 5 * kDelay, kDelay, &d));
  EXPECT_EQ(ops_of(d), (std::vector<std::string>{"-o/7/100", "-p/100/7"}));
  t.written_applied();
  WriteBatch none;
  EXPECT_FALSE(t.flush_aged(kStart + 9 * kDelay, 0, &none));
  // A clock that stepped back does not hold changes back.
  t.add(kA, kG, kStart + 20 * kDelay);
  WriteBatch back;
  EXPECT_TRUE(t.flush_aged(kStart, kDelay, &back));
  EXPECT_EQ(ops_of(back), (std::vector<std::string>{"+o/7/101", "+p/101/7"}));
}

TEST(OpenTable, AnInodeSessionAndLoadedOpensAreWrittenAsTheyAre) {
  OpenTable t;
  t.add(kA, kF, kStart);
  t.add(kB, kF, kStart);
  t.add(kA, kG, kStart);
  EXPECT_EQ(t.size(), 3u);
  WriteBatch b;
  t.store_inode(kF, &b);  // the unlink of f carries both opens of f, and only those
  std::vector<std::string> got = ops_of(b);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, (std::vector<std::string>{"+o/7/100", "+o/8/100", "+p/100/7", "+p/100/8"}));
  t.written_applied();
  WriteBatch again;
  t.store_inode(kF, &again);
  EXPECT_TRUE(again.empty()) << "already stored as they are";
  // Session A ends: its stored open of f is deleted, its unstored open of g simply goes.
  WriteBatch s;
  t.drop_session(kA, &s);
  EXPECT_EQ(ops_of(s), (std::vector<std::string>{"-o/7/100", "-p/100/7"}));
  t.written_applied();
  EXPECT_TRUE(t.inodes_of(kA).empty());
  EXPECT_EQ(t.inodes_of(kB), std::vector<InodeId>{kF});
  EXPECT_TRUE(t.has_other(kF, SessionId()));
  EXPECT_FALSE(t.has_other(kG, SessionId()));
  // An open found in the store at start is stored already: only its close writes.
  OpenTable l;
  l.load(kA, kG, 3);
  EXPECT_EQ(l.count(kA, kG), 3u);
  WriteBatch nothing;
  EXPECT_FALSE(l.flush_aged(kStart, 0, &nothing));
  EXPECT_EQ(l.drop(kA, kG, 3, kStart), 0u);
  WriteBatch del;
  EXPECT_TRUE(l.flush_aged(kStart, 0, &del));
  EXPECT_EQ(ops_of(del), (std::vector<std::string>{"-o/7/101", "-p/101/7"}));
}

// A metadata server over one MemoryStore that outlives it: dropping the service without
// store_opens() is a crash of penstock-meta in which the store keeps every applied write (the WAL
// in the page cache).
class OpenFilesAcrossACrash : public ::testing::Test {
 protected:
  void SetUp() override {
    start();
    auto s = svc_->register_session(pm::RegisterSessionReq{"test", "host"});
    ASSERT_TRUE(s.has_value());
    session_ = s->session;
    file_ = create("f");  // without a session: not opened
  }
  void start() {
    svc_.reset();
    MetaOptions o;
    o.now = [this] { return now_; };
    o.seed = 42;
    auto s = MetaService::open(&store_, o);
    ASSERT_TRUE(s.has_value()) << s.error().to_string();
    svc_ = std::move(s).value();
    // Every node is offline after a start until it reports again.
    pm::RegisterNodeReq node;
    node.node_uuid = "node-a";
    node.address = "127.0.0.1:7700";
    node.targets.push_back(pm::TargetReport{"t1", "/data/t1", 1000, 400});
    ASSERT_TRUE(svc_->register_node(node).has_value());
  }
  size_t stored_opens() {
    size_t n = 0;
    for (std::string_view prefix : {schema::kOpenPrefix, schema::kOpenByInodePrefix}) {
      EXPECT_TRUE(store_.scan(prefix, "", [&](std::string_view, std::string_view) {
                          ++n;
                          return true;
                        }).is_ok());
    }
    return n;
  }
  bool exists(InodeId ino) { return svc_->get_attr(pm::InodeReq{ino}).has_value(); }
  bool file_exists() { return exists(file_); }
  InodeId create(const std::string& name, SessionId open_for = SessionId()) {
    auto r = svc_->create(testing::create_req(kRootInode, name, open_for));
    EXPECT_TRUE(r.has_value()) << r.error().to_string();
    return r.has_value() ? r->attr.ino : InodeId();
  }

  int64_t now_ = kStart;
  MemoryStore store_;
  std::unique_ptr<MetaService> svc_;
  SessionId session_;
  InodeId file_;
};

TEST_F(OpenFilesAcrossACrash, ReadingFilesWritesNoOpenRecord) {
  for (int i = 0; i < 100; ++i) {
    ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
    now_ += 1'000'000;
    ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  }
  ASSERT_OK(svc_->expire());
  EXPECT_EQ(stored_opens(), 0u);
}

TEST_F(OpenFilesAcrossACrash, AnUnlinkCarriesTheOpensOfItsFile) {
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  EXPECT_EQ(stored_opens(), 0u) << "younger than the delay";
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_EQ(stored_opens(), 2u) << "the unlink wrote the open with it";
  start();  // crash and restart
  EXPECT_TRUE(file_exists()) << "the restarted server must still know the orphan is open";
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_TRUE(file_exists()) << "every orphan waits until the sessions sent their opens";
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {}, true}));
  EXPECT_FALSE(file_exists());
  EXPECT_EQ(stored_opens(), 0u);
}

TEST_F(OpenFilesAcrossACrash, AnOpenHeldPastTheDelayIsKept) {
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  now_ += 150'000'000;
  ASSERT_OK(svc_->expire());  // the daemon's periodic pass writes it
  EXPECT_EQ(stored_opens(), 2u);
  start();
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {}, true}));  // sends nothing back
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_TRUE(file_exists()) << "an open held before the crash keeps the unlinked file";
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_FALSE(file_exists());
}

TEST_F(OpenFilesAcrossACrash, ACleanStopStoresEveryOpen) {
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  ASSERT_OK(svc_->store_opens());
  start();
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {}, true}));  // sends nothing back
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_TRUE(file_exists()) << "the stored open holds it";
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_FALSE(file_exists());
}

// An open younger than the delay dies with a crash; the mount sends it again (ReclaimOpens) when
// it sees the restarted server's new map version. Until every session found at the start has,
// an unlinked file waits.
TEST_F(OpenFilesAcrossACrash, AnOpenTheCrashForgotIsSentAgainAndHoldsTheFile) {
  const InodeId g = create("g", session_);  // created and opened, not written to the store
  EXPECT_EQ(stored_opens(), 0u);
  start();  // crash and restart
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "g", SessionId()}));
  EXPECT_TRUE(exists(g)) << "the session has not sent its opens yet: the file waits";
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {pm::OpenCount{g, 1}}, true}));
  EXPECT_TRUE(exists(g)) << "the open it sent holds the file";
  EXPECT_EQ(stored_opens(), 2u) << "an orphan's open is written at once";
  ASSERT_OK(svc_->release(pm::ReleaseReq{g, session_}));
  EXPECT_FALSE(exists(g));
  EXPECT_EQ(stored_opens(), 0u);
}

// The mount sends its opens from a count it took before: an open this server counted after the
// start but the mount after that count is not in it, and the reclaim must not undo it.
TEST_F(OpenFilesAcrossACrash, AnOpenMadeAfterTheStartIsNotLostWhenTheMountSendsAnOlderCount) {
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));  // younger than the delay
  start();  // crash and restart: that open is forgotten
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));  // a second descriptor
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {pm::OpenCount{file_, 1}}, true}));
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_TRUE(file_exists()) << "two descriptors were open; one release must not free the file";
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_FALSE(file_exists());
}

// A release after the start may end an open from before it, which the server lost and the
// mount's count no longer holds: it must not cancel an open made after the start that the mount
// had not counted yet when it took the count it sends.
TEST_F(OpenFilesAcrossACrash, AReleaseOfAnOpenTheCrashForgotDoesNotCancelANewerOne) {
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));  // d1, younger than the delay
  start();  // crash and restart: d1 is forgotten
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));  // d2; its answer is on its way
  ASSERT_OK(svc_->release_many(pm::ReleaseManyReq{session_, {file_}}));  // d1 closed
  // The mount's count: d1 released, d2 not counted yet.
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {}, true}));
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_TRUE(file_exists()) << "d2 is open";
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_FALSE(file_exists());
}

// A count a mount sends back may be anything: at its largest, one more open must not wrap it to 0
// (not open), which let an unlink free a file the mount held open.
TEST_F(OpenFilesAcrossACrash, AnOpenCountSaturatesInsteadOfWrappingToClosed) {
  start();
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {pm::OpenCount{file_, UINT32_MAX}}, true}));
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_TRUE(file_exists()) << "the file is open";
  OpenTable t;
  t.add(session_, file_, 0, UINT32_MAX);
  EXPECT_EQ(t.add(session_, file_, 0, 1), UINT32_MAX);
}

// Opens of a session that never sends its list are counted apart only while the start waits for
// the lists (one lease): afterwards they are ordinary opens, and a list sent late is not added to
// every open made since the start (which kept unlinked files, and grew without bound).
TEST_F(OpenFilesAcrossACrash, OpensAfterTheWaitAreNotCountedApartForASessionThatNeverSent) {
  start();
  now_ += 20'000'000'000;
  ASSERT_OK(svc_->heartbeat(pm::SessionReq{session_}));
  ASSERT_OK(svc_->expire());
  now_ += 11'000'000'000;  // past the 30 s lease since the start
  ASSERT_OK(svc_->heartbeat(pm::SessionReq{session_}));
  ASSERT_OK(svc_->expire());
  for (int i = 0; i < 1000; ++i) {
    ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
    ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  }
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {pm::OpenCount{file_, 1}}, true}));  // late
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_TRUE(file_exists()) << "one descriptor is open";
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_FALSE(file_exists()) << "the 1000 opens and releases since the start were counted again";
}

TEST_F(OpenFilesAcrossACrash, UnlinkedFilesWaitUntilEverySessionSentItsOpensOrOneLeasePassed) {
  const InodeId g = create("g");
  const InodeId h = create("h");
  auto other = svc_->register_session(pm::RegisterSessionReq{"test", "host2"});
  ASSERT_TRUE(other.has_value());
  start();
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "g", SessionId()}));
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {}, true}));
  EXPECT_TRUE(exists(g)) << "the other session has not sent its opens";
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{other->session, {pm::OpenCount{file_, 2}}, false}));
  EXPECT_TRUE(exists(g)) << "more to come from it (`last` not set)";
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{other->session, {}, true}));
  EXPECT_FALSE(exists(g)) << "every session sent its opens and none holds g";
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_TRUE(file_exists()) << "the other session's open of f was taken back";
  // Hostile or stale calls.
  EXPECT_CODE(svc_->reclaim_opens(pm::ReclaimOpensReq{SessionId(999), {}, true}), Code::kBadHandle);
  std::vector<pm::OpenCount> many(pm::kMaxReclaimBatch + 1, pm::OpenCount{file_, 1});
  EXPECT_CODE(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, many, true}), Code::kInvalid);
  // An inode that is gone is skipped.
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {pm::OpenCount{InodeId(424242), 1}}, true}));

  // A session that never sends (an older mount) holds unlinked files back for one lease at most.
  start();
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "h", SessionId()}));
  EXPECT_TRUE(exists(h));
  now_ += 20'000'000'000;
  ASSERT_OK(svc_->heartbeat(pm::SessionReq{session_}));
  ASSERT_OK(svc_->heartbeat(pm::SessionReq{other->session}));
  ASSERT_OK(svc_->expire());
  EXPECT_TRUE(exists(h));
  now_ += 11'000'000'000;  // past the 30 s lease since the start; both sessions still alive
  ASSERT_OK(svc_->expire());
  EXPECT_FALSE(exists(h));
  EXPECT_TRUE(file_exists()) << "f's opens were stored with its unlink";
}

// A crash during the wait: an orphan found at the next start waits again, also when the store
// holds another session's open of it (the session that has not sent its opens may hold it too).
TEST_F(OpenFilesAcrossACrash, AnOrphanFoundAtStartWaitsForEverySessionEvenWithStoredOpens) {
  auto other = svc_->register_session(pm::RegisterSessionReq{"test", "host2"});
  ASSERT_TRUE(other.has_value());
  start();  // crash 1: `other` may hold f through an open this server forgot
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  start();  // crash 2, before `other` sent its opens
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{session_, {pm::OpenCount{file_, 1}}, true}));
  ASSERT_OK(svc_->release(pm::ReleaseReq{file_, session_}));
  EXPECT_TRUE(file_exists()) << "the other session has not sent its opens: it may hold f";
  ASSERT_OK(svc_->reclaim_opens(pm::ReclaimOpensReq{other->session, {}, true}));
  EXPECT_FALSE(file_exists());
  EXPECT_EQ(stored_opens(), 0u);
}

TEST_F(OpenFilesAcrossACrash, AClosedSessionsStoredOpensGoWithIt) {
  ASSERT_OK(svc_->open_file(pm::OpenReq{file_, session_, 0}));
  ASSERT_OK(svc_->unlink(pm::NameReq{kRootInode, "f", SessionId()}));
  EXPECT_EQ(stored_opens(), 2u);
  ASSERT_OK(svc_->close_session(pm::SessionReq{session_}));
  EXPECT_FALSE(file_exists()) << "its last open went with the session";
  EXPECT_EQ(stored_opens(), 0u);
}

}  // namespace
}  // namespace penstock::meta
