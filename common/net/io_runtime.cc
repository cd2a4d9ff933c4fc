// IoRuntime: the I/O threads (an IoPool) shared by every channel of a process.
#include <chrono>

#include "common/net/io_pool.h"
#include "common/net/transport.h"

namespace penstock::net {

struct IoRuntime::Impl {
  explicit Impl(int threads) : pool(threads) {}
  IoPool pool;
};

IoRuntime::IoRuntime(int threads) : impl_(std::make_unique<Impl>(threads)) { impl_->pool.start(); }

// Lets outstanding work (closing sockets, failing pending calls) drain so every callback runs; if
// something keeps a context busy past the grace period, it is stopped hard.
IoRuntime::~IoRuntime() { impl_->pool.drain(std::chrono::seconds(5)); }

void* IoRuntime::native_context() { return &impl_->pool.next(); }

}  // namespace penstock::net
