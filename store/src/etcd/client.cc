#include "dist/store/etcd/client.h"

#include <algorithm>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/field.hpp>
#include <charconv>
#include <random>

#include "codec.h"
#include "connection.h"
#include "dist/store/endpoint.h"
#include "dist/store/errors.h"

namespace dist::store::etcd {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using detail::Endpoint;
using detail::GatewayError;
using nlohmann::json;

constexpr std::uint16_t kDefaultPort = 2379;  // etcd's client port
// Backoff between rounds of failed members: a leader election takes about a second.
constexpr std::chrono::milliseconds kFirstBackoff{50};
constexpr std::chrono::milliseconds kMaxBackoff{1'000};
constexpr std::size_t kMaxIdleConnectionsPerMember = 8;
constexpr const char* kAuthenticatePath = "/v3/auth/authenticate";

// A key for a message: printable bytes as they are, others as \xNN.
std::string quote(std::string_view key) {
  std::string out = "'";
  for (const char c : key) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[static_cast<unsigned char>(c) >> 4];
      out += kHex[static_cast<unsigned char>(c) & 15];
    }
  }
  return out + "'";
}

std::string milliseconds_text(std::chrono::milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

StoreError invalid(const std::string& message) {
  return StoreError(StoreErrc::kInvalidArgument, "etcd: " + message);
}

// "host:port", "[v6]:port", "http(s)://..." ; the scheme goes to `scheme` ("" when absent).
Endpoint parse_endpoint(std::string text, std::string& scheme) {
  const std::string given = text;
  scheme.clear();
  if (const auto at = text.find("://"); at != std::string::npos) {
    scheme = text.substr(0, at);
    text.erase(0, at + 3);
    if (scheme != "http" && scheme != "https") {
      throw invalid("endpoint '" + given + "': the scheme must be http or https");
    }
  }
  while (!text.empty() && text.back() == '/') text.pop_back();
  if (text.find(':') != text.rfind(':') && text.front() != '[') {  // "::1:2379": which is the port?
    throw invalid("endpoint '" + given + "': write an IPv6 address as [address]:port");
  }
  store::Endpoint parsed;
  try {
    parsed = store::parse_endpoint(text, kDefaultPort);
  } catch (const store::EndpointError& error) {
    throw invalid("endpoint " + std::string(error.what()));
  }
  Endpoint e;
  e.host = parsed.host;
  e.port = std::to_string(parsed.port);
  e.text = parsed.to_string();
  return e;
}

std::unique_ptr<asio::ssl::context> make_tls(const ClientOptions& o) {
  auto tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
  tls->set_verify_mode(asio::ssl::verify_peer);
  const auto load = [](const char* what, const std::string& file, auto&& f) {
    try {
      f();
    } catch (const boost::system::system_error& e) {
      throw invalid(std::string("cannot load the TLS ") + what + " '" + file + "': " + e.what());
    }
  };
  if (o.ca_file.empty()) {
    load("system CAs", "", [&] { tls->set_default_verify_paths(); });
  } else {
    load("cacert", o.ca_file, [&] { tls->load_verify_file(o.ca_file); });
  }
  if (!o.cert_file.empty()) {
    load("cert", o.cert_file, [&] { tls->use_certificate_chain_file(o.cert_file); });
    load("key", o.key_file,
         [&] { tls->use_private_key_file(o.key_file, asio::ssl::context::pem); });
  }
  return tls;
}

}  // namespace

void Cancellation::cancel() {
  cancelled_ = true;
  auto stops = std::move(stops_);
  stops_.clear();
  for (auto& [id, stop] : stops) stop();
}

Cancellation::Registration Cancellation::on_cancel(std::function<void()> stop) {
  const auto id = next_id_++;
  if (cancelled_) {
    stop();
  } else {
    stops_.emplace(id, std::move(stop));
  }
  return Registration(*this, id);
}

Compare Compare::value_equals(std::string key, std::string value) {
  Compare c;
  c.key = std::move(key);
  c.target = Target::kValue;
  c.value = std::move(value);
  return c;
}

Compare Compare::revision_equals(Target target, std::string key, std::int64_t revision) {
  Compare c;
  c.key = std::move(key);
  c.target = target;
  c.number = revision;
  return c;
}

Op Op::range(std::string key) {
  Op op;
  op.kind = Kind::kRange;
  op.key = std::move(key);
  return op;
}

Op Op::put(std::string key, std::string value, std::int64_t lease) {
  Op op;
  op.kind = Kind::kPut;
  op.key = std::move(key);
  op.value = std::move(value);
  op.lease = lease;
  return op;
}

Op Op::erase(std::string key) {
  Op op;
  op.kind = Kind::kDeleteRange;
  op.key = std::move(key);
  return op;
}

Op Op::nested(TxnRequest txn) {
  Op op;
  op.kind = Kind::kTxn;
  op.txn = std::make_shared<const TxnRequest>(std::move(txn));
  return op;
}

std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

class Client::Impl {
 public:
  Impl(asio::io_context::executor_type executor, ClientOptions options,
       std::vector<Endpoint> endpoints, std::unique_ptr<asio::ssl::context> tls)
      : executor_(executor),
        options_(std::move(options)),
        endpoints_(std::move(endpoints)),
        tls_(std::move(tls)),
        idle_(endpoints_.size()) {
    if (options_.spread_over_members) {
      static std::minstd_rand spread{std::random_device{}()};
      preferred_ = std::uniform_int_distribution<std::size_t>(0, endpoints_.size() - 1)(spread);
    }
  }

  // One request and its answer, through whichever member answers first, starting `skip`
  // members past the preferred one.
  Task<json> call(std::string path, json body, std::string what, Cancellation& cancel,
                  Deadline deadline, std::size_t skip = 0);

  Task<void> authenticate_if_needed(Cancellation& cancel, Deadline deadline);
  detail::Request make_request(const std::string& path, std::string body,
                               std::size_t endpoint) const;
  // What an error answer from `endpoint` means: a reason to try another member (returned), or
  // a refusal (thrown).
  std::string retry_reason(const json& error, std::size_t endpoint, const std::string& what);
  // A member that failed: calls start elsewhere, and its idle connections are dropped.
  void avoid(std::size_t endpoint) {
    idle_[endpoint].clear();
    if (preferred_ == endpoint) preferred_ = (endpoint + 1) % endpoints_.size();
  }

  StoreError cancelled(const std::string& what) const {
    return StoreError(StoreErrc::kCancelled, describe() + ": " + what + ": cancelled");
  }
  std::string describe() const {
    std::string out = "etcd ";
    for (std::size_t i = 0; i < endpoints_.size(); ++i) {
      out += (i ? "," : "") + endpoints_[i].text;
    }
    return out;
  }

  asio::io_context::executor_type executor_;
  ClientOptions options_;
  std::vector<Endpoint> endpoints_;
  std::unique_ptr<asio::ssl::context> tls_;
  std::vector<std::vector<std::unique_ptr<detail::Connection>>> idle_;  // per member
  std::size_t preferred_ = 0;
  std::string token_;         // etcd's auth token, once authenticated
  bool auth_enabled_ = true;  // false once etcd said authentication is not enabled
};

namespace {

// One call's way through the members: which to ask, how long one exchange may take, and when to
// give up.
class Attempts {
 public:
  Attempts(Client::Impl& client, std::string what, Deadline deadline, std::size_t skip = 0)
      : client_(client),
        what_(std::move(what)),
        deadline_(deadline),
        give_up_(Clock::now() + client.options_.unavailable_timeout),
        endpoint_((client.preferred_ + skip) % client.endpoints_.size()) {}

  std::size_t endpoint() const { return endpoint_; }
  Clock::time_point exchange_deadline() const {
    auto t = std::min(Clock::now() + client_.options_.request_timeout, give_up_);
    return deadline_ ? std::min(t, *deadline_) : t;
  }

  // After a failure at endpoint(): the next member, after a backoff once every member failed in
  // turn. Throws kUnavailable past unavailable_timeout, kTimeout past the call's deadline.
  Task<void> failed(std::string reason, Cancellation& cancel) {
    last_ = client_.endpoints_[endpoint_].text + ": " + reason;
    client_.avoid(endpoint_);
    endpoint_ = (endpoint_ + 1) % client_.endpoints_.size();
    // A cancel that came after the failure, before this coroutine resumed, stopped nothing (the
    // timer below was not armed yet): it must not cost a backoff.
    if (cancel.cancelled()) throw client_.cancelled(what_);
    if (++failures_ % client_.endpoints_.size() == 0) {
      auto wake = std::min(Clock::now() + backoff_, give_up_);
      if (deadline_) wake = std::min(wake, *deadline_);
      asio::steady_timer timer(client_.executor_, wake);
      const auto stop = cancel.on_cancel([&timer] { timer.cancel(); });
      boost::system::error_code ignored;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
      backoff_ = std::min(backoff_ * 2, kMaxBackoff);
    }
    if (cancel.cancelled()) throw client_.cancelled(what_);
    const auto now = Clock::now();
    if (deadline_ && now >= *deadline_) {
      throw StoreError(StoreErrc::kTimeout,
                       client_.describe() + ": " + what_ + ": its deadline passed (" + last_ + ")");
    }
    if (now >= give_up_) {
      throw StoreError(StoreErrc::kUnavailable,
                       client_.describe() + ": " + what_ +
                           ": no member answered with a leader in " +
                           milliseconds_text(client_.options_.unavailable_timeout) +
                           " (last: " + last_ + "); " + what_to_check());
    }
  }

 private:
  // No route from this host to the members' network (its own link down, its routes gone:
  // ENETUNREACH) is this host's to fix, not the members'. ("No route to host", EHOSTUNREACH, is
  // also what a member's host that is down gives on the same subnet: the members' to check.)
  std::string what_to_check() const {
    return last_.find("Network is unreachable") != std::string::npos
               ? "this host has no route to the members: check its own network link and routes "
                 "(a majority of them may well be up)"
               : "check that a majority of the etcd members is up and reachable";
  }

  Client::Impl& client_;
  std::string what_;
  Deadline deadline_;
  Clock::time_point give_up_;
  std::size_t endpoint_;
  std::size_t failures_ = 0;
  std::chrono::milliseconds backoff_ = kFirstBackoff;
  std::string last_;
};

json parse_answer(const std::string& body, unsigned status, const std::string& where) {
  try {
    return json::parse(body);
  } catch (const json::exception&) {
    if (body.find("CommonName of client") != std::string::npos) {
      throw StoreError(StoreErrc::kUnauthenticated,
                       where +
                           ": with authentication on, etcd's JSON gateway refuses a client "
                           "certificate with a Common Name; use one without (the user comes from "
                           "user and password_file)");
    }
    throw StoreError(StoreErrc::kProtocol,
                     where + ": the member answered HTTP " + std::to_string(status) +
                         " with something other than etcd's JSON ('" + body.substr(0, 80) +
                         "'); is this an etcd v3 client URL?");
  }
}

// A decoder's result, or kProtocol naming the member and the call.
template <typename F>
auto decoded(const Client::Impl& client, const std::string& what, F&& f) {
  try {
    return f();
  } catch (const detail::DecodeError& e) {
    throw StoreError(StoreErrc::kProtocol,
                     client.describe() + ": " + what + ": unexpected answer: " + e.what);
  } catch (const json::exception& e) {
    throw StoreError(StoreErrc::kProtocol,
                     client.describe() + ": " + what + ": unexpected answer: " + e.what());
  }
}

}  // namespace

detail::Request Client::Impl::make_request(const std::string& path, std::string body,
                                           std::size_t endpoint) const {
  detail::Request request{http::verb::post, path, 11};
  request.set(http::field::host, endpoints_[endpoint].text);
  request.set(http::field::content_type, "application/json");
  // The gateway passes this on as gRPC metadata: a member without a leader refuses the call at
  // once (and ends a watch), instead of holding it until its own timeout.
  request.set("Grpc-Metadata-hasleader", "true");
  if (!token_.empty() && path != kAuthenticatePath) {
    request.set(http::field::authorization, token_);
  }
  request.keep_alive(true);
  request.body() = std::move(body);
  request.prepare_payload();
  return request;
}

std::string Client::Impl::retry_reason(const json& error, std::size_t endpoint,
                                       const std::string& what) {
  const auto e = decoded(*this, what, [&] { return detail::classify(error); });
  switch (e.action) {
    case GatewayError::Action::kRetry:
      return e.message;
    case GatewayError::Action::kReauthenticate:
      token_.clear();
      return e.message;
    case GatewayError::Action::kFail:
      break;
  }
  std::string hint;
  if (e.code == StoreErrc::kUnauthenticated) {
    hint = "; check --rdzv-conf user and password_file, and the user's role on the key";
  } else if (e.code == StoreErrc::kLimitExceeded) {
    hint = "; etcd's --max-request-bytes, --max-txn-ops and --quota-backend-bytes bound requests";
  }
  throw StoreError(e.code,
                   "etcd " + endpoints_[endpoint].text + ": " + what + ": " + e.message + hint);
}

Task<void> Client::Impl::authenticate_if_needed(Cancellation& cancel, Deadline deadline) {
  if (options_.user.empty() || !token_.empty() || !auth_enabled_) co_return;
  try {
    // Built outside the co_await: GCC 12 cannot keep a braced list of literals in a coroutine.
    json body{{"name", options_.user}, {"password", options_.password}};
    const auto what = "authenticate as user '" + options_.user + "'";
    const auto answer = co_await call(kAuthenticatePath, std::move(body), what, cancel, deadline);
    token_ = answer.value("token", "");
  } catch (const StoreError& e) {
    // As etcd's own client: a user given to a cluster without authentication is no error.
    if (std::string_view(e.what()).find("authentication is not enabled") == std::string::npos) {
      throw;
    }
    auth_enabled_ = false;
  }
}

Task<json> Client::Impl::call(std::string path, json body, std::string what, Cancellation& cancel,
                              Deadline deadline, std::size_t skip) {
  Attempts attempts(*this, what, deadline, skip);
  const std::string payload = body.dump();
  bool fresh_connection_tried = false;
  for (;;) {
    if (cancel.cancelled()) throw cancelled(what);
    if (path != kAuthenticatePath) co_await authenticate_if_needed(cancel, deadline);
    const std::size_t endpoint = attempts.endpoint();
    std::string failure;
    bool reused = false;
    bool timed_out = false;
    try {
      std::unique_ptr<detail::Connection> connection;
      if (!idle_[endpoint].empty()) {
        connection = std::move(idle_[endpoint].back());
        idle_[endpoint].pop_back();
        reused = true;
      } else {
        connection = std::make_unique<detail::Connection>(executor_, tls_.get());
        co_await connection->connect(endpoints_[endpoint], attempts.exchange_deadline(), cancel);
      }
      auto request = make_request(path, payload, endpoint);
      const auto response =
          co_await connection->exchange(request, attempts.exchange_deadline(), cancel);
      if (connection->reusable() && idle_[endpoint].size() < kMaxIdleConnectionsPerMember) {
        idle_[endpoint].push_back(std::move(connection));
      }
      const auto where = "etcd " + endpoints_[endpoint].text + ": " + what;
      auto answer = parse_answer(response.body(), response.result_int(), where);
      // A streamed answer (lease keepalive) reports its error inside a 200.
      const auto streamed_error = answer.find("error");
      if (response.result() != http::status::ok) {
        failure = retry_reason(answer, endpoint, what);
      } else if (streamed_error != answer.end() && streamed_error->is_object()) {
        failure = retry_reason(*streamed_error, endpoint, what);
      } else {
        preferred_ = endpoint;
        co_return answer;
      }
    } catch (const detail::TransportError& e) {
      failure = e.reason;
      timed_out = e.timed_out;
    }
    // An idle connection the member closed meanwhile says nothing about the member: once per
    // call, try it again on a new connection. One it left unanswered does: a hung member would
    // cost a second timeout.
    if (reused && !timed_out && !fresh_connection_tried) {
      fresh_connection_tried = true;
      idle_[endpoint].clear();
      continue;
    }
    co_await attempts.failed(std::move(failure), cancel);
  }
}

Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

std::shared_ptr<Client> Client::create(asio::io_context& io, ClientOptions options) {
  if (options.endpoints.empty()) throw invalid("no endpoint given");
  if (options.request_timeout.count() <= 0 || options.unavailable_timeout.count() <= 0) {
    throw invalid("request_timeout and unavailable_timeout must be positive");
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    throw invalid("a client cert needs its key, and a key its cert");
  }
  if (!options.password.empty() && options.user.empty()) {
    throw invalid("a password was given without a user");
  }
  std::vector<Endpoint> endpoints;
  std::string tls_scheme;  // the scheme given explicitly ("": none)
  for (const auto& text : options.endpoints) {
    std::string scheme;
    endpoints.push_back(parse_endpoint(text, scheme));
    if (!scheme.empty() && !tls_scheme.empty() && scheme != tls_scheme) {
      throw invalid("endpoints mix http:// and https:// ('" + text + "')");
    }
    if (!scheme.empty()) tls_scheme = scheme;
  }
  const bool tls_files = !options.ca_file.empty() || !options.cert_file.empty();
  if (tls_scheme == "http" && tls_files) {
    throw invalid("TLS files were given for http:// endpoints; use https://");
  }
  auto tls = (tls_scheme == "https" || tls_files) ? make_tls(options) : nullptr;
  auto impl = std::make_shared<Impl>(io.get_executor(), std::move(options), std::move(endpoints),
                                     std::move(tls));
  return std::shared_ptr<Client>(new Client(std::move(impl)));
}

asio::io_context::executor_type Client::executor() const {
  return impl_->executor_;
}
std::string Client::describe() const {
  return impl_->describe();
}

Task<RangeResult> Client::range(std::string key, Cancellation& cancel, Deadline deadline,
                                Read read) {
  const auto impl = impl_;
  const auto what = "read " + quote(key);
  json body{{"key", detail::base64_encode(key)}};
  if (read == Read::kSerializable) body["serializable"] = true;
  const auto answer = co_await impl->call("/v3/kv/range", std::move(body), what, cancel, deadline);
  co_return decoded(*impl, what, [&] { return detail::decode_range(answer); });
}

Task<std::int64_t> Client::put(std::string key, std::string value, std::int64_t lease,
                               Cancellation& cancel, Deadline deadline) {
  const auto impl = impl_;
  const auto what = "write " + quote(key);
  json body{{"key", detail::base64_encode(key)}, {"value", detail::base64_encode(value)}};
  if (lease != 0) body["lease"] = std::to_string(lease);
  const auto answer = co_await impl->call("/v3/kv/put", std::move(body), what, cancel, deadline);
  co_return decoded(*impl, what, [&] { return detail::header_revision(answer); });
}

Task<std::int64_t> Client::delete_key(std::string key, Cancellation& cancel, Deadline deadline) {
  const auto impl = impl_;
  const auto what = "delete " + quote(key);
  json body{{"key", detail::base64_encode(key)}};
  const auto answer =
      co_await impl->call("/v3/kv/deleterange", std::move(body), what, cancel, deadline);
  co_return decoded(*impl, what, [&] { return detail::number(answer, "deleted"); });
}

Task<TxnResult> Client::txn(TxnRequest request, Cancellation& cancel, Deadline deadline) {
  const auto impl = impl_;
  std::string what = "transaction";
  if (!request.compare.empty()) {
    what += " on " + quote(request.compare.front().key);
  } else if (!request.success.empty()) {
    what += " on " + quote(request.success.front().key);
  }
  const auto answer =
      co_await impl->call("/v3/kv/txn", detail::encode(request), what, cancel, deadline);
  co_return decoded(*impl, what, [&] { return detail::decode_txn(answer); });
}

Task<Lease> Client::lease_grant(std::chrono::seconds ttl, Cancellation& cancel, Deadline deadline) {
  const auto impl = impl_;
  const std::string what = "grant a lease";
  json body{{"TTL", std::to_string(ttl.count())}};
  const auto answer =
      co_await impl->call("/v3/lease/grant", std::move(body), what, cancel, deadline);
  co_return decoded(*impl, what, [&] {
    return Lease{detail::number(answer, "ID"), std::chrono::seconds(detail::number(answer, "TTL"))};
  });
}

Task<std::chrono::seconds> Client::lease_keep_alive(std::int64_t id, Cancellation& cancel,
                                                    Deadline deadline, std::size_t skip) {
  const auto impl = impl_;
  const auto what = "renew lease " + std::to_string(id);
  json body{{"ID", std::to_string(id)}};
  const auto answer =
      co_await impl->call("/v3/lease/keepalive", std::move(body), what, cancel, deadline, skip);
  co_return decoded(*impl, what, [&] {
    return std::chrono::seconds(detail::number(answer.at("result"), "TTL"));
  });
}

Task<void> Client::lease_revoke(std::int64_t id, Cancellation& cancel, Deadline deadline) {
  const auto impl = impl_;
  try {
    json body{{"ID", std::to_string(id)}};
    const auto what = "revoke lease " + std::to_string(id);
    co_await impl->call("/v3/lease/revoke", std::move(body), what, cancel, deadline);
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kNotFound) throw;  // expired already: what revoking wanted
  }
}

struct Watch::State {
  std::shared_ptr<Client::Impl> client;
  WatchRequest request;  // start_revision moves past each event delivered
  std::string what;
  std::unique_ptr<detail::Connection> stream;
  std::optional<Attempts> attempts;  // since the stream last failed
};

Watch::Watch(std::unique_ptr<State> state) : state_(std::move(state)) {}
Watch::~Watch() = default;

std::unique_ptr<Watch> Client::watch(WatchRequest request) {
  auto state = std::make_unique<Watch::State>();
  state->client = impl_;
  state->what = "watch " + quote(request.key);
  state->request = std::move(request);
  return std::unique_ptr<Watch>(new Watch(std::move(state)));
}

Task<std::optional<WatchBatch>> Watch::next(Clock::time_point deadline, Cancellation& cancel) {
  State& s = *state_;
  Client::Impl& client = *s.client;
  for (;;) {
    if (cancel.cancelled()) throw client.cancelled(s.what);
    if (Clock::now() >= deadline) co_return std::nullopt;
    if (!s.attempts) s.attempts.emplace(client, s.what, deadline);
    const std::size_t endpoint = s.attempts->endpoint();
    std::string failure;
    try {
      if (!s.stream) {
        co_await client.authenticate_if_needed(cancel, deadline);
        auto stream = std::make_unique<detail::Connection>(client.executor_, client.tls_.get());
        co_await stream->connect(client.endpoints_[endpoint], s.attempts->exchange_deadline(),
                                 cancel);
        auto request = client.make_request("/v3/watch", detail::encode(s.request).dump(), endpoint);
        const auto status =
            co_await stream->open_stream(request, s.attempts->exchange_deadline(), cancel);
        if (status != 200) {
          const auto body =
              co_await stream->rest_of_stream(s.attempts->exchange_deadline(), cancel);
          const auto where = "etcd " + client.endpoints_[endpoint].text + ": " + s.what;
          failure = client.retry_reason(parse_answer(body, status, where), endpoint, s.what);
        } else {
          s.stream = std::move(stream);
        }
      }
      if (s.stream) {
        const auto line = co_await s.stream->next_line(deadline, cancel);
        if (!line) {
          failure = "the member ended the watch";
        } else {
          const auto where = "etcd " + client.endpoints_[endpoint].text + ": " + s.what;
          const auto answer = parse_answer(*line, 200, where);
          if (const auto error = answer.find("error"); error != answer.end()) {
            failure = client.retry_reason(*error, endpoint, s.what);
          } else {
            const auto& result = answer.at("result");
            auto batch = decoded(client, s.what, [&] { return detail::decode_watch(result); });
            s.attempts.reset();  // the member answers
            client.preferred_ = endpoint;
            if (batch.compact_revision != 0) {
              s.stream.reset();
              co_return batch;
            }
            if (result.value("canceled", false)) {
              failure = "the member cancelled the watch: " + result.value("cancel_reason", "");
            } else if (!batch.events.empty()) {
              s.request.start_revision = batch.events.back().kv.mod_revision + 1;
              co_return batch;
            } else {
              continue;  // created, or progress
            }
          }
        }
      }
    } catch (const detail::TransportError& e) {
      failure = e.reason;
    }
    s.stream.reset();
    if (Clock::now() >= deadline) co_return std::nullopt;  // a read cut short by the deadline
    if (!s.attempts) s.attempts.emplace(client, s.what, deadline);
    bool timed_out = false;
    try {
      co_await s.attempts->failed(std::move(failure), cancel);
    } catch (const StoreError& e) {
      if (e.code() != StoreErrc::kTimeout) throw;
      timed_out = true;
    }
    if (timed_out) co_return std::nullopt;
  }
}

}  // namespace dist::store::etcd
