// Notifier: what FUSE request threads hand over runs on a thread of its own, in order; stop()
// runs what is left, and what comes after it runs at once.
#include "client/fuse/notifier.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

namespace penstock::fuse {
namespace {

std::vector<std::function<void()>> one(std::function<void()> fn) {
  std::vector<std::function<void()>> fns;
  fns.push_back(std::move(fn));
  return fns;
}

TEST(NotifierTest, RunsOnItsOwnThreadInOrderWithoutHoldingThePoster) {
  Notifier n("test-note");
  const std::thread::id me = std::this_thread::get_id();
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> ran{0};
  std::vector<int> order;
  std::thread::id where;
  // The first blocks (as a notification waiting for a directory's lock would): post() returns.
  n.post(one([&] {
    where = std::this_thread::get_id();
    released.wait();
    order.push_back(0);
    ++ran;
  }));
  std::vector<std::function<void()>> two;
  two.push_back([&] { order.push_back(1); ++ran; });
  two.push_back([&] { order.push_back(2); ++ran; });
  n.post(std::move(two));
  EXPECT_EQ(ran.load(), 0);
  release.set_value();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (ran.load() < 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(ran.load(), 3);
  EXPECT_NE(where, me);
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST(NotifierTest, StopRunsWhatIsQueuedAndLaterPostsRunAtOnce) {
  Notifier n("test-note");
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  int ran = 0;
  n.post(one([&] { released.wait(); ++ran; }));
  n.post(one([&] { ++ran; }));
  std::thread stopper([&] { n.stop(); });
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran, 2);
  const std::thread::id me = std::this_thread::get_id();
  std::thread::id where;
  n.post(one([&] { where = std::this_thread::get_id(); ++ran; }));
  EXPECT_EQ(ran, 3);
  EXPECT_EQ(where, me);
  n.stop();  // again: nothing to do
}

}  // namespace
}  // namespace penstock::fuse
