// End to end over RDMA: an in-process cluster (penstock-meta on an in-memory store, three
// penstock-data servers listening for TCP and RDMA) and a client library whose data connections
// are forced onto RDMA. Files of many sizes (odd ones, one spanning many 4 MiB chunks over every
// chain) are written, read back and compared byte for byte; reads past EOF and holes read as
// zeros; the client's data connections must say "rdma".
// Needs an RDMA device: skips without one, fails without one when RDMAVM_GUEST=1 (in the VM).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "common/net/rdma/rdma_transport.h"
#include "server/data/data_server.h"
#include "server/meta/meta_server.h"
#include "server/meta/namespace.h"
#include "server/meta/store.h"

namespace penstock {
namespace {

using namespace std::chrono_literals;

std::string rdma_host() {
  const char* ip = std::getenv("RDMAVM_IP");
  return ip != nullptr && *ip != '\0' ? ip : "127.0.0.1";
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1103515245u + 12345u;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

class RdmaClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!net::rdma_device_present()) {
      const char* g = std::getenv("RDMAVM_GUEST");
      if (g != nullptr && std::string(g) == "1") FAIL() << "RDMAVM_GUEST=1 but no RDMA device";
      GTEST_SKIP() << "no RDMA device on this host (tests/rdma-vm/run runs this in a VM)";
    }
    char tmpl[] = "/tmp/penstock-rdma-cluster.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto svc = meta::MetaService::open(&store_, meta::MetaOptions{});
    ASSERT_TRUE(svc.has_value()) << svc.error().to_string();
    service_ = std::move(svc).value();
    rpc::ServerOptions so;
    so.listen = net::Endpoint{rdma_host(), 0};
    meta_ = std::make_unique<meta::MetaServer>(*service_, so);
    Status st = meta_->start();
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    for (int i = 0; i < 3; ++i) {
      data::DataServerOptions d;
      d.listen = net::Endpoint{rdma_host(), 0};
      d.meta = net::Endpoint{rdma_host(), meta_->port()};
      d.targets = {dir_ + "/target" + std::to_string(i)};
      d.heartbeat = 200ms;
      d.workers = 4;
      d.rdma = rpc::RdmaMode::kOn;
      data_.push_back(std::make_unique<data::DataServer>(d));
      st = data_.back()->start();
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    for (auto& d : data_) ASSERT_TRUE(d->wait_registered(20s));
    client::ClientOptions co;
    co.meta_address = net::Endpoint{rdma_host(), meta_->port()}.to_string();
    co.transport = net::TransportKind::kRdma;
    co.call_timeout = 60s;
    auto c = client::Client::connect(co);
    ASSERT_TRUE(c.has_value()) << c.error().to_string();
    client_ = std::move(c).value();
  }

  void TearDown() override {
    client_.reset();
    for (auto& d : data_) d->stop();
    data_.clear();
    if (meta_) meta_->stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  meta::MemoryStore store_;
  std::unique_ptr<meta::MetaService> service_;
  std::unique_ptr<meta::MetaServer> meta_;
  std::vector<std::unique_ptr<data::DataServer>> data_;
  std::unique_ptr<client::Client> client_;
  std::string dir_;
};

TEST_F(RdmaClusterTest, FilesWrittenAndReadBackOverRdma) {
  auto map = client_->get_cluster_map();
  ASSERT_TRUE(map.has_value()) << map.error().to_string();
  ASSERT_EQ(map->nodes.size(), 3u);
  const proto::Caller root{0, 0};
  const std::vector<size_t> sizes = {
      1, 4095, 4096, 65537, (1u << 20) + 3, (4u << 20) + 1, (17u << 20) + 777};
  for (size_t k = 0; k < sizes.size(); ++k) {
    SCOPED_TRACE(sizes[k]);
    auto attr = client_->create(InodeId{1}, "file" + std::to_string(k), S_IFREG | 0644, root);
    ASSERT_TRUE(attr.has_value()) << attr.error().to_string();
    auto layout = client_->get_layout(attr->ino);
    ASSERT_TRUE(layout.has_value()) << layout.error().to_string();
    const std::vector<uint8_t> data = pattern(sizes[k], static_cast<uint32_t>(k));
    // Written in 1 MiB + 1 pieces so writes straddle chunk boundaries.
    for (size_t off = 0; off < data.size(); off += (1u << 20) + 1) {
      const size_t n = std::min<size_t>((1u << 20) + 1, data.size() - off);
      Status st =
          client_->write(attr->ino, *layout, off, std::span<const uint8_t>(data.data() + off, n));
      ASSERT_TRUE(st.is_ok()) << st.to_string();
    }
    ASSERT_TRUE(client_->fsync(attr->ino, *layout).is_ok());
    std::vector<uint8_t> back(data.size() + 100, 0xCC);
    auto got = client_->read(attr->ino, *layout, data.size(), 0, back);
    ASSERT_TRUE(got.has_value()) << got.error().to_string();
    ASSERT_EQ(*got, data.size());
    EXPECT_TRUE(std::equal(data.begin(), data.end(), back.begin()))
        << "bytes differ after an RDMA round trip";
    // An unaligned read in the middle.
    if (data.size() > 10000) {
      std::vector<uint8_t> mid(5000);
      auto m = client_->read(attr->ino, *layout, data.size(), 3333, mid);
      ASSERT_TRUE(m.has_value()) << m.error().to_string();
      ASSERT_EQ(*m, mid.size());
      EXPECT_TRUE(std::equal(mid.begin(), mid.end(), data.begin() + 3333));
    }
    ASSERT_TRUE(client_->release(attr->ino).is_ok());
  }
  // A hole: written at 9 MiB only; the first chunks read as zeros.
  auto attr = client_->create(InodeId{1}, "holey", S_IFREG | 0644, root);
  ASSERT_TRUE(attr.has_value()) << attr.error().to_string();
  auto layout = client_->get_layout(attr->ino);
  ASSERT_TRUE(layout.has_value());
  const std::vector<uint8_t> tail = pattern(1000, 99);
  ASSERT_TRUE(client_->write(attr->ino, *layout, 9u << 20, tail).is_ok());
  std::vector<uint8_t> all((9u << 20) + 1000, 0xCC);
  auto got = client_->read(attr->ino, *layout, all.size(), 0, all);
  ASSERT_TRUE(got.has_value()) << got.error().to_string();
  ASSERT_EQ(*got, all.size());
  EXPECT_TRUE(std::all_of(all.begin(), all.begin() + (9 << 20), [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), all.begin() + (9 << 20)));

  // Every data connection this client made is RDMA.
  for (const auto& n : map->nodes) {
    auto t = client_->data_transport(n.address);
    ASSERT_TRUE(t.has_value()) << t.error().to_string();
    EXPECT_EQ(*t, "rdma " + n.address);
  }
}

}  // namespace
}  // namespace penstock
