#include "session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "auth.h"
#include "text.h"

namespace dist::rendezvous {

using wire::Op;

namespace {

std::string op_name(Op op) {
  switch (op) {
    case Op::kValidate:
      return "VALIDATE";
    case Op::kSet:
      return "SET";
    case Op::kCompareSet:
      return "COMPARE_SET";
    case Op::kGet:
      return "GET";
    case Op::kAdd:
      return "ADD";
    case Op::kCheck:
      return "CHECK";
    case Op::kWait:
      return "WAIT";
    case Op::kGetNumKeys:
      return "GETNUMKEYS";
    case Op::kWatchKey:
      return "WATCH_KEY";
    case Op::kDeleteKey:
      return "DELETE_KEY";
    case Op::kAppend:
      return "APPEND";
    case Op::kMultiGet:
      return "MULTI_GET";
    case Op::kMultiSet:
      return "MULTI_SET";
    case Op::kCancelWait:
      return "CANCEL_WAIT";
    case Op::kPing:
      return "PING";
    case Op::kQueuePush:
      return "QUEUE_PUSH";
    case Op::kQueuePop:
      return "QUEUE_POP";
    case Op::kQueueLen:
      return "QUEUE_LEN";
    case Op::kListKeys:
      return "LIST_KEYS";
    case Op::kBarrier:
      return "BARRIER";
    case Op::kHello:
      return "HELLO";
    case Op::kAuth:
      return "AUTH";
    case Op::kSetExt:
      return "SET_EXT";
    case Op::kWaitDeleted:
      return "WAIT_DELETED";
    case Op::kDeleteAllExcept:
      return "DELETE_ALL_EXCEPT";
  }
  return "?";
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
  return kBaseBytes + in_.capacity() + out_.capacity() + spans_.capacity() * sizeof(Span) +
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
  spans_ = {};
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
    spans_.clear();
    if (spans_.capacity() > 1024) spans_ = {};
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

// Reads "count, then count keys (or key/value pairs)" into spans_. A list that is not all there
// yet is resumed at the first incomplete item when more bytes arrive, so a long request trickling
// in is parsed once, not once per packet.
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
    spans_.clear();
    list_resume_offset_ = static_cast<std::uint64_t>(r.position() - base);
  } else {
    r.take(list_resume_offset_ - static_cast<std::uint64_t>(r.position() - base));
  }
  const std::size_t per_item = with_values ? 2 : 1;
  while (spans_.size() < list_count_ * per_item) {
    Span key = read_key(r, base);
    Span value = with_values ? read_value(r, base) : Span{};
    if (r.short_by()) return false;
    spans_.push_back(key);
    if (with_values) spans_.push_back(value);
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

  // Parse the arguments into spans_ / number_ / u32_ / flags_.
  if (list_resume_offset_ == 0) spans_.clear();
  bool complete = true;
  switch (*op) {
    case Op::kValidate:
    case Op::kPing:
      u32_ = r.u32();
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      spans_.push_back(read_key(r, base));
      spans_.push_back(read_value(r, base));
      break;
    case Op::kSetExt:
      spans_.push_back(read_key(r, base));
      spans_.push_back(read_value(r, base));
      flags_ = r.u8();
      break;
    case Op::kCompareSet:
      spans_.push_back(read_key(r, base));
      spans_.push_back(read_value(r, base));
      spans_.push_back(read_value(r, base));
      break;
    case Op::kGet:
    case Op::kWatchKey:
    case Op::kDeleteKey:
    case Op::kDeleteAllExcept:
    case Op::kQueuePop:
    case Op::kQueueLen:
      spans_.push_back(read_key(r, base));
      break;
    case Op::kAdd:
    case Op::kBarrier:
      spans_.push_back(read_key(r, base));
      number_ = r.i64();
      break;
    case Op::kCheck:
    case Op::kMultiGet:
      complete = read_key_list(r, base, /*with_values=*/false);
      break;
    case Op::kWait:
    case Op::kWaitDeleted:
      complete = read_key_list(r, base, /*with_values=*/false, /*counts_as_wait=*/true);
      break;
    case Op::kMultiSet:
      complete = read_key_list(r, base, /*with_values=*/true);
      break;
    case Op::kHello:
      u32_ = r.u32();  // the client's extension version
      r.u64();         // flags, reserved
      break;
    case Op::kAuth:
      spans_.push_back(read_fixed(r, base, wire::ext::kMacBytes));
      spans_.push_back(read_fixed(r, base, wire::ext::kNonceBytes));
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
  const std::uint64_t max_request = state_.limits().max_request_bytes;
  if (!complete || r.short_by()) {
    need_ = size + std::max<std::uint64_t>(r.short_by(), 1);
    if (need_ > max_request) throw request_too_large(need_);
    return 0;
  }
  request_length_ = static_cast<std::size_t>(r.position() - base);
  if (request_length_ > max_request) throw request_too_large(request_length_);
  ++state_.requests;
  check_permitted(*op, base);
  execute(*op, base);
  return request_length_;
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
  if (authorized_ || op == Op::kValidate || op == Op::kHello || op == Op::kAuth) return;
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
void Session::check_permitted(Op op, const char* base) const {
  if (!restricted_) return;
  auto refuse = [&](const std::string& what) {
    throw fatal(StoreErrc::kUnauthenticated,
                what +
                    " needs authentication: a connection admitted without the store's secret "
                    "(--unauthenticated) may use PyTorch's operations on the job's keys only");
  };
  const std::string& prefix = state_.options().agent_key_prefix;
  auto check_key = [&](Span key) {
    if (state_.is_agent_key(view(base, key))) {
      refuse(op_name(op) + " of key " + quote_key(view(base, key)) + " (keys under '" + prefix +
             "' belong to dist-launch's agents)");
    }
  };
  switch (op) {
    case Op::kSetExt:
    case Op::kWaitDeleted:
    case Op::kDeleteAllExcept:
      refuse(op_name(op));
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      for (const Span& key : spans_) check_key(key);
      break;
    case Op::kMultiSet:
      for (std::size_t i = 0; i < spans_.size(); i += 2) check_key(spans_[i]);
      break;
    default:
      if (!spans_.empty() && op != Op::kAuth) check_key(spans_.front());
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Execution

void Session::execute(Op op, const char* base) {
  auto arg = [&](std::size_t i) { return view(base, spans_[i]); };
  switch (op) {
    case Op::kValidate:
      if (u32_ != wire::kValidateMagic) throw fatal(StoreErrc::kProtocol, "bad VALIDATE magic");
      return;
    case Op::kPing:
      begin_reply();
      wire::Writer(out_).u32(u32_);
      return;
    case Op::kSet:
      state_.set(arg(0), arg(1));
      reply_ack();
      return;
    case Op::kSetExt: {
      const bool ephemeral = flags_ & wire::ext::kSetFlagEphemeral;
      state_.set(arg(0), arg(1), ephemeral ? this : nullptr);
      if (ephemeral && std::find(ephemeral_keys_.begin(), ephemeral_keys_.end(), arg(0)) ==
                           ephemeral_keys_.end()) {
        registered_bytes_ += registration_bytes(arg(0));  // no room check: the key is stored
        ephemeral_keys_.emplace_back(arg(0));
      }
      reply_ack();
      return;
    }
    case Op::kCompareSet:
      reply_bytes(state_.compare_set(arg(0), arg(1), arg(2)));
      return;
    case Op::kGet: {
      const std::string* value = state_.find(arg(0));
      if (value) {
        reply_bytes(*value);
      } else if (framed_) {
        reply_error(RequestError{StoreErrc::kNotFound, "key " + quote_key(arg(0)) + " not found"});
      } else if (dialect_ == wire::Dialect::kLegacy) {
        throw fatal(StoreErrc::kNotFound, "GET of missing key " + quote_key(arg(0)));
      } else {
        reply_bytes({});
      }
      return;
    }
    case Op::kAdd:
      reply_i64(state_.add(arg(0), number_, /*wrap_on_overflow=*/!framed_));
      return;
    case Op::kAppend:
      state_.append(arg(0), arg(1));
      reply_ack();
      return;
    case Op::kCheck: {
      bool all = true;
      for (std::size_t i = 0; i < spans_.size() && all; ++i) all = state_.exists(arg(i));
      reply_u8(all ? wire::kCheckReady : wire::kCheckNotReady);
      return;
    }
    case Op::kWait:
    case Op::kWaitDeleted: {
      std::vector<std::string_view> keys;
      keys.reserve(spans_.size());
      for (std::size_t i = 0; i < spans_.size(); ++i) keys.push_back(arg(i));
      start_wait(op == Op::kWait ? WaitKind::kAllExist : WaitKind::kAnyDeleted, keys, 0);
      return;
    }
    case Op::kGetNumKeys:
      reply_i64(static_cast<std::int64_t>(state_.num_keys() -
                                          (restricted_ ? state_.num_agent_keys() : 0)));
      return;
    case Op::kDeleteKey:
      reply_i64(state_.erase(arg(0)) ? 1 : 0);
      return;
    case Op::kDeleteAllExcept: {
      const std::string_view kept = arg(0);
      const std::size_t n =
          state_.erase_if([kept](std::string_view key) { return !key.starts_with(kept); });
      reply_i64(static_cast<std::int64_t>(n));
      return;
    }
    case Op::kMultiGet: {
      // Check first, so that an error frame replaces the whole reply.
      for (std::size_t i = 0; framed_ && i < spans_.size(); ++i) {
        if (!state_.find(arg(i))) {
          throw RequestError{StoreErrc::kNotFound, "key " + quote_key(arg(i)) + " not found"};
        }
      }
      std::uint64_t bytes = 1;
      for (std::size_t i = 0; i < spans_.size(); ++i) {
        const std::string* value = state_.find(arg(i));
        bytes += 8 + (value ? value->size() : 0);
      }
      reserve_output(bytes, "MULTI_GET");
      begin_reply();
      wire::Writer w(out_);
      for (std::size_t i = 0; i < spans_.size(); ++i) {
        const std::string* value = state_.find(arg(i));
        w.bytes(value ? std::string_view(*value) : std::string_view());
      }
      return;
    }
    case Op::kMultiSet: {
      std::vector<std::pair<std::string_view, std::string_view>> items;
      items.reserve(spans_.size() / 2);
      for (std::size_t i = 0; i + 1 < spans_.size(); i += 2) items.emplace_back(arg(i), arg(i + 1));
      state_.multi_set(items);
      reply_ack();
      return;
    }
    case Op::kCancelWait:
      cancel_waits();
      reply_u8(wire::kWaitCanceled);
      return;
    case Op::kQueuePush:
      state_.queue_push(arg(0), arg(1));
      reply_ack();
      return;
    case Op::kQueuePop: {
      const std::size_t length = state_.queue_len(arg(0));
      std::string value;
      state_.queue_pop(arg(0), &value);
      reserve_output(17 + value.size(), "QUEUE_POP");
      reply_i64(static_cast<std::int64_t>(length));
      if (length > 0) wire::Writer(out_).bytes(value);
      return;
    }
    case Op::kQueueLen:
      reply_i64(static_cast<std::int64_t>(state_.queue_len(arg(0))));
      return;
    case Op::kListKeys: {
      auto keys = state_.list_keys();
      if (restricted_)
        std::erase_if(keys, [&](std::string_view k) { return state_.is_agent_key(k); });
      std::uint64_t bytes = 9;
      for (std::string_view key : keys) bytes += 8 + key.size();
      reserve_output(bytes, "LIST_KEYS");
      reply_i64(static_cast<std::int64_t>(keys.size()));
      wire::Writer w(out_);
      for (std::string_view key : keys) w.bytes(key);
      return;
    }
    case Op::kBarrier: {
      const std::int64_t count = state_.add(arg(0), 1, /*wrap_on_overflow=*/!framed_);
      if (count >= number_) {
        reply_u8(wire::kStopWaiting);
      } else {
        start_wait(WaitKind::kBarrier, {arg(0)}, number_);
      }
      return;
    }
    case Op::kWatchKey:
      need_room(registration_bytes(arg(0)), "WATCH_KEY");
      registered_bytes_ += registration_bytes(arg(0));
      state_.watchers().add(arg(0), {this, kWatchTicket, 0});
      watched_keys_.emplace_back(arg(0));
      reply_u8(wire::kWatchCallbackRegistered);
      return;
    case Op::kHello: {
      if (dialect_ != wire::Dialect::kCurrent) {
        throw fatal(StoreErrc::kProtocol, "HELLO outside the current dialect");
      }
      framed_ = true;
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
      std::memcpy(client_nonce.data(), arg(1).data(), client_nonce.size());
      const auth::Mac expected = auth::client_proof(secret, server_nonce_, client_nonce);
      if (!auth::equal(expected.data(), reinterpret_cast<const unsigned char*>(arg(0).data()),
                       expected.size())) {
        throw fatal(StoreErrc::kUnauthenticated,
                    "authentication failed: the client's secret does not match the store's");
      }
      authorized_ = true;
      state_.remember_authenticated_host(peer_.host);
      begin_reply();
      const auth::Mac proof = auth::server_proof(secret, server_nonce_, client_nonce);
      wire::Writer(out_).raw(proof.data(), proof.size());
      return;
    }
  }
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

}  // namespace dist::rendezvous
