// The agent's steps: coroutines on its io_context whose results come back to the caller's
// continuation on the same thread, and whose exceptions become the agent's one failure handler
// (lifecycle/agent.cc turns them into a RendezvousFailed event). The agent's driver and its
// recovery policy (recovery/) launch their steps through the same Steps, so that a step's failure
// means one thing whoever launched it.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without it

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "dist/store/task.h"

namespace dist::agent {

class Steps {
 public:
  Steps(boost::asio::io_context& io, std::function<void(std::exception_ptr)> failed)
      : io_(io), failed_(std::move(failed)) {}
  Steps(const Steps&) = delete;
  Steps& operator=(const Steps&) = delete;

  // Runs `task`; its result goes to `then`, an exception to the failure handler.
  template <typename T, typename Then>
  void launch(store::Task<T> task, Then then) {
    boost::asio::co_spawn(io_, std::move(task), [this, then](std::exception_ptr e, T value) {
      if (e) return failed_(e);
      then(std::move(value));
    });
  }
  template <typename Then>
  void launch(store::Task<void> task, Then then) {
    boost::asio::co_spawn(io_, std::move(task), [this, then](std::exception_ptr e) {
      if (e) return failed_(e);
      then();
    });
  }

  // A call whose outcome changes nothing here (announcing a failure): a failure is worth a line,
  // no more (a cancelled call, not even that).
  void fire_and_forget(store::Task<void> task, std::string what);

 private:
  boost::asio::io_context& io_;
  std::function<void(std::exception_ptr)> failed_;
};

}  // namespace dist::agent
