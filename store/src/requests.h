// The framing of store messages, shared by the blocking (client.cc) and asynchronous
// (async_client.cc) clients: requests encoded by one function per operation, each appending one
// whole request to `out`; replies read through a ReplyBuffer and decoded by the same rules (the
// length a reply may announce, what a status byte means). Each client keeps only its own I/O.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/store/errors.h"
#include "dist/store/limits.h"
#include "protocol.h"

namespace dist::store::requests {

// How both clients reconnect and read: the first retry after 100 ms, each next one 1.5x later,
// at most 2 s apart; replies read 64 KiB at a time.
inline constexpr std::chrono::milliseconds kInitialBackoff{100};
inline constexpr std::chrono::milliseconds kMaxBackoff{2000};
inline constexpr double kBackoffFactor = 1.5;
inline constexpr std::size_t kReadChunkBytes = 64 * 1024;

inline wire::Writer begin(std::string& out, wire::Op op) {
  wire::Writer w(out);
  w.u8(wire::encode_op(op));
  return w;
}

inline void keys(wire::Writer& w, const std::vector<std::string>& keys) {
  w.u64(keys.size());
  for (const auto& key : keys) w.bytes(key);
}

// VALIDATE, then HELLO: the first bytes of every connection of ours; HELLO asks the server to
// probe the connection on the client's own keepalive schedule, where it has one.
inline void handshake(std::string& out, int keepalive_idle = 0, int keepalive_interval = 0,
                      int keepalive_probes = 0) {
  wire::Writer w(out);
  w.u8(wire::current::kValidate);
  w.u32(wire::kValidateMagic);
  w.u8(wire::ext::kHello);
  w.u32(wire::ext::kVersion);
  w.u64(wire::ext::hello_flags(keepalive_idle, keepalive_interval, keepalive_probes));
}

inline void set(std::string& out, std::string_view key, std::string_view value, bool ephemeral) {
  auto w = begin(out, wire::Op::kSetExt);
  w.bytes(key);
  w.bytes(value);
  w.u8(ephemeral ? wire::ext::kSetFlagEphemeral : 0);
}

inline void key_only(std::string& out, wire::Op op, std::string_view key) {
  begin(out, op).bytes(key);
}

inline void add(std::string& out, std::string_view key, std::int64_t delta) {
  auto w = begin(out, wire::Op::kAdd);
  w.bytes(key);
  w.i64(delta);
}

inline void compare_set(std::string& out, std::string_view key, std::string_view expected,
                        std::string_view desired) {
  auto w = begin(out, wire::Op::kCompareSet);
  w.bytes(key);
  w.bytes(expected);
  w.bytes(desired);
}

inline void key_value(std::string& out, wire::Op op, std::string_view key, std::string_view value) {
  auto w = begin(out, op);
  w.bytes(key);
  w.bytes(value);
}

inline void key_list(std::string& out, wire::Op op, const std::vector<std::string>& list) {
  auto w = begin(out, op);
  keys(w, list);
}

inline void multi_set(std::string& out,
                      const std::vector<std::pair<std::string, std::string>>& items) {
  auto w = begin(out, wire::Op::kMultiSet);
  w.u64(items.size());
  for (const auto& [key, value] : items) {
    w.bytes(key);
    w.bytes(value);
  }
}

inline void barrier(std::string& out, std::string_view key, std::int64_t world_size) {
  auto w = begin(out, wire::Op::kBarrier);
  w.bytes(key);
  w.i64(world_size);
}

// Replies as both clients read them: what one read of the socket gave (at most kReadChunkBytes),
// taken in order; the next read only once it is used up.
class ReplyBuffer {
 public:
  // Copies at most `n` buffered bytes to `out`; returns how many (0: read more first).
  std::size_t take(char* out, std::size_t n) {
    const std::size_t count = std::min(n, len_ - pos_);
    if (count > 0) std::memcpy(out, data_.get() + pos_, count);
    pos_ += count;
    return count;
  }
  // Where the next read goes, kReadChunkBytes long (what was buffered is gone), then how much it
  // filled.
  char* space() {
    if (!data_) data_ = std::make_unique_for_overwrite<char[]>(kReadChunkBytes);
    len_ = pos_ = 0;
    return data_.get();
  }
  void filled(std::size_t n) { len_ = n; }

 private:
  std::unique_ptr<char[]> data_;
  std::size_t len_ = 0;
  std::size_t pos_ = 0;
};

// Whether a reply may announce `n` bytes under the store's `limits`; the reason when it may not.
inline std::optional<std::string> oversized_reply(std::uint64_t n, const StoreLimits& limits) {
  if (n <= limits.max_value_bytes * 2 + limits.max_request_bytes) return std::nullopt;
  return "reply announces " + std::to_string(n) + " bytes, more than the store's limits allow";
}

// A reply's status other than wire::kStatusOk, and the message that followed it: the store's
// typed error for `context` on the store at `endpoint`; nullopt for a code this client does not
// know (the rest of the reply cannot be read: the connection is lost).
inline std::optional<StoreError> status_error(std::uint8_t code, const std::string& context,
                                              const std::string& endpoint,
                                              const std::string& message) {
  if (code < static_cast<std::uint8_t>(StoreErrc::kTimeout) ||
      code > static_cast<std::uint8_t>(StoreErrc::kInvalidArgument)) {
    return std::nullopt;
  }
  return StoreError(static_cast<StoreErrc>(code),
                    context + " failed on the store at " + endpoint + ": " + message);
}

// "'a', 'b', 'c' and 4 more", for messages (keys quoted and escaped: text.h).
std::string describe_keys(const std::vector<std::string>& keys);

}  // namespace dist::store::requests
