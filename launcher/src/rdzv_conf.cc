#include "rdzv_conf.h"

#include <charconv>
#include <sstream>
#include <string_view>

namespace dist::launcher {
namespace {

using agent::LaunchConfig;

// Longer than any job: a bound that keeps milliseconds far from overflow.
constexpr double kMaxSeconds = 1e9;

std::chrono::milliseconds seconds(const std::string& flag, const std::string& value) {
  double v = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() || !(v > 0) ||
      !(v <= kMaxSeconds)) {
    throw RdzvConfError(flag + " must be a positive number of seconds, got '" + value + "'");
  }
  return std::chrono::milliseconds(static_cast<long long>(v * 1000));
}
int positive(const std::string& flag, const std::string& value) {
  int v = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() || v < 1) {
    throw RdzvConfError(flag + " must be a positive integer, got '" + value + "'");
  }
  return v;
}
bool boolean(const std::string& flag, const std::string& value) {
  if (value == "1" || value == "true" || value == "True") return true;
  if (value == "0" || value == "false" || value == "False") return false;
  throw RdzvConfError(flag + " must be 1 or 0, got '" + value + "'");
}
std::string one_of(const std::string& flag, const std::string& value,
                   std::initializer_list<std::string_view> allowed) {
  for (const auto a : allowed) {
    if (value == a) return value;
  }
  std::string list;
  for (const auto a : allowed) list += (list.empty() ? "" : " or ") + std::string(a);
  throw RdzvConfError(flag + "=" + value + ": " + list);
}

enum class Backend { kAny, kEtcd };

// One row per key: which backend reads it, and what it does to the configuration. `flag` is
// "--rdzv-conf <key>", for messages.
struct Key {
  std::string_view name;
  Backend backend;
  void (*apply)(const std::string& flag, const std::string& value, LaunchConfig& c);
};

constexpr Key kKeys[] = {
    {"timeout", Backend::kAny,  // static: how long nodes wait for each other
     [](auto& f, auto& v, LaunchConfig& c) { c.rdzv_timeout = seconds(f, v); }},
    {"join_timeout", Backend::kAny,  // elastic: how long a round may take to form
     [](auto& f, auto& v, LaunchConfig& c) { c.join_timeout = seconds(f, v); }},
    {"last_call_timeout", Backend::kAny,  // elastic: MIN nodes in, how long to wait for more
     [](auto& f, auto& v, LaunchConfig& c) { c.last_call_timeout = seconds(f, v); }},
    {"keep_alive_interval", Backend::kAny,
     [](auto& f, auto& v, LaunchConfig& c) { c.keep_alive_interval_seconds = positive(f, v); }},
    {"keep_alive_max_attempt", Backend::kAny,
     [](auto& f, auto& v, LaunchConfig& c) {
       c.keep_alive_max_attempt = positive(f, v);
       c.keep_alive_max_attempt_given = true;
     }},
    {"is_host", Backend::kAny,
     [](auto& f, auto& v, LaunchConfig& c) { c.is_host = boolean(f, v); }},
    // torchrun's, accepted: liveness is TCP keepalive here, and the store always TCP.
    {"close_timeout", Backend::kAny, [](auto&, auto&, LaunchConfig&) {}},
    {"read_timeout", Backend::kAny, [](auto&, auto&, LaunchConfig&) {}},
    {"heartbeat_timeout", Backend::kAny, [](auto&, auto&, LaunchConfig&) {}},
    {"cas_backoff_max_seconds", Backend::kAny, [](auto&, auto&, LaunchConfig&) {}},
    {"store_type", Backend::kAny,
     [](auto& f, auto& v, LaunchConfig&) {
       if (v != "tcp") {
         throw RdzvConfError(f + "=" + v +
                             ": dist-launch's c10d rendezvous runs over its TCP store only "
                             "(store_type=tcp, the default)");
       }
     }},
    // etcd-v3 (docs/ETCD.md).
    {"cacert", Backend::kEtcd, [](auto&, auto& v, LaunchConfig& c) { c.etcd.ca_file = v; }},
    {"cert", Backend::kEtcd, [](auto&, auto& v, LaunchConfig& c) { c.etcd.cert_file = v; }},
    {"key", Backend::kEtcd, [](auto&, auto& v, LaunchConfig& c) { c.etcd.key_file = v; }},
    {"user", Backend::kEtcd, [](auto&, auto& v, LaunchConfig& c) { c.etcd.user = v; }},
    {"password_file", Backend::kEtcd,
     [](auto&, auto& v, LaunchConfig& c) { c.etcd.password_file = v; }},
    {"protocol", Backend::kEtcd,
     [](auto& f, auto& v, LaunchConfig& c) {
       c.etcd.protocol = one_of(f, v, {"http", "https"});
     }},
    {"etcd_prefix", Backend::kEtcd,
     [](auto& f, auto& v, LaunchConfig& c) {
       if (v.empty() || v == "/") throw RdzvConfError(f + "=" + v + ": give a non-empty prefix");
       c.etcd.prefix = v;
     }},
    {"unavailable_timeout", Backend::kEtcd,
     [](auto& f, auto& v, LaunchConfig& c) { c.etcd.unavailable_timeout = seconds(f, v); }},
    {"member_order", Backend::kEtcd,  // spread: a random first member; given: the first listed
     [](auto& f, auto& v, LaunchConfig& c) {
       c.etcd.spread_over_members = one_of(f, v, {"spread", "given"}) == "spread";
     }},
};

const Key* find_key(std::string_view name) {
  for (const Key& k : kKeys) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

}  // namespace

std::string rdzv_conf_keys() {
  std::string any, etcd;
  for (const Key& k : kKeys) {
    std::string& list = k.backend == Backend::kEtcd ? etcd : any;
    list += (list.empty() ? "" : ", ") + std::string(k.name);
  }
  return any + " (etcd-v3 also: " + etcd + ")";
}

RdzvConf apply_rdzv_conf(std::string text, LaunchConfig& config) {
  if (text.size() >= 2 && (text.front() == '\'' || text.front() == '"') &&
      text.back() == text.front()) {
    text = text.substr(1, text.size() - 2);
  }
  RdzvConf found;
  std::stringstream items(text);
  for (std::string item; std::getline(items, item, ',');) {
    if (item.empty()) continue;
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw RdzvConfError("--rdzv-conf: '" + item +
                          "' is not key=value (keys: " + rdzv_conf_keys() + ")");
    }
    const Key* key = find_key(item.substr(0, eq));
    if (!key) {
      found.ignored.push_back(item);
      continue;
    }
    key->apply("--rdzv-conf " + std::string(key->name), item.substr(eq + 1), config);
    if (key->backend == Backend::kEtcd) found.etcd_keys.emplace_back(key->name);
  }
  return found;
}

}  // namespace dist::launcher
