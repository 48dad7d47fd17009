// Hosts with names for whole-program tests, over named-hosts.sh: network namespaces, each with its
// own host name, /etc/hosts and addresses on one private bridge. Everything a test starts on them
// is killed and reaped, and the hosts are removed, when the NamedHosts object goes, a failed
// assertion included; hosts a crashed test left behind are swept by the next one.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "process_helpers.h"

namespace dist::testing {

namespace fs = std::filesystem;

class NamedHosts {
 public:
  struct Layout {
    std::vector<std::string> names;
    std::string loopback_self;  // this host maps its own name to 127.0.1.1, as Debian does
    std::string domain;         // every name also resolves as NAME.DOMAIN (Kubernetes' subdomain)
  };

  // Why hosts cannot be made here (not root, no network namespaces), or nullopt when they can.
  static std::optional<std::string> unavailable() {
    const auto [code, output] = agent::testing::run_command(script() + " check");
    if (code == 0) return std::nullopt;
    return output.empty() ? "named-hosts.sh check failed" : output;
  }

  explicit NamedHosts(const Layout& layout) {
    agent::testing::run_command(script() + " sweep");
    static std::atomic<int> counter{0};
    std::ostringstream tag;
    tag << "dlh" << ::getpid() << "-" << counter++ << std::hex << std::random_device{}() % 4096;
    run_ = tag.str();
    std::string command = script() + " up " + run_;
    if (!layout.loopback_self.empty()) command += " --loopback-self " + layout.loopback_self;
    if (!layout.domain.empty()) command += " --domain " + layout.domain;
    for (const auto& name : layout.names) command += " " + name;
    const auto [code, output] = agent::testing::run_command(command);
    if (code != 0) {
      down();
      throw std::runtime_error("cannot make the named hosts: " + output);
    }
  }
  ~NamedHosts() {
    started_.clear();  // each program is killed by PID and reaped
    down();            // then whatever they left on the hosts
  }
  NamedHosts(const NamedHosts&) = delete;
  NamedHosts& operator=(const NamedHosts&) = delete;

  // `program args...` as host `host`, its stdout and stderr in `log`, `env` added.
  agent::testing::Child& start(const std::string& host, const std::string& program,
                               std::vector<std::string> args, const fs::path& log,
                               const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> all{"exec", run_, host, program};
    all.insert(all.end(), args.begin(), args.end());
    started_.push_back(std::make_unique<agent::testing::Child>(script(), all, log, env));
    return *started_.back();
  }

  // A shell command as host `host`, run to its end: its exit code and output.
  std::pair<int, std::string> run(const std::string& host, const std::string& command) const {
    return agent::testing::run_command(script() + " exec " + run_ + " " + host + " sh -c '" +
                                       command + "'");
  }

 private:
  static std::string script() { return NAMED_HOSTS_SCRIPT; }
  void down() { agent::testing::run_command(script() + " down " + run_); }

  std::string run_;
  std::vector<std::unique_ptr<agent::testing::Child>> started_;
};

// A test on named hosts: skips, saying why, where they cannot be made; a fresh directory for files.
class NamedHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto why = NamedHosts::unavailable()) GTEST_SKIP() << *why;
    dir_ = fs::temp_directory_path() /
           ("dist-named-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    hosts_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  NamedHosts& hosts(const NamedHosts::Layout& layout) {
    hosts_ = std::make_unique<NamedHosts>(layout);
    return *hosts_;
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path log(const std::string& name) const { return dir_ / (name + ".log"); }

  // KEY=VALUE lines of a file the test worker's `env` action wrote.
  std::map<std::string, std::string> env(const std::string& file) const {
    std::map<std::string, std::string> e;
    std::ifstream in(path(file));
    for (std::string line; std::getline(in, line);) {
      const auto eq = line.find('=');
      if (eq != std::string::npos) e[line.substr(0, eq)] = line.substr(eq + 1);
    }
    return e;
  }

  // True once `predicate` holds, polling, within `timeout`.
  template <typename Predicate>
  static bool eventually(Predicate predicate, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (!predicate()) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  fs::path dir_;
  std::unique_ptr<NamedHosts> hosts_;
};

}  // namespace dist::testing
