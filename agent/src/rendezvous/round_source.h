// The rendezvous folder's face: how this node's rounds form and end, behind one interface chosen
// once from the configuration (make_round_source), so that the agent's lifecycle is the same for
// every mode, as torch's agent is behind its RendezvousHandler:
//
//   mode                          rounds                       the job's store        the workers'
//   one node (static, 1 node)     formed here, no store call   hosted here            the same
//   static  (--nnodes N)          NodeRendezvous, round=restart node rank 0 hosts it  the same
//   elastic (--nnodes MIN:MAX)    NodeRendezvous, tickets      the endpoint's machine a new one per
//                                 and the job's verdict        (c10d), or etcd        round, node
//                                 0's
//
// Every call is a coroutine on the agent's io_context; close() cancels whatever is pending (the
// calls throw StoreError kCancelled) and releases the stores this node hosts.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/agent/config.h"
#include "dist/store/endpoint.h"
#include "rendezvous/rendezvous.h"
#include "rendezvous/schema.h"

namespace dist::agent {

// How a round's watch ended: a result, or the rendezvous store lost (why, in words).
struct WatchOutcome {
  WatchResult result;
  std::string store_lost;
};

// Every node's record of a job that failed (RoundSource::collect_failures).
struct CollectedFailures {
  std::vector<WorkerFailure> failures;
  std::vector<InPlaceReplacement> replaced;
};

class RoundSource {
 public:
  virtual ~RoundSource() = default;

  // Rounds are formed with other nodes (the watch, the exit barrier, the failure announcements
  // and the report's collection mean something).
  virtual bool several_nodes() const = 0;
  // An ended round's fate is the job's verdict (decide()), not a count of this node's.
  virtual bool elastic() const = 0;

  // Once, before the first round: binds the store this node hosts (before any worker exists, so
  // that whoever picks the port holds it) and opens the rendezvous session. Throws
  // RendezvousError, store::StoreError.
  virtual Task<void> prepare() = 0;
  // Joins the next round (after `previous`, when this node was in one): static, round `restarts`;
  // elastic, the job's next. Throws RendezvousError, JobOverError, RoundAbortedError.
  virtual Task<Round> join(int restarts, std::optional<Round> previous) = 0;
  // Elastic, --restart-policy in-place: joins the round after `previous` while this node's
  // workers run on (a lost node's survivors regroup): the workers' store this node offers is the
  // one they use. Other modes have no such round: RendezvousError.
  virtual Task<Round> join_keeping_workers(Round previous) {
    throw RendezvousError("round " + std::to_string(previous.round) +
                          " cannot be followed while its workers run: only elastic rounds can");
  }
  // Where round `a`'s workers find their store (MASTER_ADDR, MASTER_PORT).
  virtual store::Endpoint workers_store(const Round& a) const = 0;

  // Several nodes: until round `a` ends elsewhere or stop_watch() is called. A lost store is an
  // outcome too, not an error.
  virtual Task<WatchOutcome> watch(Round a) = 0;
  virtual void stop_watch() = 0;
  // Several nodes: tells every node that round `a` failed here, and why.
  virtual Task<void> announce_failure(Round a, std::vector<WorkerFailure> failures) = 0;
  // Several nodes: passed once the workers of every node still there succeeded (the job is done:
  // nodes that join later learn it), or the round ended (BarrierEnd).
  virtual Task<BarrierEnd> exit_barrier(Round a) = 0;
  // Elastic: how the job goes on after round `a` ended (the same verdict for every node).
  virtual Task<Verdict> decide(Round a) = 0;
  // The job failed for good: every node's failures for the report, and the workers every node
  // replaced in place before (static: first marks the job failed, so that a relaunched node
  // still joining learns it). A store that is gone leaves them empty (said as a warning).
  virtual Task<CollectedFailures> collect_failures(Round a, std::string reason) = 0;
  // Several nodes, in place: this node's workers replaced in place so far, published in round
  // `a` for the other nodes' reports.
  virtual Task<void> publish_replacements(Round a, std::vector<InPlaceReplacement> replaced) = 0;
  // Several nodes, in place: the job's replacements (one read; 0 where the store cannot say:
  // never an error), for job_end once the job succeeded.
  virtual Task<int> job_replacements() = 0;
  // --restart-policy in-place: claims the job's one recovery for this node (`workers` of it
  // replaced while the others run, each counted with the replacements, and refused uncounted when
  // the job's replacements would pass `budget`: RecoveryClaim::over_budget; node 0's regroup, 0),
  // says it is over, reads the count. One node keeps them itself; several, in the job's store
  // (NodeRendezvous::claim_recovery), so that every node counts the others' and no two recoveries
  // overlap.
  virtual Task<RecoveryClaim> claim_recovery(Round a, Recovery kind, int workers, int budget) = 0;
  // The replacement under way in round a (another node's, or this one's) that a refused claim found
  // (RecoveryClaim::seen) becomes this node's, `workers` replacements more (failures folded into
  // it: recovery/in_place.h) within `budget`; refused when the recovery is no longer exactly that.
  virtual Task<RecoveryClaim> take_over_recovery(Round a, std::string seen, int workers,
                                                 int budget) = 0;
  virtual Task<void> recovery_over(Round a) = 0;
  virtual Task<int> replacements() = 0;
  // In place: whether every other node of round a has finished (its workers all succeeded: it is
  // at the exit barrier). One node: there is no other.
  virtual Task<bool> others_finished(Round a) = 0;
  // Before the round that follows a failed one.
  virtual void restart() = 0;
  // Whether the other nodes need this one to stay once its work is over (it hosts their store);
  // and the bounded wait for them to leave.
  virtual bool hosts_others() const = 0;
  virtual Task<void> wait_for_others(Round a) = 0;

  virtual void close() = 0;
  // Where the rendezvous store is, for messages.
  virtual std::string describe() const = 0;

  // What this node publishes beside its heartbeat while a round runs (its agent's state and its
  // workers' progress, progress/<k>) for `dist-launch status`: several nodes in the watch, one
  // node in the store it hosts (the keys a status reader needs, under the agents' namespace).
  void set_progress_source(std::function<schema::NodeProgress()> source) {
    progress_ = std::move(source);
  }
  // Several nodes: what hears the job view (schema::JobView) while a round runs.
  void set_job_view_sink(std::function<void(schema::JobView)> sink) {
    view_sink_ = std::move(sink);
  }

 protected:
  const std::function<void(schema::JobView)>& view_sink() const { return view_sink_; }
  // progress_, encoded (none without a source).
  std::function<std::string()> encoded_progress() const {
    if (!progress_) return {};
    return [this] { return schema::encode(progress_()); };
  }

 private:
  std::function<schema::NodeProgress()> progress_;
  std::function<void(schema::JobView)> view_sink_;
};

// The mode the configuration asks for, from the job's shape and the rendezvous's part of the
// configuration. `host`: this node as the others see it; `notice` hears the rendezvous's
// progress (who it waits for); `in_place_wait`: JobShape's (--restart-policy in-place).
std::unique_ptr<RoundSource> make_round_source(boost::asio::io_context& io, const JobConfig& job,
                                               const RendezvousConfig& rendezvous, std::string host,
                                               std::function<void(const std::string&)> notice,
                                               std::chrono::milliseconds in_place_wait = {});

}  // namespace dist::agent
