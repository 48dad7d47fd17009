#include "dist/sdk/init.h"

#include <signal.h>

#include <cstdlib>
#include <string>

#include "dist/contract/worker_contract.h"
#include "folds.h"
#include "progress_slot.h"

namespace dist::sdk {
namespace {

// A survivor's write to a dead peer's socket (Gloo sends without MSG_NOSIGNAL on some paths) must
// fail with EPIPE, which the group reports as the peer's failure (the job's report names the
// peer), not kill the process with SIGPIPE (exit 141, no word of why): a worker's group ignores it
// unless the program chose a handler of its own, as Python, and so every torch worker, does.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, nullptr);
}

// A worker started as a later generation of an in-place group (a newcomer's, a replacement) says
// it is here before it waits for the group: a regroup's generation is published once every rank
// of the new world is (worker_contract.h), so that the running workers train on meanwhile.
void say_arrived(const WorkerEnv& env) {
  namespace contract = worker_contract;
  const std::string prefix = contract::generation_prefix(env.run_id, env.restart_count);
  connect_store(env).set(contract::arrived_key(prefix, env.generation, env.rank), "1");
}

// A replacement's generation may be given up while its group forms: a worker of another node
// died in it, and the agent folded that failure into the recovery (folds.h). It joins the latest.
std::unique_ptr<ProcessGroup> join_latest_group(WorkerEnv& env, Backend backend,
                                                std::chrono::milliseconds timeout) {
  while (true) {
    try {
      return join_group(env, backend, timeout);
    } catch (const CollectiveError& e) {
      if (env.generation == 0 || !detail::follows_folds(env, backend)) throw;
      std::optional<int> next;
      try {
        store::StoreClient store = connect_store(env);
        next = detail::generation_to_follow(env, store, env.generation, e);
      } catch (const store::StoreError&) {  // the error stands
      }
      if (!next) throw;
      detail::say_following(env, env.generation, *next, e.what());
      env.generation = *next;
    }
  }
}

}  // namespace

std::unique_ptr<ProcessGroup> join_group(const WorkerEnv& env, Backend backend,
                                         std::chrono::milliseconds timeout) {
  // Keys fresh for each restart attempt and each generation of it: a restarted or rebuilt group
  // never reads a previous one's.
  std::string prefix = worker_contract::group_prefix(env.run_id, env.restart_count);
  if (env.generation > 0) prefix += "gen_" + std::to_string(env.generation) + "/";
  ignore_sigpipe();
  const detail::SetupWait waiting;  // for every rank of the group to come
  if (backend == Backend::kNccl) {
    NcclOptions options;
    options.key_prefix = prefix + "nccl";
    options.route_to = env.master_addr;  // NCCL_SOCKET_IFNAME, as Gloo chooses its address
    options.init_timeout = timeout;
    if (env.in_place) options.on_failure = NcclFailure::kThrow;  // rebuilt, not restarted
    const char* nonblocking = std::getenv("TORCH_NCCL_USE_COMM_NONBLOCKING");  // torch's switch
    options.blocking =
        !(nonblocking && (std::string(nonblocking) == "1" || std::string(nonblocking) == "true"));
    return make_nccl_group(connect_store(env), env.rank, env.world_size, env.local_rank, options);
  }
  GlooOptions options;
  options.route_to = env.master_addr;
  options.key_prefix = prefix + "gloo";
  options.timeout = timeout;
  if (env.generation > 0 && detail::follows_folds(env, backend)) {
    options.superseded = detail::superseded_check(env);
  }
  return make_gloo_group(connect_store(env), env.rank, env.world_size, options);
}

Distributed init(Backend backend) {
  detail::install_stack_dump();  // where this worker is, when the agent asks (a hang)
  Distributed d;
  if (WorkerEnv::launched_by_dist_launch()) {
    d.env = WorkerEnv::from_environment();
  } else {
    d.own_store = std::make_unique<store::StoreServerThread>();
    d.env = WorkerEnv::single_process();
    d.env.master_port = d.own_store->port();
  }
  if (d.env.in_place && d.env.generation > 0) say_arrived(d.env);
  d.group = join_latest_group(d.env, backend, std::chrono::minutes(5));
  return d;
}

}  // namespace dist::sdk
