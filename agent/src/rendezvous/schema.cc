#include "rendezvous/schema.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "output/valid_text.h"

namespace dist::agent::schema {
namespace {

using nlohmann::json;

constexpr std::size_t kShownValueBytes = 80;

std::string shown(std::string_view value) {
  std::string s;
  for (std::size_t i = 0; i < value.size() && i < kShownValueBytes; ++i) {
    const auto c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      s += escaped;
    } else {
      s += static_cast<char>(c);
    }
  }
  if (value.size() > kShownValueBytes) s += "...";
  return s;
}

// Integers joined by `separator`, exactly `count` of them (0: any number).
std::vector<std::int64_t> integers(std::string_view key, std::string_view text, char separator,
                                   std::size_t count, std::string_view expected) {
  std::vector<std::int64_t> values;
  const char* p = text.data();
  const char* end = text.data() + text.size();
  while (p < end) {
    std::int64_t v = 0;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc()) throw CorruptValueError(key, text, expected);
    values.push_back(v);
    p = next;
    if (p == end) break;
    if (*p != separator || p + 1 == end) throw CorruptValueError(key, text, expected);
    ++p;
  }
  if (count != 0 && values.size() != count) throw CorruptValueError(key, text, expected);
  return values;
}

int as_int(std::string_view key, std::string_view text, std::int64_t v, std::string_view expected) {
  if (v < INT32_MIN || v > INT32_MAX) throw CorruptValueError(key, text, expected);
  return static_cast<int>(v);
}

json parse_json(std::string_view key, std::string_view text, std::string_view expected) {
  try {
    return json::parse(text);
  } catch (const json::exception&) {
    throw CorruptValueError(key, text, expected);
  }
}

// A JSON field of the expected type, or the error naming the key.
template <typename T>
T field(const json& j, const char* name, std::string_view key, std::string_view text,
        std::string_view expected) {
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    throw CorruptValueError(key, text, expected);
  }
}

constexpr std::string_view kNodeRecordShape =
    "a JSON object with host, local_world_size, pid, nonce, previous_rank, worker_store, "
    "keeps_workers and hosts_store";
constexpr std::string_view kPlaceShape = "'<node rank> <first global rank> <next ticket>'";
constexpr std::string_view kTotalsShape =
    "'<restarts> <world size> <nodes> <returning nodes> <continues: 0 or 1>'";
constexpr std::string_view kVerdictShape =
    "a JSON object with action (restart, reshape, fail, done), expect, restarts and reason";
constexpr std::string_view kFailuresShape = "a JSON list of worker failures";
constexpr std::string_view kReplacementsShape =
    "a JSON list of workers replaced in place ({failure, generation, new_pid, survivors})";
constexpr std::string_view kIntShape = "a decimal integer";
constexpr std::string_view kMembersShape = "a comma-separated list of tickets";
constexpr std::string_view kEndpointShape = "'host:port'";
constexpr std::string_view kProgressShape =
    "a JSON object with t (seconds), st (a state) and w (a list of workers, each with r and l)";

using ordered_json = nlohmann::ordered_json;

// A value as published: milliseconds are enough, and keep the value short.
double rounded(double v) {
  return std::round(v * 1000) / 1000;
}

// A time per step as published: four significant digits (a step's work of 1.4 ms compared as
// 1 ms would be a straggler of 1.4x).
double per_step(double v) {
  if (v == 0 || !std::isfinite(v)) return v;
  const double scale = std::pow(10.0, 3 - std::floor(std::log10(std::fabs(v))));
  return std::round(v * scale) / scale;
}

// (Durations and rates: a negative one, from a slot whose times a worker wrote wrongly (a step
// "in the future"), is no reading, and is left out as number() would refuse it.)
void put(ordered_json& j, const char* name, const std::optional<double>& v) {
  if (v && std::isfinite(*v) && *v >= 0) j[name] = rounded(*v);
}

void put_per_step(ordered_json& j, const char* name, const std::optional<double>& v) {
  if (v && std::isfinite(*v) && *v >= 0) j[name] = per_step(*v);
}

// An optional non-negative number; what is not one is the error naming the key.
std::optional<double> number(const ordered_json& j, const char* name, std::string_view key,
                             std::string_view text) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number() || it->get<double>() < 0) throw CorruptValueError(key, text, kProgressShape);
  return it->get<double>();
}

std::optional<std::uint64_t> unsigned_field(const ordered_json& j, const char* name,
                                            std::string_view key, std::string_view text) {
  const auto it = j.find(name);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_unsigned()) throw CorruptValueError(key, text, kProgressShape);
  return it->get<std::uint64_t>();
}

int small_count(const ordered_json& j, const char* name, std::string_view key,
                std::string_view text) {
  const auto v = unsigned_field(j, name, key, text);
  if (!v || *v > INT32_MAX) throw CorruptValueError(key, text, kProgressShape);
  return static_cast<int>(*v);
}

// At most `bytes`, cut before a UTF-8 character's continuation bytes (never inside a character).
std::string shortened(const std::string& name, std::size_t bytes = kMaxPublishedNameBytes) {
  return std::string(utf8_prefix(name, bytes));
}

constexpr std::string_view kViewShape =
    "a JSON object {\"t\": seconds, \"n\": ranks, \"m\": seconds, \"w\": [[rank, seconds], "
    "...], \"cw\": share, \"b\": [blocked ranks], \"ct\": milliseconds}";
constexpr std::string_view kBlockedShape =
    "blocked ranks [{\"r\": rank, \"g\": [[id, seq], ...], \"s\": [[id, size], ...], \"w\": "
    "[group, seq, op, seconds], \"t\": true (optional)}, ...]";

ordered_json encode_blocked(const std::vector<BlockedRank>& blocked, std::size_t most) {
  ordered_json list = ordered_json::array();
  for (std::size_t i = 0; i < std::min(blocked.size(), most); ++i) {
    const BlockedRank& b = blocked[i];
    ordered_json groups = ordered_json::array();
    ordered_json sizes = ordered_json::array();  // of the groups published
    for (std::size_t g = 0; g < std::min(b.groups.size(), kMaxPublishedGroups); ++g) {
      groups.push_back({b.groups[g].first, b.groups[g].second});
      const auto size = b.sizes.find(b.groups[g].first);
      if (size != b.sizes.end()) sizes.push_back({size->first, size->second});
    }
    ordered_json item = {{"r", b.rank},
                         {"g", std::move(groups)},
                         {"s", std::move(sizes)},
                         {"w", {b.group, b.seq, b.op, rounded(b.seconds)}}};
    if (b.threads) item["t"] = true;
    list.push_back(std::move(item));
  }
  return list;
}

std::vector<BlockedRank> decode_blocked(const ordered_json& list, std::size_t most,
                                        std::string_view key, std::string_view text,
                                        std::string_view shape) {
  const auto corrupt = [&] {
    return CorruptValueError(key, text, std::string(shape) + "; " + std::string(kBlockedShape));
  };
  if (!list.is_array() || list.size() > most) throw corrupt();
  std::vector<BlockedRank> out;
  for (const auto& item : list) {
    if (!item.is_object()) throw corrupt();
    const auto r = item.find("r"), g = item.find("g"), w = item.find("w"), s = item.find("s"),
               t = item.find("t");
    if (r == item.end() || !r->is_number_unsigned() || r->get<std::uint64_t>() > INT32_MAX ||
        g == item.end() || !g->is_array() || g->size() > kMaxPublishedGroups || w == item.end() ||
        !w->is_array() || w->size() != 4 || !(*w)[0].is_number_unsigned() ||
        !(*w)[1].is_number_unsigned() || !(*w)[2].is_number_unsigned() || !(*w)[3].is_number() ||
        (*w)[2].get<std::uint64_t>() > UINT32_MAX ||
        (s != item.end() && (!s->is_array() || s->size() > kMaxPublishedGroups)) ||
        (t != item.end() && !t->is_boolean())) {
      throw corrupt();
    }
    BlockedRank b;
    b.rank = r->get<int>();
    for (const auto& pair : *g) {
      if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
          !pair[1].is_number_unsigned()) {
        throw corrupt();
      }
      b.groups.emplace_back(pair[0].get<std::uint64_t>(), pair[1].get<std::uint64_t>());
    }
    if (s != item.end()) {
      for (const auto& pair : *s) {
        if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_unsigned() ||
            !pair[1].is_number_unsigned() || pair[1].get<std::uint64_t>() > UINT32_MAX) {
          throw corrupt();
        }
        b.sizes[pair[0].get<std::uint64_t>()] = pair[1].get<std::uint32_t>();
      }
    }
    b.threads = t != item.end() && t->get<bool>();
    b.group = (*w)[0].get<std::uint64_t>();
    b.seq = (*w)[1].get<std::uint64_t>();
    b.op = (*w)[2].get<std::uint32_t>();
    b.seconds = (*w)[3].get<double>();
    out.push_back(std::move(b));
  }
  return out;
}

ordered_json encode_rank(const RankStatus& r) {
  ordered_json j = {{"r", r.worker.rank}, {"l", r.worker.local_rank}};
  if (r.steps) j["s"] = *r.steps;
  put(j, "sps", r.steps_per_second);
  put(j, "ss", r.step_seconds);
  put(j, "as", r.since_step_seconds);
  put(j, "ab", r.since_beat_seconds);
  if (r.beats) j["b"] = r.beats;
  put(j, "ht", r.hang_timeout_seconds);
  if (r.straggler) j["sg"] = true;
  if (!r.pending_collective.empty()) j["pc"] = shortened(r.pending_collective);
  if (r.suspect) j["hs"] = true;
  if (r.paused) j["pa"] = true;
  if (!r.doing.empty()) j["do"] = shortened(r.doing, kMaxPublishedDoingBytes);
  put_per_step(j, "wk", r.work_seconds);
  put(j, "cw", r.cpu_wait);
  return j;
}

RankStatus decode_rank(const ordered_json& j, std::string_view key, std::string_view text) {
  if (!j.is_object()) throw CorruptValueError(key, text, kProgressShape);
  RankStatus r;
  r.worker.rank = small_count(j, "r", key, text);
  r.worker.local_rank = small_count(j, "l", key, text);
  r.steps = unsigned_field(j, "s", key, text);
  r.steps_per_second = number(j, "sps", key, text);
  r.step_seconds = number(j, "ss", key, text);
  r.since_step_seconds = number(j, "as", key, text);
  r.since_beat_seconds = number(j, "ab", key, text);
  r.beats = unsigned_field(j, "b", key, text).value_or(0);
  r.hang_timeout_seconds = number(j, "ht", key, text);
  r.work_seconds = number(j, "wk", key, text);
  r.cpu_wait = number(j, "cw", key, text);
  try {
    r.straggler = j.value("sg", false);
    r.pending_collective = shortened(j.value("pc", std::string()));
    r.suspect = j.value("hs", false);
    r.paused = j.value("pa", false);
    r.doing = shortened(j.value("do", std::string()), kMaxPublishedDoingBytes);
  } catch (const nlohmann::json::exception&) {
    throw CorruptValueError(key, text, kProgressShape);
  }
  return r;
}

ordered_json or_null(const std::optional<double>& v) {
  return v ? ordered_json(*v) : ordered_json();
}

}  // namespace

CorruptValueError::CorruptValueError(std::string_view key, std::string_view value,
                                     std::string_view expected)
    : RendezvousError("the rendezvous store holds a corrupted value at '" + shown(key) + "': '" +
                      shown(value) + "' (expected " + std::string(expected) +
                      "); was the store written by another program or version?") {}

std::string job_prefix(const std::string& run_id) {
  return std::string(kAgentNamespace) + run_id + "/";
}

std::string static_alive(int node_rank) {
  return std::string(kStaticAlivePrefix) + std::to_string(node_rank);
}

std::string in_round(int round, std::string_view name) {
  return "r" + std::to_string(round) + "/" + std::string(name);
}

std::string in_round(int round, std::string_view name, int id) {
  return in_round(round, name) + "/" + std::to_string(id);
}

std::string encode(const NodeRecord& r) {
  return json_text(json{{"host", r.host},
                        {"local_world_size", r.local_world_size},
                        {"pid", r.pid},
                        {"nonce", r.nonce},
                        {"previous_rank", r.previous_rank},
                        {"worker_store", encode_endpoint(r.worker_store)},
                        {"keeps_workers", r.keeps_workers},
                        {"hosts_store", r.hosts_store}});
}

NodeRecord decode_node_record(std::string_view key, std::string_view text) {
  const json j = parse_json(key, text, kNodeRecordShape);
  NodeRecord r;
  r.host = field<std::string>(j, "host", key, text, kNodeRecordShape);
  r.local_world_size = field<int>(j, "local_world_size", key, text, kNodeRecordShape);
  r.pid = field<int>(j, "pid", key, text, kNodeRecordShape);
  r.nonce = field<std::uint32_t>(j, "nonce", key, text, kNodeRecordShape);
  r.previous_rank = field<int>(j, "previous_rank", key, text, kNodeRecordShape);
  r.worker_store =
      decode_endpoint(key, field<std::string>(j, "worker_store", key, text, kNodeRecordShape));
  r.keeps_workers = field<bool>(j, "keeps_workers", key, text, kNodeRecordShape);
  r.hosts_store = field<bool>(j, "hosts_store", key, text, kNodeRecordShape);
  if (r.local_world_size < 1) throw CorruptValueError(key, text, kNodeRecordShape);
  return r;
}

std::string encode(const Place& p) {
  return std::to_string(p.node_rank) + " " + std::to_string(p.rank_offset) + " " +
         std::to_string(p.successor);
}

Place decode_place(std::string_view key, std::string_view text) {
  const auto v = integers(key, text, ' ', 3, kPlaceShape);
  Place p{as_int(key, text, v[0], kPlaceShape), as_int(key, text, v[1], kPlaceShape),
          as_int(key, text, v[2], kPlaceShape)};
  if (p.node_rank < 0 || p.rank_offset < 0) throw CorruptValueError(key, text, kPlaceShape);
  return p;
}

std::string encode(const RoundTotals& t) {
  return std::to_string(t.restarts) + " " + std::to_string(t.world_size) + " " +
         std::to_string(t.num_nodes) + " " + std::to_string(t.returning) + " " +
         (t.continues ? "1" : "0");
}

RoundTotals decode_round_totals(std::string_view key, std::string_view text) {
  const auto v = integers(key, text, ' ', 5, kTotalsShape);
  RoundTotals t{as_int(key, text, v[0], kTotalsShape), as_int(key, text, v[1], kTotalsShape),
                as_int(key, text, v[2], kTotalsShape), as_int(key, text, v[3], kTotalsShape),
                v[4] == 1};
  if (t.restarts < 0 || t.world_size < 1 || t.num_nodes < 1 || t.returning < 0 ||
      t.returning > t.num_nodes || (v[4] != 0 && v[4] != 1)) {
    throw CorruptValueError(key, text, kTotalsShape);
  }
  return t;
}

constexpr std::string_view kInPlaceShape =
    "'<replacements> <round> <recovery under way: 0 none, 1 a replacement, 2 a regroup> <node "
    "rank>'";

std::string encode(const InPlaceState& s) {
  return std::to_string(s.replacements) + " " + std::to_string(s.round) + " " +
         std::to_string(static_cast<int>(s.recovery)) + " " + std::to_string(s.node_rank);
}

InPlaceState decode_in_place(std::string_view key, std::string_view text) {
  const auto v = integers(key, text, ' ', 4, kInPlaceShape);
  if (v[2] < static_cast<int>(Recovery::kNone) || v[2] > static_cast<int>(Recovery::kRegroup)) {
    throw CorruptValueError(key, text, kInPlaceShape);
  }
  InPlaceState s{as_int(key, text, v[0], kInPlaceShape), as_int(key, text, v[1], kInPlaceShape),
                 static_cast<Recovery>(v[2]), as_int(key, text, v[3], kInPlaceShape)};
  if (s.replacements < 0 || s.round < 0) throw CorruptValueError(key, text, kInPlaceShape);
  return s;
}

const char* action_name(Verdict::Action a) {
  switch (a) {
    case Verdict::kRestart:
      return "restart";
    case Verdict::kReshape:
      return "reshape";
    case Verdict::kFail:
      return "fail";
    case Verdict::kDone:
      return "done";
  }
  return "?";
}

std::string encode(const Verdict& v) {
  return json_text(json{{"action", action_name(v.action)},
                        {"expect", v.expect},
                        {"restarts", v.restarts},
                        {"reason", v.reason}});
}

Verdict decode_verdict(std::string_view key, std::string_view text) {
  const json j = parse_json(key, text, kVerdictShape);
  Verdict v;
  const auto action = field<std::string>(j, "action", key, text, kVerdictShape);
  if (action == "restart") {
    v.action = Verdict::kRestart;
  } else if (action == "reshape") {
    v.action = Verdict::kReshape;
  } else if (action == "fail") {
    v.action = Verdict::kFail;
  } else if (action == "done") {
    v.action = Verdict::kDone;
  } else {
    throw CorruptValueError(key, text, kVerdictShape);
  }
  v.expect = field<int>(j, "expect", key, text, kVerdictShape);
  v.restarts = field<int>(j, "restarts", key, text, kVerdictShape);
  v.reason = field<std::string>(j, "reason", key, text, kVerdictShape);
  return v;
}

namespace {

json failure_json(const WorkerFailure& f) {
  return {{"time", std::chrono::duration<double>(f.time.time_since_epoch()).count()},
          {"host", f.host},
          {"rank", f.worker.rank},
          {"local_rank", f.worker.local_rank},
          {"exit_code", f.exit_code},
          {"pid", f.worker.pid},
          {"error_file", f.error_file},
          {"message", f.message},
          {"traceback", f.traceback},
          {"collateral", f.collateral},
          {"ended_by_the_stop", f.ended_by_the_stop}};
}

WorkerFailure failure_of(const json& j, std::string_view key, std::string_view text,
                         std::string_view shape) {
  WorkerFailure f;
  f.time =
      std::chrono::system_clock::time_point(std::chrono::round<std::chrono::system_clock::duration>(
          std::chrono::duration<double>(field<double>(j, "time", key, text, shape))));
  f.host = field<std::string>(j, "host", key, text, shape);
  f.worker.rank = field<int>(j, "rank", key, text, shape);
  f.worker.local_rank = field<int>(j, "local_rank", key, text, shape);
  f.exit_code = field<int>(j, "exit_code", key, text, shape);
  f.worker.pid = field<int>(j, "pid", key, text, shape);
  f.error_file = field<std::string>(j, "error_file", key, text, shape);
  f.message = field<std::string>(j, "message", key, text, shape);
  f.traceback = field<std::string>(j, "traceback", key, text, shape);
  f.collateral = j.value("collateral", false);  // (absent from older agents' records)
  f.ended_by_the_stop = j.value("ended_by_the_stop", false);
  return f;
}

}  // namespace

std::string encode(const std::vector<WorkerFailure>& failures) {
  json list = json::array();
  for (const auto& f : failures) list.push_back(failure_json(f));
  return json_text(list);
}

std::vector<WorkerFailure> decode_failures(std::string_view key, std::string_view text) {
  const json list = parse_json(key, text, kFailuresShape);
  if (!list.is_array()) throw CorruptValueError(key, text, kFailuresShape);
  std::vector<WorkerFailure> failures;
  for (const auto& j : list) failures.push_back(failure_of(j, key, text, kFailuresShape));
  return failures;
}

std::string encode(const std::vector<InPlaceReplacement>& replaced) {
  json list = json::array();
  for (const auto& r : replaced) {
    list.push_back({{"failure", failure_json(r.failure)},
                    {"generation", r.generation},
                    {"new_pid", r.new_pid},
                    {"survivors", r.survivors}});
  }
  return json_text(list);
}

std::vector<InPlaceReplacement> decode_replacements(std::string_view key, std::string_view text) {
  const json list = parse_json(key, text, kReplacementsShape);
  if (!list.is_array()) throw CorruptValueError(key, text, kReplacementsShape);
  std::vector<InPlaceReplacement> replaced;
  for (const auto& j : list) {
    if (!j.is_object() || !j.contains("failure") || !j.at("failure").is_object()) {
      throw CorruptValueError(key, text, kReplacementsShape);
    }
    InPlaceReplacement r;
    r.failure = failure_of(j.at("failure"), key, text, kReplacementsShape);
    r.generation = field<int>(j, "generation", key, text, kReplacementsShape);
    r.new_pid = field<int>(j, "new_pid", key, text, kReplacementsShape);
    r.survivors = field<std::vector<int>>(j, "survivors", key, text, kReplacementsShape);
    replaced.push_back(std::move(r));
  }
  return replaced;
}

std::optional<store::Endpoint> decode_endpoint(std::string_view key, std::string_view text) {
  if (text.empty()) return std::nullopt;
  try {
    return store::parse_endpoint(text);
  } catch (const store::EndpointError&) {
    throw CorruptValueError(key, text, kEndpointShape);
  }
}

std::string encode_endpoint(const std::optional<store::Endpoint>& endpoint) {
  return endpoint ? endpoint->to_string() : std::string();
}

std::int64_t decode_int(std::string_view key, std::string_view text) {
  return integers(key, text, ' ', 1, kIntShape).front();
}

std::string encode_members(const std::vector<int>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

std::vector<int> decode_members(std::string_view key, std::string_view text) {
  if (text.empty()) throw CorruptValueError(key, text, kMembersShape);
  std::vector<int> ids;
  for (const auto v : integers(key, text, ',', 0, kMembersShape)) {
    ids.push_back(as_int(key, text, v, kMembersShape));
  }
  return ids;
}

std::string encode(const NodeProgress& p) {
  ordered_json workers = ordered_json::array();
  const std::size_t shown = std::min(p.ranks.size(), kMaxPublishedRanks);
  for (std::size_t i = 0; i < shown; ++i) workers.push_back(encode_rank(p.ranks[i]));
  ordered_json j = {{"t", rounded(p.time)}, {"st", shortened(p.state)}, {"w", std::move(workers)}};
  if (const std::size_t more = p.more + (p.ranks.size() - shown)) j["more"] = more;
  if (!p.blocked.empty()) j["b"] = encode_blocked(p.blocked, kMaxPublishedBlocked);
  if (p.collective_timeout_ms) j["ct"] = p.collective_timeout_ms;
  return json_text(j);
}

NodeProgress decode_node_progress(std::string_view key, std::string_view text) {
  ordered_json j;
  try {
    j = ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw CorruptValueError(key, text, kProgressShape);
  }
  if (!j.is_object()) throw CorruptValueError(key, text, kProgressShape);
  NodeProgress p;
  const auto time = number(j, "t", key, text);
  const auto workers = j.find("w");
  const auto state = j.find("st");
  if (!time || workers == j.end() || !workers->is_array() || workers->size() > kMaxPublishedRanks ||
      state == j.end() || !state->is_string()) {
    throw CorruptValueError(key, text, kProgressShape);
  }
  p.time = *time;
  p.state = shortened(state->get<std::string>());
  p.more = static_cast<std::size_t>(unsigned_field(j, "more", key, text).value_or(0));
  for (const auto& w : *workers) p.ranks.push_back(decode_rank(w, key, text));
  if (const auto blocked = j.find("b"); blocked != j.end()) {
    p.blocked = decode_blocked(*blocked, kMaxPublishedBlocked, key, text, kProgressShape);
  }
  p.collective_timeout_ms = unsigned_field(j, "ct", key, text).value_or(0);
  return p;
}

JobView make_job_view(const std::vector<NodeProgress>& nodes, double now) {
  JobView v;
  v.time = now;
  std::vector<double> all, waits;
  for (const auto& n : nodes) {
    v.collective_timeout_ms = std::max(v.collective_timeout_ms, n.collective_timeout_ms);
    for (const auto& r : n.ranks) {
      if (!r.work_seconds || !std::isfinite(*r.work_seconds) || *r.work_seconds <= 0) continue;
      all.push_back(*r.work_seconds);
      v.work.emplace_back(r.worker.rank, *r.work_seconds);
      if (r.cpu_wait && std::isfinite(*r.cpu_wait)) waits.push_back(*r.cpu_wait);
    }
    for (const auto& b : n.blocked) {
      if (v.blocked.size() >= kMaxViewBlocked) break;
      v.blocked.push_back(b);
      // A set-up wait as of the view's time (when it began is what a stopped node compares); a
      // collective wait as seen (the proof asks each for a wait long enough, and observed).
      if (b.in_setup()) v.blocked.back().seconds += std::max(0.0, now - n.time);
    }
  }
  v.measured = all.size();
  if (!all.empty()) {
    std::sort(all.begin(), all.end());
    const std::size_t m = all.size();
    v.median_work = m % 2 ? all[m / 2] : (all[m / 2 - 1] + all[m / 2]) / 2;
  }
  if (!waits.empty() && waits.size() * 2 >= all.size()) {  // most of the measured ranks say it
    std::sort(waits.begin(), waits.end());
    v.median_cpu_wait = waits[waits.size() / 2];
  }
  std::sort(v.work.begin(), v.work.end());
  if (v.work.size() > kMaxViewRanks) v.work.resize(kMaxViewRanks);
  return v;
}

std::string encode(const JobView& v) {
  ordered_json work = ordered_json::array();
  for (const auto& [rank, seconds] : v.work) work.push_back({rank, per_step(seconds)});
  ordered_json j = {{"t", rounded(v.time)},
                    {"n", v.measured},
                    {"m", per_step(v.median_work)},
                    {"w", std::move(work)}};
  if (v.median_cpu_wait) j["cw"] = rounded(*v.median_cpu_wait);
  if (!v.blocked.empty()) j["b"] = encode_blocked(v.blocked, kMaxViewBlocked);
  if (v.collective_timeout_ms) j["ct"] = v.collective_timeout_ms;
  return json_text(j);
}

JobView decode_job_view(std::string_view key, std::string_view text) {
  ordered_json j;
  try {
    j = ordered_json::parse(text);
  } catch (const nlohmann::json::exception&) {
    throw CorruptValueError(key, text, kViewShape);
  }
  if (!j.is_object()) throw CorruptValueError(key, text, kViewShape);
  JobView v;
  const auto time = number(j, "t", key, text);
  const auto median = number(j, "m", key, text);
  const auto measured = unsigned_field(j, "n", key, text);
  const auto work = j.find("w");
  if (!time || !median || !measured || work == j.end() || !work->is_array() ||
      work->size() > kMaxViewRanks) {
    throw CorruptValueError(key, text, kViewShape);
  }
  v.time = *time;
  v.median_work = *median;
  v.measured = static_cast<std::size_t>(*measured);
  for (const auto& entry : *work) {
    if (!entry.is_array() || entry.size() != 2 || !entry[0].is_number_unsigned() ||
        !entry[1].is_number() || entry[0].get<std::uint64_t>() > INT32_MAX) {
      throw CorruptValueError(key, text, kViewShape);
    }
    v.work.emplace_back(entry[0].get<int>(), entry[1].get<double>());
  }
  v.median_cpu_wait = number(j, "cw", key, text);
  if (const auto blocked = j.find("b"); blocked != j.end()) {
    v.blocked = decode_blocked(*blocked, kMaxViewBlocked, key, text, kViewShape);
  }
  v.collective_timeout_ms = unsigned_field(j, "ct", key, text).value_or(0);
  return v;
}

void age_to(NodeProgress& p, double now) {
  const double elapsed = std::max(0.0, now - p.time);
  for (auto& r : p.ranks) {
    if (r.since_step_seconds) *r.since_step_seconds += elapsed;
    if (r.since_beat_seconds) *r.since_beat_seconds += elapsed;
  }
  p.time = std::max(p.time, now);
}

std::vector<std::pair<std::string, std::string>> heartbeat_items(
    int round, int node_rank, const std::function<std::string()>& progress) {
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
      std::chrono::system_clock::now().time_since_epoch());
  std::vector<std::pair<std::string, std::string>> items{
      {in_round(round, name::kHeartbeat, node_rank), std::to_string(now.count())}};
  if (progress) items.emplace_back(in_round(round, name::kProgress, node_rank), progress());
  return items;
}

nlohmann::ordered_json to_json(const RankStatus& r) {
  return {{"rank", r.worker.rank},
          {"local_rank", r.worker.local_rank},
          {"steps", r.steps ? ordered_json(*r.steps) : ordered_json()},
          {"steps_per_second", or_null(r.steps_per_second)},
          {"step_seconds", or_null(r.step_seconds)},
          {"since_step_seconds", or_null(r.since_step_seconds)},
          {"since_beat_seconds", or_null(r.since_beat_seconds)},
          {"beats", r.beats},
          {"progress_age_seconds", or_null(r.progress_age_seconds())},
          {"hang_timeout_seconds", or_null(r.hang_timeout_seconds)},
          {"straggler", r.straggler},
          {"hung", r.hung()},
          {"paused", r.paused},
          {"doing", r.doing},
          {"work_seconds", or_null(r.work_seconds)},
          {"pending_collective", r.pending_collective}};
}

}  // namespace dist::agent::schema
