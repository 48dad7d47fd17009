#include "dist/store/client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "auth.h"
#include "protocol.h"
#include "requests.h"
#include "text.h"

namespace dist::store {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

using requests::kBackoffFactor;
using requests::kInitialBackoff;
using requests::kMaxBackoff;
using requests::kReadChunkBytes;
constexpr std::size_t kMaxSecretFileBytes = 64 * 1024;  // a token, not a data file

// Milliseconds left until the deadline, rounded up so that a wait never ends early.
long long remaining_ms(Clock::time_point deadline) {
  return std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
}

// Opens a TCP connection to host:port before the deadline, or returns -1 with errno-like `err`.
int connect_once(const std::string& host, std::uint16_t port, Clock::time_point deadline,
                 std::string* err) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &results); rc != 0) {
    *err = std::string("cannot resolve host: ") + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = results; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS) {
      *err = std::strerror(errno);
      ::close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    const auto left = remaining_ms(deadline);
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (::poll(&p, 1, static_cast<int>(std::max<long long>(left, 0))) != 1 ||
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0 || so_error != 0) {
      *err = so_error ? std::strerror(so_error) : "connect timed out";
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(results);
  if (fd >= 0) {
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

void enable_keepalive(int fd, int idle_seconds, int interval_seconds, int probes) {
  if (idle_seconds <= 0) return;
  // Linux's bounds (a value past one is refused, and the socket keeps the rest of its schedule).
  idle_seconds = std::min(idle_seconds, kMaxKeepaliveSeconds);
  interval_seconds = std::clamp(interval_seconds, 1, kMaxKeepaliveSeconds);
  probes = std::clamp(probes, 1, kMaxKeepaliveProbes);
  int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_seconds, sizeof idle_seconds);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_seconds, sizeof interval_seconds);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
  // Data sent but never acknowledged times out on the same schedule.
  const auto user_timeout_ms = static_cast<unsigned int>(
      (static_cast<std::uint64_t>(idle_seconds) +
       static_cast<std::uint64_t>(interval_seconds) * static_cast<std::uint64_t>(probes)) *
      1000);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
}

class StoreClient::Impl {
 public:
  explicit Impl(ClientOptions options) : options_(std::move(options)) {}
  ~Impl() {
    if (fd_ >= 0) ::close(fd_);
  }

  void connect();

  // The buffer of one request, empty; the request is written whole by send().
  std::string& request() {
    check_usable();
    out_.clear();
    return out_;
  }
  void send(Clock::time_point deadline);

  // Replies.
  void status(Clock::time_point deadline, const std::string& context);
  void check_status(std::uint8_t code, Clock::time_point deadline, const std::string& context);
  std::uint8_t u8(Clock::time_point d) { return read_fixed<std::uint8_t>(d); }
  std::uint32_t u32(Clock::time_point d) { return read_fixed<std::uint32_t>(d); }
  std::uint64_t u64(Clock::time_point d) { return read_fixed<std::uint64_t>(d); }
  std::int64_t i64(Clock::time_point d) { return read_fixed<std::int64_t>(d); }
  std::string bytes(Clock::time_point d);
  void read_exact(void* dst, std::size_t n, Clock::time_point deadline);

  Clock::time_point deadline(Timeout t) const {
    return Clock::now() + t.value_or(options_.timeout);
  }
  void check_key(const std::string& key) const;
  void check_value(const std::string& key, const std::string& value) const;
  void check_count(std::size_t n) const;
  // Waits for an asynchronous wait reply; on timeout cancels the wait on the server. Returns the
  // reply byte (kStopWaiting or kKeyGone) and, for kKeyGone, the key's index.
  std::optional<std::pair<std::uint8_t, std::uint64_t>> await(Clock::time_point deadline,
                                                              const std::string& context);
  std::optional<std::pair<std::uint8_t, std::uint64_t>> cancel_wait(const std::string& context);
  [[noreturn]] void lost(const std::string& what);

  std::string endpoint() const { return options_.host + ":" + std::to_string(options_.port); }

  ClientOptions options_;
  StoreLimits limits_;
  int fd_ = -1;
  std::string out_;
  requests::ReplyBuffer in_;  // allocated on the first read, never zeroed
  bool broken_ = false;
  std::string broken_reason_;

 private:
  template <typename T>
  T read_fixed(Clock::time_point d) {
    T v{};
    read_exact(&v, sizeof v, d);
    return v;
  }
  void check_usable() const {
    if (broken_) {
      throw StoreError(StoreErrc::kConnectionLost, "connection to the store at " + endpoint() +
                                                       " is unusable (" + broken_reason_ +
                                                       "); create a new client");
    }
  }
  void handshake(Clock::time_point deadline);
};

void StoreClient::Impl::lost(const std::string& what) {
  broken_ = true;
  broken_reason_ = what;
  throw StoreError(StoreErrc::kConnectionLost,
                   "connection to the store at " + endpoint() + " lost: " + what);
}

void StoreClient::Impl::connect() {
  const auto give_up = Clock::now() + options_.connect_timeout;
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.8, 1.2);
  milliseconds backoff = kInitialBackoff;
  std::string last_error;
  int attempts = 0;
  while (true) {
    ++attempts;
    const auto attempt_deadline = std::min(give_up, Clock::now() + options_.timeout);
    fd_ = connect_once(options_.host, options_.port, attempt_deadline, &last_error);
    if (fd_ >= 0) {
      enable_keepalive(fd_, options_.keepalive_idle_seconds, options_.keepalive_interval_seconds,
                       options_.keepalive_probes);
      break;
    }
    if (options_.refusal_is_final && last_error == std::strerror(ECONNREFUSED)) {
      throw StoreError(StoreErrc::kUnavailable, refused_for_good(endpoint()));
    }
    const auto now = Clock::now();
    if (now >= give_up) {
      throw StoreError(StoreErrc::kUnavailable,
                       "cannot connect to the store at " + endpoint() + " after " +
                           std::to_string(attempts) + " attempts in " +
                           std::to_string(options_.connect_timeout.count()) + " ms (" + last_error +
                           "); is the host agent or dist-rendezvous running there?");
    }
    const auto sleep = std::min(
        milliseconds(static_cast<long long>(static_cast<double>(backoff.count()) * jitter(rng))),
        std::chrono::duration_cast<milliseconds>(give_up - now));
    std::this_thread::sleep_for(sleep);
    backoff = std::min(kMaxBackoff, milliseconds(static_cast<long long>(
                                        static_cast<double>(backoff.count()) * kBackoffFactor)));
  }
  handshake(Clock::now() + options_.timeout);
}

void StoreClient::Impl::handshake(Clock::time_point d) {
  out_.clear();
  requests::handshake(out_, options_.keepalive_idle_seconds, options_.keepalive_interval_seconds,
                      options_.keepalive_probes);
  send(d);
  try {
    status(d, "HELLO");
    u32(d);  // the server's extension version
    limits_.max_key_bytes = u64(d);
    limits_.max_value_bytes = u64(d);
    limits_.max_keys_per_request = u64(d);
    limits_.max_request_bytes = u64(d);
    limits_.max_total_bytes = u64(d);
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kConnectionLost) throw;
    throw StoreError(StoreErrc::kProtocol, closed_at_handshake(endpoint(), e.what()));
  }
  const bool auth_required = u8(d) != 0;
  if (!auth_required) {
    if (options_.secret.empty()) return;
    throw StoreError(StoreErrc::kUnauthenticated, auth::store_without_token(endpoint()));
  }

  auth::Nonce server_nonce{};
  read_exact(server_nonce.data(), server_nonce.size(), d);
  if (options_.secret.empty()) {
    throw StoreError(StoreErrc::kUnauthenticated, auth::token_required(endpoint()));
  }
  const auth::Nonce client_nonce = auth::random_nonce();
  const auth::Mac mac = auth::client_proof(options_.secret, server_nonce, client_nonce);
  auto w = requests::begin(request(), wire::Op::kAuth);
  w.raw(mac.data(), mac.size());
  w.raw(client_nonce.data(), client_nonce.size());
  send(d);
  try {
    status(d, "AUTH");
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kUnauthenticated) throw;
    throw StoreError(StoreErrc::kUnauthenticated, auth::token_refused(e.what()));
  }
  auth::Mac proof{};
  read_exact(proof.data(), proof.size(), d);
  const auth::Mac expected = auth::server_proof(options_.secret, server_nonce, client_nonce);
  if (!auth::equal(proof.data(), expected.data(), proof.size())) {
    throw StoreError(StoreErrc::kUnauthenticated,
                     "the store at " + endpoint() +
                         " could not prove it knows the shared secret; refusing to use it");
  }
}

void StoreClient::Impl::send(Clock::time_point deadline) {
  std::size_t sent = 0;
  while (sent < out_.size()) {
    const ssize_t n = ::send(fd_, out_.data() + sent, out_.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd_, POLLOUT, 0};
      const auto left = remaining_ms(deadline);
      if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) == 0) {
        broken_ = true;
        broken_reason_ = "a request was only partly sent before its deadline";
        throw StoreError(StoreErrc::kTimeout, "sending to the store at " + endpoint() +
                                                  " timed out (the store is not reading)");
      }
      continue;
    }
    lost(std::string("send failed: ") + std::strerror(errno));
  }
}

void StoreClient::Impl::read_exact(void* dst, std::size_t n, Clock::time_point deadline) {
  char* out = static_cast<char*>(dst);
  while (n > 0) {
    if (const std::size_t took = in_.take(out, n); took > 0) {
      out += took;
      n -= took;
      continue;
    }
    char* space = in_.space();
    pollfd p{fd_, POLLIN, 0};
    const auto left = remaining_ms(deadline);
    const int ready = left > 0 ? ::poll(&p, 1, static_cast<int>(left)) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) throw StoreError(StoreErrc::kTimeout, "");  // callers add the context
    const ssize_t got = ::recv(fd_, space, kReadChunkBytes, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) lost(got == 0 ? "the store closed the connection" : std::strerror(errno));
    in_.filled(static_cast<std::size_t>(got));
  }
}

std::string StoreClient::Impl::bytes(Clock::time_point d) {
  const std::uint64_t n = u64(d);
  if (const auto why = requests::oversized_reply(n, limits_)) lost(*why);
  std::string value(n, '\0');
  read_exact(value.data(), n, d);
  return value;
}

void StoreClient::Impl::status(Clock::time_point d, const std::string& context) {
  std::uint8_t code = 0;
  try {
    code = u8(d);
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kTimeout) throw;
    broken_ = true;
    broken_reason_ = context + " timed out waiting for its reply";
    throw StoreError(StoreErrc::kTimeout,
                     context + " on the store at " + endpoint() + " got no reply in time");
  }
  check_status(code, d, context);
}

void StoreClient::Impl::check_status(std::uint8_t code, Clock::time_point d,
                                     const std::string& context) {
  if (code == wire::kStatusOk) return;
  const std::string message = bytes(d);
  const auto error = requests::status_error(code, context, endpoint(), message);
  if (!error) lost("unknown status " + std::to_string(code) + " in reply to " + context);
  throw *error;
}

std::optional<std::pair<std::uint8_t, std::uint64_t>> StoreClient::Impl::await(
    Clock::time_point deadline, const std::string& context) {
  std::uint8_t code = 0;
  try {
    code = u8(deadline);
  } catch (const StoreError& e) {
    if (e.code() != StoreErrc::kTimeout) throw;
    return cancel_wait(context);
  }
  check_status(code, deadline, context);
  const std::uint8_t kind = u8(deadline);
  const std::uint64_t index = kind == wire::kKeyGone ? u64(deadline) : 0;
  return std::make_pair(kind, index);
}

std::optional<std::pair<std::uint8_t, std::uint64_t>> StoreClient::Impl::cancel_wait(
    const std::string& context) {
  auto read_reply = [&](Clock::time_point d) -> std::pair<std::uint8_t, std::uint64_t> {
    status(d, context);
    const std::uint8_t kind = u8(d);
    const std::uint64_t index = kind == wire::kKeyGone ? u64(d) : 0;
    return {kind, index};
  };
  // Timed out: cancel on the server and read until it confirms, accepting a result that was
  // already on its way.
  requests::begin(request(), wire::Op::kCancelWait);
  const auto cancel_deadline = Clock::now() + options_.timeout;
  send(cancel_deadline);
  std::optional<std::pair<std::uint8_t, std::uint64_t>> result;
  while (true) {
    const auto reply = read_reply(cancel_deadline);
    if (reply.first == wire::kWaitCanceled) return result;
    result = reply;
  }
}

void StoreClient::Impl::check_key(const std::string& key) const {
  if (key.size() > limits_.max_key_bytes) {
    throw StoreError(StoreErrc::kLimitExceeded,
                     "key " + quote_key(key) + " is " + std::to_string(key.size()) +
                         " bytes; the store at " + endpoint() + " accepts at most " +
                         std::to_string(limits_.max_key_bytes));
  }
}

void StoreClient::Impl::check_value(const std::string& key, const std::string& value) const {
  check_key(key);
  if (value.size() > limits_.max_value_bytes) {
    throw StoreError(StoreErrc::kLimitExceeded,
                     "value for key " + quote_key(key) + " is " + std::to_string(value.size()) +
                         " bytes; the store at " + endpoint() + " accepts at most " +
                         std::to_string(limits_.max_value_bytes));
  }
}

void StoreClient::Impl::check_count(std::size_t n) const {
  if (n > limits_.max_keys_per_request) {
    throw StoreError(StoreErrc::kLimitExceeded,
                     std::to_string(n) + " keys in one request; the store at " + endpoint() +
                         " accepts at most " + std::to_string(limits_.max_keys_per_request));
  }
}

std::string read_secret_file(const std::string& path) {
  auto fail = [&](const std::string& why) -> StoreError {
    return StoreError(StoreErrc::kInvalidArgument, "secret file '" + path + "' " + why);
  };
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(std::string("cannot be read: ") + std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw fail(std::string("cannot be read: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw fail("is not a regular file");
  if (st.st_mode & (S_IROTH | S_IWOTH)) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw fail(std::string("is open to other users (mode ") + mode +
               "): anyone on this machine could read or replace the secret; run chmod 600 '" +
               path + "'");
  }
  if (static_cast<std::size_t>(st.st_size) > kMaxSecretFileBytes) {
    throw fail("is " + std::to_string(st.st_size) + " bytes; a secret file holds one token");
  }
  std::string secret(static_cast<std::size_t>(st.st_size), '\0');
  std::size_t got = 0;
  while (got < secret.size()) {
    const ssize_t n = ::read(fd, secret.data() + got, secret.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw fail(std::string("cannot be read: ") + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  secret.resize(got);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) throw fail("is empty; write the job's token into it");
  return secret;
}

// ---------------------------------------------------------------------------------------------
// StoreClient

StoreClient StoreClient::connect(ClientOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->connect();
  return StoreClient(impl.release());
}

StoreClient::StoreClient(Impl* impl) : impl_(impl) {}
StoreClient::StoreClient(StoreClient&& other) noexcept
    : impl_(std::exchange(other.impl_, nullptr)) {}
StoreClient& StoreClient::operator=(StoreClient&& other) noexcept {
  if (this != &other) {
    delete impl_;
    impl_ = std::exchange(other.impl_, nullptr);
  }
  return *this;
}
StoreClient::~StoreClient() {
  delete impl_;
}

const StoreLimits& StoreClient::server_limits() const {
  return impl_->limits_;
}
std::string StoreClient::endpoint() const {
  return impl_->endpoint();
}

void StoreClient::set(const std::string& key, const std::string& value, bool ephemeral) {
  impl_->check_value(key, value);
  requests::set(impl_->request(), key, value, ephemeral);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "SET " + quote_key(key));
}

std::optional<std::string> StoreClient::try_get(const std::string& key) {
  impl_->check_key(key);
  requests::key_only(impl_->request(), wire::Op::kGet, key);
  const auto d = impl_->deadline({});
  impl_->send(d);
  try {
    impl_->status(d, "GET " + quote_key(key));
  } catch (const StoreError& e) {
    if (e.code() == StoreErrc::kNotFound) return std::nullopt;
    throw;
  }
  return impl_->bytes(d);
}

std::string StoreClient::get(const std::string& key, Timeout timeout) {
  if (auto value = try_get(key)) return *std::move(value);
  wait({key}, timeout);
  if (auto value = try_get(key)) return *std::move(value);
  throw StoreError(StoreErrc::kNotFound,
                   "key '" + quote_key(key) +
                       "' was deleted right after it appeared on the store at " + endpoint());
}

std::int64_t StoreClient::add(const std::string& key, std::int64_t delta) {
  impl_->check_key(key);
  requests::add(impl_->request(), key, delta);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "ADD " + quote_key(key));
  return impl_->i64(d);
}

std::string StoreClient::compare_set(const std::string& key, const std::string& expected,
                                     const std::string& desired) {
  impl_->check_value(key, expected);
  impl_->check_value(key, desired);
  requests::compare_set(impl_->request(), key, expected, desired);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "COMPARE_SET " + quote_key(key));
  return impl_->bytes(d);
}

void StoreClient::append(const std::string& key, const std::string& value) {
  impl_->check_value(key, value);
  requests::key_value(impl_->request(), wire::Op::kAppend, key, value);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "APPEND " + quote_key(key));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  impl_->check_count(keys.size());
  for (const auto& key : keys) impl_->check_key(key);
  requests::key_list(impl_->request(), wire::Op::kCheck, keys);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "CHECK " + requests::describe_keys(keys));
  return impl_->u8(d) == wire::kCheckReady;
}

void StoreClient::wait(const std::vector<std::string>& keys, Timeout timeout) {
  impl_->check_count(keys.size());
  for (const auto& key : keys) impl_->check_key(key);
  requests::key_list(impl_->request(), wire::Op::kWait, keys);
  const auto d = impl_->deadline(timeout);
  impl_->send(d);
  if (!impl_->await(d, "WAIT " + requests::describe_keys(keys))) {
    throw StoreError(StoreErrc::kTimeout,
                     "WAIT for " + requests::describe_keys(keys) + " on the store at " +
                         endpoint() + " timed out after " +
                         std::to_string(timeout.value_or(impl_->options_.timeout).count()) +
                         " ms; the key was never set (did its writer start or fail?)");
  }
}

std::size_t StoreClient::wait_deleted(const std::vector<std::string>& keys, Timeout timeout) {
  impl_->check_count(keys.size());
  for (const auto& key : keys) impl_->check_key(key);
  requests::key_list(impl_->request(), wire::Op::kWaitDeleted, keys);
  const auto d = impl_->deadline(timeout);
  impl_->send(d);
  const auto reply = impl_->await(d, "WAIT_DELETED " + requests::describe_keys(keys));
  if (!reply) {
    throw StoreError(StoreErrc::kTimeout,
                     "none of " + requests::describe_keys(keys) + " was deleted within " +
                         std::to_string(timeout.value_or(impl_->options_.timeout).count()) + " ms");
  }
  return static_cast<std::size_t>(reply->second);
}

std::vector<std::string> StoreClient::multi_get(const std::vector<std::string>& keys,
                                                Timeout timeout) {
  impl_->check_count(keys.size());
  for (const auto& key : keys) impl_->check_key(key);
  for (int attempt = 0; attempt < 2; ++attempt) {
    requests::key_list(impl_->request(), wire::Op::kMultiGet, keys);
    const auto d = impl_->deadline({});
    impl_->send(d);
    try {
      impl_->status(d, "MULTI_GET " + requests::describe_keys(keys));
    } catch (const StoreError& e) {
      if (e.code() != StoreErrc::kNotFound || attempt > 0) throw;
      wait(keys, timeout);
      continue;
    }
    std::vector<std::string> values;
    values.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) values.push_back(impl_->bytes(d));
    return values;
  }
  throw StoreError(StoreErrc::kNotFound,
                   "keys " + requests::describe_keys(keys) + " vanished after appearing");
}

void StoreClient::multi_set(const std::vector<std::pair<std::string, std::string>>& items) {
  impl_->check_count(items.size());
  for (const auto& [key, value] : items) impl_->check_value(key, value);
  requests::multi_set(impl_->request(), items);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "MULTI_SET of " + std::to_string(items.size()) + " keys");
}

bool StoreClient::delete_key(const std::string& key) {
  impl_->check_key(key);
  requests::key_only(impl_->request(), wire::Op::kDeleteKey, key);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "DELETE_KEY " + quote_key(key));
  return impl_->i64(d) > 0;
}

std::int64_t StoreClient::delete_all_except(const std::string& prefix) {
  impl_->check_key(prefix);
  requests::key_only(impl_->request(), wire::Op::kDeleteAllExcept, prefix);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "DELETE_ALL_EXCEPT " + quote_key(prefix));
  return impl_->i64(d);
}

std::int64_t StoreClient::num_keys() {
  requests::begin(impl_->request(), wire::Op::kGetNumKeys);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "GETNUMKEYS");
  return impl_->i64(d);
}

std::vector<std::string> StoreClient::list_keys() {
  requests::begin(impl_->request(), wire::Op::kListKeys);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "LIST_KEYS");
  const std::int64_t n = impl_->i64(d);
  std::vector<std::string> keys;
  for (std::int64_t i = 0; i < n; ++i) keys.push_back(impl_->bytes(d));
  return keys;
}

void StoreClient::barrier(const std::string& key, std::int64_t world_size, Timeout timeout) {
  impl_->check_key(key);
  requests::barrier(impl_->request(), key, world_size);
  const auto d = impl_->deadline(timeout);
  impl_->send(d);
  if (!impl_->await(d, "BARRIER " + quote_key(key))) {
    throw StoreError(StoreErrc::kTimeout,
                     "BARRIER " + quote_key(key) + " of " + std::to_string(world_size) +
                         " did not fill in time on the store at " + endpoint());
  }
}

void StoreClient::queue_push(const std::string& key, const std::string& value) {
  impl_->check_value(key, value);
  requests::key_value(impl_->request(), wire::Op::kQueuePush, key, value);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "QUEUE_PUSH " + quote_key(key));
}

std::optional<std::string> StoreClient::queue_pop(const std::string& key) {
  impl_->check_key(key);
  requests::key_only(impl_->request(), wire::Op::kQueuePop, key);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "QUEUE_POP " + quote_key(key));
  if (impl_->i64(d) <= 0) return std::nullopt;
  return impl_->bytes(d);
}

std::int64_t StoreClient::queue_len(const std::string& key) {
  impl_->check_key(key);
  requests::key_only(impl_->request(), wire::Op::kQueueLen, key);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "QUEUE_LEN " + quote_key(key));
  return impl_->i64(d);
}

std::uint32_t StoreClient::ping(std::uint32_t nonce) {
  requests::begin(impl_->request(), wire::Op::kPing).u32(nonce);
  const auto d = impl_->deadline({});
  impl_->send(d);
  impl_->status(d, "PING");
  return impl_->u32(d);
}

}  // namespace dist::store
