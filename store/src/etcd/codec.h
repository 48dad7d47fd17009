// etcd v3's JSON gateway encoding: keys and values in base64, 64-bit numbers as strings, and the
// gateway's errors ({"code": <gRPC code>, "message": ...}) sorted by what a caller does next.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "dist/store/errors.h"
#include "dist/store/etcd/client.h"

namespace dist::store::etcd::detail {

std::string base64_encode(std::string_view bytes);
// nullopt when `text` is not base64.
std::optional<std::string> base64_decode(std::string_view text);

nlohmann::json encode(const Compare& compare);
nlohmann::json encode(const Op& op);
nlohmann::json encode(const TxnRequest& request);
nlohmann::json encode(const WatchRequest& request);

// The decoders throw DecodeError on a field of the wrong shape.
struct DecodeError {
  std::string what;
};
std::int64_t number(const nlohmann::json& object, const char* field);  // absent: 0
KeyValue decode_kv(const nlohmann::json& kv);
RangeResult decode_range(const nlohmann::json& response);
TxnResult decode_txn(const nlohmann::json& response);
std::int64_t header_revision(const nlohmann::json& response);
// One line of a watch stream's "result".
WatchBatch decode_watch(const nlohmann::json& result);

// An error answered by a member, and what to do about it.
struct GatewayError {
  enum class Action {
    kRetry,           // another member, or the same later: no leader, timed out, overloaded
    kReauthenticate,  // the auth token expired: a new one, then the same request
    kFail,            // the request itself is refused: `code` says why
  };
  Action action = Action::kFail;
  StoreErrc code = StoreErrc::kProtocol;
  std::string message;
};
// From a gateway error object ({"code", "message"} or a stream's {"grpc_code", "message"}).
GatewayError classify(const nlohmann::json& error);

}  // namespace dist::store::etcd::detail
