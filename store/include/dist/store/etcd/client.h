// An asynchronous etcd v3 client over etcd's JSON gateway (HTTP/1.1 with Boost.Beast), for the
// agents' rendezvous. docs/ETCD.md says why the gateway rather than gRPC.
//
// Every call is an Asio coroutine on the caller's io_context (nothing blocks a thread) and throws
// StoreError, with a message naming the member and the key:
//   kUnavailable     no member answered with a leader within ClientOptions::unavailable_timeout
//                    (members down, quorum lost); the call may have applied or not.
//   kTimeout         the call's own deadline passed first.
//   kCancelled       the caller's Cancellation was cancelled.
//   kUnauthenticated TLS verification, user/password or permissions refused.
//   kNotFound        a lease or a compacted revision that no longer exists.
//   kInvalidArgument, kLimitExceeded  etcd refused the request (bad key, too large, too many ops).
//   kProtocol        a member answered something that is not the etcd v3 gateway's JSON.
//
// Failover: one member at a time; a member that cannot be reached, has no leader, or does not
// answer within request_timeout is left for the next one (after each full round of members, a
// backoff). Calls are retried whole, mutations included: one whose answer was lost may apply
// twice. Callers that cannot have that make the mutation conditional (the rendezvous store's
// session marker does).
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without including it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dist/store/task.h"

namespace dist::store::etcd {

using store::Task;
using Clock = std::chrono::steady_clock;
using Deadline = std::optional<Clock::time_point>;  // none: the client's own policy

struct ClientOptions {
  // "host:port", "http://host:port" or "https://host:port" (one scheme for all); names or IPs.
  std::vector<std::string> endpoints;
  // TLS, as etcdctl's --cacert/--cert/--key: on for https:// endpoints or when ca_file is given.
  std::string ca_file;    // empty: the system's trusted CAs
  std::string cert_file;  // a client certificate, for members started with --client-cert-auth
  std::string key_file;
  // etcd's user/password authentication (empty user: none).
  std::string user;
  std::string password;
  // One HTTP exchange with one member; a member slower than this is left for the next.
  std::chrono::milliseconds request_timeout{5'000};
  // How long a call goes on trying the members before kUnavailable.
  std::chrono::milliseconds unavailable_timeout{10'000};
  // Start at a random member, so that many clients spread over the members; false: the first.
  bool spread_over_members = true;
};

struct KeyValue {
  std::string key;
  std::string value;
  std::int64_t create_revision = 0;
  std::int64_t mod_revision = 0;
  std::int64_t version = 0;
  std::int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  std::int64_t count = 0;
  std::int64_t revision = 0;  // the store's revision the read saw
};

struct Compare {
  enum class Target { kVersion, kCreateRevision, kModRevision, kValue };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kValue;
  Result result = Result::kEqual;
  std::int64_t number = 0;  // for the revision and version targets
  std::string value;        // for kValue

  static Compare value_equals(std::string key, std::string value);
  static Compare revision_equals(Target target, std::string key, std::int64_t revision);
};

struct TxnRequest;

struct Op {
  enum class Kind { kRange, kPut, kDeleteRange, kTxn };
  Kind kind = Kind::kRange;
  std::string key;
  std::string range_end;  // range and delete: empty for the one key
  std::string value;
  std::int64_t lease = 0;
  bool ignore_value = false;  // put: keep the current value (the key's version still grows)
  bool ignore_lease = false;  // put: keep the current lease
  bool count_only = false;    // range
  std::int64_t revision = 0;  // range: read as of this revision (0: the newest)
  std::shared_ptr<const TxnRequest> txn;  // a transaction nested in this one's branch

  static Op range(std::string key);
  static Op put(std::string key, std::string value, std::int64_t lease = 0);
  static Op erase(std::string key);
  static Op nested(TxnRequest txn);
};

struct OpResult {
  std::vector<KeyValue> kvs;      // range
  std::int64_t count = 0;         // range
  std::int64_t deleted = 0;       // delete
  bool succeeded = false;         // nested transaction: which branch ran,
  std::vector<OpResult> results;  // and what its ops answered
};

struct TxnRequest {
  std::vector<Compare> compare;  // all must hold for `success` to run, else `failure` runs
  std::vector<Op> success;
  std::vector<Op> failure;
};

struct TxnResult {
  bool succeeded = false;
  std::int64_t revision = 0;
  std::vector<OpResult> results;  // one per op of the branch that ran
};

struct Lease {
  std::int64_t id = 0;
  std::chrono::seconds ttl{0};  // as granted: etcd raises a TTL below its minimum
};

// Ends calls in flight from outside. Asio 1.18 has no per-operation cancellation, so a call
// registers how to stop what it waits on (close its connection, cancel its timer) and cancel()
// runs those; the calls throw kCancelled. Later calls with it throw kCancelled at once.
// It must outlive the calls that use it.
class Cancellation {
 public:
  class Registration {
   public:
    Registration(Cancellation& owner, std::uint64_t id) : owner_(&owner), id_(id) {}
    Registration(const Registration&) = delete;
    Registration& operator=(const Registration&) = delete;
    ~Registration() { owner_->stops_.erase(id_); }

   private:
    Cancellation* owner_;
    std::uint64_t id_;
  };

  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  void cancel();
  bool cancelled() const { return cancelled_; }
  // Runs `stop` on cancel() while the registration lives (at once when already cancelled).
  [[nodiscard]] Registration on_cancel(std::function<void()> stop);

 private:
  bool cancelled_ = false;
  std::uint64_t next_id_ = 0;
  std::map<std::uint64_t, std::function<void()>> stops_;
};

struct WatchRequest {
  std::string key;
  std::string range_end;            // empty: the one key
  std::int64_t start_revision = 0;  // 0: from now
  bool no_put = false;
  bool no_delete = false;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // a delete carries the key and its mod_revision only
};

struct WatchBatch {
  std::vector<WatchEvent> events;
  // Nonzero when the start revision had been compacted away: no events, the watch has ended;
  // read again and watch from the newer revision.
  std::int64_t compact_revision = 0;
};

class Client;

// One watcher on its own streamed HTTP response. When its member fails, it resumes on another
// from the revision after the last event it delivered: no event is lost or repeated.
class Watch {
 public:
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // The next events; nullopt when `deadline` passed first.
  Task<std::optional<WatchBatch>> next(Clock::time_point deadline, Cancellation& cancel);

 private:
  friend class Client;
  struct State;
  explicit Watch(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// Not thread-safe: use it from the one thread that runs its io_context, and destroy it (and what
// uses it) before that io_context.
class Client {
 public:
  // Checks the options and loads the TLS files (kInvalidArgument); connects on the first call.
  static std::shared_ptr<Client> create(boost::asio::io_context& io, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Linearizable: what the cluster holds now. Serializable: what the member answering holds, maybe
  // a little behind, without asking the leader; for guesses a transaction's comparison checks.
  enum class Read { kLinearizable, kSerializable };
  Task<RangeResult> range(std::string key, Cancellation& cancel, Deadline deadline = {},
                          Read read = Read::kLinearizable);
  // Returns the revision of the put.
  Task<std::int64_t> put(std::string key, std::string value, std::int64_t lease,
                         Cancellation& cancel, Deadline deadline = {});
  // Returns how many keys were deleted.
  Task<std::int64_t> delete_key(std::string key, Cancellation& cancel, Deadline deadline = {});
  Task<TxnResult> txn(TxnRequest request, Cancellation& cancel, Deadline deadline = {});

  Task<Lease> lease_grant(std::chrono::seconds ttl, Cancellation& cancel, Deadline deadline = {});
  // The lease's remaining TTL after the renewal; zero when it had expired (or never existed).
  // `skip`: start that many members past the one calls start at, so that a renewal sent while
  // earlier ones wait unanswered (on a member that stopped answering) reaches another member.
  Task<std::chrono::seconds> lease_keep_alive(std::int64_t id, Cancellation& cancel,
                                              Deadline deadline = {}, std::size_t skip = 0);
  Task<void> lease_revoke(std::int64_t id, Cancellation& cancel, Deadline deadline = {});

  // Connects on the first next().
  std::unique_ptr<Watch> watch(WatchRequest request);

  boost::asio::io_context::executor_type executor() const;
  std::string describe() const;  // "etcd 10.0.0.1:2379,10.0.0.2:2379", for messages

  class Impl;  // internal (client.cc), named here for the watches' state

 private:
  explicit Client(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

// The end of the range of keys that start with `prefix` (etcd's --prefix).
std::string prefix_end(std::string prefix);

}  // namespace dist::store::etcd
