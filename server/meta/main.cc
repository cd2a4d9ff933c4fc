// penstock-meta: the metadata server daemon. Parses flags (or a TOML --config file), opens the
// RocksDB store, loads the namespace, serves the meta RPCs, runs session/node expiry and chunk GC in
// the background, and stops cleanly on SIGTERM/SIGINT.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/base/log.h"
#include "common/net/endpoint.h"
#include "common/net/transport.h"
#include "server/daemon/daemon.h"
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
};

int run(const Flags& flags) {
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
  meta::RocksDbOptions store_options;
  store_options.sync_soon_delay = std::chrono::milliseconds(flags.close_sync_ms);
  auto store = meta::RocksDbStore::open(flags.db, store_options);
  if (!store.has_value()) {
    PENSTOCK_LOG(Error) << store.error().to_string();
    return 1;
  }
  // Inode and directory-entry records are read far more often than written: a lookup reads three,
  // an open two (server/meta/cached_store.h).
  meta::CachedStoreOptions cache_options;
  cache_options.capacity_bytes = static_cast<size_t>(flags.record_cache_mb) << 20;
  cache_options.prefixes = {std::string(meta::schema::kInodePrefix), std::string(meta::schema::kDentryPrefix)};
  meta::CachedStore cached(store->get(), cache_options);
  meta::MetaOptions opts;
  opts.session_lease_ns = static_cast<int64_t>(flags.session_lease_s * 1e9);
  opts.node_timeout_ns = static_cast<int64_t>(flags.node_timeout_s * 1e9);
  opts.node_report_wait_ns = static_cast<int64_t>(flags.node_report_wait_ms) * 1'000'000;
  opts.entry_leases.term_ns = static_cast<int64_t>(flags.entry_lease_s * 1e9);
  opts.dir_leases.term_ns = flags.dir_lease_ms * 1'000'000;
  auto service = meta::MetaService::open(&cached, opts);
  if (!service.has_value()) {
    PENSTOCK_LOG(Error) << service.error().to_string();
    return 1;
  }
  meta::MetaService& svc = **service;

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
  sopts.worker_threads = flags.workers;
  sopts.io_threads = flags.io_threads;
  meta::MetaServer server(svc, sopts);
  st = server.start();
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

  std::string sig = daemon::wait_for_termination_signal();
  PENSTOCK_LOG(Info) << "got " << sig << ", stopping";
  scrubber.stop();  // first: the server's stop waits for a Scrub call in flight, which this ends
  server.stop();
  {
    std::lock_guard lock(mu);
    stopping = true;
  }
  cv.notify_all();
  expiry.join();
  // Opens younger than the delay are only in memory: store them, so this restart forgets none.
  if (Status st = svc.store_opens(); !st.is_ok()) {
    PENSTOCK_LOG(Error) << "storing the open files before the stop failed: " << st.to_string();
  }
  gc.stop();
  PENSTOCK_LOG(Info) << "penstock-meta stopped (" << (*store)->wal_syncs() << " group-commit WAL syncs, record cache "
                     << cached.hits() << " hits, " << cached.misses() << " misses)";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  CLI::App app{"penstock-meta: the Penstock metadata server (namespace, sessions, cluster map; RocksDB)"};
  app.set_config("--config", "", "Read options from this TOML file (keys are the long flag names, e.g. db = \"/var/lib/penstock/meta\"); flags given on the command line win");
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
  app.add_option("--workers", flags.workers, "RPC worker threads that run metadata requests (default 8)")->capture_default_str();
  app.add_option("--io-threads", flags.io_threads,
                 "Network threads; they also answer lookups, getattr, readdir, open and release (default 2)")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return run(flags);
}
