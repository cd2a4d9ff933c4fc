// Garbage collection of unlinked files' chunks. When the last link and the last open of a regular
// file are gone, MetaService queues the inode (durably, key "g/"). The GarbageCollector sends
// proto::data::Remove{target, ino} to every target of every chain of the file's layout, retrying
// failed targets with exponential backoff, and deletes the queue entry once all have succeeded.
// "Send Remove to a node" is the ChunkRemover interface, so unit tests can use a fake.
// Ownership: the GarbageCollector borrows the MetaService and the ChunkRemover (both must outlive
// it). Thread-safety: run_once() must not be called concurrently with itself or with a started
// background thread; start/stop/wake may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "common/base/result.h"
#include "common/proto/data_service.h"
#include "server/meta/namespace.h"

namespace penstock::net {
class IoRuntime;
}
namespace penstock::rpc {
class RpcClient;
}

namespace penstock::meta {

class ChunkRemover {
 public:
  virtual ~ChunkRemover() = default;
  // Removes every chunk of `ino` on `target`, served by the data server at `address` (host:port).
  // Ok when the target has no chunk of ino. Must be safe to call again after any outcome.
  virtual Status remove(const std::string& address, TargetId target, InodeId ino) = 0;
};

// What the scrub (server/meta/scrub.h) asks of a data server: one page of the inodes with chunks
// in one bucket of a target (proto::data::ListInodes).
class ChunkLister {
 public:
  virtual ~ChunkLister() = default;
  virtual Result<proto::data::ListInodesResp> list_inodes(const std::string& address,
                                                          const proto::data::ListInodesReq& req) = 0;
};

// The real remover and lister: proto::data::Remove and ListInodes over TCP, one cached RpcClient
// per data server address; `timeout` is a call's deadline (at least a minute for a listing).
// Thread-safe.
class RpcDataNodes final : public ChunkRemover, public ChunkLister {
 public:
  RpcDataNodes(net::IoRuntime& runtime, std::chrono::milliseconds timeout);
  ~RpcDataNodes() override;
  Status remove(const std::string& address, TargetId target, InodeId ino) override;
  Result<proto::data::ListInodesResp> list_inodes(const std::string& address,
                                                  const proto::data::ListInodesReq& req) override;

 private:
  Result<std::shared_ptr<rpc::RpcClient>> client_for(const std::string& address);

  net::IoRuntime& runtime_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;  // leaf lock; guards clients_, never held during a call
  std::map<std::string, std::shared_ptr<rpc::RpcClient>> clients_;
};

struct GcOptions {
  int64_t min_backoff_ns = 200'000'000;     // first retry after a failure
  int64_t max_backoff_ns = 30'000'000'000;  // backoff doubles up to this
  size_t batch = 256;                       // queue entries read per store scan
  std::chrono::milliseconds idle_poll{1000};  // background thread: pass interval without wakeups
};

class GarbageCollector {
 public:
  GarbageCollector(MetaService& service, ChunkRemover& remover, GcOptions options = {});
  ~GarbageCollector();  // stop()
  GarbageCollector(const GarbageCollector&) = delete;
  GarbageCollector& operator=(const GarbageCollector&) = delete;

  // One pass over the queue: every job whose retry time has come is tried (targets that already
  // succeeded are not asked again). Returns the number of inodes fully collected in this pass, or
  // the store error that stopped it. Time comes from the service's clock.
  Result<size_t> run_once();

  // Starts the background thread (a pass on every wake() and every idle_poll). Also registers
  // wake() with the service. Idempotent.
  void start();
  // Stops and joins the background thread. Idempotent.
  void stop();
  void wake();

 private:
  struct Progress {
    std::set<uint64_t> done;  // targets that acknowledged Remove
    int64_t backoff_ns = 0;
    int64_t next_try_ns = 0;
  };
  void loop();

  MetaService& service_;
  ChunkRemover& remover_;
  GcOptions options_;
  std::map<uint64_t, Progress> progress_;  // by inode; touched only by the pass that runs

  // Lock order: leaf lock, guards the thread state below; never held during a pass.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_requested_ = false;
  bool woken_ = false;
  std::thread thread_;
};

}  // namespace penstock::meta
