#include "session.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "auth.h"

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
}

Session::~Session() {
  cancel_waits();
  for (const auto& key : watched_keys_) state_.watchers().remove(key, this);
  for (const auto& key : ephemeral_keys_) state_.release_ephemeral(key, this);
}

// ---------------------------------------------------------------------------------------------
// Input: incremental parsing

bool Session::wants_input() const {
  return !closing() && out_.size() <= state_.limits().max_reply_backlog_bytes;
}

void Session::feed(const char* data, std::size_t size) {
  if (closing()) return;
  in_feed_ = true;
  if (in_.empty()) {
    // Common case: whole requests straight from the socket's buffer, leftovers kept.
    std::size_t consumed = 0;
    process(data, size, &consumed);
    if (!closing()) in_.assign(data + consumed, size - consumed);
  } else {
    in_.append(data, size);
    if (in_.size() >= need_) resume();
  }
  in_feed_ = false;
}

void Session::resume() {
  if (in_.empty() || in_.size() < need_) return;
  std::size_t consumed = 0;
  process(in_.data(), in_.size(), &consumed);
  in_.erase(0, consumed);
  if (in_.empty() && in_.capacity() > 64 * 1024) in_.shrink_to_fit();
}

void Session::process(const char* data, std::size_t size, std::size_t* consumed) {
  *consumed = 0;
  need_ = 0;
  while (*consumed < size && wants_input()) {
    std::size_t n = 0;
    try {
      n = handle_one(data + *consumed, size - *consumed);
    } catch (const RequestError& e) {
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
bool Session::read_key_list(wire::Reader& r, const char* base, bool with_values) {
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
    case Op::kWait:
    case Op::kMultiGet:
    case Op::kWaitDeleted:
      complete = read_key_list(r, base, /*with_values=*/false);
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
  execute(*op, base);
  return request_length_;
}

void Session::check_authorized(Op op) {
  if (authorized_ || op == Op::kValidate || op == Op::kHello || op == Op::kAuth) return;
  bool allowed = false;
  switch (state_.options().unauthenticated) {
    case UnauthenticatedPolicy::kDeny:
      break;
    case UnauthenticatedPolicy::kLoopback:
      allowed = peer_.loopback;
      break;
    case UnauthenticatedPolicy::kKnownHosts:
      allowed = peer_.loopback || state_.is_known_host(peer_.host);
      break;
    case UnauthenticatedPolicy::kAllow:
      allowed = true;
      break;
  }
  if (!allowed) {
    throw fatal(StoreErrc::kUnauthenticated,
                op_name(op) +
                    " before authenticating: this store requires the shared secret "
                    "(pass the job's token file) or a connection from a permitted host");
  }
  authorized_ = true;
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
        reply_error(
            RequestError{StoreErrc::kNotFound, "key '" + std::string(arg(0)) + "' not found"});
      } else if (dialect_ == wire::Dialect::kLegacy) {
        throw fatal(StoreErrc::kNotFound, "GET of missing key '" + std::string(arg(0)) + "'");
      } else {
        reply_bytes({});
      }
      return;
    }
    case Op::kAdd:
      reply_i64(state_.add(arg(0), number_));
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
      reply_i64(static_cast<std::int64_t>(state_.num_keys()));
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
          throw RequestError{StoreErrc::kNotFound, "key '" + std::string(arg(i)) + "' not found"};
        }
      }
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
      reply_i64(static_cast<std::int64_t>(length));
      if (length > 0) wire::Writer(out_).bytes(value);
      return;
    }
    case Op::kQueueLen:
      reply_i64(static_cast<std::int64_t>(state_.queue_len(arg(0))));
      return;
    case Op::kListKeys: {
      const auto keys = state_.list_keys();
      reply_i64(static_cast<std::int64_t>(keys.size()));
      wire::Writer w(out_);
      for (std::string_view key : keys) w.bytes(key);
      return;
    }
    case Op::kBarrier: {
      const std::int64_t count = state_.add(arg(0), 1);
      if (count >= number_) {
        reply_u8(wire::kStopWaiting);
      } else {
        start_wait(WaitKind::kBarrier, {arg(0)}, number_);
      }
      return;
    }
    case Op::kWatchKey:
      state_.watchers().add(arg(0), {this, 0, 0});
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
    close(std::string(to_string(e.code)) + ": " + e.message);
  }
}

void Session::close(std::string reason) {
  if (closing()) return;
  close_reason_ = std::move(reason);
  cancel_waits();
}

// ---------------------------------------------------------------------------------------------
// Waits

void Session::start_wait(WaitKind kind, const std::vector<std::string_view>& keys,
                         std::int64_t target) {
  PendingWait wait{next_ticket_++, kind, 0, {}};
  WaiterIndex* index = nullptr;
  switch (kind) {
    case WaitKind::kAllExist:
      index = &state_.creation_waiters();
      for (std::string_view key : keys) {
        if (!state_.exists(key)) wait.keys.emplace_back(key);
      }
      if (wait.keys.empty()) {
        reply_u8(wire::kStopWaiting);
        return;
      }
      wait.remaining = wait.keys.size();
      break;
    case WaitKind::kAnyDeleted:
      index = &state_.deletion_waiters();
      for (std::size_t i = 0; i < keys.size(); ++i) {
        if (!state_.find(keys[i])) {
          reply_u8(wire::kKeyGone);
          wire::Writer(out_).u64(i);
          return;
        }
      }
      wait.keys.assign(keys.begin(), keys.end());
      wait.remaining = 1;
      break;
    case WaitKind::kBarrier:
      index = &state_.barrier_waiters();
      wait.keys.emplace_back(keys.front());
      wait.remaining = 1;
      break;
  }
  for (const auto& key : wait.keys) index->add(key, {this, wait.ticket, target});
  waits_.push_back(std::move(wait));
}

void Session::finish_wait(std::size_t index) {
  PendingWait& wait = waits_[index];
  WaiterIndex& keys_index = wait.kind == WaitKind::kAnyDeleted ? state_.deletion_waiters()
                            : wait.kind == WaitKind::kBarrier  ? state_.barrier_waiters()
                                                               : state_.creation_waiters();
  for (const auto& key : wait.keys) keys_index.remove(key, this);
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
  // Legacy watch notification: event type, key, old value, new value.
  wire::Writer w(out_);
  w.u8(event);
  w.bytes(key);
  w.bytes(old_value);
  w.bytes(new_value);
  after_async_output();
}

void Session::after_async_output() {
  // Output produced while this session handles its own input is flushed by the server afterwards.
  if (!in_feed_ && owner_) owner_->on_async_output();
}

}  // namespace dist::rendezvous
