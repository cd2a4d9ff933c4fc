// penstock-data: the data server daemon. Flags (or the same keys in a TOML file given with
// --config) are listed by --help; none can change while the process runs.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/base/byte_size.h"
#include "common/base/log.h"
#include "common/base/malloc_tuning.h"
#include "server/daemon/daemon.h"
#include "server/data/chunk_format.h"
#include "server/data/data_server.h"

namespace {

int fail(const std::string& what) {
  std::fprintf(stderr, "penstock-data: %s\n", what.c_str());
  return 1;
}

// Raises the open-file limit to its hard maximum and returns how many cached chunk files per
// target fit in half of it (the rest stays for sockets, syncs and the other targets' churn).
size_t fit_fd_cache(size_t wanted, size_t targets, bool two_descriptors) {
  const size_t limit = penstock::daemon::raise_open_file_limit();
  if (limit == SIZE_MAX) return wanted;
  const size_t per_entry = two_descriptors ? 2 : 1;
  const size_t fit = limit / 2 / per_entry / std::max<size_t>(1, targets);
  if (wanted <= fit) return wanted;
  PENSTOCK_LOG(Warn) << "--fd-cache " << wanted << " with " << targets << " target(s) would pass half the open-file "
                     << "limit (" << limit << "); using " << fit << ". Raise `ulimit -n` (LimitNOFILE= in "
                     << "the systemd unit) to cache more";
  return fit;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace penstock;
  CLI::App app{
      "penstock-data: the Penstock data server. Stores file chunks (checksummed per 4 KiB block) in one or\n"
      "more target directories, serves them over TCP and registers with penstock-meta."};
  std::string listen = "127.0.0.1:7700";
  std::string meta = "127.0.0.1:7600";
  std::vector<std::string> targets;
  std::string level = "info";
  int heartbeat_ms = 2000;
  int workers = 8;
  size_t fd_cache = 1024;
  bool direct_io = false;
  std::string direct_write_min = std::to_string(data::kDefaultDirectWriteMin);
  std::string direct_read_min = "0";
  bool buffered_streams = false;
  std::string write_piece = std::to_string(data::kDefaultWritePieceWhileReading);
  app.set_config("--config", "", "TOML file with any of the options below (keys without the dashes, e.g. "
                                 "target = [\"/nvme0/penstock\"]); command-line flags win");
  // A misspelled key is an error, not a default silently kept.
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.add_option("--listen", listen,
                 "host:port to listen on; registered with penstock-meta as the address clients connect to, "
                 "so use an address they can reach (default 127.0.0.1:7700; port 0 picks a free port)");
  app.add_option("--meta", meta, "host:port of penstock-meta (default 127.0.0.1:7600)");
  app.add_option("--target", targets,
                 "directory holding a target's chunks, created if missing; repeat for several targets "
                 "(at least one; the first also keeps this node's node.uuid)")
      ->required();
  app.add_option("--log-level", level, "debug | info | warn | error (default info)");
  app.add_option("--heartbeat-ms", heartbeat_ms,
                 "milliseconds between heartbeats to penstock-meta carrying each target's free space "
                 "(default 2000); keep it well under penstock-meta's --node-timeout-s (default 10 s), "
                 "or this node is marked offline between heartbeats")
      ->check(CLI::Range(50, 600000));
  app.add_option("--workers", workers,
                 "threads running chunk requests, each with its own io_uring (default 8)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--fd-cache", fd_cache,
                 "open chunk files kept per target (LRU), so requests skip open/close; 0 turns it off. "
                 "Each costs one descriptor (two with direct I/O): keep it under the open-file limit "
                 "(default 1024)")
      ->check(CLI::Range(size_t{0}, size_t{1} << 20));
  app.add_flag("--direct-io", direct_io,
               "move chunk data with O_DIRECT, bypassing the page cache (default off; a target on a file "
               "system without O_DIRECT, e.g. tmpfs, logs a warning and stays buffered)");
  app.add_option("--direct-write-min", direct_write_min,
                 "writes of at least this size (K/M/G suffixes, powers of 1024) move their data with "
                 "O_DIRECT while smaller writes use the page cache (reads: --direct-read-min): a checkpoint's streaming "
                 "writes reach the disk as they arrive instead of waiting for fsync, and leave nothing "
                 "dirty; 0 turns it off (default 1M)");
  app.add_option("--direct-read-min", direct_read_min,
                 "reads of a chunk at least this long (a large file's; K/M/G suffixes) whose bytes are not "
                 "all in the page cache move them with O_DIRECT, so cold data reaches clients without "
                 "filling this host's page cache first, while the chunks of smaller files, cached ranges "
                 "and ranges not yet written back are read through the page cache (needs cachestat(2), "
                 "Linux 6.5; off without). Worth it where a fresh page-cache page costs more than "
                 "a copy (a VM returning freed memory to its host); over TCP the page cache is otherwise "
                 "cheaper, its ranges sent without a copy (default 0: off; e.g. 1M)");
  app.add_flag("--buffered-streams", buffered_streams,
               "under --direct-read-min, reads a client marks sequential (its read-ahead of a stream) "
               "stay in the page cache too, which reads ahead of them; only random cold reads of long "
               "chunks go direct. Try it where fresh page-cache pages are cheap; where they are dear, "
               "streams read faster direct (docs/performance.md, round 36)");
  app.add_option("--write-piece-while-reading", write_piece,
                 "while reads of a target wait for its disk (or did under 20 ms ago), its O_DIRECT writes go "
                 "to the disk in pieces of this size, one after another, so training reads queue behind one "
                 "piece of a checkpoint write instead of all of it (a multiple of 4K, K/M suffixes; 0: writes "
                 "always go whole; default 512K)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  set_log_component("data");
  LogLevel log_level = LogLevel::kInfo;
  if (!parse_log_level(level, &log_level)) {
    return fail("--log-level '" + level + "' is not one of debug, info, warn, error");
  }
  set_log_level(log_level);

  data::DataServerOptions options;
  auto listen_ep = net::Endpoint::parse(listen);
  if (!listen_ep.has_value()) return fail("--listen: " + listen_ep.error().to_string());
  auto meta_ep = net::Endpoint::parse(meta);
  if (!meta_ep.has_value()) return fail("--meta: " + meta_ep.error().to_string());
  options.listen = *listen_ep;
  options.meta = *meta_ep;
  options.targets = targets;
  options.heartbeat = std::chrono::milliseconds(heartbeat_ms);
  options.workers = workers;
  auto write_min = parse_byte_size(direct_write_min);
  if (!write_min.has_value()) return fail("--direct-write-min: " + write_min.error().message());
  if (*write_min > (uint64_t{1} << 30)) {
    return fail("--direct-write-min " + direct_write_min + " is larger than any write (at most 1G; 0 turns it off)");
  }
  auto read_min = parse_byte_size(direct_read_min);
  if (!read_min.has_value()) return fail("--direct-read-min: " + read_min.error().message());
  if (*read_min > (uint64_t{64} << 20)) {
    return fail("--direct-read-min " + direct_read_min + " is longer than any chunk (at most 64M; 0 turns it off)");
  }
  options.store.direct_io = direct_io;
  options.store.direct_write_min = static_cast<uint32_t>(*write_min);
  options.store.direct_read_min = static_cast<uint32_t>(*read_min);
  if (buffered_streams && *read_min == 0) {
    return fail("--buffered-streams needs --direct-read-min (without it every read is buffered already)");
  }
  options.store.buffered_streams = buffered_streams;
  auto piece = parse_byte_size(write_piece);
  if (!piece.has_value()) return fail("--write-piece-while-reading: " + piece.error().message());
  const uint64_t block = data::kBlockSize;
  if (*piece != 0 && (*piece < block || *piece % block != 0 || *piece > (uint64_t{1} << 30))) {
    return fail("--write-piece-while-reading " + write_piece +
                " must be a multiple of 4K between 4K and 1G (O_DIRECT moves whole blocks), or 0");
  }
  options.store.write_piece_while_reading = static_cast<uint32_t>(*piece);
  options.store.fd_cache = fit_fd_cache(fd_cache, targets.size(), options.store.any_direct());

  // Before any thread starts, so that every thread inherits the blocked signal mask.
  daemon::block_termination_signals();
  keep_large_buffers_mapped();
  data::DataServer server(options);
  Status st = server.start();
  if (!st.is_ok()) return fail(st.to_string());
  std::string sig = daemon::wait_for_termination_signal();
  PENSTOCK_LOG(Info) << sig << " received; stopping";
  server.stop();
  PENSTOCK_LOG(Info) << "stopped";
  return 0;
}
