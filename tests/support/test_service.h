// A test RPC service shared by the RPC and transport suites: Echo (text and bulk both ways),
// InlineEcho (the same, run with rpc::Dispatch::kInline on the I/O thread), Sleep (a slow
// handler, for deadlines), WaitingSleep (the same on the waiting pool, rpc::Dispatch::kWaiting)
// and Fail (any status with a text), on the data service id
// with method numbers no real method uses (1000+; 1999 is never registered).
// Thread-safety: the handlers are stateless.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/proto/codec.h"
#include "common/proto/method.h"
#include "common/rpc/client.h"
#include "common/rpc/server.h"

namespace penstock::test_service {

struct EchoReq {
  std::string text;
  bool echo_bulk = false;       // reply with the request's bulk
  uint32_t reply_bulk_len = 0;  // else: reply with this many pattern bytes
  PENSTOCK_FIELDS(text, echo_bulk, reply_bulk_len);
};
// Echo's answer carries reply_bulk_len bytes, declared as data Read declares its length, so the
// server counts them in flight from the moment it reads the request (rpc::RpcServer::reply_bound).
inline uint64_t reply_bulk_bound(const EchoReq& r) { return r.reply_bulk_len; }
struct EchoResp {
  std::string text;
  uint32_t bulk_in_len = 0;
  bool bulk_in_page_aligned = false;  // where the server received the bulk
  PENSTOCK_FIELDS(text, bulk_in_len, bulk_in_page_aligned);
};
struct SleepReq {
  uint32_t ms = 0;
  uint32_t reply_bulk_len = 0;
  PENSTOCK_FIELDS(ms, reply_bulk_len);
};
struct FailReq {
  uint32_t code = 0;
  std::string text;
  PENSTOCK_FIELDS(code, text);
};
PENSTOCK_METHOD(Echo, proto::ServiceId::kData, 1000, EchoReq, EchoResp);
PENSTOCK_METHOD(Sleep, proto::ServiceId::kData, 1001, SleepReq, proto::Empty);
PENSTOCK_METHOD(Fail, proto::ServiceId::kData, 1002, FailReq, proto::Empty);
PENSTOCK_METHOD(InlineEcho, proto::ServiceId::kData, 1003, EchoReq, EchoResp);
PENSTOCK_METHOD(WaitingSleep, proto::ServiceId::kData, 1004, SleepReq, proto::Empty);
PENSTOCK_METHOD(NotRegistered, proto::ServiceId::kData, 1999, proto::Empty, proto::Empty);

// Deterministic bytes whose value depends on the position (and `salt`), so a misplaced byte shows.
inline uint8_t pattern_byte(size_t i) { return static_cast<uint8_t>((i * 131 + (i >> 11) * 7 + 1) & 0xff); }
inline std::vector<uint8_t> pattern(size_t n, uint8_t salt = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(pattern_byte(i) ^ salt);
  return v;
}

// A pattern() of at least `n` bytes, shared: byte i of a pattern does not depend on its length,
// and a per-byte loop per reply is slow under ThreadSanitizer (1000 replies of 1 MiB kept the
// workers busy past a 5 s call deadline).
inline std::shared_ptr<const std::vector<uint8_t>> pattern_of_at_least(size_t n) {
  static std::mutex mu;
  static std::shared_ptr<const std::vector<uint8_t>> longest;
  std::lock_guard<std::mutex> lock(mu);
  if (longest == nullptr || longest->size() < n) longest = std::make_shared<const std::vector<uint8_t>>(pattern(n));
  return longest;
}

inline Result<EchoResp> echo(const EchoReq& req, rpc::RequestContext& ctx) {
  EchoResp resp;
  resp.text = req.text;
  resp.bulk_in_len = static_cast<uint32_t>(ctx.bulk_in().size());
  resp.bulk_in_page_aligned = reinterpret_cast<uintptr_t>(ctx.bulk_in().data()) % 4096 == 0;
  if (req.echo_bulk) {
    ctx.bulk_out().assign(ctx.bulk_in().begin(), ctx.bulk_in().end());
  } else if (req.reply_bulk_len > 0) {
    const auto bytes = pattern_of_at_least(req.reply_bulk_len);
    ctx.bulk_out().assign(bytes->begin(), bytes->begin() + static_cast<std::ptrdiff_t>(req.reply_bulk_len));
  }
  return resp;
}

// Fails the current test unless an Echo round trip through `client` works (a connection or server
// survived what the test did to it).
inline void expect_echo_works(rpc::RpcClient& client) {
  EchoReq req;
  req.text = "still alive";
  auto r = client.call<Echo>(req);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->text, "still alive");
}

inline void register_test_service(rpc::RpcServer& server) {
  server.handle<Echo>(echo);
  server.handle<InlineEcho>(echo, rpc::Dispatch::kInline);
  auto sleep = [](const SleepReq& req, rpc::RequestContext& ctx) -> Result<proto::Empty> {
    std::this_thread::sleep_for(std::chrono::milliseconds(req.ms));
    if (req.reply_bulk_len > 0) ctx.bulk_out().assign(req.reply_bulk_len, 0xAB);
    return proto::Empty{};
  };
  server.handle<Sleep>(sleep);
  server.handle<WaitingSleep>(sleep, rpc::Dispatch::kWaiting);
  server.handle<Fail>([](const FailReq& req, rpc::RequestContext&) -> Result<proto::Empty> {
    return Status(static_cast<Code>(req.code), req.text);
  });
}

}  // namespace penstock::test_service
