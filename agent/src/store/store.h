// The store folder's face: the key-value store the agents' rendezvous runs over, one asynchronous
// interface with two implementations (the job's TCPStore, hosted by an agent or by
// dist-rendezvous; and etcd v3), the one factory that makes either, and the store an agent hosts.
//
// Calls are Asio coroutines on the agent's one io_context: nothing here blocks a thread.
//
// Contract, for every implementation:
// - Keys are relative to the job: the store puts them under the job's own prefix
//   (TCPStore: "rdzv/<run id>/", etcd: "<root>/<run id>/"). Callers never see the prefix.
// - Calls on one object are served one at a time, in order (a call made while another is in
//   flight waits for it). A user that must not wait behind another's long wait (the round's
//   watch) opens its own session with open_another().
// - Failures throw store::StoreError: kUnavailable or kConnectionLost when the store is gone
//   (the job cannot go on through this session), kCancelled after close(), kLimitExceeded or
//   kInvalidArgument for a request the store refuses. A wait that times out is not an error: it
//   returns false / nullopt.
// - An ephemeral key lives exactly as long as the session that set it: its TCP connection, or its
//   etcd lease (kept alive by the session, expiring about its TTL, EtcdOptions::lease_ttl, after
//   the process vanished). Sessions opened with open_another() have their own.
#pragma once

#include <utility>  // first: Asio 1.18's awaitable.hpp uses std::exchange without it

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "dist/agent/config.h"
#include "dist/store/client.h"
#include "dist/store/etcd/client.h"
#include "dist/store/server.h"
#include "dist/store/task.h"

namespace dist::agent {

using store::Task;

class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;

  // Connects: TCP, retrying until the client's connect_timeout; etcd, until a member answers and
  // takes the credentials. close() may end it at any time, open() included (kCancelled).
  virtual Task<void> open() = 0;

  virtual Task<void> set(std::string key, std::string value) = 0;
  // A key deleted by the store when this session ends (connection closed, lease expired).
  virtual Task<void> set_ephemeral(std::string key, std::string value) = 0;
  virtual Task<void> multi_set(std::vector<std::pair<std::string, std::string>> items) = 0;
  virtual Task<std::optional<std::string>> try_get(std::string key) = 0;
  // One value per key, nullopt where the key does not exist.
  virtual Task<std::vector<std::optional<std::string>>> multi_get(
      std::vector<std::string> keys) = 0;
  // Adds delta to the decimal counter at key (a missing key counts as 0); returns the new value.
  virtual Task<std::int64_t> add(std::string key, std::int64_t delta) = 0;
  // PyTorch's semantics: stores `desired` if the value equals `expected`, or if the key is missing
  // and `expected` is empty; returns the value stored afterwards (missing and not created:
  // `expected`).
  virtual Task<std::string> compare_set(std::string key, std::string expected,
                                        std::string desired) = 0;
  // True when every key exists.
  virtual Task<bool> check(std::vector<std::string> keys) = 0;
  // True when the key existed.
  virtual Task<bool> delete_key(std::string key) = 0;
  // True once every key exists; false when `timeout` passed first.
  virtual Task<bool> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) = 0;
  // The index in `keys` of a key that does not exist, now or once it is deleted; nullopt when
  // `timeout` passed first.
  virtual Task<std::optional<std::size_t>> wait_deleted(std::vector<std::string> keys,
                                                        std::chrono::milliseconds timeout) = 0;

  // A new session to the same store and job, for concurrent use.
  virtual Task<std::unique_ptr<RendezvousStore>> open_another() = 0;
  // A handle for a user that waits beside this session's calls (the round's watch), whose close()
  // ends its own calls only. TCP: a lane of this session's connection (its waits give way to the
  // session's calls; its ephemeral keys are the session's), so a job of N nodes holds N
  // connections to the store, not 2N. Otherwise a session of its own: open_another().
  virtual Task<std::unique_ptr<RendezvousStore>> open_watcher() { return open_another(); }
  // Ends the session: pending and later calls throw kCancelled; its ephemeral keys go (at once
  // where the store can tell, else when they expire). Safe to call more than once.
  virtual void close() = 0;
  // Where the store is, for messages: "127.0.0.1:29400", "etcd 10.0.0.1:2379,10.0.0.2:2379".
  virtual std::string describe() const = 0;
};

// Where a job's store is.
struct TcpStoreTarget {  // the job's TCPStore: keys under "rdzv/<run id>/", ephemeral per
                         // connection
  store::ClientOptions client;
};
struct EtcdOptions {  // etcd v3: keys under "<prefix>/<run id>/", ephemeral per lease
  store::etcd::ClientOptions client;
  std::string prefix = "/dist-launch";
  // An ephemeral key outlives a vanished session by about this (etcd raises it to its minimum,
  // about 1.5 election timeouts); the agent's: keep_alive_interval * (keep_alive_max_attempt - 1)
  // where --rdzv-conf gives keep_alive_max_attempt, else keep_alive_interval * 2; at least 2 s.
  std::chrono::seconds lease_ttl{3};
};
using StoreTarget = std::variant<TcpStoreTarget, EtcdOptions>;

// Where job `run_id`'s agent keys live in a TCPStore: "rdzv/<run id>/".
inline std::string tcp_job_prefix(const std::string& run_id) {
  return std::string(store::kAgentKeyPrefix) + run_id + "/";
}

// The etcd client's options from the launch configuration's (the password read from its file).
// Throws ConfigError with a one-line reason: no members, a user without a password file or the
// reverse, a password file that cannot be read.
EtcdOptions etcd_options(const EtcdConfig& config, std::chrono::seconds lease_ttl);

// The one way to make a session of job `run_id` on `target`: not connected yet (open() connects).
// Its calls run on `io` (one thread); an etcd session must be destroyed before `io`. Throws
// StoreError(kInvalidArgument) for an unusable target (an empty run id, an etcd TTL under 1 s).
std::unique_ptr<RendezvousStore> make_rendezvous_store(boost::asio::io_context& io,
                                                       StoreTarget target, std::string run_id);

// make_rendezvous_store, then open().
Task<std::unique_ptr<RendezvousStore>> open_rendezvous_store(boost::asio::io_context& io,
                                                             StoreTarget target,
                                                             std::string run_id);

// Who hosts the job's store, decided once from the configuration, as torch's _create_tcp_store
// decides it (is_host, else whether the endpoint names this machine; host, else be a client):
//
//   mode                   role                  address            port
//   one node               host                  loopback, or every master_port, else free
//   static, node rank 0    host (is_host=0: no)  every address      master_port, else 29500
//   static, other ranks    client                master_addr        master_port, else 29500
//   elastic c10d           host if the endpoint  every address      the endpoint's
//                          names this machine and the port is free, else client (is_host=1:
//                          host, is_host=0: client)
//   elastic etcd-v3        none (etcd is the store)
struct StorePlan {
  // kHost: a port this node cannot bind is an error; kHostIfThisMachine: this node is a client
  // then, of whoever holds it (another agent, a dist-rendezvous).
  enum class Role { kHost, kHostIfThisMachine, kClient, kNone } role = Role::kNone;
  std::string bind_address;   // hosting: "127.0.0.1", or "" for every address of the machine
  std::uint16_t port = 0;     // 0: a free port (one node)
  bool session = false;       // the agents meet in a rendezvous session (several nodes)
  bool round_stores = false;  // elastic: every round's workers get a store of their own
};
StorePlan plan_stores(const JobConfig& job, const RendezvousConfig& rendezvous);

// A store this agent hosts (a job's, or a round's for its workers). It is bound before any worker
// starts, so the process that decides the port is the one that holds it.
class StoreHost {
 public:
  // Binds `address` ("" for every address of the machine: "::" with IPv4 mapped in, or 0.0.0.0
  // where IPv6 is off) on `port` (0: a free one) and serves. Throws store::StoreError
  // (kUnavailable) naming the address when it cannot.
  StoreHost(boost::asio::io_context& io, const std::string& address, std::uint16_t port,
            store::ServerOptions options);
  ~StoreHost();
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;

  std::uint16_t port() const;
  std::string bound_address() const;  // for messages
  // Deletes every key outside the agents' namespace: a restart attempt's clean store.
  std::size_t clear_worker_keys();
  // Stores the agents' keys of job `run_id` (keys relative to the job, as RendezvousStore's) in
  // one MULTI_SET, straight into this store: a session's round trips spared. Throws
  // store::StoreError when the store's limits refuse them.
  void set_agent_keys(const std::string& run_id,
                      std::vector<std::pair<std::string, std::string>> items);
  // What the store has served so far (its requests by operation, connections); on the
  // io_context's thread.
  store::ServerStats stats() const;
  void stop();

 private:
  std::optional<store::StoreServer> server_;
};

// Whether `host` (a name or an address) is this machine: one of its resolved addresses can be
// bound here. Names resolve on Asio's resolver; a name that does not resolve is not this machine.
Task<bool> names_this_machine(std::string host);

}  // namespace dist::agent
