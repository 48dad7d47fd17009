#include "dist/launcher/status.h"

#include <CLI/CLI.hpp>
#include <chrono>
#include <ostream>

#include "dist/agent/job_status.h"
#include "dist/launcher/cli.h"
#include "dist/rendezvous/client.h"
#include "dist/rendezvous/endpoint.h"
#include "dist/rendezvous/token.h"

namespace dist::launcher {

int run_status(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  CLI::App app{"dist-launch status: the nodes of a job, read from its rendezvous store",
               "dist-launch status"};
  std::string endpoint, run_id = "none", token_file;
  int timeout_s = 10;
  bool json = false;
  app.add_option("--rdzv-endpoint,--rdzv_endpoint,--master-addr-port", endpoint,
                 "HOST:PORT of the job's store (static: node 0's --master-addr:--master-port)")
      ->required();
  app.add_option("--rdzv-id,--rdzv_id", run_id, "The job's id")->capture_default_str();
  app.add_option("--timeout", timeout_s, "Seconds to wait for the store")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_flag("--json", json, "One JSON object instead of the table");
  app.add_option("--token-file", token_file, "The job's token file, when the job has one")
      ->envname(rendezvous::kTokenFileVariable);
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
  rendezvous::ClientOptions options;
  try {
    const rendezvous::Endpoint store = rendezvous::parse_endpoint(endpoint);
    options.host = store.host;
    options.port = store.port;
  } catch (const rendezvous::EndpointError&) {
    err << "dist-launch status: error: --rdzv-endpoint must be HOST:PORT, got '" << endpoint
        << "'\n";
    return kExitUsage;
  }
  options.connect_timeout = std::chrono::seconds(timeout_s);
  options.timeout = std::chrono::seconds(timeout_s);
  try {
    if (!token_file.empty()) options.secret = rendezvous::read_secret_file(token_file);
  } catch (const rendezvous::StoreError& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return kExitUsage;
  }
  std::optional<agent::JobStatus> status;
  try {
    status = agent::read_job_status(options, run_id);
  } catch (const std::exception& e) {
    err << "dist-launch status: error: " << e.what() << "\n";
    return 1;
  }
  if (!status) {
    err << "dist-launch status: no job '" << run_id << "' in the store at " << endpoint
        << " (check --rdzv-id)\n";
    return 1;
  }
  out << (json ? agent::to_json(*status) + "\n" : agent::format_table(*status));
  return kExitOk;
}

}  // namespace dist::launcher
