// The client library going away while requests it sent without a waiting thread are still on the
// wire: the data servers of a real cluster are frozen (SIGSTOP) so that the small-file fetches
// started by opens stay unanswered, and the client is destroyed with them outstanding. It must
// wait for their replies (here: their deadlines) before it frees what the replies touch, and must
// not retry them (nobody will read them). Under ASan a reply handled after the client is gone is a
// use-after-free, and a reply dropped with the client is a leak.
#include <signal.h>
#include <fcntl.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/lib/client.h"
#include "tests/support/cluster.h"

namespace penstock::testing {
namespace {

constexpr const char* kDataRoles[] = {"data1", "data2", "data3"};

// Sends `sig` to every data server of `cluster`; false (with a test failure) if one is missing.
bool signal_data_servers(const Cluster& cluster, int sig) {
  bool ok = true;
  for (const char* role : kDataRoles) {
    const pid_t pid = cluster.pid_of(role);
    EXPECT_GT(pid, 0) << "no pid recorded for " << role;
    if (pid <= 0 || kill(pid, sig) != 0) ok = false;
  }
  return ok;
}

TEST(ClientShutdownTest, WaitsForSmallFileFetchesStillOnTheWire) {
  Cluster cluster;
  ASSERT_TRUE(cluster.up());
  constexpr int kFiles = 8;
  const std::string contents(6000, 'x');
  for (int i = 0; i < kFiles; ++i) {
    std::ofstream out(cluster.mount_path() + "/small" + std::to_string(i));
    out << contents;
    ASSERT_TRUE(out.good());
  }

  client::ClientOptions o;
  o.meta_address = cluster.meta_addr();
  o.transport = net::TransportKind::kTcp;
  constexpr double kDeadline = 2.0;  // seconds: every call's deadline, so also the fetches'
  o.call_timeout = std::chrono::milliseconds(static_cast<int>(kDeadline * 1000));
  auto c = client::Client::connect(o);
  ASSERT_TRUE(c.has_value()) << c.error().to_string();
  std::vector<InodeId> inos;
  for (int i = 0; i < kFiles; ++i) {
    auto e = (*c)->lookup_entry(InodeId{1}, "small" + std::to_string(i));
    ASSERT_TRUE(e.has_value()) << e.error().to_string();
    inos.push_back(e->attr.ino);
  }

  // From here no data server answers; the meta server still does (open, close of the session).
  const bool frozen = signal_data_servers(cluster, SIGSTOP);
  struct Thaw {
    const Cluster& cluster;
    ~Thaw() { signal_data_servers(cluster, SIGCONT); }
  } thaw{cluster};
  ASSERT_TRUE(frozen);
  for (InodeId ino : inos) {
    ASSERT_TRUE((*c)->open(ino, O_RDONLY).has_value());
  }
  EXPECT_EQ((*c)->cache_stats().misses, static_cast<uint64_t>(kFiles)) << "not every open started a fetch";

  const auto start = std::chrono::steady_clock::now();
  c->reset();  // shutdown() while all kFiles fetches are outstanding; then the client is freed
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, kDeadline * 0.75) << "the client did not wait for the outstanding fetches' deadlines";
  // A retry of the failed fetches (fetch_block on the pool) would wait out a second deadline.
  EXPECT_LT(waited, kDeadline * 1.75) << "a fetch failing during shutdown must not be retried";
}

}  // namespace
}  // namespace penstock::testing
