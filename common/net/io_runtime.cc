// IoRuntime: the I/O threads (an IoPool) shared by every channel of a process.
#include <chrono>

#include "common/net/io_pool.h"
#include "common/net/transport.h"

namespace penstock::net {

IoRuntime::IoRuntime(int threads) : pool_(std::make_unique<IoPool>(threads)) { pool_->start(); }

// Lets outstanding work (closing sockets, failing pending calls) drain so every callback runs; if
// something keeps a context busy past the grace period, it is stopped hard.
IoRuntime::~IoRuntime() { pool_->drain(std::chrono::seconds(5)); }

void* IoRuntime::native_context() { return &pool_->next(); }

}  // namespace penstock::net
