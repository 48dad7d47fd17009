#include "node_rendezvous.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <random>
#include <thread>

namespace dist::agent {
namespace {

using nlohmann::json;
using std::chrono::milliseconds;

constexpr milliseconds kPollInterval{50};
constexpr milliseconds kForever{std::chrono::hours(24 * 365)};

std::string list(const std::vector<int>& nodes) {
  std::string s = "[";
  for (std::size_t i = 0; i < nodes.size(); ++i) s += (i ? ", " : "") + std::to_string(nodes[i]);
  return s + "]";
}

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

NodeRendezvous::NodeRendezvous(rendezvous::ClientOptions store, std::string run_id, int num_nodes,
                               int node_rank)
    : options_(store),
      client_(rendezvous::StoreClient::connect(store)),
      prefix_("rdzv/" + run_id + "/"),
      nonce_(std::random_device{}()),
      num_nodes_(num_nodes),
      node_rank_(node_rank) {}

Assignment NodeRendezvous::join(int round, int local_world_size, const std::string& host,
                                milliseconds timeout) {
  // The agent's pid and a random nonce make every agent's record unique, so a second claim of the
  // same node rank is seen even from an identical node.
  const std::string record = json{
      {"local_world_size", local_world_size},
      {"host", host},
      {"pid", ::getpid()},
      {"nonce", nonce_}}.dump();
  const std::string mine = round_key(round, "node/" + std::to_string(node_rank_));
  const std::string stored = client_.compare_set(mine, "", record);
  if (stored != record) {
    const json other = json::parse(stored);
    throw RendezvousError("node rank " + std::to_string(node_rank_) + " joined twice (host " +
                          other.value("host", "?") + " pid " +
                          std::to_string(other.value("pid", 0)) + ", and this agent on " + host +
                          "): give every node its own --node-rank");
  }
  // Liveness, published only once this agent owns its node rank (an impostor must not touch it):
  // the key lives exactly as long as this agent's connection.
  client_.set(key("alive/" + std::to_string(node_rank_)), "1", /*ephemeral=*/true);
  client_.set(round_key(round, "healthy"), "1");
  client_.set(round_key(round, "stop/" + std::to_string(node_rank_)), "1");

  // O(N) in all: the node whose join completes the count reads every record once and publishes
  // each node's rank offset; every other node waits for one key and reads only its own offset.
  Assignment a;
  a.round = round;
  a.num_nodes = num_nodes_;
  if (client_.add(round_key(round, "joined"), 1) == num_nodes_) {
    std::vector<std::string> keys;
    for (int n = 0; n < num_nodes_; ++n) {
      keys.push_back(round_key(round, "node/" + std::to_string(n)));
    }
    const auto records = client_.multi_get(keys);
    std::vector<std::pair<std::string, std::string>> offsets;
    int offset = 0;
    for (int n = 0; n < num_nodes_; ++n) {
      offsets.emplace_back(round_key(round, "offset/" + std::to_string(n)), std::to_string(offset));
      offset += json::parse(records[static_cast<std::size_t>(n)]).at("local_world_size").get<int>();
    }
    offsets.emplace_back(round_key(round, "world_size"), std::to_string(offset));
    client_.multi_set(offsets);
    client_.set(round_key(round, "closed"), "1");
  }
  try {
    client_.wait({round_key(round, "closed")}, timeout);
  } catch (const rendezvous::StoreError& e) {
    if (e.code() != rendezvous::StoreErrc::kTimeout) throw;
    std::vector<int> seen, missing;
    for (int n = 0; n < num_nodes_; ++n) {
      (client_.check({round_key(round, "node/" + std::to_string(n))}) ? seen : missing)
          .push_back(n);
    }
    throw RendezvousError("rendezvous round " + std::to_string(round) + " did not fill in " +
                          std::to_string(timeout.count() / 1000) + " s: nodes seen " + list(seen) +
                          ", missing " + list(missing) +
                          "; start their agents with the same --master-addr/--master-port, or "
                          "raise --rdzv-conf timeout");
  }
  const auto placement = client_.multi_get(
      {round_key(round, "offset/" + std::to_string(node_rank_)), round_key(round, "world_size")});
  a.rank_offset = std::stoi(placement[0]);
  a.world_size = std::stoi(placement[1]);
  return a;
}

void NodeRendezvous::announce_failure(int round, const std::vector<WorkerFailure>& failures) {
  json list = json::array();
  for (const auto& f : failures) list.push_back(to_json(f));
  client_.set(round_key(round, "failures/" + std::to_string(node_rank_)), list.dump());
  client_.delete_key(round_key(round, "healthy"));
}

std::vector<WorkerFailure> NodeRendezvous::failures(int round) {
  std::vector<WorkerFailure> all;
  for (int n = 0; n < num_nodes_; ++n) {
    if (auto v = client_.try_get(round_key(round, "failures/" + std::to_string(n)))) {
      for (const auto& j : json::parse(*v)) all.push_back(from_json(j));
    }
  }
  return all;
}

std::vector<std::string> NodeRendezvous::alive_keys_of_others() const {
  std::vector<std::string> keys;
  for (int n = 0; n < num_nodes_; ++n) {
    if (n != node_rank_) keys.push_back(key("alive/" + std::to_string(n)));
  }
  return keys;
}

WatchResult NodeRendezvous::watch(int round) {
  auto watcher = rendezvous::StoreClient::connect(options_);
  std::vector<std::string> keys{round_key(round, "healthy"),
                                round_key(round, "stop/" + std::to_string(node_rank_))};
  const auto others = alive_keys_of_others();
  keys.insert(keys.end(), others.begin(), others.end());
  const std::size_t gone = watcher.wait_deleted(keys, kForever);
  if (gone == 0) return {WatchResult::kFailed, -1};
  if (gone == 1) return {WatchResult::kStopped, -1};
  const int lost = static_cast<int>(gone - 2);
  return {WatchResult::kNodeLost, lost < node_rank_ ? lost : lost + 1};
}

void NodeRendezvous::stop_watch(int round) {
  client_.delete_key(round_key(round, "stop/" + std::to_string(node_rank_)));
}

bool NodeRendezvous::exit_barrier(int round, milliseconds timeout) {
  client_.add(round_key(round, "done"), 1);
  std::vector<std::string> trouble{round_key(round, "healthy")};
  const auto others = alive_keys_of_others();
  trouble.insert(trouble.end(), others.begin(), others.end());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto everyone_done = [&] { return client_.add(round_key(round, "done"), 0) >= num_nodes_; };
  while (true) {
    if (everyone_done()) return true;
    try {
      client_.wait_deleted(trouble, kPollInterval);
      // A node that passed the barrier may leave at once: only a count short of everyone, seen
      // after the trouble, means a failure or a lost node.
      return everyone_done();
    } catch (const rendezvous::StoreError& e) {
      if (e.code() != rendezvous::StoreErrc::kTimeout) throw;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw RendezvousError("exit barrier of round " + std::to_string(round) + ": not every node " +
                            "finished within " + std::to_string(timeout.count() / 1000) + " s");
    }
  }
}

void NodeRendezvous::wait_for_others_to_leave(milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const auto others = alive_keys_of_others();
  while (std::chrono::steady_clock::now() < deadline) {
    bool anyone = false;
    for (const auto& k : others) anyone = anyone || client_.try_get(k).has_value();
    if (!anyone) return;
    std::this_thread::sleep_for(kPollInterval);
  }
}

}  // namespace dist::agent
