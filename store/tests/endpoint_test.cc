// Endpoint: the one parser and formatter of host:port that flags, store keys and messages use.
#include "dist/store/endpoint.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace dist::store {
namespace {

TEST(Endpoint, ParsesNamesIpv4AndBracketedIpv6AndFormatsThemBack) {
  struct Case {
    std::string text;
    std::string host;
    std::uint16_t port;
    std::string formatted;
  };
  const std::vector<Case> cases{
      {"node-1:29400", "node-1", 29400, "node-1:29400"},
      {"10.0.0.7:1", "10.0.0.7", 1, "10.0.0.7:1"},
      {"[fd00::1]:65535", "fd00::1", 65535, "[fd00::1]:65535"},
      {"node-1", "node-1", 29500, "node-1:29500"},  // the default port
      {"[::1]", "::1", 29500, "[::1]:29500"},
      {"::1", "::1", 29500, "[::1]:29500"},  // a bare IPv6 address is all host
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.text);
    const Endpoint e = parse_endpoint(c.text, 29500);
    EXPECT_EQ(e.host, c.host);
    EXPECT_EQ(e.port, c.port);
    EXPECT_EQ(e.to_string(), c.formatted);
    EXPECT_EQ(parse_endpoint(e.to_string()), e) << "round trip";
  }
}

TEST(Endpoint, MistakesAreOneLineErrorsQuotingTheText) {
  const std::vector<std::string> bad{"host",       ":80",     "[::1:80", "[::1]x80", "host:0",
                                     "host:65536", "host:8o", "host:",   "",         "[::1]:99999"};
  for (const std::string& text : bad) {
    SCOPED_TRACE(text);
    try {
      parse_endpoint(text);  // no default port: "host" alone is a mistake here
      ADD_FAILURE() << "accepted";
    } catch (const EndpointError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("'" + text), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
  EXPECT_EQ(parse_endpoint("host:0", std::nullopt, /*allow_zero=*/true).port, 0);
}

TEST(Endpoint, SplitHostLeavesTheSuffixToTheCaller) {
  EXPECT_EQ(split_host("a:4").suffix, "4");
  EXPECT_EQ(split_host("[fd00::2]:8").host, "fd00::2");
  EXPECT_FALSE(split_host("fd00::2").suffix.has_value());
  EXPECT_EQ(bracketed_host("fd00::2"), "[fd00::2]");
  EXPECT_EQ(bracketed_host("a"), "a");
}

}  // namespace
}  // namespace dist::store
