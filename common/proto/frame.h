// The frame: what travels on a connection. A fixed 32-byte header, then the encoded message, then
// the bulk segment (chunk data). Bulk bytes are never part of the message: a sender gathers
// header + message + bulk with one scatter/gather write, and a receiver reads the bulk straight into
// the buffer its caller named. docs/wire-format.md is the specification.
// Thread-safety: pure functions and value types.
#pragma once

#include <array>
#include <cstdint>
#include <span>

#include "common/base/result.h"

namespace penstock::proto {

inline constexpr uint32_t kFrameMagic = 0x4b534e50;  // "PNSK" little-endian
// 2: Read carries verify_at_client, block_sums. 3: directory entry leases (Lookup, Rmdir and
// Rename carry the session; AttrResp carries entry_lease_ns). 4: file-system ids (TargetReport,
// RegisterNodeResp). 5: Read carries `sequential`. 6: Unlink answers the parent's attributes.
// 7: Rmdir and Rename answer the directories they changed (DirsResp).
inline constexpr uint8_t kFrameVersion = 7;
inline constexpr size_t kFrameHeaderSize = 32;
inline constexpr uint32_t kMaxMessageBytes = 16u << 20;  // encoded message
inline constexpr uint32_t kMaxBulkBytes = 64u << 20;     // one chunk at most

enum class FrameKind : uint8_t { kRequest = 1, kResponse = 2 };

enum class ServiceId : uint8_t { kMeta = 1, kData = 2 };

struct FrameHeader {
  FrameKind kind = FrameKind::kRequest;
  ServiceId service = ServiceId::kMeta;
  uint16_t method = 0;
  uint16_t flags = 0;      // reserved, must be 0
  uint32_t status = 0;     // responses: a penstock::Code; requests: 0
  uint64_t request_id = 0; // chosen by the caller, echoed in the response
  uint32_t message_len = 0;
  uint32_t bulk_len = 0;
};

// Writes the 32-byte header.
std::array<uint8_t, kFrameHeaderSize> encode_header(const FrameHeader& h);
// The header of request `id` to `service`'s `method`, carrying the given message and bulk lengths.
std::array<uint8_t, kFrameHeaderSize> encode_request_header(ServiceId service, uint16_t method, uint64_t id,
                                                            uint32_t message_len, uint32_t bulk_len);

// Parses and validates a header from a peer: magic, version, kind, service, reserved bits,
// status code and both lengths against the limits. kProtocol on any violation.
Result<FrameHeader> decode_header(std::span<const uint8_t> bytes);

}  // namespace penstock::proto
