// Client: one process's connection to a Penstock cluster, the library under penstock-mount and the
// penstock CLI. Owns the I/O threads, the RPC client to penstock-meta, data-server RPC clients made
// on demand per node address from the cluster map, and (optionally) a meta session kept alive by a
// heartbeat thread. It offers typed wrappers for every meta RPC and file data I/O that fans chunk
// requests out to all data servers in parallel.
//
// Consistency it implements (DESIGN.md): a client's own writes are visible to its own reads and
// getattr (sizes are merged with the highest offset this client wrote and has not yet reported);
// flush (every close) reports the size to the meta server, so another host's open() afterwards sees
// data and size (close-to-open); fsync first makes the bytes durable on every replica (Sync).
//
// Data path (issue #3): reads through a ReadContext use one bounded LRU cache of chunk blocks shared
// by all files (ChunkCache, keyed by inode, generation and offset) with per-handle sequential
// read-ahead (StreamDetector) fetched by a small task pool; writes are gathered per file into
// chunk-sized buffers sent asynchronously (write-behind) under one dirty-byte bound (DirtyBudget).
// Reads drain overlapping buffered writes first; flush/fsync/truncate drain the file's buffers and
// surface a send error (to every open handle once, WriteError); own writes and truncates invalidate
// the overlapping cached blocks; open drops blocks of an older generation.
//
// Thread-safety: every public method may be called from any number of threads at once. No lock is
// held across an RPC (the one exception: a write racing shutdown() sends under its file's lock).
// Lock order: wb_mu_ before a WbFile's mu; a WbFile's mu before the budget's and the pool's locks;
// files_mu_, routes_mu_, data_mu_, opened_mu_, looked_up_mu_, async_mu_, errors_mu_ and the cache's
// lock are leaves: nothing is taken while one is held, except the cache's lock under files_mu_
// (prefetch_small_file checks for our own writes and inserts its block in one step); errors_mu_
// itself may be taken under wb_mu_, when write() makes a file's write-behind record.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "client/lib/chunk_cache.h"
#include "client/lib/create_behind.h"
#include "client/lib/dir_attr_cache.h"
#include "client/lib/io_plan.h"
#include "client/lib/read_ahead.h"
#include "client/lib/reported_sizes.h"
#include "client/lib/reply_slots.h"
#include "client/lib/write_behind.h"
#include "common/base/bytes.h"
#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/net/channel_factory.h"
#include "common/net/transport.h"
#include "common/proto/data_service.h"
#include "common/proto/meta_service.h"
#include "common/rpc/client.h"

namespace penstock::client {

struct ClientOptions {
  std::string meta_address = "127.0.0.1:7600";     // host:port of penstock-meta
  std::chrono::milliseconds connect_timeout{3000};  // TCP connect and the first meta call
  std::chrono::milliseconds call_timeout{10000};    // default deadline of every other RPC
  int io_threads = 2;                               // transport I/O threads
  int connections_per_server = 2;                   // TCP sockets per server
  // Data servers: auto (RDMA when a device reaches the server and it accepts RDMA, else TCP),
  // rdma or tcp. Metadata RPC always uses TCP.
  net::TransportKind transport = net::TransportKind::kAuto;
  bool register_session = true;  // false for one-shot tools (status, df): no session, no heartbeat
  std::string client_name = "penstock";  // shown in the meta server's session table
  // ---- data path (docs/architecture.md, "Client data path"); 0 turns each off ----
  uint64_t cache_size = 1ull << 30;      // bytes of file data cached, shared by all files (LRU)
  uint64_t readahead_max = 64ull << 20;  // largest read-ahead window of one sequential stream
  uint64_t dirty_limit = 256ull << 20;   // write-behind bytes not yet on the data servers
  int worker_threads = 16;               // threads sending write-behind buffers and read-ahead
  // How long "security.capability is absent" is remembered per inode (see getxattr); 0: never.
  std::chrono::milliseconds absent_xattr_ttl{1000};
  // Directory attributes served from DirAttrCache for at most this long after the meta server
  // sent them (the mount's attribute timeout); 0: never.
  std::chrono::milliseconds dir_attr_max_age{0};
  // Creates behind a directory lease (client/lib/create_behind.h); needs a session.
  bool create_behind = false;
  CreateBehindOptions create_behind_options;
  // Open tickets (Client::lookup_entry with a caller): a read-only open right after its lookup
  // costs no meta round trip of its own; needs a session.
  bool open_tickets = true;
  // How long after its lookup's answer a ticket may be taken. The kernel sends the OPEN of an
  // open() right after the LOOKUP of its last path component; a thread descheduled longer than
  // this in between only costs the Open round trip. It also bounds how long a ticket nobody takes
  // keeps an unlinked file's chunks (to about two windows: the releaser sweeps once a window).
  std::chrono::milliseconds open_ticket_window{50};
};

// Open tickets (Client::lookup_entry): opens the meta server granted with a lookup, those an
// open() took, and those released unused (the lookup was not followed by an open of the file).
struct OpenTicketStats {
  uint64_t granted = 0;
  uint64_t taken = 0;
  uint64_t dropped = 0;
};

// Per open file handle read state: the generation the handle was opened at (cache key) and the
// stream detector for read-ahead. Made by Client::make_read_context; thread-safe (mu guards the
// detector).
struct ReadContext {
  ReadContext(uint64_t gen, ReadAheadOptions options) : generation(gen), detector(options) {}
  const uint64_t generation;
  std::mutex mu;
  StreamDetector detector;  // guarded by mu
};

// The bytes of one read, in file order, as spans that point either into cached blocks (pinned by
// `pins`, so the memory stays valid while this object lives; no copy was made) or into the scratch
// buffer the caller passed to Client::read_pieces. Filled by read_pieces; the caller owns it and
// may reuse it after clear(). Not thread-safe.
struct ReadPieces {
  std::vector<std::span<const uint8_t>> spans;   // contiguous in the file, from the read's offset
  std::vector<std::shared_ptr<CachedBlock>> pins;  // keep the blocks `spans` point into alive
  size_t bytes = 0;                                // sum of the span sizes
  bool deferred = false;  // read_pieces() handed the read to its `later` (nothing else is set)
  void clear() {
    spans.clear();
    pins.clear();
    bytes = 0;
    deferred = false;
  }
};

// The rest of a read that read_pieces() deferred: called once with its outcome, as read_pieces()
// would have returned it, on the thread that completed the block it waited for (a connection's I/O
// thread, or a pool thread) or, when the pool has stopped, on the one that found that. The pieces
// are valid during the call only.
using ReadLater = std::function<void(Result<size_t> n, ReadPieces& pieces)>;

class Client {
 public:
  // Connects to penstock-meta, registers a session (when asked) and loads the cluster map.
  // kInvalid for a bad address; kUnavailable "cannot reach penstock-meta at HOST:PORT: <reason>; is
  // it running?" when the server cannot be reached within connect_timeout; any other error of the
  // first calls with context.
  static Result<std::unique_ptr<Client>> connect(const ClientOptions& options);

  // Calls shutdown().
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Stops the heartbeat and closes the session at the meta server (best effort, logged). Idempotent.
  // Calls made after shutdown still work but run without a session.
  void shutdown();

  SessionId session() const;
  const std::string& meta_address() const { return options_.meta_address; }

  // ---- namespace (meta RPCs). Attributes of regular files carry this client's merged size. ----
  Result<proto::InodeAttr> lookup(InodeId parent, const std::string& name);
  // A lookup for a kernel's dentry cache: also asks for the entry lease a directory may get
  // (server/meta/entry_leases.h). `trust_s` is how long the name may be reused without asking:
  // the lease less the time since the request was sent and a margin; 0 without a lease.
  // `caller` is the thread the kernel looks up for (the FUSE request's pid; 0: unknown). With it a
  // regular file found is opened with the lookup (an open ticket) for the open() of that thread
  // that may follow; see "Open tickets" below.
  struct Entry {
    proto::InodeAttr attr;
    double trust_s = 0;
    bool opened = false;  // an open ticket was granted: call prefetch_small_file() after the reply
  };
  Result<Entry> lookup_entry(InodeId parent, const std::string& name, uint64_t caller = 0);
  // A directory's attributes as the meta server last sent them to this client, while younger than
  // ClientOptions::dir_attr_max_age (client/lib/dir_attr_cache.h); nullopt otherwise.
  std::optional<DirAttrCache::Hit> cached_dir_attr(InodeId dir) const;
  Result<proto::InodeAttr> getattr(InodeId ino);
  // SetAttr exactly as given. REQUIRES: kSetSize is not in req.valid (use truncate(), which cuts
  // the chunks on the data servers first).
  Result<proto::InodeAttr> setattr(const proto::meta::SetAttrReq& req);
  // Creates a regular file and opens it for this session in one round trip.
  Result<proto::InodeAttr> create(InodeId parent, const std::string& name, uint32_t mode,
                                  const proto::Caller& caller);
  Result<proto::InodeAttr> mknod(InodeId parent, const std::string& name, uint32_t mode, uint64_t rdev,
                                 const proto::Caller& caller);
  Result<proto::InodeAttr> mkdir(InodeId parent, const std::string& name, uint32_t mode,
                                 const proto::Caller& caller);
  Status unlink(InodeId parent, const std::string& name);
  // rmdir and rename name this session, whose own entry leases do not delay them.
  Status rmdir(InodeId parent, const std::string& name);
  // flags: proto::meta::RenameFlags bits.
  Status rename(InodeId parent, const std::string& name, InodeId new_parent, const std::string& new_name,
                uint32_t flags);
  Result<proto::InodeAttr> link(InodeId ino, InodeId new_parent, const std::string& new_name);
  Result<proto::InodeAttr> symlink(InodeId parent, const std::string& name, const std::string& target,
                                   const proto::Caller& caller);
  Result<std::string> readlink(InodeId ino);
  Result<proto::meta::ReadDirResp> readdir(InodeId ino, const std::string& after, uint32_t max_entries,
                                           bool plus);
  Result<proto::meta::StatFsResp> statfs();
  // The kernel asks for "security.capability" before every write() (to drop file capabilities);
  // that it is absent is remembered per inode for ClientOptions::absent_xattr_ttl, so a stream of
  // writes costs one meta RPC per inode and ttl, not one per write. This client's own set/remove
  // of it forgets the inode; another host's setcap is seen within the ttl (as attributes are).
  Result<std::string> getxattr(InodeId ino, const std::string& name);
  Status setxattr(InodeId ino, const std::string& name, const std::string& value, uint32_t flags);
  Result<std::vector<std::string>> listxattr(InodeId ino);
  Status removexattr(InodeId ino, const std::string& name);
  // Opens for this session (bookkeeping that keeps an unlinked file's chunks alive). When
  // `unchanged` is given it says whether the file's generation and mtime are the same as at this
  // client's previous open of it and an open that reported the change has completed (the kernel
  // may keep its cached pages: see note_open_completed); either way cached data of
  // an older generation is dropped here (close-to-open). A read-only open by the `caller` whose
  // lookup just got an open ticket for `ino` takes that ticket instead of asking the meta server.
  Result<proto::InodeAttr> open(InodeId ino, uint32_t flags, bool* unchanged = nullptr, uint64_t caller = 0);
  // An open of version (`generation`, `mtime_ns`) of `ino` that reported it changed has completed
  // in the kernel (a request came on its handle), which dropped the file's pages then: later
  // opens of that version may report it unchanged.
  void note_open_completed(InodeId ino, uint64_t generation, int64_t mtime_ns);
  // Reading a small file is open + one read: with the attributes of the lookup that preceded the
  // open, its one block is fetched at once instead of after the meta open returns (open() calls
  // this; a mount calls it right after answering a lookup that got an open ticket, Entry::opened).
  // Nothing when the lookup did not find a small file, or the kernel may hold its pages.
  void prefetch_small_file(InodeId ino, uint32_t flags);
  // Read state for a handle opened at `generation` (pass it to read()).
  std::unique_ptr<ReadContext> make_read_context(uint64_t generation) const;
  Result<proto::Layout> get_layout(InodeId ino);
  // The layout of a file this client created behind (its chains, once the server applied the
  // create), without a GetLayout when the create's answer is still known; else get_layout().
  Result<proto::Layout> created_layout(InodeId ino);
  Status set_layout(InodeId dir, uint32_t chunk_size, uint32_t stripe_count);
  // Applies a parsed layout xattr value to a directory: keys not given keep their current value.
  Status set_layout_text(InodeId dir, const std::string& text);
  Result<proto::ClusterMap> get_cluster_map();
  // Runs a scrub pass on the meta server (proto::meta::Scrub: the chunks of inodes the namespace
  // does not have are removed, or with dry_run only counted) and waits up to `timeout` for it.
  Result<proto::meta::ScrubResp> scrub(bool dry_run, std::chrono::milliseconds timeout);
  // The connection to the data server at `address` (host:port), made now if there is none, as
  // describe() gives it: "rdma HOST:PORT" or "tcp HOST:PORT". Errors as for any data call.
  Result<std::string> data_transport(const std::string& address);

  // ---- file data ----
  // Reads up to buf.size() bytes at `offset` into buf; returns the byte count up to EOF, where the
  // file size is max(meta size, the highest offset this client wrote). `size_hint` is the size the
  // caller knows (e.g. at open); when the range passes it the size is fetched from the meta server.
  // Holes and short chunks read as zeros. Errors name the inode, chunk and target.
  // Buffered writes of this client that overlap the range are sent (and waited for) first. With a
  // ReadContext, sequential streams are served through the cache with read-ahead; without one
  // (or for random reads that miss the cache) the range is read directly.
  Result<size_t> read(InodeId ino, const proto::Layout& layout, uint64_t size_hint, uint64_t offset,
                      std::span<uint8_t> buf, ReadContext* ctx = nullptr);
  // read() without the copy out of the cache, for callers that can send scattered memory (the FUSE
  // adapter replies with an iovec): reads up to scratch.size() bytes at `offset` with exactly the
  // semantics, errors and side effects of read(), but bytes served from the cache are handed out as
  // spans of the cached blocks (pinned in *out) and only bytes read directly from the data servers
  // land in `scratch`. *out is cleared first; on success out->bytes is the returned count. `scratch`
  // and *out are the caller's; *out must not outlive `scratch`.
  // With `later`, a read that would wait for one cache block still being fetched (a small file whose
  // open started its fetch, a read-ahead block) does not wait: it returns 0 with out->deferred set,
  // and a copy of `later` gets the outcome when the block arrives, so the calling thread is free at
  // once and nobody is woken only to pass the bytes on. A deferred read never uses `scratch` (a
  // range it must read directly after all lands in a buffer of its own).
  Result<size_t> read_pieces(InodeId ino, const proto::Layout& layout, uint64_t size_hint, uint64_t offset,
                             std::span<uint8_t> scratch, ReadContext* ctx, ReadPieces* out,
                             const ReadLater* later = nullptr);
  // Writes all of `data` at `offset`. With write-behind (dirty_limit > 0) the bytes are gathered
  // into per-file buffers sent asynchronously (blocking while the dirty bound is passed); an error
  // of an earlier asynchronous send of this file that `cursor` has not reported yet is returned
  // here, by every write of that handle until its flush or fsync reports it (a write does not mark
  // it reported: close and fsync must still return it). Without it the bytes are on the data servers on
  // return. Either way this client's reads and size see them. `cursor` is the writing handle's
  // (write_cursor()); null, or one without a record: errors no handle reported yet.
  Status write(InodeId ino, const proto::Layout& layout, uint64_t offset, std::span<const uint8_t> data,
               WriteCursor* cursor = nullptr) {
    WriteSource src(data);
    return write(ino, layout, offset, src, cursor);
  }
  // As above, the bytes taken from `src` (all of them on success; on kIo from a descriptor source
  // the bytes taken before it are written, and written_end covers them).
  Status write(InodeId ino, const proto::Layout& layout, uint64_t offset, WriteSource& src,
               WriteCursor* cursor = nullptr);
  // A new handle's position in the file's write errors (WriteError: Linux errseq semantics). Keep
  // it for the handle's life and pass it to write, flush, fsync and release.
  WriteCursor write_cursor(InodeId ino);
  // Sends this file's buffered writes, waits for every send, then reports the highest offset this
  // client wrote to `ino`, and the mtime, to the meta server (close-to-open: another host's open()
  // then sees data and size; durable soon after, as the data is: ReportSizeAtClose). Returns an
  // asynchronous write error `cursor` has not reported yet (marking it reported) instead of
  // reporting the size. Ok at once when nothing was written.
  Status flush(InodeId ino, WriteCursor* cursor = nullptr);
  // Sends and waits for buffered writes, makes the file's data durable on every target of every
  // chain of `layout` (Sync), then flush() with a report that returns once durable (a SyncLog when
  // there is nothing new to report: an earlier close's report is durable then too). A write error
  // is reported as flush() reports it.
  Status fsync(InodeId ino, const proto::Layout& layout, WriteCursor* cursor = nullptr);
  // Returns once every namespace change the meta server acknowledged so far (creates and unlinks
  // are acknowledged before their WAL sync) is on its disk: fsyncdir (SyncLog).
  Status sync_namespace();
  // Cache and write-behind counters (for logs and tests).
  CacheStats cache_stats() const { return cache_->stats(); }
  // Reads read_pieces() deferred (answered by the thread their block arrived on).
  uint64_t deferred_reads() const { return deferred_reads_.load(std::memory_order_relaxed); }
  // Creates behind a directory lease (all zero when off).
  CreateBehindStats create_behind_stats() const { return cb_ ? cb_->stats() : CreateBehindStats{}; }
  OpenTicketStats open_ticket_stats() const;
  // Drops the caches between this client and the disks, for cold-cache benchmarks: this client's
  // chunk cache (open handles keep working; blocks in flight are detached, never put back), then
  // the meta server's DropCaches (its record and block caches; kNotSupported from an older server
  // counts as done), then DropCaches on every online data server of a freshly fetched cluster
  // map, all in parallel (each drops its open-file cache and the page cache of its chunk files).
  // Write-behind buffers are not touched. Errors: the first failing server's error with its
  // address (kUnavailable, kTimeout, kIo), or the meta server's error. Thread-safe.
  Status drop_caches();
  // One data server's counters (proto::data::Stats), or why it gave none: kNotSupported from a
  // server older than the method, kUnavailable/kTimeout when it cannot be reached.
  struct DataServerStats {
    proto::NodeInfo node;
    Status status;
    proto::data::StatsResp stats;
  };
  // The counters of every online data server of a freshly fetched cluster map, asked all at once,
  // in map order (`penstock stats`). Errors: only fetching the map; a server's own failure is in
  // its entry. Thread-safe.
  Result<std::vector<DataServerStats>> data_stats();
  // The meta server's per-method counters (proto::meta::ServerStats). Errors: kNotSupported from a
  // server older than the method; kUnavailable/kTimeout when it cannot be reached. Thread-safe.
  Result<proto::meta::ServerStatsResp> meta_stats();
  uint64_t dirty_bytes() const { return budget_ ? budget_->used() : 0; }
  // flush() (unless `flush_writes` is false: a handle opened read-only, which must neither wait
  // for nor take the write errors that belong to a writer's close), then queues the Release for
  // the meta server and returns flush()'s result: a background thread sends queued releases in
  // batches (ReleaseMany, within about 2 ms), so a close never waits for its release and many
  // closes share one RPC. shutdown() sends the rest. A file created behind whose create is still
  // queued is sent closed instead (CreateBehind::closed_before_sent): no Release at all.
  Status release(InodeId ino, bool flush_writes = true, WriteCursor* cursor = nullptr);
  // Cuts the file to `size`: data Truncate on every target of every chain of its layout first, then
  // the meta size, then forgets this client's size knowledge. Returns the new attributes.
  // kIsDir on a directory, kInvalid on other non-regular files.
  Result<proto::InodeAttr> truncate(InodeId ino, uint64_t size, const proto::Caller& caller);
  // How many truncates this client has made (any file): a size taken before one may be stale.
  uint64_t truncates() const { return truncates_.load(); }

 private:
  struct FileState {
    uint64_t written_end = 0;               // highest offset written and not yet reported
    // The mtime the next size report sets: the time of the last write, or what a later setattr
    // of mtime or truncate made it at the server (so that the report does not undo a futimens, as
    // `cp -p` does before close, or move mtime back behind a truncate). Non-zero while unreported.
    int64_t mtime_ns = 0;
    uint64_t seq = 0;                       // bumped on every write
  };

  // A data request of a fan-out: routed by chain (head or tail) or to one exact target.
  struct DataTask {
    ChainId chain;
    TargetId target;      // when valid: exactly this target of `chain`
    bool to_tail = false; // otherwise: the chain's tail (reads) or head (writes)
    std::string what;     // "read chunk 3 of inode 17": error context
  };
  // Issues the RPC for task `index` to `route` on `rpc`; must call `done` exactly once. `blocking`:
  // the caller waits for this one call alone, so it may be made on the calling thread
  // (RpcClient::call_either).
  using IssueFn = std::function<void(size_t index, const Route& route, rpc::RpcClient& rpc, bool blocking,
                                     std::function<void(Status)> done)>;

  Client(ClientOptions options, net::Endpoint meta_endpoint);

  template <class M>
  Result<typename M::Response> meta_call(const typename M::Request& req);
  // One send of a meta call (meta_call's retries around it): a change penstock-meta can answer
  // exactly once goes as a Replay (send_change), the rest as themselves.
  template <class M>
  Result<typename M::Response> send_meta(const typename M::Request& req);
  // `req` as a Replay in a reply slot of `session`, sent again with the same slot and number while
  // it lost its connection on the way, until the call timeout. std::nullopt when this meta server
  // cannot (an older one, or it no longer knows the session): then send it as itself.
  template <class M>
  std::optional<Result<typename M::Response>> send_change(SessionId session, const typename M::Request& req);

  Status start();
  void heartbeat_loop();
  void release_loop();
  void send_releases(std::vector<InodeId> inos);
  // Tells the meta server how many times this mount has each file open, since a restarted server
  // may have forgotten opens it had not written yet (proto ReclaimOpensReq). True once it took
  // them (or is too old to ask). Runs on the release thread, so no release is sent between the
  // snapshot of the counts and the call: a count falls only once its release was sent.
  bool reclaim_opens();
  void count_open(InodeId ino);
  void count_release(InodeId ino);
  Status refresh_map();
  std::shared_ptr<const ClusterRoutes> routes() const;
  Result<std::shared_ptr<rpc::RpcClient>> data_client(const std::string& address);
  // Calls M with `req` on every online data server of a freshly fetched cluster map, all at once;
  // waits for every answer. `nodes` gets those servers in map order, `statuses` and `replies`
  // each one's result (a reply is default-constructed where its status is not ok). Errors: only
  // fetching the cluster map (refresh_map's); a server's own failure is in its status.
  template <class M>
  Status call_online_data_servers(const typename M::Request& req, std::vector<proto::NodeInfo>* nodes,
                                  std::vector<Status>* statuses, std::vector<typename M::Response>* replies);
  Result<Route> resolve(const ClusterRoutes& routes, const DataTask& task) const;
  // Runs every task in parallel and waits for all (one task alone: a blocking call on this thread).
  // A task whose route is unknown, or whose call fails with kUnavailable or kNotFound, makes the
  // client refresh the cluster map once and retry those tasks; any other error (or a second
  // failure) fails the whole operation with context.
  Status fan_out(const std::vector<DataTask>& tasks, const IssueFn& issue);
  void merge_local_size(proto::InodeAttr* attr);
  // A setattr of mtime or a truncate of `ino` succeeded and left its mtime at `mtime_ns`: unreported
  // writes of it before that report that time, not their own.
  void adopt_mtime(InodeId ino, int64_t mtime_ns);
  // flush(); with `durable` the size report (or, with nothing to report, a SyncLog) returns once
  // it is on the meta server's disk (fsync).
  Status flush_and_report(InodeId ino, WriteCursor* cursor, bool durable);

  // ---- data path internals ----
  // One file's write-behind: the buffer being filled and the ranges being sent.
  struct WbFile {
    std::mutex mu;  // never held across an RPC except by the inline send after stop
    std::condition_variable cv;
    proto::Layout layout;                                 // guarded by mu
    uint64_t buf_offset = 0;                              // guarded by mu
    ByteBuffer buf;                                       // guarded by mu
    std::vector<std::pair<uint64_t, uint64_t>> inflight;  // [begin, end) being sent; guarded by mu
    bool retired = false;                                 // removed from wb_files_; guarded by mu
    int writers = 0;  // write() calls inside (they may wait, releasing mu): never retired then
    std::shared_ptr<WriteError> error;  // the file's (error_record()), shared with its handles
  };
  // The writes as before write-behind: all pieces in parallel, on the data servers on return.
  Status write_now(InodeId ino, const proto::Layout& layout, uint64_t offset, std::span<const uint8_t> bytes);
  // Reads each (offset, buffer) range of the file (holes as zeros), all pieces in parallel.
  // `sequential`: the ranges belong to a stream read ahead (ReadReq::sequential).
  Status read_ranges(InodeId ino, const proto::Layout& layout,
                     const std::vector<std::pair<uint64_t, std::span<uint8_t>>>& ranges, bool sequential);
  // The pieces of [offset, end) from `blocks` (each waited for), pinned in *out: true when done,
  // false when a block was cut at an older EOF and the range must be read directly instead. The
  // first failed fetch's error (*out then cleared).
  static Result<bool> collect_pieces(std::vector<std::shared_ptr<CachedBlock>> blocks, uint64_t offset,
                                     uint64_t end, uint64_t block_size, ReadPieces* out);
  // A deferred read's end, once `block` completed (read_pieces' `later`): hands `later` its pieces,
  // or reads the range directly on the pool.
  void finish_deferred_read(InodeId ino, const proto::Layout& layout, uint64_t offset, uint64_t n,
                            uint64_t block_size, std::shared_ptr<CachedBlock> block, const ReadLater& later);
  // Fetches one cache block into its buffer and completes it; drops it from the cache on error.
  void fetch_block(InodeId ino, const proto::Layout& layout, const std::shared_ptr<CachedBlock>& block);
  // fetch_block() without a thread: sent now, completed by the reply (one try; else fetch_block).
  void fetch_block_async(InodeId ino, const proto::Layout& layout, std::shared_ptr<CachedBlock> block);
  std::shared_ptr<WbFile> wb_find(InodeId ino);
  // REQUIRES wf->mu held via `lock`. Starts sending the buffer (a pool task), or with `here` sends
  // it on this thread and returns once it is on the data servers (`lock` released meanwhile and
  // held again on return).
  void wb_send_locked(InodeId ino, const std::shared_ptr<WbFile>& wf, std::unique_lock<std::mutex>& lock,
                      bool here = false);
  // Sends the buffer and waits until nothing of the file is in flight. Returns the remembered error.
  Status wb_drain(InodeId ino);
  // wb_drain() when buffered or in-flight bytes overlap [offset, offset + length).
  Status wb_drain_overlap(InodeId ino, uint64_t offset, uint64_t length);
  // Forgets the file's write-behind record when it is idle (after a flush) and no error of it is
  // left unreported (handles keep the error record itself alive).
  void wb_retire_if_idle(InodeId ino);
  // The file's one error record: the live one a handle or a WbFile holds, or a new one.
  std::shared_ptr<WriteError> error_record(InodeId ino);
  // Reports the write error `cursor` has not seen (null: one no handle reported), marking it.
  Status take_write_error(InodeId ino, WriteCursor* cursor);
  // The reply's attributes with this client's own size merged in; directories' attributes (the
  // reply's and its `parent`) also go to dir_attrs_, taken with the ticket of before the call.
  Result<proto::InodeAttr> merged(const DirAttrCache::Ticket& t, Result<proto::meta::AttrResp> r);
  template <class M, class Req>
  Result<proto::InodeAttr> attr_call(const Req& req);
  // An rmdir's or rename's outcome: the directories its reply names go to dir_attrs_ (ticket of
  // before the call), the one it removed is forgotten; a failure forgets every directory.
  Status take_dirs(const DirAttrCache::Ticket& t, const Result<proto::meta::DirsResp>& r);

  const ClientOptions options_;
  const net::Endpoint meta_endpoint_;
  // Destroyed last: every channel made on it must be gone first.
  std::unique_ptr<net::IoRuntime> runtime_;
  std::unique_ptr<rpc::RpcClient> meta_;
  std::unique_ptr<CreateBehind> cb_;  // with ClientOptions::create_behind and a session; own lock

  mutable std::mutex routes_mu_;  // leaf lock
  std::shared_ptr<const ClusterRoutes> routes_;  // guarded by routes_mu_

  std::mutex data_mu_;  // leaf lock
  std::unordered_map<std::string, std::shared_ptr<rpc::RpcClient>> data_clients_;  // guarded

  std::mutex files_mu_;  // leaf lock
  std::unordered_map<InodeId, FileState> files_;  // guarded by files_mu_
  ReportedSizes reported_;  // guarded by files_mu_: what the last size reports left (merge_local_size)

  std::atomic<uint64_t> session_{0};
  std::atomic<uint64_t> truncates_{0};  // truncate() calls that succeeded
  std::atomic<uint64_t> deferred_reads_{0};
  ReplySlots reply_slots_;
  // The meta server answered kNotSupported to Replay/ReplayWaiting, or to ReplayInline (one that
  // predates ReplayInline has the others): those changes go as themselves.
  std::atomic<bool> replay_unsupported_{false};
  std::atomic<bool> replay_inline_unsupported_{false};
  // The one of the two flags above that says whether change M goes as itself.
  template <class M>
  std::atomic<bool>& replay_unsupported() {
    return proto::meta::kReplayInline<M> ? replay_inline_unsupported_ : replay_unsupported_;
  }
  std::atomic<uint64_t> replay_checked_version_{0};  // the map version the heartbeat last saw
  std::atomic<int64_t> lease_ns_{0};

  std::mutex hb_mu_;  // guards stop_ (leaf lock)
  std::condition_variable hb_cv_;
  bool stop_ = false;
  std::thread heartbeat_;
  std::once_flag shutdown_once_;

  DirAttrCache dir_attrs_;  // own lock (leaf)

  // Inodes known to have no "security.capability", with when that knowledge expires.
  std::mutex caps_mu_;  // leaf lock
  std::unordered_map<InodeId, std::chrono::steady_clock::time_point> no_caps_;  // guarded by caps_mu_
  void forget_caps(InodeId ino, const std::string& name);
  // Remembers for ClientOptions::absent_xattr_ttl that `ino` has no "security.capability".
  void note_no_caps(InodeId ino);

  // ---- open tickets ----
  // The kernel's open() of a path sends a LOOKUP of the file (files get no entry timeout,
  // client/fuse/fuse_ops.cc) and then OPEN, both as the calling thread. lookup_entry() with that
  // thread as `caller` asks for the open along with the lookup (LookupOpen); an open() of the same
  // inode by the same thread within ClientOptions::open_ticket_window, with no other lookup of
  // that thread between, takes it instead of sending Open: the attributes are the ones this open's
  // own path walk fetched, so close-to-open holds. Tickets of an earlier session are not taken,
  // nor released under the current one. Unused tickets (a stat(), an open the kernel refused) are
  // released through the release queue: by the next lookup of the thread, or by the releaser
  // once older than the window. A thread whose last ticket went unused, or whose last open was for
  // writing, asks for no more until it opens a file read-only again (a tree walk or an rm -r
  // costs at most two opens and releases of the meta server per thread).
  struct OpenTicket {
    InodeId ino;
    proto::InodeAttr attr;
    std::chrono::steady_clock::time_point granted;
    SessionId session;  // the session the meta server opened it for
  };
  struct CallerTickets {
    bool want = true;  // ask at this thread's next lookup (its last open was read-only)
    std::optional<OpenTicket> ticket;
  };
  bool tickets_on() const;
  // Whether `caller`'s lookup should ask; drops the thread's ticket when not (into `dropped`).
  bool want_ticket(uint64_t caller, std::vector<OpenTicket>* dropped);
  // After `caller`'s lookup: `attr` opened for session `opened_for`, or not opened (nullopt); the
  // thread's older ticket goes into `dropped`.
  void keep_ticket(uint64_t caller, const proto::InodeAttr& attr, std::optional<SessionId> opened_for,
                   std::vector<OpenTicket>* dropped);
  // The ticket of `caller` for `ino`, taken when `usable` and fresh (dropped otherwise).
  std::optional<proto::InodeAttr> take_ticket(uint64_t caller, InodeId ino, bool usable);
  // Tickets older than the window (all of them with `all`), dropped.
  std::vector<OpenTicket> expire_tickets(bool all);
  void drop_ticket_locked(CallerTickets& c, std::vector<OpenTicket>* dropped);  // REQUIRES: tickets_mu_
  // Releases dropped tickets at the meta server (queued), those of the current session only.
  void release_tickets(const std::vector<OpenTicket>& dropped);
  // Queues the meta release of opens (closed handles, dropped tickets).
  void queue_releases(const std::vector<InodeId>& inos);
  mutable std::mutex tickets_mu_;  // leaf lock
  std::unordered_map<uint64_t, CallerTickets> tickets_;  // by caller thread; guarded by tickets_mu_
  OpenTicketStats ticket_stats_;                         // guarded by tickets_mu_
  std::atomic<size_t> tickets_held_{0};       // the releaser expires tickets while there are any
  std::atomic<bool> releaser_idle_{false};    // the releaser waits without a timeout
  std::atomic<bool> lookup_open_ok_{true};    // false once the meta server answered kNotSupported
  std::atomic<bool> tickets_closed_{false};   // shutdown() began: no new tickets

  std::mutex rel_mu_;  // guards rel_queue_, rel_running_ and rel_stop_ (leaf lock)
  std::condition_variable rel_cv_;
  std::vector<InodeId> rel_queue_;  // releases not yet sent
  bool rel_running_ = false;        // releaser_ takes releases
  // Map version whose opens the meta server should get (reclaim_opens), and the last one it got;
  // both guarded by rel_mu_.
  uint64_t reclaim_version_ = 0;
  uint64_t reclaimed_version_ = 0;
  bool rel_stop_ = false;
  std::thread releaser_;

  // Data path. pool_ is declared last: it stops (and its tasks end) before anything they use.
  struct OpenedVersion {
    uint64_t generation = 0;
    int64_t mtime_ns = 0;
    // The kernel asked for the file's first bytes since that open: its pages were not cached
    // (keep_cache or not), so the next open's small-file prefetch is not wasted.
    bool kernel_read = false;
    // An open of this version that told the kernel to drop the file's pages has completed
    // (note_open_completed), so the kernel holds none older. Until then every open of it drops
    // them too: of two opens racing after a change, the second must not keep pages that the
    // first one's completion has yet to drop.
    bool dropped = false;
  };
  void note_kernel_read(InodeId ino);
  std::mutex open_counts_mu_;  // leaf lock
  std::unordered_map<uint64_t, uint32_t> open_counts_;  // ino -> handles open at the meta server
  std::mutex opened_mu_;  // leaf lock
  std::unordered_map<InodeId, OpenedVersion> opened_;  // last open of each inode; guarded
  // Small regular files (one cache block) as the last lookup saw them: a read-only open of one
  // starts fetching its data while the meta open is on its way (open()); taken by that open.
  struct LookedUp {
    uint64_t generation = 0;
    uint64_t size = 0;
    proto::Layout layout;
  };
  void note_small_file(const proto::InodeAttr& attr);
  std::mutex looked_up_mu_;  // leaf lock
  std::unordered_map<InodeId, LookedUp> looked_up_;  // guarded by looked_up_mu_
  std::mutex async_mu_;  // guards async_fetches_ and async_closed_ (leaf lock)
  std::condition_variable async_cv_;
  int async_fetches_ = 0;      // fetch_block_async replies not yet handled
  bool async_closed_ = false;  // shutdown() began: no more of them
  std::unique_ptr<ChunkCache> cache_;
  std::unique_ptr<DirtyBudget> budget_;  // null: write-behind off
  std::mutex wb_mu_;  // may be held while taking a WbFile's mu (wb_retire_if_idle), never the reverse
  std::unordered_map<InodeId, std::shared_ptr<WbFile>> wb_files_;  // guarded by wb_mu_
  std::mutex errors_mu_;  // leaf lock
  std::unordered_map<InodeId, std::weak_ptr<WriteError>> errors_;  // guarded by errors_mu_
  size_t errors_sweep_at_ = 64;                                    // guarded by errors_mu_
  std::unique_ptr<TaskPool> pool_;
};

// The hostname for session registration ("unknown" when it cannot be read).
std::string local_hostname();

}  // namespace penstock::client
