#include "dist/launcher/hosts.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>

#include "config_from_options.h"
#include "dist/store/endpoint.h"
#include "hosts_options.h"
#include "options.h"

extern char** environ;

namespace dist::launcher {
namespace {

// Always exported when set: the interpreter the workers run, and the agents' log level.
constexpr const char* kAlwaysExported[] = {"PYTHON_EXEC", "LOGLEVEL"};

// Options of this command that are the launcher's alone, and options whose value the launcher sets
// for every agent itself: none of them is passed on to the agents as given. Each takes one value.
const std::set<std::string> kNotForwarded = {"--hosts",
                                             "--hostfile",
                                             "--include",
                                             "--exclude",
                                             "--ssh",
                                             "--ssh-port",
                                             "--ssh-config",
                                             "--ssh-option",
                                             "--export",
                                             "--export-prefix",
                                             "--remote-dist-launch",
                                             "--rdzv-id",
                                             "--rdzv_id",
                                             "--rdzv-conf",
                                             "--rdzv_conf",
                                             "--master-addr",
                                             "--master_addr",
                                             "--master-port",
                                             "--master_port",
                                             "--rdzv-backend",
                                             "--rdzv_backend",
                                             "--token-file",  // the token goes on the agents' stdin
                                             "--token_file",
                                             "--unauthenticated"};
// Flags (no value) of the same kind.
const std::set<std::string> kFlagsNotForwarded = {"--generate-token", "--generate_token"};

// Options that contradict --hosts, and why.
const std::map<std::string, std::string> kConflicting = {
    {"--nnodes", "the hosts are the nodes"},
    {"--node-rank", "each host's node rank is its place in the list"},
    {"--rdzv-endpoint",
     "this command hosts the job's store (--master-port chooses its port, --master-addr how the "
     "hosts reach it)"},
    {"--standalone", "the job runs on the hosts listed"},
    {"--local-addr", "each host publishes its own address"}};

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r") - first + 1);
}

int parse_count(const std::string& text, const std::string& what) {
  int value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < 0) {
    throw HostsError(what + ": '" + text + "' is not a number");
  }
  return value;
}

// "host", "host:N", "[v6]:N", "v6" (several ':' and no brackets: an address, no count).
std::pair<std::string, std::optional<std::string>> split_host(const std::string& entry) {
  try {
    auto [host, count] = store::split_host(entry);
    return {std::move(host), std::move(count)};
  } catch (const store::EndpointError& e) {
    throw HostsError(e.what());
  }
}

void check_name(const std::string& host, const std::string& where) {
  if (host.empty()) throw HostsError(where + ": a host without a name");
  if (host.front() == '-' || host.find_first_of(" \t'\"") != std::string::npos) {
    throw HostsError(where + ": '" + host + "' is not a host name");
  }
}

void add_host(std::vector<JobHost>& hosts, JobHost host, const std::string& where) {
  check_name(host.name, where);
  if (host.slots == 0) {
    throw HostsError(where + ": host " + host.name +
                     " has 0 slots (give it at least 1, or leave "
                     "it out)");
  }
  for (const auto& h : hosts) {
    if (h.name == host.name) {
      throw HostsError(where + ": host " + host.name +
                       " is listed twice (list each host once, "
                       "with all its slots)");
    }
  }
  hosts.push_back(std::move(host));
}

// One --include / --exclude entry: a host, and the slots it names (none: the whole host).
struct Choice {
  std::string host;
  std::set<int> slots;
};

std::vector<Choice> parse_choices(const std::string& flag, const std::string& text) {
  std::vector<Choice> choices;
  std::stringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, '@')) {
    const auto [host, slots] = split_host(trim(entry));
    Choice choice{host, {}};
    check_name(host, flag);
    if (slots) {
      std::stringstream items(*slots);
      std::string item;
      while (std::getline(items, item, ',')) {
        choice.slots.insert(parse_count(item, flag + " " + host + " slot"));
      }
      if (choice.slots.empty()) throw HostsError(flag + " " + host + ": no slot after ':'");
    }
    choices.push_back(std::move(choice));
  }
  if (choices.empty()) throw HostsError(flag + " names no host");
  return choices;
}

bool is_option(const std::string& arg, const std::set<std::string>& names) {
  return names.contains(arg.substr(0, arg.find('=')));
}

// The command line's options, less the launcher's own and those it sets per agent.
std::vector<std::string> forwarded_options(const std::vector<std::string>& args,
                                           std::size_t script_at) {
  std::vector<std::string> options;
  for (std::size_t i = 0; i < script_at; ++i) {
    const std::string& arg = args[i];
    if (arg == "--" || is_option(arg, kFlagsNotForwarded)) continue;
    if (is_option(arg, kNotForwarded)) {
      if (arg.find('=') == std::string::npos) ++i;  // and its value
      continue;
    }
    options.push_back(arg);
  }
  return options;
}

std::map<std::string, std::string> exported_environment(const HostsFlags& flags) {
  std::map<std::string, std::string> env;
  for (const char* name : kAlwaysExported) {
    if (const char* value = std::getenv(name)) env[name] = value;
  }
  for (const auto& item : flags.exports) {
    const auto eq = item.find('=');
    const std::string name = item.substr(0, eq);
    if (name.empty()) throw HostsError("--export '" + item + "': no variable name");
    if (eq != std::string::npos) {
      env[name] = item.substr(eq + 1);
      continue;
    }
    const char* value = std::getenv(name.c_str());
    if (!value) {
      throw HostsError("--export " + name + ": " + name +
                       " is not set here (set it, or give "
                       "--export " +
                       name + "=VALUE)");
    }
    env[name] = value;
  }
  for (const auto& prefix : flags.export_prefixes) {
    if (prefix.empty()) throw HostsError("--export-prefix needs a prefix, e.g. NCCL_");
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      const auto eq = entry.find('=');
      if (eq != std::string::npos && entry.starts_with(prefix)) {
        env[entry.substr(0, eq)] = entry.substr(eq + 1);
      }
    }
  }
  return env;
}

std::vector<JobHost> read_hosts(const HostsFlags& flags) {
  if (!flags.hosts.empty() && !flags.hostfile.empty()) {
    throw HostsError("give --hosts or --hostfile, not both");
  }
  if (!flags.hosts.empty()) return parse_host_list(flags.hosts);
  std::ifstream in(flags.hostfile);
  if (!in) {
    throw HostsError("--hostfile " + flags.hostfile + ": cannot read it (" + std::strerror(errno) +
                     ")");
  }
  return parse_hostfile(in, flags.hostfile);
}

}  // namespace

std::vector<JobHost> parse_host_list(const std::string& text) {
  std::vector<JobHost> hosts;
  std::stringstream entries(text);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry = trim(entry);
    if (entry.empty()) throw HostsError("--hosts '" + text + "': an empty entry");
    const auto [name, slots] = split_host(entry);
    add_host(hosts, {name, slots ? parse_count(*slots, "--hosts " + name + " slots") : 1, {}},
             "--hosts");
  }
  if (hosts.empty()) throw HostsError("--hosts names no host (e.g. --hosts a:2,b:2)");
  return hosts;
}

std::vector<JobHost> parse_hostfile(std::istream& in, const std::string& path) {
  std::vector<JobHost> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string where = "--hostfile " + path + " line " + std::to_string(number);
    std::stringstream words(trim(line.substr(0, line.find('#'))));
    JobHost host;
    if (!(words >> host.name)) continue;  // blank, or a comment
    std::string word;
    while (words >> word) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots")) {
        throw HostsError(where + ": '" + word + "' is not understood (a line is `host slots=N`)");
      }
      const int value = parse_count(word.substr(eq + 1), where + " " + key);
      if (key == "slots") host.slots = value;
    }
    add_host(hosts, std::move(host), where);
  }
  if (hosts.empty()) throw HostsError("--hostfile " + path + " lists no host");
  return hosts;
}

std::vector<JobHost> select_hosts(std::vector<JobHost> hosts, const std::string& include,
                                  const std::string& exclude) {
  if (include.empty() && exclude.empty()) return hosts;
  if (!include.empty() && !exclude.empty())
    throw HostsError("give --include or --exclude, not both");
  const bool including = !include.empty();
  const std::string flag = including ? "--include" : "--exclude";
  std::map<std::string, std::set<int>> chosen;
  for (auto& choice : parse_choices(flag, including ? include : exclude)) {
    const auto host = std::find_if(hosts.begin(), hosts.end(),
                                   [&](const JobHost& h) { return h.name == choice.host; });
    if (host == hosts.end()) throw HostsError(flag + ": host " + choice.host + " is not listed");
    for (int slot : choice.slots) {
      if (slot >= host->slots) {
        throw HostsError(flag + ": host " + choice.host + " has slots 0 to " +
                         std::to_string(host->slots - 1) + ", not " + std::to_string(slot));
      }
    }
    if (chosen.contains(choice.host)) throw HostsError(flag + ": host " + choice.host + " twice");
    chosen[choice.host] = std::move(choice.slots);
  }
  std::vector<JobHost> selected;
  for (auto& host : hosts) {
    const auto it = chosen.find(host.name);
    if (it == chosen.end()) {  // not named: out of an include, kept by an exclude
      if (!including) selected.push_back(std::move(host));
      continue;
    }
    const std::set<int>& slots = it->second;
    if (including) {
      host.devices.assign(slots.begin(), slots.end());
      selected.push_back(std::move(host));
      continue;
    }
    if (slots.empty()) continue;  // the whole host excluded
    for (int slot = 0; slot < host.slots; ++slot) {
      if (!slots.contains(slot)) host.devices.push_back(slot);
    }
    if (!host.devices.empty()) selected.push_back(std::move(host));
  }
  if (selected.empty())
    throw HostsError(flag + " " + (including ? include : exclude) + " leaves no host to run on");
  return selected;
}

void add_hosts_options(CommandLine& app, HostsFlags& flags) {
  app.text("--hosts", flags.hosts,
           "Run on these hosts, HOST:SLOTS,... (slots: workers per host, unless "
           "--nproc-per-node); this host, if listed, runs its agent without ssh");
  app.text("--hostfile", flags.hostfile,
           "Hosts from a file of `host slots=N` lines (deepspeed's, mpirun's)");
  app.text("--include", flags.include,
           "Only these hosts (or slots: device indices), deepspeed's form: a:0,1@b");
  app.text("--exclude", flags.exclude, "Not these hosts (or slots), e.g. a:1@c");
  app.text("--ssh", flags.ssh_program, "The ssh client to run").show_default();
  app.number("--ssh-port", flags.ssh_port, 1, 65535, "ssh -p PORT for every host");
  app.text("--ssh-config", flags.ssh_config, "ssh -F FILE (default: ~/.ssh/config)");
  app.list("--ssh-option", flags.ssh_options, "ssh -o OPTION (ControlMaster=auto, User=..., ...)");
  app.list("--export", flags.exports,
           "Pass VAR (or VAR=VALUE) to every host's agent and workers (mpirun -x); PYTHON_EXEC "
           "and LOGLEVEL always are");
  app.list("--export-prefix", flags.export_prefixes,
           "Pass every variable starting with PREFIX (e.g. NCCL_)");
  app.text("--remote-dist-launch", flags.remote_dist_launch,
           "dist-launch on the other hosts: a name on their PATH, or a path")
      .show_default();
}

HostsJobConfig hosts_job_config(const RawOptions& raw, const agent::LaunchConfig& parsed) {
  const HostsFlags& flags = raw.hosts;
  for (const auto& [name, why] : kConflicting) {
    if (raw.was_given(name)) throw HostsError(name + " does not go with --hosts: " + why);
  }
  if (raw.was_given("--rdzv-backend") && raw.rdzv_backend != "static") {
    throw HostsError("--rdzv-backend " + raw.rdzv_backend +
                     " does not go with --hosts: the hosts meet at this command's store");
  }
  HostsJobConfig c;
  c.hosts = select_hosts(read_hosts(flags), flags.include, flags.exclude);
  c.devices_given = raw.was_given("--devices");
  c.nproc_given = raw.was_given("--nproc-per-node");
  for (const auto& host : c.hosts) {
    if (!host.devices.empty() && c.devices_given) {
      throw HostsError("--devices and the slots chosen by --include/--exclude (host " + host.name +
                       ") both say which devices the workers get: give one of them");
    }
  }
  c.ssh.program = flags.ssh_program;
  c.ssh.config_file = flags.ssh_config;
  if (flags.ssh_port > 0) c.ssh.port = flags.ssh_port;
  c.ssh.options = flags.ssh_options;
  c.remote_command = flags.remote_dist_launch;
  c.script_and_args = raw.script_and_args;
  c.agent_options =
      forwarded_options(raw.expanded_args, raw.expanded_args.size() - c.script_and_args.size());
  if (raw.was_given("--rdzv-conf")) c.rdzv_conf = raw.rdzv_conf;
  c.run_id = parsed.run_id == "none" ? random_run_id() : parsed.run_id;
  if (raw.was_given("--master-addr")) c.master_addr = parsed.master_addr;
  c.master_port = parsed.master_port;
  c.environment = exported_environment(flags);
  c.working_directory = std::filesystem::current_path().string();
  c.token = parsed.secret;
  c.unauthenticated = parsed.unauthenticated;
  c.signals_to_handle = parsed.signals_to_handle;
  c.shutdown_timeout = parsed.shutdown_timeout;
  c.keep_alive_interval_seconds = parsed.keep_alive_interval_seconds;
  c.keep_alive_max_attempt = parsed.keep_alive_max_attempt;
  return c;
}

}  // namespace dist::launcher
