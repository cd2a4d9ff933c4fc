// Fuzz target for the RDMA transport's decoders of peer bytes: control messages (both kinds) and
// the rdma_cm connect parameters. Nothing may crash; whatever decodes must respect the limits the
// decoders promise, and a decoded control message must re-encode to exactly its input.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "common/net/rdma/control.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace penstock;
  using namespace penstock::net::rdma;
  std::span<const uint8_t> in(data, size);
  for (proto::FrameKind kind : {proto::FrameKind::kRequest, proto::FrameKind::kResponse}) {
    auto m = decode_control(in, kind);
    if (!m.has_value()) continue;
    if (m->header.kind != kind) std::abort();
    if (m->header.bulk_len > proto::kMaxBulkBytes || m->header.message_len > proto::kMaxMessageBytes) std::abort();
    std::vector<uint8_t> again(control_size(kind, m->message.size()));
    if (again.size() != size) std::abort();
    encode_control(m->header, m->message, m->bulk_out, m->bulk_in, again);
    if (std::memcmp(again.data(), data, size) != 0) std::abort();
  }
  auto p = decode_connect_params(in);
  if (p.has_value() && (p->recv_depth == 0 || p->recv_depth > kMaxRecvDepth ||
                        p->control_bytes < kMinControlBytes || p->control_bytes > kMaxControlBytes)) {
    std::abort();
  }
  return 0;
}
