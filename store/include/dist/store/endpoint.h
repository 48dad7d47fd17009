// A host and a port as dist-launch spells them everywhere (flags, store keys, messages):
// "host:port", "[v6]:port", or a host alone where the port has a default. Parsed and formatted
// here only.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace dist::store {

// Malformed endpoint text; what() quotes it and says what is wrong.
class EndpointError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

struct Endpoint {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  std::uint16_t port = 0;

  // "host:port", "[v6]:port".
  std::string to_string() const;
  bool operator==(const Endpoint&) const = default;
};

// "host" as an endpoint's host part: an IPv6 address in brackets, anything else as it is.
std::string bracketed_host(std::string_view host);

// The host and what follows its ':' (a port, a slot count), before either means anything:
// "host", "host:S", "[v6]", "[v6]:S"; a bare IPv6 address (several ':' and no brackets) is all
// host. Throws EndpointError for a missing ']', or text after ']' that is not ":S".
struct HostAndSuffix {
  std::string host;
  std::optional<std::string> suffix;
};
HostAndSuffix split_host(std::string_view text);

// host[:port]. Without a port: `default_port`, or EndpointError when there is none. The port is
// 1-65535, or 0 too when `allow_zero` (a free port). An empty host is an error.
Endpoint parse_endpoint(std::string_view text, std::optional<std::uint16_t> default_port = {},
                        bool allow_zero = false);

}  // namespace dist::store
