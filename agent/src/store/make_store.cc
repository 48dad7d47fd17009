// The one factory of rendezvous store sessions (store.h): a TCPStore's or etcd's, by target.
#include <variant>

#include "store/etcd_store.h"
#include "store/store.h"
#include "store/tcp_store.h"

namespace dist::agent {

std::unique_ptr<RendezvousStore> make_rendezvous_store(boost::asio::io_context& io,
                                                       StoreTarget target, std::string run_id) {
  if (auto* tcp = std::get_if<TcpStoreTarget>(&target)) {
    return std::make_unique<TcpRendezvousStore>(io.get_executor(), std::move(tcp->client),
                                                std::move(run_id));
  }
  return make_etcd_store(io, std::get<EtcdOptions>(std::move(target)), std::move(run_id));
}

namespace {

Task<std::unique_ptr<RendezvousStore>> opened(std::unique_ptr<RendezvousStore> store) {
  co_await store->open();
  co_return store;
}

}  // namespace

// Not a coroutine itself: the target is consumed when called, so that a temporary target in the
// caller's co_await expression never has to survive in a coroutine frame (GCC 12 copies such
// temporaries' parameters incorrectly).
Task<std::unique_ptr<RendezvousStore>> open_rendezvous_store(boost::asio::io_context& io,
                                                             StoreTarget target,
                                                             std::string run_id) {
  return opened(make_rendezvous_store(io, std::move(target), std::move(run_id)));
}

}  // namespace dist::agent
