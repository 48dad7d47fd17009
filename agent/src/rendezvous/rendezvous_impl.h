// NodeRendezvous's state and its static and common parts (node_rendezvous.cc), and the elastic
// rounds (ElasticRendezvous, elastic_round.cc), which work over that state.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/rendezvous.h"
#include "rendezvous/schema.h"

namespace dist::agent {

// GCC 12 cannot compile a braced list inside a co_await expression ("array used as
// initializer"), so key lists are built by this plain function.
template <typename... K>
std::vector<std::string> keys(K&&... k) {
  return {std::string(std::forward<K>(k))...};
}

// The elastic rounds of one node's rendezvous (--nnodes MIN:MAX; elastic_round.cc): joining one,
// and the job's verdict after it ends. It works over its NodeRendezvous::Impl's sessions, job
// shape, timeouts and record.
class ElasticRendezvous {
 public:
  explicit ElasticRendezvous(NodeRendezvous::Impl& node) : node_(node) {}

  Task<Round> join_elastic(int round, std::optional<Round> previous,
                           std::optional<store::Endpoint> worker_store, bool keeps_workers);
  Task<int> current_round();
  Task<Verdict> decide(Round a, int max_restarts);
  Task<Verdict> settle(int round, std::string verdict);
  Task<bool> mark_done(Round a, std::string reason);

 private:
  // This node's ticket in `round`; `spare`: the running round was full or finishing, so this node
  // waits for a place (a hot spare) rather than for the running nodes to make one.
  struct Ticket {
    int number = 0;
    bool spare = false;
    int returning = 0;  // a survivor of the previous round: its ADD to `returning` (from 1)
  };
  Task<Ticket> take_ticket(int round, std::optional<Round> previous,
                           std::optional<store::Endpoint> worker_store, bool keeps_workers);
  // This node's record under `ticket` (ephemeral): its place before, the store it offers.
  Task<void> write_record(int round, int ticket, std::optional<Round> previous,
                          std::optional<store::Endpoint> worker_store, bool keeps_workers);
  Task<void> close_if_complete(int round, Ticket ticket);
  // `taken`: a lower bound of the round's ticket count this node knows (its own ticket's number).
  Task<bool> try_close(int round, std::optional<std::int64_t> taken = std::nullopt);
  // `in_place`: this node's workers run on meanwhile, and the deadline is --in-place-timeout's.
  Task<std::optional<Round>> await_assignment(int round, Ticket ticket,
                                              std::chrono::steady_clock::time_point deadline,
                                              bool in_place = false);
  // The closed round's assignment of `ticket`: its place, or none when it is not a member.
  Task<std::optional<Round>> read_assignment(int round, Ticket ticket);
  // A node whose workers waited in place past its deadline takes its record out of `round`
  // (withdrawn_), unless a closer is under way: then the round's outcome, its place when the round
  // closed with it (none when withdrawn or left out).
  Task<std::optional<Round>> withdraw(int round, Ticket ticket);
  // Round `round`'s verdict, when it has one: from those this node has read or settled, else
  // from the store (a verdict never changes once settled).
  Task<std::optional<Verdict>> verdict_of(int round);
  Verdict remember(int round, Verdict verdict);
  // Whether round `round` closed and runs on, undecided.
  Task<bool> runs_on(int round);
  // At each of a hot spare's last calls: while the round before `round` runs on, a deadline
  // that passed moves on by join_timeout (saying so); once that round is over, join_timeout
  // counts from the first last call that sees it over (`running`: it ran at the last look). A
  // spare's join timeout thus counts from that round's end. A round whose nodes have all
  // vanished runs on no more: it is decided first (decide_if_abandoned).
  Task<void> extend_while_running(int round, std::chrono::steady_clock::time_point& deadline,
                                  bool& running);
  // A newcomer's remedy for a round that closed and whose nodes have all vanished (killed, cut
  // off) before any of them decided its verdict: it decides it for them, so that the next round
  // can close instead of waiting out the join timeout.
  Task<void> decide_if_abandoned(int round);
  Task<void> throw_if_job_over(int round);
  std::string claim() const;  // "<nonce>/<pid>": whose claim a COMPARE_SET won

  // The node's session, job shape and timeouts.
  RendezvousStore& store();
  const JobShape& shape() const;
  const RendezvousTimeouts& timeouts() const;

  NodeRendezvous::Impl& node_;
  // The verdicts this node read or settled, by round: the latest few (a node asks about its own
  // round and the one before).
  static constexpr std::size_t kVerdictsKept = 4;
  std::map<int, Verdict> verdicts_;
  // The ticket this node held in a round it waited in with its workers running, past
  // --in-place-timeout (round, ticket): its record withdrawn while they stop, it is the node's
  // again when it joins that round next.
  std::optional<std::pair<int, Ticket>> withdrawn_;
};

class NodeRendezvous::Impl {
 public:
  Impl(std::unique_ptr<RendezvousStore> session, JobShape shape, RendezvousTimeouts timeouts,
       std::function<void(const std::string&)> log);

  // Static (node_rendezvous.cc).
  Task<Round> join_static(int round, int node_rank);
  Task<void> mark_failed(Round a, std::string reason);

  // In-place recovery (node_rendezvous.cc).
  Task<RecoveryClaim> claim_recovery(Round a, Recovery kind, int workers, int budget);
  Task<RecoveryClaim> take_over_recovery(Round a, std::string seen, int workers, int budget);
  Task<void> recovery_over(Round a);
  Task<int> replacements();
  // One more in-place replacement, job-wide (a lost node's survivors waiting in place for a node:
  // ElasticRendezvous::decide).
  Task<void> count_replacement();
  Task<bool> others_finished(Round a);

  // Both (node_rendezvous.cc).
  Task<void> announce_failure(Round a, std::vector<WorkerFailure> failures);
  Task<std::vector<WorkerFailure>> failures(Round a);
  Task<void> publish_replacements(Round a, std::vector<InPlaceReplacement> replaced);
  Task<std::vector<InPlaceReplacement>> replaced(Round a);
  Task<WatchResult> watch(Round a, std::chrono::seconds heartbeat,
                          std::function<std::string()> progress,
                          std::function<void(schema::JobView)> on_view);
  void stop_watch();
  Task<BarrierEnd> exit_barrier(Round a, std::chrono::milliseconds timeout, bool may_leave);
  // Static: the job finished (every node still there succeeded); a relaunched node learns it.
  Task<bool> mark_finished(Round a, std::string reason);
  Task<BarrierEnd> pass_without_lost(Round a, std::chrono::steady_clock::time_point deadline,
                                     std::chrono::milliseconds timeout, bool may_leave);
  Task<std::optional<BarrierEnd>> past_barrier_timeout(
      const Round& a, std::chrono::steady_clock::time_point& deadline,
      std::chrono::milliseconds timeout, bool may_leave);
  Task<std::vector<int>> absent_nodes(Round a);
  Task<void> wait_for_others_to_leave(Round a, std::chrono::milliseconds timeout);
  void close();

  RendezvousStore& store() { return *store_; }

  ElasticRendezvous elastic{*this};  // the elastic rounds (elastic_round.cc), over this state

 private:
  friend class ElasticRendezvous;

  // Static rounds.
  Task<void> publish_liveness(int node_rank, std::string record);
  Task<void> raise_round_pointer(int round, std::string current);
  Task<void> abort_round(int round, int node_rank, std::string reason);
  Task<void> close_static(int round);
  Task<std::vector<int>> missing_static(int round);
  Task<void> throw_if_over();
  Task<Round> placed(int round, int node_rank);
  Task<bool> still_at_barrier(int round, int node_rank);
  Task<bool> finished_without(int round, int node_rank);
  Task<bool> settle_static(int round, bool finished);

  // Both.
  std::vector<std::string> liveness_keys(const Round& a, const std::vector<int>& members);
  Task<std::vector<int>> members(const Round& a);
  Task<std::vector<int>> members(const Round& a, RendezvousStore& via);
  Task<std::vector<int>> lost_nodes(Round a);
  Task<void> report_lost_successor(const Round& a, RendezvousStore& via, int successor);
  Task<std::optional<std::string>> skip_departed(const Round& a, RendezvousStore& via,
                                                 int& successor);
  // The job view (schema::JobView): node 0 reads every node's progress and writes it, the others
  // read it; `on_view` hears it. A value that does not decode is said at debug level and skipped.
  Task<void> exchange_view(const Round& a, RendezvousStore& via,
                           const std::function<void(schema::JobView)>& on_view);
  std::optional<std::string> successor_key(const Round& a) const;
  void notice(const std::string& message) const {
    if (log_) log_(message);
  }

  std::unique_ptr<RendezvousStore> store_;  // joins, announcements; holds this node's liveness
  std::unique_ptr<RendezvousStore> watch_session_;
  bool watch_stop_requested_ = false;
  // Expires with this object: a coroutine frame destroyed after it (the io_context goes last)
  // must not touch its members.
  std::shared_ptr<char> alive_ = std::make_shared<char>();
  JobShape shape_;
  RendezvousTimeouts timeouts_;
  std::function<void(const std::string&)> log_;
  std::uint32_t nonce_;
  schema::NodeRecord self_;  // this agent's record (elastic rounds add its previous rank)
  bool alive_published_ = false;
};

}  // namespace dist::agent
