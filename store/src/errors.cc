#include "dist/store/errors.h"

#include "dist/store/limits.h"

#include <sys/resource.h>

#include <fstream>

namespace dist::store {

std::string_view to_string(StoreErrc code) {
  switch (code) {
    case StoreErrc::kTimeout:
      return "timeout";
    case StoreErrc::kUnavailable:
      return "unavailable";
    case StoreErrc::kConnectionLost:
      return "connection lost";
    case StoreErrc::kProtocol:
      return "protocol error";
    case StoreErrc::kLimitExceeded:
      return "limit exceeded";
    case StoreErrc::kUnauthenticated:
      return "unauthenticated";
    case StoreErrc::kNotFound:
      return "not found";
    case StoreErrc::kInvalidArgument:
      return "invalid argument";
    case StoreErrc::kCancelled:
      return "cancelled";
  }
  return "unknown error";
}

void raise_open_file_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  std::ifstream nr_open("/proc/sys/fs/nr_open");
  rlim_t most = 0;
  if (nr_open >> most && most > limit.rlim_max) {
    const rlimit raised{most, most};
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return;  // else not allowed: the hard limit holds
  }
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

namespace {
// Room in a connection's budget beyond one request and one reply: read chunks, bookkeeping.
constexpr std::uint64_t kConnectionSlackBytes = 256 * 1024;
}  // namespace

std::string StoreLimits::validate() const {
  if (max_key_bytes == 0 || max_value_bytes == 0 || max_keys_per_request == 0 ||
      max_connections == 0) {
    return "store limits must be positive";
  }
  if (max_request_bytes < max_key_bytes + max_value_bytes + 64) {
    return "max request bytes (" + std::to_string(max_request_bytes) +
           ") must hold one maximal key and value (" +
           std::to_string(max_key_bytes + max_value_bytes + 64) + ")";
  }
  if (max_connection_bytes < max_request_bytes + max_value_bytes + kConnectionSlackBytes) {
    return "max connection bytes (" + std::to_string(max_connection_bytes) +
           ") must hold one maximal request and one maximal reply (" +
           std::to_string(max_request_bytes + max_value_bytes + kConnectionSlackBytes) + ")";
  }
  if (max_reply_backlog_bytes + max_value_bytes > max_connection_bytes) {
    return "max reply backlog bytes (" + std::to_string(max_reply_backlog_bytes) +
           ") plus one maximal value must fit in max connection bytes (" +
           std::to_string(max_connection_bytes) +
           "), or a slow reader is closed before reads pause";
  }
  return {};
}

}  // namespace dist::store
