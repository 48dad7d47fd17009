// The wire protocol: query types of both TCPStore dialects, dist-launch's extensions, and the
// byte-level encoding shared by the server and the client. Internal to rendezvous/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace dist::store::wire {

// A current-dialect client's first message: VALIDATE (0) followed by this little-endian uint32.
inline constexpr std::uint32_t kValidateMagic = 0x3C85F7CE;

// Every operation the server knows, independent of how a dialect numbers it.
enum class Op : std::uint8_t {
  kValidate,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kWatchKey,  // legacy only
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,
  kBarrier,
  // dist-launch extensions (current dialect only)
  kHello,
  kAuth,
  kSetExt,
  kWaitDeleted,
  kDeleteAllExcept,
};

enum class Dialect : std::uint8_t { kUnknown, kLegacy, kCurrent };

// Query type bytes of torch 1.9 .. 2.0 (legacy) and torch 2.1+ (current).
namespace legacy {
inline constexpr std::uint8_t kSet = 0, kCompareSet = 1, kGet = 2, kAdd = 3, kCheck = 4, kWait = 5,
                              kGetNumKeys = 6, kWatchKey = 7, kDeleteKey = 8;
}
namespace current {
inline constexpr std::uint8_t kValidate = 0, kSet = 1, kCompareSet = 2, kGet = 3, kAdd = 4,
                              kCheck = 5, kWait = 6, kGetNumKeys = 7, kDeleteKey = 8, kAppend = 9,
                              kMultiGet = 10, kMultiSet = 11, kCancelWait = 12, kPing = 13,
                              kQueuePush = 14, kQueuePop = 15, kQueueLen = 16, kListKeys = 17,
                              kBarrier = 18;
}
// dist-launch's extensions live at 0x80 and above, a range no PyTorch version uses.
namespace ext {
inline constexpr std::uint8_t kHello = 0x80, kAuth = 0x81, kSetExt = 0x82, kWaitDeleted = 0x83,
                              kDeleteAllExcept = 0x84;
inline constexpr std::uint32_t kVersion = 1;
inline constexpr std::uint8_t kSetFlagEphemeral = 0x01;
// HELLO's flags: bit 0 asks the server to probe this connection on the client's keepalive
// schedule, given in the bits above it (16 bits each: idle seconds, interval seconds, probes).
// The agent's liveness lives on its connection, so the job's own schedule holds on any server.
inline constexpr std::uint64_t kHelloFlagKeepalive = 0x1;
inline constexpr int kHelloIdleShift = 8, kHelloIntervalShift = 24, kHelloProbesShift = 40;
inline constexpr std::uint64_t kHelloFieldMax = 0xffff;

// HELLO's flags for a client whose connection is probed after `idle` s, every `interval` s,
// `probes` times (idle 0: keepalive off, nothing asked).
inline std::uint64_t hello_flags(int idle, int interval, int probes) {
  if (idle <= 0) return 0;
  const auto field = [](int v) {
    return std::min<std::uint64_t>(static_cast<std::uint64_t>(std::max(v, 1)), kHelloFieldMax);
  };
  return kHelloFlagKeepalive | field(idle) << kHelloIdleShift |
         field(interval) << kHelloIntervalShift | field(probes) << kHelloProbesShift;
}
inline constexpr std::size_t kNonceBytes = 32;
inline constexpr std::size_t kMacBytes = 32;  // HMAC-SHA256
}  // namespace ext

// How an operation's arguments follow its type byte.
enum class Args : std::uint8_t {
  kNone,
  kU32,            // VALIDATE's magic, PING's cookie
  kHello,          // the client's extension version (u32), flags (u64: kHelloFlag...)
  kKey,            // one key
  kKeyI64,         // a key and a number (ADD's delta, BARRIER's count)
  kKeyValue,       // a key and a value
  kKeyValueFlags,  // SET_EXT: a key, a value, a flags byte
  kKeyTwoValues,   // COMPARE_SET: a key, the expected and the desired value
  kKeyList,        // a count, then that many keys
  kWaitList,       // the same, counted as a wait's registration while it arrives
  kKeyValueList,   // a count, then that many key/value pairs
  kAuth,           // the client's MAC and nonce, fixed sizes
};

// Who may send an operation on a store with a secret: anyone (the handshake), authenticated
// clients only (dist-launch's extensions, which act on other clients), or also a client the
// unauthenticated policy let in, on keys outside the agents' namespace.
enum class Access : std::uint8_t { kHandshake, kAuthenticatedOnly, kJobKeys };

// One row per operation: its bytes in each dialect (-1: not in that dialect), its name in
// messages, its arguments and who may send it. Indexed by Op.
struct OpInfo {
  Op op;
  std::int16_t legacy_byte;
  std::int16_t current_byte;  // the current dialect's, or the extension range's
  std::string_view name;
  Args args;
  Access access;
};
inline constexpr OpInfo kOps[] = {
    {Op::kValidate, -1, current::kValidate, "VALIDATE", Args::kU32, Access::kHandshake},
    {Op::kSet, legacy::kSet, current::kSet, "SET", Args::kKeyValue, Access::kJobKeys},
    {Op::kCompareSet, legacy::kCompareSet, current::kCompareSet, "COMPARE_SET", Args::kKeyTwoValues,
     Access::kJobKeys},
    {Op::kGet, legacy::kGet, current::kGet, "GET", Args::kKey, Access::kJobKeys},
    {Op::kAdd, legacy::kAdd, current::kAdd, "ADD", Args::kKeyI64, Access::kJobKeys},
    {Op::kCheck, legacy::kCheck, current::kCheck, "CHECK", Args::kKeyList, Access::kJobKeys},
    {Op::kWait, legacy::kWait, current::kWait, "WAIT", Args::kWaitList, Access::kJobKeys},
    {Op::kGetNumKeys, legacy::kGetNumKeys, current::kGetNumKeys, "GETNUMKEYS", Args::kNone,
     Access::kJobKeys},
    {Op::kWatchKey, legacy::kWatchKey, -1, "WATCH_KEY", Args::kKey, Access::kJobKeys},
    {Op::kDeleteKey, legacy::kDeleteKey, current::kDeleteKey, "DELETE_KEY", Args::kKey,
     Access::kJobKeys},
    {Op::kAppend, -1, current::kAppend, "APPEND", Args::kKeyValue, Access::kJobKeys},
    {Op::kMultiGet, -1, current::kMultiGet, "MULTI_GET", Args::kKeyList, Access::kJobKeys},
    {Op::kMultiSet, -1, current::kMultiSet, "MULTI_SET", Args::kKeyValueList, Access::kJobKeys},
    {Op::kCancelWait, -1, current::kCancelWait, "CANCEL_WAIT", Args::kNone, Access::kJobKeys},
    {Op::kPing, -1, current::kPing, "PING", Args::kU32, Access::kJobKeys},
    {Op::kQueuePush, -1, current::kQueuePush, "QUEUE_PUSH", Args::kKeyValue, Access::kJobKeys},
    {Op::kQueuePop, -1, current::kQueuePop, "QUEUE_POP", Args::kKey, Access::kJobKeys},
    {Op::kQueueLen, -1, current::kQueueLen, "QUEUE_LEN", Args::kKey, Access::kJobKeys},
    {Op::kListKeys, -1, current::kListKeys, "LIST_KEYS", Args::kNone, Access::kJobKeys},
    {Op::kBarrier, -1, current::kBarrier, "BARRIER", Args::kKeyI64, Access::kJobKeys},
    {Op::kHello, -1, ext::kHello, "HELLO", Args::kHello, Access::kHandshake},
    {Op::kAuth, -1, ext::kAuth, "AUTH", Args::kAuth, Access::kHandshake},
    {Op::kSetExt, -1, ext::kSetExt, "SET_EXT", Args::kKeyValueFlags, Access::kAuthenticatedOnly},
    {Op::kWaitDeleted, -1, ext::kWaitDeleted, "WAIT_DELETED", Args::kWaitList,
     Access::kAuthenticatedOnly},
    {Op::kDeleteAllExcept, -1, ext::kDeleteAllExcept, "DELETE_ALL_EXCEPT", Args::kKey,
     Access::kAuthenticatedOnly},
};
constexpr const OpInfo& op_info(Op op) {
  return kOps[static_cast<std::size_t>(op)];
}

std::optional<Op> decode_op(Dialect dialect, std::uint8_t byte);
std::uint8_t encode_op(Op op);  // current dialect numbering (and the extension range)

// Single-byte replies.
inline constexpr std::uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr std::uint8_t kStopWaiting = 0, kWaitCanceled = 1, kKeyGone = 2;
inline constexpr std::uint8_t kWatchKeyUpdated = 0, kWatchKeyCreated = 1, kWatchKeyDeleted = 2,
                              kWatchCallbackRegistered = 3;

// Once a connection has said HELLO, each reply starts with a status byte: 0 for success, else a
// StoreErrc value followed by a message string (and the request had no effect).
inline constexpr std::uint8_t kStatusOk = 0;

// Appends encoded values to a byte string.
class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void u8(std::uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(std::uint32_t v) { raw(&v, sizeof v); }
  void u64(std::uint64_t v) { raw(&v, sizeof v); }
  void i64(std::int64_t v) { raw(&v, sizeof v); }
  void bytes(std::string_view s) {
    u64(s.size());
    out_.append(s);
  }
  void raw(const void* p, std::size_t n) { out_.append(static_cast<const char*>(p), n); }

 private:
  std::string& out_;
};

// Reads encoded values from a byte range without ever reading past its end. A read that would
// need more bytes than are there marks the reader short and returns a zero value; callers check
// short_by() once at the end of a message.
class Reader {
 public:
  Reader(const char* data, std::size_t size) : p_(data), end_(data + size) {}

  std::uint8_t u8() {
    std::uint8_t v = 0;
    fixed(&v, sizeof v);
    return v;
  }
  std::uint32_t u32() {
    std::uint32_t v = 0;
    fixed(&v, sizeof v);
    return v;
  }
  std::uint64_t u64() {
    std::uint64_t v = 0;
    fixed(&v, sizeof v);
    return v;
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  // A length-prefixed byte string, viewed in place. `length_out` reports the declared length
  // (even when the bytes are not all there yet), so callers can check limits early.
  std::string_view bytes(std::uint64_t* length_out = nullptr) {
    std::uint64_t n = u64();
    if (length_out) *length_out = n;
    if (missing_ > 0) return {};
    if (n > static_cast<std::uint64_t>(end_ - p_)) {
      missing_ = n - static_cast<std::uint64_t>(end_ - p_);
      p_ = end_;
      return {};
    }
    std::string_view s(p_, n);
    p_ += n;
    return s;
  }
  std::string_view take(std::size_t n) {
    if (missing_ > 0) return {};
    if (n > static_cast<std::size_t>(end_ - p_)) {
      missing_ = n - static_cast<std::size_t>(end_ - p_);
      p_ = end_;
      return {};
    }
    std::string_view s(p_, n);
    p_ += n;
    return s;
  }

  // 0 when everything read so far was present; else at least how many more bytes are needed.
  std::uint64_t short_by() const { return missing_; }
  std::size_t remaining() const { return static_cast<std::size_t>(end_ - p_); }
  const char* position() const { return p_; }

 private:
  void fixed(void* v, std::size_t n) {
    if (missing_ > 0) return;
    if (n > static_cast<std::size_t>(end_ - p_)) {
      missing_ = n - static_cast<std::size_t>(end_ - p_);
      p_ = end_;
      return;
    }
    std::memcpy(v, p_, n);
    p_ += n;
  }
  const char* p_;
  const char* end_;
  std::uint64_t missing_ = 0;
};

}  // namespace dist::store::wire
