// IoRuntime: the I/O threads (an IoPool) shared by every channel of a process; and the default
// Channel::call_sync.
#include <chrono>
#include <future>

#include "common/net/io_pool.h"
#include "common/net/transport.h"

namespace penstock::net {

IoRuntime::IoRuntime(int threads) : pool_(std::make_unique<IoPool>(threads)) { pool_->start(); }

// Lets outstanding work (closing sockets, failing pending calls) drain so every callback runs; if
// something keeps a context busy past the grace period, it is stopped hard.
IoRuntime::~IoRuntime() { pool_->drain(std::chrono::seconds(5)); }

void* IoRuntime::native_context() { return &pool_->next(); }

Result<CallReply> Channel::call_sync(OutgoingCall call) {
  std::promise<Result<CallReply>> p;
  auto f = p.get_future();
  start_call(std::move(call), [&p](Result<CallReply> r) { p.set_value(std::move(r)); });
  return f.get();
}

}  // namespace penstock::net
