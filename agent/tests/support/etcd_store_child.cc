// A session that sets one ephemeral key and then lives on its keepalive until it is killed: what a
// node's agent is to the store when its host dies.
//   etcd-store-child <endpoints> <run id> <key> <lease ttl seconds>
// Prints "ready" once the key is set.
#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include <sstream>
#include "dist/store/errors.h"

#include "store/store.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s ENDPOINTS RUN_ID KEY LEASE_TTL_SECONDS\n", argv[0]);
    return 2;
  }
  boost::asio::io_context io;
  dist::agent::EtcdConfig members;
  std::stringstream items(argv[1]);
  for (std::string item; std::getline(items, item, ',');) members.endpoints.push_back(item);
  auto options = dist::agent::etcd_options(members, std::chrono::seconds(std::stoi(argv[4])));
  std::unique_ptr<dist::agent::RendezvousStore> store;
  int rc = 0;
  boost::asio::co_spawn(
      io,
      [&]() -> dist::agent::Task<void> {
        store = dist::agent::make_rendezvous_store(io, options, argv[2]);
        co_await store->open();
        co_await store->set_ephemeral(argv[3], "held by this process");
        std::printf("ready\n");
        std::fflush(stdout);
      },
      [&](std::exception_ptr e) {
        if (!e) return;
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& error) {
          std::fprintf(stderr, "etcd-store-child: %s\n", error.what());
        }
        rc = 1;
        io.stop();
      });
  io.run();  // the lease's keepalive, until killed
  return rc;
}
