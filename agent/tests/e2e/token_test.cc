// The job's token through the real dist-launch on one node: the agent's store asks for it; the
// workers get a path to it, never the secret; a generated token's file is the owner's alone and
// goes with the job; PyTorch-style clients without it get what --unauthenticated allows, and
// never the agents' keys.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "dist/store/client.h"
#include "dist/store/errors.h"
#include "dist/store/token.h"
#include "process_helpers.h"
#include "programs.h"

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using dist::agent::testing::Child;
using dist::agent::testing::eventually;

const std::string kWorker = DIST_TEST_WORKER_BIN;
constexpr std::chrono::milliseconds kReplyTimeout{10'000};

// A client that speaks torch 1.x's TCPStore protocol (legacy dialect) and cannot authenticate.
class TorchLikeClient {
 public:
  explicit TorchLikeClient(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << std::strerror(errno);
  }
  ~TorchLikeClient() { ::close(fd_); }
  TorchLikeClient(const TorchLikeClient&) = delete;
  TorchLikeClient& operator=(const TorchLikeClient&) = delete;

  // ADD (query 3): the counter's new value, or nullopt when the server closed the connection.
  std::optional<std::int64_t> add(const std::string& key, std::int64_t delta) {
    std::string request(1, '\x03');
    append_string(request, key);
    request.append(reinterpret_cast<const char*>(&delta), sizeof delta);
    std::int64_t value = 0;
    if (!exchange(request, &value, sizeof value)) return std::nullopt;
    return value;
  }
  // GET (query 2): nullopt when the server closed the connection.
  std::optional<std::string> get(const std::string& key) {
    std::string request(1, '\x02');
    append_string(request, key);
    std::uint64_t size = 0;
    if (!exchange(request, &size, sizeof size)) return std::nullopt;
    std::string value(size, '\0');
    if (!read_exact(value.data(), value.size())) return std::nullopt;
    return value;
  }

 private:
  static void append_string(std::string& out, const std::string& s) {
    const std::uint64_t n = s.size();
    out.append(reinterpret_cast<const char*>(&n), sizeof n);
    out += s;
  }
  bool exchange(const std::string& request, void* reply, std::size_t n) {
    if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      return false;
    }
    return read_exact(reply, n);
  }
  bool read_exact(void* out, std::size_t n) {
    auto* p = static_cast<char*>(out);
    while (n > 0) {
      pollfd pfd{fd_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(kReplyTimeout.count())) != 1) {
        ADD_FAILURE() << "no reply and no close within " << kReplyTimeout.count() << " ms";
        return false;
      }
      const ssize_t got = ::recv(fd_, p, n, 0);
      if (got <= 0) return false;  // closed by the server
      p += got;
      n -= static_cast<std::size_t>(got);
    }
    return true;
  }
  int fd_ = -1;
};

class TokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dist-token-agent-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // A job of `nproc` workers that write their environment, then wait for the file "go".
  std::unique_ptr<Child> start(std::vector<std::string> options, int nproc = 1) {
    std::vector<std::string> args{"--nproc-per-node", std::to_string(nproc)};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), {"--no-python", kWorker, "env", path("env_${local_rank}"), "wait-file",
                             path("go")});
    return std::make_unique<Child>(DIST_LAUNCH_BIN, args, dir_ / "launch.log");
  }
  // The workers' environment, once every one of them wrote it.
  std::vector<std::map<std::string, std::string>> worker_envs(const Child& launch, int nproc) {
    std::vector<std::map<std::string, std::string>> envs;
    const bool written = eventually(
        [&] {
          for (int r = 0; r < nproc; ++r) {
            if (!fs::exists(path("env_" + std::to_string(r)))) return false;
          }
          return true;
        },
        60s);
    EXPECT_TRUE(written) << launch.output();
    for (int r = 0; r < nproc; ++r) {
      std::map<std::string, std::string> env;
      std::ifstream in(path("env_" + std::to_string(r)));
      for (std::string line; std::getline(in, line);) {
        const auto eq = line.find('=');
        if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
      }
      envs.push_back(std::move(env));
    }
    return envs;
  }
  void finish(Child& launch) {
    std::ofstream(path("go")) << "go\n";
    EXPECT_EQ(launch.wait(60s), 0) << launch.output();
  }
  static dist::store::ClientOptions client(const std::string& port, std::string secret) {
    dist::store::ClientOptions o;
    o.port = static_cast<std::uint16_t>(std::stoi(port));
    o.secret = std::move(secret);
    o.connect_timeout = 10s;
    o.timeout = 10s;
    return o;
  }

  fs::path dir_;
};

TEST_F(TokenTest, AGeneratedTokenReachesTheWorkersAsAFileOfTheirOwnerAlone) {
  auto launch = start({"--generate-token", "--unauthenticated", "deny"}, 2);
  const auto envs = worker_envs(*launch, 2);
  ASSERT_EQ(envs.size(), 2u);
  const std::string token_file = envs[0].at(dist::store::kTokenFileVariable);
  EXPECT_EQ(envs[1].at(dist::store::kTokenFileVariable), token_file);
  struct stat st {};
  ASSERT_EQ(::stat(token_file.c_str(), &st), 0) << token_file;
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  const std::string secret = dist::store::read_secret_file(token_file);
  EXPECT_EQ(secret.size(), 64u);
  for (const auto& env : envs) {  // the secret itself is in no worker's environment
    for (const auto& [name, value] : env) {
      EXPECT_EQ(value.find(secret), std::string::npos) << name;
    }
  }

  // The agent's store asks for it, and under deny admits nobody without it.
  const std::string port = envs[0].at("MASTER_PORT");
  try {
    dist::store::StoreClient::connect(client(port, ""));
    ADD_FAILURE() << "a client without the token must be refused";
  } catch (const dist::store::StoreError& e) {
    EXPECT_EQ(e.code(), dist::store::StoreErrc::kUnauthenticated) << e.what();
  }
  TorchLikeClient stranger(std::stoi(port));
  EXPECT_EQ(stranger.add("job/counter", 1), std::nullopt);
  auto member = dist::store::StoreClient::connect(client(port, secret));
  EXPECT_EQ(member.add("job/counter", 1), 1);

  finish(*launch);
  EXPECT_FALSE(fs::exists(token_file)) << "the generated token outlived the job";
}

TEST_F(TokenTest, AGivenTokenFileIsTheWorkersAndStays) {
  const std::string token = path("token");
  dist::store::write_secret_file(token, "given-token");
  auto launch = start({"--token-file", token});
  const auto envs = worker_envs(*launch, 1);
  ASSERT_EQ(envs.size(), 1u);
  EXPECT_EQ(envs[0].at(dist::store::kTokenFileVariable), token);
  auto member = dist::store::StoreClient::connect(client(envs[0].at("MASTER_PORT"), "given-token"));
  EXPECT_EQ(member.add("job/counter", 2), 2);
  finish(*launch);
  EXPECT_EQ(dist::store::read_secret_file(token), "given-token");
}

TEST_F(TokenTest, NoTokenNoVariable) {
  auto launch = start({});
  const auto envs = worker_envs(*launch, 1);
  ASSERT_EQ(envs.size(), 1u);
  EXPECT_FALSE(envs[0].contains(dist::store::kTokenFileVariable));
  finish(*launch);
}

// The default policy (known-hosts) admits this machine's PyTorch workers without the token, to the
// workers' keys only: the agents' keys (rdzv/) close the connection.
TEST_F(TokenTest, LocalClientsWithoutTheTokenGetTheWorkersKeysOnly) {
  auto launch = start({"--generate-token"});
  const auto envs = worker_envs(*launch, 1);
  ASSERT_EQ(envs.size(), 1u);
  const int port = std::stoi(envs[0].at("MASTER_PORT"));
  {
    TorchLikeClient worker(port);
    EXPECT_EQ(worker.add("torchelastic/counter", 5), 5);
    EXPECT_EQ(worker.get("torchelastic/counter"), "5");
  }
  auto agent_like = dist::store::StoreClient::connect(
      client(envs[0].at("MASTER_PORT"),
             dist::store::read_secret_file(envs[0].at(dist::store::kTokenFileVariable))));
  agent_like.set("rdzv/none/round", "7");
  TorchLikeClient reader(port);
  EXPECT_EQ(reader.get("rdzv/none/round"), std::nullopt);  // exists, yet closed
  TorchLikeClient writer(port);
  EXPECT_EQ(writer.add("rdzv/none/round", 1), std::nullopt);
  EXPECT_EQ(agent_like.get("rdzv/none/round"), "7");
  finish(*launch);
}

}  // namespace
