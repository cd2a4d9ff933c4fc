// Endpoint parsing and printing.
#include "common/net/endpoint.h"

#include <gtest/gtest.h>

namespace penstock::net {
namespace {

TEST(EndpointTest, ParsesHostAndPort) {
  auto e = Endpoint::parse("127.0.0.1:7000");
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ(e->host, "127.0.0.1");
  EXPECT_EQ(e->port, 7000);
  EXPECT_EQ(e->to_string(), "127.0.0.1:7000");

  auto n = Endpoint::parse("meta.example:65535");
  ASSERT_TRUE(n.has_value());
  EXPECT_EQ(n->host, "meta.example");
  EXPECT_EQ(n->port, 65535);

  auto z = Endpoint::parse("localhost:0");
  ASSERT_TRUE(z.has_value());
  EXPECT_EQ(z->port, 0);
}

TEST(EndpointTest, ParsesBracketedIpv6) {
  auto e = Endpoint::parse("[::1]:7000");
  ASSERT_TRUE(e.has_value()) << e.error().to_string();
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 7000);
  EXPECT_EQ(e->to_string(), "[::1]:7000");

  auto f = Endpoint::parse("[fe80::1:2]:1");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->host, "fe80::1:2");
  EXPECT_EQ(f->to_string(), "[fe80::1:2]:1");
}

TEST(EndpointTest, RejectsMalformed) {
  for (const char* bad : {"", ":", "7000", "host", "host:", ":7000", "host:70000", "host:-1", "host:7x",
                          "host: 7000", "host:7000 ", "[::1]", "[::1]7000", "[::1:7000", "[]:7000",
                          "host:99999999999999999999", "::1", "fe80::1", "host::7000", "[[::1]:80", "[::1]]:80"}) {
    auto e = Endpoint::parse(bad);
    EXPECT_FALSE(e.has_value()) << "'" << bad << "' parsed";
    if (!e.has_value()) {
      EXPECT_EQ(e.error().code(), Code::kInvalid) << bad;
      EXPECT_NE(e.error().message().find("expected host:port"), std::string::npos);
    }
  }
}

TEST(EndpointTest, UnbracketedIpv6UsesTheLastColonAsPortSeparator) {
  // Documented behaviour: without brackets the last colon separates the port.
  auto e = Endpoint::parse("::1:7000");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->host, "::1");
  EXPECT_EQ(e->port, 7000);
  EXPECT_EQ(e->to_string(), "[::1]:7000");
}

}  // namespace
}  // namespace penstock::net
