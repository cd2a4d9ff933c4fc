// LocalHandles: a fill runs only with no handle of the file open and no writer begun or ended
// since its epoch, and a writer that begins during a fill waits for it.
#include "client/lib/local_handles.h"

#include <atomic>
#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace penstock::client {
namespace {

using Kind = LocalHandles::Kind;

TEST(LocalHandles, FillRunsWhenNothingIsOpen) {
  LocalHandles h;
  int ran = 0;
  EXPECT_TRUE(h.run_if_quiet(InodeId(7), h.epoch(InodeId(7)), [&] { ++ran; }));
  EXPECT_EQ(ran, 1);
}

TEST(LocalHandles, OpenWriterSkipsTheFill) {
  LocalHandles h;
  const InodeId ino(7);
  h.begin(ino, Kind::kWriter);
  EXPECT_EQ(h.open_count(ino), 1);
  int ran = 0;
  EXPECT_FALSE(h.run_if_quiet(ino, h.epoch(ino), [&] { ++ran; }));
  h.begin(ino, Kind::kWriter);  // a second handle
  h.end(ino, Kind::kWriter);
  EXPECT_FALSE(h.run_if_quiet(ino, h.epoch(ino), [&] { ++ran; })) << "one writer is still open";
  h.end(ino, Kind::kWriter);
  EXPECT_EQ(h.open_count(ino), 0);
  EXPECT_TRUE(h.run_if_quiet(ino, h.epoch(ino), [&] { ++ran; }));
  EXPECT_EQ(ran, 1);
}

// Another reader's READ may hold the pages locked until a FUSE thread answers it: no fill then.
// Readers do not move the epoch (they change no byte), so one that came and went costs nothing.
TEST(LocalHandles, OpenReaderSkipsTheFillButLeavesTheEpoch) {
  LocalHandles h;
  const InodeId ino(7);
  const uint64_t before = h.epoch(ino);
  h.begin(ino, Kind::kReader);
  int ran = 0;
  EXPECT_FALSE(h.run_if_quiet(ino, before, [&] { ++ran; }));
  h.end(ino, Kind::kReader);
  EXPECT_EQ(h.epoch(ino), before);
  EXPECT_TRUE(h.run_if_quiet(ino, before, [&] { ++ran; }));
  EXPECT_EQ(ran, 1);
}

// A truncate that began and ended after the filler asked the meta server: the version it would
// fill may be older than the kernel's pages are now.
TEST(LocalHandles, WriterThatCameAndWentSinceTheEpochSkipsTheFill) {
  LocalHandles h;
  const InodeId ino(7);
  const uint64_t before = h.epoch(ino);
  h.begin(ino, Kind::kWriter);
  h.end(ino, Kind::kWriter);
  int ran = 0;
  EXPECT_FALSE(h.run_if_quiet(ino, before, [&] { ++ran; }));
  EXPECT_EQ(ran, 0);
}

TEST(LocalHandles, WritersOfOtherInodesAtMostSkipAFill) {
  LocalHandles h;
  const InodeId ino(7);
  const uint64_t before = h.epoch(ino);
  h.begin(InodeId(8), Kind::kWriter);  // another shard
  int ran = 0;
  EXPECT_TRUE(h.run_if_quiet(ino, before, [&] { ++ran; }));
  // An inode of the same shard moves the shard's epoch: the fill is skipped, never wrong.
  const uint64_t again = h.epoch(ino);
  h.begin(InodeId(7 + 64), Kind::kWriter);
  EXPECT_FALSE(h.run_if_quiet(ino, again, [&] { ++ran; }));
  EXPECT_EQ(ran, 1);
  h.end(InodeId(8), Kind::kWriter);
  h.end(InodeId(7 + 64), Kind::kWriter);
  EXPECT_EQ(h.open_count(InodeId(8)), 0);
}

// A writer that opens while a fill is going into the kernel's pages must not get its reply (and
// with it the right to write) before the fill is done, or the fill could land on its bytes.
TEST(LocalHandles, BeginWaitsForARunningFill) {
  LocalHandles h;
  const InodeId ino(7);
  std::atomic<bool> began{false};
  std::thread writer;
  bool overlapped = false;
  ASSERT_TRUE(h.run_if_quiet(ino, h.epoch(ino), [&] {
    writer = std::thread([&] {
      h.begin(ino, Kind::kWriter);
      began = true;
    });
    // Give the writer time to get past begin() if it could (it must not).
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (std::chrono::steady_clock::now() < until) {
      if (began) overlapped = true;
      std::this_thread::yield();
    }
  }));
  writer.join();
  EXPECT_FALSE(overlapped) << "begin() returned while a fill was running";
  EXPECT_TRUE(began);
  EXPECT_EQ(h.open_count(ino), 1);
  h.end(ino, Kind::kWriter);
}

}  // namespace
}  // namespace penstock::client
