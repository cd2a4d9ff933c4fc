// WorkerPool: a few places take requests at once; a request that waits long (before_long_wait(),
// or unanswered past the stall time) hands its place on so that the requests behind it are
// served; a thread back from a long wait parks while the places are taken; the pool never starts
// more than max_threads; run() ends with the session (waking parked threads, interrupting reads,
// waiting for requests still served) and returns a receive error.
#include "client/fuse/worker_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <thread>

#include "common/base/long_wait.h"

namespace penstock::fuse {
namespace {

using namespace std::chrono_literals;

// Requests are functions queued by the test; receive() waits for one (returning -EINTR now and
// then, as a read() woken by a signal does), serve() runs it.
class FakeRequests final : public RequestSource {
 public:
  struct Slot final : Context {
    std::function<void()> fn;
  };

  std::unique_ptr<Context> new_context() override { return std::make_unique<Slot>(); }

  int receive(Context& ctx) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, 5ms, [&] { return ended_ || fail_ || !queue_.empty(); })) return -EINTR;
    if (fail_) return -EIO;
    if (queue_.empty()) return 0;  // ended
    static_cast<Slot&>(ctx).fn = std::move(queue_.front());
    queue_.pop_front();
    return 1;
  }

  void serve(Context& ctx) override {
    const int now = ++serving_;
    int seen = most_serving_.load();
    while (now > seen && !most_serving_.compare_exchange_weak(seen, now)) {
    }
    static_cast<Slot&>(ctx).fn();
    --serving_;
  }

  bool ended() override {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }

  void end() override {
    std::lock_guard<std::mutex> lock(mu_);
    ended_ = true;
    cv_.notify_all();
  }

  void push(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(fn));
    cv_.notify_one();
  }

  void fail() {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = true;
    cv_.notify_all();
  }

  int most_serving() const { return most_serving_.load(); }
  int serving() const { return serving_.load(); }
  void reset_most_serving() { most_serving_.store(serving_.load()); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool ended_ = false;
  bool fail_ = false;
  std::atomic<int> serving_{0};
  std::atomic<int> most_serving_{0};
};

// A pool running on a thread of its own; ends the session and joins on destruction.
class RunningPool {
 public:
  RunningPool(FakeRequests& requests, WorkerPoolOptions options) : requests_(requests), pool_(requests, options) {
    result_ = std::async(std::launch::async, [this] { return pool_.run(); });
  }
  ~RunningPool() {
    requests_.end();
    if (result_.valid()) result_.wait();
  }
  WorkerPool& pool() { return pool_; }
  std::future<int>& result() { return result_; }

 private:
  FakeRequests& requests_;
  WorkerPool pool_;
  std::future<int> result_;
};

// Lets waiting requests go once, at the latest when it goes out of scope: declared after the
// pool, so that a failed assertion does not leave the pool's destructor waiting for them.
class Release {
 public:
  ~Release() { now(); }
  void now() {
    if (!done_) promise_.set_value();
    done_ = true;
  }
  std::shared_future<void> future() const { return future_; }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_ = promise_.get_future().share();
  bool done_ = false;
};

// Requests are bytes in a pipe, taken by a blocking read() that only a signal interrupts; ending
// the session wakes no reader, as with /dev/fuse before the unmount.
class PipeRequests final : public RequestSource {
 public:
  PipeRequests() { EXPECT_EQ(pipe(fds_), 0); }
  ~PipeRequests() override {
    close_writer();
    close(fds_[0]);
  }
  struct Byte final : Context {
    char c = 0;
  };
  std::unique_ptr<Context> new_context() override { return std::make_unique<Byte>(); }
  int receive(Context& ctx) override {
    const ssize_t n = read(fds_[0], &static_cast<Byte&>(ctx).c, 1);
    if (n < 0) return -errno;
    return n == 0 ? 0 : 1;  // 0: the writer closed
  }
  void serve(Context&) override { ++served_; }
  bool ended() override { return ended_.load(); }
  void end() override { ended_.store(true); }

  void push() {
    const char c = 'r';
    EXPECT_EQ(write(fds_[1], &c, 1), 1);
  }
  void close_writer() {
    if (fds_[1] >= 0) close(fds_[1]);
    fds_[1] = -1;
  }
  int served() const { return served_.load(); }

 private:
  int fds_[2] = {-1, -1};
  std::atomic<bool> ended_{false};
  std::atomic<int> served_{0};
};

// Queues a request that signals `done` and waits until it is served (false after 10 s).
bool served(FakeRequests& requests, std::function<void()> before = {}) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  requests.push([done, before] {
    if (before) before();
    done->set_value();
  });
  return f.wait_for(10s) == std::future_status::ready;
}

// How a request waits long: told (before_long_wait(), twice: the second gives nothing more) or
// silent (as a call to a server that does not answer).
enum class Wait { kTold, kSilent };

// Queues a request that waits until `released` is ready; true once it is being served (false
// after 10 s).
bool start_waiting(FakeRequests& requests, std::shared_future<void> released, Wait how) {
  auto started = std::make_shared<std::promise<void>>();
  std::future<void> f = started->get_future();
  requests.push([started, released, how] {
    if (how == Wait::kTold) {
      before_long_wait();
      before_long_wait();
    }
    started->set_value();
    released.wait();
  });
  return f.wait_for(10s) == std::future_status::ready;
}

WorkerPoolOptions options(int active, int max_threads, std::chrono::microseconds stall) {
  WorkerPoolOptions o;
  o.active = active;
  o.max_threads = max_threads;
  o.stall = stall;
  o.thread_name = "test-fuse";
  return o;
}

TEST(WorkerPoolTest, ShortRequestsUseNoMoreThreadsThanPlaces) {
  FakeRequests requests;
  std::atomic<int> count{0};
  // A stall time no request reaches, so that only the places decide.
  RunningPool running(requests, options(2, 8, std::chrono::microseconds(60s)));
  std::vector<std::thread> producers;
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < 250; ++i) requests.push([&] { ++count; });
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(served(requests));
  for (int i = 0; i < 1000 && count.load() < 1000; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(count.load(), 1000);
  EXPECT_LE(running.pool().stats().threads, 2u);
  EXPECT_LE(requests.most_serving(), 2);
  EXPECT_EQ(running.pool().stats().stalls, 0u);
}

TEST(WorkerPoolTest, ARequestAboutToWaitLongHandsItsPlaceOn) {
  FakeRequests requests;
  RunningPool running(requests, options(1, 4, std::chrono::microseconds(60s)));
  Release release;
  ASSERT_TRUE(start_waiting(requests, release.future(), Wait::kTold));
  // With its one place held by the waiting request, this one would never be served.
  EXPECT_TRUE(served(requests));
  const WorkerPoolStats st = running.pool().stats();
  EXPECT_EQ(st.long_waits, 1u);
  EXPECT_EQ(st.threads, 2u);
}

// Also: the pool counts where options.counters points (the mount's user.penstock.stats reads
// them there while requests are served).
TEST(WorkerPoolTest, ARequestUnansweredPastTheStallTimeHandsItsPlaceOn) {
  FakeRequests requests;
  WorkerPoolCounters counters;
  WorkerPoolOptions o = options(1, 4, 5ms);
  o.counters = &counters;
  RunningPool running(requests, o);
  Release release;
  ASSERT_TRUE(start_waiting(requests, release.future(), Wait::kSilent));
  EXPECT_TRUE(served(requests));
  EXPECT_GE(counters.stalls.load(), 1u);
  EXPECT_GE(counters.threads.load(), 2u);
  EXPECT_GE(running.pool().stats().stalls, 1u);  // stats() reads the same counters
}

TEST(WorkerPoolTest, AThreadBackFromALongWaitParksWhileThePlacesAreTaken) {
  FakeRequests requests;
  std::atomic<int> count{0};
  RunningPool running(requests, options(1, 4, std::chrono::microseconds(60s)));
  Release release;
  ASSERT_TRUE(start_waiting(requests, release.future(), Wait::kTold));
  ASSERT_TRUE(served(requests));  // on the thread that took the place
  release.now();
  // The waiting request ends; its thread finds the one place taken and parks, so from now on one
  // request at a time is served, by two threads in all.
  for (int i = 0; i < 10000 && requests.serving() > 0; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(requests.serving(), 0);
  requests.reset_most_serving();
  for (int i = 0; i < 200; ++i) requests.push([&] { ++count; });
  ASSERT_TRUE(served(requests));
  for (int i = 0; i < 1000 && count.load() < 200; ++i) std::this_thread::sleep_for(1ms);
  EXPECT_EQ(count.load(), 200);
  EXPECT_EQ(requests.most_serving(), 1);
  EXPECT_EQ(running.pool().stats().threads, 2u);
}

TEST(WorkerPoolTest, NeverStartsMoreThanMaxThreads) {
  FakeRequests requests;
  std::atomic<int> blocked{0};
  RunningPool running(requests, options(1, 2, 2ms));
  Release release;
  for (int i = 0; i < 2; ++i) {
    requests.push([&blocked, released = release.future()] {
      ++blocked;
      released.wait();
    });
  }
  for (int i = 0; i < 10000 && blocked.load() < 2; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(blocked.load(), 2);
  // Both threads wait: a third request waits for one of them.
  auto third = std::make_shared<std::promise<void>>();
  std::future<void> third_done = third->get_future();
  requests.push([third] { third->set_value(); });
  EXPECT_EQ(third_done.wait_for(50ms), std::future_status::timeout);
  release.now();
  EXPECT_EQ(third_done.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(running.pool().stats().threads, 2u);
}

TEST(WorkerPoolTest, RunEndsWithTheSessionAndReportsAReceiveError) {
  {
    FakeRequests requests;
    RunningPool running(requests, options(2, 4, 2ms));
    ASSERT_TRUE(served(requests));
    requests.end();
    ASSERT_EQ(running.result().wait_for(10s), std::future_status::ready);
    EXPECT_EQ(running.result().get(), 0);
  }
  {
    FakeRequests requests;
    RunningPool running(requests, options(2, 4, 2ms));
    ASSERT_TRUE(served(requests));
    requests.fail();
    ASSERT_EQ(running.result().wait_for(10s), std::future_status::ready);
    EXPECT_EQ(running.result().get(), -EIO);
  }
}

TEST(WorkerPoolTest, EndingWakesParkedThreadsAndWaitsForOnesWaitingLong) {
  FakeRequests requests;
  RunningPool running(requests, options(1, 4, std::chrono::microseconds(60s)));
  Release first;
  Release second;
  ASSERT_TRUE(start_waiting(requests, first.future(), Wait::kTold));
  ASSERT_TRUE(start_waiting(requests, second.future(), Wait::kTold));
  ASSERT_TRUE(served(requests));  // on a third thread, which keeps the one place
  first.now();                    // the first thread comes back and parks
  for (int i = 0; i < 10000 && requests.serving() > 1; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(requests.serving(), 1);
  requests.end();
  // run() waits for the request still being served, then returns.
  EXPECT_EQ(running.result().wait_for(50ms), std::future_status::timeout);
  second.now();
  ASSERT_EQ(running.result().wait_for(10s), std::future_status::ready);
  EXPECT_EQ(running.result().get(), 0);
  EXPECT_EQ(running.pool().stats().threads, 3u);
}

TEST(WorkerPoolTest, EndingInterruptsThreadsWaitingInARead) {
  PipeRequests requests;
  WorkerPool pool(requests, options(2, 4, 2ms));
  std::future<int> rc = std::async(std::launch::async, [&] { return pool.run(); });
  for (int i = 0; i < 3; ++i) requests.push();
  for (int i = 0; i < 10000 && requests.served() < 3; ++i) std::this_thread::sleep_for(1ms);
  ASSERT_EQ(requests.served(), 3);
  // No byte and no EOF comes: only the watch (which sees ended()) and its signals end the reads.
  requests.end();
  const bool ended = rc.wait_for(10s) == std::future_status::ready;
  if (!ended) requests.close_writer();  // so that the test fails instead of hanging
  EXPECT_TRUE(ended);
  EXPECT_EQ(rc.get(), 0);
}

TEST(WorkerPoolTest, BeforeLongWaitDoesNothingOffAPoolThread) {
  before_long_wait();  // no hook on this thread
  int calls = 0;
  set_long_wait_hook([](void* arg) { ++*static_cast<int*>(arg); }, &calls);
  before_long_wait();
  set_long_wait_hook(nullptr, nullptr);
  before_long_wait();
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace penstock::fuse
