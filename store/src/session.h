// One client connection's protocol engine: detects the dialect, parses requests incrementally
// (a partial request simply waits for more bytes, never blocking anyone), enforces the limits and
// the authentication policy, executes requests against the StoreState and appends replies to its
// output buffer. No sockets here: the server moves bytes in and out, the fuzzer calls it directly.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "protocol.h"
#include "store_state.h"

namespace dist::store {

// Told when a session has new output that did not come from its own input (a wait released by
// another client's SET, a legacy watch event).
class SessionOwner {
 public:
  virtual void on_async_output() = 0;
  // The client asked in HELLO that its connection be probed on its own keepalive schedule.
  virtual void on_keepalive_asked(const Keepalive& keepalive) = 0;

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
  using Clock = std::chrono::steady_clock;
  // What a connection costs before it holds anything (this object, the server's connection
  // object, the socket's event registration), counted against max_total_bytes.
  static constexpr std::uint64_t kBaseBytes = 1024;

  Session(StoreState& state, PeerInfo peer, SessionOwner* owner);
  ~Session();  // cancels waits, releases ephemeral keys and what it held
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
  StoreErrc close_code() const { return close_code_; }
  const PeerInfo& peer() const { return peer_; }

  // Memory: what this session holds (its buffers, waits, watches), as last reported to the
  // StoreState; account() reports it anew (the server calls it after writing output).
  std::uint64_t charged() const { return charged_; }
  void account();
  // Closed from outside to make room: its buffers are freed at once, its owner told.
  void evict(StoreErrc code, std::string reason);

  // Deadlines (ServerOptions::deadlines): why this connection is overdue at `now`, or empty.
  std::string overdue(Clock::time_point now) const;
  // When every connection slot is taken, connections are closed to admit a new one in this
  // order: lower rank first (0: must authenticate and has not; 1: in the middle of a request),
  // then the longest waiting. nullopt: never (a connection that is doing its work).
  std::optional<std::pair<int, Clock::time_point>> eviction_rank() const;

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
    std::uint64_t bytes = 0;        // its memory, counted in registered_bytes_
  };
  // A key or value inside the request being parsed, as an offset from the request's first byte,
  // so that it survives the input buffer growing while a long request arrives.
  struct Span {
    std::uint64_t offset;
    std::uint64_t size;
  };
  // One request's arguments as parsed (by its operation's wire::Args), which execute() consumes.
  struct Request {
    wire::Op op = wire::Op::kPing;
    std::vector<Span> spans;  // keys and values, in wire order
    std::int64_t number = 0;  // ADD's delta, BARRIER's count
    std::uint32_t u32 = 0;    // VALIDATE's magic, PING's cookie, HELLO's version
    std::uint64_t u64 = 0;    // HELLO's flags
    std::uint8_t flags = 0;   // SET_EXT's
  };

  void process(const char* data, std::size_t size, std::size_t* consumed);
  std::size_t handle_one(const char* data, std::size_t size);  // 0: incomplete
  bool detect_dialect(const char* data, std::size_t size);
  void check_authorized(wire::Op op);
  bool policy_admits() const;  // the unauthenticated policy lets this peer in
  bool must_authenticate() const;
  // Reads the arguments of request_.op into request_; false when they are not all there yet.
  bool parse_arguments(wire::Reader& r, const char* base);
  void check_permitted(const Request& q, const char* base) const;  // restricted sessions' limits
  void execute(const Request& q, const char* base);
  void execute_handshake(const Request& q, const char* base);
  void execute_key(const Request& q, const char* base);
  void execute_list(const Request& q, const char* base);
  void execute_queue(const Request& q, const char* base);
  void reply_multi_get(const Request& q, const char* base);
  void reply_list_keys();
  std::string_view view(const char* base, Span s) const { return {base + s.offset, s.size}; }

  // Argument parsing: read into request_.spans, checking declared sizes against the limits.
  Span read_key(wire::Reader& r, const char* base);
  Span read_value(wire::Reader& r, const char* base);
  Span read_fixed(wire::Reader& r, const char* base, std::size_t size);
  bool read_key_list(wire::Reader& r, const char* base, bool with_values,
                     bool counts_as_wait = false);

  // Replies.
  void begin_reply();  // status byte in framed mode
  void reply_u8(std::uint8_t v);
  void reply_i64(std::int64_t v);
  void reply_bytes(std::string_view v);
  void reply_ack();  // framed mode only: an empty success frame
  void reply_error(const RequestError& e);
  void fail(const RequestError& e);
  RequestError request_too_large(std::uint64_t bytes) const;
  void close(StoreErrc code, std::string reason);

  // Budgets: throws a fatal kLimitExceeded when this session cannot hold `more` bytes more.
  void need_room(std::uint64_t more, const std::string& what);
  void enforce_budget();  // after output grew without a check (small replies)
  void buffer_input(const char* data, std::size_t size);
  void reserve_output(std::uint64_t bytes, const char* what);
  std::uint64_t holding() const;  // what account() reports

  // Waits.
  void start_wait(WaitKind kind, const std::vector<std::string_view>& keys, std::int64_t target);
  void finish_wait(std::size_t index);
  void cancel_waits();
  void after_async_output();

  StoreState& state_;
  PeerInfo peer_;
  SessionOwner* owner_;
  std::optional<Keepalive> asked_keepalive_;  // HELLO's, until AUTH proves the secret
  wire::Dialect dialect_ = wire::Dialect::kUnknown;
  bool framed_ = false;      // said HELLO: replies carry a status byte
  bool authorized_ = false;  // authenticated, or let in by the unauthenticated policy
  bool restricted_ = false;  // let in by the policy without the secret: PyTorch's ops, job keys
  std::string out_;
  std::string in_;          // bytes of requests not yet executed
  std::uint64_t need_ = 0;  // do not parse again until in_ holds this many bytes
  std::string close_reason_;
  StoreErrc close_code_ = StoreErrc::kProtocol;
  bool in_feed_ = false;

  std::uint64_t charged_ = 0;             // reported to the state
  std::uint64_t registered_bytes_ = 0;    // waits, watches, ephemeral key names
  std::uint64_t parsing_wait_bytes_ = 0;  // what the WAIT being received will register
  Clock::time_point connected_at_;
  Clock::time_point last_input_at_;
  Clock::time_point resumed_at_;  // reads last resumed after the reply backlog drained
  std::optional<Clock::time_point> partial_since_;  // an incomplete request is buffered
  bool paused_ = false;

  // The request being parsed; a key list's parsing resumes where it stopped.
  Request request_;
  std::uint64_t list_count_ = 0;
  std::uint64_t list_resume_offset_ = 0;  // 0: the list has not started

  std::vector<PendingWait> waits_;
  std::uint64_t next_ticket_ = 1;
  std::size_t request_length_ = 0;  // of the request being executed
  std::vector<std::string> ephemeral_keys_;
  std::vector<std::string> watched_keys_;  // legacy WATCH_KEY registrations
  std::array<unsigned char, wire::ext::kNonceBytes> server_nonce_{};
  bool nonce_issued_ = false;
};

}  // namespace dist::store
