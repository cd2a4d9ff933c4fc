// InProcessCluster: penstock-meta on an in-memory store and N penstock-data servers running inside
// the test process, plus one client library connected to them. For tests of the client library
// and of the transports end to end without FUSE or daemon processes (the TCP read-path suite, the
// RDMA cluster suite in the VM). Owns a temp dir under /tmp holding the data targets; stop() (also
// run by the destructor) stops the client first, then the data servers, then meta, and removes it.
// Header-only: tests that use it link penstock_client, penstock_data and penstock_meta_server.
// Thread-safety: one test thread drives it; the client it hands out is thread-safe.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "server/data/data_server.h"
#include "server/meta/meta_server.h"
#include "server/meta/namespace.h"
#include "server/meta/store.h"

namespace penstock::testing {

// Deterministic pseudo-random bytes: a misplaced or stale byte shows up in a comparison.
inline std::vector<uint8_t> seeded_bytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

struct InProcessClusterOptions {
  std::string host = "127.0.0.1";  // every server listens here (an RDMA-capable address for RDMA)
  int data_servers = 3;            // one target each
  int data_workers = 2;
  // How often each data server heartbeats (each one a synced meta mutation).
  std::chrono::milliseconds data_heartbeat{200};
  rpc::RdmaMode rdma = rpc::RdmaMode::kOff;
  client::ClientOptions client;  // meta_address is set by start()
  // Changes to the meta service's options (at start and at every restart_meta()).
  std::function<void(meta::MetaOptions&)> adjust_meta;
  // The exactly-once envelopes meta answers: fewer to serve as an older penstock-meta.
  meta::Envelopes meta_envelopes = meta::Envelopes::kAll;
  std::string temp_prefix = "penstock-inproc";
};

class InProcessCluster {
 public:
  InProcessCluster() = default;
  ~InProcessCluster() { stop(); }
  InProcessCluster(const InProcessCluster&) = delete;
  InProcessCluster& operator=(const InProcessCluster&) = delete;

  // Starts meta, the data servers (waiting until each registered) and the client. Call once.
  ::testing::AssertionResult start(InProcessClusterOptions o) {
    using namespace std::chrono_literals;
    std::string tmpl = "/tmp/" + o.temp_prefix + ".XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return ::testing::AssertionFailure() << "mkdtemp " << tmpl << " failed";
    dir_ = tmpl;
    host_ = o.host;
    adjust_meta_ = o.adjust_meta;
    envelopes_ = o.meta_envelopes;
    if (auto started = start_meta(0); !started) return started;
    for (int i = 0; i < o.data_servers; ++i) {
      data::DataServerOptions d;
      d.listen = net::Endpoint{o.host, 0};
      d.meta = net::Endpoint{o.host, meta_->port()};
      d.targets = {dir_ + "/target" + std::to_string(i)};
      d.heartbeat = o.data_heartbeat;
      d.workers = o.data_workers;
      d.rdma = o.rdma;
      data_.push_back(std::make_unique<data::DataServer>(d));
      Status st = data_.back()->start();
      if (!st.is_ok()) return ::testing::AssertionFailure() << "data server " << i << ": " << st.to_string();
    }
    for (auto& d : data_) {
      if (!d->wait_registered(20s)) return ::testing::AssertionFailure() << "a data server did not register in 20 s";
    }
    o.client.meta_address = net::Endpoint{o.host, meta_->port()}.to_string();
    meta_address_ = o.client.meta_address;
    auto c = client::Client::connect(o.client);
    if (!c.has_value()) return ::testing::AssertionFailure() << "client: " << c.error().to_string();
    client_ = std::move(c).value();
    return ::testing::AssertionSuccess();
  }

  // Stops the meta server and starts it again on the same port and store, as a restart of
  // penstock-meta: handlers still running finish first, their replies lost with the connections.
  ::testing::AssertionResult restart_meta() {
    const uint16_t port = meta_->port();
    meta_->stop();
    meta_.reset();
    service_.reset();
    return start_meta(port);
  }

  void stop() {
    client_.reset();
    for (auto& d : data_) d->stop();
    data_.clear();
    if (meta_) meta_->stop();
    meta_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
    dir_.clear();
  }

  // Stops every data server (the meta server and the client stay): data I/O then fails.
  void stop_data_servers() {
    for (auto& d : data_) d->stop();
  }

  // REQUIRES: start() succeeded.
  client::Client& client() { return *client_; }
  // The meta service now running (a new one after restart_meta()).
  const meta::MetaService& meta_service() const { return *service_; }
  // The meta server's store (counts its syncs).
  const meta::MemoryStore& meta_store() const { return store_; }
  const std::string& dir() const { return dir_; }
  // host:port of the meta server (for a second client).
  const std::string& meta_address() const { return meta_address_; }

 private:
  ::testing::AssertionResult start_meta(uint16_t port) {
    meta::MetaOptions mo;
    mo.entry_leases.term_ns = meta::kDefaultEntryLeaseNs;  // as the daemon
    mo.dir_leases.term_ns = meta::kDefaultDirLeaseNs;
    if (adjust_meta_) adjust_meta_(mo);
    auto svc = meta::MetaService::open(&store_, mo);
    if (!svc.has_value()) return ::testing::AssertionFailure() << "meta service: " << svc.error().to_string();
    service_ = std::move(svc).value();
    rpc::ServerOptions so;
    so.listen = net::Endpoint{host_, port};
    meta_ = std::make_unique<meta::MetaServer>(*service_, so, envelopes_);
    Status st = meta_->start();
    if (!st.is_ok()) return ::testing::AssertionFailure() << "meta server: " << st.to_string();
    return ::testing::AssertionSuccess();
  }

  std::string host_;
  std::function<void(meta::MetaOptions&)> adjust_meta_;
  meta::Envelopes envelopes_ = meta::Envelopes::kAll;
  meta::MemoryStore store_;
  std::unique_ptr<meta::MetaService> service_;
  std::unique_ptr<meta::MetaServer> meta_;
  std::vector<std::unique_ptr<data::DataServer>> data_;
  std::unique_ptr<client::Client> client_;
  std::string dir_;
  std::string meta_address_;
};

}  // namespace penstock::testing
