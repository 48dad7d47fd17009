#include "etcd_cluster.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <thread>

namespace dist::store::testing {
namespace {

// A loaded 2-core machine: etcd takes about 1 s (one member) to 2.5 s (three) when idle.
constexpr std::chrono::milliseconds kStartTimeout{60'000};
constexpr std::chrono::milliseconds kPollInterval{20};
constexpr int kStartAttempts = 3;  // a port taken between free_port() and etcd's bind
constexpr int kHttpTimeoutMs = 2'000;

int free_port(const std::string& ip) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("etcd cluster: no free port on " + ip);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// GET over plain HTTP/1.0 with a timeout; nullopt when the member does not answer.
std::optional<std::string> http_get(const std::string& ip, int port, const std::string& path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{kHttpTimeoutMs / 1000, (kHttpTimeoutMs % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, ip.c_str(), &a.sin_addr);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + ip + "\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[8192];
      ssize_t n;
      while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) response.append(buffer, n);
    }
  }
  ::close(fd);
  if (response.empty()) return std::nullopt;
  return response;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (const char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// Runs a shell command; its output (stdout and stderr), or throws with it when it fails.
std::string run_or_throw(const std::string& command) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run: " + command);
  std::string out;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, pipe)) out += buffer;
  const int status = ::pclose(pipe);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("'" + command + "' failed: " + out);
  }
  return out;
}

}  // namespace

TestPki make_test_pki(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const auto path = [&](const char* name) { return (dir / name).string(); };
  TestPki pki{path("ca.crt"),          path("server.crt"), path("server.key"),
              path("client.crt"),      path("client.key"), path("named-client.crt"),
              path("named-client.key")};
  const std::string key_options = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  run_or_throw("openssl req -x509 " + key_options + " -keyout " + path("ca.key") + " -out " +
               pki.ca_cert + " -days 2 -subj /CN=dist-launch-test-ca");
  std::ofstream(path("server.ext"))
      << "subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost\n"
      << "extendedKeyUsage=serverAuth,clientAuth\n";
  std::ofstream(path("client.ext")) << "extendedKeyUsage=clientAuth\n";
  const auto issue = [&](const std::string& name, const std::string& subject,
                         const std::string& ext) {
    run_or_throw("openssl req " + key_options + " -keyout " + path((name + ".key").c_str()) +
                 " -out " + path((name + ".csr").c_str()) + " -subj " + subject);
    run_or_throw("openssl x509 -req -in " + path((name + ".csr").c_str()) + " -CA " + pki.ca_cert +
                 " -CAkey " + path("ca.key") + " -CAcreateserial -days 2 -out " +
                 path((name + ".crt").c_str()) + " -extfile " + path(ext.c_str()));
  };
  issue("server", "/CN=dist-launch-server", "server.ext");
  issue("client", "/O=dist-launch-client", "client.ext");
  issue("named-client", "/CN=root", "client.ext");
  return pki;
}

EtcdCluster::EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)) {
  if (options_.members < 1 || options_.members > 3) {
    throw std::invalid_argument("etcd cluster: 1 to 3 members");
  }
  std::string pattern = (std::filesystem::temp_directory_path() / "dist-etcd-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("etcd cluster: mkdtemp failed");
  dir_ = pattern;
  // etcd takes no port 0: the ports are found free, then given to it, and another process may
  // bind one in between (seen in CI: "bind: address already in use"). Then the cluster starts
  // again on other ports, a few times.
  for (int attempt = 1;; ++attempt) {
    members_.clear();
    std::string initial_cluster;
    for (int i = 0; i < options_.members; ++i) {
      Member m;
      m.name = "m" + std::to_string(i + 1);
      m.ip = "127.0.0." + std::to_string(i + 1);
      m.client_port = free_port(m.ip);
      m.peer_port = free_port(m.ip);
      m.metrics_port = free_port(m.ip);
      m.log = dir_ / (m.name + ".log");
      initial_cluster +=
          (i ? "," : "") + m.name + "=http://" + m.ip + ":" + std::to_string(m.peer_port);
      members_.push_back(std::move(m));
    }
    try {
      for (auto& m : members_) start(m, initial_cluster);
      wait_healthy(kStartTimeout);
      return;
    } catch (const std::exception& e) {
      for (int i = 0; i < size(); ++i) kill(i);
      const bool port_taken =
          std::string_view(e.what()).find("address already in use") != std::string_view::npos;
      if (port_taken && attempt < kStartAttempts) {
        for (const auto& m : members_) std::filesystem::remove_all(dir_ / m.name);
        continue;
      }
      std::filesystem::remove_all(dir_);
      throw;
    }
  }
}

EtcdCluster::~EtcdCluster() {
  for (int i = 0; i < size(); ++i) kill(i);
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void EtcdCluster::start(Member& m, const std::string& initial_cluster) {
  const std::string scheme = options_.tls ? "https://" : "http://";
  const std::string client_url = scheme + m.ip + ":" + std::to_string(m.client_port);
  const std::string peer_url = "http://" + m.ip + ":" + std::to_string(m.peer_port);
  std::vector<std::string> args{
      "etcd",
      "--name=" + m.name,
      "--data-dir=" + (dir_ / m.name).string(),
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--listen-metrics-urls=http://" + m.ip + ":" + std::to_string(m.metrics_port),
      "--initial-cluster=" + initial_cluster,
      "--initial-cluster-state=new",
      "--initial-cluster-token=" + dir_.filename().string(),
      "--logger=zap"};
  if (options_.tls) {
    args.push_back("--cert-file=" + options_.tls->server_cert);
    args.push_back("--key-file=" + options_.tls->server_key);
    args.push_back("--trusted-ca-file=" + options_.tls->ca_cert);
    args.push_back("--client-cert-auth");
  }
  for (const auto& a : options_.extra_args) args.push_back(a);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("etcd cluster: fork failed");
  if (pid == 0) {
    const int fd = ::open(m.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("etcd", argv.data());
    ::_exit(127);
  }
  m.pid = pid;
}

void EtcdCluster::wait_healthy(std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (auto& m : members_) {
    for (;;) {
      int status = 0;
      if (::waitpid(m.pid, &status, WNOHANG) == m.pid) {
        m.pid = -1;
        throw std::runtime_error("etcd member " + m.name +
                                 " exited while starting: " + log_tail(m));
      }
      const auto health = http_get(m.ip, m.metrics_port, "/health");
      if (health && health->find("\"health\":\"true\"") != std::string::npos) break;
      if (std::chrono::steady_clock::now() >= end) {
        throw std::runtime_error("etcd member " + m.name + " not healthy in time: " + log_tail(m));
      }
      std::this_thread::sleep_for(kPollInterval);
    }
  }
}

std::string EtcdCluster::log_tail(const Member& m) const {
  std::ifstream in(m.log);
  std::stringstream s;
  s << in.rdbuf();
  const auto text = s.str();
  return text.size() > 4000 ? text.substr(text.size() - 4000) : text;
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}

std::string EtcdCluster::endpoint(int member) const {
  const auto& m = members_[member];
  return (options_.tls ? "https://" : "") + m.ip + ":" + std::to_string(m.client_port);
}

std::string EtcdCluster::endpoint_list() const {
  std::string out;
  for (const auto& e : endpoints()) out += (out.empty() ? "" : ",") + e;
  return out;
}

int EtcdCluster::leader(std::chrono::milliseconds timeout) const {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (int i = 0; i < size(); ++i) {
      if (!alive(i)) continue;
      const auto metrics = http_get(members_[i].ip, members_[i].metrics_port, "/metrics");
      if (metrics && metrics->find("\netcd_server_is_leader 1") != std::string::npos) return i;
    }
    if (std::chrono::steady_clock::now() >= end) {
      throw std::runtime_error("etcd cluster: no leader elected in time");
    }
    std::this_thread::sleep_for(kPollInterval);
  }
}

void EtcdCluster::kill(int member) {
  auto& m = members_[member];
  if (m.pid <= 0) return;
  ::kill(m.pid, SIGKILL);
  ::waitpid(m.pid, nullptr, 0);
  m.pid = -1;
}

std::string EtcdCluster::etcdctl(const std::vector<std::string>& args) const {
  std::string endpoints;
  for (int i = 0; i < size(); ++i) {
    if (alive(i)) endpoints += (endpoints.empty() ? "" : ",") + endpoint(i);
  }
  std::string command = "ETCDCTL_API=3 etcdctl --endpoints=" + shell_quote(endpoints);
  if (options_.tls) {
    command += " --cacert=" + shell_quote(options_.tls->ca_cert) +
               " --cert=" + shell_quote(options_.tls->client_cert) +
               " --key=" + shell_quote(options_.tls->client_key);
  }
  for (const auto& a : args) command += " " + shell_quote(a);
  return run_or_throw(command);
}

}  // namespace dist::store::testing
