// The TCPStore implementation of the rendezvous store (an agent's store, or dist-rendezvous)
// against the same contract as every other implementation (store_conformance.h).
#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <memory>
#include <optional>
#include <string>

#include "dist/store/errors.h"
#include "dist/store/server.h"
#include "store/store.h"
#include "store_conformance.h"

namespace dist::agent::testing {
namespace {

using namespace std::chrono_literals;

class TcpBackend final : public StoreBackend {
 public:
  Task<std::unique_ptr<RendezvousStore>> open(boost::asio::io_context& io,
                                              std::string run_id) override {
    store::ClientOptions options;
    options.port = server_.port();
    options.connect_timeout = 10s;
    options.timeout = 10s;
    return open_rendezvous_store(io, TcpStoreTarget{options}, std::move(run_id));
  }

 private:
  store::StoreServerThread server_;
};

INSTANTIATE_TEST_SUITE_P(Tcp, StoreConformance,
                         ::testing::Values(StoreBackendFactory{
                             "tcp", [] { return std::make_unique<TcpBackend>(); }}));

// A second session (the round's watch) to a store that went away gives up within the liveness
// period, not the (here 60 s) connect timeout: an agent stopping meanwhile is not held up.
TEST(TcpRendezvousStore, AnotherSessionToAStoreThatIsGoneFailsWithinTheLivenessPeriod) {
  std::optional<store::StoreServerThread> server(std::in_place);
  store::ClientOptions options;
  options.port = server->port();
  options.connect_timeout = 60s;
  options.timeout = 60s;
  options.keepalive_idle_seconds = 1;
  options.keepalive_interval_seconds = 1;
  options.keepalive_probes = 1;
  boost::asio::io_context io;
  std::exception_ptr failure;
  auto elapsed = std::chrono::steady_clock::duration::zero();
  boost::asio::co_spawn(
      io,
      [&]() -> Task<void> {
        auto store = make_rendezvous_store(io, TcpStoreTarget{options}, "job");
        co_await store->open();
        server.reset();  // the store's host is gone
        const auto start = std::chrono::steady_clock::now();
        try {
          co_await store->open_another();
        } catch (...) {
          elapsed = std::chrono::steady_clock::now() - start;
          throw;
        }
      },
      [&](std::exception_ptr e) { failure = e; });
  io.run();
  ASSERT_TRUE(failure);
  EXPECT_THROW(std::rethrow_exception(failure), store::StoreError);
  EXPECT_LT(elapsed, 30s);  // the liveness period is 2 s; the connect timeout 60 s
}

}  // namespace
}  // namespace dist::agent::testing
