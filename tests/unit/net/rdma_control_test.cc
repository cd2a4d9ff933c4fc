// RDMA control messages and connect data (common/net/rdma/control.h): round trips and every
// rejection of hostile bytes, without a device.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/net/rdma/control.h"

namespace penstock::net::rdma {
namespace {

proto::FrameHeader request_header(uint32_t message_len, uint32_t bulk_len) {
  proto::FrameHeader h;
  h.kind = proto::FrameKind::kRequest;
  h.service = proto::ServiceId::kData;
  h.method = 2;
  h.request_id = 99;
  h.message_len = message_len;
  h.bulk_len = bulk_len;
  return h;
}

std::vector<uint8_t> encode(const proto::FrameHeader& h, const std::string& msg, RemoteBuffer out,
                            RemoteBuffer in) {
  std::vector<uint8_t> b(control_size(h.kind, msg.size()));
  size_t n = encode_control(
      h, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(msg.data()), msg.size()), out,
      in, b);
  EXPECT_EQ(n, b.size());
  return b;
}

TEST(RdmaControl, RequestRoundTripCarriesDescriptor) {
  const std::string msg = "hello";
  auto b = encode(request_header(5, 4096), msg, {0x7f0000001000, 0x1234, 4096},
                  {0x7f0000200000, 0x5678, 1 << 20});
  EXPECT_EQ(b.size(), proto::kFrameHeaderSize + 5 + kRequestDescriptorSize);
  auto m = decode_control(b, proto::FrameKind::kRequest);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(m->header.request_id, 99u);
  EXPECT_EQ(std::string(m->message.begin(), m->message.end()), "hello");
  EXPECT_EQ(m->bulk_out.addr, 0x7f0000001000u);
  EXPECT_EQ(m->bulk_out.rkey, 0x1234u);
  EXPECT_EQ(m->bulk_out.len, 4096u);
  EXPECT_EQ(m->bulk_in.addr, 0x7f0000200000u);
  EXPECT_EQ(m->bulk_in.rkey, 0x5678u);
  EXPECT_EQ(m->bulk_in.len, 1u << 20);
}

TEST(RdmaControl, ResponseHasNoDescriptor) {
  proto::FrameHeader h;
  h.kind = proto::FrameKind::kResponse;
  h.service = proto::ServiceId::kData;
  h.request_id = 5;
  h.message_len = 3;
  h.bulk_len = 100;
  auto b = encode(h, "abc", {}, {});
  EXPECT_EQ(b.size(), proto::kFrameHeaderSize + 3);
  auto m = decode_control(b, proto::FrameKind::kResponse);
  ASSERT_TRUE(m.has_value()) << m.error().to_string();
  EXPECT_EQ(m->header.bulk_len, 100u);
}

TEST(RdmaControl, RejectsHostileBytes) {
  const std::string msg = "hello";
  auto good = encode(request_header(5, 10), msg, {0x1000, 1, 10}, {});
  // Short of a header; garbage; wrong kind; truncated; trailing bytes.
  EXPECT_EQ(decode_control(std::span<const uint8_t>(good.data(), 31), proto::FrameKind::kRequest)
                .error()
                .code(),
            Code::kProtocol);
  std::vector<uint8_t> garbage(64, 0xEE);
  EXPECT_EQ(decode_control(garbage, proto::FrameKind::kRequest).error().code(), Code::kProtocol);
  EXPECT_EQ(decode_control(good, proto::FrameKind::kResponse).error().code(), Code::kProtocol);
  EXPECT_EQ(decode_control(std::span<const uint8_t>(good.data(), good.size() - 1),
                           proto::FrameKind::kRequest)
                .error()
                .code(),
            Code::kProtocol);
  auto longer = good;
  longer.push_back(0);
  EXPECT_EQ(decode_control(longer, proto::FrameKind::kRequest).error().code(), Code::kProtocol);
  // The descriptor disagrees with the header, names a null address, or an over-limit buffer.
  EXPECT_EQ(decode_control(encode(request_header(5, 10), msg, {0x1000, 1, 9}, {}),
                           proto::FrameKind::kRequest)
                .error()
                .code(),
            Code::kProtocol);
  EXPECT_EQ(
      decode_control(encode(request_header(5, 10), msg, {0, 1, 10}, {}), proto::FrameKind::kRequest)
          .error()
          .code(),
      Code::kProtocol);
  EXPECT_EQ(
      decode_control(encode(request_header(5, 0), msg, {}, {0, 1, 10}), proto::FrameKind::kRequest)
          .error()
          .code(),
      Code::kProtocol);
  EXPECT_EQ(
      decode_control(encode(request_header(5, 0), msg, {}, {0x1000, 1, proto::kMaxBulkBytes + 1}),
                     proto::FrameKind::kRequest)
          .error()
          .code(),
      Code::kProtocol);
  EXPECT_TRUE(
      decode_control(encode(request_header(5, 0), msg, {}, {0x1000, 1, proto::kMaxBulkBytes}),
                     proto::FrameKind::kRequest)
          .has_value());
}

TEST(RdmaControl, EveryTruncationAndBitFlipIsHandled) {
  // No crash and no out-of-bounds read for any prefix or single-byte corruption (ASan watches).
  const std::string msg(40, 'm');
  auto good = encode(request_header(40, 7), msg, {0x1000, 1, 7}, {0x2000, 2, 100});
  for (size_t n = 0; n <= good.size(); ++n) {
    auto r = decode_control(std::span<const uint8_t>(good.data(), n), proto::FrameKind::kRequest);
    EXPECT_EQ(r.has_value(), n == good.size()) << n;
  }
  for (size_t i = 0; i < good.size(); ++i) {
    auto b = good;
    b[i] ^= 0x80;
    (void)decode_control(b, proto::FrameKind::kRequest);
  }
}

TEST(RdmaControl, ConnectParams) {
  std::array<uint8_t, kConnectParamsSize> b{};
  encode_connect_params(ConnectParams{64, 16384}, b);
  auto p = decode_connect_params(b);
  ASSERT_TRUE(p.has_value()) << p.error().to_string();
  EXPECT_EQ(p->recv_depth, 64u);
  EXPECT_EQ(p->control_bytes, 16384u);
  EXPECT_EQ(decode_connect_params(std::span<const uint8_t>(b.data(), 15)).error().code(),
            Code::kProtocol);
  auto bad = b;
  bad[0] ^= 1;
  EXPECT_EQ(decode_connect_params(bad).error().code(), Code::kProtocol);  // magic
  bad = b;
  bad[4] = 2;
  EXPECT_EQ(decode_connect_params(bad).error().code(), Code::kProtocol);  // version
  encode_connect_params(ConnectParams{0, 16384}, b);
  EXPECT_EQ(decode_connect_params(b).error().code(), Code::kProtocol);
  encode_connect_params(ConnectParams{kMaxRecvDepth + 1, 16384}, b);
  EXPECT_EQ(decode_connect_params(b).error().code(), Code::kProtocol);
  encode_connect_params(ConnectParams{8, kMinControlBytes - 1}, b);
  EXPECT_EQ(decode_connect_params(b).error().code(), Code::kProtocol);
}

}  // namespace
}  // namespace penstock::net::rdma
