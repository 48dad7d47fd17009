// The rendezvous store's contract (agent/src/store/store.h) as one suite of tests for every
// implementation. An implementation joins with a backend and one line in its own test file:
//
//   INSTANTIATE_TEST_SUITE_P(Etcd, StoreConformance,
//                            ::testing::Values(StoreBackendFactory{"etcd", make_etcd_backend}));
//
// and links store_conformance.cc into its test program.
#pragma once

#include <gtest/gtest.h>

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <boost/asio/io_context.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "run_task.h"
#include "store/store.h"

namespace dist::agent::testing {

// One implementation under test, with whatever serves it (a store process, an etcd cluster).
class StoreBackend {
 public:
  virtual ~StoreBackend() = default;
  // A session to the job `run_id`; each test uses its own job.
  virtual Task<std::unique_ptr<RendezvousStore>> open(boost::asio::io_context& io,
                                                      std::string run_id) = 0;
};

struct StoreBackendFactory {
  std::string name;
  std::function<std::unique_ptr<StoreBackend>()> make;  // once per test
};

// Test names end in the backend's name ("Etcd/StoreConformance.SetThenTryGet/etcd" in ctest).
void PrintTo(const StoreBackendFactory& factory, std::ostream* out);

class StoreConformance : public ::testing::TestWithParam<StoreBackendFactory> {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Runs a call of the test's own to its end (other work on the io_context runs meanwhile).
  template <typename T>
  T run(Task<T> task);
  // Runs `body` beside the test's own calls; finish_beside() waits for it and rethrows its
  // failure.
  void beside(std::function<Task<void>()> body) { beside_.spawn(std::move(body)); }
  void finish_beside() { beside_.wait(); }
  // Another session to the test's job.
  std::unique_ptr<RendezvousStore> another();

  boost::asio::io_context io_;  // first: outlives the sessions below
  std::unique_ptr<StoreBackend> backend_;
  std::string run_id_;
  std::unique_ptr<RendezvousStore> store_;

 private:
  store::testing::TaskGroup beside_{io_};
};

template <typename T>
T StoreConformance::run(Task<T> task) {
  return store::testing::run_task(io_, std::move(task));
}

}  // namespace dist::agent::testing
