// The frame header: encode/decode round trip and every validation rule of decode_header.
#include "common/proto/frame.h"

#include <cstring>
#include <string>

#include <gtest/gtest.h>

namespace penstock::proto {
namespace {

FrameHeader sample() {
  FrameHeader h;
  h.kind = FrameKind::kResponse;
  h.service = ServiceId::kData;
  h.method = 0xbeef;
  h.flags = 0;
  h.status = static_cast<uint32_t>(Code::kCorrupt);
  h.request_id = 0x0123456789abcdefull;
  h.message_len = kMaxMessageBytes;
  h.bulk_len = kMaxBulkBytes;
  return h;
}

template <class I>
void put(std::array<uint8_t, kFrameHeaderSize>& b, size_t at, I v) {
  std::memcpy(&b[at], &v, sizeof(I));
}

void expect_rejected(const std::array<uint8_t, kFrameHeaderSize>& b, const std::string& why) {
  auto r = decode_header(b);
  ASSERT_FALSE(r.has_value()) << why;
  EXPECT_EQ(r.error().code(), Code::kProtocol);
  EXPECT_NE(r.error().message().find(why), std::string::npos) << r.error().message();
}

TEST(FrameTest, RoundTrip) {
  const FrameHeader h = sample();
  auto b = encode_header(h);
  ASSERT_EQ(b.size(), kFrameHeaderSize);
  auto r = decode_header(b);
  ASSERT_TRUE(r.has_value()) << r.error().to_string();
  EXPECT_EQ(r->kind, h.kind);
  EXPECT_EQ(r->service, h.service);
  EXPECT_EQ(r->method, h.method);
  EXPECT_EQ(r->status, h.status);
  EXPECT_EQ(r->request_id, h.request_id);
  EXPECT_EQ(r->message_len, h.message_len);
  EXPECT_EQ(r->bulk_len, h.bulk_len);
}

TEST(FrameTest, RequestRoundTripAndWireLayout) {
  FrameHeader h;
  h.kind = FrameKind::kRequest;
  h.service = ServiceId::kMeta;
  h.method = 10;
  h.request_id = 5;
  h.message_len = 3;
  h.bulk_len = 0;
  auto b = encode_header(h);
  // Fixed layout (docs/wire-format.md): magic "PNSK", version, kind, service, pad.
  EXPECT_EQ(b[0], 'P');
  EXPECT_EQ(b[1], 'N');
  EXPECT_EQ(b[2], 'S');
  EXPECT_EQ(b[3], 'K');
  EXPECT_EQ(b[4], kFrameVersion);
  EXPECT_EQ(b[5], 1);
  EXPECT_EQ(b[6], 1);
  EXPECT_EQ(b[7], 0);
  EXPECT_EQ(b[8], 10);
  EXPECT_EQ(b[16], 5);
  EXPECT_EQ(b[24], 3);
  auto r = decode_header(b);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->kind, FrameKind::kRequest);
  EXPECT_EQ(r->status, 0u);
}

TEST(FrameTest, TruncatedHeader) {
  auto b = encode_header(sample());
  for (size_t n = 0; n < kFrameHeaderSize; ++n) {
    auto r = decode_header(std::span<const uint8_t>(b.data(), n));
    ASSERT_FALSE(r.has_value()) << n;
    EXPECT_EQ(r.error().code(), Code::kProtocol);
  }
}

TEST(FrameTest, WrongMagic) {
  auto b = encode_header(sample());
  b[0] ^= 1;
  expect_rejected(b, "magic");
  b = encode_header(sample());
  b[3] = 'X';
  expect_rejected(b, "magic");
}

TEST(FrameTest, WrongVersion) {
  for (uint8_t v : {uint8_t{0}, static_cast<uint8_t>(kFrameVersion - 1), static_cast<uint8_t>(kFrameVersion + 1),
                    uint8_t{255}}) {
    auto b = encode_header(sample());
    b[4] = v;
    expect_rejected(b, "version");
  }
}

TEST(FrameTest, UnknownKind) {
  for (uint8_t v : {uint8_t{0}, uint8_t{3}, uint8_t{255}}) {
    auto b = encode_header(sample());
    b[5] = v;
    expect_rejected(b, "kind");
  }
}

TEST(FrameTest, UnknownService) {
  for (uint8_t v : {uint8_t{0}, uint8_t{3}, uint8_t{255}}) {
    auto b = encode_header(sample());
    b[6] = v;
    expect_rejected(b, "service");
  }
}

TEST(FrameTest, ReservedByteSet) {
  auto b = encode_header(sample());
  b[7] = 1;
  expect_rejected(b, "reserved");
}

TEST(FrameTest, FlagsSet) {
  for (uint16_t f : {uint16_t{1}, uint16_t{0x8000}}) {
    auto b = encode_header(sample());
    put<uint16_t>(b, 10, f);
    expect_rejected(b, "flags");
  }
}

TEST(FrameTest, UnknownStatus) {
  auto b = encode_header(sample());
  put<uint32_t>(b, 12, static_cast<uint32_t>(Code::kCancelled) + 1);
  expect_rejected(b, "status");
  put<uint32_t>(b, 12, UINT32_MAX);
  expect_rejected(b, "status");
  put<uint32_t>(b, 12, static_cast<uint32_t>(Code::kCancelled));
  EXPECT_TRUE(decode_header(b).has_value());
}

TEST(FrameTest, RequestWithStatus) {
  FrameHeader h = sample();
  h.kind = FrameKind::kRequest;
  h.status = static_cast<uint32_t>(Code::kNotFound);
  expect_rejected(encode_header(h), "request carries a status");
}

TEST(FrameTest, LengthsOverTheLimits) {
  FrameHeader h = sample();
  h.message_len = kMaxMessageBytes + 1;
  expect_rejected(encode_header(h), "message length");
  h = sample();
  h.message_len = UINT32_MAX;
  expect_rejected(encode_header(h), "message length");
  h = sample();
  h.bulk_len = kMaxBulkBytes + 1;
  expect_rejected(encode_header(h), "bulk length");
  h = sample();
  h.bulk_len = UINT32_MAX;
  expect_rejected(encode_header(h), "bulk length");
}

TEST(FrameTest, EveryKnownStatusIsAccepted) {
  for (uint32_t c = 0; c <= static_cast<uint32_t>(Code::kCancelled); ++c) {
    FrameHeader h = sample();
    h.status = c;
    auto r = decode_header(encode_header(h));
    ASSERT_TRUE(r.has_value()) << c;
    EXPECT_EQ(r->status, c);
  }
}

}  // namespace
}  // namespace penstock::proto
