#include "local_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "dist/sdk/process_group.h"

namespace dist::sdk::detail {
namespace {

constexpr const char* kAdvice =
    "set GLOO_SOCKET_IFNAME to the interface the other hosts reach, or DIST_LOCAL_ADDR "
    "(dist-launch --local-addr) to this node's address";

std::string numeric(const sockaddr* address, socklen_t length) {
  char text[NI_MAXHOST] = {};
  if (::getnameinfo(address, length, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0) {
    return "";
  }
  return text;
}

struct Resolved {
  int family;
  sockaddr_storage address;
  socklen_t length;
};

// Every address `host` resolves to, in getaddrinfo's order; throws when it does not resolve.
std::vector<Resolved> resolve(const std::string& host, const char* what) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  if (rc != 0) {
    throw CollectiveError(std::string(what) + " '" + host + "' does not resolve on this host (" +
                          ::gai_strerror(rc) + "): check /etc/hosts or DNS here, or " + kAdvice);
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, &::freeaddrinfo);
  std::vector<Resolved> all;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    Resolved r{a->ai_family, {}, static_cast<socklen_t>(a->ai_addrlen)};
    std::memcpy(&r.address, a->ai_addr, a->ai_addrlen);
    all.push_back(r);
  }
  return all;
}

// The address of interface `name` in `family` (any family when none has one); throws otherwise.
std::string interface_address(const std::string& name, int family) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) {
    throw CollectiveError("cannot list this host's interfaces for GLOO_SOCKET_IFNAME=" + name +
                          ": " + std::strerror(errno));
  }
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, &::freeifaddrs);
  std::string any;
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || name != i->ifa_name) continue;
    const int f = i->ifa_addr->sa_family;
    if (f != AF_INET && f != AF_INET6) continue;
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(i->ifa_addr);
    if (f == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&v6->sin6_addr)) continue;  // needs a scope id
    const std::string text =
        numeric(i->ifa_addr, f == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    if (f == family) return text;
    if (any.empty()) any = text;
  }
  if (any.empty()) {
    throw CollectiveError("GLOO_SOCKET_IFNAME=" + name +
                          ": this host has no such interface with an address (see `ip addr`)");
  }
  return any;
}

std::string first_interface(const char* list) {
  const std::string names = list;
  return names.substr(0, names.find(','));
}

}  // namespace

bool is_loopback(const std::string& numeric_address) {
  in_addr v4{};
  if (::inet_pton(AF_INET, numeric_address.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, numeric_address.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

std::string address_towards(const std::string& destination) {
  const auto addresses = resolve(destination, "MASTER_ADDR");
  std::string errors;
  for (const Resolved& r : addresses) {
    const int fd = ::socket(r.family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    const bool routed =
        ::connect(fd, reinterpret_cast<const sockaddr*>(&r.address), r.length) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    const int error = errno;
    ::close(fd);
    if (routed) return numeric(reinterpret_cast<const sockaddr*>(&local), length);
    errors += " " + numeric(reinterpret_cast<const sockaddr*>(&r.address), r.length) + ": " +
              std::strerror(error) + ";";
  }
  throw CollectiveError("no route from this host to MASTER_ADDR '" + destination + "' (" +
                        errors.substr(1, errors.size() - 2) + "): " + kAdvice);
}

std::string choose_local_address(const std::string& explicit_address,
                                 const std::string& destination) {
  if (!explicit_address.empty()) return explicit_address;
  if (const char* ifname = std::getenv(kSocketIfnameVariable); ifname && *ifname) {
    int family = AF_INET;
    try {
      family = resolve(destination, "MASTER_ADDR").front().family;
    } catch (const CollectiveError&) {
      // The interface decides; the peers' addresses come from the store, not from this name.
    }
    return interface_address(first_interface(ifname), family);
  }
  const std::string route = address_towards(destination);
  if (const char* local = std::getenv(kLocalAddrVariable); local && *local) {
    const auto all = resolve(local, kLocalAddrVariable);
    const int route_family = route.find(':') == std::string::npos ? AF_INET : AF_INET6;
    const Resolved* chosen = &all.front();
    for (const Resolved& r : all) {
      if (r.family == route_family) {
        chosen = &r;
        break;
      }
    }
    const std::string address =
        numeric(reinterpret_cast<const sockaddr*>(&chosen->address), chosen->length);
    // A node name that /etc/hosts maps to 127.0.1.1 on the node itself is no address for the
    // others: the route to the master is.
    if (!is_loopback(address) || is_loopback(route)) return address;
  }
  return route;
}

namespace {

// The address bytes of an IPv4 or IPv6 socket address, for comparisons under a netmask.
std::vector<unsigned char> address_bytes(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    const auto* v4 = &reinterpret_cast<const sockaddr_in*>(a)->sin_addr;
    const auto* p = reinterpret_cast<const unsigned char*>(v4);
    return {p, p + 4};
  }
  const auto* v6 = &reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  const auto* p = reinterpret_cast<const unsigned char*>(v6);
  return {p, p + 16};
}

bool same_network(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b,
                  const std::vector<unsigned char>& mask) {
  if (a.size() != b.size() || a.size() != mask.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if ((a[i] & mask[i]) != (b[i] & mask[i])) return false;
  }
  return true;
}

}  // namespace

std::string interface_with_address(const std::string& address) {
  std::vector<std::vector<unsigned char>> wanted;
  for (const Resolved& r : resolve(address, "the local address")) {
    wanted.push_back(address_bytes(reinterpret_cast<const sockaddr*>(&r.address)));
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::unique_ptr<ifaddrs, decltype(&::freeifaddrs)> owner(list, &::freeifaddrs);
  // An interface's own address first; then the interface whose network holds it (127.0.0.2 is
  // lo's, whose address is 127.0.0.1/8).
  for (const bool exact : {true, false}) {
    for (const ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || !i->ifa_netmask) continue;
      const int f = i->ifa_addr->sa_family;
      if (f != AF_INET && f != AF_INET6) continue;
      const auto mine = address_bytes(i->ifa_addr);
      const auto mask =
          exact ? std::vector<unsigned char>(mine.size(), 0xFF) : address_bytes(i->ifa_netmask);
      for (const auto& w : wanted) {
        if (same_network(w, mine, mask)) return i->ifa_name;
      }
    }
  }
  return "";
}

}  // namespace dist::sdk::detail
