#include "dist/agent/job_status.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "output/valid_text.h"
#include "rendezvous/rendezvous_impl.h"
#include "rendezvous/schema.h"

namespace dist::agent {

namespace name = schema::name;

namespace {

long long now_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double now_precise() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// An optional integer key (a counter, a heartbeat).
Task<std::optional<std::int64_t>> read_int(RendezvousStore& store, std::string key) {
  const auto value = co_await store.try_get(key);
  if (!value) co_return std::nullopt;
  co_return schema::decode_int(key, *value);
}

void fill_record(NodeStatus& node, const std::string& key, const std::optional<std::string>& v) {
  if (!v) return;
  const auto record = schema::decode_node_record(key, *v);
  node.host = record.host;
  node.pid = record.pid;
  node.workers = record.local_world_size;
}

// How a round stands, from its keys.
Task<std::string> round_state(RendezvousStore& store, int round, std::size_t nodes) {
  const std::string verdict_key = schema::in_round(round, name::kVerdict);
  if (const auto verdict = co_await store.try_get(verdict_key)) {
    co_return "ended (" + schema::decode_verdict(verdict_key, *verdict).reason + ")";
  }
  if (!co_await store.check(keys(schema::in_round(round, name::kHealthy)))) co_return "FAILED";
  const auto done = co_await read_int(store, schema::in_round(round, name::kDone));
  if (done && *done >= static_cast<std::int64_t>(nodes)) co_return "done";
  co_return "running";
}

Task<std::vector<std::optional<long long>>> heartbeats(RendezvousStore& store, int round,
                                                       int nodes) {
  std::vector<std::string> names;
  for (int n = 0; n < nodes; ++n) names.push_back(schema::in_round(round, name::kHeartbeat, n));
  const auto values = co_await store.multi_get(names);
  std::vector<std::optional<long long>> ages;
  const long long now = now_seconds();
  for (std::size_t n = 0; n < values.size(); ++n) {
    if (values[n]) {
      ages.emplace_back(now - schema::decode_int(names[n], *values[n]));
    } else {
      ages.emplace_back(std::nullopt);
    }
  }
  co_return ages;
}

// Each node's published progress (its agent's state, its workers), aged to now.
Task<void> read_progress(RendezvousStore& store, int round, std::vector<NodeStatus>& nodes) {
  std::vector<std::string> names;
  for (std::size_t n = 0; n < nodes.size(); ++n) {
    names.push_back(schema::in_round(round, name::kProgress, nodes[n].node_rank));
  }
  const auto values = co_await store.multi_get(names);
  const double now = now_precise();
  for (std::size_t n = 0; n < values.size(); ++n) {
    if (!values[n]) continue;
    auto progress = schema::decode_node_progress(names[n], *values[n]);
    schema::age_to(progress, now);
    nodes[n].agent_state = progress.state;
    nodes[n].ranks = std::move(progress.ranks);
    std::sort(
        nodes[n].ranks.begin(), nodes[n].ranks.end(),
        [](const RankStatus& a, const RankStatus& b) { return a.worker.rank < b.worker.rank; });
  }
}

Task<JobStatus> static_status(RendezvousStore& store, int round) {
  JobStatus s;
  s.round = round;
  s.restarts = round;
  const int nodes =
      static_cast<int>((co_await read_int(store, std::string(schema::kStaticNodes))).value_or(0));
  std::vector<std::string> records, alive, offsets;
  for (int n = 0; n < nodes; ++n) {
    records.push_back(schema::in_round(round, name::kNode, n));
    alive.push_back(schema::static_alive(n));
    offsets.push_back(schema::in_round(round, name::kOffset, n));
  }
  const auto record_values = co_await store.multi_get(records);
  const auto alive_values = co_await store.multi_get(alive);
  const auto offset_values = co_await store.multi_get(offsets);
  const auto ages = co_await heartbeats(store, round, nodes);
  for (int n = 0; n < nodes; ++n) {
    const auto i = static_cast<std::size_t>(n);
    NodeStatus node;
    node.node_rank = n;
    fill_record(node, records[i], record_values[i]);
    node.alive = alive_values[i].has_value();
    if (offset_values[i]) {
      node.first_rank = static_cast<int>(schema::decode_int(offsets[i], *offset_values[i]));
    }
    node.heartbeat_age_seconds = ages[i];
    s.nodes.push_back(std::move(node));
  }
  co_await read_progress(store, round, s.nodes);
  s.state = co_await round_state(store, round, s.nodes.size());
  // (A node lost at its exit barrier leaves the round's count short of a job that finished.)
  // (Two GETs, not one MULTI_GET of both: that coroutine made GCC 12's sanitized unity build
  // crash.)
  if (co_await store.try_get(std::string(schema::kJobFinished))) s.state = "done";
  if (co_await store.try_get(std::string(schema::kJobOver))) s.state = "FAILED";
  co_return s;
}

// Elastic: the latest round that closed (the pointer names the one after it, maybe forming).
Task<JobStatus> elastic_status(RendezvousStore& store, int pointer) {
  JobStatus s;
  s.elastic = true;
  s.next_round_joined = static_cast<int>(
      (co_await read_int(store, schema::in_round(pointer, name::kJoin))).value_or(0));
  s.round = pointer - 1;
  const std::string totals_key = schema::in_round(s.round, name::kAssignment);
  const auto totals_text = co_await store.try_get(totals_key);
  if (s.round < 0 || !totals_text) {
    s.round = pointer;
    s.state = "forming";
    co_return s;
  }
  const auto totals = schema::decode_round_totals(totals_key, *totals_text);
  s.restarts = totals.restarts;
  const std::string members_key = schema::in_round(s.round, name::kMembers);
  const auto list = co_await store.try_get(members_key);
  const auto tickets = list ? schema::decode_members(members_key, *list) : std::vector<int>{};
  std::vector<std::string> places, records;
  for (const int t : tickets) {
    places.push_back(schema::in_round(s.round, name::kPlace, t));
    records.push_back(schema::in_round(s.round, name::kNode, t));
  }
  const auto place_values = co_await store.multi_get(places);
  const auto record_values = co_await store.multi_get(records);  // ephemeral: gone with the agent
  const auto ages = co_await heartbeats(store, s.round, static_cast<int>(tickets.size()));
  for (std::size_t i = 0; i < tickets.size(); ++i) {
    NodeStatus node;
    node.node_rank = static_cast<int>(i);
    if (place_values[i]) {
      const auto place = schema::decode_place(places[i], *place_values[i]);
      node.node_rank = place.node_rank;
      node.first_rank = place.rank_offset;
    }
    fill_record(node, records[i], record_values[i]);
    node.alive = record_values[i].has_value();
    node.heartbeat_age_seconds = ages[i];
    s.nodes.push_back(std::move(node));
  }
  co_await read_progress(store, s.round, s.nodes);
  s.state = co_await round_state(store, s.round, s.nodes.size());
  co_return s;
}

Task<std::optional<JobStatus>> read_status(RendezvousStore& store, std::string run_id) {
  const auto pointer = co_await read_int(store, std::string(schema::kRoundPointer));
  if (!pointer) co_return std::nullopt;
  // Static jobs keep their node count; elastic ones take tickets.
  const bool elastic = !co_await store.check(keys(std::string(schema::kStaticNodes)));
  JobStatus s;
  if (elastic) {
    s = co_await elastic_status(store, static_cast<int>(*pointer));
  } else {
    s = co_await static_status(store, static_cast<int>(*pointer));
  }
  s.run_id = std::move(run_id);
  s.endpoint = store.describe();
  co_return s;
}

}  // namespace

std::optional<JobStatus> read_job_status(const store::ClientOptions& options,
                                         const std::string& run_id) {
  boost::asio::io_context io;
  std::optional<JobStatus> status;
  std::exception_ptr failure;
  boost::asio::co_spawn(
      io,
      [&]() -> Task<void> {
        auto store = make_rendezvous_store(io, TcpStoreTarget{options}, run_id);
        co_await store->open();
        status = co_await read_status(*store, run_id);
      },
      [&](std::exception_ptr e) { failure = e; });
  io.run();
  if (failure) std::rethrow_exception(failure);
  return status;
}

std::optional<double> RankStatus::progress_age_seconds() const {
  return since_step_seconds ? since_step_seconds : since_beat_seconds;
}

bool RankStatus::hung() const {
  return suspect;
}

std::string format_seconds(std::optional<double> seconds) {
  if (!seconds || !std::isfinite(*seconds)) return "-";
  const double v = std::max(0.0, *seconds);
  char text[32];
  if (v < 10) {
    std::snprintf(text, sizeof text, "%.2f s", v);
  } else if (v < 100) {
    std::snprintf(text, sizeof text, "%.1f s", v);
  } else if (v < 3600) {
    const auto whole = static_cast<long long>(v);
    std::snprintf(text, sizeof text, "%lldm%02llds", whole / 60, whole % 60);
  } else {
    const auto minutes = static_cast<long long>(v / 60);
    std::snprintf(text, sizeof text, "%lldh%02lldm", minutes / 60, minutes % 60);
  }
  return text;
}

std::string rank_marks(const RankStatus& r) {
  std::string marks;
  const auto add = [&](const std::string& m) { marks += (marks.empty() ? "" : " ") + m; };
  if (r.hung()) add("HUNG?" + (r.doing.empty() ? "" : " (" + r.doing + ")"));
  if (r.paused) add("PAUSED" + (r.doing.empty() ? "" : " (" + r.doing + ")"));
  if (r.straggler) add("STRAGGLER");
  if (!r.pending_collective.empty()) add("waits in " + r.pending_collective);
  return marks;
}

namespace {

std::string node_line(const NodeStatus& n) {
  std::string ranks = "-";
  if (n.first_rank >= 0 && n.workers > 0) {
    ranks = std::to_string(n.first_rank) + ".." + std::to_string(n.first_rank + n.workers - 1);
  }
  const std::string beat =
      n.heartbeat_age_seconds ? std::to_string(*n.heartbeat_age_seconds) + " s ago" : "-";
  char line[512];
  std::snprintf(line, sizeof line, "%-5d %-12s %-8d %-6s %-10s %-12s %s (%d)\n", n.node_rank,
                ranks.c_str(), n.workers, n.alive ? "yes" : "NO", beat.c_str(),
                n.agent_state.empty() ? "-" : n.agent_state.c_str(),
                n.host.empty() ? "?" : n.host.c_str(), n.pid);
  return line;
}

std::string rank_line(const NodeStatus& n, const RankStatus& r) {
  char rate[32] = "-";
  if (r.steps_per_second) std::snprintf(rate, sizeof rate, "%.2f", *r.steps_per_second);
  const std::string steps = r.steps ? std::to_string(*r.steps) : "-";
  const std::string age =
      r.progress_age_seconds() ? format_seconds(r.progress_age_seconds()) + " ago" : "-";
  char line[512];
  std::snprintf(line, sizeof line, "%-5d %-5d %-6d %-10s %-8s %-10s %-14s %-8llu %s", r.worker.rank,
                n.node_rank, r.worker.local_rank, steps.c_str(), rate,
                format_seconds(r.step_seconds).c_str(), age.c_str(),
                static_cast<unsigned long long>(r.beats), rank_marks(r).c_str());
  std::string text = line;
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text + "\n";
}

}  // namespace

std::string format_table(const JobStatus& s) {
  std::string out = "job " + s.run_id + " at " + s.endpoint +
                    (s.elastic ? " (elastic)" : " (static)") + ": round " +
                    std::to_string(s.round) + ", restarts so far " + std::to_string(s.restarts) +
                    ", " + std::to_string(s.nodes.size()) + " node(s), " + s.state + "\n";
  if (s.next_round_joined > 0) {
    out += "next round forming: " + std::to_string(s.next_round_joined) + " node(s) joined\n";
  }
  if (s.nodes.empty()) return out;
  out += "node  ranks        workers  alive  heartbeat  agent        host (pid)\n";
  std::size_t ranks = 0, hung = 0, stragglers = 0;
  for (const auto& n : s.nodes) {
    out += node_line(n);
    for (const auto& r : n.ranks) {
      ++ranks;
      hung += r.hung() ? 1 : 0;
      stragglers += r.straggler ? 1 : 0;
    }
  }
  if (ranks == 0) return out;
  out += "\nrank  node  local  steps      steps/s  step time  last progress  beats    marks\n";
  for (const auto& n : s.nodes) {
    for (const auto& r : n.ranks) out += rank_line(n, r);
  }
  out += std::to_string(ranks) + " running worker(s), " + std::to_string(stragglers) +
         " straggler(s), " + std::to_string(hung) + " suspected of a hang\n";
  return out;
}

std::string to_json(const JobStatus& s) {
  nlohmann::ordered_json nodes = nlohmann::ordered_json::array();
  for (const auto& n : s.nodes) {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (const auto& r : n.ranks) ranks.push_back(schema::to_json(r));
    nodes.push_back({{"node_rank", n.node_rank},
                     {"first_rank", n.first_rank},
                     {"workers", n.workers},
                     {"alive", n.alive},
                     {"heartbeat_age_seconds",
                      n.heartbeat_age_seconds ? nlohmann::ordered_json(*n.heartbeat_age_seconds)
                                              : nlohmann::ordered_json(nullptr)},
                     {"host", n.host},
                     {"pid", n.pid},
                     {"agent_state", n.agent_state.empty() ? nlohmann::ordered_json(nullptr)
                                                           : nlohmann::ordered_json(n.agent_state)},
                     {"ranks", std::move(ranks)}});
  }
  return json_text(nlohmann::ordered_json{{"run_id", s.run_id},
                                          {"endpoint", s.endpoint},
                                          {"mode", s.elastic ? "elastic" : "static"},
                                          {"round", s.round},
                                          {"restarts", s.restarts},
                                          {"state", s.state},
                                          {"next_round_joined", s.next_round_joined},
                                          {"nodes", nodes}});
}

}  // namespace dist::agent
