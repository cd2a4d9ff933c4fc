#include "common/proto/frame.h"

#include <cstring>
#include <string>

namespace penstock::proto {
namespace {
template <class I>
void store(uint8_t* p, I v) { std::memcpy(p, &v, sizeof(I)); }
template <class I>
I load(const uint8_t* p) { I v; std::memcpy(&v, p, sizeof(I)); return v; }
Status bad(const std::string& what) { return Status(Code::kProtocol, "bad frame header: " + what); }
}  // namespace

// Layout: magic u32 | version u8 | kind u8 | service u8 | pad u8 | method u16 | flags u16 |
//         status u32 | request_id u64 | message_len u32 | bulk_len u32
std::array<uint8_t, kFrameHeaderSize> encode_header(const FrameHeader& h) {
  std::array<uint8_t, kFrameHeaderSize> b{};
  store<uint32_t>(&b[0], kFrameMagic);
  b[4] = kFrameVersion;
  b[5] = static_cast<uint8_t>(h.kind);
  b[6] = static_cast<uint8_t>(h.service);
  b[7] = 0;
  store<uint16_t>(&b[8], h.method);
  store<uint16_t>(&b[10], h.flags);
  store<uint32_t>(&b[12], h.status);
  store<uint64_t>(&b[16], h.request_id);
  store<uint32_t>(&b[24], h.message_len);
  store<uint32_t>(&b[28], h.bulk_len);
  return b;
}

std::array<uint8_t, kFrameHeaderSize> encode_request_header(ServiceId service, uint16_t method, uint64_t id,
                                                            uint32_t message_len, uint32_t bulk_len) {
  FrameHeader h;
  h.kind = FrameKind::kRequest;
  h.service = service;
  h.method = method;
  h.request_id = id;
  h.message_len = message_len;
  h.bulk_len = bulk_len;
  return encode_header(h);
}

Result<FrameHeader> decode_header(std::span<const uint8_t> b) {
  if (b.size() < kFrameHeaderSize) return bad("truncated (" + std::to_string(b.size()) + " bytes)");
  if (load<uint32_t>(&b[0]) != kFrameMagic) return bad("wrong magic (not a Penstock peer?)");
  if (b[4] != kFrameVersion) {
    return bad("unsupported wire version " + std::to_string(b[4]) + " (this build speaks " +
               std::to_string(kFrameVersion) + "; upgrade every node of the file system together)");
  }
  FrameHeader h;
  if (b[5] != 1 && b[5] != 2) return bad("unknown kind " + std::to_string(b[5]));
  h.kind = static_cast<FrameKind>(b[5]);
  if (b[6] != 1 && b[6] != 2) return bad("unknown service " + std::to_string(b[6]));
  h.service = static_cast<ServiceId>(b[6]);
  if (b[7] != 0) return bad("reserved byte set");
  h.method = load<uint16_t>(&b[8]);
  h.flags = load<uint16_t>(&b[10]);
  if (h.flags != 0) return bad("unknown flags");
  h.status = load<uint32_t>(&b[12]);
  if (!code_is_known(h.status)) return bad("unknown status code " + std::to_string(h.status));
  if (h.kind == FrameKind::kRequest && h.status != 0) return bad("request carries a status");
  h.request_id = load<uint64_t>(&b[16]);
  h.message_len = load<uint32_t>(&b[24]);
  h.bulk_len = load<uint32_t>(&b[28]);
  if (h.message_len > kMaxMessageBytes) return bad("message length " + std::to_string(h.message_len) + " over the limit");
  if (h.bulk_len > kMaxBulkBytes) return bad("bulk length " + std::to_string(h.bulk_len) + " over the limit");
  return h;
}

}  // namespace penstock::proto
