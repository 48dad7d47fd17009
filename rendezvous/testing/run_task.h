// Runs one coroutine to its end on an io_context, for tests and benchmarks that drive the
// asynchronous store and client from plain functions.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace dist::rendezvous::testing {

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

}  // namespace dist::rendezvous::testing
