// penstock-meta: the metadata server daemon. Parses flags (or a TOML --config file), opens the
// RocksDB store, loads the namespace, serves the meta RPCs, runs session/node expiry and chunk GC in
// the background, and stops cleanly on SIGTERM/SIGINT. After a full disk it opens the database again
// by itself once there is room (server/meta/disk_reserve.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/base/byte_size.h"
#include "common/base/log.h"
#include "common/net/endpoint.h"
#include "common/net/transport.h"
#include "server/daemon/daemon.h"
#include "server/meta/disk_reserve.h"
#include "server/meta/gc.h"
#include "server/meta/meta_server.h"
#include "server/meta/namespace.h"
#include "server/meta/cached_store.h"
#include "server/meta/rocksdb_store.h"
#include "server/meta/schema.h"
#include "server/meta/scrub.h"

namespace {

using namespace penstock;

struct Flags {
  std::string listen = "127.0.0.1:7600";
  std::string db;
  std::string log_level = "info";
  double session_lease_s = 30;
  double node_timeout_s = 10;
  int node_report_wait_ms = meta::kDefaultNodeReportWaitNs / 1'000'000;
  double entry_lease_s = meta::kDefaultEntryLeaseNs / 1e9;
  int64_t dir_lease_ms = meta::kDefaultDirLeaseNs / 1'000'000;
  int workers = 8;
  int io_threads = 2;
  int close_sync_ms = 50;
  int record_cache_mb = 128;
  double scrub_interval_s = 86400;
  std::string disk_reserve;  // empty: DiskReserve::default_bytes
  int memtable_mb = 64;
};

// run() asks main() to run it again: the database is opened anew after a full disk.
constexpr int kOpenAgain = -1;
// At most one reopen this often, whatever the disk says.
constexpr auto kMinReopenInterval = std::chrono::seconds(5);
// How often the disk watch looks at the store, and how often a missing ballast is tried again.
constexpr auto kDiskWatchPeriod = std::chrono::seconds(1);
constexpr auto kBallastRetry = std::chrono::seconds(5);

// What outlives one run() of the service in this process.
struct RunState {
  int runs = 0;       // runs started so far
  uint16_t port = 0;  // the port the first run served on: a reopen serves on the same one
  std::chrono::steady_clock::time_point last_open{};  // of the last reopen
};

// The store and the namespace over it, opened together (and closed in reverse).
struct Opened {
  std::unique_ptr<meta::RocksDbStore> store;
  std::unique_ptr<meta::CachedStore> cached;
  std::unique_ptr<meta::MetaService> service;
};

Result<Opened> open_service(const Flags& flags, const meta::MetaOptions& opts) {
  meta::RocksDbOptions store_options;
  store_options.sync_soon_delay = std::chrono::milliseconds(flags.close_sync_ms);
  store_options.write_buffer_bytes = static_cast<size_t>(flags.memtable_mb) << 20;
  Opened o;
  PENSTOCK_ASSIGN_OR_RETURN(o.store, meta::RocksDbStore::open(flags.db, store_options));
  // Inode and directory-entry records are read far more often than written: a lookup reads three,
  // an open two (server/meta/cached_store.h).
  meta::CachedStoreOptions cache_options;
  cache_options.capacity_bytes = static_cast<size_t>(flags.record_cache_mb) << 20;
  cache_options.prefixes = {std::string(meta::schema::kInodePrefix), std::string(meta::schema::kDentryPrefix)};
  o.cached = std::make_unique<meta::CachedStore>(o.store.get(), cache_options);
  PENSTOCK_ASSIGN_OR_RETURN(o.service, meta::MetaService::open(o.cached.get(), opts));
  return o;
}

std::string mib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return text;
}

// One look of the disk watch at a store whose log failed: removes the ballast and says whether the
// database may be opened again now. `told` keeps the waiting message to once per run.
bool time_to_reopen(const Status& failed, meta::DiskReserve& reserve, const std::string& db, bool* told) {
  if (failed.code() != Code::kNoSpace) {
    if (!*told) {
      PENSTOCK_LOG(Error) << "the metadata database's disk failed (" << failed.to_string()
                          << "): changes are refused and reads go on; fix the disk and restart penstock-meta";
      *told = true;
    }
    return false;
  }
  if (const uint64_t freed = reserve.release(); freed > 0) {
    PENSTOCK_LOG(Warn) << "the metadata disk is full: removed the ballast file " << reserve.ballast_path() << " ("
                       << mib(freed) << ") so that the database can be opened again";
  }
  uint64_t need = 0;
  uint64_t free = 0;
  Result<bool> ready = reserve.ready_to_reopen(&need, &free);
  if (ready.has_value() && *ready) {
    PENSTOCK_LOG(Warn) << "opening the metadata database again after a full disk (" << mib(free) << " free, "
                       << mib(need) << " needed): changes resume once it is open, and every acknowledged one is kept";
    return true;
  }
  if (!*told) {
    PENSTOCK_LOG(Error) << "the metadata disk is full: changes fail with ENOSPC and reads go on. penstock-meta opens "
                        << "the database again by itself once " << mib(need) << " are free in " << db << " ("
                        << (ready.has_value() ? mib(free) : ready.error().to_string())
                        << " now): remove files on that disk or grow it";
    *told = true;
  }
  return false;
}

// Makes the ballast when there is room; logs what it did (a failure or a lack of room only at a start).
void ensure_ballast(meta::DiskReserve& reserve, bool at_start) {
  bool made = false;
  const Status st = reserve.ensure(&made);
  if (!st.is_ok()) {
    if (at_start) {
      PENSTOCK_LOG(Warn) << "no ballast file for a full disk: " << st.to_string();
    }
  } else if (made) {
    PENSTOCK_LOG(Info) << "ballast file " << reserve.ballast_path() << " (" << mib(reserve.bytes())
                       << ") made: after a full disk it is the room to open the database again";
  } else if (at_start && reserve.bytes() > 0 && !reserve.held()) {
    PENSTOCK_LOG(Warn) << "no room for the ballast file (" << mib(reserve.bytes()) << ", made when twice that is free): "
                       << "after a full disk penstock-meta waits for room before it takes changes again";
  }
}

int run(const Flags& flags, RunState* state) {
  LogLevel level;
  if (!parse_log_level(flags.log_level, &level)) {
    std::cerr << "penstock-meta: --log-level must be debug, info, warn or error, not '" << flags.log_level << "'\n";
    return 2;
  }
  set_log_level(level);
  set_log_component("meta");
  auto ep = net::Endpoint::parse(flags.listen);
  if (!ep.has_value()) {
    std::cerr << "penstock-meta: --listen: " << ep.error().to_string() << "; give host:port, e.g. 127.0.0.1:7600\n";
    return 2;
  }
  if (flags.session_lease_s <= 0 || flags.node_timeout_s <= 0 || flags.workers < 1 ||
      flags.io_threads < 1) {
    std::cerr << "penstock-meta: --session-lease-s and --node-timeout-s must be > 0, --workers and --io-threads >= 1\n";
    return 2;
  }
  if (flags.node_report_wait_ms < 0 || flags.node_report_wait_ms > 4'000) {
    std::cerr << "penstock-meta: --node-report-wait-ms must be between 0 and 4000 (clients retry a waiting create "
                 "for 5 s)\n";
    return 2;
  }
  if (flags.close_sync_ms < 0 || flags.close_sync_ms > 60'000) {
    std::cerr << "penstock-meta: --close-sync-ms must be between 0 and 60000 milliseconds\n";
    return 2;
  }
  if (flags.record_cache_mb < 0 || flags.record_cache_mb > 1'048'576) {
    std::cerr << "penstock-meta: --record-cache-mb must be between 0 (off) and 1048576 MiB\n";
    return 2;
  }
  if (flags.memtable_mb < 1 || flags.memtable_mb > 4096) {
    std::cerr << "penstock-meta: --memtable-mb must be between 1 and 4096 MiB\n";
    return 2;
  }
  if (!(flags.scrub_interval_s == 0 || (flags.scrub_interval_s >= 1 && flags.scrub_interval_s <= 365.0 * 86400))) {
    std::cerr << "penstock-meta: --scrub-interval-s must be 0 (no background scrub) or between 1 and 31536000 seconds\n";
    return 2;
  }
  // A contended rmdir/rename waits up to the term on a worker thread: it must stay well inside a
  // client's 10 s call deadline.
  if (!(flags.entry_lease_s >= 0 && flags.entry_lease_s <= meta::kMaxEntryLeaseNs / 1e9)) {
    std::cerr << "penstock-meta: --entry-lease-s must be between 0 (off) and " << meta::kMaxEntryLeaseNs / 1e9
              << " seconds\n";
    return 2;
  }
  if (!(flags.dir_lease_ms >= 0 && flags.dir_lease_ms <= meta::kMaxDirLeaseNs / 1'000'000)) {
    std::cerr << "penstock-meta: --dir-lease-ms must be between 0 (off) and " << meta::kMaxDirLeaseNs / 1'000'000
              << "\n";
    return 2;
  }
  daemon::block_termination_signals();
  // Every mount holds a few connections (shared ones and one per thread that waits on a call).
  if (const size_t files = daemon::raise_open_file_limit(); files < 4096) {
    PENSTOCK_LOG(Warn) << "open-file limit " << files << ": each client connection is a descriptor; raise "
                       << "`ulimit -n` (LimitNOFILE= in the systemd unit) for more than a few hundred mounts";
  }

  Status st = daemon::ensure_directory(flags.db);
  if (!st.is_ok()) {
    PENSTOCK_LOG(Error) << "--db: " << st.to_string();
    return 1;
  }
  uint64_t reserve_bytes = 0;
  if (flags.disk_reserve.empty()) {
    if (auto space = daemon::disk_space(flags.db); space.has_value()) {
      reserve_bytes = meta::DiskReserve::default_bytes(space->total);
    }
  } else {
    auto parsed = parse_byte_size(flags.disk_reserve);
    if (!parsed.has_value()) {
      std::cerr << "penstock-meta: --disk-reserve: " << parsed.error().to_string() << "; give a size such as 256M, or 0\n";
      return 2;
    }
    reserve_bytes = *parsed;
  }
  meta::MetaOptions opts;
  opts.session_lease_ns = static_cast<int64_t>(flags.session_lease_s * 1e9);
  opts.node_timeout_ns = static_cast<int64_t>(flags.node_timeout_s * 1e9);
  opts.node_report_wait_ns = static_cast<int64_t>(flags.node_report_wait_ms) * 1'000'000;
  opts.entry_leases.term_ns = static_cast<int64_t>(flags.entry_lease_s * 1e9);
  opts.dir_leases.term_ns = flags.dir_lease_ms * 1'000'000;
  const bool again = state->runs++ > 0;
  meta::DiskReserveOptions reserve_options;
  reserve_options.dir = flags.db;
  reserve_options.bytes = reserve_bytes;
  meta::DiskReserve reserve(reserve_options);
  Opened opened;
  for (;;) {
    auto o = open_service(flags, opts);
    if (o.has_value()) {
      opened = std::move(*o);
      break;
    }
    if (!again) {
      PENSTOCK_LOG(Error) << o.error().to_string();
      return 1;
    }
    // Opening again after a full disk: until it works there is nothing to serve. Tried again every
    // 5 s once the disk has room for it (a failed open may leave files that take more), until stopped.
    PENSTOCK_LOG(Error) << "opening the metadata database again failed: " << o.error().to_string()
                        << "; trying again when there is room, every 5 s (SIGTERM stops penstock-meta)";
    for (bool room = false; !room;) {
      const std::string sig = daemon::wait_for_termination_signal(std::chrono::seconds(5));
      if (!sig.empty()) {
        PENSTOCK_LOG(Info) << "got " << sig << ", stopping";
        return 0;
      }
      uint64_t need = 0;
      uint64_t free = 0;
      const Result<bool> ready = reserve.ready_to_reopen(&need, &free);
      room = !ready.has_value() || *ready;  // unknown space: try all the same
    }
  }
  if (again) state->last_open = std::chrono::steady_clock::now();
  meta::MetaService& svc = *opened.service;
  ensure_ballast(reserve, /*at_start=*/true);
  // The live log can hold two memtables while a flush fails: a smaller ballast may not be room
  // enough to open the database again.
  const uint64_t log_room = (uint64_t{2} * static_cast<uint64_t>(flags.memtable_mb) << 20) + meta::DiskReserve::kReopenMargin;
  if (!again && reserve_bytes > 0 && reserve_bytes < log_room) {
    PENSTOCK_LOG(Warn) << "the ballast (" << mib(reserve_bytes) << ") is smaller than two memtables and a margin ("
                       << mib(log_room) << "): after a full disk its room may not be enough to open the database "
                       << "again; give a larger --disk-reserve or a smaller --memtable-mb";
  }

  net::IoRuntime io(1);
  meta::RpcDataNodes data_nodes(io, std::chrono::milliseconds(5000));
  meta::GarbageCollector gc(svc, data_nodes);
  gc.start();
  meta::ScrubOptions scrub_options;
  scrub_options.interval = std::chrono::milliseconds(static_cast<int64_t>(flags.scrub_interval_s * 1000));
  // The first background pass comes soon after a start, the one most likely to follow a crash.
  scrub_options.first_delay = std::min<std::chrono::milliseconds>(scrub_options.interval, std::chrono::minutes(10));
  meta::Scrubber scrubber(svc, data_nodes, data_nodes, scrub_options);
  scrubber.start();

  rpc::ServerOptions sopts;
  sopts.listen = *ep;
  if (again && state->port != 0) sopts.listen.port = state->port;  // "port 0" picked one the first time
  sopts.worker_threads = flags.workers;
  sopts.io_threads = flags.io_threads;
  meta::MetaServer server(svc, sopts);
  st = server.start();
  if (!st.is_ok() && again) {
    // Opening again after a full disk: the first run served on this port, so try it all again.
    scrubber.stop();
    gc.stop();
    PENSTOCK_LOG(Error) << "cannot listen on port " << sopts.listen.port << " again: " << st.to_string()
                        << "; trying again in 5 s (SIGTERM stops penstock-meta)";
    const std::string sig = daemon::wait_for_termination_signal(std::chrono::seconds(5));
    if (!sig.empty()) {
      PENSTOCK_LOG(Info) << "got " << sig << ", stopping";
      return 0;
    }
    return kOpenAgain;
  }
  if (!st.is_ok()) {
    scrubber.stop();
    gc.stop();
    if (st.message().find("in use") != std::string::npos) {
      PENSTOCK_LOG(Error) << "cannot listen on " << flags.listen << ": address in use; is another penstock-meta running?";
    } else {
      PENSTOCK_LOG(Error) << "cannot listen on " << flags.listen << ": " << st.to_string()
                          << "; is another penstock-meta running, or is the address wrong?";
    }
    return 1;
  }
  if (!again) state->port = server.port();
  char lease[32];
  std::snprintf(lease, sizeof lease, flags.entry_lease_s > 0 ? "%g s" : "off", flags.entry_lease_s);
  PENSTOCK_LOG(Info) << "penstock-meta listening on " << ep->host << ":" << server.port() << ", db " << flags.db
                     << ", map version " << svc.map_version() << ", directory entry leases " << lease
                     << ", directory leases for creates behind "
                     << (flags.dir_lease_ms > 0 ? std::to_string(flags.dir_lease_ms) + " ms" : std::string("off")) << ", scrub "
                     << (flags.scrub_interval_s > 0 ? "every " + std::to_string(static_cast<int64_t>(flags.scrub_interval_s)) + " s"
                                                    : std::string("on demand only"));

  // Session and node expiry: checked often enough that a timeout is noticed within a quarter of it.
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  auto period = std::chrono::nanoseconds(std::min(opts.session_lease_ns, opts.node_timeout_ns) / 4);
  period = std::max<std::chrono::nanoseconds>(period, std::chrono::milliseconds(50));
  std::thread expiry([&] {
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, period, [&] { return stopping; })) {
      lock.unlock();
      Status e = svc.expire();
      if (!e.is_ok()) {
        PENSTOCK_LOG(Error) << "expiry pass failed: " << e.to_string();
      }
      lock.lock();
    }
  });
  // The disk watch: after a failed write of the log, opens the database again once it can (a full
  // disk); otherwise keeps the ballast in place.
  std::atomic<bool> open_again{false};
  std::thread disk_watch([&] {
    bool told = false;
    auto last_ballast_try = std::chrono::steady_clock::now();
    std::unique_lock lock(mu);
    while (!cv.wait_for(lock, kDiskWatchPeriod, [&] { return stopping; })) {
      lock.unlock();
      const auto now = std::chrono::steady_clock::now();
      if (const Status failed = opened.store->wal_error(); !failed.is_ok()) {
        if (now - state->last_open >= kMinReopenInterval && time_to_reopen(failed, reserve, flags.db, &told)) {
          open_again.store(true);
          return;
        }
      } else if (now - last_ballast_try >= kBallastRetry) {
        last_ballast_try = now;
        ensure_ballast(reserve, /*at_start=*/false);
      }
      lock.lock();
    }
  });

  std::string sig;
  while (sig.empty() && !open_again.load()) sig = daemon::wait_for_termination_signal(std::chrono::milliseconds(200));
  // A signal wins over a reopen the disk watch decided, also one that came with the decision
  // (looked for once more here); one that comes later stays pending, and the next run's wait
  // takes it.
  if (sig.empty()) sig = daemon::wait_for_termination_signal(std::chrono::milliseconds(0));
  const bool reopen = sig.empty();
  if (!reopen) {
    PENSTOCK_LOG(Info) << "got " << sig << ", stopping";
  }
  {
    std::lock_guard lock(mu);
    stopping = true;  // first: the disk watch decides nothing more
  }
  cv.notify_all();
  disk_watch.join();
  scrubber.stop();  // before the server: its stop waits for a Scrub call in flight, which this ends
  server.stop();
  expiry.join();
  if (reopen) {
    // The log refuses every write now: the opens only in memory go with this run, and every mount
    // gives its opens back to the next one (it sees the new map version).
    gc.stop();
    PENSTOCK_LOG(Info) << "metadata service stopped for opening the database again";
    return kOpenAgain;
  }
  // Opens younger than the delay are only in memory: store them, so this restart forgets none.
  if (Status st = svc.store_opens(); !st.is_ok()) {
    PENSTOCK_LOG(Error) << "storing the open files before the stop failed: " << st.to_string();
  }
  gc.stop();
  PENSTOCK_LOG(Info) << "penstock-meta stopped (" << opened.store->wal_syncs() << " group-commit WAL syncs, record cache "
                     << opened.cached->hits() << " hits, " << opened.cached->misses() << " misses)";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"penstock-meta: the Penstock metadata server (namespace, sessions, cluster map; RocksDB)"};
  app.set_config("--config", "", "Read options from this TOML file (keys are the long flag names, e.g. db = \"/var/lib/penstock/meta\"); flags given on the command line win");
  // A misspelled key is an error, not a default silently kept.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--listen", flags.listen, "host:port to serve metadata RPCs on (default 127.0.0.1:7600; port 0 picks a free one)")->capture_default_str();
  app.add_option("--db", flags.db, "Directory of the RocksDB metadata database; created if missing; one penstock-meta per directory (required)")->required();
  app.add_option("--log-level", flags.log_level, "Log level: debug, info, warn or error (default info)")->capture_default_str();
  app.add_option("--session-lease-s", flags.session_lease_s, "Seconds a client session lives without a heartbeat before its opens are dropped (default 30)")->capture_default_str();
  app.add_option("--node-timeout-s", flags.node_timeout_s, "Seconds without heartbeat after which a data server is marked offline (default 10)")->capture_default_str();
  app.add_option("--node-report-wait-ms", flags.node_report_wait_ms,
                 "Milliseconds after a start during which new files wait for every known data server to report again "
                 "(until it does it is offline, and a file made then would leave it out); 0 waits for none (default "
                 "3000, at most 4000)")
      ->capture_default_str();
  app.add_option("--entry-lease-s", flags.entry_lease_s,
                 "Seconds a mount may reuse a directory's name without asking again; rmdir and rename of a directory "
                 "another mount looked up wait up to this long (default 1; 0 turns entry leases off). For that long after a "
                 "start, every rmdir and rename waits, for the longest term this database was ever served with")
      ->capture_default_str();
  app.add_option("--dir-lease-ms", flags.dir_lease_ms,
                 "Milliseconds a mount may hold a directory's names for itself, answering \"no such name\" and creating "
                 "files behind (sent in batches) while it creates many files there; another mount's first use of that "
                 "directory waits up to this long plus 100 ms, and it is not leased again for 10 s (default 250; 0 turns "
                 "directory leases off; at most 2000). For that long after a start, every directory operation waits, for "
                 "the longest term this database was ever served with")
      ->capture_default_str();
  app.add_option("--close-sync-ms", flags.close_sync_ms,
                 "Milliseconds within which a file size reported by close(), and a create, mkdir, mknod, symlink or "
                 "unlink, is synced to disk; they wait only until every client sees them and a crash of penstock-meta "
                 "cannot lose them (fsync() of the file or its directory waits for the sync). Default 50")
      ->capture_default_str();
  app.add_option("--record-cache-mb", flags.record_cache_mb,
                 "MiB of inode and directory-entry records kept in memory in front of the database (0: off; default 128)")
      ->capture_default_str();
  app.add_option("--scrub-interval-s", flags.scrub_interval_s,
                 "Seconds between background scrubs, which remove chunks no file owns (those of a create a power loss "
                 "took back after its data was written); the first runs 10 minutes after start, or after the interval "
                 "when shorter. 0: only on demand (`penstock scrub`). Default 86400")
      ->capture_default_str();
  app.add_option("--disk-reserve", flags.disk_reserve,
                 "Bytes of the database's disk held by a ballast file (PENSTOCK-BALLAST in --db) while there is room "
                 "for it: when the disk fills up, changes fail with ENOSPC, and penstock-meta removes the ballast and "
                 "opens the database again in its room, so that deletes work; without a ballast it does that once "
                 "the disk has room again. K/M/G/T suffixes; 0: no ballast (default: 256M, or 5% of the file system "
                 "when that is less)");
  app.add_option("--memtable-mb", flags.memtable_mb,
                 "MiB of changes RocksDB gathers in memory before it writes them to a table file; the write-ahead "
                 "log stays about this size, and opening the database again after a full disk needs that much free "
                 "(default 64)")
      ->capture_default_str();
  app.add_option("--workers", flags.workers, "RPC worker threads that run metadata requests (default 8)")->capture_default_str();
  app.add_option("--io-threads", flags.io_threads,
                 "Network threads; they also answer lookups, getattr, readdir, open and release (default 2)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  RunState state;
  for (;;) {
    const int rc = run(flags, &state);
    if (rc != kOpenAgain) return rc;
  }
}
