// The libfuse3 low-level operations of penstock-mount: a thin adapter that turns each kernel
// request into calls on client::Client and exactly one reply. The FUSE API version is pinned here
// (3.12: the first whose fuse_loop_config carries max_threads; the op signatures we use are those
// of 3.5+). Thread-safety: every op may run on any FUSE worker thread at once; per-handle state is
// immutable (files) or guarded by a leaf mutex (directories) that is never held across an RPC or a
// fuse_reply_* call.
#pragma once

#include <atomic>

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include "client/fuse/late_replies.h"
#include "client/fuse/worker_pool.h"
#include "client/lib/client.h"

namespace penstock::fuse {

// What the ops reach through fuse_req_userdata(). REQUIRES: `client` outlives the session.
struct MountState {
  client::Client* client = nullptr;
  bool direct_io = false;  // FOPEN_DIRECT_IO on every open (MountSettings::direct_io)
  // ...and on write-only opens (MountSettings::direct_writes); op_init clears it where the
  // kernel would leave stale pages (fuse_ops.cc, kMinorDirectWriteDropsCache).
  bool direct_writes = false;
  // Ask the kernel for SPLICE_READ (MountSettings::splice_writes): WRITE data then arrives in a pipe
  // holding the writer's pages and is read from it into the write-behind buffer, one copy. op_init
  // clears it where libfuse could not splice.
  bool splice_writes = false;
  fuse_session* session = nullptr;  // for invalidation notices; set once the session exists
  LateReplies late_replies;
  // The FUSE loop's counters (user.penstock.stats): its places, and what its WorkerPool counts.
  // Both stay 0 under --clone-fd, whose loop is libfuse's.
  std::atomic<int> fuse_places{0};  // set as the loop starts (ring threads may read it then)
  WorkerPoolCounters fuse_workers;
};

// The operation table (static storage).
const fuse_lowlevel_ops& penstock_ops();

// Adjusts the client's options to the consistency contract of these ops (attribute timeout), so
// that the client's directory-attribute cache never serves older attributes than the kernel may.
void apply_contract(client::ClientOptions* options);

}  // namespace penstock::fuse
