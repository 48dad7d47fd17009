// The TCPStore implementation of the rendezvous store (an agent's store, or dist-rendezvous)
// against the same contract as every other implementation (store_conformance.h).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dist/agent/rendezvous_store.h"
#include "dist/rendezvous/server.h"
#include "store_conformance.h"

namespace dist::agent::testing {
namespace {

using namespace std::chrono_literals;

class TcpBackend final : public StoreBackend {
 public:
  Task<std::unique_ptr<RendezvousStore>> open(boost::asio::io_context&,
                                              std::string run_id) override {
    rendezvous::ClientOptions options;
    options.port = server_.port();
    options.connect_timeout = 10s;
    options.timeout = 10s;
    return open_tcp_store(options, std::move(run_id));
  }

 private:
  rendezvous::StoreServerThread server_;
};

INSTANTIATE_TEST_SUITE_P(Tcp, StoreConformance,
                         ::testing::Values(StoreBackendFactory{
                             "tcp", [] { return std::make_unique<TcpBackend>(); }}));

}  // namespace
}  // namespace dist::agent::testing
