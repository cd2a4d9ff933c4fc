// Write-behind accounting: the dirty bound with back-pressure, error surfacing, the task pool, and
// the sources a write's bytes are taken from.
#include "client/lib/write_behind.h"

#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace penstock::client {
namespace {

TEST(DirtyBudget, WithinTheLimitNobodyWaits) {
  DirtyBudget b(100);
  b.acquire(60);
  b.acquire(40);
  EXPECT_EQ(b.used(), 100u);
  EXPECT_EQ(b.waits(), 0u);
  b.start_flight(60);
  EXPECT_EQ(b.in_flight(), 60u);
  b.finish_flight(60);
  b.release_buffered(40);
  EXPECT_EQ(b.used(), 0u);
  EXPECT_EQ(b.in_flight(), 0u);
}

TEST(DirtyBudget, WriterBlocksOverTheLimitUntilASendCompletes) {
  DirtyBudget b(100);
  b.acquire(100);
  b.start_flight(100);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    b.acquire(50);
    done = true;
  });
  while (b.waits() == 0) std::this_thread::yield();
  EXPECT_FALSE(done.load()) << "the writer must wait while the bound is passed";
  b.finish_flight(100);
  writer.join();
  EXPECT_TRUE(done.load());
  EXPECT_EQ(b.used(), 50u);
}

TEST(DirtyBudget, NothingInFlightMeansNoWaitEvenOverTheLimit) {
  // Only buffered bytes (which nobody is sending): waiting could never end.
  DirtyBudget b(100);
  b.acquire(90);
  b.acquire(90);
  EXPECT_EQ(b.used(), 180u);
  EXPECT_EQ(b.waits(), 0u);
}

TEST(DirtyBudget, ManyWritersNeverHoldMoreThanTheLimitWhileSendsRun) {
  DirtyBudget b(64);
  std::atomic<uint64_t> peak{0};
  // A sender: keeps one unit in flight and completes it when the writers need room.
  b.acquire(16);
  b.start_flight(16);
  std::vector<std::thread> writers;
  std::atomic<int> finished{0};
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        b.acquire(16);
        uint64_t u = b.used();
        uint64_t p = peak.load();
        while (u > p && !peak.compare_exchange_weak(p, u)) {
        }
        b.start_flight(16);
        b.finish_flight(16);
      }
      ++finished;
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(finished.load(), 4);
  b.finish_flight(16);
  EXPECT_LE(peak.load(), 64u);
  EXPECT_EQ(b.used(), 0u);
}

TEST(WriteError, WithoutHandlesTheLatestErrorIsPeekedThenReportedOnce) {
  WriteError e;
  EXPECT_TRUE(e.check(nullptr, false).is_ok());
  e.record(Status::ok());
  EXPECT_TRUE(e.check(nullptr, false).is_ok());
  EXPECT_FALSE(e.unreported());
  e.record(Status(Code::kNoSpace, "target full"));
  e.record(Status(Code::kIo, "later"));
  EXPECT_TRUE(e.unreported());
  EXPECT_EQ(e.check(nullptr, false).code(), Code::kIo);  // the next write sees it (the latest)
  EXPECT_EQ(e.check(nullptr, false).code(), Code::kIo);  // and still flush/fsync
  EXPECT_EQ(e.check(nullptr, true).code(), Code::kIo);   // reported once
  EXPECT_TRUE(e.check(nullptr, true).is_ok());
  EXPECT_FALSE(e.unreported());
}

// Linux errseq_t semantics: every handle open at the failure reports it once; a handle opened after
// someone reported it does not; one opened before anyone did does.
TEST(WriteError, EveryHandleOpenAtTheFailureReportsItOnce) {
  auto e = std::make_shared<WriteError>();
  WriteCursor a{e, e->sample()};
  WriteCursor b{e, e->sample()};
  EXPECT_TRUE(e->check(&a, true).is_ok());
  e->record(Status(Code::kNoSpace, "target full"));
  WriteCursor c{e, e->sample()};  // opened before anyone reported it
  EXPECT_EQ(e->check(&a, false).code(), Code::kNoSpace);  // a write peeks
  EXPECT_EQ(e->check(&a, true).code(), Code::kNoSpace);   // a's close reports it
  EXPECT_TRUE(e->check(&a, true).is_ok());                // once
  WriteCursor d{e, e->sample()};                          // opened after a reported it
  EXPECT_EQ(e->check(&b, true).code(), Code::kNoSpace);   // b was open at the failure
  EXPECT_EQ(e->check(&c, true).code(), Code::kNoSpace);
  EXPECT_TRUE(e->check(&d, true).is_ok());
  EXPECT_FALSE(e->unreported());
  e->record(Status(Code::kIo, "again"));  // a second failure reaches every handle again
  EXPECT_TRUE(e->unreported());
  for (WriteCursor* h : {&a, &b, &c, &d}) EXPECT_EQ(e->check(h, true).code(), Code::kIo);
  EXPECT_FALSE(e->unreported());
}

TEST(TaskPool, RunsEveryTaskAndStopDrainsTheQueue) {
  std::atomic<int> ran{0};
  {
    TaskPool pool(3);
    for (int i = 0; i < 100; ++i) pool.submit([&] { ++ran; });
    pool.stop();
    EXPECT_EQ(ran.load(), 100);
    pool.submit([&] { ++ran; });  // after stop: on the caller's thread
    EXPECT_EQ(ran.load(), 101);
    EXPECT_TRUE(pool.stopped());
    EXPECT_FALSE(pool.try_submit([&] { ++ran; }));  // refused, not run
    EXPECT_EQ(ran.load(), 101);
  }
}

TEST(WriteSource, MemoryIsTakenInOrder) {
  const std::vector<uint8_t> bytes = {1, 2, 3, 4, 5, 6, 7};
  WriteSource src{std::span<const uint8_t>(bytes)};
  EXPECT_EQ(src.memory().size(), 7u);
  uint8_t a[3] = {}, b[4] = {};
  ASSERT_TRUE(src.take(a, 3).is_ok());
  ASSERT_TRUE(src.take(b, 4).is_ok());
  EXPECT_EQ(src.taken(), 7u);
  EXPECT_EQ(std::vector<uint8_t>(a, a + 3), (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_EQ(std::vector<uint8_t>(b, b + 4), (std::vector<uint8_t>{4, 5, 6, 7}));
}

// The pipe a FUSE WRITE was spliced into: read in pieces, in order; one that ends before the
// request's size is kIo naming how far it got.
TEST(WriteSource, APipeIsReadInPiecesAndOneEndingEarlyIsAnIoError) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  std::vector<uint8_t> sent(10000);
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<uint8_t>(i * 7);
  std::thread writer([&] {
    EXPECT_EQ(write(fds[1], sent.data(), sent.size()), static_cast<ssize_t>(sent.size()));
    close(fds[1]);
  });
  WriteSource src(fds[0], 12000);
  EXPECT_TRUE(src.memory().empty());
  std::vector<uint8_t> got(12000);
  ASSERT_TRUE(src.take(got.data(), 6000).is_ok());
  const Status st = src.take(got.data() + 6000, 6000);
  writer.join();
  close(fds[0]);
  ASSERT_EQ(st.code(), Code::kIo);
  EXPECT_NE(st.message().find("10000 of 12000 bytes"), std::string::npos) << st.message();
  EXPECT_EQ(src.taken(), 6000u);  // only whole takes count
  EXPECT_TRUE(std::equal(sent.begin(), sent.end(), got.begin()));
}

}  // namespace
}  // namespace penstock::client
