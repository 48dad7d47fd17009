// The agents' rendezvous protocol as data: every key the agents write under the job's prefix and
// every value's encoding, with checked decoding. A value that does not decode is a
// CorruptValueError naming its key and what was expected, never a bare "stoi".
//
// Keys are relative to the job's prefix (TCPStore: rdzv/<run id>/). Job-wide:
//   round               static: the latest round whose first node joined (it raises it);
//                       elastic: the round after the latest that closed
//   alive/<k>           static: node rank k's liveness, ephemeral (exists while its agent lives)
//   over                static: the job failed for good (the reason); nodes still joining stop
//   nodes               static: the job's node count (for status)
//   in_place            --restart-policy in-place: InPlaceState, the replacements so far and the
//                       one recovery under way (claimed by COMPARE_SET: one at a time, job-wide)
// Per round n, under r<n>/:
//   node/<id>           the node's record (NodeRecord); static: id = node rank; elastic: id =
//                       ticket, ephemeral (it is the node's liveness in that round)
//   joined              static: count of nodes in; the node that completes it publishes:
//   offset/<k>          static: node k's first global rank
//   world_size          static: the round's world size
//   pending             static: exists until the round closes or is aborted (waited on)
//   closed              static: the round closed; elastic: the closer's claim (COMPARE_SET)
//   aborted             static: why the round was aborted before it closed
//   join                elastic: ticket counter
//   returning           elastic: count of the previous round's nodes back in this one
//   quorum              elastic: at least MIN tickets taken
//   size                elastic: number of nodes the round closed with
//   place/<ticket>      elastic: that node's Place
//   members             elastic: tickets by node rank ("t,t,..."), for who needs every node
//   assignment          elastic: RoundTotals, published last: the round is formed
//   worker_store        etcd: "host:port" of the workers' store, hosted by node rank 0
//   verdict             elastic: the Verdict after the round ended; deciding: the decider's claim
// and, for a running round, in both modes:
//   healthy             deleted by the first node whose workers fail
//   failures/<k>        node k's failures, written before healthy is deleted
//   intact, lost        intact is deleted (after naming the node in lost) by the node that saw
//                       the next node in the ring vanish
//   no_newcomers        elastic: deleted by a node that waits to join (ends the round)
//   running, done       running is deleted by the node whose success completes done's count
//   heartbeat/<k>       wall-clock seconds, refreshed while node k's workers run (for status)
//   progress/<k>        node k's agent state and its running workers' progress (NodeProgress),
//                       written with heartbeat/<k>, in the same request
//   view                the job as node 0 read every node's progress (JobView): each rank's work
//                       per step and the ranks blocked in a collective; every node reads it
// A single node's agent writes the static keys a status reader needs (round, nodes, alive/0,
// node/0, offset/0, world_size, healthy, heartbeat/0, progress/0) in the store it hosts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dist/agent/job_status.h"
#include "dist/contract/worker_contract.h"
#include "dist/store/endpoint.h"
#include "rendezvous/rendezvous.h"

namespace dist::agent::schema {

// The agents' own keys in a TCPStore that workers share: everything else is the workers'.
inline constexpr std::string_view kAgentNamespace = "rdzv/";
std::string job_prefix(const std::string& run_id);  // "rdzv/<run id>/"

// Job-wide keys.
inline constexpr std::string_view kRoundPointer = "round";
inline constexpr std::string_view kJobOver = "over";  // static: the job failed (why)
// Static: the job finished though a node was lost at its exit barrier (which), for a relaunched
// node to learn it.
inline constexpr std::string_view kJobFinished = "finished";
// dist-launch --hosts was told to stop the job (the signal's number): set before it forwards the
// signal to each host, so that an agent that sees another host leave first stops as told too.
inline constexpr std::string_view kLauncherStop = "launcher_stop";
inline constexpr std::string_view kStaticNodes = "nodes";
inline constexpr std::string_view kInPlace = "in_place";
std::string static_alive(int node_rank);  // "alive/<k>"
inline constexpr std::string_view kStaticAlivePrefix = "alive/";

// Names within a round.
namespace name {
inline constexpr std::string_view kNode = "node", kJoined = "joined", kOffset = "offset",
                                  kWorldSize = "world_size", kClosed = "closed",
                                  kAborted = "aborted", kJoin = "join", kReturning = "returning",
                                  kQuorum = "quorum", kSize = "size", kPlace = "place",
                                  kMembers = "members", kAssignment = "assignment",
                                  kVerdict = "verdict", kWorkerStore = "worker_store",
                                  kDeciding = "deciding", kHealthy = "healthy",
                                  kFailures = "failures", kIntact = "intact", kLost = "lost",
                                  kNoNewcomers = "no_newcomers", kUndecided = "undecided",
                                  kRunning = "running", kDone = "done", kHeartbeat = "heartbeat",
                                  kProgress = "progress", kView = "view", kSettled = "settled",
                                  kLeft = "left", kAtBarrier = "at_barrier", kOutcome = "outcome",
                                  kReplaced = "replaced";
}  // namespace name

// A static round's `settled`: its closer or its abort writes it, and every node waits for it.
inline constexpr std::string_view kSettledClosed = "closed", kSettledAborted = "aborted";

// A node's `at_barrier` in a round: said before its count in `done` ("1"), then once counted
// ("counted"): a relaunched agent takes its place at the barrier only when the count is sure.
inline constexpr std::string_view kAtBarrierSaid = "1", kAtBarrierCounted = "counted";

std::string in_round(int round, std::string_view name);          // "r<n>/<name>"
std::string in_round(int round, std::string_view name, int id);  // "r<n>/<name>/<id>"

// A value that does not decode: names the key, shows the value (escaped, shortened), says what
// was expected.
class CorruptValueError : public RendezvousError {
 public:
  CorruptValueError(std::string_view key, std::string_view value, std::string_view expected);
};

// A node's record in a round.
struct NodeRecord {
  std::string host;
  int local_world_size = 0;
  int pid = 0;
  std::uint32_t nonce = 0;  // tells this agent's records from any other's, even on one host
  int previous_rank = -1;   // elastic: its node rank in the previous round, -1 for a newcomer
  // etcd: the store this node would host for workers (written "host:port", "" for none)
  std::optional<store::Endpoint> worker_store;
  bool keeps_workers = false;  // in-place: it joins while its workers run on (a regroup)
  bool hosts_store = false;    // its agent hosts the rendezvous store (c10d)
};
std::string encode(const NodeRecord& record);
NodeRecord decode_node_record(std::string_view key, std::string_view text);

// Elastic: one node's place in a closed round.
struct Place {
  int node_rank = 0;
  int rank_offset = 0;
  int successor = -1;  // the next node's ticket in the ring, -1 when alone
  bool operator==(const Place&) const = default;
};
std::string encode(const Place& place);
Place decode_place(std::string_view key, std::string_view text);

// Elastic: what every node of a closed round reads.
struct RoundTotals {
  int restarts = 0;
  int world_size = 0;
  int num_nodes = 0;
  int returning = 0;       // members that were in the previous round
  bool continues = false;  // its workers' store is the previous round's, whose workers run on
  bool operator==(const RoundTotals&) const = default;
};
std::string encode(const RoundTotals& totals);
RoundTotals decode_round_totals(std::string_view key, std::string_view text);

std::string encode(const Verdict& verdict);
Verdict decode_verdict(std::string_view key, std::string_view text);

std::string encode(const std::vector<WorkerFailure>& failures);
std::vector<WorkerFailure> decode_failures(std::string_view key, std::string_view text);

// A node's workers replaced in place (round/<r>/replaced/<k>): each one's failure, generation,
// new pid and survivors.
std::string encode(const std::vector<InPlaceReplacement>& replaced);
std::vector<InPlaceReplacement> decode_replacements(std::string_view key, std::string_view text);

// "host:port" (a host may be a name, an IPv4 or a bracketed IPv6 address); the empty string for
// none (an empty host).
std::optional<store::Endpoint> decode_endpoint(std::string_view key, std::string_view text);
std::string encode_endpoint(const std::optional<store::Endpoint>& endpoint);

// Counters and integers ("12"), and member lists ("3,1,2").
std::int64_t decode_int(std::string_view key, std::string_view text);
std::string encode_members(const std::vector<int>& ids);
std::vector<int> decode_members(std::string_view key, std::string_view text);

// --restart-policy in-place: every worker replaced alone so far, job-wide (they count against
// --max-restarts with the group restarts), and the recovery under way, if any (0 none, 1 a
// replacement, 2 a regroup), claimed by node `node_rank` in round `round`.
// "<replacements> <round> <0|1|2> <node rank>".
struct InPlaceState {
  int replacements = 0;
  int round = 0;
  Recovery recovery = Recovery::kNone;
  int node_rank = -1;
  bool operator==(const InPlaceState&) const = default;
};
std::string encode(const InPlaceState& state);
InPlaceState decode_in_place(std::string_view key, std::string_view text);

const char* action_name(Verdict::Action action);

// What a node publishes beside its heartbeat: its agent's lifecycle state, its running workers'
// progress and those blocked in a collective. Bounded: at most kMaxPublishedRanks workers (the rest
// are counted in `more`), names shortened to kMaxPublishedNameBytes, kMaxPublishedBlocked blocked
// ranks of kMaxPublishedGroups groups each, so that a value stays under about 48 KiB at its
// longest (about 100 bytes a worker in practice); compact keys ({"t","st","w":[{"r","l","s",...}],
// "b":[...]}), an absent field left out.
inline constexpr std::size_t kMaxPublishedRanks = 128;
inline constexpr std::size_t kMaxPublishedNameBytes = 40;
inline constexpr std::size_t kMaxPublishedDoingBytes = 64;  // what a rank is doing, in words
inline constexpr std::size_t kMaxPublishedBlocked = 8;      // blocked ranks a node publishes
inline constexpr std::size_t kMaxPublishedGroups = 16;      // and process groups of each
// A rank blocked in a collective, stably (the same one for several seconds, its processes idle):
// what another node needs of it to prove a hang across nodes (health/collective_proof.h). Or, op
// kSetup (worker_contract.h), in its group's set-up: no groups, group 0, and seq
// kSetupOfAReplacement when the rank replaces a failed worker (its agent started it again in its
// round), else 0.
inline constexpr std::uint64_t kSetupOfAReplacement = 1;
struct BlockedRank {
  int rank = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> groups;  // id, collectives issued
  std::map<std::uint64_t, std::uint32_t> sizes;                 // id -> ranks in it (0: unknown)
  // Its main thread is blocked, but another thread of its own may issue a collective
  // (kActivityThreads): no proof counts it as blocked.
  bool threads = false;
  std::uint64_t group = 0;  // the one it is blocked in (0: the SDK's one sequence)
  std::uint64_t seq = 0;
  std::uint32_t op = 0;
  double seconds = 0;  // blocked for

  bool in_setup() const {
    return op == static_cast<std::uint32_t>(worker_contract::heartbeat_slot::Collective::kSetup);
  }
};

struct NodeProgress {
  double time = 0;    // wall-clock seconds when it was taken
  std::string state;  // the agent's lifecycle state ("running")
  std::vector<RankStatus> ranks;
  std::size_t more = 0;              // workers left out (past kMaxPublishedRanks)
  std::vector<BlockedRank> blocked;  // its ranks blocked in a collective (at most the ranks)
  // The longest collective timeout its ranks said (a group's, or a collective's own argument):
  // past it and a margin, the hang detectors take an idle rank the job waits for as hung.
  std::uint64_t collective_timeout_ms = 0;
};
std::string encode(const NodeProgress& progress);
NodeProgress decode_node_progress(std::string_view key, std::string_view text);
// The same value's ages moved on to `now` (wall-clock seconds): what a reader shows.
void age_to(NodeProgress& progress, double now);

// The job as node 0 of a round sees it, every kJobViewInterval: each rank's work per step (the
// straggler measure, compared job-wide) and the ranks blocked in a collective (a hang proven
// across nodes). Bounded: at most kMaxViewRanks work entries (the lowest ranks; the median is of
// every rank measured) and kMaxViewBlocked blocked ranks.
inline constexpr std::size_t kMaxViewRanks = 1024;
inline constexpr std::size_t kMaxViewBlocked = 256;
struct JobView {
  double time = 0;                           // wall-clock seconds when node 0 made it
  std::vector<std::pair<int, double>> work;  // rank, work seconds per step; ascending by rank
  std::size_t measured = 0;                  // ranks with a work measure (work may list fewer)
  double median_work = 0;                    // of all of them
  // The median of the ranks' shares of time waited for a CPU (none unless most of the ranks with
  // a work measure publish one).
  std::optional<double> median_cpu_wait;
  std::vector<BlockedRank> blocked;
  std::uint64_t collective_timeout_ms = 0;  // the longest of the nodes' (NodeProgress)
};
JobView make_job_view(const std::vector<NodeProgress>& nodes, double now);
std::string encode(const JobView& view);
JobView decode_job_view(std::string_view key, std::string_view text);

// Node `node_rank`'s heartbeat in `round`: heartbeat/<k> (the wall-clock seconds, now) and, when
// there is a `progress` (encoded NodeProgress), progress/<k>: one MULTI_SET.
std::vector<std::pair<std::string, std::string>> heartbeat_items(
    int round, int node_rank, const std::function<std::string()>& progress);

// One worker's progress as `dist-launch status --json` and the status page name it (absent: null).
nlohmann::ordered_json to_json(const RankStatus& rank);

}  // namespace dist::agent::schema
