// RDMA control messages (docs/wire-format.md, section "RDMA"): the bytes of one SEND on an RDMA
// queue pair, and the private data exchanged by rdma_cm at connect. Pure functions over bytes, so
// the parsing of peer input is unit-tested and fuzzable without a device.
// Thread-safety: pure functions and value types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "common/base/result.h"
#include "common/proto/frame.h"

namespace penstock::net::rdma {

// A buffer the peer may access one-sided: address, remote key, length.
struct RemoteBuffer {
  uint64_t addr = 0;
  uint32_t rkey = 0;
  uint32_t len = 0;
};

// Requests end with two RemoteBuffers (bulk_out: where the server READs the request bulk; bulk_in:
// where it WRITEs the response bulk), 16 bytes each. Responses carry no descriptor.
inline constexpr size_t kRemoteBufferSize = 16;
inline constexpr size_t kRequestDescriptorSize = 2 * kRemoteBufferSize;

struct ControlMessage {
  proto::FrameHeader header;
  std::span<const uint8_t> message;  // points into the decoded bytes
  RemoteBuffer bulk_out;             // requests only
  RemoteBuffer bulk_in;              // requests only
};

// Bytes a control message takes.
size_t control_size(proto::FrameKind kind, size_t message_len);

// Writes header + message (+ the descriptor for requests) into `dst` and returns the byte count.
// REQUIRES: dst.size() >= control_size(h.kind, message.size()); h.message_len == message.size().
size_t encode_control(const proto::FrameHeader& h, std::span<const uint8_t> message,
                      const RemoteBuffer& bulk_out, const RemoteBuffer& bulk_in,
                      std::span<uint8_t> dst);

// Parses one received control message of kind `expect`. kProtocol when the header is invalid
// (proto::decode_header), the kind differs, the size is not exactly header + message (+
// descriptor), a request's bulk_out length differs from its header's bulk_len, a bulk_in
// length is over proto::kMaxBulkBytes, or a descriptor names a length with a null address.
Result<ControlMessage> decode_control(std::span<const uint8_t> bytes, proto::FrameKind expect);

// rdma_cm private data, in both directions: who we are and how many control messages of what
// size we can receive.
struct ConnectParams {
  uint32_t recv_depth = 0;     // receive buffers posted for the peer (>= 1)
  uint32_t control_bytes = 0;  // bytes per receive buffer (>= kMinControlBytes)
};
inline constexpr size_t kConnectParamsSize = 16;
inline constexpr uint32_t kConnectMagic = 0x4d44524e;  // "NRDM"
inline constexpr uint16_t kConnectVersion = 1;
inline constexpr uint32_t kMinControlBytes = 1024;
inline constexpr uint32_t kMaxControlBytes = 1u << 20;
inline constexpr uint32_t kMaxRecvDepth = 4096;

void encode_connect_params(const ConnectParams& p, std::span<uint8_t, kConnectParamsSize> dst);
// kProtocol on a short buffer, wrong magic or version, or values outside the limits above.
Result<ConnectParams> decode_connect_params(std::span<const uint8_t> bytes);

}  // namespace penstock::net::rdma
