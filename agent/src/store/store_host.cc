#include "store/store.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "dist/store/endpoint.h"
#include "dist/store/errors.h"

namespace dist::agent {

namespace asio = boost::asio;

namespace {

// Every address of the machine: "::" takes IPv4 too, unless this host (or network namespace)
// has no IPv6, where 0.0.0.0 does.
asio::ip::tcp::acceptor bind_any(asio::io_context& io, std::uint16_t port) {
  asio::ip::tcp::acceptor probe(io);
  boost::system::error_code ec;
  probe.open(asio::ip::tcp::v6(), ec);
  return store::StoreServer::bind(io, ec ? "0.0.0.0" : "::", port);
}

}  // namespace

StoreHost::StoreHost(asio::io_context& io, const std::string& address, std::uint16_t port,
                     store::ServerOptions options) {
  server_.emplace(
      io, address.empty() ? bind_any(io, port) : store::StoreServer::bind(io, address, port),
      std::move(options));
  server_->start();
}

StoreHost::~StoreHost() {
  stop();
}

std::uint16_t StoreHost::port() const {
  return server_->local_endpoint().port();
}

std::string StoreHost::bound_address() const {
  const auto endpoint = server_->local_endpoint();
  return store::Endpoint{endpoint.address().to_string(), endpoint.port()}.to_string();
}

std::size_t StoreHost::clear_worker_keys() {
  return server_->erase_keys(
      [](std::string_view key) { return !key.starts_with(store::kAgentKeyPrefix); });
}

void StoreHost::set_agent_keys(const std::string& run_id,
                               std::vector<std::pair<std::string, std::string>> items) {
  const std::string prefix = tcp_job_prefix(run_id);
  for (auto& item : items) item.first.insert(0, prefix);
  server_->multi_set(items);
}

store::ServerStats StoreHost::stats() const {
  return server_->stats();
}

void StoreHost::stop() {
  if (server_) server_->stop();
}

Task<bool> names_this_machine(std::string host) {
  const auto executor = co_await asio::this_coro::executor;
  asio::ip::tcp::resolver resolver(executor);
  boost::system::error_code ec;
  const auto results =
      co_await resolver.async_resolve(host, "", asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return false;
  for (const auto& entry : results) {
    asio::ip::tcp::acceptor probe(executor);
    probe.open(entry.endpoint().protocol(), ec);
    if (!ec) probe.bind(asio::ip::tcp::endpoint(entry.endpoint().address(), 0), ec);
    if (!ec) co_return true;
  }
  co_return false;
}

}  // namespace dist::agent
