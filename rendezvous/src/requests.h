// Request encoding shared by the blocking (client.cc) and asynchronous (async_client.cc) clients:
// one function per operation, each appending one whole request to `out`.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "protocol.h"

namespace dist::rendezvous::requests {

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

// VALIDATE, then HELLO: the first bytes of every connection of ours.
inline void handshake(std::string& out) {
  wire::Writer w(out);
  w.u8(wire::current::kValidate);
  w.u32(wire::kValidateMagic);
  w.u8(wire::ext::kHello);
  w.u32(wire::ext::kVersion);
  w.u64(0);
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

// "'a', 'b', 'c' and 4 more", for messages (keys quoted and escaped: text.h).
std::string describe_keys(const std::vector<std::string>& keys);

}  // namespace dist::rendezvous::requests
