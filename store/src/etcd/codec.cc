#include "codec.h"

#include <array>
#include <charconv>

namespace dist::store::etcd::detail {
namespace {

using nlohmann::json;

constexpr std::string_view kAlphabet =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

// gRPC status codes (grpc/status.h), as the gateway reports them.
enum GrpcCode : int {
  kCancelledCode = 1,
  kUnknownCode = 2,
  kInvalidArgumentCode = 3,
  kDeadlineExceededCode = 4,
  kNotFoundCode = 5,
  kPermissionDeniedCode = 7,
  kResourceExhaustedCode = 8,
  kFailedPreconditionCode = 9,
  kAbortedCode = 10,
  kOutOfRangeCode = 11,
  kInternalCode = 13,
  kUnavailableCode = 14,
  kUnauthenticatedCode = 16,
};

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

const char* target_name(Compare::Target t) {
  switch (t) {
    case Compare::Target::kVersion:
      return "VERSION";
    case Compare::Target::kCreateRevision:
      return "CREATE";
    case Compare::Target::kModRevision:
      return "MOD";
    case Compare::Target::kValue:
      return "VALUE";
  }
  return "VALUE";
}

const char* result_name(Compare::Result r) {
  switch (r) {
    case Compare::Result::kEqual:
      return "EQUAL";
    case Compare::Result::kGreater:
      return "GREATER";
    case Compare::Result::kLess:
      return "LESS";
    case Compare::Result::kNotEqual:
      return "NOT_EQUAL";
  }
  return "EQUAL";
}

std::string bytes_field(const json& object, const char* field) {
  const auto it = object.find(field);
  if (it == object.end()) return {};
  if (!it->is_string()) throw DecodeError{std::string(field) + " is not a string"};
  auto decoded = base64_decode(it->get_ref<const std::string&>());
  if (!decoded) throw DecodeError{std::string(field) + " is not base64"};
  return std::move(*decoded);
}

OpResult decode_op_result(const json& response) {
  OpResult r;
  if (const auto range = response.find("response_range"); range != response.end()) {
    auto decoded = decode_range(*range);
    r.kvs = std::move(decoded.kvs);
    r.count = decoded.count;
  } else if (const auto del = response.find("response_delete_range"); del != response.end()) {
    r.deleted = number(*del, "deleted");
  } else if (const auto txn = response.find("response_txn"); txn != response.end()) {
    auto decoded = decode_txn(*txn);
    r.succeeded = decoded.succeeded;
    r.results = std::move(decoded.results);
  }
  return r;
}

}  // namespace

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned n = static_cast<unsigned char>(bytes[i]) << 16 |
                       static_cast<unsigned char>(bytes[i + 1]) << 8 |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += kAlphabet[n & 63];
  }
  if (i + 1 == bytes.size()) {
    const unsigned n = static_cast<unsigned char>(bytes[i]) << 16;
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const unsigned n =
        static_cast<unsigned char>(bytes[i]) << 16 | static_cast<unsigned char>(bytes[i + 1]) << 8;
    out += kAlphabet[n >> 18];
    out += kAlphabet[(n >> 12) & 63];
    out += kAlphabet[(n >> 6) & 63];
    out += '=';
  }
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  static const auto table = [] {
    std::array<int, 256> t{};
    t.fill(-1);
    for (std::size_t i = 0; i < kAlphabet.size(); ++i) {
      t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int>(i);
    }
    return t;
  }();
  if (text.size() % 4 != 0) return std::nullopt;
  std::size_t padding = 0;
  while (padding < 2 && padding < text.size() && text[text.size() - 1 - padding] == '=') {
    ++padding;
  }
  std::string out;
  out.reserve(text.size() / 4 * 3);
  unsigned bits = 0;
  int count = 0;
  for (std::size_t i = 0; i < text.size() - padding; ++i) {
    const int v = table[static_cast<unsigned char>(text[i])];
    if (v < 0) return std::nullopt;
    bits = bits << 6 | static_cast<unsigned>(v);
    if (++count == 4) {
      out += static_cast<char>(bits >> 16);
      out += static_cast<char>(bits >> 8);
      out += static_cast<char>(bits);
      bits = 0;
      count = 0;
    }
  }
  if (count == 3) {
    out += static_cast<char>(bits >> 10);
    out += static_cast<char>(bits >> 2);
  } else if (count == 2) {
    out += static_cast<char>(bits >> 4);
  } else if (count != 0) {
    return std::nullopt;
  }
  return out;
}

json encode(const Compare& c) {
  json j{{"key", base64_encode(c.key)},
         {"target", target_name(c.target)},
         {"result", result_name(c.result)}};
  switch (c.target) {
    case Compare::Target::kVersion:
      j["version"] = std::to_string(c.number);
      break;
    case Compare::Target::kCreateRevision:
      j["create_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kModRevision:
      j["mod_revision"] = std::to_string(c.number);
      break;
    case Compare::Target::kValue:
      j["value"] = base64_encode(c.value);
      break;
  }
  return j;
}

json encode(const Op& op) {
  if (op.kind == Op::Kind::kTxn) return json{{"request_txn", encode(*op.txn)}};
  json j{{"key", base64_encode(op.key)}};
  if (!op.range_end.empty()) j["range_end"] = base64_encode(op.range_end);
  switch (op.kind) {
    case Op::Kind::kRange:
      if (op.count_only) j["count_only"] = true;
      if (op.revision != 0) j["revision"] = std::to_string(op.revision);
      return json{{"request_range", std::move(j)}};
    case Op::Kind::kPut:
      if (op.ignore_value) {
        j["ignore_value"] = true;
      } else {
        j["value"] = base64_encode(op.value);
      }
      if (op.ignore_lease) {
        j["ignore_lease"] = true;
      } else if (op.lease != 0) {
        j["lease"] = std::to_string(op.lease);
      }
      return json{{"request_put", std::move(j)}};
    case Op::Kind::kDeleteRange:
      return json{{"request_delete_range", std::move(j)}};
    case Op::Kind::kTxn:
      break;  // above
  }
  return {};
}

json encode(const TxnRequest& request) {
  json compare = json::array(), success = json::array(), failure = json::array();
  for (const auto& c : request.compare) compare.push_back(encode(c));
  for (const auto& op : request.success) success.push_back(encode(op));
  for (const auto& op : request.failure) failure.push_back(encode(op));
  return json{{"compare", std::move(compare)},
              {"success", std::move(success)},
              {"failure", std::move(failure)}};
}

json encode(const WatchRequest& request) {
  json j{{"key", base64_encode(request.key)}};
  if (!request.range_end.empty()) j["range_end"] = base64_encode(request.range_end);
  if (request.start_revision != 0) j["start_revision"] = std::to_string(request.start_revision);
  json filters = json::array();
  if (request.no_put) filters.push_back("NOPUT");
  if (request.no_delete) filters.push_back("NODELETE");
  if (!filters.empty()) j["filters"] = std::move(filters);
  return json{{"create_request", std::move(j)}};
}

std::int64_t number(const json& object, const char* field) {
  const auto it = object.find(field);
  if (it == object.end()) return 0;
  if (it->is_number_integer()) return it->get<std::int64_t>();
  if (!it->is_string()) throw DecodeError{std::string(field) + " is not a number"};
  const auto& text = it->get_ref<const std::string&>();
  std::int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    throw DecodeError{std::string(field) + " is not a number: " + text};
  }
  return value;
}

KeyValue decode_kv(const json& kv) {
  KeyValue r;
  r.key = bytes_field(kv, "key");
  r.value = bytes_field(kv, "value");
  r.create_revision = number(kv, "create_revision");
  r.mod_revision = number(kv, "mod_revision");
  r.version = number(kv, "version");
  r.lease = number(kv, "lease");
  return r;
}

std::int64_t header_revision(const json& response) {
  const auto header = response.find("header");
  return header == response.end() ? 0 : number(*header, "revision");
}

RangeResult decode_range(const json& response) {
  RangeResult r;
  r.revision = header_revision(response);
  r.count = number(response, "count");
  if (const auto kvs = response.find("kvs"); kvs != response.end()) {
    for (const auto& kv : *kvs) r.kvs.push_back(decode_kv(kv));
  }
  return r;
}

TxnResult decode_txn(const json& response) {
  TxnResult r;
  r.revision = header_revision(response);
  r.succeeded = response.value("succeeded", false);
  if (const auto responses = response.find("responses"); responses != response.end()) {
    for (const auto& op : *responses) r.results.push_back(decode_op_result(op));
  }
  return r;
}

WatchBatch decode_watch(const json& result) {
  WatchBatch batch;
  batch.compact_revision = number(result, "compact_revision");
  if (const auto events = result.find("events"); events != result.end()) {
    for (const auto& e : *events) {
      WatchEvent event;
      event.type =
          e.value("type", "PUT") == "DELETE" ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
      if (const auto kv = e.find("kv"); kv != e.end()) event.kv = decode_kv(*kv);
      batch.events.push_back(std::move(event));
    }
  }
  return batch;
}

GatewayError classify(const json& error) {
  // A stream that failed before its first message answers {"error": {...}} with its status.
  if (const auto inner = error.find("error"); inner != error.end() && inner->is_object()) {
    return classify(*inner);
  }
  GatewayError e;
  if (const auto message = error.find("message"); message != error.end() && message->is_string()) {
    e.message = message->get<std::string>();
  } else {
    e.message = "(no message)";
  }
  const int code = static_cast<int>(error.contains("grpc_code") ? number(error, "grpc_code")
                                                                : number(error, "code"));
  const auto fail = [&](StoreErrc c) {
    e.action = GatewayError::Action::kFail;
    e.code = c;
    return e;
  };
  const auto retry = [&] {
    e.action = GatewayError::Action::kRetry;
    e.code = StoreErrc::kUnavailable;
    return e;
  };
  switch (code) {
    case kInvalidArgumentCode:
      if (contains(e.message, "auth store is old")) return retry();  // the member catches up
      if (contains(e.message, "too large") || contains(e.message, "too many operations")) {
        return fail(StoreErrc::kLimitExceeded);
      }
      if (contains(e.message, "authentication failed") || contains(e.message, "user name")) {
        return fail(StoreErrc::kUnauthenticated);
      }
      return fail(StoreErrc::kInvalidArgument);
    case kNotFoundCode:
    case kOutOfRangeCode:  // a compacted revision
      return fail(StoreErrc::kNotFound);
    case kPermissionDeniedCode:
    case kFailedPreconditionCode:  // "authentication is not enabled", "not capable"
      return fail(StoreErrc::kUnauthenticated);
    case kResourceExhaustedCode:
      // "too many requests" is a member behind on applying; "database space exceeded" stays.
      return contains(e.message, "too many requests") ? retry() : fail(StoreErrc::kLimitExceeded);
    case kUnauthenticatedCode:
      if (contains(e.message, "invalid auth token")) {
        e.action = GatewayError::Action::kReauthenticate;
        e.code = StoreErrc::kUnauthenticated;
        return e;
      }
      return fail(StoreErrc::kUnauthenticated);
    case kCancelledCode:
    case kUnknownCode:
    case kDeadlineExceededCode:
    case kAbortedCode:
    case kInternalCode:
    case kUnavailableCode:
      return retry();
    default:
      return fail(StoreErrc::kProtocol);
  }
}

}  // namespace dist::store::etcd::detail
