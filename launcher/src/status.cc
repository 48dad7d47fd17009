#include "dist/launcher/status.h"

#include <CLI/CLI.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>

#include "dist/launcher/cli.h"
#include "dist/rendezvous/client.h"

namespace dist::launcher {

int run_status(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{"dist-launch status: the nodes of a job, read from its rendezvous store",
               "dist-launch status"};
  std::string endpoint, run_id = "none";
  int timeout_s = 10;
  app.add_option("--rdzv-endpoint,--rdzv_endpoint,--master-addr-port", endpoint,
                 "HOST:PORT of the job's store (node 0's --master-addr:--master-port)")
      ->required();
  app.add_option("--rdzv-id,--rdzv_id", run_id, "The job's id")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Seconds to wait for the store")->capture_default_str();
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return kExitUsage;
  }
  const auto colon = endpoint.rfind(':');
  if (colon == std::string::npos) {
    err << "dist-launch status: error: --rdzv-endpoint must be HOST:PORT, got '" << endpoint
        << "'\n";
    return kExitUsage;
  }
  try {
    rendezvous::ClientOptions options;
    options.host = endpoint.substr(0, colon);
    options.port = static_cast<std::uint16_t>(std::stoi(endpoint.substr(colon + 1)));
    options.connect_timeout = std::chrono::seconds(timeout_s);
    options.timeout = std::chrono::seconds(timeout_s);
    auto store = rendezvous::StoreClient::connect(options);

    // The latest round that has join records is the job's current attempt.
    const std::string prefix = "rdzv/" + run_id + "/";
    int round = -1;
    for (const auto& key : store.list_keys()) {
      if (key.rfind(prefix + "r", 0) != 0) continue;
      const auto slash = key.find('/', prefix.size());
      try {
        round =
            std::max(round, std::stoi(key.substr(prefix.size() + 1, slash - prefix.size() - 1)));
      } catch (const std::exception&) {
      }
    }
    if (round < 0) {
      err << "dist-launch status: no job '" << run_id << "' in the store at " << endpoint
          << " (check --rdzv-id)\n";
      return 1;
    }
    const std::string r = prefix + "r" + std::to_string(round) + "/";
    std::map<int, nlohmann::json> nodes;
    for (const auto& key : store.list_keys()) {
      if (key.rfind(r + "node/", 0) == 0) {
        nodes[std::stoi(key.substr(r.size() + 5))] = nlohmann::json::parse(*store.try_get(key));
      }
    }
    const bool healthy = store.check({r + "healthy"});
    const auto done = store.try_get(r + "done");
    out << "job " << run_id << " at " << endpoint << ": attempt " << round << " (restarts so far "
        << round << "), " << nodes.size() << " node(s) joined, "
        << (!healthy ? "FAILED" : (done && std::stoul(*done) >= nodes.size() ? "done" : "running"))
        << "\n";
    out << "node  ranks        workers  alive  host (pid)\n";
    for (const auto& [n, info] : nodes) {
      const auto offset = store.try_get(r + "offset/" + std::to_string(n));
      const int workers = info.value("local_world_size", 0);
      std::string ranks = "-";
      if (offset) {
        const int first = std::stoi(*offset);
        ranks = std::to_string(first) + ".." + std::to_string(first + workers - 1);
      }
      const bool alive = store.check({prefix + "alive/" + std::to_string(n)});
      char line[256];
      std::snprintf(line, sizeof line, "%-5d %-12s %-8d %-6s %s (%d)\n", n, ranks.c_str(), workers,
                    alive ? "yes" : "NO", info.value("host", "?").c_str(), info.value("pid", 0));
      out << line;
    }
    return 0;
  } catch (const std::exception& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace dist::launcher
