#include "dist/launcher/status.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <sstream>

#include "dist/launcher/cli.h"
#include "dist/rendezvous/client.h"

namespace dist::launcher {
namespace {

using nlohmann::json;

// One node of a round, as the store knows it.
struct NodeRow {
  int node_rank = 0;
  int first_rank = -1;  // -1: not placed
  json record;          // host, pid, local_world_size
  bool alive = false;   // the agent's liveness key exists
  std::optional<long long> heartbeat;
};

long long now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The highest round number with any key under `prefix` (rdzv/<id>/), or -1.
int latest_round(rendezvous::StoreClient& store, const std::string& prefix) {
  int round = -1;
  for (const auto& key : store.list_keys()) {
    if (key.rfind(prefix + "r", 0) != 0) continue;
    const auto slash = key.find('/', prefix.size());
    try {
      round = std::max(round, std::stoi(key.substr(prefix.size() + 1, slash - prefix.size() - 1)));
    } catch (const std::exception&) {
    }
  }
  return round;
}

std::optional<long long> heartbeat(rendezvous::StoreClient& store, const std::string& r, int node) {
  const auto v = store.try_get(r + "heartbeat/" + std::to_string(node));
  if (!v) return std::nullopt;
  return std::stoll(*v);
}

// Static round r: node/<k> records with offset/<k>; liveness in alive/<k>.
std::vector<NodeRow> static_nodes(rendezvous::StoreClient& store, const std::string& prefix,
                                  const std::string& r) {
  std::vector<NodeRow> rows;
  for (const auto& key : store.list_keys()) {
    if (key.rfind(r + "node/", 0) != 0) continue;
    NodeRow row;
    row.node_rank = std::stoi(key.substr(r.size() + 5));
    row.record = json::parse(*store.try_get(key));
    row.alive = store.check({prefix + "alive/" + std::to_string(row.node_rank)});
    if (const auto offset = store.try_get(r + "offset/" + std::to_string(row.node_rank))) {
      row.first_rank = std::stoi(*offset);
    }
    row.heartbeat = heartbeat(store, r, row.node_rank);
    rows.push_back(std::move(row));
  }
  std::sort(rows.begin(), rows.end(),
            [](const NodeRow& a, const NodeRow& b) { return a.node_rank < b.node_rank; });
  return rows;
}

// Elastic round r: "<restarts> <world size> <nodes>" in assignment, the tickets by node rank in
// members; per ticket an ephemeral record and "<node rank> <offset> <next>" in place/<ticket>.
std::vector<NodeRow> elastic_nodes(rendezvous::StoreClient& store, const std::string& r,
                                   const std::string& assignment, int& restarts) {
  std::istringstream(assignment) >> restarts;
  std::vector<NodeRow> rows;
  std::istringstream list(store.get(r + "members"));
  for (std::string t; std::getline(list, t, ',');) {
    NodeRow row;
    if (const auto place = store.try_get(r + "place/" + t)) {
      std::istringstream(*place) >> row.node_rank >> row.first_rank;
    }
    if (const auto record = store.try_get(r + "node/" + t)) {  // ephemeral: gone with its agent
      row.record = json::parse(*record);
      row.alive = true;
    }
    row.heartbeat = heartbeat(store, r, row.node_rank);
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace

int run_status(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{"dist-launch status: the nodes of a job, read from its rendezvous store",
               "dist-launch status"};
  std::string endpoint, run_id = "none";
  int timeout_s = 10;
  app.add_option("--rdzv-endpoint,--rdzv_endpoint,--master-addr-port", endpoint,
                 "HOST:PORT of the job's store (static: node 0's --master-addr:--master-port)")
      ->required();
  app.add_option("--rdzv-id,--rdzv_id", run_id, "The job's id")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Seconds to wait for the store")->capture_default_str();
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return kExitUsage;
  }
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos) {
    err << "dist-launch status: error: --rdzv-endpoint must be HOST:PORT, got '" << endpoint
        << "'\n";
    return kExitUsage;
  }
  try {
    rendezvous::ClientOptions options;
    options.host = endpoint.substr(0, colon);
    options.port = static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1)));
    options.connect_timeout = std::chrono::seconds(timeout_s);
    options.timeout = std::chrono::seconds(timeout_s);
    auto store = rendezvous::StoreClient::connect(options);

    const std::string prefix = "rdzv/" + run_id + "/";
    int round = latest_round(store, prefix);
    if (round < 0) {
      err << "dist-launch status: no job '" << run_id << "' in the store at " << endpoint
          << " (check --rdzv-id)\n";
      return 1;
    }
    // Elastic: the latest round that closed (a later one may be forming).
    std::string r = prefix + "r" + std::to_string(round) + "/";
    const bool elastic = store.check({r + "join"});
    int forming = 0;
    std::optional<std::string> assignment;
    if (elastic) {
      while (round >= 0 &&
             !(assignment = store.try_get(prefix + "r" + std::to_string(round) + "/assignment"))) {
        forming = static_cast<int>(store.add(prefix + "r" + std::to_string(round) + "/join", 0));
        --round;
      }
      if (!assignment) {
        out << "job " << run_id << " at " << endpoint << ": elastic, first round forming, "
            << forming << " node(s) joined\n";
        return 0;
      }
      r = prefix + "r" + std::to_string(round) + "/";
    }
    int restarts = round;
    const auto nodes =
        elastic ? elastic_nodes(store, r, *assignment, restarts) : static_nodes(store, prefix, r);
    const bool healthy = store.check({r + "healthy"});
    const auto done = store.try_get(r + "done");
    const auto verdict = store.try_get(r + "verdict");
    std::string state = "running";
    if (done && std::stoul(*done) >= nodes.size()) state = "done";
    if (!healthy) state = "FAILED";
    if (verdict) state = "ended (" + json::parse(*verdict).value("reason", "") + ")";
    out << "job " << run_id << " at " << endpoint << (elastic ? " (elastic)" : " (static)")
        << ": round " << round << ", restarts so far " << restarts << ", " << nodes.size()
        << " node(s), " << state << "\n";
    if (forming > 0) out << "next round forming: " << forming << " node(s) joined\n";
    out << "node  ranks        workers  alive  heartbeat  host (pid)\n";
    const long long now = now_seconds();
    for (const auto& n : nodes) {
      const int workers = n.record.is_object() ? n.record.value("local_world_size", 0) : 0;
      std::string ranks = "-";
      if (n.first_rank >= 0 && workers > 0) {
        ranks = std::to_string(n.first_rank) + ".." + std::to_string(n.first_rank + workers - 1);
      }
      const std::string beat = n.heartbeat ? std::to_string(now - *n.heartbeat) + " s ago" : "-";
      char line[256];
      std::snprintf(line, sizeof line, "%-5d %-12s %-8d %-6s %-10s %s (%d)\n", n.node_rank,
                    ranks.c_str(), workers, n.alive ? "yes" : "NO", beat.c_str(),
                    n.record.is_object() ? n.record.value("host", "?").c_str() : "?",
                    n.record.is_object() ? n.record.value("pid", 0) : 0);
      out << line;
    }
    return 0;
  } catch (const std::exception& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace dist::launcher
