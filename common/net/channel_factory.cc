#include "common/net/channel_factory.h"

#include <string>

#include "common/base/log.h"

namespace penstock::net {

Result<TransportKind> parse_transport(std::string_view text) {
  if (text == "auto") return TransportKind::kAuto;
  if (text == "rdma") return TransportKind::kRdma;
  if (text == "tcp") return TransportKind::kTcp;
  return Status(Code::kInvalid,
                "transport '" + std::string(text) + "': expected auto, rdma or tcp");
}

std::string_view transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kAuto:
      return "auto";
    case TransportKind::kRdma:
      return "rdma";
    case TransportKind::kTcp:
      return "tcp";
  }
  return "unknown";
}

Result<std::shared_ptr<Channel>> make_channel(IoRuntime& runtime, const Endpoint& server,
                                              const ChannelOptions& options) {
  if (options.transport == TransportKind::kTcp)
    return make_tcp_channel(runtime, server, options.tcp);
  const bool forced = options.transport == TransportKind::kRdma;
  if (!rdma_device_present()) {
    if (forced) {
      return Status(
          Code::kUnavailable,
          "transport = rdma, but this host has no RDMA device (use transport = auto or tcp)");
    }
    return make_tcp_channel(runtime, server, options.tcp);
  }
  if (!forced && !rdma_can_reach(server, options.rdma.connect_timeout)) {
    PENSTOCK_LOG(Info) << "no RDMA device reaches " << server.to_string() << ": using TCP";
    return make_tcp_channel(runtime, server, options.tcp);
  }
  std::shared_ptr<RdmaChannel> rdma = make_rdma_channel(server, options.rdma);
  Status st = rdma->connect_now();
  if (st.is_ok()) return std::shared_ptr<Channel>(std::move(rdma));
  if (forced) return st.with_context("transport = rdma");
  PENSTOCK_LOG(Info) << st.message() << ": using TCP";
  return make_tcp_channel(runtime, server, options.tcp);
}

}  // namespace penstock::net
