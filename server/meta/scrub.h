// Scrubber: finds and removes chunks that no file owns. Creates are acknowledged before their WAL
// sync (docs/meta-store.md "Durability"), so a power loss can take back a create whose client had
// already written data: those chunks, and chunks a late write recreated after its file was
// collected, belong to no inode. A pass pages through every bucket of every target
// (proto::data::ListInodes) and asks the namespace about each inode found (MetaService::chunk_owner):
// live and collecting inodes are left to their file and the garbage collector; numbers never handed
// out are left alone and counted; orphans have their chunks on that target removed
// (proto::data::Remove), after a WAL sync, so that no removal acts on an unlink a crash could still
// take back (the collector's rule too).
//
// Passes run on demand (the meta RPC Scrub, `penstock scrub`) and, with ScrubOptions::interval,
// in the background; one at a time (the RPC answers kBusy while a pass runs).
// Ownership: borrows the MetaService, lister and remover (all must outlive it); must itself
// outlive the RPC server whose Scrub handler calls it.
// Thread-safety: run() may be called from any thread (a pass waits for the one running, or is
// refused with kBusy); start/stop from the owning thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "common/base/result.h"
#include "common/proto/meta_service.h"
#include "server/meta/gc.h"
#include "server/meta/namespace.h"

namespace penstock::meta {

struct ScrubOptions {
  uint32_t page = proto::data::kMaxListInodes;  // inodes asked for per ListInodes call
  // Background passes: the first `first_delay` after start(), then one every `interval`
  // (0: no background passes; the RPC still runs them on demand).
  std::chrono::milliseconds interval{0};
  std::chrono::milliseconds first_delay{std::chrono::minutes(10)};
};

class Scrubber {
 public:
  Scrubber(MetaService& service, ChunkLister& lister, ChunkRemover& remover, ScrubOptions options = {});
  ~Scrubber();  // stop()
  Scrubber(const Scrubber&) = delete;
  Scrubber& operator=(const Scrubber&) = delete;

  // One pass over every target. A pass already running is waited for first, or with
  // `wait_for_running` false answered with kBusy. A target that is offline or cannot be listed
  // counts in targets_failed, with a line in errors, and the pass goes on; a failed removal is a
  // line in errors too. Returns the store's error when the namespace cannot be read or synced
  // (then nothing more is removed); kUnavailable once stop() began.
  Result<pm::ScrubResp> run(bool dry_run, bool wait_for_running = true);

  // Installs run() as the service's scrub RPC and, with an interval, starts the background
  // thread. Idempotent.
  void start();
  // Uninstalls the RPC (later calls get kNotSupported), ends a running pass at its next page (its
  // remaining targets count as not scrubbed; a call waiting for it gets kUnavailable), stops and
  // joins the thread. Idempotent. Call it before stopping the RPC server, whose stop waits for
  // the Scrub calls in flight.
  void stop();

 private:
  // Scrubs one target into `resp`; false when it could not be listed to the end.
  Result<bool> scrub_target(const MetaService::ScrubTarget& target, bool dry_run, pm::ScrubResp* resp);
  // Whether stop() began; if so, notes that `where` was not scrubbed to the end.
  bool stopped(const std::string& where, pm::ScrubResp* resp) const;
  void loop();

  MetaService& service_;
  ChunkLister& lister_;
  ChunkRemover& remover_;
  const ScrubOptions options_;

  std::mutex run_mu_;  // held for a whole pass: passes run one at a time
  std::atomic<bool> stopping_{false};

  // Lock order: leaf lock, guards the thread state below; never held during a pass.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_requested_ = false;
  bool started_ = false;
  std::thread thread_;
};

}  // namespace penstock::meta
