#include "common/net/rdma/control.h"

#include <cstring>
#include <string>

namespace penstock::net::rdma {
namespace {

void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void put_remote(uint8_t* p, const RemoteBuffer& b) {
  put64(p, b.addr);
  put32(p + 8, b.rkey);
  put32(p + 12, b.len);
}
RemoteBuffer get_remote(const uint8_t* p) {
  return RemoteBuffer{get64(p), get32(p + 8), get32(p + 12)};
}

Status bad(const std::string& what) {
  return Status(Code::kProtocol, "RDMA control message: " + what);
}

}  // namespace

size_t control_size(proto::FrameKind kind, size_t message_len) {
  return proto::kFrameHeaderSize + message_len +
         (kind == proto::FrameKind::kRequest ? kRequestDescriptorSize : 0);
}

size_t encode_control(const proto::FrameHeader& h, std::span<const uint8_t> message,
                      const RemoteBuffer& bulk_out, const RemoteBuffer& bulk_in,
                      std::span<uint8_t> dst) {
  auto header = proto::encode_header(h);
  uint8_t* p = dst.data();
  std::memcpy(p, header.data(), header.size());
  p += header.size();
  if (!message.empty()) std::memcpy(p, message.data(), message.size());
  p += message.size();
  if (h.kind == proto::FrameKind::kRequest) {
    put_remote(p, bulk_out);
    put_remote(p + kRemoteBufferSize, bulk_in);
    p += kRequestDescriptorSize;
  }
  return static_cast<size_t>(p - dst.data());
}

Result<ControlMessage> decode_control(std::span<const uint8_t> bytes, proto::FrameKind expect) {
  if (bytes.size() < proto::kFrameHeaderSize) {
    return bad(std::to_string(bytes.size()) + " bytes, shorter than a frame header");
  }
  auto header = proto::decode_header(bytes.first(proto::kFrameHeaderSize));
  if (!header.has_value()) return header.error();
  ControlMessage m;
  m.header = *header;
  if (m.header.kind != expect) {
    return bad(expect == proto::FrameKind::kRequest ? "a response frame sent to the server"
                                                    : "a request frame sent to the client");
  }
  const size_t want = control_size(expect, m.header.message_len);
  if (bytes.size() != want) {
    return bad(std::to_string(bytes.size()) + " bytes where the header announces " +
               std::to_string(want));
  }
  m.message = bytes.subspan(proto::kFrameHeaderSize, m.header.message_len);
  if (expect == proto::FrameKind::kRequest) {
    const uint8_t* d = bytes.data() + proto::kFrameHeaderSize + m.header.message_len;
    m.bulk_out = get_remote(d);
    m.bulk_in = get_remote(d + kRemoteBufferSize);
    if (m.bulk_out.len != m.header.bulk_len) {
      return bad("descriptor names " + std::to_string(m.bulk_out.len) +
                 " request bulk bytes, the header " + std::to_string(m.header.bulk_len));
    }
    if (m.bulk_in.len > proto::kMaxBulkBytes) {
      return bad("response buffer of " + std::to_string(m.bulk_in.len) +
                 " bytes is over the bulk limit");
    }
    if ((m.bulk_out.len > 0 && m.bulk_out.addr == 0) ||
        (m.bulk_in.len > 0 && m.bulk_in.addr == 0)) {
      return bad("descriptor names a null address");
    }
  }
  return m;
}

void encode_connect_params(const ConnectParams& p, std::span<uint8_t, kConnectParamsSize> dst) {
  std::memset(dst.data(), 0, dst.size());
  put32(dst.data(), kConnectMagic);
  dst[4] = static_cast<uint8_t>(kConnectVersion & 0xff);
  dst[5] = static_cast<uint8_t>(kConnectVersion >> 8);
  put32(dst.data() + 8, p.recv_depth);
  put32(dst.data() + 12, p.control_bytes);
}

Result<ConnectParams> decode_connect_params(std::span<const uint8_t> bytes) {
  if (bytes.size() < kConnectParamsSize) {
    return Status(Code::kProtocol, "RDMA connect data: " + std::to_string(bytes.size()) +
                                       " bytes, want " + std::to_string(kConnectParamsSize));
  }
  if (get32(bytes.data()) != kConnectMagic) {
    return Status(Code::kProtocol, "RDMA connect data: bad magic (not a Penstock peer)");
  }
  const uint16_t version = static_cast<uint16_t>(bytes[4] | (bytes[5] << 8));
  if (version != kConnectVersion) {
    return Status(Code::kProtocol, "RDMA connect data: version " + std::to_string(version) +
                                       ", this build speaks " + std::to_string(kConnectVersion));
  }
  ConnectParams p;
  p.recv_depth = get32(bytes.data() + 8);
  p.control_bytes = get32(bytes.data() + 12);
  if (p.recv_depth < 1 || p.recv_depth > kMaxRecvDepth) {
    return Status(Code::kProtocol, "RDMA connect data: receive depth " +
                                       std::to_string(p.recv_depth) + " out of range");
  }
  if (p.control_bytes < kMinControlBytes || p.control_bytes > kMaxControlBytes) {
    return Status(Code::kProtocol, "RDMA connect data: control buffer of " +
                                       std::to_string(p.control_bytes) + " bytes out of range");
  }
  return p;
}

}  // namespace penstock::net::rdma
