// penstock: the admin CLI.
//   penstock layout get PATH
//   penstock layout set DIR [--chunk-size SIZE] [--stripe-count N]
//   penstock status [--meta HOST:PORT]
//   penstock df [--meta HOST:PORT]
//   penstock scrub [--meta HOST:PORT] [--dry-run] [--timeout-s N]
//   penstock stats [--meta HOST:PORT] [--interval S] [--methods] [--json]
//   penstock stats --mount PATH [--interval S] [--json]
// `layout` works on a mounted path through the virtual xattr user.penstock.layout (served by
// penstock-mount); `status`, `df` and `scrub` talk to penstock-meta directly, without a session,
// `stats` to penstock-meta for its counters and the cluster map, then to every online data server
// (with --mount, it reads one mount's counters through its virtual xattr user.penstock.stats).
#include <sys/xattr.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
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

// The value of xattr `name` of `path`, however long: its size, then the value (again if it grew
// meanwhile). Errors: kIo with xattr_error()'s message.
penstock::Result<std::string> read_xattr(const std::string& path, std::string_view name_view) {
  const std::string name(name_view);
  std::string value;
  for (;;) {
    const ssize_t need = getxattr(path.c_str(), name.c_str(), nullptr, 0);
    if (need < 0) return penstock::Status(penstock::Code::kIo, xattr_error(path, errno));
    value.assign(static_cast<size_t>(need) + 1, '\0');
    const ssize_t n = getxattr(path.c_str(), name.c_str(), value.data(), value.size());
    if (n >= 0) {
      value.resize(static_cast<size_t>(n));
      return value;
    }
    if (errno != ERANGE) return penstock::Status(penstock::Code::kIo, xattr_error(path, errno));
  }
}

int layout_get(const std::string& path) {
  auto value = read_xattr(path, kLayoutXattr);
  if (!value.has_value()) return fail(value.error().message());
  std::printf("%s\n", value->c_str());
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

using penstock::proto::MethodStats;
using penstock::proto::data::TargetCounters;
using DataServerStats = penstock::client::Client::DataServerStats;

// a - b, field by field (counters between two snapshots; a field that went down reads 0).
TargetCounters minus(const TargetCounters& a, const TargetCounters& b) {
  TargetCounters d;
  d.visit_fields([&](auto&... out) {
    a.visit_fields([&](const auto&... x) {
      b.visit_fields([&](const auto&... y) { ((out = x >= y ? x - y : 0), ...); });
    });
  });
  return d;
}

// `now`'s methods less what `before` had of each (by name; a method new since then counts whole).
std::vector<MethodStats> minus(std::vector<MethodStats> now, const std::vector<MethodStats>& before) {
  auto less = [](uint64_t x, uint64_t y) { return x >= y ? x - y : 0; };
  for (auto& m : now) {
    for (const auto& b : before) {
      if (b.name != m.name) continue;
      m.calls = less(m.calls, b.calls);
      m.errors = less(m.errors, b.errors);
      m.busy_us = less(m.busy_us, b.busy_us);
    }
  }
  std::erase_if(now, [](const MethodStats& m) { return m.calls == 0; });
  return now;
}

// Whether a server's second snapshot continues its first: the same run of it answered both (a
// restart draws a new instance number) and its clock went on.
bool continues(uint64_t before_instance, uint64_t before_uptime_ms, uint64_t now_instance, uint64_t now_uptime_ms) {
  return before_instance != 0 && before_instance == now_instance && now_uptime_ms >= before_uptime_ms;
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

// `s` as a JSON string literal.
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

using Ull = unsigned long long;

// What every JSON line of one server starts with.
std::string json_head(const char* server, uint64_t node, const std::string& address, uint64_t uptime_ms,
                      double interval_s) {
  char buf[160];
  std::snprintf(buf, sizeof(buf), "{\"server\":\"%s\",\"node\":%llu,\"address\":", server, static_cast<Ull>(node));
  std::string out = buf;
  out += json_string(address);
  std::snprintf(buf, sizeof(buf), ",\"uptime_ms\":%llu,\"interval_s\":%.3f", static_cast<Ull>(uptime_ms), interval_s);
  return out + buf;
}

void print_target_json(const std::string& head, const penstock::proto::data::TargetStats& t) {
  const TargetCounters& c = t.counters;
  std::printf("%s,\"target\":%llu,\"reads\":%llu,\"read_bytes\":%llu,\"sequential_reads\":%llu,"
              "\"direct_reads\":%llu,\"unread_reads\":%llu,\"writes\":%llu,\"write_bytes\":%llu,"
              "\"truncates\":%llu,\"removes\":%llu,\"syncs\":%llu,\"errors\":%llu,\"corrupt\":%llu,"
              "\"no_space\":%llu}\n",
              head.c_str(), static_cast<Ull>(t.target.value), static_cast<Ull>(c.reads),
              static_cast<Ull>(c.read_bytes), static_cast<Ull>(c.sequential_reads), static_cast<Ull>(c.direct_reads),
              static_cast<Ull>(c.unread_reads), static_cast<Ull>(c.writes), static_cast<Ull>(c.write_bytes),
              static_cast<Ull>(c.truncates), static_cast<Ull>(c.removes), static_cast<Ull>(c.syncs),
              static_cast<Ull>(c.errors), static_cast<Ull>(c.corrupt), static_cast<Ull>(c.no_space));
}

void print_method_json(const std::string& head, const MethodStats& m) {
  std::printf("%s,\"method\":%s,\"calls\":%llu,\"errors\":%llu,\"busy_us\":%llu}\n", head.c_str(),
              json_string(m.name).c_str(), static_cast<Ull>(m.calls), static_cast<Ull>(m.errors),
              static_cast<Ull>(m.busy_us));
}

// A count as text: the count itself, or (interval_s > 0) per second over the interval.
std::string count_text(uint64_t v, double interval_s) {
  char buf[32];
  if (interval_s > 0) {
    std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(v) / interval_s);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu", static_cast<Ull>(v));
  }
  return buf;
}

// One target's row: counts since start, or per second over the interval.
void print_target_row(const penstock::proto::data::TargetStats& t, double interval_s) {
  const TargetCounters& c = t.counters;
  auto count = [&](uint64_t v) { return count_text(v, interval_s); };
  auto bytes = [&](uint64_t v) {
    return interval_s > 0 ? human(static_cast<uint64_t>(static_cast<double>(v) / interval_s)) + "/s" : human(v);
  };
  std::printf("  %-6llu %10s %12s %5s %7s %7s %10s %12s %6s %6s %6s %7s %7s %8s\n",
              static_cast<Ull>(t.target.value), count(c.reads).c_str(), bytes(c.read_bytes).c_str(),
              percent(c.sequential_reads, c.reads).c_str(), percent(c.direct_reads, c.reads).c_str(),
              percent(c.unread_reads, c.reads).c_str(), count(c.writes).c_str(), bytes(c.write_bytes).c_str(),
              count(c.truncates).c_str(), count(c.removes).c_str(), count(c.syncs).c_str(), count(c.errors).c_str(),
              count(c.corrupt).c_str(), count(c.no_space).c_str());
}

// A server's methods: calls and errors (per second over an interval), the handler's mean time.
void print_method_table(const std::vector<MethodStats>& methods, double interval_s) {
  if (methods.empty()) {
    std::printf("  no requests%s\n", interval_s > 0 ? " during the interval" : "");
    return;
  }
  std::printf("  %-20s %12s %10s %10s\n", "METHOD", interval_s > 0 ? "CALLS/S" : "CALLS",
              interval_s > 0 ? "ERRORS/S" : "ERRORS", "MEAN-US");
  for (const auto& m : methods) {
    char mean[32];
    std::snprintf(mean, sizeof(mean), "%.1f", static_cast<double>(m.busy_us) / static_cast<double>(m.calls));
    std::printf("  %-20s %12s %10s %10s\n", m.name.c_str(), count_text(m.calls, interval_s).c_str(),
                count_text(m.errors, interval_s).c_str(), mean);
  }
}

// Both servers' snapshots, so that an interval can subtract one from the other.
struct Snapshot {
  penstock::Result<penstock::proto::meta::ServerStatsResp> meta = penstock::Status(penstock::Code::kInternal, "");
  std::vector<DataServerStats> data;
};

penstock::Result<Snapshot> snapshot(penstock::client::Client& c) {
  Snapshot s;
  s.meta = c.meta_stats();
  auto data = c.data_stats();
  if (!data.has_value()) return data.error();
  s.data = std::move(*data);
  return s;
}

// What is printed for each server: its counters (or an interval's differences), and, over an
// interval, whether it had a first snapshot to subtract and how many seconds the two are apart.
struct Shown {
  Snapshot snap;
  bool interval = false;
  bool meta_baseline = true;
  double meta_seconds = 0;
  std::vector<bool> data_baseline;
  std::vector<double> data_seconds;
  std::vector<std::string> left_out;  // what has no rates over the interval, in words
};

// `second` less `first`, per server that answered both and did not restart in between.
Shown difference(const Snapshot& first, Snapshot second) {
  Shown out;
  out.interval = true;
  out.meta_baseline = false;
  if (first.meta.has_value() && second.meta.has_value() &&
      continues(first.meta->instance, first.meta->uptime_ms, second.meta->instance, second.meta->uptime_ms)) {
    out.meta_baseline = true;
    out.meta_seconds = static_cast<double>(second.meta->uptime_ms - first.meta->uptime_ms) / 1000.0;
    second.meta->methods = minus(std::move(second.meta->methods), first.meta->methods);
  }
  out.data_baseline.assign(second.data.size(), false);
  out.data_seconds.assign(second.data.size(), 0);
  for (size_t i = 0; i < second.data.size(); ++i) {
    DataServerStats& now = second.data[i];
    auto before = std::find_if(first.data.begin(), first.data.end(),
                               [&](const auto& b) { return b.node.id == now.node.id; });
    if (!now.status.is_ok() || before == first.data.end() || !before->status.is_ok() ||
        !continues(before->stats.instance, before->stats.uptime_ms, now.stats.instance, now.stats.uptime_ms)) {
      continue;
    }
    out.data_baseline[i] = true;
    out.data_seconds[i] = static_cast<double>(now.stats.uptime_ms - before->stats.uptime_ms) / 1000.0;
    // A target the first snapshot lacked (it joined the server meanwhile) has counted since the
    // server started: no rates for it.
    std::erase_if(now.stats.targets, [&](auto& t) {
      for (const auto& b : before->stats.targets) {
        if (b.target != t.target) continue;
        t.counters = minus(t.counters, b.counters);
        return false;
      }
      out.left_out.push_back("target " + t.target.to_string() + " of data server " + now.node.address +
                             " joined during the interval");
      return true;
    });
    now.stats.methods = minus(std::move(now.stats.methods), before->stats.methods);
  }
  for (const auto& b : first.data) {
    const bool still = std::any_of(second.data.begin(), second.data.end(),
                                   [&](const auto& n) { return n.node.id == b.node.id; });
    if (!still) out.left_out.push_back("data server " + b.node.address + " went offline during the interval");
  }
  out.snap = std::move(second);
  return out;
}

std::string not_supported_hint(const penstock::Status& st, const char* what) {
  if (st.code() != penstock::Code::kNotSupported) return "";
  return std::string(" (a ") + what + " older than stats; upgrade it)";
}

// Prints `s` as tables or JSON lines; returns the exit code (1 when a server gave no counters).
int print_stats(const std::string& meta, const Shown& s, bool json, bool methods) {
  const char* per_second = s.interval ? ", per second over the interval" : "";
  int failed = 0;
  // A server without both snapshots shows no rates: its counters would read as the interval's.
  auto no_baseline = [&](const std::string& who) {
    ++failed;
    std::fprintf(stderr, "penstock: %s: restarted or unreachable during the interval; no rates for it\n",
                 who.c_str());
  };
  const auto& m = s.snap.meta;
  if (!m.has_value()) {
    // A meta server older than ServerStats: the data servers' counters are still what was asked.
    if (m.error().code() != penstock::Code::kNotSupported) ++failed;
    std::fprintf(stderr, "penstock: meta server %s: %s%s\n", meta.c_str(), m.error().to_string().c_str(),
                 not_supported_hint(m.error(), "penstock-meta").c_str());
  } else if (!s.meta_baseline) {
    no_baseline("meta server " + meta);
  } else if (json) {
    const std::string head = json_head("meta", 0, meta, m->uptime_ms, s.meta_seconds);
    for (const auto& method : m->methods) print_method_json(head, method);
  } else {
    std::printf("meta server %s, up %s%s\n", meta.c_str(), duration(m->uptime_ms).c_str(), per_second);
    print_method_table(m->methods, s.meta_seconds);
  }

  for (size_t i = 0; i < s.snap.data.size(); ++i) {
    const DataServerStats& n = s.snap.data[i];
    const std::string who = "data server " + n.node.address + " (node " + std::to_string(n.node.id.value) + ")";
    if (!n.status.is_ok()) {
      ++failed;
      std::fprintf(stderr, "penstock: %s: %s%s\n", who.c_str(), n.status.to_string().c_str(),
                   not_supported_hint(n.status, "penstock-data").c_str());
      continue;
    }
    if (s.interval && !s.data_baseline[i]) {
      no_baseline(who);
      continue;
    }
    const double seconds = s.interval ? s.data_seconds[i] : 0;
    if (json) {
      const std::string head = json_head("data", n.node.id.value, n.node.address, n.stats.uptime_ms, seconds);
      for (const auto& t : n.stats.targets) print_target_json(head, t);
      if (methods) {
        for (const auto& method : n.stats.methods) print_method_json(head, method);
      }
      continue;
    }
    std::printf("%s, up %s%s\n", who.c_str(), duration(n.stats.uptime_ms).c_str(), per_second);
    std::printf("  %-6s %10s %12s %5s %7s %7s %10s %12s %6s %6s %6s %7s %7s %8s\n", "TARGET", "READS", "READ", "SEQ%",
                "DIRECT%", "UNREAD%", "WRITES", "WRITTEN", "TRUNC", "REMOVE", "SYNC", "ERRORS", "CORRUPT", "NO-SPACE");
    for (const auto& t : n.stats.targets) print_target_row(t, seconds);
    if (methods) print_method_table(n.stats.methods, seconds);
  }
  for (const auto& what : s.left_out) {
    ++failed;
    std::fprintf(stderr, "penstock: %s; no rates for it\n", what.c_str());
  }
  if (s.snap.data.empty()) std::fprintf(json ? stderr : stdout, "no data server is online\n");
  if (failed > 0) return fail(std::to_string(failed) + " server(s) gave no counters (see above)");
  return 0;
}

// `penstock stats`: the meta server's and every online data server's counters, since each started,
// or with `interval_s` what changed over that many seconds (per second in the table; JSON gives the
// differences and the seconds they cover). `methods`: the data servers' per-method counters too.
int stats(const std::string& meta, double interval_s, bool json, bool methods) {
  auto c = connect(meta);
  if (!c.has_value()) return fail(c.error().message());
  auto first = snapshot(**c);
  if (!first.has_value()) return fail(first.error().to_string());
  if (interval_s <= 0) return print_stats(meta, Shown{std::move(*first)}, json, methods);
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
  auto second = snapshot(**c);
  if (!second.has_value()) return fail(second.error().to_string());
  return print_stats(meta, difference(*first, std::move(*second)), json, methods);
}

// A mount's counters now (user.penstock.stats on `path`, any path on the mount).
penstock::Result<std::vector<penstock::client::ParsedCounter>> mount_counters(const std::string& path) {
  PENSTOCK_ASSIGN_OR_RETURN(std::string text, read_xattr(path, penstock::client::kStatsXattr));
  auto parsed = penstock::client::parse_counters(text);
  if (!parsed.has_value()) return std::move(parsed).error().with_context(path + ": user.penstock.stats");
  return parsed;
}

// `penstock stats --mount PATH`: the mount's counters since it started, or with `interval_s` what
// changed over that many seconds (per second in the table; JSON gives the change and the seconds).
// Levels (is_level_counter) are shown as they are at the end.
int mount_stats(const std::string& path, double interval_s, bool json) {
  auto first = mount_counters(path);
  if (!first.has_value()) return fail(first.error().message());
  std::vector<penstock::client::ParsedCounter> shown = std::move(*first);
  if (interval_s > 0) {
    const auto start = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(interval_s * 1000)));
    auto second = mount_counters(path);
    if (!second.has_value()) return fail(second.error().message());
    interval_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::vector<penstock::client::ParsedCounter> before = std::move(shown);
    shown = std::move(*second);
    for (penstock::client::ParsedCounter& c : shown) {
      if (penstock::client::is_level_counter(c.name)) continue;
      auto was = std::find_if(before.begin(), before.end(), [&](const auto& b) { return b.name == c.name; });
      if (was == before.end()) continue;  // new in the second reading: counted from 0
      if (was->value > c.value) {
        return fail(path + ": " + c.name + " went back from " + std::to_string(was->value) + " to " +
                    std::to_string(c.value) + " (was the mount restarted?); run it again");
      }
      c.value -= was->value;
    }
  }
  if (json) {
    for (const auto& c : shown) {
      const bool level = penstock::client::is_level_counter(c.name);
      std::printf("{\"mount\":%s,\"counter\":%s,", json_string(path).c_str(), json_string(c.name).c_str());
      if (interval_s > 0 && !level) {
        std::printf("\"change\":%llu,\"interval_s\":%.3f}\n", static_cast<Ull>(c.value), interval_s);
      } else {
        std::printf("\"value\":%llu%s}\n", static_cast<Ull>(c.value), level ? ",\"level\":true" : "");
      }
    }
    return 0;
  }
  if (interval_s > 0) {
    std::printf("mount %s: per second over %.1f s (levels: now)\n", path.c_str(), interval_s);
  } else {
    std::printf("mount %s: since it started (levels: now)\n", path.c_str());
  }
  for (const auto& c : shown) {
    const bool level = penstock::client::is_level_counter(c.name);
    std::printf("  %-42s %14s%s\n", c.name.c_str(), count_text(c.value, level ? 0 : interval_s).c_str(),
                level ? "  (level)" : "");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  penstock::set_log_level(penstock::LogLevel::kWarn);
  penstock::set_log_component("cli");
  CLI::App app{
      "penstock: administer a Penstock file system (cluster status, space, directory layouts, scrub, server "
      "counters)."};
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
  bool methods = false;
  auto* stc = app.add_subcommand(
      "stats", "show what the servers handled: the meta server's requests per method, each data server's targets "
               "(reads, bytes, how reads went: sequential, O_DIRECT, sent unread; writes; errors); with --mount, "
               "one mount's counters");
  auto* stats_meta = stc->add_option("--meta", meta, "penstock-meta address host:port")->capture_default_str();
  stc->add_option("--interval", interval_s,
                  "seconds to watch (0.1 to 86400): what changed over them, per second in the table, as differences "
                  "with the seconds they cover in JSON (0: totals since each server started)")
      ->capture_default_str()
      ->check([](const std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !std::isfinite(v) || (v != 0 && (v < 0.1 || v > 86400))) {
          return "--interval must be 0 or 0.1 to 86400 seconds, not '" + text + "'";
        }
        return "";
      });
  std::string mount_path;
  auto* methods_flag = stc->add_flag("--methods", methods, "the data servers' requests per method too");
  auto* stats_mount =
      stc->add_option("--mount", mount_path,
                      "a penstock mount (any path on it): show that mount's counters (user.penstock.stats: chunk "
                      "cache, open tickets, directory leases, creates behind, FUSE loop) instead of the servers'")
          ->excludes(methods_flag)
          ->excludes(stats_meta)
          ->check([](const std::string& text) -> std::string {
            return text.empty() ? "--mount needs a path on a penstock mount" : "";
          });
  stc->add_flag("--json", json,
                "one JSON object per line (a target, or a server's method; with --mount, a counter) instead of tables");

  CLI11_PARSE(app, argc, argv);
  if (lget->parsed()) return layout_get(get_path);
  if (lset->parsed()) return layout_set(set_dir, chunk_size, stripe_count);
  if (st->parsed()) return status(meta);
  if (dfc->parsed()) return df(meta);
  if (scc->parsed()) return scrub(meta, dry_run, timeout_s);
  if (stc->parsed()) {
    return stats_mount->count() > 0 ? mount_stats(mount_path, interval_s, json) : stats(meta, interval_s, json, methods);
  }
  return fail("no command given; see --help");
}
