#include "dist/store/endpoint.h"

#include <charconv>

namespace dist::store {

std::string bracketed_host(std::string_view host) {
  if (host.find(':') != std::string_view::npos) return "[" + std::string(host) + "]";
  return std::string(host);
}

std::string Endpoint::to_string() const {
  return bracketed_host(host) + ":" + std::to_string(port);
}

HostAndSuffix split_host(std::string_view text) {
  const auto quoted = [&] { return "'" + std::string(text) + "'"; };
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos) throw EndpointError(quoted() + ": missing ]");
    HostAndSuffix out{std::string(text.substr(1, close - 1)), std::nullopt};
    if (close + 1 == text.size()) return out;
    if (text[close + 1] != ':') throw EndpointError(quoted() + ": expected ':' after ]");
    out.suffix = std::string(text.substr(close + 2));
    return out;
  }
  const auto colon = text.find(':');
  if (colon == std::string_view::npos || text.find(':', colon + 1) != std::string_view::npos) {
    return {std::string(text), std::nullopt};  // a name, or a bare IPv6 address
  }
  return {std::string(text.substr(0, colon)), std::string(text.substr(colon + 1))};
}

Endpoint parse_endpoint(std::string_view text, std::optional<std::uint16_t> default_port,
                        bool allow_zero) {
  const auto [host, suffix] = split_host(text);
  if (host.empty()) throw EndpointError("'" + std::string(text) + "' has no host");
  if (!suffix) {
    if (!default_port) throw EndpointError("'" + std::string(text) + "' has no port (HOST:PORT)");
    return {host, *default_port};
  }
  unsigned port = 0;
  const auto [end, error] = std::from_chars(suffix->data(), suffix->data() + suffix->size(), port);
  if (suffix->empty() || error != std::errc() || end != suffix->data() + suffix->size() ||
      port > 65535 || (port == 0 && !allow_zero)) {
    throw EndpointError("'" + std::string(text) + "': '" + *suffix + "' is not a port (" +
                        (allow_zero ? "0" : "1") + "-65535)");
  }
  return {host, static_cast<std::uint16_t>(port)};
}

}  // namespace dist::store
