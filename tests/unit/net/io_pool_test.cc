// IoPool: one thread per context, round-robin hand-out, graceful and hard drain.
#include "common/net/io_pool.h"

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <thread>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <gtest/gtest.h>

namespace penstock::net {
namespace {

namespace asio = boost::asio;

// The thread that runs `io`'s handlers.
std::thread::id runner_of(asio::io_context& io) {
  std::promise<std::thread::id> p;
  asio::post(io, [&] { p.set_value(std::this_thread::get_id()); });
  return p.get_future().get();
}

TEST(IoPoolTest, EachContextRunsOnAThreadOfItsOwn) {
  IoPool pool(3);
  ASSERT_EQ(pool.size(), 3u);
  pool.start();
  std::set<std::thread::id> runners;
  for (size_t i = 0; i < pool.size(); ++i) {
    const std::thread::id t = runner_of(pool.at(i));
    EXPECT_NE(t, std::this_thread::get_id());
    EXPECT_EQ(runner_of(pool.at(i)), t) << "context " << i << " moved to another thread";
    runners.insert(t);
  }
  EXPECT_EQ(runners.size(), 3u);
  pool.drain(std::chrono::seconds(5));
}

TEST(IoPoolTest, NextHandsOutContextsRoundRobin) {
  IoPool pool(2);
  asio::io_context* a = &pool.next();
  asio::io_context* b = &pool.next();
  EXPECT_NE(a, b);
  EXPECT_EQ(&pool.next(), a);
  EXPECT_EQ(&pool.next(), b);
}

TEST(IoPoolTest, ZeroThreadsStillGetsOne) {
  IoPool pool(0);
  EXPECT_EQ(pool.size(), 1u);
  pool.start();
  EXPECT_NE(runner_of(pool.next()), std::this_thread::get_id());
}

TEST(IoPoolTest, DrainRunsQueuedWorkFirst) {
  IoPool pool(2);
  pool.start();
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) asio::post(pool.next(), [&] { ran.fetch_add(1); });
  pool.drain(std::chrono::seconds(5));
  EXPECT_EQ(ran.load(), 100);
}

TEST(IoPoolTest, DrainStopsWorkThatOutlivesTheGrace) {
  IoPool pool(1);
  pool.start();
  // A timer an hour out keeps the context busy; drain must not wait for it.
  asio::steady_timer timer(pool.at(0), std::chrono::hours(1));
  bool fired = false;
  timer.async_wait([&](boost::system::error_code) { fired = true; });
  const auto t0 = std::chrono::steady_clock::now();
  pool.drain(std::chrono::milliseconds(50));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_FALSE(fired);
  pool.drain(std::chrono::milliseconds(50));  // idempotent
}

}  // namespace
}  // namespace penstock::net
