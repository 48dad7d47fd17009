// The Kubeflow training operator's environments on named hosts, as its pods get them: dist-launch
// is started with no flags at all, only the PET_* variables (and the operator's own MASTER_ADDR,
// WORLD_SIZE and RANK) that each pod receives, and the host names the pods have.
#include <set>

#include "named_hosts.h"

namespace dist::testing {
namespace {

using namespace std::chrono_literals;

using Env = std::map<std::string, std::string>;

class Kubeflow : public NamedHostsTest {
 protected:
  // A pod: dist-launch with the pod's environment and no flags; each worker writes its environment
  // to env_<pod>_<local rank> and, in an elastic job, stays until the world is `elastic_world`.
  agent::testing::Child& pod(const std::string& host, const Env& pet, int elastic_world = 0) {
    std::vector<std::string> args{"--no-python", DIST_TEST_WORKER_BIN, "env",
                                  path("env_" + host + "_${local_rank}")};
    if (elastic_world > 0) {
      args.insert(args.end(), {"exit-if-world", std::to_string(elastic_world), "0", "forever"});
    }
    return hosts_->start(host, DIST_LAUNCH_BIN, args, log(host), pet);
  }
};

TEST_F(Kubeflow, V1MasterAndWorkers) {
  // PyTorchJob with a Master and two Workers: a static job, the master reached by its pod name.
  const std::vector<std::string> pods = {"job-master-0", "job-worker-0", "job-worker-1"};
  hosts({pods, "job-worker-1", ""});
  std::vector<agent::testing::Child*> started;
  for (int i = 0; i < 3; ++i) {
    started.push_back(&pod(pods[i], {{"PET_NNODES", "3"},
                                     {"PET_NODE_RANK", std::to_string(i)},
                                     {"PET_MASTER_ADDR", "job-master-0"},
                                     {"PET_MASTER_PORT", "23456"},
                                     {"PET_NPROC_PER_NODE", "1"},
                                     {"MASTER_ADDR", "job-master-0"},
                                     {"MASTER_PORT", "23456"},
                                     {"WORLD_SIZE", "3"},
                                     {"RANK", std::to_string(i)},
                                     {"PYTHONUNBUFFERED", "0"}}));
  }
  for (auto* p : started) EXPECT_EQ(p->wait(90s), 0) << p->output();
  for (int i = 0; i < 3; ++i) {
    auto e = env("env_" + pods[i] + "_0");
    SCOPED_TRACE(pods[i]);
    EXPECT_EQ(e["RANK"], std::to_string(i));
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["MASTER_ADDR"], "job-master-0");
    EXPECT_EQ(e["MASTER_PORT"], "23456");
  }
}

TEST_F(Kubeflow, V1ElasticPolicy) {
  // elasticPolicy {minReplicas: 2, maxReplicas: 3, rdzvConf last_call_timeout=1}: the store on the
  // first worker's pod, every pod the same variables; the workers finish once all three joined.
  const std::vector<std::string> pods = {"job-worker-0", "job-worker-1", "job-worker-2"};
  hosts({pods, "", ""});
  const Env pet = {{"PET_RDZV_ENDPOINT", "job-worker-0:23456"},
                   {"PET_RDZV_BACKEND", "c10d"},
                   {"PET_NNODES", "2:3"},
                   {"PET_MAX_RESTARTS", "3"},
                   {"PET_NPROC_PER_NODE", "1"},
                   {"PET_RDZV_CONF", "join_timeout=60,last_call_timeout=1"},
                   {"PYTHONUNBUFFERED", "0"}};
  std::vector<agent::testing::Child*> started;
  for (const auto& p : pods) started.push_back(&pod(p, pet, 3));
  for (auto* p : started) EXPECT_EQ(p->wait(120s), 0) << p->output();
  std::set<std::string> ranks;
  for (const auto& p : pods) {
    auto e = env("env_" + p + "_0");
    SCOPED_TRACE(p);
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["MASTER_ADDR"], "job-worker-0");
    ranks.insert(e["RANK"]);
  }
  EXPECT_EQ(ranks.size(), 3u);
}

TEST_F(Kubeflow, TrainerV2WithAutoWorkersPerNode) {
  // TrainJob with numNodes 2 and numProcPerNode auto: the master is node 0's pod by its name in
  // the job's subdomain; each node starts one worker per GPU, else per CPU.
  const std::vector<std::string> pods = {"trainjob-node-0-0", "trainjob-node-0-1"};
  hosts({pods, "", "trainjob"});
  std::vector<agent::testing::Child*> started;
  for (int i = 0; i < 2; ++i) {
    started.push_back(&pod(pods[i], {{"PET_NNODES", "2"},
                                     {"PET_NPROC_PER_NODE", "auto"},
                                     {"PET_NODE_RANK", std::to_string(i)},
                                     {"PET_MASTER_ADDR", "trainjob-node-0-0.trainjob"},
                                     {"PET_MASTER_PORT", "29400"}}));
  }
  for (auto* p : started) EXPECT_EQ(p->wait(90s), 0) << p->output();
  const int per_node = std::stoi(env("env_" + pods[0] + "_0")["LOCAL_WORLD_SIZE"]);
  ASSERT_GE(per_node, 1);
  std::set<std::string> ranks;
  for (int i = 0; i < 2; ++i) {
    for (int local = 0; local < per_node; ++local) {
      auto e = env("env_" + pods[i] + "_" + std::to_string(local));
      SCOPED_TRACE(pods[i] + " local rank " + std::to_string(local));
      EXPECT_EQ(e["WORLD_SIZE"], std::to_string(2 * per_node));
      EXPECT_EQ(e["RANK"], std::to_string(i * per_node + local));
      EXPECT_EQ(e["MASTER_ADDR"], "trainjob-node-0-0.trainjob");
      ranks.insert(e["RANK"]);
    }
  }
  EXPECT_EQ(ranks.size(), static_cast<std::size_t>(2 * per_node));
}

}  // namespace
}  // namespace dist::testing
