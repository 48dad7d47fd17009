// A real etcd cluster for tests and benchmarks: Debian's etcd 3.4, members on 127.0.0.1, .2 and
// .3 with ports the kernel handed out, data in a temporary directory, started and stopped by the
// PIDs recorded here, healthy when its own /health says so (polled, never slept on).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dist::store::testing {

// A CA, a certificate for the members (127.0.0.1-3 and localhost) and two for clients, made with
// the openssl program. etcd's JSON gateway refuses client certificates with a Common Name once
// authentication is on, so the first has none; the second has one.
struct TestPki {
  std::string ca_cert;
  std::string server_cert;
  std::string server_key;
  std::string client_cert;
  std::string client_key;
  std::string named_client_cert;
  std::string named_client_key;
};
TestPki make_test_pki(const std::filesystem::path& dir);

struct EtcdClusterOptions {
  int members = 1;  // 1 to 3
  // Serve clients over TLS with these certificates, and ask them for theirs.
  std::optional<TestPki> tls;
  std::vector<std::string> extra_args;  // for every member
};

class EtcdCluster {
 public:
  // Starts the members and returns once every one is healthy; throws std::runtime_error (with
  // the failing member's log) otherwise.
  explicit EtcdCluster(EtcdClusterOptions options);
  explicit EtcdCluster(int members = 1) : EtcdCluster(with_members(members)) {}
  // Kills and reaps the members, removes the data.
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // Client URLs as a client takes them: "127.0.0.1:port", "https://..." with TLS.
  std::vector<std::string> endpoints() const;
  std::string endpoint_list() const;  // comma-separated
  std::string endpoint(int member) const;

  // The member that leads now; waits (polling the members' metrics) for one to be elected.
  int leader(std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;
  // SIGKILL, then reaped.
  void kill(int member);
  bool alive(int member) const { return members_[member].pid > 0; }
  pid_t pid(int member) const { return members_[member].pid; }

  // Runs etcdctl (v3 API) against the live members; its output. Throws when it fails.
  std::string etcdctl(const std::vector<std::string>& args) const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  struct Member {
    std::string name;
    std::string ip;
    int client_port = 0;
    int peer_port = 0;
    int metrics_port = 0;  // plain HTTP /health and /metrics, with or without TLS for clients
    pid_t pid = -1;
    std::filesystem::path log;
  };

  static EtcdClusterOptions with_members(int members) {
    EtcdClusterOptions o;
    o.members = members;
    return o;
  }
  void start(Member& member, const std::string& initial_cluster);
  void wait_healthy(std::chrono::milliseconds timeout);
  std::string log_tail(const Member& member) const;

  EtcdClusterOptions options_;
  std::filesystem::path dir_;
  std::vector<Member> members_;
};

}  // namespace dist::store::testing
