// libFuzzer target for the store's request parser and executor: arbitrary bytes, cut into chunks
// at fuzzer-chosen points, fed to two sessions that share one store (so waits, wake-ups and
// ephemeral keys cross connections). Limits are small so memory stays bounded and the memory
// budgets (closing a session, closing others to make room) are exercised.
//
// Input layout: byte 0 picks the first session's peer (loopback or not) and the secret; then
// records of [session selector (1 byte), chunk length (1 byte), chunk bytes].
#include <cstddef>
#include <cstdint>
#include <memory>

#include "session.h"
#include "store_state.h"

namespace {

using dist::store::PeerInfo;
using dist::store::ServerOptions;
using dist::store::Session;
using dist::store::StoreState;

ServerOptions fuzz_options(std::uint8_t mode) {
  ServerOptions o;
  o.limits.max_key_bytes = 256;
  o.limits.max_value_bytes = 4096;
  o.limits.max_keys_per_request = 64;
  o.limits.max_request_bytes = 64 * 1024;
  o.limits.max_reply_backlog_bytes = 256 * 1024;
  o.limits.max_connection_bytes = 512 * 1024;
  o.limits.max_total_bytes = 1024 * 1024;
  if (mode & 1) o.secret = "fuzz-secret";
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return 0;
  const std::uint8_t mode = data[0];
  StoreState state(fuzz_options(mode));
  std::unique_ptr<Session> sessions[2] = {
      std::make_unique<Session>(state, PeerInfo{"127.0.0.1:1", "127.0.0.1", (mode & 2) == 0},
                                nullptr),
      std::make_unique<Session>(state, PeerInfo{"10.0.0.2:2", "10.0.0.2", false}, nullptr)};
  std::size_t i = 1;
  while (i + 2 <= size) {
    const std::uint8_t selector = data[i];
    const std::size_t length = std::min<std::size_t>(data[i + 1], size - i - 2);
    i += 2;
    Session* s = sessions[selector & 1].get();
    if (selector & 0x80) {  // the connection closes (and a new one takes its place)
      sessions[selector & 1] =
          std::make_unique<Session>(state, PeerInfo{"127.0.0.1:3", "127.0.0.1", true}, nullptr);
      continue;
    }
    if (!s->closing()) {
      s->feed(reinterpret_cast<const char*>(data + i), length);
      if (selector & 0x40) s->output().clear();  // the peer read its replies
      if (s->has_runnable_input()) s->resume();
    }
    i += length;
    if (state.stored_bytes() > state.limits().max_total_bytes) __builtin_trap();
    for (const auto& session : sessions) {  // a session over its budget must have been closed
      if (!session->closing() && session->charged() > state.limits().max_connection_bytes) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
