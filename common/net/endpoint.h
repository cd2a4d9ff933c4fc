// Endpoint: a host:port a server listens on or a client connects to.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/base/result.h"

namespace penstock::net {

struct Endpoint {
  std::string host;   // a numeric IPv4/IPv6 address or a host name
  uint16_t port = 0;

  // Parses "host:port" or "[v6addr]:port". kInvalid with the offending text on failure.
  static Result<Endpoint> parse(std::string_view text);
  std::string to_string() const;
};

}  // namespace penstock::net
