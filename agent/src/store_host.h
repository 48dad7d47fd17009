// The store this agent hosts for its job (static: node rank 0; elastic: the agent on the
// endpoint's machine). It is bound before any worker starts, so the process that decides the port
// is the one that holds it.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dist/agent/rendezvous_store.h"
#include "dist/rendezvous/server.h"

namespace dist::agent {

class StoreHost {
 public:
  // Binds `address` ("" for every address of the machine: "::" with IPv4 mapped in, or 0.0.0.0
  // where IPv6 is off) on `port` (0: a free one) and serves. Throws rendezvous::StoreError
  // (kUnavailable) naming the address when it cannot.
  StoreHost(boost::asio::io_context& io, const std::string& address, std::uint16_t port,
            rendezvous::ServerOptions options);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  std::uint16_t port() const;
  std::string bound_address() const;  // for messages
  // Deletes every key outside the agents' namespace: a restart attempt's clean store.
  std::size_t clear_worker_keys();
  void stop();

 private:
  std::optional<rendezvous::StoreServer> server_;
};

// Whether `host` (a name or an address) is this machine: one of its resolved addresses can be
// bound here. Names resolve on Asio's resolver; a name that does not resolve is not this machine.
Task<bool> names_this_machine(std::string host);

}  // namespace dist::agent
