// File bulks (common/rpc/file_bulk.h): staging into a pipe or memory, and responses whose bulk is
// spliced from a file into the socket, alone and interleaved with ordinary responses on loopback.
#include "common/rpc/file_bulk.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/net/transport.h"
#include "common/rpc/client.h"
#include "common/rpc/server.h"
#include "tests/support/test_service.h"

namespace penstock {
namespace {

using namespace std::chrono_literals;
using test_service::pattern;

constexpr size_t kFileBytes = (8u << 20) + 100;  // ends mid-page

// A temporary file of pattern bytes, removed on destruction.
class PatternFile {
 public:
  PatternFile() {
    char tmpl[] = "/tmp/penstock-file-bulk-XXXXXX";
    fd_ = ::mkstemp(tmpl);
    EXPECT_GE(fd_, 0);
    path_ = tmpl;
    bytes_ = pattern(kFileBytes, 0x5a);
    EXPECT_EQ(::pwrite(fd_, bytes_.data(), bytes_.size(), 0), static_cast<ssize_t>(bytes_.size()));
  }
  ~PatternFile() {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd() const { return fd_; }
  std::vector<uint8_t> slice(uint64_t off, uint64_t len) const {
    if (off >= bytes_.size()) return {};
    len = std::min<uint64_t>(len, bytes_.size() - off);
    return {bytes_.begin() + static_cast<ptrdiff_t>(off), bytes_.begin() + static_cast<ptrdiff_t>(off + len)};
  }

 private:
  int fd_ = -1;
  std::string path_;
  std::vector<uint8_t> bytes_;
};

std::vector<uint8_t> drain(const rpc::StagedBulk& s) {
  if (!s.pipe) return {s.memory.begin(), s.memory.end()};
  std::vector<uint8_t> out(s.bytes);
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(s.pipe->read_fd(), out.data() + got, out.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

TEST(FileBulkStageTest, AlignedRangesGoThroughAPipeOthersThroughMemory) {
  PatternFile file;
  rpc::PipePool pool;
  struct Case {
    uint64_t off;
    uint32_t len;
    bool pipe;
  };
  for (const Case& c : {Case{0, 1u << 20, true}, Case{4096, 4096, true}, Case{8192, 5000, true},
                        Case{5, 1000, false},            // unaligned start
                        Case{0, (1u << 20) + 4096, false},  // over a pipe's capacity
                        Case{kFileBytes - 100 - 4096, 1u << 20, true}}) {  // the file ends first
    SCOPED_TRACE(std::to_string(c.off) + "+" + std::to_string(c.len));
    auto staged = rpc::stage_file_bulk(rpc::FileBulk{nullptr, file.fd(), c.off, c.len}, pool);
    ASSERT_TRUE(staged.has_value()) << staged.error().to_string();
    EXPECT_EQ(staged->pipe != nullptr, c.pipe);
    const std::vector<uint8_t> want = file.slice(c.off, c.len);
    EXPECT_EQ(staged->bytes, want.size());
    EXPECT_EQ(drain(*staged), want);
    if (staged->pipe) pool.give_back(std::move(staged->pipe));
  }
}

// The blocking splice may only be used where the range cannot need more pipe slots (one per page)
// than the pipe has: a 4 KiB-aligned 1 MiB range on a 64 KiB-page kernel spans 17 pages of a
// 16-slot pipe, and its splice would wait forever.
TEST(FileBulkStageTest, ARangeMustStartOnAPageOfTheRunningKernel) {
  const uint64_t mib = rpc::PipePool::kCapacity;
  EXPECT_TRUE(rpc::fits_one_pipe(20480, mib, 4096));
  EXPECT_FALSE(rpc::fits_one_pipe(20480, mib, 65536));
  EXPECT_TRUE(rpc::fits_one_pipe(65536, mib, 65536));
  EXPECT_FALSE(rpc::fits_one_pipe(0, mib + 1, 4096));
  EXPECT_FALSE(rpc::fits_one_pipe(5, 1000, 4096));
}

TEST(FileBulkStageTest, PastTheEndIsEmptyAndABadDescriptorIsAnError) {
  PatternFile file;
  rpc::PipePool pool;
  auto past = rpc::stage_file_bulk(rpc::FileBulk{nullptr, file.fd(), kFileBytes + 4096 * 10, 4096}, pool);
  ASSERT_TRUE(past.has_value()) << past.error().to_string();
  EXPECT_EQ(past->bytes, 0u);
  auto bad = rpc::stage_file_bulk(rpc::FileBulk{nullptr, -1, 0, 4096}, pool);
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code(), Code::kIo);
}

TEST(FileBulkStageTest, PoolHandsBackTheSamePipe) {
  rpc::PipePool pool;
  auto a = pool.take();
  ASSERT_TRUE(a.has_value()) << a.error().to_string();
  const int fd = (*a)->read_fd();
  EXPECT_GE((*a)->capacity(), rpc::PipePool::kCapacity);
  pool.give_back(std::move(*a));
  auto b = pool.take();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ((*b)->read_fd(), fd);
}

// ---- over the wire ----

struct FileReadReq {
  uint64_t offset = 0;
  uint32_t length = 0;
  bool fail = false;  // the handler names a file range, then fails
  PENSTOCK_FIELDS(offset, length, fail);
};
struct FileReadResp {
  bool spliced = false;  // the context allowed a file bulk
  PENSTOCK_FIELDS(spliced);
};
PENSTOCK_METHOD(FileRead, proto::ServiceId::kData, 1010, FileReadReq, FileReadResp);

class FileBulkRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rpc::ServerOptions opts;
    opts.listen = net::Endpoint{"127.0.0.1", 0};
    opts.io_threads = 2;
    opts.worker_threads = 4;
    server_ = std::make_unique<rpc::RpcServer>(opts);
    test_service::register_test_service(*server_);
    server_->handle<FileRead>([this](const FileReadReq& req, rpc::RequestContext& ctx) -> Result<FileReadResp> {
      if (!ctx.can_send_file()) return Status(Code::kInternal, "a TCP request context must allow file bulks");
      ctx.send_file(rpc::FileBulk{nullptr, file_.fd(), req.offset, req.length});
      if (req.fail) return Status(Code::kNotFound, "no such range");
      return FileReadResp{true};
    });
    ASSERT_TRUE(server_->start().is_ok());
    channel_ = net::make_tcp_channel(runtime_, net::Endpoint{"127.0.0.1", server_->port()}, net::TcpOptions{1000ms, 2});
    client_ = std::make_unique<rpc::RpcClient>(channel_, 10000ms);
  }
  void TearDown() override {
    client_.reset();
    channel_.reset();
    server_->stop();
  }

  // Reads [off, off + len) through FileRead and checks every byte.
  void expect_range(uint64_t off, uint32_t len) {
    std::vector<uint8_t> in(len + 7, 0xEE);
    uint32_t received = 0;
    rpc::CallOptions opts;
    opts.bulk_in = in;
    opts.bulk_received = &received;
    auto r = client_->call<FileRead>(FileReadReq{off, len, false}, opts);
    ASSERT_TRUE(r.has_value()) << r.error().to_string();
    const std::vector<uint8_t> want = file_.slice(off, len);
    ASSERT_EQ(received, want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), in.begin())) << "range " << off << "+" << len;
    for (size_t i = want.size(); i < in.size(); ++i) ASSERT_EQ(in[i], 0xEE) << "byte past the bulk written at " << i;
  }

  PatternFile file_;
  net::IoRuntime runtime_{2};
  std::unique_ptr<rpc::RpcServer> server_;
  std::shared_ptr<net::Channel> channel_;
  std::unique_ptr<rpc::RpcClient> client_;
};

TEST_F(FileBulkRpcTest, RangesArriveByteForByte) {
  expect_range(0, 1u << 20);                          // spliced
  expect_range(4096, 4096);                           // spliced
  expect_range(3, 70000);                             // read into memory
  expect_range(kFileBytes - 100 - 8192, 1u << 20);    // the file ends first: a short bulk
  expect_range(kFileBytes + 4096, 4096);              // past the end: no bulk
  expect_range(0, (1u << 20) + 4096);                 // over a pipe: memory
  test_service::expect_echo_works(*client_);
}

TEST_F(FileBulkRpcTest, AFailingHandlerSendsItsErrorAndNoBulk) {
  std::vector<uint8_t> in(4096, 0xEE);
  uint32_t received = 0;
  rpc::CallOptions opts;
  opts.bulk_in = in;
  opts.bulk_received = &received;
  auto r = client_->call<FileRead>(FileReadReq{0, 4096, true}, opts);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code(), Code::kNotFound);
  EXPECT_EQ(received, 0u);
  test_service::expect_echo_works(*client_);
}

// 32 MiB of spliced responses in flight at once overfill the socket, so the writer must wait for
// room (EAGAIN) and resume; ordinary responses on the same connections must come through intact.
TEST_F(FileBulkRpcTest, ManySplicedResponsesInterleaveWithOrdinaryOnes) {
  constexpr int kCalls = 32;
  std::vector<std::vector<uint8_t>> bufs(kCalls, std::vector<uint8_t>(1u << 20));
  std::vector<std::vector<uint8_t>> ebufs(kCalls, std::vector<uint8_t>(5000));
  std::vector<uint32_t> received(kCalls, 0);
  std::atomic<int> failures{0};
  std::atomic<int> left{2 * kCalls};
  std::promise<void> all_done;
  auto finish = [&] {
    if (left.fetch_sub(1) == 1) all_done.set_value();
  };
  for (int i = 0; i < kCalls; ++i) {
    const uint64_t off = static_cast<uint64_t>(i % 8) << 20;
    rpc::CallOptions opts;
    opts.bulk_in = bufs[i];
    opts.bulk_received = &received[i];
    client_->call_async<FileRead>(FileReadReq{off, 1u << 20, false}, opts, [&, i, off](Result<FileReadResp> r) {
      if (!r.has_value() || received[i] != bufs[i].size() || bufs[i] != file_.slice(off, 1u << 20)) {
        failures.fetch_add(1);
      }
      finish();
    });
    test_service::EchoReq e;
    e.text = "between";
    e.reply_bulk_len = 5000;
    rpc::CallOptions eopts;
    eopts.bulk_in = ebufs[i];
    client_->call_async<test_service::Echo>(e, eopts, [&, i](Result<test_service::EchoResp> r) {
      if (!r.has_value() || r->text != "between" || ebufs[i] != pattern(5000)) failures.fetch_add(1);
      finish();
    });
  }
  ASSERT_EQ(all_done.get_future().wait_for(30s), std::future_status::ready);
  EXPECT_EQ(failures.load(), 0);
  test_service::expect_echo_works(*client_);
}

}  // namespace
}  // namespace penstock
