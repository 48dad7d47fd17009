// Runs a test body on every rank of a Gloo group at once, each rank a thread of this process with
// its own store client, against a real store server (Gloo's own testing style).
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "dist/sdk/process_group.h"
#include "dist/store/server.h"

namespace dist::sdk::testing {

// Fails the test (naming the rank) if body throws on any rank.
inline void on_ranks(int size, const std::function<void(ProcessGroup&)>& body,
                     GlooOptions options = {}) {
  store::StoreServerThread store;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  for (int rank = 0; rank < size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        store::ClientOptions client;
        client.port = store.port();
        auto group = make_gloo_group(store::StoreClient::connect(client), rank, size, options);
        EXPECT_EQ(group->rank(), rank);
        EXPECT_EQ(group->size(), size);
        body(*group);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(rank)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < size; ++rank) {
    EXPECT_EQ(errors[static_cast<std::size_t>(rank)], "") << "rank " << rank;
  }
}

}  // namespace dist::sdk::testing
