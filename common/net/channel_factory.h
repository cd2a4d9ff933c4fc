// Transport selection: makes the Channel a client uses to reach one server, over RDMA or TCP.
//
// `auto` picks RDMA when a local RDMA device can reach the server's address and the server
// accepts an RDMA connection on the same port number (penstock servers listen for both on one
// address), else TCP; `rdma` and `tcp` force one. The choice is made once per channel, when it is
// made; describe() of the result says which ("rdma 10.0.0.5:7700" or "tcp 10.0.0.5:7700").
// Thread-safety: pure functions and a thread-safe factory function.
#pragma once

#include <memory>
#include <string_view>

#include "common/base/result.h"
#include "common/net/endpoint.h"
#include "common/net/rdma/rdma_transport.h"
#include "common/net/transport.h"

namespace penstock::net {

enum class TransportKind { kAuto, kRdma, kTcp };

// "auto", "rdma" or "tcp"; kInvalid naming the text otherwise.
Result<TransportKind> parse_transport(std::string_view text);
std::string_view transport_name(TransportKind kind);

struct ChannelOptions {
  TransportKind transport = TransportKind::kAuto;
  TcpOptions tcp;
  RdmaOptions rdma;  // rdma.connect_timeout also bounds the probe of `auto`
};

// The channel to `server`. kRdma: an RDMA channel, or kUnavailable with the reason when no RDMA
// connection can be made now ("transport = rdma, but ..."). kAuto never fails: it falls back to TCP
// (logging why at Info). kTcp: a TCP channel. Blocks for at most the RDMA connect timeout (kAuto
// with a reachable RDMA device, and kRdma).
Result<std::shared_ptr<Channel>> make_channel(IoRuntime& runtime, const Endpoint& server,
                                              const ChannelOptions& options);

}  // namespace penstock::net
