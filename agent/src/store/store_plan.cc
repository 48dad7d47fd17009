#include <boost/asio/ip/address.hpp>

#include "store/store.h"

namespace dist::agent {
namespace {

bool is_loopback_name(const std::string& host) {
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  return host == "localhost" || (!ec && address.is_loopback());
}

}  // namespace

StorePlan plan_stores(const JobConfig& job, const RendezvousConfig& c) {
  StorePlan plan;
  const bool several_nodes = job.max_nodes > 1 || job.elastic;
  plan.session = several_nodes;
  plan.round_stores = job.elastic;
  if (c.rdzv_backend == RendezvousBackend::kEtcdV3) return plan;  // etcd is the store
  if (!several_nodes) {  // the workers are all here: loopback, unless told otherwise
    plan.role = StorePlan::Role::kHost;
    plan.bind_address = is_loopback_name(c.master_addr) ? "127.0.0.1" : "";
    plan.port = c.master_port.value_or(0);
    return plan;
  }
  plan.port = c.master_port.value_or(kDefaultStaticPort);
  if (job.elastic) {
    plan.role = !c.is_host   ? StorePlan::Role::kHostIfThisMachine
                : *c.is_host ? StorePlan::Role::kHost
                             : StorePlan::Role::kClient;
    return plan;
  }
  // Static: node rank 0 hosts, unless someone else does (is_host=0: dist-launch --hosts).
  plan.role =
      job.node_rank == 0 && c.is_host != false ? StorePlan::Role::kHost : StorePlan::Role::kClient;
  return plan;
}

}  // namespace dist::agent
