// The rendezvous's decisions (rules.h) and its encodings (schema.h), table-driven: one array of
// cases, one loop, a SCOPED_TRACE per case.
#include <gtest/gtest.h>

#include <functional>

#include <string>
#include <vector>

#include "rendezvous/rules.h"
#include "rendezvous/schema.h"

namespace dist::agent {
namespace {

schema::NodeRecord record(std::string host, int pid, int previous_rank, int workers = 1) {
  return {std::move(host), workers, pid, 7u, previous_rank, std::nullopt};
}

// A newcomer whose agent hosts the rendezvous store.
schema::NodeRecord store_host(std::string host, int pid) {
  schema::NodeRecord r = record(std::move(host), pid, -1);
  r.hosts_store = true;
  return r;
}

TEST(Rules, TheVerdictAfterARound) {
  struct Case {
    const char* name;
    rules::RoundEnd end;
    int max_restarts, min_nodes;
    Verdict::Action action;
    int restarts, expect;
    const char* reason;
  };
  const Case cases[] = {
      {"a worker failed, restarts left",
       {true, false, {}, 3, 0, 0},
       1,
       1,
       Verdict::kRestart,
       1,
       3,
       "a worker failed"},
      {"a worker failed, none left",
       {true, false, {}, 3, 2, 0},
       2,
       1,
       Verdict::kFail,
       2,
       3,
       "the most --max-restarts allows"},
      {"a node lost, enough left",
       {false, false, {2}, 3, 0, 0},
       0,
       2,
       Verdict::kReshape,
       0,
       2,
       "node(s) [2] lost"},
      {"a failure with a lost node is collateral",
       {true, false, {1}, 3, 0, 0},
       0,
       1,
       Verdict::kReshape,
       0,
       2,
       "node(s) [1] lost"},
      {"too few left with a restart to spare: a restart whose round waits for MIN",
       {false, false, {0, 1}, 3, 0, 0},
       5,
       2,
       Verdict::kRestart,
       1,
       1,
       "1 node(s) left, fewer than the minimum 2: waiting for nodes to join"},
      {"too few left and no restart left",
       {false, false, {0, 1}, 3, 2, 0},
       2,
       2,
       Verdict::kFail,
       2,
       1,
       "1 node(s) left, fewer than the minimum 2"},
      {"a newcomer waiting counts towards the minimum",
       {false, false, {0, 1}, 3, 0, 1},
       5,
       2,
       Verdict::kReshape,
       0,
       1,
       "lost"},
      {"a newcomer",
       {false, true, {}, 2, 1, 0},
       1,
       1,
       Verdict::kReshape,
       1,
       2,
       "a node is waiting to join"},
      {"a failure while a newcomer waits is collateral",
       {true, true, {}, 2, 0, 0},
       0,
       1,
       Verdict::kReshape,
       0,
       2,
       "waiting to join"},
      {"in-place replacements count against --max-restarts",
       {true, false, {}, 2, 1, 0, 1},
       2,
       1,
       Verdict::kFail,
       1,
       2,
       "a worker failed after 1 restart(s) and 1 in-place replacement(s), the most"},
      {"a restart left beside the replacements",
       {true, false, {}, 2, 0, 0, 1},
       2,
       1,
       Verdict::kRestart,
       1,
       2,
       "a worker failed"},
      {"too few left, the restarts spent in place",
       {false, false, {0, 1}, 3, 0, 0, 2},
       2,
       2,
       Verdict::kFail,
       0,
       1,
       "fewer than the minimum 2"},
      {"in place, too few left with a restart to spare: the survivors wait in place",
       {false, false, {1}, 2, 0, 0, 0, true},
       1,
       2,
       Verdict::kReshape,
       0,
       1,
       "1 node(s) left, fewer than the minimum 2: the survivors' workers wait in place"},
      {"in place, too few left and no restart left: as without",
       {false, false, {1}, 2, 0, 0, 1, true},
       1,
       2,
       Verdict::kFail,
       0,
       1,
       "1 node(s) left, fewer than the minimum 2"},
      {"in place, node 0 lost (the workers' store's host): a restart",
       {false, false, {0}, 2, 0, 0, 0, true},
       1,
       2,
       Verdict::kRestart,
       1,
       1,
       "waiting for nodes to join (until the join timeout)"},
      {"in place, no node left: a restart whose round waits for MIN",
       {false, false, {0, 1}, 2, 0, 0, 0, true},
       1,
       2,
       Verdict::kRestart,
       1,
       0,
       "waiting for nodes to join (until the join timeout)"},
      {"ended elsewhere",
       {false, false, {}, 2, 0, 0},
       0,
       1,
       Verdict::kReshape,
       0,
       2,
       "the round ended elsewhere"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const Verdict v = rules::decide(c.end, c.max_restarts, c.min_nodes);
    EXPECT_EQ(v.action, c.action);
    EXPECT_EQ(v.restarts, c.restarts);
    EXPECT_EQ(v.expect, c.expect);
    EXPECT_NE(v.reason.find(c.reason), std::string::npos) << v.reason;
  }
}

TEST(Rules, WhoIsInAClosingRoundAndInWhatOrder) {
  struct Case {
    const char* name;
    std::vector<rules::Candidate> joined;
    int max_nodes;
    std::vector<int> tickets;  // by node rank
  };
  const std::vector<Case> cases = {
      {"newcomers by host, then pid",
       {{1, record("b", 10, -1)}, {2, record("a", 20, -1)}, {3, record("a", 5, -1)}},
       3,
       {3, 2, 1}},
      {"the previous round's nodes keep their order, before newcomers",
       {{1, record("z", 1, -1)}, {2, record("y", 2, 1)}, {3, record("x", 3, 0)}},
       3,
       {3, 2, 1}},
      // Whatever its name and pid (pids wrap): node 0 shares the store's fate.
      {"the store's host first among newcomers",
       {{1, record("a", 10, -1)}, {2, store_host("b", 30000)}, {3, record("a", 5, -1)}},
       3,
       {2, 3, 1}},
      {"a returning node keeps its rank before the store's host",
       {{1, store_host("a", 1)}, {2, record("b", 2, 0)}},
       2,
       {2, 1}},
      {"at most max_nodes: newcomers wait",
       {{1, record("a", 1, -1)}, {2, record("b", 2, 0)}, {3, record("c", 3, 1)}},
       2,
       {2, 3}},
      {"nobody", {}, 4, {}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<int> tickets;
    for (const auto& m : rules::choose_members(c.joined, c.max_nodes)) tickets.push_back(m.ticket);
    EXPECT_EQ(tickets, c.tickets);
  }
}

TEST(Rules, PlacesGiveContiguousRanksAndARing) {
  struct Case {
    const char* name;
    std::vector<int> ids, sizes;
    std::vector<schema::Place> places;
    int world_size;
  };
  const std::vector<Case> cases = {
      {"alone", {5}, {4}, {{0, 0, -1}}, 4},
      {"two", {5, 9}, {2, 3}, {{0, 0, 9}, {1, 2, 5}}, 5},
      {"three, uneven", {1, 2, 3}, {1, 8, 2}, {{0, 0, 2}, {1, 1, 3}, {2, 9, 1}}, 11},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const auto p = rules::place(c.ids, c.sizes);
    EXPECT_EQ(p.places, c.places);
    EXPECT_EQ(p.world_size, c.world_size);
  }
}

TEST(Schema, EveryEncodingRoundTrips) {
  const schema::NodeRecord r{"node-a", 4,   1234, 99u, 2, store::Endpoint{"node-a", 4100},
                             true,     true};
  const auto back = schema::decode_node_record("k", schema::encode(r));
  EXPECT_EQ(back.host, r.host);
  EXPECT_EQ(back.local_world_size, 4);
  EXPECT_EQ(back.pid, 1234);
  EXPECT_EQ(back.nonce, 99u);
  EXPECT_EQ(back.previous_rank, 2);
  EXPECT_EQ(back.worker_store, (store::Endpoint{"node-a", 4100}));
  EXPECT_TRUE(back.keeps_workers);
  EXPECT_TRUE(back.hosts_store);
  const schema::Place place{3, 24, 7};
  EXPECT_EQ(schema::decode_place("k", schema::encode(place)), place);
  const schema::RoundTotals totals{1, 32, 4, 3, true};
  EXPECT_EQ(schema::decode_round_totals("k", schema::encode(totals)), totals);
  for (const Recovery r : {Recovery::kNone, Recovery::kReplacement, Recovery::kRegroup}) {
    const schema::InPlaceState in_place{3, 2, r, 1};
    EXPECT_EQ(schema::decode_in_place("k", schema::encode(in_place)), in_place);
  }
  EXPECT_EQ(schema::encode(schema::InPlaceState{3, 2, Recovery::kReplacement, 1}), "3 2 1 1");
  EXPECT_EQ(schema::encode(schema::InPlaceState{3, 2, Recovery::kRegroup, 0}), "3 2 2 0");
  Verdict v;
  v.action = Verdict::kRestart;
  v.expect = 3;
  v.restarts = 2;
  v.reason = "a worker failed";
  const auto vb = schema::decode_verdict("k", schema::encode(v));
  EXPECT_EQ(vb.action, v.action);
  EXPECT_EQ(vb.expect, 3);
  EXPECT_EQ(vb.restarts, 2);
  EXPECT_EQ(vb.reason, v.reason);
  WorkerFailure f;
  f.host = "h";
  f.worker.rank = 5;
  f.worker.local_rank = 1;
  f.worker.pid = 77;
  f.exit_code = -9;
  f.message = "RuntimeError: x";
  const auto fb = schema::decode_failures("k", schema::encode(std::vector<WorkerFailure>{f}));
  ASSERT_EQ(fb.size(), 1u);
  EXPECT_EQ(fb[0].worker.rank, 5);
  EXPECT_EQ(fb[0].worker.local_rank, 1);
  EXPECT_EQ(fb[0].worker.pid, 77);
  EXPECT_EQ(fb[0].exit_code, -9);
  EXPECT_EQ(fb[0].message, f.message);
  const InPlaceReplacement replaced{f, 3, 78, {0, 2}};
  const auto rb =
      schema::decode_replacements("k", schema::encode(std::vector<InPlaceReplacement>{replaced}));
  ASSERT_EQ(rb.size(), 1u);
  EXPECT_EQ(rb[0].failure.worker.pid, 77);
  EXPECT_EQ(rb[0].failure.host, "h");
  EXPECT_EQ(rb[0].failure.exit_code, -9);
  EXPECT_EQ(rb[0].generation, 3);
  EXPECT_EQ(rb[0].new_pid, 78);
  EXPECT_EQ(rb[0].survivors, (std::vector<int>{0, 2}));
  EXPECT_EQ(schema::decode_members("k", schema::encode_members({4, 1, 9})),
            (std::vector<int>{4, 1, 9}));
  const auto e = schema::decode_endpoint("k", "[fd00::1]:29500");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->host, "fd00::1");
  EXPECT_EQ(e->port, 29500);
  EXPECT_EQ(schema::encode_endpoint(e), "[fd00::1]:29500");
  EXPECT_FALSE(schema::decode_endpoint("k", ""));
  EXPECT_EQ(schema::encode_endpoint(std::nullopt), "");
}

// A value that does not decode is an error naming the key and showing the value (escaped), never
// a bare "stoi".
TEST(Schema, ACorruptedValueIsAnErrorNamingItsKey) {
  struct Case {
    const char* name;
    std::function<void()> decode;
    const char* expected;
  };
  const Case cases[] = {
      {"place: too few numbers", [] { schema::decode_place("r3/place/5", "1 2"); },
       "'<node rank> <first global rank> <next ticket>'"},
      {"place: not numbers", [] { schema::decode_place("r3/place/5", "a b c"); }, "r3/place/5"},
      {"place: a negative rank", [] { schema::decode_place("r3/place/5", "-1 0 2"); }, "-1 0 2"},
      {"totals: trailing bytes", [] { schema::decode_round_totals("r1/assignment", "0 8 2x"); },
       "r1/assignment"},
      {"totals: no nodes", [] { schema::decode_round_totals("r1/assignment", "0 8 0 0 0"); },
       "'<restarts> <world size> <nodes> <returning nodes> <continues: 0 or 1>'"},
      {"totals: more returning than nodes",
       [] { schema::decode_round_totals("r1/assignment", "0 8 2 3 1"); }, "0 8 2 3 1"},
      {"totals: continues neither 0 nor 1",
       [] { schema::decode_round_totals("r1/assignment", "0 8 2 2 2"); }, "0 8 2 2 2"},
      {"in-place: a recovery neither 0, 1 nor 2",
       [] { schema::decode_in_place("in_place", "1 0 3 0"); },
       "'<replacements> <round> <recovery under way: 0 none, 1 a replacement, 2 a regroup> <node "
       "rank>'"},
      {"int: empty", [] { schema::decode_int("round", ""); }, "a decimal integer"},
      {"int: too big", [] { schema::decode_int("round", "99999999999999999999"); }, "round"},
      {"int: a control byte shown escaped", [] { schema::decode_int("round", "1\n2"); }, "1\\x0a2"},
      {"record: not JSON", [] { schema::decode_node_record("r0/node/1", "{oops"); }, "r0/node/1"},
      {"record: a field missing",
       [] { schema::decode_node_record("r0/node/1", R"({"host":"a","pid":1})"); },
       "local_world_size"},
      {"verdict: an unknown action",
       [] {
         schema::decode_verdict("r2/verdict",
                                R"({"action":"party","expect":1,"restarts":0,"reason":""})");
       },
       "r2/verdict"},
      {"failures: not a list", [] { schema::decode_failures("r0/failures/1", "{}"); },
       "a JSON list of worker failures"},
      {"replacements: no failure",
       [] { schema::decode_replacements("r0/replaced/1", R"([{"generation":1}])"); },
       "r0/replaced/1"},
      {"replacements: a failure without its fields",
       [] {
         schema::decode_replacements(
             "r0/replaced/1", R"([{"failure":{},"generation":1,"new_pid":2,"survivors":[]}])");
       },
       "workers replaced in place"},
      {"members: empty", [] { schema::decode_members("r0/members", ""); }, "r0/members"},
      {"endpoint: no port", [] { schema::decode_endpoint("r0/worker_store", "host"); },
       "'host:port'"},
      {"endpoint: port out of range",
       [] { schema::decode_endpoint("r0/worker_store", "host:70000"); }, "host:70000"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    try {
      c.decode();
      ADD_FAILURE() << "decoded";
    } catch (const schema::CorruptValueError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("corrupted value"), std::string::npos) << what;
      EXPECT_NE(what.find(c.expected), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace dist::agent
