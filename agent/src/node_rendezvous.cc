#include "node_rendezvous.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cstdlib>
#include <random>

#include "rendezvous_detail.h"

namespace dist::agent {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

using detail::node_list;

constexpr milliseconds kPollInterval{50};

json to_json(const WorkerFailure& f) {
  return {{"time", std::chrono::duration<double>(f.time.time_since_epoch()).count()},
          {"host", f.host},
          {"rank", f.rank},
          {"local_rank", f.local_rank},
          {"exit_code", f.exit_code},
          {"pid", f.pid},
          {"error_file", f.error_file},
          {"message", f.message},
          {"traceback", f.traceback}};
}

WorkerFailure from_json(const json& j) {
  WorkerFailure f;
  f.time =
      std::chrono::system_clock::time_point(std::chrono::round<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(j.at("time").get<double>())));
  f.host = j.value("host", "");
  f.rank = j.value("rank", 0);
  f.local_rank = j.value("local_rank", 0);
  f.exit_code = j.value("exit_code", 0);
  f.pid = j.value("pid", -1);
  f.error_file = j.value("error_file", "");
  f.message = j.value("message", "");
  f.traceback = j.value("traceback", "");
  return f;
}

}  // namespace

NodeRendezvous::NodeRendezvous(rendezvous::ClientOptions store, std::string run_id, JobShape shape)
    : options_(store),
      client_(rendezvous::StoreClient::connect(store)),
      prefix_("rdzv/" + run_id + "/"),
      nonce_(std::random_device{}()),
      shape_(std::move(shape)) {}

Assignment NodeRendezvous::join_static(int round, int node_rank, milliseconds timeout) {
  const int num_nodes = shape_.max_nodes;
  const std::string& host = shape_.host;
  // The agent's pid and a random nonce make every agent's record unique, so a second claim of the
  // same node rank is seen even from an identical node.
  const std::string record = json{
      {"local_world_size", shape_.local_world_size},
      {"host", host},
      {"pid", ::getpid()},
      {"nonce", nonce_}}.dump();
  const std::string mine = round_key(round, "node/" + std::to_string(node_rank));
  const std::string stored = client_.compare_set(mine, "", record);
  if (stored != record) {
    const json other = json::parse(stored);
    throw RendezvousError("node rank " + std::to_string(node_rank) + " joined twice (host " +
                          other.value("host", "?") + " pid " +
                          std::to_string(other.value("pid", 0)) + ", and this agent on " + host +
                          "): give every node its own --node-rank");
  }
  // Liveness, published only once this agent owns its node rank (an impostor must not touch it):
  // the key lives exactly as long as this agent's connection.
  client_.set(key("alive/" + std::to_string(node_rank)), "1", /*ephemeral=*/true);
  client_.set(round_key(round, "healthy"), "1");
  client_.set(round_key(round, "stop/" + std::to_string(node_rank)), "1");

  // O(N) in all: the node whose join completes the count reads every record once and publishes
  // each node's rank offset; every other node waits for one key and reads only its own offset.
  Assignment a;
  a.round = round;
  a.restarts = round;
  a.node_rank = node_rank;
  a.num_nodes = num_nodes;
  a.alive_prefix = key("alive/");
  if (num_nodes > 1) a.successor_id = (node_rank + 1) % num_nodes;
  if (client_.add(round_key(round, "joined"), 1) == num_nodes) {
    std::vector<std::string> keys;
    for (int n = 0; n < num_nodes; ++n) {
      keys.push_back(round_key(round, "node/" + std::to_string(n)));
    }
    const auto records = client_.multi_get(keys);
    std::vector<std::pair<std::string, std::string>> offsets;
    int offset = 0;
    for (int n = 0; n < num_nodes; ++n) {
      offsets.emplace_back(round_key(round, "offset/" + std::to_string(n)), std::to_string(offset));
      offset += json::parse(records[static_cast<std::size_t>(n)]).at("local_world_size").get<int>();
    }
    offsets.emplace_back(round_key(round, "world_size"), std::to_string(offset));
    offsets.emplace_back(round_key(round, "intact"), "1");
    client_.multi_set(offsets);
    client_.set(round_key(round, "closed"), "1");
  }
  try {
    client_.wait({round_key(round, "closed")}, timeout);
  } catch (const rendezvous::StoreError& e) {
    if (e.code() != rendezvous::StoreErrc::kTimeout) throw;
    std::vector<int> seen, missing;
    for (int n = 0; n < num_nodes; ++n) {
      (client_.check({round_key(round, "node/" + std::to_string(n))}) ? seen : missing)
          .push_back(n);
    }
    throw RendezvousError("rendezvous round " + std::to_string(round) + " did not fill in " +
                          std::to_string(timeout.count() / 1000) + " s: nodes seen " +
                          node_list(seen) + ", missing " + node_list(missing) +
                          "; start their agents with the same --master-addr/--master-port, or "
                          "raise --rdzv-conf timeout");
  }
  const auto placement = client_.multi_get(
      {round_key(round, "offset/" + std::to_string(node_rank)), round_key(round, "world_size")});
  a.rank_offset = std::stoi(placement[0]);
  a.world_size = std::stoi(placement[1]);
  return a;
}

void NodeRendezvous::announce_failure(const Assignment& a,
                                      const std::vector<WorkerFailure>& failures) {
  json list = json::array();
  for (const auto& f : failures) list.push_back(to_json(f));
  client_.set(round_key(a.round, "failures/" + std::to_string(a.node_rank)), list.dump());
  client_.delete_key(round_key(a.round, "healthy"));
}

std::vector<WorkerFailure> NodeRendezvous::failures(const Assignment& a) {
  std::vector<WorkerFailure> all;
  for (int n = 0; n < a.num_nodes; ++n) {
    if (auto v = client_.try_get(round_key(a.round, "failures/" + std::to_string(n)))) {
      for (const auto& j : json::parse(*v)) all.push_back(from_json(j));
    }
  }
  return all;
}

std::vector<std::string> NodeRendezvous::liveness_keys(const Assignment& a) {
  std::vector<std::string> keys;
  if (a.members_key.empty()) {
    for (int n = 0; n < a.num_nodes; ++n) keys.push_back(a.alive_prefix + std::to_string(n));
    return keys;
  }
  const std::string members = client_.get(a.members_key);
  for (const char* p = members.c_str(); *p;) {  // "<id>,<id>,...", no streams: N may be large
    char* end = nullptr;
    keys.push_back(a.alive_prefix + std::to_string(std::strtol(p, &end, 10)));
    p = *end == ',' ? end + 1 : end;
  }
  return keys;
}

std::vector<int> NodeRendezvous::lost_nodes(const Assignment& a) {
  std::vector<int> lost;
  const std::vector<std::string> keys = liveness_keys(a);
  if (client_.check(keys)) return lost;  // one request in the usual case
  for (int n = 0; n < static_cast<int>(keys.size()); ++n) {
    if (!client_.check({keys[static_cast<std::size_t>(n)]})) lost.push_back(n);
  }
  return lost;
}

// Liveness in a ring: each node watches only the next node's liveness key and, when that one
// vanishes, tells everyone by deleting `intact` (after naming the node in `lost`). Every watch is
// O(1) keys, so N nodes cost the store O(N), and a loss still reaches everyone in one more hop.
std::optional<std::string> NodeRendezvous::successor_key(const Assignment& a) const {
  if (a.successor_id < 0) return std::nullopt;
  return a.alive_prefix + std::to_string(a.successor_id);
}

void NodeRendezvous::report_lost_successor(const Assignment& a, rendezvous::StoreClient& via) {
  const int successor = (a.node_rank + 1) % a.num_nodes;
  via.set(round_key(a.round, "lost"), std::to_string(successor));
  via.delete_key(round_key(a.round, "intact"));
}

WatchResult NodeRendezvous::watch(const Assignment& a, std::chrono::seconds heartbeat) {
  auto watcher = rendezvous::StoreClient::connect(options_);
  // Each key, and what its deletion means.
  enum Event { kFailed, kStopped, kLossNoticed, kNewcomer, kSuccessorGone };
  std::vector<std::string> keys{round_key(a.round, "healthy"),
                                round_key(a.round, "stop/" + std::to_string(a.node_rank)),
                                round_key(a.round, "intact")};
  std::vector<Event> events{kFailed, kStopped, kLossNoticed};
  if (a.elastic) {
    keys.push_back(round_key(a.round, "no_newcomers"));
    events.push_back(kNewcomer);
  }
  if (const auto next = successor_key(a)) {
    keys.push_back(*next);
    events.push_back(kSuccessorGone);
  }
  // Between events, a heartbeat: the wall-clock time, for `dist-launch status`.
  const std::string beat = round_key(a.round, "heartbeat/" + std::to_string(a.node_rank));
  std::size_t gone = 0;
  while (true) {
    watcher.set(beat, std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                         std::chrono::system_clock::now().time_since_epoch())
                                         .count()));
    try {
      gone = watcher.wait_deleted(keys, heartbeat);
      break;
    } catch (const rendezvous::StoreError& e) {
      if (e.code() != rendezvous::StoreErrc::kTimeout) throw;
    }
  }
  switch (events[gone]) {
    case kFailed:
      return {WatchResult::kFailed, -1};
    case kStopped:
      return {WatchResult::kStopped, -1};
    case kLossNoticed: {
      const auto lost = watcher.try_get(round_key(a.round, "lost"));
      return {WatchResult::kNodeLost, lost ? std::stoi(*lost) : -1};
    }
    case kNewcomer:
      return {WatchResult::kNewcomer, -1};
    case kSuccessorGone:
      break;
  }
  report_lost_successor(a, watcher);
  return {WatchResult::kNodeLost, (a.node_rank + 1) % a.num_nodes};
}

void NodeRendezvous::stop_watch(const Assignment& a) {
  client_.delete_key(round_key(a.round, "stop/" + std::to_string(a.node_rank)));
}

bool NodeRendezvous::exit_barrier(const Assignment& a, milliseconds timeout) {
  client_.add(round_key(a.round, "done"), 1);
  std::vector<std::string> trouble{round_key(a.round, "healthy"), round_key(a.round, "intact")};
  const auto next = successor_key(a);
  if (next) trouble.push_back(*next);
  // Elastic: a newcomer that got in before this node was done ends the round for everyone.
  if (a.elastic) trouble.push_back(round_key(a.round, "no_newcomers"));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto everyone_done = [&] { return client_.add(round_key(a.round, "done"), 0) >= a.num_nodes; };
  while (true) {
    if (everyone_done()) return true;
    try {
      const std::size_t gone = client_.wait_deleted(trouble, kPollInterval);
      // A node that passed the barrier may leave at once: only a count short of everyone, seen
      // after the trouble, means a failure or a lost node.
      if (everyone_done()) return true;
      if (next && gone == 2) report_lost_successor(a, client_);
      return false;
    } catch (const rendezvous::StoreError& e) {
      if (e.code() != rendezvous::StoreErrc::kTimeout) throw;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw RendezvousError("exit barrier of round " + std::to_string(a.round) +
                            ": not every node finished within " +
                            std::to_string(timeout.count() / 1000) + " s");
    }
  }
}

void NodeRendezvous::wait_for_others_to_leave(const Assignment& a, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> others = liveness_keys(a);
  others.erase(others.begin() + a.node_rank);
  for (const auto& k : others) {  // one wait per node still there, each until it leaves
    const auto left =
        std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left <= milliseconds(0)) return;
    try {
      client_.wait_deleted({k}, left);
    } catch (const rendezvous::StoreError& e) {
      if (e.code() != rendezvous::StoreErrc::kTimeout) throw;
      return;
    }
  }
}

}  // namespace dist::agent
