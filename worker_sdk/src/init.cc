#include "dist/sdk/init.h"

#include <cstdlib>
#include <string>

#include "progress_slot.h"

namespace dist::sdk {

Distributed init(Backend backend) {
  detail::install_stack_dump();  // where this worker is, when the agent asks (a hang)
  Distributed d;
  if (WorkerEnv::launched_by_dist_launch()) {
    d.env = WorkerEnv::from_environment();
  } else {
    d.own_store = std::make_unique<rendezvous::StoreServerThread>();
    d.env = WorkerEnv::single_process();
    d.env.master_port = d.own_store->port();
  }
  // Keys fresh for each restart attempt: a restarted group never reads the previous one's.
  const std::string prefix =
      "sdk/" + d.env.run_id + "/attempt_" + std::to_string(d.env.restart_count) + "/";
  if (backend == Backend::kNccl) {
    NcclOptions options;
    options.key_prefix = prefix + "nccl";
    options.route_to = d.env.master_addr;  // NCCL_SOCKET_IFNAME, as Gloo chooses its address
    const char* nonblocking = std::getenv("TORCH_NCCL_USE_COMM_NONBLOCKING");  // torch's switch
    options.blocking =
        !(nonblocking && (std::string(nonblocking) == "1" || std::string(nonblocking) == "true"));
    d.group = make_nccl_group(connect_store(d.env), d.env.rank, d.env.world_size, d.env.local_rank,
                              options);
  } else {
    GlooOptions options;
    options.route_to = d.env.master_addr;
    options.key_prefix = prefix + "gloo";
    d.group = make_gloo_group(connect_store(d.env), d.env.rank, d.env.world_size, options);
  }
  return d;
}

}  // namespace dist::sdk
