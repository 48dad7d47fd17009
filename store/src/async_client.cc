#include "dist/store/async_client.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "auth.h"
#include "protocol.h"
#include "requests.h"
#include "text.h"

namespace dist::store {

namespace asio = boost::asio;
using asio::use_awaitable;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
template <typename T = void>
using Task = asio::awaitable<T>;

namespace {

using requests::kBackoffFactor;
using requests::kInitialBackoff;
using requests::kMaxBackoff;
using requests::kReadChunkBytes;

constexpr std::string_view kRefused = "Connection refused";  // (connect_once's word for it)

}  // namespace

// A lane's state: its close() ends its calls only (Impl::close_lane).
struct AsyncStoreClient::Lane {
  bool closed = false;
};

// The connection and the state of the one call in flight. Timers hold a weak reference and a
// call generation, so a timer that fires after its call ended does nothing.
class AsyncStoreClient::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(asio::any_io_executor executor, ClientOptions options)
      : options_(std::move(options)),
        socket_(executor),
        resolver_(executor),
        deadline_(executor),
        wait_timer_(executor) {}

  // One call's hold on the connection, released on every exit path; the next queued call, if
  // any, takes it over.
  class Call {
   public:
    explicit Call(Impl* impl) : impl_(impl) {}
    Call(Call&& other) noexcept : impl_(std::exchange(other.impl_, nullptr)) {}
    Call& operator=(Call&&) = delete;
    ~Call() {
      if (impl_) impl_->end();
    }
    std::string& out() { return impl_->out_; }

   private:
    Impl* impl_;
  };

  // A call waiting for the connection: woken by end() (handed it), close(), its lane's close(),
  // or its deadline (a wait's).
  struct Turn {
    Turn(asio::any_io_executor executor, const Lane* lane, Clock::time_point deadline)
        : timer(std::move(executor), deadline), lane(lane) {}
    asio::steady_timer timer;
    const Lane* lane;
    bool handed = false;
  };
  // Counts a queued call that a wait gives way to, for as long as its frame waits.
  struct Taker {
    Taker(std::size_t& count, bool counted) : count_(count), counted_(counted) {
      count_ += counted_ ? 1 : 0;
    }
    ~Taker() { count_ -= counted_ ? 1 : 0; }
    Taker(const Taker&) = delete;
    Taker& operator=(const Taker&) = delete;

   private:
    std::size_t& count_;
    bool counted_;
  };

  // Waits for the connection (calls are served one at a time, in order), then starts the call. A
  // wait in flight gives way to it (see wait_for), unless it is a wait made again after giving
  // way itself (two waits would take the connection from each other for ever: the first to hold
  // it keeps it). A call of a closed lane ends with kCancelled; nullopt once `deadline` passed
  // while the call was queued (a wait's: it then times out).
  Task<std::optional<Call>> take_turn(std::shared_ptr<Lane> lane, std::string context,
                                      bool takes_way, Clock::time_point deadline) {
    if (lane && lane->closed) throw cancelled(context);
    if (busy_) {
      if (takes_way) give_way();
      auto turn = std::make_shared<Turn>(socket_.get_executor(), lane.get(), deadline);
      queue_.push_back(turn);
      {
        const Taker taker(takers_queued_, takes_way);
        boost::system::error_code ignored;
        co_await turn->timer.async_wait(asio::redirect_error(use_awaitable, ignored));
      }
      if (!turn->handed) {  // close(), the lane's close(), or the deadline
        std::erase(queue_, turn);
        if (closed_ || (lane && lane->closed)) throw cancelled(context);
        co_return std::nullopt;
      }
      // end() handed the connection over (busy_ stays true): from here on, end() passes it on.
    } else {
      busy_ = true;
    }
    try {
      if (lane && lane->closed) throw cancelled(context);
      begin(std::move(context));
    } catch (...) {
      end();
      throw;
    }
    lane_in_flight_ = lane.get();
    co_return Call(this);
  }
  Task<Call> begin_call(std::shared_ptr<Lane> lane, std::string context) {
    auto turn = co_await take_turn(std::move(lane), std::move(context), /*takes_way=*/true,
                                   Clock::time_point::max());
    co_return std::move(*turn);  // no deadline: handed the connection, or it threw
  }

  // A lane closed: its wait in flight is cancelled on the store, and its queued calls end now
  // (with kCancelled), not when their turn comes.
  void close_lane(const Lane* lane) {
    if (waiting_ && lane_in_flight_ == lane) send_cancel_wait();
    for (auto& turn : queue_) {
      if (turn->lane == lane) turn->timer.cancel();
    }
  }

  // The call that holds the connection: usable?
  void begin(std::string context) {
    if (closed_) throw cancelled(context);
    if (broken_) {
      throw StoreError(StoreErrc::kConnectionLost, "connection to the store at " + endpoint() +
                                                       " is unusable (" + broken_reason_ +
                                                       "); create a new client");
    }
    timed_out_ = false;
    cancel_sent_ = false;
    waiting_ = false;
    gave_way_ = false;
    ++generation_;
    context_ = std::move(context);
    out_.clear();
  }
  void end() {
    ++generation_;
    waiting_ = false;
    lane_in_flight_ = nullptr;
    deadline_.cancel();
    wait_timer_.cancel();
    if (queue_.empty()) {
      busy_ = false;
      return;
    }
    queue_.front()->handed = true;  // its turn: busy_ passes to it
    queue_.front()->timer.cancel();
    queue_.pop_front();
  }

  // The reply must come within the call timeout; past it the connection is given up.
  void arm_deadline() {
    deadline_.expires_after(options_.timeout);
    deadline_.async_wait(
        [weak = weak_from_this(), gen = generation_](boost::system::error_code ec) {
          auto self = weak.lock();
          if (ec || !self || self->generation_ != gen) return;
          self->timed_out_ = true;
          boost::system::error_code ignored;
          self->socket_.cancel(ignored);
        });
  }

  Task<void> connect();
  Task<std::string> connect_once(Clock::time_point deadline);
  Task<void> handshake();

  Task<void> send() {
    try {
      co_await asio::async_write(socket_, asio::buffer(out_), use_awaitable);
    } catch (const boost::system::system_error& e) {
      fail(e);
    }
  }
  Task<void> read_exact(void* dst, std::size_t n) {
    char* out = static_cast<char*>(dst);
    while (n > 0) {
      if (const std::size_t took = in_.take(out, n); took > 0) {
        out += took;
        n -= took;
        continue;
      }
      try {
        char* space = in_.space();
        in_.filled(
            co_await socket_.async_read_some(asio::buffer(space, kReadChunkBytes), use_awaitable));
      } catch (const boost::system::system_error& e) {
        fail(e);
      }
    }
  }
  template <typename T>
  Task<T> fixed() {
    T v{};
    co_await read_exact(&v, sizeof v);
    co_return v;
  }
  Task<std::string> bytes() {
    const auto n = co_await fixed<std::uint64_t>();
    if (const auto why = requests::oversized_reply(n, limits_)) lost(*why);
    std::string value(n, '\0');
    co_await read_exact(value.data(), n);
    co_return value;
  }
  // The status byte of an extension-protocol reply: returns on success, else throws the store's
  // typed error (kNotFound, kLimitExceeded, ...).
  Task<void> status() {
    const auto code = co_await fixed<std::uint8_t>();
    if (code == wire::kStatusOk) co_return;
    const std::string message = co_await bytes();
    const auto error = requests::status_error(code, context_, endpoint(), message);
    if (!error) lost("unknown status " + std::to_string(code) + " in reply to " + context_);
    throw *error;
  }

  // A wait's reply: kStopWaiting or kKeyGone (with the key's index), or nullopt once `timeout`
  // passed (the wait is then cancelled on the server, accepting a result already under way).
  Task<std::optional<std::uint64_t>> await_wait(milliseconds timeout) {
    wait_timer_.expires_after(timeout);
    wait_timer_.async_wait(
        [weak = weak_from_this(), gen = generation_](boost::system::error_code ec) {
          auto self = weak.lock();
          if (ec || !self || self->generation_ != gen) return;
          self->send_cancel_wait();
        });
    std::optional<std::uint64_t> result;
    while (true) {
      co_await status();
      const auto kind = co_await fixed<std::uint8_t>();
      if (kind == wire::kWaitCanceled) co_return result;
      result = 0;
      // Not `kind == kKeyGone ? co_await ... : 0`: GCC 12 runs a co_await in either branch.
      if (kind == wire::kKeyGone) result = co_await fixed<std::uint64_t>();
      if (!cancel_sent_) co_return result;
    }
  }
  // The wait in flight, if any, gives way to a call made meanwhile.
  void give_way() {
    if (!waiting_ || cancel_sent_) return;
    gave_way_ = true;
    send_cancel_wait();
  }
  // A wait's request is sent: from now on it gives way (at once, to a call that came during the
  // send), and ends early when its lane closed meanwhile.
  void started_wait(const Lane* lane) {
    waiting_ = true;
    if (takers_queued_ > 0) give_way();
    if (lane && lane->closed) send_cancel_wait();
  }
  // A wait, made again after each time it gave way to another call (take_turn cancels it on the
  // store for them), until a reply or `timeout` in all. A lane's close() cancels it too.
  Task<std::optional<std::uint64_t>> wait_for(std::shared_ptr<Lane> lane, std::string context,
                                              wire::Op op, std::vector<std::string> keys,
                                              milliseconds timeout) {
    check_keys(keys);
    const auto deadline = Clock::now() + timeout;
    for (bool again = false;; again = true) {
      auto turn = co_await take_turn(lane, context, /*takes_way=*/!again, deadline);
      if (!turn) co_return std::nullopt;  // the deadline passed while it waited for its turn
      auto call = std::move(*turn);
      requests::key_list(call.out(), op, keys);
      co_await send();
      started_wait(lane.get());
      const auto left =
          std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
      const auto result = co_await await_wait(left);
      if (result) co_return result;
      if (lane && lane->closed) throw cancelled(context);
      if (!gave_way_ || Clock::now() >= deadline) co_return std::nullopt;
    }  // `call` ends here: the connection passes to the call the wait gave way to
  }
  void send_cancel_wait() {
    if (cancel_sent_) return;  // one CANCEL_WAIT, one reply
    cancel_sent_ = true;
    cancel_out_.clear();
    requests::begin(cancel_out_, wire::Op::kCancelWait);
    arm_deadline();  // the cancellation must be confirmed in time
    asio::async_write(socket_, asio::buffer(cancel_out_),
                      [weak = weak_from_this()](boost::system::error_code ec, std::size_t) {
                        auto self = weak.lock();
                        if (ec && self) self->socket_.cancel(ec);  // the read reports it
                      });
  }

  void check_key(const std::string& key) const {
    if (key.size() > limits_.max_key_bytes) {
      throw StoreError(StoreErrc::kLimitExceeded,
                       "key " + quote_key(key) + " is " + std::to_string(key.size()) +
                           " bytes; the store at " + endpoint() + " accepts at most " +
                           std::to_string(limits_.max_key_bytes));
    }
  }
  void check_value(const std::string& key, const std::string& value) const {
    check_key(key);
    if (value.size() > limits_.max_value_bytes) {
      throw StoreError(StoreErrc::kLimitExceeded,
                       "value for key " + quote_key(key) + " is " + std::to_string(value.size()) +
                           " bytes; the store at " + endpoint() + " accepts at most " +
                           std::to_string(limits_.max_value_bytes));
    }
  }
  void check_keys(const std::vector<std::string>& keys) const {
    if (keys.size() > limits_.max_keys_per_request) {
      throw StoreError(StoreErrc::kLimitExceeded, std::to_string(keys.size()) +
                                                      " keys in one request; the store at " +
                                                      endpoint() + " accepts at most " +
                                                      std::to_string(limits_.max_keys_per_request));
    }
    for (const auto& key : keys) check_key(key);
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    ++generation_;
    boost::system::error_code ignored;
    resolver_.cancel();
    deadline_.cancel();
    wait_timer_.cancel();
    for (auto& turn : queue_) turn->timer.cancel();  // not handed: each ends in kCancelled
    socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  std::string endpoint() const { return options_.host + ":" + std::to_string(options_.port); }

  StoreError cancelled(const std::string& context) const {
    return StoreError(StoreErrc::kCancelled,
                      context + " on the store at " + endpoint() + " cancelled: client closed");
  }
  [[noreturn]] void lost(const std::string& what) {
    broken_ = true;
    broken_reason_ = what;
    throw StoreError(StoreErrc::kConnectionLost,
                     "connection to the store at " + endpoint() + " lost: " + what);
  }
  // An I/O error of the call in flight, as the caller should see it.
  [[noreturn]] void fail(const boost::system::system_error& e) {
    if (closed_) throw cancelled(context_);
    if (timed_out_) {
      broken_ = true;
      broken_reason_ = context_ + " timed out waiting for its reply";
      throw StoreError(StoreErrc::kTimeout, context_ + " on the store at " + endpoint() +
                                                " got no reply within " +
                                                std::to_string(options_.timeout.count()) + " ms");
    }
    lost(e.code() == asio::error::eof ? "the store closed the connection" : e.code().message());
  }

  ClientOptions options_;
  StoreLimits limits_;
  asio::ip::tcp::socket socket_;
  asio::ip::tcp::resolver resolver_;
  asio::steady_timer deadline_;
  asio::steady_timer wait_timer_;  // a wait's own timeout, and the connect backoff
  std::string out_;
  std::string cancel_out_;
  requests::ReplyBuffer in_;  // allocated on the first read, never zeroed
  std::uint64_t generation_ = 0;
  std::string context_;
  bool busy_ = false;
  bool closed_ = false;
  bool connected_ = false;  // open() connected and said HELLO (the client is never reconnected)
  bool broken_ = false;
  bool timed_out_ = false;
  bool cancel_sent_ = false;
  bool waiting_ = false;                  // the call in flight is a wait
  const Lane* lane_in_flight_ = nullptr;  // the lane whose call is in flight, if any
  bool gave_way_ = false;                 // ... cancelled for a call made meanwhile
  std::size_t takers_queued_ = 0;         // queued calls that a wait gives way to
  std::string broken_reason_;
  std::deque<std::shared_ptr<Turn>> queue_;  // calls waiting for the connection
};

// Resolves (on every attempt: a name may appear late, as in a cluster that is still booting) and
// tries each address until one connects before the deadline; returns why none did. An address
// given as digits is used as it is: Asio resolves on a thread of its own, which a launch would
// otherwise start (and wait for) only to be told 127.0.0.1.
Task<std::string> AsyncStoreClient::Impl::connect_once(Clock::time_point deadline) {
  boost::system::error_code ec;
  std::vector<asio::ip::tcp::endpoint> endpoints;
  if (const auto literal = asio::ip::make_address(options_.host, ec); !ec) {
    endpoints.emplace_back(literal, options_.port);
  } else {
    const auto results = co_await resolver_.async_resolve(
        options_.host, std::to_string(options_.port), asio::redirect_error(use_awaitable, ec));
    if (ec) co_return "cannot resolve '" + options_.host + "': " + ec.message();
    for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  }
  std::string why = "no address";
  for (const auto& endpoint : endpoints) {
    socket_.close(ec);
    socket_.open(endpoint.protocol(), ec);
    if (ec) {
      why = ec.message();
      continue;
    }
    deadline_.expires_at(deadline);
    deadline_.async_wait([weak = weak_from_this(), gen = generation_](boost::system::error_code e) {
      auto self = weak.lock();
      if (!e && self && self->generation_ == gen) self->socket_.cancel(e);
    });
    co_await socket_.async_connect(endpoint, asio::redirect_error(use_awaitable, ec));
    deadline_.cancel();
    if (!ec) co_return "";
    why = ec == asio::error::operation_aborted    ? std::string("connect timed out")
          : ec == asio::error::connection_refused ? std::string(kRefused)
                                                  : ec.message();
  }
  socket_.close(ec);
  co_return why;
}

Task<void> AsyncStoreClient::Impl::connect() {
  const auto started = Clock::now();
  const auto give_up = started + options_.connect_timeout;
  auto last_notice = started;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  milliseconds backoff = kInitialBackoff;
  int attempts = 0;
  while (true) {
    ++attempts;
    {
      // The connect and its HELLO are one call: nothing else is sent on the connection before the
      // HELLO, and an open() made meanwhile (another coroutine's) waits for both, then returns.
      auto call = co_await begin_call(nullptr, "connect");
      if (connected_) co_return;
      const std::string why =
          co_await connect_once(std::min(give_up, Clock::now() + options_.timeout));
      if (closed_) throw cancelled("connect");
      if (why.empty()) {
        // (A connect deadline that fired as the connect completed is queued still: a generation
        // of its own keeps it off the HELLO.)
        ++generation_;
        timed_out_ = false;
        boost::system::error_code ignored;
        socket_.set_option(asio::ip::tcp::no_delay(true), ignored);
        enable_keepalive(socket_.native_handle(), options_.keepalive_idle_seconds,
                         options_.keepalive_interval_seconds, options_.keepalive_probes);
        co_await handshake();
        connected_ = true;
        co_return;
      }
      if (options_.refusal_is_final && why == kRefused) {
        throw StoreError(StoreErrc::kUnavailable, refused_for_good(endpoint()));
      }
      const auto now = Clock::now();
      if (now >= give_up) {
        throw StoreError(StoreErrc::kUnavailable,
                         "cannot connect to the store at " + endpoint() + " after " +
                             std::to_string(attempts) + " attempts in " +
                             std::to_string(options_.connect_timeout.count()) + " ms (" + why +
                             "); is the host agent or dist-rendezvous running there?");
      }
      if (options_.on_retry && now - last_notice >= options_.retry_notice_interval) {
        last_notice = now;
        options_.on_retry(
            "still cannot reach the store at " + endpoint() + " after " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(now - started).count()) +
            " s (" + why + "); retrying for up to " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(options_.connect_timeout)
                    .count()) +
            " s");
      }
      wait_timer_.expires_after(std::min(
          milliseconds(static_cast<long long>(static_cast<double>(backoff.count()) * jitter(rng))),
          std::chrono::duration_cast<milliseconds>(give_up - now)));
      boost::system::error_code ec;
      co_await wait_timer_.async_wait(asio::redirect_error(use_awaitable, ec));
      if (closed_) throw cancelled("connect");
    }
    backoff = std::min(kMaxBackoff, milliseconds(static_cast<long long>(
                                        static_cast<double>(backoff.count()) * kBackoffFactor)));
  }
}

// Within connect()'s call, on the connection it made.
Task<void> AsyncStoreClient::Impl::handshake() {
  context_ = "HELLO";
  arm_deadline();
  requests::handshake(out_, options_.keepalive_idle_seconds, options_.keepalive_interval_seconds,
                      options_.keepalive_probes);
  co_await send();
  try {
    co_await status();
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kConnectionLost) throw;
    throw StoreError(StoreErrc::kProtocol, closed_at_handshake(endpoint(), e.what()));
  }
  co_await fixed<std::uint32_t>();  // the server's extension version
  limits_.max_key_bytes = co_await fixed<std::uint64_t>();
  limits_.max_value_bytes = co_await fixed<std::uint64_t>();
  limits_.max_keys_per_request = co_await fixed<std::uint64_t>();
  limits_.max_request_bytes = co_await fixed<std::uint64_t>();
  limits_.max_total_bytes = co_await fixed<std::uint64_t>();
  const bool auth_required = co_await fixed<std::uint8_t>() != 0;
  if (!auth_required) {
    if (options_.secret.empty()) co_return;
    throw StoreError(StoreErrc::kUnauthenticated, auth::store_without_token(endpoint()));
  }

  auth::Nonce server_nonce{};
  co_await read_exact(server_nonce.data(), server_nonce.size());
  if (options_.secret.empty()) {
    throw StoreError(StoreErrc::kUnauthenticated, auth::token_required(endpoint()));
  }
  context_ = "AUTH";
  const auth::Nonce client_nonce = auth::random_nonce();
  const auth::Mac mac = auth::client_proof(options_.secret, server_nonce, client_nonce);
  out_.clear();
  auto w = requests::begin(out_, wire::Op::kAuth);
  w.raw(mac.data(), mac.size());
  w.raw(client_nonce.data(), client_nonce.size());
  co_await send();
  std::string refused;
  try {
    co_await status();
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kUnauthenticated) throw;
    refused = e.what();
  }
  if (!refused.empty()) throw StoreError(StoreErrc::kUnauthenticated, auth::token_refused(refused));
  auth::Mac proof{};
  co_await read_exact(proof.data(), proof.size());
  const auth::Mac expected = auth::server_proof(options_.secret, server_nonce, client_nonce);
  if (!auth::equal(proof.data(), expected.data(), proof.size())) {
    throw StoreError(StoreErrc::kUnauthenticated,
                     "the store at " + endpoint() +
                         " could not prove it knows the job's token; refusing to use it");
  }
}

// ---------------------------------------------------------------------------------------------

AsyncStoreClient::AsyncStoreClient(asio::any_io_executor executor, ClientOptions options)
    : impl_(std::make_shared<Impl>(std::move(executor), std::move(options))) {}

AsyncStoreClient::AsyncStoreClient(std::shared_ptr<Impl> impl, std::shared_ptr<Lane> lane)
    : impl_(std::move(impl)), lane_(std::move(lane)) {}

AsyncStoreClient::~AsyncStoreClient() {
  close();
}

AsyncStoreClient AsyncStoreClient::lane() const {
  return AsyncStoreClient(impl_, std::make_shared<Lane>());
}

Task<void> AsyncStoreClient::open() {
  if (lane_) co_return;  // the connection is its client's
  auto impl = impl_;
  if (impl->connected_) co_return;  // (without a turn: it would cancel a wait in flight)
  co_await impl->connect();
}

Task<AsyncStoreClient> AsyncStoreClient::connect(ClientOptions options) {
  AsyncStoreClient client(co_await asio::this_coro::executor, std::move(options));
  co_await client.open();
  co_return client;
}

void AsyncStoreClient::close() {
  if (!impl_) return;  // moved from
  if (!lane_) return impl_->close();
  if (lane_->closed) return;
  lane_->closed = true;
  impl_->close_lane(lane_.get());
}

const ClientOptions& AsyncStoreClient::options() const {
  return impl_->options_;
}

std::string AsyncStoreClient::endpoint() const {
  return impl_->endpoint();
}

Task<void> AsyncStoreClient::set(std::string key, std::string value, bool ephemeral) {
  auto impl = impl_;
  impl->check_value(key, value);
  auto call = co_await impl->begin_call(lane_, "SET " + quote_key(key));
  requests::set(call.out(), key, value, ephemeral);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
}

Task<std::optional<std::string>> AsyncStoreClient::try_get(std::string key) {
  auto impl = impl_;
  impl->check_key(key);
  auto call = co_await impl->begin_call(lane_, "GET " + quote_key(key));
  requests::key_only(call.out(), wire::Op::kGet, key);
  impl->arm_deadline();
  co_await impl->send();
  try {
    co_await impl->status();
  } catch (const StoreError& e) {
    if (e.code() == StoreErrc::kNotFound) co_return std::nullopt;
    throw;
  }
  co_return co_await impl->bytes();
}

Task<std::vector<std::string>> AsyncStoreClient::multi_get(std::vector<std::string> keys) {
  auto impl = impl_;
  impl->check_keys(keys);
  auto call = co_await impl->begin_call(lane_, "MULTI_GET " + requests::describe_keys(keys));
  requests::key_list(call.out(), wire::Op::kMultiGet, keys);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) values.push_back(co_await impl->bytes());
  co_return values;
}

Task<void> AsyncStoreClient::multi_set(Items items) {
  auto impl = impl_;
  if (items.size() > impl->limits_.max_keys_per_request) {
    throw StoreError(StoreErrc::kLimitExceeded,
                     std::to_string(items.size()) + " keys in one MULTI_SET; the store at " +
                         endpoint() + " accepts at most " +
                         std::to_string(impl->limits_.max_keys_per_request));
  }
  for (const auto& [key, value] : items) impl->check_value(key, value);
  auto call =
      co_await impl->begin_call(lane_, "MULTI_SET of " + std::to_string(items.size()) + " keys");
  requests::multi_set(call.out(), items);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
}

Task<std::int64_t> AsyncStoreClient::add(std::string key, std::int64_t delta) {
  auto impl = impl_;
  impl->check_key(key);
  auto call = co_await impl->begin_call(lane_, "ADD " + quote_key(key));
  requests::add(call.out(), key, delta);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  co_return co_await impl->fixed<std::int64_t>();
}

Task<std::string> AsyncStoreClient::compare_set(std::string key, std::string expected,
                                                std::string desired) {
  auto impl = impl_;
  impl->check_value(key, expected);
  impl->check_value(key, desired);
  auto call = co_await impl->begin_call(lane_, "COMPARE_SET " + quote_key(key));
  requests::compare_set(call.out(), key, expected, desired);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  co_return co_await impl->bytes();
}

Task<bool> AsyncStoreClient::check(std::vector<std::string> keys) {
  auto impl = impl_;
  impl->check_keys(keys);
  auto call = co_await impl->begin_call(lane_, "CHECK " + requests::describe_keys(keys));
  requests::key_list(call.out(), wire::Op::kCheck, keys);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  co_return co_await impl->fixed<std::uint8_t>() == wire::kCheckReady;
}

Task<bool> AsyncStoreClient::delete_key(std::string key) {
  auto impl = impl_;
  impl->check_key(key);
  auto call = co_await impl->begin_call(lane_, "DELETE_KEY " + quote_key(key));
  requests::key_only(call.out(), wire::Op::kDeleteKey, key);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  co_return co_await impl->fixed<std::int64_t>() > 0;
}

Task<std::int64_t> AsyncStoreClient::delete_all_except(std::string prefix) {
  auto impl = impl_;
  impl->check_key(prefix);
  auto call = co_await impl->begin_call(lane_, "DELETE_ALL_EXCEPT " + quote_key(prefix));
  requests::key_only(call.out(), wire::Op::kDeleteAllExcept, prefix);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  co_return co_await impl->fixed<std::int64_t>();
}

Task<std::vector<std::string>> AsyncStoreClient::list_keys() {
  auto impl = impl_;
  auto call = co_await impl->begin_call(lane_, "LIST_KEYS");
  requests::begin(call.out(), wire::Op::kListKeys);
  impl->arm_deadline();
  co_await impl->send();
  co_await impl->status();
  const auto n = co_await impl->fixed<std::int64_t>();
  std::vector<std::string> keys;
  for (std::int64_t i = 0; i < n; ++i) keys.push_back(co_await impl->bytes());
  co_return keys;
}

Task<bool> AsyncStoreClient::wait(std::vector<std::string> keys, milliseconds timeout) {
  auto impl = impl_;
  std::string context = "WAIT " + requests::describe_keys(keys);
  const auto reply =
      co_await impl->wait_for(lane_, std::move(context), wire::Op::kWait, std::move(keys), timeout);
  co_return reply.has_value();
}

Task<std::optional<std::size_t>> AsyncStoreClient::wait_deleted(std::vector<std::string> keys,
                                                                milliseconds timeout) {
  auto impl = impl_;
  std::string context = "WAIT_DELETED " + requests::describe_keys(keys);
  const auto index = co_await impl->wait_for(lane_, std::move(context), wire::Op::kWaitDeleted,
                                             std::move(keys), timeout);
  if (!index) co_return std::nullopt;
  co_return static_cast<std::size_t>(*index);
}

}  // namespace dist::store
