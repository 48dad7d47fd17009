// A worker finds the job's token through DIST_LAUNCH_TOKEN_FILE (a path; dist-launch never puts the
// secret in an environment) and connects to a store that asks for it; a token file it cannot use
// is an EnvironmentError that names the variable and the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "dist/sdk/env.h"
#include "dist/store/server.h"
#include "dist/store/token.h"

namespace dist::sdk {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class SdkToken : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-sdk-token-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    token_ = (dir_ / "token").string();
    store::write_secret_file(token_, "job-token");
  }
  void TearDown() override {
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) {
      ::unsetenv(name);
    }
    ::unsetenv(store::kTokenFileVariable);
    fs::remove_all(dir_);
  }
  static store::ServerOptions asking_for(const std::string& secret) {
    store::ServerOptions o;
    o.secret = secret;
    o.unauthenticated = store::UnauthenticatedPolicy::kDeny;
    return o;
  }
  WorkerEnv env_for(std::uint16_t port) const {
    WorkerEnv env = WorkerEnv::single_process();
    env.master_port = port;
    return env;
  }
  fs::path dir_;
  std::string token_;
};

TEST_F(SdkToken, TheTokenFileComesFromTheEnvironmentAndOpensTheStore) {
  for (const auto& [name, value] : std::map<std::string, std::string>{{"RANK", "0"},
                                                                      {"LOCAL_RANK", "0"},
                                                                      {"WORLD_SIZE", "1"},
                                                                      {"LOCAL_WORLD_SIZE", "1"},
                                                                      {"MASTER_ADDR", "127.0.0.1"},
                                                                      {"MASTER_PORT", "29500"}}) {
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ::setenv(store::kTokenFileVariable, token_.c_str(), 1);
  EXPECT_EQ(WorkerEnv::from_environment().token_file, token_);
  ::unsetenv(store::kTokenFileVariable);
  EXPECT_EQ(WorkerEnv::from_environment().token_file, "");

  store::StoreServerThread server("127.0.0.1", 0, asking_for("job-token"));
  WorkerEnv env = env_for(server.port());
  env.token_file = token_;
  auto store = connect_store(env, 5s);
  store.set("sdk/k", "v");
  EXPECT_EQ(store.get("sdk/k"), "v");
  env.token_file.clear();  // the store asks for the token: without it, a typed refusal
  try {
    connect_store(env, 5s);
    ADD_FAILURE() << "a worker without the token must be refused";
  } catch (const store::StoreError& e) {
    EXPECT_EQ(e.code(), store::StoreErrc::kUnauthenticated) << e.what();
  }
}

TEST_F(SdkToken, AnUnusableTokenFileIsAnEnvironmentErrorNamingTheVariableAndTheFile) {
  store::StoreServerThread server("127.0.0.1", 0, asking_for("job-token"));
  WorkerEnv env = env_for(server.port());
  env.token_file = (dir_ / "missing").string();
  try {
    connect_store(env, 5s);
    ADD_FAILURE() << "a missing token file must be an error";
  } catch (const EnvironmentError& e) {
    EXPECT_NE(std::string(e.what()).find(store::kTokenFileVariable), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(env.token_file), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace dist::sdk
