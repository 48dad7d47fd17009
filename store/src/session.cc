#include "session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "auth.h"
#include "text.h"

namespace dist::store {

using wire::Op;

namespace {

std::string op_name(Op op) {
  return std::string(wire::op_info(op).name);
}

constexpr std::uint64_t kWatchTicket =
    0;  // legacy watches never end, so need no ticket of their own
// Memory of one key's registration in a wait or watch besides the key's bytes (held twice: in the
// session and in the state's index): hash nodes, string headers, a bucket.
constexpr std::uint64_t kWaitEntryBookkeepingBytes = 256;
// Input buffers larger than this are shrunk once mostly consumed.
constexpr std::size_t kKeptInputCapacityBytes = 64 * 1024;

std::uint64_t registration_bytes(std::string_view key) {
  return kWaitEntryBookkeepingBytes + 2 * key.size();
}

// Gives `s` exactly `capacity` (std::string::reserve would round a growth below 2x up to 2x, and
// the doubled capacity is what the budget would have to count).
void grow_to(std::string& s, std::size_t capacity) {
  std::string bigger;
  bigger.reserve(capacity);
  bigger.append(s);
  s.swap(bigger);
}

std::string ms(std::chrono::milliseconds d) {
  return group_digits(static_cast<std::uint64_t>(d.count())) + " ms";
}

RequestError fatal(StoreErrc code, std::string message) {
  return RequestError{code, std::move(message), true};
}

}  // namespace

RequestError Session::request_too_large(std::uint64_t bytes) const {
  return fatal(StoreErrc::kLimitExceeded, "request of at least " + std::to_string(bytes) +
                                              " bytes is over the limit of " +
                                              std::to_string(state_.limits().max_request_bytes));
}

Session::Session(StoreState& state, PeerInfo peer, SessionOwner* owner)
    : state_(state), peer_(std::move(peer)), owner_(owner) {
  authorized_ = state_.options().secret.empty();
  connected_at_ = last_input_at_ = resumed_at_ = Clock::now();
  account();
}

Session::~Session() {
  cancel_waits();
  for (const auto& key : watched_keys_) state_.watchers().remove(key, this, kWatchTicket);
  for (const auto& key : ephemeral_keys_) state_.release_ephemeral(key, this);
  state_.recharge(this, charged_, 0);
}

// ---------------------------------------------------------------------------------------------
// Memory budgets

std::uint64_t Session::holding() const {
  return kBaseBytes + in_.capacity() + out_.capacity() + request_.spans.capacity() * sizeof(Span) +
         registered_bytes_ + parsing_wait_bytes_;
}

void Session::account() {
  const std::uint64_t now_holding = holding();
  state_.recharge(this, charged_, now_holding);
  charged_ = now_holding;
  const bool paused = !closing() && !wants_input();
  if (paused_ && !paused) resumed_at_ = Clock::now();
  paused_ = paused;
}

void Session::need_room(std::uint64_t more, const std::string& what) {
  account();
  const StoreLimits& limits = state_.limits();
  if (charged_ + more > limits.max_connection_bytes) {
    throw fatal(StoreErrc::kLimitExceeded,
                what + " would make this connection hold " + group_digits(charged_ + more) +
                    " bytes, over the limit of " + group_digits(limits.max_connection_bytes) +
                    " per connection (--max-connection-bytes)");
  }
  if (!state_.make_room(more, this, charged_ + more)) {
    throw fatal(StoreErrc::kLimitExceeded,
                what + " needs " + group_digits(more) + " more bytes; the server holds " +
                    group_digits(state_.held_bytes()) + " of its limit of " +
                    group_digits(limits.max_total_bytes) + " (--max-total-bytes)");
  }
}

void Session::enforce_budget() {
  account();
  const StoreLimits& limits = state_.limits();
  if (charged_ > limits.max_connection_bytes ||
      (state_.held_bytes() > limits.max_total_bytes && !state_.make_room(0, this, charged_))) {
    // Throws the error that says which limit.
    need_room(0, "what it holds (a partial request, unread replies, waits)");
  }
}

void Session::buffer_input(const char* data, std::size_t size) {
  // Grown here, by doubling or straight to the size the request declared, so that the memory
  // is accounted before it is taken.
  const std::uint64_t wanted = std::max<std::uint64_t>(in_.size() + size, need_);
  if (wanted > in_.capacity()) {
    std::uint64_t grown = std::max<std::uint64_t>(wanted, 2 * in_.capacity());
    if (charged_ - in_.capacity() + grown > state_.limits().max_connection_bytes) grown = wanted;
    need_room(grown - in_.capacity(), "a partial request");
    grow_to(in_, grown);
  }
  in_.append(data, size);
}

void Session::reserve_output(std::uint64_t bytes, const char* what) {
  if (out_.size() + bytes <= out_.capacity()) return;
  const std::uint64_t wanted = out_.size() + bytes;
  std::uint64_t grown = std::max<std::uint64_t>(wanted, 2 * out_.capacity());
  if (charged_ - out_.capacity() + grown > state_.limits().max_connection_bytes) grown = wanted;
  need_room(grown - out_.capacity(),
            std::string("a reply to ") + what + " of " + group_digits(bytes) + " bytes");
  grow_to(out_, grown);
}

void Session::evict(StoreErrc code, std::string reason) {
  close(code, std::move(reason));
  if (state_.is_current(this)) return;  // its own request is running: freed when it returns
  std::string().swap(in_);
  std::string().swap(out_);  // never sent now: the connection closes
  request_.spans = {};
  account();
  if (owner_) owner_->on_async_output();
}

// ---------------------------------------------------------------------------------------------
// Deadlines

bool Session::must_authenticate() const {
  return !state_.options().secret.empty() && !authorized_ && !policy_admits();
}

std::string Session::overdue(Clock::time_point now) const {
  if (closing()) return {};
  const Deadlines& d = state_.options().deadlines;
  if (d.auth_timeout.count() > 0 && must_authenticate() && now - connected_at_ > d.auth_timeout) {
    return "did not authenticate within " + ms(d.auth_timeout) +
           " of connecting (--auth-timeout-ms); the store requires the job's secret from this "
           "address";
  }
  if (d.request_timeout.count() > 0 && partial_since_ && !paused_ &&
      now - std::max(*partial_since_, resumed_at_) > d.request_timeout) {
    return "sent " + group_digits(in_.size()) + " bytes of a request of at least " +
           group_digits(std::max<std::uint64_t>(need_, in_.size() + 1)) +
           " and not the rest within " + ms(d.request_timeout) + " (--request-timeout-ms)";
  }
  if (d.idle_timeout.count() > 0 && waits_.empty() && watched_keys_.empty() && in_.empty() &&
      out_.empty() && now - last_input_at_ > d.idle_timeout) {
    return "idle for " + ms(d.idle_timeout) + " (--idle-timeout-ms)";
  }
  return {};
}

std::optional<std::pair<int, Session::Clock::time_point>> Session::eviction_rank() const {
  if (closing()) return std::nullopt;
  if (must_authenticate()) return std::make_pair(0, connected_at_);
  if (partial_since_ && !paused_) return std::make_pair(1, *partial_since_);
  return std::nullopt;
}

// ---------------------------------------------------------------------------------------------
// Input: incremental parsing

bool Session::wants_input() const {
  return !closing() && out_.size() <= state_.limits().max_reply_backlog_bytes;
}

void Session::feed(const char* data, std::size_t size) {
  if (closing()) return;
  in_feed_ = true;
  last_input_at_ = Clock::now();
  try {
    if (in_.empty()) {
      // Common case: whole requests straight from the socket's buffer, leftovers kept.
      std::size_t consumed = 0;
      process(data, size, &consumed);
      if (!closing() && consumed < size) buffer_input(data + consumed, size - consumed);
    } else {
      buffer_input(data, size);
      if (in_.size() >= need_) resume();
    }
    if (!closing()) enforce_budget();  // a wait being received may have outgrown the room
  } catch (const RequestError& e) {    // no room for what arrived
    fail(e);
  }
  if (in_.empty() || closing()) {
    partial_since_.reset();
  } else if (!partial_since_) {
    partial_since_ = last_input_at_;
  }
  account();
  in_feed_ = false;
}

void Session::resume() {
  if (in_.empty() || in_.size() < need_) return;
  std::size_t consumed = 0;
  process(in_.data(), in_.size(), &consumed);
  in_.erase(0, consumed);
  if (in_.empty()) partial_since_.reset();
  if (in_.capacity() > kKeptInputCapacityBytes && in_.size() < in_.capacity() / 4) {
    in_.shrink_to_fit();
  }
  account();
}

void Session::process(const char* data, std::size_t size, std::size_t* consumed) {
  *consumed = 0;
  need_ = 0;
  const CurrentSession current(state_, this);
  while (*consumed < size && wants_input()) {
    std::size_t n = 0;
    try {
      n = handle_one(data + *consumed, size - *consumed);
      if (n > 0) parsing_wait_bytes_ = 0;
      if (n > 0) enforce_budget();
    } catch (const RequestError& e) {
      parsing_wait_bytes_ = 0;
      fail(e);
      if (closing()) return;
      n = request_length_;  // non-fatal errors come from whole requests: skip exactly that one
    }
    if (n == 0) return;  // incomplete: need_ says how much to wait for
    *consumed += n;
    request_.spans.clear();
    if (request_.spans.capacity() > 1024) request_.spans = {};
    list_resume_offset_ = 0;
  }
}

bool Session::detect_dialect(const char* data, std::size_t size) {
  // A current client opens with VALIDATE (0x00) and the magic; anything else is a legacy client.
  if (size < 1) return false;
  if (data[0] != wire::current::kValidate) {
    dialect_ = wire::Dialect::kLegacy;
    return true;
  }
  if (size < 5) return false;
  std::uint32_t magic = 0;
  std::memcpy(&magic, data + 1, sizeof magic);
  dialect_ = magic == wire::kValidateMagic ? wire::Dialect::kCurrent : wire::Dialect::kLegacy;
  return true;
}

Session::Span Session::read_fixed(wire::Reader& r, const char* base, std::size_t size) {
  std::string_view bytes = r.take(size);
  return Span{bytes.empty() ? 0 : static_cast<std::uint64_t>(bytes.data() - base), bytes.size()};
}

Session::Span Session::read_key(wire::Reader& r, const char* base) {
  std::uint64_t length = 0;
  std::string_view key = r.bytes(&length);
  if (length > state_.limits().max_key_bytes) {
    throw fatal(StoreErrc::kLimitExceeded, "key of " + std::to_string(length) +
                                               " bytes is over the limit of " +
                                               std::to_string(state_.limits().max_key_bytes));
  }
  return Span{static_cast<std::uint64_t>(key.data() - base), key.size()};
}

Session::Span Session::read_value(wire::Reader& r, const char* base) {
  std::uint64_t length = 0;
  std::string_view value = r.bytes(&length);
  if (length > state_.limits().max_value_bytes) {
    throw fatal(StoreErrc::kLimitExceeded, "value of " + std::to_string(length) +
                                               " bytes is over the limit of " +
                                               std::to_string(state_.limits().max_value_bytes));
  }
  return Span{value.empty() ? 0 : static_cast<std::uint64_t>(value.data() - base), value.size()};
}

// Reads "count, then count keys (or key/value pairs)" into request_.spans. A list that is not all
// there yet is resumed at the first incomplete item when more bytes arrive, so a long request
// trickling in is parsed once, not once per packet.
bool Session::read_key_list(wire::Reader& r, const char* base, bool with_values,
                            bool counts_as_wait) {
  if (list_resume_offset_ == 0) {
    list_count_ = r.u64();
    if (r.short_by()) return false;
    if (list_count_ > state_.limits().max_keys_per_request) {
      throw fatal(StoreErrc::kLimitExceeded,
                  std::to_string(list_count_) + " keys in one request is over the limit of " +
                      std::to_string(state_.limits().max_keys_per_request));
    }
    request_.spans.clear();
    list_resume_offset_ = static_cast<std::uint64_t>(r.position() - base);
  } else {
    r.take(list_resume_offset_ - static_cast<std::uint64_t>(r.position() - base));
  }
  const std::size_t per_item = with_values ? 2 : 1;
  std::vector<Span>& spans = request_.spans;
  while (spans.size() < list_count_ * per_item) {
    Span key = read_key(r, base);
    Span value = with_values ? read_value(r, base) : Span{};
    if (r.short_by()) return false;
    spans.push_back(key);
    if (with_values) spans.push_back(value);
    // What the wait will hold counts while the request arrives, so that an impossible wait is
    // refused early instead of after all of it was read.
    if (counts_as_wait) parsing_wait_bytes_ += registration_bytes(view(base, key));
    list_resume_offset_ = static_cast<std::uint64_t>(r.position() - base);
  }
  return true;
}

std::size_t Session::handle_one(const char* base, std::size_t size) {
  if (dialect_ == wire::Dialect::kUnknown && !detect_dialect(base, size)) {
    need_ = 5;
    return 0;
  }
  wire::Reader r(base, size);
  const std::uint8_t type = r.u8();
  const std::optional<Op> op = wire::decode_op(dialect_, type);
  if (!op) {
    throw fatal(StoreErrc::kProtocol,
                "unknown query type " + std::to_string(type) + " (" +
                    (dialect_ == wire::Dialect::kLegacy ? "legacy" : "current") + " dialect)");
  }
  if (*op == Op::kValidate && dialect_ != wire::Dialect::kCurrent) {
    throw fatal(StoreErrc::kProtocol, "VALIDATE from a legacy client");
  }
  check_authorized(*op);

  if (list_resume_offset_ == 0) request_.spans.clear();
  request_.op = *op;
  const bool complete = parse_arguments(r, base);
  const std::uint64_t max_request = state_.limits().max_request_bytes;
  if (!complete || r.short_by()) {
    need_ = size + std::max<std::uint64_t>(r.short_by(), 1);
    if (need_ > max_request) throw request_too_large(need_);
    return 0;
  }
  request_length_ = static_cast<std::size_t>(r.position() - base);
  if (request_length_ > max_request) throw request_too_large(request_length_);
  ++state_.requests_by_op[static_cast<std::size_t>(*op)];
  check_permitted(request_, base);
  execute(request_, base);
  return request_length_;
}

bool Session::parse_arguments(wire::Reader& r, const char* base) {
  Request& q = request_;
  switch (wire::op_info(q.op).args) {
    case wire::Args::kNone:
      return true;
    case wire::Args::kU32:
      q.u32 = r.u32();
      return true;
    case wire::Args::kHello:
      q.u32 = r.u32();  // the client's extension version
      q.u64 = r.u64();  // flags
      return true;
    case wire::Args::kKey:
      q.spans.push_back(read_key(r, base));
      return true;
    case wire::Args::kKeyI64:
      q.spans.push_back(read_key(r, base));
      q.number = r.i64();
      return true;
    case wire::Args::kKeyValue:
    case wire::Args::kKeyValueFlags:
    case wire::Args::kKeyTwoValues:
      q.spans.push_back(read_key(r, base));
      q.spans.push_back(read_value(r, base));
      if (wire::op_info(q.op).args == wire::Args::kKeyTwoValues) {
        q.spans.push_back(read_value(r, base));
      }
      if (wire::op_info(q.op).args == wire::Args::kKeyValueFlags) q.flags = r.u8();
      return true;
    case wire::Args::kKeyList:
      return read_key_list(r, base, /*with_values=*/false);
    case wire::Args::kWaitList:
      return read_key_list(r, base, /*with_values=*/false, /*counts_as_wait=*/true);
    case wire::Args::kKeyValueList:
      return read_key_list(r, base, /*with_values=*/true);
    case wire::Args::kAuth:
      q.spans.push_back(read_fixed(r, base, wire::ext::kMacBytes));
      q.spans.push_back(read_fixed(r, base, wire::ext::kNonceBytes));
      return true;
  }
  return true;
}

bool Session::policy_admits() const {
  switch (state_.options().unauthenticated) {
    case UnauthenticatedPolicy::kDeny:
      return false;
    case UnauthenticatedPolicy::kLoopback:
      return peer_.loopback;
    case UnauthenticatedPolicy::kKnownHosts:
      return peer_.loopback || state_.is_known_host(peer_.host);
    case UnauthenticatedPolicy::kAllow:
      return true;
  }
  return false;
}

void Session::check_authorized(Op op) {
  if (authorized_ || wire::op_info(op).access == wire::Access::kHandshake) return;
  if (!policy_admits()) {
    throw fatal(StoreErrc::kUnauthenticated,
                op_name(op) +
                    " before authenticating: this store requires the shared secret "
                    "(pass the job's token file) or a connection from a permitted host");
  }
  authorized_ = true;
  restricted_ = true;  // only reached when a secret is set
}

// A connection the policy let in without the secret (a PyTorch worker) gets PyTorch's operations
// on the job's keys: not dist-launch's extensions, which act on other clients (ephemeral keys,
// deleting every key, watching agents leave), and not the agents' own keys.
void Session::check_permitted(const Request& q, const char* base) const {
  if (!restricted_) return;
  const wire::OpInfo& info = wire::op_info(q.op);
  auto refuse = [&](const std::string& what) {
    throw fatal(StoreErrc::kUnauthenticated,
                what +
                    " needs authentication: a connection admitted without the store's secret "
                    "(--unauthenticated) may use PyTorch's operations on the job's keys only");
  };
  if (info.access == wire::Access::kAuthenticatedOnly) refuse(op_name(q.op));
  if (info.access != wire::Access::kJobKeys) return;
  const std::string& prefix = state_.options().agent_key_prefix;
  const std::size_t step = info.args == wire::Args::kKeyValueList ? 2 : 1;  // keys, not values
  const bool lists = info.args == wire::Args::kKeyList || info.args == wire::Args::kWaitList ||
                     info.args == wire::Args::kKeyValueList;
  const std::size_t keys = lists ? q.spans.size() : std::min<std::size_t>(q.spans.size(), 1);
  for (std::size_t i = 0; i < keys; i += step) {
    const std::string_view key = view(base, q.spans[i]);
    if (state_.is_agent_key(key)) {
      refuse(op_name(q.op) + " of key " + quote_key(key) + " (keys under '" + prefix +
             "' belong to dist-launch's agents)");
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Execution

void Session::execute(const Request& q, const char* base) {
  switch (q.op) {
    case Op::kValidate:
    case Op::kPing:
    case Op::kHello:
    case Op::kAuth:
      return execute_handshake(q, base);
    case Op::kSet:
    case Op::kSetExt:
    case Op::kCompareSet:
    case Op::kGet:
    case Op::kAdd:
    case Op::kAppend:
    case Op::kDeleteKey:
    case Op::kDeleteAllExcept:
    case Op::kWatchKey:
      return execute_key(q, base);
    case Op::kCheck:
    case Op::kWait:
    case Op::kWaitDeleted:
    case Op::kMultiGet:
    case Op::kMultiSet:
    case Op::kBarrier:
    case Op::kCancelWait:
      return execute_list(q, base);
    case Op::kGetNumKeys:
    case Op::kQueuePush:
    case Op::kQueuePop:
    case Op::kQueueLen:
    case Op::kListKeys:
      return execute_queue(q, base);
  }
}

void Session::execute_handshake(const Request& q, const char* base) {
  switch (q.op) {
    case Op::kValidate:
      if (q.u32 != wire::kValidateMagic) throw fatal(StoreErrc::kProtocol, "bad VALIDATE magic");
      return;
    case Op::kPing:
      begin_reply();
      wire::Writer(out_).u32(q.u32);
      return;
    case Op::kHello: {
      if (dialect_ != wire::Dialect::kCurrent) {
        throw fatal(StoreErrc::kProtocol, "HELLO outside the current dialect");
      }
      framed_ = true;
      if ((q.u64 & wire::ext::kHelloFlagKeepalive) && owner_) {
        const auto field = [&](int shift) {
          return static_cast<int>((q.u64 >> shift) & wire::ext::kHelloFieldMax);
        };
        const Keepalive asked{field(wire::ext::kHelloIdleShift),
                              field(wire::ext::kHelloIntervalShift),
                              field(wire::ext::kHelloProbesShift)};
        if (asked.idle_seconds > 0 && asked.interval_seconds > 0 && asked.probes > 0) {
          // A client that must prove the secret first gets its schedule once it has.
          if (must_authenticate()) {
            asked_keepalive_ = asked;
          } else {
            owner_->on_keepalive_asked(asked);
          }
        }
      }
      begin_reply();
      wire::Writer w(out_);
      const StoreLimits& l = state_.limits();
      w.u32(wire::ext::kVersion);
      for (std::uint64_t v : {l.max_key_bytes, l.max_value_bytes, l.max_keys_per_request,
                              l.max_request_bytes, l.max_total_bytes}) {
        w.u64(v);
      }
      const bool auth_required = !state_.options().secret.empty();
      w.u8(auth_required ? 1 : 0);
      if (auth_required) {
        const auto nonce = auth::random_nonce();
        std::copy(nonce.begin(), nonce.end(), server_nonce_.begin());
        nonce_issued_ = true;
        w.raw(server_nonce_.data(), server_nonce_.size());
      }
      return;
    }
    case Op::kAuth: {
      if (!framed_ || !nonce_issued_) {
        throw fatal(StoreErrc::kProtocol, "AUTH without a HELLO that issued a challenge");
      }
      nonce_issued_ = false;  // one attempt per challenge
      const std::string& secret = state_.options().secret;
      auth::Nonce client_nonce{};
      std::memcpy(client_nonce.data(), view(base, q.spans[1]).data(), client_nonce.size());
      const auth::Mac expected = auth::client_proof(secret, server_nonce_, client_nonce);
      if (!auth::equal(expected.data(),
                       reinterpret_cast<const unsigned char*>(view(base, q.spans[0]).data()),
                       expected.size())) {
        throw fatal(StoreErrc::kUnauthenticated,
                    "authentication failed: the client's secret does not match the store's");
      }
      authorized_ = true;
      state_.remember_authenticated_host(peer_.host);
      if (asked_keepalive_ && owner_) owner_->on_keepalive_asked(*asked_keepalive_);
      asked_keepalive_.reset();
      begin_reply();
      const auth::Mac proof = auth::server_proof(secret, server_nonce_, client_nonce);
      wire::Writer(out_).raw(proof.data(), proof.size());
      return;
    }
    default:
      return;
  }
}

void Session::execute_key(const Request& q, const char* base) {
  const std::string_view key = view(base, q.spans[0]);
  auto value = [&](std::size_t i) { return view(base, q.spans[i]); };
  switch (q.op) {
    case Op::kSet:
      state_.set(key, value(1));
      return reply_ack();
    case Op::kSetExt: {
      const bool ephemeral = q.flags & wire::ext::kSetFlagEphemeral;
      state_.set(key, value(1), ephemeral ? this : nullptr);
      if (ephemeral &&
          std::find(ephemeral_keys_.begin(), ephemeral_keys_.end(), key) == ephemeral_keys_.end()) {
        registered_bytes_ += registration_bytes(key);  // no room check: the key is stored
        ephemeral_keys_.emplace_back(key);
      }
      return reply_ack();
    }
    case Op::kCompareSet:
      return reply_bytes(state_.compare_set(key, value(1), value(2)));
    case Op::kGet: {
      if (const std::string* found = state_.find(key)) return reply_bytes(*found);
      if (framed_) {
        return reply_error(
            RequestError{StoreErrc::kNotFound, "key " + quote_key(key) + " not found"});
      }
      if (dialect_ == wire::Dialect::kLegacy) {
        throw fatal(StoreErrc::kNotFound, "GET of missing key " + quote_key(key));
      }
      return reply_bytes({});
    }
    case Op::kAdd:
      return reply_i64(state_.add(key, q.number, /*wrap_on_overflow=*/!framed_));
    case Op::kAppend:
      state_.append(key, value(1));
      return reply_ack();
    case Op::kDeleteKey:
      return reply_i64(state_.erase(key) ? 1 : 0);
    case Op::kDeleteAllExcept: {
      const std::size_t n =
          state_.erase_if([key](std::string_view other) { return !other.starts_with(key); });
      return reply_i64(static_cast<std::int64_t>(n));
    }
    case Op::kWatchKey:
      need_room(registration_bytes(key), "WATCH_KEY");
      registered_bytes_ += registration_bytes(key);
      state_.watchers().add(key, {this, kWatchTicket, 0});
      watched_keys_.emplace_back(key);
      return reply_u8(wire::kWatchCallbackRegistered);
    default:
      return;
  }
}

void Session::execute_list(const Request& q, const char* base) {
  auto arg = [&](std::size_t i) { return view(base, q.spans[i]); };
  switch (q.op) {
    case Op::kCheck: {
      bool all = true;
      for (std::size_t i = 0; i < q.spans.size() && all; ++i) all = state_.exists(arg(i));
      return reply_u8(all ? wire::kCheckReady : wire::kCheckNotReady);
    }
    case Op::kWait:
    case Op::kWaitDeleted: {
      std::vector<std::string_view> keys;
      keys.reserve(q.spans.size());
      for (std::size_t i = 0; i < q.spans.size(); ++i) keys.push_back(arg(i));
      return start_wait(q.op == Op::kWait ? WaitKind::kAllExist : WaitKind::kAnyDeleted, keys, 0);
    }
    case Op::kMultiGet:
      return reply_multi_get(q, base);
    case Op::kMultiSet: {
      std::vector<std::pair<std::string_view, std::string_view>> items;
      items.reserve(q.spans.size() / 2);
      for (std::size_t i = 0; i + 1 < q.spans.size(); i += 2) {
        items.emplace_back(arg(i), arg(i + 1));
      }
      state_.multi_set(items);
      return reply_ack();
    }
    case Op::kBarrier: {
      const std::int64_t count = state_.add(arg(0), 1, /*wrap_on_overflow=*/!framed_);
      if (count >= q.number) return reply_u8(wire::kStopWaiting);
      return start_wait(WaitKind::kBarrier, {arg(0)}, q.number);
    }
    case Op::kCancelWait:
      cancel_waits();
      return reply_u8(wire::kWaitCanceled);
    default:
      return;
  }
}

void Session::reply_multi_get(const Request& q, const char* base) {
  // Checked first, so that an error frame replaces the whole reply.
  for (std::size_t i = 0; framed_ && i < q.spans.size(); ++i) {
    if (!state_.find(view(base, q.spans[i]))) {
      throw RequestError{StoreErrc::kNotFound,
                         "key " + quote_key(view(base, q.spans[i])) + " not found"};
    }
  }
  std::uint64_t bytes = 1;
  for (const Span& key : q.spans) {
    const std::string* value = state_.find(view(base, key));
    bytes += 8 + (value ? value->size() : 0);
  }
  reserve_output(bytes, "MULTI_GET");
  begin_reply();
  wire::Writer w(out_);
  for (const Span& key : q.spans) {
    const std::string* value = state_.find(view(base, key));
    w.bytes(value ? std::string_view(*value) : std::string_view());
  }
}

void Session::execute_queue(const Request& q, const char* base) {
  switch (q.op) {
    case Op::kGetNumKeys:
      return reply_i64(static_cast<std::int64_t>(state_.num_keys() -
                                                 (restricted_ ? state_.num_agent_keys() : 0)));
    case Op::kQueuePush:
      state_.queue_push(view(base, q.spans[0]), view(base, q.spans[1]));
      return reply_ack();
    case Op::kQueuePop: {
      const std::string_view key = view(base, q.spans[0]);
      const std::size_t length = state_.queue_len(key);
      std::string value;
      state_.queue_pop(key, &value);
      reserve_output(17 + value.size(), "QUEUE_POP");
      reply_i64(static_cast<std::int64_t>(length));
      if (length > 0) wire::Writer(out_).bytes(value);
      return;
    }
    case Op::kQueueLen:
      return reply_i64(static_cast<std::int64_t>(state_.queue_len(view(base, q.spans[0]))));
    case Op::kListKeys:
      return reply_list_keys();
    default:
      return;
  }
}

void Session::reply_list_keys() {
  auto keys = state_.list_keys();
  if (restricted_) std::erase_if(keys, [&](std::string_view k) { return state_.is_agent_key(k); });
  std::uint64_t bytes = 9;
  for (std::string_view key : keys) bytes += 8 + key.size();
  reserve_output(bytes, "LIST_KEYS");
  reply_i64(static_cast<std::int64_t>(keys.size()));
  wire::Writer w(out_);
  for (std::string_view key : keys) w.bytes(key);
}

// ---------------------------------------------------------------------------------------------
// Replies

void Session::begin_reply() {
  if (framed_) out_.push_back(static_cast<char>(wire::kStatusOk));
}
void Session::reply_u8(std::uint8_t v) {
  begin_reply();
  out_.push_back(static_cast<char>(v));
}
void Session::reply_i64(std::int64_t v) {
  begin_reply();
  wire::Writer(out_).i64(v);
}
void Session::reply_bytes(std::string_view v) {
  reserve_output(9 + v.size(), "a read");
  begin_reply();
  wire::Writer(out_).bytes(v);
}
void Session::reply_ack() {
  if (framed_) out_.push_back(static_cast<char>(wire::kStatusOk));
}
void Session::reply_error(const RequestError& e) {
  out_.push_back(static_cast<char>(e.code));
  wire::Writer(out_).bytes(e.message);
}

void Session::fail(const RequestError& e) {
  if (framed_) reply_error(e);
  if (e.fatal || !framed_) {
    close(e.code, std::string(to_string(e.code)) + ": " + e.message);
  }
}

void Session::close(StoreErrc code, std::string reason) {
  if (closing()) return;
  close_code_ = code;
  close_reason_ = std::move(reason);
  cancel_waits();
}

// ---------------------------------------------------------------------------------------------
// Waits

void Session::start_wait(WaitKind kind, const std::vector<std::string_view>& keys,
                         std::int64_t target) {
  std::vector<std::string_view> registered;  // the keys to wait on, copied once room is made
  WaiterIndex* index = nullptr;
  Op op = Op::kWait;
  switch (kind) {
    case WaitKind::kAllExist:
      index = &state_.creation_waiters();
      for (std::string_view key : keys) {
        if (!state_.exists(key)) registered.push_back(key);
      }
      if (registered.empty()) {
        reply_u8(wire::kStopWaiting);
        return;
      }
      break;
    case WaitKind::kAnyDeleted:
      index = &state_.deletion_waiters();
      op = Op::kWaitDeleted;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (!state_.find(keys[i])) {
          reply_u8(wire::kKeyGone);
          wire::Writer(out_).u64(i);
          return;
        }
      }
      registered = keys;
      break;
    case WaitKind::kBarrier:
      index = &state_.barrier_waiters();
      op = Op::kBarrier;
      registered.push_back(keys.front());
      break;
  }
  PendingWait wait{next_ticket_++, kind, kind == WaitKind::kAllExist ? registered.size() : 1, {}};
  for (std::string_view key : registered) wait.bytes += registration_bytes(key);
  parsing_wait_bytes_ = 0;  // replaced by what the wait really registers
  need_room(wait.bytes, op_name(op) + " on " + group_digits(registered.size()) + " keys");
  registered_bytes_ += wait.bytes;
  wait.keys.assign(registered.begin(), registered.end());
  for (const auto& key : wait.keys) index->add(key, {this, wait.ticket, target});
  waits_.push_back(std::move(wait));
}

void Session::finish_wait(std::size_t index) {
  PendingWait& wait = waits_[index];
  WaiterIndex& keys_index = wait.kind == WaitKind::kAnyDeleted ? state_.deletion_waiters()
                            : wait.kind == WaitKind::kBarrier  ? state_.barrier_waiters()
                                                               : state_.creation_waiters();
  for (const auto& key : wait.keys) keys_index.remove(key, this, wait.ticket);
  registered_bytes_ -= wait.bytes;
  waits_.erase(waits_.begin() + static_cast<std::ptrdiff_t>(index));
}

void Session::cancel_waits() {
  while (!waits_.empty()) finish_wait(waits_.size() - 1);
}

void Session::on_key_created(std::uint64_t ticket) {
  for (std::size_t i = 0; i < waits_.size(); ++i) {
    if (waits_[i].ticket != ticket) continue;
    if (--waits_[i].remaining == 0) {
      finish_wait(i);
      reply_u8(wire::kStopWaiting);
      after_async_output();
    }
    return;
  }
}

void Session::on_key_deleted(std::uint64_t ticket, std::string_view key) {
  for (std::size_t i = 0; i < waits_.size(); ++i) {
    if (waits_[i].ticket != ticket) continue;
    const auto& keys = waits_[i].keys;
    const std::uint64_t position =
        static_cast<std::uint64_t>(std::find(keys.begin(), keys.end(), key) - keys.begin());
    finish_wait(i);
    reply_u8(wire::kKeyGone);
    wire::Writer(out_).u64(position);
    after_async_output();
    return;
  }
}

void Session::on_barrier_reached(std::uint64_t ticket) {
  for (std::size_t i = 0; i < waits_.size(); ++i) {
    if (waits_[i].ticket != ticket) continue;
    finish_wait(i);
    reply_u8(wire::kStopWaiting);
    after_async_output();
    return;
  }
}

void Session::on_watch_event(std::uint8_t event, std::string_view key, std::string_view old_value,
                             std::string_view new_value) {
  if (closing()) return;
  // Legacy watch notification: event type, key, old value, new value.
  try {
    reserve_output(25 + key.size() + old_value.size() + new_value.size(), "WATCH_KEY");
  } catch (const RequestError& e) {  // a watcher that does not read is closed, not the writer
    evict(e.code, e.message);
    return;
  }
  wire::Writer w(out_);
  w.u8(event);
  w.bytes(key);
  w.bytes(old_value);
  w.bytes(new_value);
  after_async_output();
}

void Session::after_async_output() {
  // Output produced while this session handles its own input is flushed (and accounted) by the
  // server afterwards.
  if (in_feed_) return;
  if (owner_) owner_->on_async_output();
  account();
  if (!closing() && charged_ > state_.limits().max_connection_bytes) {
    evict(StoreErrc::kLimitExceeded,
          "its unread replies make it hold " + group_digits(charged_) +
              " bytes, over the limit per connection (--max-connection-bytes)");
  }
}

}  // namespace dist::store
