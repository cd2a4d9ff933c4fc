// Dropping caches on a real mount: setxattr user.penstock.drop_caches empties the mount's chunk
// cache, makes the meta server drop its record cache and every data server its open-file cache
// and the page cache of its chunk files, without changing a byte; only root or the mount's owner may do it; and
// `penstock-bench --drop-caches` on a Penstock mount uses it. And data servers at
// --direct-read-min, whose cold reads of large files leave their page cache empty.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/cluster.h"
#include "tests/support/posix_util.h"

namespace penstock::testing {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDropXattr = "user.penstock.drop_caches";

// Pages of the chunk files under the cluster's targets (state/data*/chunks) that are in the page
// cache, from mincore over a fresh read-only mapping (which itself loads nothing): apart for chunk
// files of at least `long_bytes` bytes and for shorter ones, with how many files each.
struct ChunkPages {
  uint64_t long_pages = 0, long_files = 0, short_pages = 0, short_files = 0;
};
::testing::AssertionResult cached_chunk_pages_by_size(const std::string& state, uint64_t long_bytes, ChunkPages* out) {
  *out = {};
  for (const auto& target : fs::directory_iterator(state)) {
    if (target.path().filename().string().rfind("data", 0) != 0 || !fs::is_directory(target.path() / "chunks")) {
      continue;
    }
    for (const auto& e : fs::recursive_directory_iterator(target.path() / "chunks")) {
      if (!e.is_regular_file() || e.file_size() == 0) continue;
      uint64_t resident = 0;
      auto r = resident_pages(e.path().string(), &resident);
      if (!r) return r;
      const bool is_long = e.file_size() >= long_bytes;
      (is_long ? out->long_pages : out->short_pages) += resident;
      ++(is_long ? out->long_files : out->short_files);
    }
  }
  return ::testing::AssertionSuccess();
}

// The same, all chunk files together.
::testing::AssertionResult cached_chunk_pages(const std::string& state, uint64_t* pages, uint64_t* files) {
  ChunkPages all;
  auto r = cached_chunk_pages_by_size(state, 0, &all);
  *pages = all.long_pages;
  *files = all.long_files;
  return r;
}

// The lines of `penstock stats --json` output (stdout and stderr together) that contain `part`,
// e.g. "\"target\":" for the data servers' targets or "\"server\":\"meta\"".
std::vector<std::string> stats_lines(const std::string& output, const std::string& part) {
  std::vector<std::string> lines;
  size_t at = 0;
  while (at < output.size()) {
    size_t end = output.find('\n', at);
    if (end == std::string::npos) end = output.size();
    std::string line = output.substr(at, end - at);
    if (line.rfind("{", 0) == 0 && line.find(part) != std::string::npos) lines.push_back(std::move(line));
    at = end + 1;
  }
  return lines;
}

// The sum of one counter, e.g. "sequential_reads", over those lines; -1 when none has it.
int64_t stats_sum(const std::vector<std::string>& lines, const std::string& key) {
  const std::string needle = "\"" + key + "\":";
  int64_t sum = -1;
  for (const auto& line : lines) {
    const size_t at = line.find(needle);
    if (at != std::string::npos) sum = std::max<int64_t>(sum, 0) + std::strtoll(line.c_str() + at + needle.size(), nullptr, 10);
  }
  return sum;
}

// The data servers' targets in `penstock stats --json` output.
std::vector<std::string> target_lines(const std::string& output) { return stats_lines(output, "\"target\":"); }

// penstock-meta's calls per method so far (`penstock stats --methods --json`).
std::map<std::string, int64_t> meta_method_calls(const std::string& meta_addr) {
  CommandResult r = run_command({build_dir() + "/tools/penstock", "stats", "--meta", meta_addr, "--methods", "--json"}, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::map<std::string, int64_t> calls;
  for (const std::string& line : stats_lines(r.output, "\"server\":\"meta\"")) {
    const std::string key = "\"method\":\"";
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const size_t from = at + key.size();
    calls[line.substr(from, line.find('"', from) - from)] = stats_sum({line}, "calls");
  }
  return calls;
}

int64_t calls_since(const std::map<std::string, int64_t>& before, const std::map<std::string, int64_t>& after,
                    const std::string& method) {
  auto b = before.find(method);
  auto a = after.find(method);
  return (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
}

// A log file's text ("" when it cannot be read; the assertions on its contents then fail).
std::string slurp(const std::string& path) {
  std::string text;
  if (!read_file(path, &text)) return "";
  return text;
}

// The client cache blocks dropped in the mount log's last "caches dropped" line; -1 if none.
long last_client_blocks_dropped(const std::string& log) {
  const std::string prefix = "caches dropped: ";
  const std::string suffix = " client cache block";
  long last = -1;
  for (size_t at = log.find(prefix); at != std::string::npos; at = log.find(prefix, at + 1)) {
    const size_t digits = at + prefix.size();
    size_t end = digits;
    while (end < log.size() && log[end] >= '0' && log[end] <= '9') ++end;
    if (end > digits && log.compare(end, suffix.size(), suffix) == 0) last = std::stol(log.substr(digits, end - digits));
  }
  return last;
}

using DropCachesTest = ClusterTest;

TEST_F(DropCachesTest, XattrDropsClientAndServerCachesAndKeepsData) {
  const std::string file = cluster_.mount_path() + "/data.bin";
  const std::string data = pattern(6u << 20, 0, 41);
  ASSERT_TRUE(write_file(file, data));
  std::string got;
  ASSERT_TRUE(read_file(file, &got));  // sequential: fills the mount's chunk cache
  ASSERT_TRUE(same_bytes(data, got));

  uint64_t pages = 0, files = 0;
  ASSERT_TRUE(cached_chunk_pages(cluster_.state_dir(), &pages, &files));
  ASSERT_GT(files, 0u) << "no chunk files under " << cluster_.state_dir();
  EXPECT_GT(pages, 0u) << "the chunk files were just written and read: some pages must be cached";

  ASSERT_EQ(::setxattr(cluster_.mount_path().c_str(), kDropXattr, "1", 1, 0), 0) << errno_name(errno);

  // Data servers: the page cache of every chunk file is empty (dirty pages were written first).
  ASSERT_TRUE(cached_chunk_pages(cluster_.state_dir(), &pages, &files));
  EXPECT_EQ(pages, 0u) << pages << " chunk-file pages still cached after DropCaches";
  std::string data_logs;
  for (int k = 1; k <= 3; ++k) data_logs += slurp(cluster_.state_dir() + "/logs/data" + std::to_string(k) + ".log");
  EXPECT_NE(data_logs.find("DropCaches: 1 target(s)"), std::string::npos) << cluster_.log_tails();
  // The meta server: its record cache held the records the writes and reads above looked up.
  const std::string meta_log = slurp(cluster_.state_dir() + "/logs/meta.log");
  const size_t at = meta_log.rfind("DropCaches: ");
  ASSERT_NE(at, std::string::npos) << cluster_.log_tails();
  EXPECT_GT(std::atol(meta_log.c_str() + at + 12), 0) << meta_log.substr(at, 80);
  // The mount: its chunk cache held the blocks read above.
  const long blocks = last_client_blocks_dropped(slurp(cluster_.state_dir() + "/logs/mount1.log"));
  EXPECT_GT(blocks, 0) << cluster_.log_tails();

  // Nothing changed: the bytes read back the same, from the servers' disks now. The kernel's page
  // cache of the mount is not the mount's to drop (penstock-bench writes /proc/sys/vm/drop_caches
  // for that); drop this file's pages so the read reaches penstock-mount.
  {
    UniqueFd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(fd.get(), 0) << errno_name(errno);
    ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
  }
  ASSERT_TRUE(read_file(file, &got));
  EXPECT_TRUE(same_bytes(data, got));
  // A second drop right away finds the blocks of that read.
  ASSERT_EQ(::setxattr(file.c_str(), kDropXattr, "anything", 8, 0), 0) << errno_name(errno);
  EXPECT_GT(last_client_blocks_dropped(slurp(cluster_.state_dir() + "/logs/mount1.log")), 0);
}

// `penstock stats`: a table per data server, JSON lines per target, totals or an interval's rates;
// a bad address and a server that does not answer are errors that say which.
TEST_F(DropCachesTest, StatsShowEveryTargetAndReportAServerThatDoesNotAnswer) {
  const std::string penstock = build_dir() + "/tools/penstock";
  const std::string file = cluster_.mount_path() + "/counted.bin";
  const std::string data = pattern(3u << 20, 0, 43);
  ASSERT_TRUE(write_file(file, data));
  CommandResult r = run_command({penstock, "stats", "--meta", cluster_.meta_addr(), "--methods"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t servers = 0;
  for (size_t at = r.output.find("data server "); at != std::string::npos; at = r.output.find("data server ", at + 1)) {
    ++servers;
  }
  EXPECT_EQ(servers, 3u) << r.output;
  EXPECT_NE(r.output.find("meta server " + cluster_.meta_addr()), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("TARGET"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("NO-SPACE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("MEAN-US"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  Write "), std::string::npos) << "the data servers' methods:\n" << r.output;

  r = run_command({penstock, "stats", "--meta", cluster_.meta_addr(), "--json", "--methods"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto targets = target_lines(r.output);
  EXPECT_EQ(targets.size(), 3u) << r.output;
  // A retried write would count twice; nothing here should retry, but a slow sanitizer build may.
  EXPECT_GE(stats_sum(targets, "write_bytes"), static_cast<int64_t>(data.size())) << r.output;
  EXPECT_LE(stats_sum(targets, "write_bytes"), 2 * static_cast<int64_t>(data.size())) << r.output;
  EXPECT_EQ(stats_sum(targets, "errors"), 0) << r.output;
  // The data servers handled the writes (Write calls, as counted per method, match the targets').
  EXPECT_EQ(stats_sum(stats_lines(r.output, "\"method\":\"Write\""), "calls"), stats_sum(targets, "writes"))
      << r.output;
  // The meta server: the CLI's own cluster-map fetch, at least, and the file's size report at
  // close, which the mount sends inside a ReplayInline: counted under its own name too.
  EXPECT_GE(stats_sum(stats_lines(r.output, "\"method\":\"GetClusterMap\""), "calls"), 1) << r.output;
  EXPECT_GE(stats_sum(stats_lines(r.output, "\"method\":\"ReportSizeAtClose\""), "calls"), 1) << r.output;
  EXPECT_FALSE(stats_lines(r.output, "\"server\":\"meta\"").empty()) << r.output;

  // Nothing is written during the interval: no bytes, no Write calls.
  r = run_command({penstock, "stats", "--meta", cluster_.meta_addr(), "--json", "--methods", "--interval", "0.5"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(stats_sum(target_lines(r.output), "write_bytes"), 0) << r.output;
  EXPECT_EQ(stats_sum(target_lines(r.output), "writes"), 0) << r.output;
  EXPECT_TRUE(stats_lines(r.output, "\"method\":\"Write\"").empty()) << r.output;
  // The seconds the differences cover: the servers' uptimes moved by about the interval.
  for (const auto& line : stats_lines(r.output, "\"interval_s\":")) {
    const double seconds = std::strtod(line.c_str() + line.find("\"interval_s\":") + 13, nullptr);
    EXPECT_GE(seconds, 0.4) << line;
    EXPECT_LT(seconds, 30.0) << line;
  }
  for (const std::string bad : {"-1", "0.01", "nan", "x"}) {
    r = run_command({penstock, "stats", "--meta", cluster_.meta_addr(), "--interval", bad}, 60);
    EXPECT_NE(r.exit_code, 0) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("--interval"), std::string::npos) << bad << ": " << r.output;
  }

  r = run_command({penstock, "stats", "--meta", "127.0.0.1:1"}, 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("penstock:"), std::string::npos) << r.output;
  // A data server killed before the meta server noticed: the others still report, the command fails
  // and names the one that did not answer.
  const pid_t data2 = cluster_.pid_of("data2");
  ASSERT_GT(data2, 0);
  ASSERT_EQ(::kill(data2, SIGKILL), 0);
  r = run_command({penstock, "stats", "--meta", cluster_.meta_addr(), "--json"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(target_lines(r.output).size(), 2u) << r.output;
  EXPECT_NE(r.output.find("gave no counters"), std::string::npos) << r.output;
}

// `penstock stats --mount`: the mount's counters by name (a cold read counts misses), as JSON
// lines, and over an interval in which nothing happens no change, while the levels (the cache's
// bytes, the FUSE loop's places) keep their values. A path off any penstock mount says so.
TEST_F(DropCachesTest, StatsOfAMountShowItsCountersAndWhatChanged) {
  const std::string penstock = build_dir() + "/tools/penstock";
  const std::string mnt = cluster_.mount_path();
  const std::string file = mnt + "/counted-by-the-mount.bin";
  const std::string data = pattern(3u << 20, 0, 44);
  ASSERT_TRUE(write_file(file, data));
  ASSERT_EQ(::setxattr(mnt.c_str(), kDropXattr, "1", 1, 0), 0) << errno_name(errno);
  std::string back;
  ASSERT_TRUE(read_file(file, &back));
  EXPECT_TRUE(same_bytes(data, back));

  CommandResult r = run_command({penstock, "stats", "--mount", mnt}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mount " + mnt + ": since it started"), std::string::npos) << r.output;
  for (const char* name : {"cache_misses", "cache_bytes", "open_tickets_taken", "fuse_places", "fuse_threads_started"}) {
    EXPECT_NE(r.output.find(std::string("  ") + name + " "), std::string::npos) << name << "\n" << r.output;
  }

  r = run_command({penstock, "stats", "--mount", mnt, "--json"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GT(stats_sum(stats_lines(r.output, "\"counter\":\"cache_misses\""), "value"), 0) << r.output;
  EXPECT_GT(stats_sum(stats_lines(r.output, "\"counter\":\"fuse_threads_started\""), "value"), 0) << r.output;
  const int64_t places = stats_sum(stats_lines(r.output, "\"counter\":\"fuse_places\""), "value");
  EXPECT_GT(places, 0) << r.output;
  const int64_t cached = stats_sum(stats_lines(r.output, "\"counter\":\"cache_bytes\""), "value");
  EXPECT_GT(cached, 0) << r.output;

  r = run_command({penstock, "stats", "--mount", mnt, "--json", "--interval", "0.5"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto misses = stats_lines(r.output, "\"counter\":\"cache_misses\"");
  ASSERT_EQ(misses.size(), 1u) << r.output;
  EXPECT_EQ(stats_sum(misses, "change"), 0) << r.output;
  EXPECT_NE(misses[0].find("\"interval_s\":"), std::string::npos) << r.output;
  EXPECT_EQ(stats_sum(stats_lines(r.output, "\"counter\":\"fuse_places\""), "value"), places) << r.output;
  EXPECT_EQ(stats_sum(stats_lines(r.output, "\"counter\":\"cache_bytes\""), "value"), cached) << r.output;

  r = run_command({penstock, "stats", "--mount", cluster_.temp_dir()}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is it on a penstock mount?"), std::string::npos) << r.output;
  r = run_command({penstock, "stats", "--mount", mnt, "--methods"}, 60);
  EXPECT_NE(r.exit_code, 0) << "--methods is for the servers' counters:\n" << r.output;
  r = run_command({penstock, "stats", "--mount", mnt, "--meta", cluster_.meta_addr()}, 60);
  EXPECT_NE(r.exit_code, 0) << "--meta is for the servers' counters:\n" << r.output;
  r = run_command({penstock, "stats", "--mount", ""}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("meta server"), std::string::npos) << "an empty --mount showed the servers:\n" << r.output;
}

// `penstock layout get|set` on a real mount: a new directory shows the default layout, a set one
// what was set, and a file made in it that layout with its chains; a file's layout is not set, a
// bad chunk size is refused with a reason, and a path off any mount says so.
TEST_F(DropCachesTest, LayoutGetAndSetThroughTheCli) {
  const std::string penstock = build_dir() + "/tools/penstock";
  const std::string dir = cluster_.mount_path() + "/laid-out";
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << errno_name(errno);
  CommandResult r = run_command({penstock, "layout", "get", dir}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("chunk_size=", 0), 0u) << r.output;
  r = run_command({penstock, "layout", "set", dir, "--chunk-size", "1M", "--stripe-count", "2"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output, "chunk_size=1048576 stripe_count=2\n");
  ASSERT_TRUE(write_file(dir + "/f", "laid out"));
  r = run_command({penstock, "layout", "get", dir + "/f"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("chunk_size=1048576 stripe_count=2 chains=", 0), 0u) << r.output;
  r = run_command({penstock, "layout", "set", dir + "/f", "--chunk-size", "1M"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layouts are set on directories"), std::string::npos) << r.output;
  r = run_command({penstock, "layout", "set", dir, "--chunk-size", "3M"}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("layout set: "), std::string::npos) << r.output;
  r = run_command({penstock, "layout", "get", cluster_.temp_dir()}, 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("is it on a penstock mount?"), std::string::npos) << r.output;
}

// `penstock stats --interval` across a restart of penstock-meta: the meta server gets no rates (its
// counters started again; the instance number in its answer tells), the data servers do, and the
// command says which and exits 1.
TEST_F(DropCachesTest, StatsIntervalAcrossAMetaRestartGivesItNoRates) {
  const std::string penstock = build_dir() + "/tools/penstock";
  ASSERT_TRUE(write_file(cluster_.mount_path() + "/before-restart", "x"));
  CommandResult r;
  std::thread stats([&] {
    r = run_command({penstock, "stats", "--meta", cluster_.meta_addr(), "--json", "--interval", "4"}, 120);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ::testing::AssertionResult restarted = cluster_.restart_meta(/*crash=*/false);
  stats.join();
  ASSERT_TRUE(restarted) << restarted.message();
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("meta server " + cluster_.meta_addr() + ": restarted or unreachable during the interval"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(stats_lines(r.output, "\"server\":\"meta\"").size(), 0u) << "no rates for it:\n" << r.output;
  EXPECT_EQ(stats_lines(r.output, "\"interval_s\":").size(), target_lines(r.output).size()) << r.output;
  EXPECT_EQ(target_lines(r.output).size(), 3u) << "the data servers ran on:\n" << r.output;
}

// A written small file costs two meta round trips: its Create and its close's size report. The
// mount's directory lease answers the kernel's negative LOOKUP of each new name (a dataset written
// file by file; client/lib/create_behind.h), except right after the lease's term ran out, which
// the next create renews (DirLease). Counted by penstock-meta itself (`penstock stats --methods`).
TEST_F(DropCachesTest, AWrittenSmallFileCostsTwoMetaRoundTrips) {
  const std::string dir = cluster_.mount_path() + "/written-small";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << errno_name(errno);
  auto write_files = [&](int from, int to) {
    for (int i = from; i < to; ++i) {
      ASSERT_TRUE(write_file(dir + "/f" + std::to_string(i), pattern(8192, static_cast<uint64_t>(i), 47))) << i;
    }
  };
  auto meta_calls = [&] { return meta_method_calls(cluster_.meta_addr()); };
  // The burst that takes the lease: 16 files created and closed within a second (more on a slow
  // machine, until the mount holds it).
  int warm = 0;
  while (mount_counters(cluster_.mount_path())["dir_leases_granted"] == 0 && warm < 400) {
    write_files(warm, warm + 20);
    warm += 20;
  }
  ASSERT_GT(mount_counters(cluster_.mount_path())["dir_leases_granted"], 0u) << "no lease after " << warm << " files";
  const std::map<std::string, int64_t> before = meta_calls();
  constexpr int kFiles = 200;
  const auto t0 = std::chrono::steady_clock::now();
  write_files(warm, warm + kFiles);
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::map<std::string, int64_t> after = meta_calls();
  auto made = [&](const std::string& m) { return calls_since(before, after, m); };
  const int64_t lookups = made("LookupOpen") + made("Lookup");
  const int64_t renewals = made("DirLease");
  EXPECT_EQ(made("Create"), kFiles);
  EXPECT_EQ(made("CreateBatch"), 0) << "written at once: created synchronously";
  EXPECT_EQ(made("ReportSizeAtClose"), kFiles);
  // The directory's attributes come with each create; the mount root's expire after 1 s.
  EXPECT_LE(made("GetAttr"), static_cast<int64_t>(took_s) + 2);
  EXPECT_LE(lookups, renewals + 1) << "only a lookup after the term ran out reaches the server";
  EXPECT_LE(renewals, kFiles / 4) << "a 250 ms term outlasts several creates";
  // Nothing else either: every meta call the writers waited for, whatever its method.
  int64_t waited = 0;
  for (const auto& [method, n] : after) {
    const bool aside = method == "ReleaseMany" || method == "Release" || method == "Replay" || method == "ReplayInline" ||
                       method == "ReplayWaiting" || method == "ServerStats" || method == "Heartbeat" ||
                       method == "GetClusterMap" || method == "NodeHeartbeat";
    if (!aside) waited += calls_since(before, after, method);
  }
  EXPECT_LE(waited, 2 * kFiles + 2 * renewals + static_cast<int64_t>(took_s) + 3);
  const auto counters = mount_counters(cluster_.mount_path());
  EXPECT_GE(counters.at("lookups_answered_by_dir_lease"), static_cast<uint64_t>(kFiles - renewals - 1));
  std::printf("%d written small files: %lld Create, %lld ReportSizeAtClose, %lld lookups, %lld DirLease\n", kFiles,
              static_cast<long long>(made("Create")), static_cast<long long>(made("ReportSizeAtClose")),
              static_cast<long long>(lookups), static_cast<long long>(renewals));
  for (int i = 0; i < warm + kFiles; i += 37) {
    std::string back;
    ASSERT_TRUE(read_file(dir + "/f" + std::to_string(i), &back)) << i;
    EXPECT_TRUE(same_bytes(pattern(8192, static_cast<uint64_t>(i), 47), back)) << i;
  }
}

// An unlink's reply carries its directory's new attributes, so the kernel's permission check of
// the next unlink there (it dropped the directory's attributes) is answered by the mount.
TEST_F(DropCachesTest, AnUnlinkCostsNoGetAttrOfItsDirectory) {
  const std::string dir = cluster_.mount_path() + "/unlinked-many";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << errno_name(errno);
  constexpr int kFiles = 100;
  for (int i = 0; i < kFiles; ++i) ASSERT_TRUE(write_file(dir + "/f" + std::to_string(i), "x")) << i;
  const std::map<std::string, int64_t> before = meta_method_calls(cluster_.meta_addr());
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kFiles; ++i) ASSERT_EQ(::unlink((dir + "/f" + std::to_string(i)).c_str()), 0) << errno_name(errno);
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::map<std::string, int64_t> after = meta_method_calls(cluster_.meta_addr());
  EXPECT_EQ(calls_since(before, after, "Unlink"), kFiles);
  // The mount root's attributes still expire after 1 s.
  EXPECT_LE(calls_since(before, after, "GetAttr"), static_cast<int64_t>(took_s) + 2);
  struct stat st {};
  ASSERT_EQ(::stat(dir.c_str(), &st), 0) << errno_name(errno);
  EXPECT_EQ(st.st_nlink, 2u);
  DIR* d = ::opendir(dir.c_str());
  ASSERT_NE(d, nullptr) << errno_name(errno);
  int left = 0;
  while (dirent* e = ::readdir(d)) left += e->d_name[0] != '.';
  ::closedir(d);
  EXPECT_EQ(left, 0);
  ASSERT_EQ(::rmdir(dir.c_str()), 0) << errno_name(errno);
}

// Rmdir's and rename's replies carry the directories they changed, so the kernel's permission
// checks after them (it dropped those directories' attributes) are answered by the mount, with
// the link counts the server has.
TEST_F(DropCachesTest, RenamesAndRmdirsCostNoGetAttrOfTheirDirectories) {
  const std::string dir = cluster_.mount_path() + "/renamed-many";
  const std::string other = cluster_.mount_path() + "/renamed-into";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0) << errno_name(errno);
  ASSERT_EQ(::mkdir(other.c_str(), 0755), 0) << errno_name(errno);
  constexpr int kNames = 60;
  auto file = [&](int i, const char* suffix) { return dir + "/t" + std::to_string(i) + suffix; };
  auto sub = [&](int i) { return dir + "/d" + std::to_string(i); };
  for (int i = 0; i < kNames; ++i) {
    ASSERT_TRUE(write_file(file(i, ".tmp"), "x")) << i;
    ASSERT_EQ(::mkdir(sub(i).c_str(), 0755), 0) << errno_name(errno);
  }
  const std::map<std::string, int64_t> before = meta_method_calls(cluster_.meta_addr());
  const auto t0 = std::chrono::steady_clock::now();
  // A checkpoint's way: each shard written under a temporary name, then renamed into place.
  for (int i = 0; i < kNames; ++i) {
    ASSERT_EQ(::rename(file(i, ".tmp").c_str(), file(i, "").c_str()), 0) << errno_name(errno);
  }
  for (int i = 0; i < kNames; ++i) ASSERT_EQ(::rmdir(sub(i).c_str()), 0) << errno_name(errno);
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::map<std::string, int64_t> after = meta_method_calls(cluster_.meta_addr());
  EXPECT_EQ(calls_since(before, after, "Rename"), kNames);
  EXPECT_EQ(calls_since(before, after, "Rmdir"), kNames);
  // The mount root's attributes still expire after 1 s.
  EXPECT_LE(calls_since(before, after, "GetAttr"), static_cast<int64_t>(took_s) + 2);

  // What the mount answers from those replies is what the server has.
  auto nlink = [](const std::string& path) {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0) << path << ": " << errno_name(errno);
    return st.st_nlink;
  };
  EXPECT_EQ(nlink(dir), 2u);
  ASSERT_EQ(::mkdir((dir + "/m").c_str(), 0755), 0) << errno_name(errno);
  ASSERT_EQ(::mkdir((other + "/empty").c_str(), 0755), 0) << errno_name(errno);
  EXPECT_EQ(nlink(dir), 3u);
  EXPECT_EQ(nlink(other), 3u);
  ASSERT_EQ(::rename((dir + "/m").c_str(), (other + "/m").c_str()), 0) << errno_name(errno);
  EXPECT_EQ(nlink(dir), 2u);
  EXPECT_EQ(nlink(other), 4u);
  // Over an empty directory: it is gone, and `other` counts one subdirectory fewer.
  ASSERT_EQ(::rename((other + "/m").c_str(), (other + "/empty").c_str()), 0) << errno_name(errno);
  EXPECT_EQ(nlink(other), 3u);
  EXPECT_EQ(nlink(other + "/empty"), 2u);
  ASSERT_EQ(::rmdir((other + "/empty").c_str()), 0) << errno_name(errno);
  EXPECT_EQ(nlink(other), 2u);
  for (int i = 0; i < kNames; ++i) ASSERT_EQ(::unlink(file(i, "").c_str()), 0) << errno_name(errno);
  ASSERT_EQ(::rmdir(dir.c_str()), 0) << errno_name(errno);
  ASSERT_EQ(::rmdir(other.c_str()), 0) << errno_name(errno);
}

TEST_F(DropCachesTest, XattrIsVirtual) {
  const std::string file = cluster_.mount_path() + "/f";
  ASSERT_TRUE(write_file(file, "x"));
  char buf[64];
  EXPECT_EQ(::getxattr(file.c_str(), kDropXattr, buf, sizeof buf), -1);
  EXPECT_EQ(errno, ENODATA) << errno_name(errno);
  ASSERT_EQ(::setxattr(file.c_str(), kDropXattr, "1", 1, 0), 0) << errno_name(errno);
  char list[1024];
  const ssize_t n = ::listxattr(file.c_str(), list, sizeof list);
  ASSERT_GE(n, 0) << errno_name(errno);
  EXPECT_EQ(std::string(list, static_cast<size_t>(n)).find(kDropXattr), std::string::npos);
  // Still nothing to read after the set: it was never stored.
  EXPECT_EQ(::getxattr(file.c_str(), kDropXattr, buf, sizeof buf), -1);
  EXPECT_EQ(errno, ENODATA) << errno_name(errno);
}

TEST_F(DropCachesTest, OnlyRootOrTheMountOwnerMayDrop) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching to another user needs root";
  // A file the other user may write, so the kernel's own permission check lets the request
  // through to penstock-mount, which must refuse it.
  const std::string file = cluster_.mount_path() + "/open-to-all";
  ASSERT_TRUE(write_file(file, "x"));
  ASSERT_EQ(::chmod(file.c_str(), 0666), 0) << errno_name(errno);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    if (::setxattr(file.c_str(), kDropXattr, "1", 1, 0) == 0) ::_exit(11);
    ::_exit(errno == EPERM ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10: cannot become nobody, 11: drop allowed, 12: not EPERM";
}

TEST_F(DropCachesTest, BenchDropCachesOnAPenstockMount) {
  if (::geteuid() != 0) GTEST_SKIP() << "--drop-caches writes /proc/sys/vm/drop_caches: needs root";
  const std::string bench = build_dir() + "/tools/bench/penstock-bench";
  if (!fs::exists(bench)) GTEST_SKIP() << bench << " is not built";
  CommandResult r = run_command({bench, "ckpt-restore", cluster_.mount_path(), "--ranks", "2", "--size", "8M",
                                 "--block", "1M", "--drop-caches"},
                                120);
  ASSERT_EQ(r.exit_code, 0) << r.output << cluster_.log_tails();
  EXPECT_NE(r.output.find("Penstock caches dropped 1 time(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cpu_s_per_gib"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("machine-wide"), std::string::npos) << r.output;
  EXPECT_GT(last_client_blocks_dropped(slurp(cluster_.state_dir() + "/logs/mount1.log")), -1);
  std::string data_logs;
  for (int k = 1; k <= 3; ++k) data_logs += slurp(cluster_.state_dir() + "/logs/data" + std::to_string(k) + ".log");
  EXPECT_NE(data_logs.find("DropCaches:"), std::string::npos);
}

// Data servers at --direct-read-min 1M --buffered-streams, through a real mount: random reads of a large file,
// cold, come with O_DIRECT and leave at most its chunks' headers, tables and partial last block in
// the data servers' page cache; a sequential read of it (the mount's read-ahead marks its fetches
// ReadReq::sequential) and a small file's chunk go through that page cache; every byte reads back.
TEST(DirectReadsTest, RandomColdReadsOfLargeFilesSkipTheServersPageCacheStreamsAndSmallFilesUseIt) {
  if (local_only()) GTEST_SKIP() << "needs the Penstock binaries (PENSTOCK_TEST_DIR is set)";
  Cluster cluster(ClusterOptions{.data_args = "--direct-read-min 1M --buffered-streams"});
  ASSERT_TRUE(cluster.up());
  const std::string large = cluster.mount_path() + "/large.bin";
  const std::string small = cluster.mount_path() + "/small.bin";
  const std::string large_data = pattern((6u << 20) + 4097, 0, 61);  // chunks of 4 MiB and 2 MiB + 4097 bytes
  const std::string small_data = pattern(100u << 10, 0, 62);
  ASSERT_TRUE(write_file(large, large_data));
  ASSERT_TRUE(write_file(small, small_data));
  // Every cache the reads could be served from: the servers' and the mount's (xattr), the kernel's
  // page cache of the mounted files named (opening the small file reads it whole, ahead).
  auto drop_all = [&](std::initializer_list<std::string> files) {
    ASSERT_EQ(::setxattr(cluster.mount_path().c_str(), kDropXattr, "1", 1, 0), 0) << errno_name(errno);
    for (const auto& path : files) {
      UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      ASSERT_GE(fd.get(), 0) << errno_name(errno);
      ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED), 0);
    }
  };
  std::string data_logs;
  for (int k = 1; k <= 3; ++k) data_logs += slurp(cluster.state_dir() + "/logs/data" + std::to_string(k) + ".log");
  const bool direct = data_logs.find("refuses O_DIRECT") == std::string::npos;
  if (!direct) std::printf("note: the targets' file system refuses O_DIRECT; the buffered fallback read the bytes\n");

  // `penstock stats` says how the servers served the reads: what changed since the last call.
  const std::string penstock = build_dir() + "/tools/penstock";
  struct Reads {
    int64_t reads, sequential, direct;
  };
  auto read_counters = [&] {
    CommandResult r = run_command({penstock, "stats", "--meta", cluster.meta_addr(), "--json"}, 60);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const auto targets = target_lines(r.output);
    EXPECT_EQ(targets.size(), 3u) << "one line per target:\n" << r.output;
    return Reads{stats_sum(targets, "reads"), stats_sum(targets, "sequential_reads"),
                 stats_sum(targets, "direct_reads")};
  };
  const Reads before = read_counters();
  ASSERT_GE(before.reads, 0);

  // Samples at scattered offsets, none where another ended: random reads for the mount.
  drop_all({large});
  {
    UniqueFd fd(::open(large.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_GE(fd.get(), 0) << errno_name(errno);
    ASSERT_EQ(::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_RANDOM), 0);
    std::string sample(128u << 10, '\0');
    for (uint64_t off : {uint64_t{5} << 20, uint64_t{1} << 20, (uint64_t{3} << 20) + 8192, uint64_t{6} << 20}) {
      const ssize_t n = ::pread(fd.get(), sample.data(), sample.size(), static_cast<off_t>(off));
      const uint64_t want = std::min<uint64_t>(sample.size(), large_data.size() - off);
      ASSERT_EQ(n, static_cast<ssize_t>(want)) << "pread at " << off << ": " << errno_name(errno);
      EXPECT_TRUE(same_bytes(large_data.substr(off, want), sample.substr(0, want))) << "at " << off;
    }
  }
  const Reads after_random = read_counters();
  EXPECT_GE(after_random.reads - before.reads, 4);
  EXPECT_EQ(after_random.sequential - before.sequential, 0) << "random samples were marked sequential";
  if (direct) {
    EXPECT_GE(after_random.direct - before.direct, 4) << "random cold reads did not use O_DIRECT";
  }
  ChunkPages pages;
  ASSERT_TRUE(cached_chunk_pages_by_size(cluster.state_dir(), 1u << 20, &pages));
  if (direct) {
    EXPECT_NE(data_logs.find("reads of chunks of 1048576 bytes or more not in the page cache"), std::string::npos)
        << cluster.log_tails();
    EXPECT_EQ(pages.long_files, 2u);
    // Header and table (5 pages for a 4 MiB chunk) and a partial last block, of 1024 and 514 data pages.
    EXPECT_LE(pages.long_pages, 8 * pages.long_files) << "random cold reads filled the servers' page cache";
  }

  // The whole file in order, and the small file: through the servers' page cache.
  drop_all({large, small});
  std::string got;
  ASSERT_TRUE(read_file(large, &got));
  EXPECT_TRUE(same_bytes(large_data, got));
  ASSERT_TRUE(read_file(small, &got));
  EXPECT_TRUE(same_bytes(small_data, got));
  ASSERT_TRUE(cached_chunk_pages_by_size(cluster.state_dir(), 1u << 20, &pages));
  EXPECT_EQ(pages.long_files, 2u);
  EXPECT_GE(pages.long_pages, (6u << 20) / 4096) << "a sequential read of a large file skipped the servers' page cache";
  EXPECT_EQ(pages.short_files, 1u);
  EXPECT_GE(pages.short_pages, small_data.size() / 4096) << "the small file's chunk was not read through the page cache";
  const Reads after_sequential = read_counters();
  EXPECT_GT(after_sequential.sequential - after_random.sequential, 0) << "the mount's read-ahead was not marked sequential";
  EXPECT_EQ(after_sequential.direct - after_random.direct, 0) << "a stream or a small file was read with O_DIRECT";
  EXPECT_TRUE(cluster.down());
}

}  // namespace
}  // namespace penstock::testing
