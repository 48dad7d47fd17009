// Runs one coroutine to its end on an io_context, for tests and benchmarks that drive the
// asynchronous store and client from plain functions.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace dist::store::testing {

// The task's result, or its exception rethrown; std::runtime_error when it runs past `limit`.
// Other work on `io` (a lease's keepalive) runs meanwhile and stays queued afterwards.
template <typename T>
T run_task(boost::asio::io_context& io, boost::asio::awaitable<T> task,
           std::chrono::milliseconds limit = std::chrono::minutes(2)) {
  // Shared with the completion handler, which may still run after a task past its limit.
  struct Outcome {
    std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> result;
    std::exception_ptr error;
    bool done = false;
  };
  const auto outcome = std::make_shared<Outcome>();
  if constexpr (std::is_void_v<T>) {
    boost::asio::co_spawn(io, std::move(task), [outcome](std::exception_ptr e) {
      outcome->error = e;
      outcome->done = true;
    });
  } else {
    boost::asio::co_spawn(io, std::move(task), [outcome](std::exception_ptr e, T value) {
      outcome->error = e;
      if (!e) outcome->result.emplace(std::move(value));
      outcome->done = true;
    });
  }
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!outcome->done) {
    if (std::chrono::steady_clock::now() >= end) {
      throw std::runtime_error("a task ran past its limit of " + std::to_string(limit.count()) +
                               " ms");
    }
    if (io.stopped()) io.restart();
    io.run_one_for(std::chrono::milliseconds(100));
  }
  if (outcome->error) std::rethrow_exception(outcome->error);
  if constexpr (!std::is_void_v<T>) return std::move(*outcome->result);
}

// Coroutines run beside a test's own calls (run_task runs them too, as it runs the io_context).
class TaskGroup {
 public:
  explicit TaskGroup(boost::asio::io_context& io) : io_(io), state_(std::make_shared<State>()) {}

  void spawn(std::function<boost::asio::awaitable<void>()> body) {
    ++state_->running;
    boost::asio::co_spawn(io_, std::move(body), [state = state_](std::exception_ptr e) {
      if (e) state->failures.push_back(e);
      --state->running;
    });
  }
  // Runs the io_context until every one has finished; rethrows the first failure.
  void wait(std::chrono::milliseconds limit = std::chrono::minutes(2)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    while (state_->running > 0) {
      if (std::chrono::steady_clock::now() >= end) {
        throw std::runtime_error("tasks ran past their limit of " + std::to_string(limit.count()) +
                                 " ms");
      }
      if (io_.stopped()) io_.restart();
      io_.run_one_for(std::chrono::milliseconds(100));
    }
    auto failures = std::exchange(state_->failures, {});
    if (!failures.empty()) std::rethrow_exception(failures.front());
  }
  int running() const { return state_->running; }

 private:
  struct State {
    int running = 0;
    std::vector<std::exception_ptr> failures;
  };
  boost::asio::io_context& io_;
  std::shared_ptr<State> state_;  // shared with completions that may come after the group
};

}  // namespace dist::store::testing
