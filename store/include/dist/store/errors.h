// Typed errors of the rendezvous store, shared by the server and the client.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace dist::store {

// What went wrong, and what a caller may do about it:
//   kTimeout          the deadline of one call passed; the connection is still usable.
//   kUnavailable      could not connect before the deadline; retry later or check the endpoint.
//   kConnectionLost   the connection broke mid-call; make a new client (calls are not retried).
//   kProtocol         the peer sent bytes that break the protocol; the connection is closed.
//   kLimitExceeded    a key, value, request or the store itself is over a configured limit.
//   kUnauthenticated  the store wants a shared secret and ours is missing or wrong.
//   kNotFound         the key does not exist.
//   kInvalidArgument  the request is well formed but meaningless (ADD to a non-number).
//   kCancelled        this process cancelled the call (it is stopping); never sent by a server.
enum class StoreErrc {
  kTimeout = 1,
  kUnavailable,
  kConnectionLost,
  kProtocol,
  kLimitExceeded,
  kUnauthenticated,
  kNotFound,
  kInvalidArgument,
  kCancelled,
};

std::string_view to_string(StoreErrc code);

class StoreError : public std::runtime_error {
 public:
  StoreError(StoreErrc code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  StoreErrc code() const noexcept { return code_; }

 private:
  StoreErrc code_;
};

}  // namespace dist::store
