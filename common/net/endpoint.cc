#include "common/net/endpoint.h"

#include <arpa/inet.h>

#include <charconv>

namespace penstock::net {

Result<Endpoint> Endpoint::parse(std::string_view text) {
  auto bad = [&](const char* why) {
    return Status(Code::kInvalid, "address '" + std::string(text) + "' " + why + " (expected host:port)");
  };
  Endpoint ep;
  std::string_view port_text;
  if (!text.empty() && text.front() == '[') {
    auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') return bad("is malformed");
    ep.host = std::string(text.substr(1, close - 1));
    port_text = text.substr(close + 2);
    if (ep.host.find_first_of("[]") != std::string::npos) return bad("is malformed");
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no port");
    ep.host = std::string(text.substr(0, colon));
    port_text = text.substr(colon + 1);
    // Without brackets a host with a colon must be a whole IPv6 address: "::1" alone or
    // "fe80::1" would otherwise read as host ":" or "fe80:" with port 1.
    if (ep.host.find(':') != std::string::npos) {
      const std::string addr = ep.host.substr(0, ep.host.find('%'));  // fe80::1%eth0
      in6_addr parsed{};
      if (::inet_pton(AF_INET6, addr.c_str(), &parsed) != 1) {
        return bad("is not an IPv6 address with a port; write IPv6 as [addr]:port");
      }
    }
  }
  if (ep.host.empty()) return bad("has no host");
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || ptr != port_text.data() + port_text.size() || port > 65535) return bad("has a bad port");
  ep.port = static_cast<uint16_t>(port);
  return ep;
}

std::string Endpoint::to_string() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

}  // namespace penstock::net
