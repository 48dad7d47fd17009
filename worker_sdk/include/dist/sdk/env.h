// What dist-launch tells a worker, read from the environment, and the way to the agent's store.
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "dist/contract/worker_contract.h"
#include "dist/store/client.h"

namespace dist::sdk {

// A worker's environment is missing or wrong: the message names the variable and what to do.
class EnvironmentError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WorkerEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int restart_count = 0;  // TORCHELASTIC_RESTART_COUNT: which attempt this is
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 0;
  std::string run_id = "none";
  // The job's token file (DIST_LAUNCH_TOKEN_FILE, set when the job has a token): connect_store
  // authenticates with what it holds. Empty: the store asks for none.
  std::string token_file;
  // dist-launch --restart-policy in-place (DIST_LAUNCH_RESTART_POLICY): a failed worker is
  // replaced alone while the others rebuild their group (recovery.h).
  bool in_place = false;
  // The generation of the group this worker is in: DIST_LAUNCH_GENERATION at start, 0 for the
  // workers the group started with and g for a worker started as generation g's replacement (it
  // has no state yet: recovery.h gives it a survivor's); InPlaceRecovery advances it.
  int generation = 0;
  // How long an in-place recovery may take (--in-place-timeout, DIST_LAUNCH_IN_PLACE_TIMEOUT_MS):
  // the agent restarts the group past it, so a worker waits no longer for a generation's group.
  std::chrono::milliseconds in_place_timeout = worker_contract::kDefaultInPlaceTimeout;

  // Reads RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
  // TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID, DIST_LAUNCH_TOKEN_FILE,
  // DIST_LAUNCH_RESTART_POLICY, DIST_LAUNCH_GENERATION and DIST_LAUNCH_IN_PLACE_TIMEOUT_MS. Throws
  // EnvironmentError when one is missing or malformed, or when the ranks are inconsistent.
  static WorkerEnv from_environment();

  // Rank 0 of a world of 1, for running a worker without dist-launch: the caller hosts a store
  // itself (store::StoreServerThread) and sets master_port to it.
  static WorkerEnv single_process();

  // True when the variables dist-launch sets are present (RANK and WORLD_SIZE).
  static bool launched_by_dist_launch();
};

// Connects to the agent's store at MASTER_ADDR:MASTER_PORT (retrying until `timeout`), with the
// job's token when env.token_file names one. Throws EnvironmentError when that file cannot be
// read (naming it and the variable), store::StoreError when the store cannot be used.
store::StoreClient connect_store(const WorkerEnv& env,
                                 std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace dist::sdk
