// CreateBehind against a fake meta server: when it asks for a directory's lease, what it answers
// itself (absent names, creates) and what it leaves to the server, the batches it sends (order,
// numbers, barrier), and what a refused renewal, a refused create or a failed batch do.
#include "client/lib/create_behind.h"

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

namespace pm = proto::meta;
using namespace std::chrono_literals;

const InodeId kDir{10};
const proto::Caller kCaller{1000, 100};

// A meta server in memory: grants every lease (names `listed`), hands out numbers from 1000 up,
// answers batches with `batch_code` per entry and renews with `renew_ns`.
class FakeMeta {
 public:
  CreateBehind::Rpc rpc() {
    CreateBehind::Rpc r;
    r.session = [] { return SessionId{3}; };
    r.lease = [this](const pm::DirLeaseReq& req) -> Result<pm::DirLeaseResp> {
      if (while_listing) while_listing();  // what the mount does while the server lists the names
      std::lock_guard lock(mu);
      leases.push_back(req);
      pm::DirLeaseResp resp;
      resp.lease_ns = lease_ns;
      resp.fresh = !req.have_names;
      resp.names = listed;
      resp.dir_attr.ino = req.dir;
      resp.dir_attr.mode = S_IFDIR | dir_mode;
      resp.dir_attr.gid = 77;
      for (uint32_t i = 0; i < req.want_inodes; ++i) resp.inos.push_back(InodeId{next_ino++});
      return resp;
    };
    r.batch = [this](const pm::CreateBatchReq& req) -> Result<pm::CreateBatchResp> {
      std::lock_guard lock(mu);
      batches.push_back(req);
      if (fail_batches != 0) {
        if (fail_batches > 0) fail_batches -= 1;
        return Status(fail_code, "meta is down");
      }
      pm::CreateBatchResp resp;
      for (const pm::CreateBehind& e : req.entries) {
        pm::CreateResult res;
        res.code = static_cast<uint32_t>(batch_code);
        if (batch_code != Code::kOk) {
          res.message = "refused";
        } else {
          res.attr.emplace();
          res.attr->ino = e.ino;
          res.attr->layout.chains = {ChainId{e.ino.value}};
        }
        resp.results.push_back(res);
        created.push_back(e.name);
      }
      resp.lease_ns = renew_ns;
      for (uint32_t i = 0; i < req.want_inodes; ++i) resp.inos.push_back(InodeId{next_ino++});
      return resp;
    };
    return r;
  }
  std::mutex mu;
  std::vector<pm::DirLeaseReq> leases;
  std::vector<pm::CreateBatchReq> batches;
  std::vector<std::string> created;
  std::vector<std::string> listed{"existing"};
  std::function<void()> while_listing;
  int64_t lease_ns = 10'000'000'000;  // long: the tests do not race the clock
  int64_t renew_ns = 10'000'000'000;
  uint32_t dir_mode = 0755;
  Code batch_code = Code::kOk;
  int fail_batches = 0;  // the next this many batch calls fail with fail_code (-1: all)
  Code fail_code = Code::kUnavailable;
  uint64_t next_ino = 1000;
};

CreateBehindOptions options() {
  CreateBehindOptions o;
  o.creates_before_lease = 3;
  o.flush_interval = 200ms;  // long: batch contents are predictable
  o.inode_refill = 8;
  return o;
}

// Three files created synchronously in kDir and closed unwritten: the third close asks for the lease.
void burst(CreateBehind& cb) {
  for (int i = 0; i < 3; ++i) {
    cb.created_sync(kDir, "sync" + std::to_string(i), InodeId{static_cast<uint64_t>(500 + i)});
    cb.closed(InodeId{static_cast<uint64_t>(500 + i)});
  }
}

TEST(CreateBehindTest, NamesThisMountAddsWhileTheGrantIsListedAreKeptEvenWhenTheListingMissesThem) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  o.max_dirs = 2;
  CreateBehind cb(o, meta.rpc());
  // The meta server lets the asker's own changes run across the listing: other threads of this
  // mount finish creates, a mkdir and a rename into kDir meanwhile, and touch more directories
  // than the mount keeps records of. The listing has none of them.
  meta.while_listing = [&cb] {
    cb.created_sync(kDir, "raced-create", InodeId{600});
    cb.added(kDir, "raced-mkdir");
    cb.added(kDir, "raced-rename");
    for (uint64_t d = 20; d < 25; ++d) cb.created_sync(InodeId{d}, "elsewhere", InodeId{600 + d});
  };
  burst(cb);
  ASSERT_EQ(meta.leases.size(), 1u);
  for (const char* name : {"raced-create", "raced-mkdir", "raced-rename", "existing", "sync0"}) {
    EXPECT_FALSE(cb.known_absent(kDir, name)) << name << " exists: the server must be asked";
    EXPECT_FALSE(cb.create(kDir, name, 0644, kCaller).has_value()) << name;
  }
  EXPECT_TRUE(cb.known_absent(kDir, "new")) << "the lease was granted";
}

TEST(CreateBehindTest, AfterABurstOfCreatesTheLeaseIsAskedForAndAbsentNamesAreAnsweredHere) {
  FakeMeta meta;
  CreateBehind cb(options(), meta.rpc());
  cb.created_sync(kDir, "sync0", InodeId{500});
  cb.created_sync(kDir, "sync1", InodeId{501});
  cb.created_sync(kDir, "sync2", InodeId{502});
  cb.created_sync(kDir, "sync3", InodeId{503});
  cb.closed(InodeId{500});
  cb.closed(InodeId{501});
  EXPECT_TRUE(meta.leases.empty()) << "no lease before the burst";
  EXPECT_FALSE(cb.known_absent(kDir, "nope"));
  EXPECT_FALSE(cb.create(kDir, "nope", 0644, kCaller).has_value());
  cb.written(InodeId{777});
  cb.closed(InodeId{777});  // not created here: not counted
  cb.closed(InodeId{500});  // counted once
  EXPECT_TRUE(meta.leases.empty());
  cb.written(InodeId{502});
  cb.closed(InodeId{502});  // written or not, every close counts
  ASSERT_EQ(meta.leases.size(), 1u);
  EXPECT_EQ(meta.leases[0].dir, kDir);
  EXPECT_FALSE(meta.leases[0].have_names);
  EXPECT_EQ(meta.leases[0].want_inodes, 8u);
  EXPECT_TRUE(cb.known_absent(kDir, "nope"));
  EXPECT_FALSE(cb.known_absent(kDir, "existing")) << "listed by the grant";
  EXPECT_FALSE(cb.known_absent(kDir, "sync1")) << "created by this client";
  EXPECT_FALSE(cb.known_absent(InodeId{11}, "nope")) << "another directory";
  EXPECT_EQ(cb.stats().leases, 1u);
}

TEST(CreateBehindTest, CreatesAreAnsweredHereAndSentInOrderBeforeTheBarrierReturns) {
  FakeMeta meta;
  meta.dir_mode = 02775;  // setgid: new files take the directory's group
  CreateBehind cb(options(), meta.rpc());
  burst(cb);
  std::vector<proto::InodeAttr> made;
  for (const char* name : {"a", "b", "c"}) {
    auto a = cb.create(kDir, name, 0640, kCaller);
    ASSERT_TRUE(a.has_value()) << name;
    made.push_back(*a);
  }
  EXPECT_EQ(made[0].mode, S_IFREG | 0640u);
  EXPECT_EQ(made[0].uid, 1000u);
  EXPECT_EQ(made[0].gid, 77u) << "the setgid directory's group";
  EXPECT_TRUE(made[0].layout.chains.empty()) << "chains come with the server's answer";
  EXPECT_NE(made[0].ino, made[1].ino);
  EXPECT_FALSE(cb.create(kDir, "a", 0640, kCaller).has_value()) << "a name now known: the server decides";
  EXPECT_FALSE(cb.known_absent(kDir, "b"));
  cb.barrier();
  std::lock_guard lock(meta.mu);
  ASSERT_EQ(meta.batches.size(), 1u) << "one batch for the three";
  const pm::CreateBatchReq& sent = meta.batches[0];
  EXPECT_EQ(sent.session, SessionId{3});
  EXPECT_EQ(sent.dir, kDir);
  ASSERT_EQ(sent.entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(sent.entries[i].ino, made[i].ino);
    EXPECT_EQ(sent.entries[i].mode, 0640u);
    EXPECT_EQ(sent.entries[i].caller.uid, 1000u);
  }
  EXPECT_EQ(sent.entries[0].name, "a");
  EXPECT_EQ(sent.entries[2].name, "c");
  EXPECT_EQ(cb.stats().created, 3u);
  // The server's answer carried each file's chains: kept for the file's first write, once.
  std::optional<proto::Layout> l = cb.take_layout(made[1].ino);
  ASSERT_TRUE(l.has_value());
  ASSERT_EQ(l->chains.size(), 1u);
  EXPECT_EQ(l->chains[0].value, made[1].ino.value);
  EXPECT_FALSE(cb.take_layout(made[1].ino).has_value()) << "taken";
  EXPECT_FALSE(cb.take_layout(InodeId{5}).has_value()) << "not created behind";
}

TEST(CreateBehindTest, AFileClosedBeforeItsCreateWasSentIsSentClosed) {
  FakeMeta meta;
  CreateBehind cb(options(), meta.rpc());
  burst(cb);
  auto a = cb.create(kDir, "a", 0644, kCaller);
  auto b = cb.create(kDir, "b", 0644, kCaller);
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_TRUE(cb.closed_before_sent(a->ino));
  EXPECT_FALSE(cb.closed_before_sent(a->ino)) << "once";
  EXPECT_FALSE(cb.closed_before_sent(InodeId{5})) << "not created behind";
  cb.barrier();
  EXPECT_FALSE(cb.closed_before_sent(b->ino)) << "sent already: its Release follows as usual";
  std::lock_guard lock(meta.mu);
  ASSERT_EQ(meta.batches.size(), 1u);
  EXPECT_FALSE(meta.batches[0].entries[0].open);
  EXPECT_TRUE(meta.batches[0].entries[1].open);
}

// A dataset written file by file: half the files created behind are written before their batch
// was sent (each such write waits for it). The directory then creates synchronously, one Create per
// file from the caller's thread, and keeps its lease for the lookups: a written small file costs
// two meta round trips (Create, size report), not three. When its files are then closed unwritten
// again, creates are answered here again.
TEST(CreateBehindTest, ADirectoryWhoseFilesAreWrittenAtOnceCreatesSynchronouslyAndKeepsAnsweringLookups) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  o.inode_refill = 256;
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  InodeId last_behind;
  for (int i = 0; i < CreateBehind::kJudgeAfter; ++i) {
    auto a = cb.create(kDir, "w" + std::to_string(i), 0644, kCaller);
    ASSERT_TRUE(a.has_value()) << i;
    if (i % 2 == 0) {
      ASSERT_TRUE(cb.take_layout(a->ino).has_value()) << "written before its create was sent";
    }
    last_behind = a->ino;  // not written yet, still queued
  }
  EXPECT_TRUE(cb.known_absent(kDir, "next"));
  EXPECT_FALSE(cb.create(kDir, "next", 0644, kCaller).has_value()) << "half were written at once";
  EXPECT_EQ(cb.stats().turned, 1u);
  // A file created behind before the turn, written now: it was judged then, and says nothing about
  // the synchronous creates.
  ASSERT_TRUE(cb.take_layout(last_behind).has_value());
  // Synchronous creates (the caller sent Create) closed written, but for 15 of the first 32: the
  // directory stays this way, and its lookups are answered here all along.
  uint64_t ino = 700;
  for (int i = 0; i < 2 * CreateBehind::kJudgeAfter; ++i, ++ino) {
    const std::string name = "s" + std::to_string(i);
    ASSERT_TRUE(cb.known_absent(kDir, name)) << i;
    ASSERT_FALSE(cb.create(kDir, name, 0644, kCaller).has_value()) << i;
    cb.created_sync(kDir, name, InodeId{ino});
    EXPECT_FALSE(cb.known_absent(kDir, name)) << i << ": made, listed";
    if (i >= CreateBehind::kJudgeAfter || i % 2 == 0 || i >= 30) {
      cb.written(InodeId{ino});
      cb.written(InodeId{ino});  // again after a size report
    }
    cb.closed(InodeId{ino});
  }
  EXPECT_EQ(cb.stats().turned, 1u);
  // Now closed unwritten (markers): after kJudgeAfter of them, creates are answered here again.
  for (int i = 0; i <= CreateBehind::kJudgeAfter; ++i, ++ino) {
    const std::string name = "m" + std::to_string(i);
    ASSERT_FALSE(cb.create(kDir, name, 0644, kCaller).has_value()) << i;
    cb.created_sync(kDir, name, InodeId{ino});
    cb.closed(InodeId{ino});
  }
  EXPECT_TRUE(cb.create(kDir, "behind-again", 0644, kCaller).has_value());
  EXPECT_EQ(cb.stats().turned, 2u);
  std::lock_guard lock(meta.mu);
  EXPECT_EQ(meta.leases.size(), 1u) << "one grant all along";
}

// A burst of files written at once asks for the lease too, and starts with synchronous creates.
TEST(CreateBehindTest, ABurstOfWrittenFilesLeasesTheDirectoryForItsLookups) {
  FakeMeta meta;
  CreateBehind cb(options(), meta.rpc());
  for (int i = 0; i < 3; ++i) {
    cb.created_sync(kDir, "sync" + std::to_string(i), InodeId{static_cast<uint64_t>(500 + i)});
    if (i != 1) cb.written(InodeId{static_cast<uint64_t>(500 + i)});
    cb.closed(InodeId{static_cast<uint64_t>(500 + i)});
  }
  ASSERT_EQ(meta.leases.size(), 1u);
  EXPECT_TRUE(cb.known_absent(kDir, "new"));
  EXPECT_FALSE(cb.create(kDir, "new", 0644, kCaller).has_value()) << "two of three were written";
  EXPECT_FALSE(cb.known_absent(kDir, "sync1"));
}

TEST(CreateBehindTest, NumbersRunningOutMakeCreatesSynchronousUntilABatchRefills) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  o.inode_refill = 2;
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  ASSERT_TRUE(cb.create(kDir, "b", 0644, kCaller).has_value());
  EXPECT_FALSE(cb.create(kDir, "c", 0644, kCaller).has_value()) << "no number left";
  cb.barrier();
  EXPECT_EQ(meta.batches.back().want_inodes, 2u) << "the batch asked for more";
  EXPECT_TRUE(cb.create(kDir, "c", 0644, kCaller).has_value());
}

TEST(CreateBehindTest, ARefusedRenewalStopsAnsweringHere) {
  FakeMeta meta;
  meta.renew_ns = 0;  // another mount is waiting for the directory
  CreateBehind cb(options(), meta.rpc());
  burst(cb);
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  cb.barrier();
  EXPECT_FALSE(cb.known_absent(kDir, "nope"));
  EXPECT_FALSE(cb.create(kDir, "b", 0644, kCaller).has_value());
  for (uint64_t i = 0; i < 3; ++i) {
    cb.created_sync(kDir, "s" + std::to_string(i), InodeId{600 + i});
    cb.closed(InodeId{600 + i});
  }
  EXPECT_EQ(meta.leases.size(), 1u) << "not asked again during the back-off";
}

TEST(CreateBehindTest, AGrantOfZeroIsARefusal) {
  FakeMeta meta;
  meta.lease_ns = 0;
  CreateBehind cb(options(), meta.rpc());
  burst(cb);
  EXPECT_FALSE(cb.known_absent(kDir, "nope"));
  EXPECT_FALSE(cb.create(kDir, "nope", 0644, kCaller).has_value());
}

TEST(CreateBehindTest, RefusedCreatesAndFailedBatchesAreCountedAndTheirNamesForgotten) {
  FakeMeta meta;
  meta.batch_code = Code::kNoSpace;
  CreateBehind cb(options(), meta.rpc());
  burst(cb);
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  cb.barrier();
  EXPECT_EQ(cb.stats().failed, 1u);
  EXPECT_FALSE(cb.known_absent(kDir, "a")) << "a refused name stays listed (kExists means it is there)";
  EXPECT_TRUE(cb.known_absent(kDir, "zzz")) << "the lease goes on";
  meta.batch_code = Code::kOk;
  meta.fail_batches = -1;
  meta.fail_code = Code::kInternal;  // not a failure on the way: not sent again
  ASSERT_TRUE(cb.create(kDir, "b", 0644, kCaller).has_value());
  cb.barrier();
  EXPECT_EQ(cb.stats().failed, 2u);
  EXPECT_FALSE(cb.known_absent(kDir, "zzz")) << "after a failed batch nothing is answered here";
}

// One file created behind a lease from a meta server that fails every batch with `code`: what
// the mount counted once it gave the batch up, whether it still answers for the directory, and how
// long the create's barrier took.
struct GivenUp {
  CreateBehindStats stats;
  bool still_leased = false;
  std::chrono::steady_clock::duration took{};
};
GivenUp create_where_every_batch_fails(const CreateBehindOptions& o, Code code) {
  FakeMeta meta;
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  meta.fail_batches = -1;
  meta.fail_code = code;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(cb.create(kDir, "x", 0644, kCaller).has_value());
  cb.barrier();
  return GivenUp{cb.stats(), cb.known_absent(kDir, "zzz"), std::chrono::steady_clock::now() - t0};
}

TEST(CreateBehindTest, ABatchThatFailsOnTheWayOrWaitsIsSentAgainUntilItIsAnswered) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  meta.fail_batches = 2;  // unreachable twice (the fake applies nothing then)
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  ASSERT_TRUE(cb.create(kDir, "b", 0644, kCaller).has_value());
  cb.barrier();
  {
    std::lock_guard lock(meta.mu);
    EXPECT_EQ(meta.batches.size(), 3u);
    EXPECT_EQ(meta.created, (std::vector<std::string>{"a", "b"}));
    meta.fail_batches = 1;
    meta.fail_code = Code::kBusy;
  }
  ASSERT_TRUE(cb.create(kDir, "c", 0644, kCaller).has_value());
  cb.barrier();
  EXPECT_EQ(cb.stats().resent, 3u);
  EXPECT_EQ(cb.stats().failed, 0u);
  EXPECT_TRUE(cb.take_layout(InodeId{meta.batches.back().entries[0].ino}).has_value());
  EXPECT_TRUE(cb.known_absent(kDir, "zzz")) << "the lease goes on";

  // Unreachable for longer than batch_retry_for: given up, counted as failed, lease dropped.
  o.batch_retry_for = 50ms;
  const GivenUp down = create_where_every_batch_fails(o, Code::kUnavailable);
  EXPECT_EQ(down.stats.failed, 1u);
  EXPECT_GE(down.stats.resent, 2u);
  EXPECT_FALSE(down.still_leased);
}

// penstock-meta refuses a whole batch with kNoSpace while its disk is full, and opens its database
// again in its ballast's room about a second later: the batch is sent again for a while.
TEST(CreateBehindTest, ABatchRefusedForAFullDiskIsSentAgainForAWhile) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  meta.fail_batches = 2;
  meta.fail_code = Code::kNoSpace;
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  cb.barrier();
  {
    std::lock_guard lock(meta.mu);
    EXPECT_EQ(meta.created, (std::vector<std::string>{"a"}));
  }
  EXPECT_EQ(cb.stats().resent, 2u);
  EXPECT_EQ(cb.stats().failed, 0u);
  EXPECT_TRUE(cb.known_absent(kDir, "zzz")) << "the lease goes on";

  // Full for longer than no_space_retry_for: given up, counted as failed, lease dropped.
  o.no_space_retry_for = 50ms;
  const GivenUp full = create_where_every_batch_fails(o, Code::kNoSpace);
  EXPECT_LT(full.took, std::chrono::milliseconds(o.batch_retry_for.count() / 2))
      << "a full disk is retried only for no_space_retry_for";
  EXPECT_EQ(full.stats.failed, 1u);
  EXPECT_GE(full.stats.resent, 1u);
  EXPECT_FALSE(full.still_leased);
}

TEST(CreateBehindTest, OwnChangesKeepTheNamesRight) {
  FakeMeta meta;
  CreateBehind cb(options(), meta.rpc());
  burst(cb);
  cb.added(kDir, "made-by-mkdir");
  EXPECT_FALSE(cb.known_absent(kDir, "made-by-mkdir"));
  cb.removed(kDir, "existing");
  EXPECT_TRUE(cb.known_absent(kDir, "existing"));
  EXPECT_TRUE(cb.create(kDir, "existing", 0644, kCaller).has_value()) << "removed by us: free again";
}

TEST(CreateBehindTest, ANewSessionDropsTheHoldsAndNumbersOfTheOldOne) {
  FakeMeta meta;
  std::atomic<uint64_t> session{3};
  CreateBehind::Rpc rpc = meta.rpc();
  rpc.session = [&] { return SessionId{session.load()}; };
  CreateBehind cb(options(), rpc);
  burst(cb);
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  session = 4;  // the server lost session 3: its holds and numbers are gone there
  EXPECT_FALSE(cb.create(kDir, "b", 0644, kCaller).has_value());
  EXPECT_FALSE(cb.known_absent(kDir, "b"));
  cb.barrier();
  std::lock_guard lock(meta.mu);
  ASSERT_EQ(meta.batches.size(), 1u);
  EXPECT_EQ(meta.batches[0].session, SessionId{3}) << "sent with the session its number belongs to";
}

TEST(CreateBehindTest, ADirectoryGrownPastMaxNamesIsGivenUp) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  o.max_names = 6;  // "existing", three sync creates, two behind
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  ASSERT_TRUE(cb.create(kDir, "a", 0644, kCaller).has_value());
  ASSERT_TRUE(cb.create(kDir, "b", 0644, kCaller).has_value());
  EXPECT_FALSE(cb.create(kDir, "c", 0644, kCaller).has_value());
  EXPECT_FALSE(cb.known_absent(kDir, "c"));
}

TEST(CreateBehindTest, BarriersFromManyThreadsAndStopSendEverything) {
  FakeMeta meta;
  CreateBehindOptions o = options();
  o.flush_interval = 1ms;
  o.inode_refill = 256;
  CreateBehind cb(o, meta.rpc());
  burst(cb);
  std::atomic<int> made{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string name = "t" + std::to_string(t) + "-" + std::to_string(i);
        if (cb.create(kDir, name, 0644, kCaller).has_value()) made.fetch_add(1);
        if (i % 10 == 0) cb.barrier();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_GT(made.load(), 0);
  cb.stop();
  EXPECT_FALSE(cb.create(kDir, "after-stop", 0644, kCaller).has_value());
  std::lock_guard lock(meta.mu);
  EXPECT_EQ(meta.created.size(), static_cast<size_t>(made.load())) << "every create reached the server once";
}

}  // namespace
}  // namespace penstock::client
