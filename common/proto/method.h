// A Method binds a service, a fixed method number and the request/response message types.
// Each service header declares all its methods once with PENSTOCK_METHOD; the RPC layer is typed on
// these declarations, so a caller cannot send a request with the wrong response type.
#pragma once

#include <cstdint>
#include <string_view>

#include "common/proto/frame.h"

// PENSTOCK_METHOD(Name, service, number, Request, Response): method numbers are part of the wire
// format; never reuse one.
#define PENSTOCK_METHOD(NAME, SERVICE, NUMBER, REQ, RESP)                 \
  struct NAME {                                                           \
    static constexpr ::penstock::proto::ServiceId kService = SERVICE;     \
    static constexpr uint16_t kId = NUMBER;                               \
    static constexpr std::string_view kName = #NAME;                      \
    using Request = REQ;                                                  \
    using Response = RESP;                                                \
  }

namespace penstock::proto {

template <class M>
concept RpcMethod = requires {
  { M::kService } -> std::convertible_to<ServiceId>;
  { M::kId } -> std::convertible_to<uint16_t>;
  typename M::Request;
  typename M::Response;
};

// An empty message (no fields).
struct Empty {
  template <class V> void visit_fields(V&& v) { v(); }
  template <class V> void visit_fields(V&& v) const { v(); }
};

}  // namespace penstock::proto
