// One client connection's protocol engine: detects the dialect, parses requests incrementally
// (a partial request simply waits for more bytes, never blocking anyone), enforces the limits and
// the authentication policy, executes requests against the StoreState and appends replies to its
// output buffer. No sockets here: the server moves bytes in and out, the fuzzer calls it directly.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.h"
#include "store_state.h"

namespace dist::rendezvous {

// Told when a session has new output that did not come from its own input (a wait released by
// another client's SET, a legacy watch event).
class SessionOwner {
 public:
  virtual void on_async_output() = 0;

 protected:
  ~SessionOwner() = default;
};

struct PeerInfo {
  std::string address;  // "1.2.3.4:5678", for messages
  std::string host;     // "1.2.3.4", for the known-hosts policy
  bool loopback = false;
};

class Session {
 public:
  Session(StoreState& state, PeerInfo peer, SessionOwner* owner);
  ~Session();  // cancels waits, releases ephemeral keys
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Consumes bytes received from the peer. Requests are executed as soon as they are complete.
  void feed(const char* data, std::size_t size);
  // Executes requests held back while the output backlog was too large.
  void resume();

  std::string& output() { return out_; }
  // False while unsent output exceeds the limit: the server stops reading until it drains.
  bool wants_input() const;
  // Complete requests are buffered and the output backlog allows running them.
  bool has_runnable_input() const { return wants_input() && !in_.empty() && in_.size() >= need_; }
  bool closing() const { return !close_reason_.empty(); }
  const std::string& close_reason() const { return close_reason_; }
  const PeerInfo& peer() const { return peer_; }

  // Called by the StoreState.
  void on_key_created(std::uint64_t ticket);
  void on_key_deleted(std::uint64_t ticket, std::string_view key);
  void on_barrier_reached(std::uint64_t ticket);
  void on_watch_event(std::uint8_t event, std::string_view key, std::string_view old_value,
                      std::string_view new_value);

 private:
  enum class WaitKind : std::uint8_t { kAllExist, kAnyDeleted, kBarrier };
  struct PendingWait {
    std::uint64_t ticket;
    WaitKind kind;
    std::size_t remaining;          // kAllExist: keys still missing
    std::vector<std::string> keys;  // registered in the state's index
  };
  // A key or value inside the request being parsed, as an offset from the request's first byte,
  // so that it survives the input buffer growing while a long request arrives.
  struct Span {
    std::uint64_t offset;
    std::uint64_t size;
  };

  void process(const char* data, std::size_t size, std::size_t* consumed);
  std::size_t handle_one(const char* data, std::size_t size);  // 0: incomplete
  bool detect_dialect(const char* data, std::size_t size);
  void check_authorized(wire::Op op);
  void execute(wire::Op op, const char* base);
  std::string_view view(const char* base, Span s) const { return {base + s.offset, s.size}; }

  // Argument parsing: read into spans_, checking declared sizes against the limits.
  Span read_key(wire::Reader& r, const char* base);
  Span read_value(wire::Reader& r, const char* base);
  Span read_fixed(wire::Reader& r, const char* base, std::size_t size);
  bool read_key_list(wire::Reader& r, const char* base, bool with_values);

  // Replies.
  void begin_reply();  // status byte in framed mode
  void reply_u8(std::uint8_t v);
  void reply_i64(std::int64_t v);
  void reply_bytes(std::string_view v);
  void reply_ack();  // framed mode only: an empty success frame
  void reply_error(const RequestError& e);
  void fail(const RequestError& e);
  RequestError request_too_large(std::uint64_t bytes) const;
  void close(std::string reason);

  // Waits.
  void start_wait(WaitKind kind, const std::vector<std::string_view>& keys, std::int64_t target);
  void finish_wait(std::size_t index);
  void cancel_waits();
  void after_async_output();

  StoreState& state_;
  PeerInfo peer_;
  SessionOwner* owner_;
  wire::Dialect dialect_ = wire::Dialect::kUnknown;
  bool framed_ = false;      // said HELLO: replies carry a status byte
  bool authorized_ = false;  // authenticated, or let in by the unauthenticated policy
  std::string out_;
  std::string in_;          // bytes of requests not yet executed
  std::uint64_t need_ = 0;  // do not parse again until in_ holds this many bytes
  std::string close_reason_;
  bool in_feed_ = false;

  // Parse state of the current request; list parsing resumes where it stopped.
  std::vector<Span> spans_;
  std::uint64_t list_count_ = 0;
  std::uint64_t list_resume_offset_ = 0;  // 0: the list has not started
  std::int64_t number_ = 0;
  std::uint32_t u32_ = 0;
  std::uint8_t flags_ = 0;

  std::vector<PendingWait> waits_;
  std::uint64_t next_ticket_ = 1;
  std::size_t request_length_ = 0;  // of the request being executed
  std::vector<std::string> ephemeral_keys_;
  std::vector<std::string> watched_keys_;  // legacy WATCH_KEY registrations
  std::array<unsigned char, wire::ext::kNonceBytes> server_nonce_{};
  bool nonce_issued_ = false;
};

}  // namespace dist::rendezvous
