// penstock: the admin CLI.
//   penstock layout get PATH
//   penstock layout set DIR [--chunk-size SIZE] [--stripe-count N]
//   penstock status [--meta HOST:PORT]
//   penstock df [--meta HOST:PORT]
//   penstock scrub [--meta HOST:PORT] [--dry-run] [--timeout-s N]
//   penstock stats [--meta HOST:PORT] [--interval S] [--json]
// `layout` works on a mounted path through the virtual xattr user.penstock.layout (served by
// penstock-mount); `status`, `df` and `scrub` talk to penstock-meta directly, without a session,
// `stats` to penstock-meta for the cluster map and then to every online data server.
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

#include "client/lib/client.h"
#include "client/lib/layout_text.h"
#include "common/base/log.h"

namespace {

using penstock::client::kLayoutXattr;

std::string human(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

int fail(const std::string& msg) {
  std::fprintf(stderr, "penstock: %s\n", msg.c_str());
  return 1;
}

std::string xattr_error(const std::string& path, int err) {
  std::string msg = path + ": " + std::strerror(err);
  if (err == ENOTSUP || err == ENODATA) msg += " (is it on a penstock mount?)";
  return msg;
}

int layout_get(const std::string& path) {
  const std::string name(kLayoutXattr);
  std::string value(256, '\0');
  for (;;) {
    ssize_t n = getxattr(path.c_str(), name.c_str(), value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      break;
    }
    if (errno != ERANGE) return fail(xattr_error(path, errno));
    ssize_t need = getxattr(path.c_str(), name.c_str(), nullptr, 0);
    if (need < 0) return fail(xattr_error(path, errno));
    value.assign(static_cast<size_t>(need) + 1, '\0');
  }
  std::printf("%s\n", value.c_str());
  return 0;
}

int layout_set(const std::string& dir, const std::optional<std::string>& chunk_size,
               const std::optional<uint32_t>& stripe_count) {
  std::string spec;
  if (chunk_size) spec += "chunk_size=" + *chunk_size;
  if (stripe_count) spec += std::string(spec.empty() ? "" : " ") + "stripe_count=" + std::to_string(*stripe_count);
  if (spec.empty()) return fail("layout set: give --chunk-size and/or --stripe-count");
  // Check here so that a bad value gets a reason, not just EINVAL from setxattr.
  auto parsed = penstock::client::parse_layout_spec(spec);
  if (!parsed.has_value()) return fail("layout set: " + parsed.error().message());
  const std::string name(kLayoutXattr);
  if (setxattr(dir.c_str(), name.c_str(), spec.data(), spec.size(), 0) != 0) {
    const int err = errno;
    if (err == ENOTDIR) return fail(dir + ": layouts are set on directories; files keep theirs");
    return fail(xattr_error(dir, err));
  }
  return layout_get(dir);
}

penstock::Result<std::unique_ptr<penstock::client::Client>> connect(const std::string& meta) {
  penstock::client::ClientOptions opts;
  opts.meta_address = meta;
  opts.register_session = false;
  opts.io_threads = 1;
  opts.connections_per_server = 1;
  opts.client_name = "penstock-cli";
  return penstock::client::Client::connect(opts);
}

int status(const std::string& meta) {
  auto c = connect(meta);
  if (!c.has_value()) return fail(c.error().message());
  auto map = (*c)->get_cluster_map();
  if (!map.has_value()) return fail("cluster map: " + map.error().to_string());
  std::printf("meta     %s\ncluster map version %llu\n\n", meta.c_str(),
              static_cast<unsigned long long>(map->version));
  std::printf("NODES (%zu)\n  %-6s %-24s %-8s %s\n", map->nodes.size(), "ID", "ADDRESS", "STATE", "TRANSPORT");
  for (const auto& n : map->nodes) {
    // The transport this host's connection to the node uses (auto selection: RDMA when a device
    // reaches it and it accepts RDMA, else TCP).
    std::string transport = "-";
    if (n.online) {
      auto t = (*c)->data_transport(n.address);
      transport = t.has_value() ? t->substr(0, t->find(' ')) : "unreachable";
    }
    std::printf("  %-6llu %-24s %-8s %s\n", static_cast<unsigned long long>(n.id.value), n.address.c_str(),
                n.online ? "online" : "OFFLINE", transport.c_str());
  }
  std::printf("\nTARGETS (%zu)\n  %-6s %-6s %-12s %-12s %-8s %s\n", map->targets.size(), "ID", "NODE", "CAPACITY",
              "FREE", "STATE", "PATH");
  for (const auto& t : map->targets) {
    std::printf("  %-6llu %-6llu %-12s %-12s %-8s %s\n", static_cast<unsigned long long>(t.id.value),
                static_cast<unsigned long long>(t.node.value), human(t.capacity_bytes).c_str(),
                human(t.free_bytes).c_str(), t.online ? "online" : "OFFLINE", t.path.c_str());
  }
  std::printf("\nCHAINS (%zu)\n  %-6s %s\n", map->chains.size(), "ID", "TARGETS (head first)");
  for (const auto& ch : map->chains) {
    std::string targets;
    for (const auto& t : ch.targets) targets += (targets.empty() ? "" : ",") + t.to_string();
    std::printf("  %-6llu %s\n", static_cast<unsigned long long>(ch.id.value), targets.c_str());
  }
  return 0;
}

int df(const std::string& meta) {
  auto c = connect(meta);
  if (!c.has_value()) return fail(c.error().message());
  auto r = (*c)->statfs();
  if (!r.has_value()) return fail("statfs: " + r.error().to_string());
  const uint64_t used = r->total_bytes >= r->free_bytes ? r->total_bytes - r->free_bytes : 0;
  const double pct = r->total_bytes == 0 ? 0.0 : 100.0 * static_cast<double>(used) / static_cast<double>(r->total_bytes);
  std::printf("%-24s %12s %12s %12s %5s %14s %14s\n", "Filesystem", "Size", "Used", "Avail", "Use%", "Inodes",
              "IUsed");
  std::printf("%-24s %12s %12s %12s %4.0f%% %14llu %14llu\n", ("penstock:" + meta).c_str(),
              human(r->total_bytes).c_str(), human(used).c_str(), human(r->free_bytes).c_str(), pct,
              static_cast<unsigned long long>(r->total_inodes), static_cast<unsigned long long>(r->used_inodes));
  return 0;
}

int scrub(const std::string& meta, bool dry_run, double timeout_s) {
  auto c = connect(meta);
  if (!c.has_value()) return fail(c.error().message());
  auto r = (*c)->scrub(dry_run, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  if (!r.has_value()) {
    std::string hint;
    if (r.status().code() == penstock::Code::kTimeout) {
      hint = " (the pass goes on in penstock-meta, whose log reports its end; give a longer --timeout-s)";
    }
    return fail("scrub: " + r.error().to_string() + hint);
  }
  std::printf("targets scrubbed        %u\n", r->targets);
  std::printf("targets not scrubbed    %u\n", r->targets_failed);
  // Counted per target: an inode striped over three targets counts three times.
  std::printf("inodes with chunks      %llu (per target)\n", static_cast<unsigned long long>(r->inodes));
  std::printf("orphans (no such file)  %llu\n", static_cast<unsigned long long>(r->orphans));
  std::printf("orphans removed         %llu%s\n", static_cast<unsigned long long>(r->removed),
              dry_run ? " (dry run: nothing removed)" : "");
  std::printf("never handed out        %llu (left alone)\n", static_cast<unsigned long long>(r->unknown));
  for (const std::string& e : r->errors) std::printf("error: %s\n", e.c_str());
  if (r->targets_failed > 0 || (!dry_run && r->removed < r->orphans)) {
    if (r->errors.size() == penstock::proto::meta::kMaxScrubErrors) std::printf("error: ... (more in penstock-meta's log)\n");
    return fail("scrub incomplete: see the errors above and penstock-meta's log, then run it again");
  }
  return 0;
}

using penstock::proto::data::TargetCounters;

// a - b, field by field (counters between two snapshots).
TargetCounters minus(const TargetCounters& a, const TargetCounters& b) {
  TargetCounters d;
  d.visit_fields([&](auto&... out) {
    a.visit_fields([&](const auto&... x) {
      b.visit_fields([&](const auto&... y) { ((out = x >= y ? x - y : 0), ...); });
    });
  });
  return d;
}

std::string percent(uint64_t part, uint64_t whole) {
  if (whole == 0) return "-";
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

std::string duration(uint64_t ms) {
  const uint64_t s = ms / 1000;
  char buf[48];
  if (s >= 86400) {
    std::snprintf(buf, sizeof(buf), "%llud %lluh", static_cast<unsigned long long>(s / 86400),
                  static_cast<unsigned long long>(s % 86400 / 3600));
  } else if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lluh %llum", static_cast<unsigned long long>(s / 3600),
                  static_cast<unsigned long long>(s % 3600 / 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%llum %llus", static_cast<unsigned long long>(s / 60),
                  static_cast<unsigned long long>(s % 60));
  }
  return buf;
}

void print_stats_json(const penstock::client::Client::DataServerStats& n, const penstock::proto::data::TargetStats& t,
                      double interval_s) {
  const TargetCounters& c = t.counters;
  std::printf("{\"node\":%llu,\"address\":\"%s\",\"uptime_ms\":%llu,\"interval_s\":%g,\"target\":%llu,"
              "\"reads\":%llu,\"read_bytes\":%llu,\"sequential_reads\":%llu,\"direct_reads\":%llu,"
              "\"unread_reads\":%llu,\"writes\":%llu,\"write_bytes\":%llu,\"truncates\":%llu,\"removes\":%llu,"
              "\"syncs\":%llu,\"errors\":%llu,\"corrupt\":%llu,\"no_space\":%llu}\n",
              static_cast<unsigned long long>(n.node.id.value), n.node.address.c_str(),
              static_cast<unsigned long long>(n.stats.uptime_ms), interval_s,
              static_cast<unsigned long long>(t.target.value), static_cast<unsigned long long>(c.reads),
              static_cast<unsigned long long>(c.read_bytes), static_cast<unsigned long long>(c.sequential_reads),
              static_cast<unsigned long long>(c.direct_reads), static_cast<unsigned long long>(c.unread_reads),
              static_cast<unsigned long long>(c.writes), static_cast<unsigned long long>(c.write_bytes),
              static_cast<unsigned long long>(c.truncates), static_cast<unsigned long long>(c.removes),
              static_cast<unsigned long long>(c.syncs), static_cast<unsigned long long>(c.errors),
              static_cast<unsigned long long>(c.corrupt), static_cast<unsigned long long>(c.no_space));
}

// One table row: counts since start, or (interval_s > 0) per second over the interval.
void print_stats_row(const penstock::proto::data::TargetStats& t, double interval_s) {
  const TargetCounters& c = t.counters;
  auto count = [&](uint64_t v) {
    char buf[32];
    if (interval_s > 0) {
      std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(v) / interval_s);
    } else {
      std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(v));
    }
    return std::string(buf);
  };
  auto bytes = [&](uint64_t v) {
    return interval_s > 0 ? human(static_cast<uint64_t>(static_cast<double>(v) / interval_s)) + "/s" : human(v);
  };
  std::printf("  %-6llu %10s %12s %5s %7s %7s %10s %12s %6s %6s %6s %7s %7s %8s\n",
              static_cast<unsigned long long>(t.target.value), count(c.reads).c_str(), bytes(c.read_bytes).c_str(),
              percent(c.sequential_reads, c.reads).c_str(), percent(c.direct_reads, c.reads).c_str(),
              percent(c.unread_reads, c.reads).c_str(), count(c.writes).c_str(), bytes(c.write_bytes).c_str(),
              count(c.truncates).c_str(), count(c.removes).c_str(), count(c.syncs).c_str(), count(c.errors).c_str(),
              count(c.corrupt).c_str(), count(c.no_space).c_str());
}

// `penstock stats`: every online data server's counters per target, since it started, or with
// `interval_s` what changed over that many seconds, per second.
int stats(const std::string& meta, double interval_s, bool json) {
  auto c = connect(meta);
  if (!c.has_value()) return fail(c.error().message());
  auto first = (*c)->data_stats();
  if (!first.has_value()) return fail(first.error().to_string());
  std::vector<penstock::client::Client::DataServerStats> shown = std::move(*first);
  if (interval_s > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
    auto second = (*c)->data_stats();
    if (!second.has_value()) return fail(second.error().to_string());
    for (auto& now : *second) {
      auto before = std::find_if(shown.begin(), shown.end(), [&](const auto& b) { return b.node.id == now.node.id; });
      // A server that restarted meanwhile, or was not asked the first time, shows what it has.
      if (before == shown.end() || !before->status.is_ok() || before->stats.uptime_ms > now.stats.uptime_ms) {
        continue;
      }
      for (auto& t : now.stats.targets) {
        for (const auto& b : before->stats.targets) {
          if (b.target == t.target) t.counters = minus(t.counters, b.counters);
        }
      }
    }
    shown = std::move(*second);
  }
  int failed = 0;
  for (const auto& n : shown) {
    if (!n.status.is_ok()) {
      ++failed;
      std::string hint;
      if (n.status.code() == penstock::Code::kNotSupported) hint = " (a penstock-data older than stats; upgrade it)";
      std::fprintf(stderr, "penstock: data server %s (node %llu): %s%s\n", n.node.address.c_str(),
                   static_cast<unsigned long long>(n.node.id.value), n.status.to_string().c_str(), hint.c_str());
      continue;
    }
    if (json) {
      for (const auto& t : n.stats.targets) print_stats_json(n, t, interval_s);
      continue;
    }
    std::printf("data server %s (node %llu), up %s%s\n", n.node.address.c_str(),
                static_cast<unsigned long long>(n.node.id.value), duration(n.stats.uptime_ms).c_str(),
                interval_s > 0 ? ", per second over the interval" : "");
    std::printf("  %-6s %10s %12s %5s %7s %7s %10s %12s %6s %6s %6s %7s %7s %8s\n", "TARGET", "READS", "READ", "SEQ%",
                "DIRECT%", "UNREAD%", "WRITES", "WRITTEN", "TRUNC", "REMOVE", "SYNC", "ERRORS", "CORRUPT", "NO-SPACE");
    for (const auto& t : n.stats.targets) print_stats_row(t, interval_s);
  }
  if (shown.empty()) std::printf("no data server is online\n");
  if (failed > 0) return fail(std::to_string(failed) + " data server(s) gave no counters (see above)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  penstock::set_log_level(penstock::LogLevel::kWarn);
  penstock::set_log_component("cli");
  CLI::App app{"penstock: administer a Penstock file system (cluster status, space, directory layouts, scrub, server counters)."};
  app.require_subcommand(1);

  auto* layout = app.add_subcommand("layout", "show or set file and directory layouts (on a mounted path)");
  layout->require_subcommand(1);
  std::string get_path;
  auto* lget = layout->add_subcommand("get", "print the layout of a file or directory on a penstock mount");
  lget->add_option("PATH", get_path, "a file or directory on a penstock mount")->required();
  std::string set_dir;
  std::optional<std::string> chunk_size;
  std::optional<uint32_t> stripe_count;
  auto* lset = layout->add_subcommand("set", "set the layout new files in a directory get");
  lset->add_option("DIR", set_dir, "a directory on a penstock mount")->required();
  lset->add_option("--chunk-size", chunk_size, "chunk size, a power of two from 64K to 64M (e.g. 1M, 4M)");
  lset->add_option("--stripe-count", stripe_count, "how many chains each new file spreads over (0 = all)");

  std::string meta = "127.0.0.1:7600";
  auto* st = app.add_subcommand("status", "show the cluster map: data servers, targets, chains");
  st->add_option("--meta", meta, "penstock-meta address host:port")->capture_default_str();
  auto* dfc = app.add_subcommand("df", "show space and inode usage of the file system");
  dfc->add_option("--meta", meta, "penstock-meta address host:port")->capture_default_str();

  bool dry_run = false;
  double timeout_s = 3600;
  auto* scc = app.add_subcommand("scrub", "remove chunks that no file owns (e.g. of creates a power loss took back)");
  scc->add_option("--meta", meta, "penstock-meta address host:port")->capture_default_str();
  scc->add_flag("--dry-run", dry_run, "only count what would be removed");
  scc->add_option("--timeout-s", timeout_s, "seconds to wait for the pass (1 to 604800)")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 604800.0));

  double interval_s = 0;
  bool json = false;
  auto* stc = app.add_subcommand(
      "stats", "show what each data server's targets served: reads, bytes, how reads went (sequential, O_DIRECT, "
               "sent unread), writes, errors");
  stc->add_option("--meta", meta, "penstock-meta address host:port")->capture_default_str();
  stc->add_option("--interval", interval_s,
                  "seconds to watch: print what changed over them, per second (0: totals since each server started)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  stc->add_flag("--json", json, "one JSON object per target and line instead of the table");

  CLI11_PARSE(app, argc, argv);
  if (lget->parsed()) return layout_get(get_path);
  if (lset->parsed()) return layout_set(set_dir, chunk_size, stripe_count);
  if (st->parsed()) return status(meta);
  if (dfc->parsed()) return df(meta);
  if (scc->parsed()) return scrub(meta, dry_run, timeout_s);
  if (stc->parsed()) return stats(meta, interval_s, json);
  return fail("no command given; see --help");
}
