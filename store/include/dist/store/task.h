// A coroutine's type, as every asynchronous call of the store library, the etcd client and the
// agent spells it: an Asio awaitable on the caller's io_context.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>

namespace dist::store {

template <typename T = void>
using Task = boost::asio::awaitable<T>;

}  // namespace dist::store
