// The three ways a node's rounds form (round_source.h): alone, static, elastic. Which store this
// node hosts comes from store/'s plan_stores(); what the rounds do over the store, from
// NodeRendezvous.
#include "rendezvous/round_source.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <memory>
#include <optional>

#include "dist/store/async_client.h"
#include "dist/store/errors.h"
#include "store/store.h"

namespace dist::agent {
namespace {

using store::Endpoint;

// The agent that hosts the store waits this long for the others to leave, so that they can
// finish their exit barrier and report.
constexpr std::chrono::milliseconds kLeaveTimeout{std::chrono::seconds(30)};

// A rejoining node that cannot reach etcd yet says so this often.
constexpr std::chrono::seconds kRejoinNoticeInterval{30};

// A store this agent hosts asks for the job's token, when there is one.
store::ServerOptions with_token(const RendezvousConfig& c, store::ServerOptions options) {
  options.secret = c.secret;
  options.unauthenticated = c.unauthenticated;
  return options;
}

// TCP keepalive on the agents' store connections, both ends: a peer that went silent is dropped
// after about keep_alive_interval * keep_alive_max_attempt seconds (the first probe after one
// interval of silence, then max_attempt - 1 more).
store::Keepalive liveness(const RendezvousConfig& c) {
  return {c.keep_alive_interval_seconds, c.keep_alive_interval_seconds,
          std::max(1, c.keep_alive_max_attempt - 1)};
}

// One node: rounds formed here; the store is this agent's, for the workers. In it, under the
// agents' namespace, the keys `dist-launch status` reads (as a static job of one node), written
// straight into the store (no session of this agent's own: a launch spares its connection and
// round trips): the round's at each join, the heartbeat and progress every keep_alive_interval
// until the agent closes. Status is a courtesy: a write the store refuses is said at debug level
// and changes nothing.
class LocalRounds final : public RoundSource {
 public:
  LocalRounds(boost::asio::io_context& io, const JobConfig& job, const RendezvousConfig& config,
              std::string host)
      : io_(io),
        job_(job),
        config_(config),
        plan_(plan_stores(job, config)),
        host_(std::move(host)) {}
  ~LocalRounds() override { close(); }

  bool several_nodes() const override { return false; }
  bool elastic() const override { return false; }

  Task<void> prepare() override {
    try {
      store_.emplace(io_, plan_.bind_address, plan_.port, with_token(config_, {}));
    } catch (const store::StoreError& e) {
      throw RendezvousError(std::string("cannot host the rendezvous store: ") + e.what());
    }
    spdlog::debug(
        "store listening on {} (dist-launch status --rdzv-endpoint 127.0.0.1:{} "
        "--rdzv-id {})",
        store_->bound_address(), store_->port(), job_.run_id);
    co_return;
  }
  Task<Round> join(int restarts, std::optional<Round>) override {
    Round a;
    a.round = a.restarts = restarts;
    a.world_size = job_.nproc_per_node;
    round_ = a.round;
    publish_round(a);
    if (!beating_) {
      beating_ = true;
      boost::asio::co_spawn(io_, heartbeat(std::weak_ptr<char>(alive_)), boost::asio::detached);
    }
    co_return a;
  }
  Endpoint workers_store(const Round&) const override {
    return {config_.master_addr, store_->port()};
  }
  Task<WatchOutcome> watch(Round) override { co_return WatchOutcome{}; }
  void stop_watch() override {}
  Task<void> announce_failure(Round, std::vector<WorkerFailure>) override { co_return; }
  Task<BarrierEnd> exit_barrier(Round) override { co_return BarrierEnd{true, {}, false}; }
  Task<Verdict> decide(Round) override {
    throw RendezvousError("a single node's rounds have no verdict");
  }
  Task<CollectedFailures> collect_failures(Round, std::string) override {
    co_return CollectedFailures{};
  }
  Task<void> publish_replacements(Round, std::vector<InPlaceReplacement>) override { co_return; }
  Task<int> job_replacements() override { co_return 0; }
  Task<RecoveryClaim> claim_recovery(Round a, Recovery kind, int workers, int budget) override {
    if (recovering_ != Recovery::kNone && recovering_round_ == a.round) {
      co_return RecoveryClaim{std::nullopt, recovering_, {}, std::nullopt};
    }
    if (kind == Recovery::kReplacement && replacements_ + workers > budget) {
      co_return RecoveryClaim{std::nullopt, Recovery::kNone, {}, replacements_};
    }
    recovering_ = kind;
    recovering_round_ = a.round;
    if (kind == Recovery::kReplacement) replacements_ += workers;
    co_return RecoveryClaim{replacements_, Recovery::kNone, {}, std::nullopt};
  }
  Task<RecoveryClaim> take_over_recovery(Round a, std::string, int workers, int budget) override {
    if (recovering_ != Recovery::kReplacement || recovering_round_ != a.round) {
      co_return RecoveryClaim{};
    }
    if (replacements_ + workers > budget) {
      co_return RecoveryClaim{std::nullopt, Recovery::kReplacement, {}, replacements_};
    }
    co_return RecoveryClaim{replacements_ += workers, Recovery::kNone, {}, std::nullopt};
  }
  Task<void> recovery_over(Round) override {
    recovering_ = Recovery::kNone;
    co_return;
  }
  Task<int> replacements() override { co_return replacements_; }
  Task<bool> others_finished(Round) override { co_return true; }
  // A restart attempt starts with a clean store: PyTorch 2.5+ workers expect a fresh one.
  void restart() override {
    if (store_)
      spdlog::debug("cleared {} keys of the previous attempt", store_->clear_worker_keys());
  }
  bool hosts_others() const override { return false; }
  Task<void> wait_for_others(Round) override { co_return; }
  void close() override {
    closed_ = true;
    if (beat_timer_) beat_timer_->cancel();
    if (store_) store_->stop();
  }
  std::string describe() const override {
    return store_ ? store_->bound_address() : "this node's store";
  }

 private:
  // The keys of a static job's round a status reader needs, for node rank 0 alone. Its alive key
  // is a plain one: the store goes with this agent, as an ephemeral key would.
  void publish_round(Round a) {
    const std::string record = schema::encode(schema::NodeRecord{
        host_, job_.nproc_per_node, static_cast<int>(::getpid()), 0, -1, std::nullopt});
    namespace name = schema::name;
    std::vector<std::pair<std::string, std::string>> items{
        {std::string(schema::kRoundPointer), std::to_string(a.round)},
        {std::string(schema::kStaticNodes), "1"},
        {schema::in_round(a.round, name::kNode, 0), record},
        {schema::in_round(a.round, name::kOffset, 0), "0"},
        {schema::in_round(a.round, name::kWorldSize), std::to_string(a.world_size)},
        {schema::in_round(a.round, name::kHealthy), "1"}};
    if (a.round == 0) items.emplace_back(schema::static_alive(0), record);
    for (auto& item : schema::heartbeat_items(a.round, 0, encoded_progress())) {
      items.push_back(std::move(item));
    }
    publish(std::move(items), "round " + std::to_string(a.round));
  }

  void publish(std::vector<std::pair<std::string, std::string>> items, const std::string& what) {
    if (closed_) return;  // a heartbeat whose timer fired before close() cancelled it
    try {
      store_->set_agent_keys(job_.run_id, std::move(items));
    } catch (const store::StoreError& e) {
      spdlog::debug("cannot publish {} for dist-launch status: {}", what, e.what());
    }
  }

  // Until close(): this node's heartbeat and progress, every keep_alive_interval.
  Task<void> heartbeat(std::weak_ptr<char> alive) {
    boost::asio::steady_timer timer(io_);
    beat_timer_ = &timer;
    struct Forget {  // the timer goes with this frame; this object may be gone before it
      std::weak_ptr<char>& alive;
      boost::asio::steady_timer*& slot;
      ~Forget() {
        if (!alive.expired()) slot = nullptr;
      }
    } forget{alive, beat_timer_};
    while (true) {
      timer.expires_after(std::chrono::seconds(config_.keep_alive_interval_seconds));
      boost::system::error_code ec;
      co_await timer.async_wait(boost::asio::redirect_error(boost::asio::use_awaitable, ec));
      if (alive.expired() || ec) co_return;  // closed (this object may be gone)
      publish(schema::heartbeat_items(round_, 0, encoded_progress()), "the heartbeat");
    }
  }

  boost::asio::io_context& io_;
  const JobConfig& job_;
  const RendezvousConfig& config_;
  StorePlan plan_;
  std::string host_;
  std::optional<StoreHost> store_;
  int round_ = 0;
  bool beating_ = false;
  bool closed_ = false;
  boost::asio::steady_timer* beat_timer_ = nullptr;  // the heartbeat's, while it runs
  std::shared_ptr<char> alive_ = std::make_shared<char>();
  int replacements_ = 0;  // in-place
  Recovery recovering_ = Recovery::kNone;
  int recovering_round_ = 0;
};

// What static and elastic rounds share: the store this node may host, the rendezvous session,
// and every call made over it once a round runs.
class NodeRounds : public RoundSource {
 public:
  NodeRounds(boost::asio::io_context& io, const JobConfig& job, const RendezvousConfig& config,
             std::string host, std::function<void(const std::string&)> notice,
             std::chrono::milliseconds in_place_wait)
      : io_(io),
        job_(job),
        config_(config),
        plan_(plan_stores(job, config)),
        host_(std::move(host)),
        notice_(std::move(notice)),
        in_place_wait_(in_place_wait) {}

  bool several_nodes() const override { return true; }

  Task<WatchOutcome> watch(Round a) override {
    WatchOutcome o;
    try {
      o.result = co_await rdzv_->watch(a, std::chrono::seconds(config_.keep_alive_interval_seconds),
                                       encoded_progress(), view_sink());
    } catch (const store::StoreError& e) {
      if (e.code() == store::StoreErrc::kCancelled) throw;
      o.store_lost = e.what();
    }
    co_return o;
  }
  void stop_watch() override { rdzv_->stop_watch(); }
  Task<void> announce_failure(Round a, std::vector<WorkerFailure> failures) override {
    co_await rdzv_->announce_failure(std::move(a), std::move(failures));
  }
  Task<RecoveryClaim> claim_recovery(Round a, Recovery kind, int workers, int budget) override {
    co_return co_await rdzv_->claim_recovery(std::move(a), kind, workers, budget);
  }
  Task<RecoveryClaim> take_over_recovery(Round a, std::string seen, int workers,
                                         int budget) override {
    co_return co_await rdzv_->take_over_recovery(std::move(a), std::move(seen), workers, budget);
  }
  Task<void> recovery_over(Round a) override { co_await rdzv_->recovery_over(std::move(a)); }
  Task<int> replacements() override { co_return co_await rdzv_->replacements(); }
  Task<bool> others_finished(Round a) override {
    co_return co_await rdzv_->others_finished(std::move(a));
  }
  Task<CollectedFailures> collect_failures(Round a, std::string reason) override {
    CollectedFailures all;
    try {
      co_await before_collecting(a, std::move(reason));
      all.failures = co_await rdzv_->failures(a);
    } catch (const store::StoreError& e) {
      if (e.code() == store::StoreErrc::kCancelled) throw;
      spdlog::warn("cannot read the other nodes' failures: {}", e.what());
      co_return all;
    }
    try {
      all.replaced = co_await rdzv_->replaced(a);
    } catch (const store::StoreError& e) {
      if (e.code() == store::StoreErrc::kCancelled) throw;
      spdlog::warn("cannot read the workers the other nodes replaced in place: {}", e.what());
    } catch (const std::exception& e) {  // a record this agent cannot read: left out, said
      spdlog::warn("cannot read the workers the other nodes replaced in place: {}", e.what());
    }
    co_return all;
  }
  Task<void> publish_replacements(Round a, std::vector<InPlaceReplacement> replaced) override {
    co_await rdzv_->publish_replacements(std::move(a), std::move(replaced));
  }
  Task<int> job_replacements() override {
    try {
      co_return co_await rdzv_->replacements();
    } catch (const store::StoreError& e) {
      if (e.code() == store::StoreErrc::kCancelled) throw;
      spdlog::info("cannot read the job's in-place replacements: {}", e.what());
    } catch (const std::exception& e) {
      spdlog::info("cannot read the job's in-place replacements: {}", e.what());
    }
    co_return 0;
  }
  bool hosts_others() const override { return job_store_.has_value(); }
  Task<void> wait_for_others(Round a) override {
    co_await rdzv_->wait_for_others_to_leave(std::move(a), kLeaveTimeout);
  }
  void close() override {
    if (opening_) opening_->close();
    if (rdzv_) rdzv_->close();
    if (job_store_) job_store_->stop();
  }
  std::string describe() const override { return rdzv_ ? rdzv_->describe() : config_.master_addr; }

 protected:
  virtual Task<void> before_collecting(const Round&, std::string) { co_return; }

  // Whether this node may leave its exit barrier when it times out, the others still running:
  // not while it serves a store they use (the job's rendezvous store; node 0, the workers').
  bool may_leave_early(const Round& a) const { return !hosts_others() && a.node_rank != 0; }

  // A round that did not form, said with the connections this node's job store refused for the
  // job's token: a node started with another token (or none) is missing for that reason, and
  // its own log, on its own machine, says so (this one said each refusal as it came).
  [[noreturn]] void round_timed_out(const RoundTimeoutError& e) const {
    const auto stats = job_store_ ? job_store_->stats() : store::ServerStats{};
    if (stats.connections_unauthenticated == 0) throw e;
    throw RoundTimeoutError(
        std::string(e.what()) + "; this node's store refused " +
        std::to_string(stats.connections_unauthenticated) +
        (stats.connections_unauthenticated == 1 ? " connection" : " connections") +
        " for the job's token (the last, " + stats.last_unauthenticated +
        "): give every node's agent the same --token-file");
  }

  // Hosts the job's store as the plan says; false when this node is a client of it.
  Task<bool> host_job_store() {
    bool host = plan_.role == StorePlan::Role::kHost;
    // (No co_await inside && or ?: : GCC 12 evaluates it whatever the left side says.)
    if (plan_.role == StorePlan::Role::kHostIfThisMachine) {
      host = co_await names_this_machine(config_.master_addr);
    }
    if (!host) co_return false;
    store::ServerOptions options;
    options.keepalive = liveness(config_);  // agents that vanish are dropped
    try {
      job_store_.emplace(io_, plan_.bind_address, plan_.port, with_token(config_, options));
    } catch (const store::StoreError& e) {
      if (plan_.role == StorePlan::Role::kHost) {
        throw RendezvousError(std::string("cannot host the rendezvous store") +
                              (job_.elastic ? " (--rdzv-conf is_host=1): " : ": ") + e.what());
      }
      spdlog::debug("not hosting the store ({}): joining {}:{}", e.what(), config_.master_addr,
                    plan_.port);
      co_return false;
    }
    if (job_.elastic) {
      spdlog::info("hosting the rendezvous store for {}:{} on {}", config_.master_addr,
                   job_store_->port(), job_store_->bound_address());
    } else {
      spdlog::debug("store listening on {}", job_store_->bound_address());
    }
    co_return true;
  }

  // Opens `session`, which this node's rounds then run over: the job's TCPStore (hosted here or
  // elsewhere), or etcd. (The session is made by the caller, outside any co_await: GCC 12 copies
  // class temporaries in co_await expressions incorrectly.)
  Task<void> open_session(std::unique_ptr<RendezvousStore> session) {
    RendezvousTimeouts timeouts;
    timeouts.rdzv = config_.rdzv_timeout;
    timeouts.join = config_.join_timeout;
    timeouts.last_call = config_.last_call_timeout;
    const JobShape shape{job_.min_nodes,    job_.max_nodes,         job_.nproc_per_node, host_,
                         job_.max_restarts, job_store_.has_value(), in_place_wait_};
    // Held here, not in this frame, so that close() can cancel the connect, and a frame destroyed
    // after this object (the io_context goes last) has nothing of it to touch.
    opening_ = std::move(session);
    co_await opening_->open();
    rdzv_.emplace(std::move(opening_), shape, timeouts, notice_);
  }

  // The job's TCPStore, as a client (every agent is one, the host included).
  TcpStoreTarget tcp_target() const {
    store::ClientOptions options;
    options.host = config_.master_addr;
    options.port = job_store_ ? job_store_->port() : plan_.port;
    options.connect_timeout = job_.elastic ? config_.join_timeout : config_.rdzv_timeout;
    options.secret = config_.secret;
    const store::Keepalive keepalive = liveness(config_);
    options.keepalive_idle_seconds = keepalive.idle_seconds;
    options.keepalive_interval_seconds = keepalive.interval_seconds;
    options.keepalive_probes = keepalive.probes;
    options.on_retry = [](const std::string& why) { spdlog::warn("{}", why); };
    options.refusal_is_final = config_.rejoining;
    return {std::move(options)};
  }

  boost::asio::io_context& io_;
  const JobConfig& job_;
  const RendezvousConfig& config_;
  StorePlan plan_;
  std::string host_;
  std::function<void(const std::string&)> notice_;
  std::chrono::milliseconds in_place_wait_;
  std::optional<StoreHost> job_store_;  // the job's store, when this node hosts it
  std::optional<NodeRendezvous> rdzv_;
  std::unique_ptr<RendezvousStore> opening_;  // the session being connected
};

// --nnodes N --node-rank k: round n is restart n; node rank 0 hosts the store.
class StaticRounds final : public NodeRounds {
 public:
  using NodeRounds::NodeRounds;

  bool elastic() const override { return false; }
  Task<void> prepare() override {
    co_await host_job_store();
    auto session = make_rendezvous_store(io_, tcp_target(), job_.run_id);
    co_await open_session(std::move(session));
  }
  Task<Round> join(int restarts, std::optional<Round>) override {
    try {
      co_return co_await rdzv_->join_static(restarts, job_.node_rank);
    } catch (const RoundTimeoutError& e) {
      round_timed_out(e);
    }
  }
  Endpoint workers_store(const Round&) const override {
    return {config_.master_addr, job_store_ ? job_store_->port() : plan_.port};
  }
  // A node lost at the barrier: a relaunched one learns that the job finished without it.
  Task<BarrierEnd> exit_barrier(Round a) override {
    BarrierEnd end =
        co_await rdzv_->exit_barrier(a, config_.exit_barrier_timeout, may_leave_early(a));
    if (end.passed && !end.lost.empty()) co_await rdzv_->mark_done(a, end.lost);
    co_return end;
  }
  Task<Verdict> decide(Round) override {
    throw RendezvousError("static rounds have no verdict: restarts are counted per node");
  }
  // A restart attempt starts with a clean store: PyTorch 2.5+ workers expect a fresh one.
  void restart() override {
    if (job_store_) {
      spdlog::debug("cleared {} keys of the previous attempt", job_store_->clear_worker_keys());
    }
  }

 private:
  // Nodes still joining (a relaunched one) learn that the job failed.
  Task<void> before_collecting(const Round& a, std::string reason) override {
    co_await rdzv_->mark_failed(a, std::move(reason));
  }
};

// --nnodes MIN:MAX: rounds of whoever is there, the job's verdict after each; every round's
// workers on a store of their own.
class ElasticRounds final : public NodeRounds {
 public:
  using NodeRounds::NodeRounds;

  bool elastic() const override { return true; }
  Task<void> prepare() override {
    if (config_.rdzv_backend == RendezvousBackend::kEtcdV3) {
      // A vanished node's lease expires after keep_alive_interval * (keep_alive_max_attempt - 1)
      // seconds, at least 2 (etcd's own minimum is about 1.5 election timeouts); by default
      // keep_alive_interval * 2 (config.h).
      const int attempts =
          config_.keep_alive_max_attempt_given ? config_.keep_alive_max_attempt : 3;
      const int ttl = std::max(2, config_.keep_alive_interval_seconds * (attempts - 1));
      // A rejoining node (cut off from the members) waits join_timeout for them to answer, as
      // its TCP store's connect would, not one call's unavailable_timeout (10 s); its session's
      // calls keep that (a second cut is noticed as soon as the first was).
      const auto give_up = std::chrono::steady_clock::now() + config_.join_timeout;
      auto said = std::chrono::steady_clock::now();
      while (true) {
        auto session = make_rendezvous_store(
            io_, etcd_options(config_.etcd, std::chrono::seconds(ttl)), job_.run_id);
        try {
          co_return co_await open_session(std::move(session));
        } catch (const store::StoreError& e) {
          const auto now = std::chrono::steady_clock::now();
          if (!config_.rejoining || e.code() != store::StoreErrc::kUnavailable || now >= give_up) {
            throw;
          }
          if (now - said >= kRejoinNoticeInterval) {
            said = now;
            spdlog::warn("still cannot reach etcd to rejoin the job ({}); retrying for up to {} s",
                         e.what(),
                         std::chrono::duration_cast<std::chrono::seconds>(give_up - now).count());
          }
        }
      }
    }
    co_await host_job_store();
    if (plan_.port == 0 && !job_store_) {
      throw RendezvousError("--rdzv-endpoint " + config_.master_addr +
                            ":0 asks for a free port, which only the agent that hosts the store "
                            "can pick, and this one does not host it (the endpoint is not this "
                            "machine, or is_host=0): give the store's real port");
    }
    auto session = make_rendezvous_store(io_, tcp_target(), job_.run_id);
    co_await open_session(std::move(session));
  }
  // As torch's rendezvous does, every round's workers get a fresh store of their own (except
  // when a lost node's survivors regroup in place: join_keeping_workers): the
  // rendezvous store may outlive the job (etcd, a dist-rendezvous daemon, another job's agent),
  // and torch keys the workers' entries by restart count only, so that two jobs, or two rounds of
  // one job (a reshaped round does not advance the restart count), would read each other's there.
  Task<Round> join(int, std::optional<Round> previous) override {
    // (Not `previous ? ... : co_await ...`: GCC 12 runs a co_await in either branch.)
    int round = 0;
    if (previous) {
      round = previous->round + 1;
    } else {
      round = co_await rdzv_->current_round();
    }
    round_store_.reset();
    round_store_.emplace(io_, "", 0, with_token(config_, store::ServerOptions{}));
    co_return co_await join_offering_store(round, std::move(previous));
  }
  // The workers run on: the store this node offers is the one they use (when it was node 0, the
  // round's first member, whose offer the round takes again).
  Task<Round> join_keeping_workers(Round previous) override {
    if (!round_store_) {
      round_store_.emplace(io_, "", 0, with_token(config_, store::ServerOptions{}));
    }
    const int round = previous.round + 1;
    std::optional<Round> after = std::move(previous);
    co_return co_await join_offering_store(round, std::move(after), true);
  }
  Endpoint workers_store(const Round& a) const override {
    return a.worker_store.value_or(Endpoint{});
  }
  // Once every node still there succeeded, nodes waiting to join learn the job is over: the
  // job's verdict, unless another came first (the round ended after all).
  Task<BarrierEnd> exit_barrier(Round a) override {
    BarrierEnd end =
        co_await rdzv_->exit_barrier(a, config_.exit_barrier_timeout, may_leave_early(a));
    if (!end.passed || end.left_early) co_return end;  // (the job runs on: no verdict yet)
    // (Not `end.passed && !co_await ...`: GCC 12 runs a co_await whatever the left side says.)
    const bool done = co_await rdzv_->mark_done(a, end.lost);
    if (!done) co_return BarrierEnd{};
    co_return end;
  }
  Task<Verdict> decide(Round a) override {
    co_return co_await rdzv_->decide(std::move(a), job_.max_restarts);
  }
  void restart() override {}  // the verdict counted it, job-wide; the next round has a new store
  void close() override {
    NodeRounds::close();
    if (round_store_) round_store_->stop();
  }

 private:
  // The agents never use the round's workers' store, so it learns this host from one
  // authentication here, and admits this node's PyTorch workers (--unauthenticated known-hosts).
  Task<Round> join_offering_store(int round, std::optional<Round> previous,
                                  bool keeps_workers = false) {
    const Endpoint offered{host_, round_store_->port()};
    std::optional<Round> formed;
    try {
      formed = co_await rdzv_->join_elastic(round, std::move(previous), offered, keeps_workers);
    } catch (const RoundTimeoutError& e) {
      round_timed_out(e);
    }
    Round joined = std::move(*formed);
    if (!config_.secret.empty()) co_await introduce_to_workers_store(joined);
    co_return joined;
  }

  Task<void> introduce_to_workers_store(const Round& a) {
    store::ClientOptions options;
    const Endpoint workers = workers_store(a);
    options.host = workers.host;
    options.port = workers.port;
    options.connect_timeout = config_.join_timeout;
    options.secret = config_.secret;
    store::AsyncStoreClient client(io_.get_executor(), options);
    co_await client.open();
    client.close();
  }

  std::optional<StoreHost> round_store_;  // the store this node offers this round's workers
};

}  // namespace

std::unique_ptr<RoundSource> make_round_source(boost::asio::io_context& io, const JobConfig& job,
                                               const RendezvousConfig& config, std::string host,
                                               std::function<void(const std::string&)> notice,
                                               std::chrono::milliseconds in_place_wait) {
  if (job.elastic) {
    return std::make_unique<ElasticRounds>(io, job, config, std::move(host), std::move(notice),
                                           in_place_wait);
  }
  if (job.max_nodes > 1) {
    return std::make_unique<StaticRounds>(io, job, config, std::move(host), std::move(notice),
                                          in_place_wait);
  }
  return std::make_unique<LocalRounds>(io, job, config, std::move(host));
}

}  // namespace dist::agent
