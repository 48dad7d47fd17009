// A lease kept alive for as long as its session lives, as the Go client's concurrency.Session:
// granted on first use, renewed every TTL/3 (counted from the grant or the last renewal sent, not
// waiting for the last one's answer), lost when etcd says it expired, revoked when closed.
//
// Why renewals do not wait for each other: a slow answer (a loaded cluster) must not make the next
// renewal late, and a renewal stuck on a member that stopped answering (frozen, or cut off: its
// connection stays open and silent) must not hold up the next, which goes to the next member. A
// new leader extends every lease by an election timeout, but a frozen follower extends nothing: a
// renewal must reach another member within the TTL, as the next one does. The lease is lost only
// when etcd says it expired: while no member with a leader answers, etcd expires no lease either.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "dist/store/errors.h"
#include "dist/store/etcd/client.h"

namespace dist::store::etcd {

class LeaseSession {
 public:
  // `on_lost` runs once, on the client's executor, when etcd says the lease expired (its keys are
  // gone with it): the owner fails what depends on them.
  LeaseSession(std::shared_ptr<Client> client, std::chrono::seconds ttl,
               std::function<void()> on_lost = {});
  ~LeaseSession();  // close()
  LeaseSession(const LeaseSession&) = delete;
  LeaseSession& operator=(const LeaseSession&) = delete;

  // The lease's id: granted by the first call (cancelled through `cancel`), which also starts
  // renewing it. Throws StoreError as Client::lease_grant does, or the lease's loss.
  Task<std::int64_t> ensure(Cancellation& cancel);
  std::int64_t id() const;  // 0: not granted yet

  // Declares the lease lost (etcd said it expired, or something keyed on it vanished): renewals
  // stop, on_lost runs, and lost() says why from then on.
  void lose(const std::string& reason);
  // The error every call that needs the lease throws once it is lost: kConnectionLost, naming
  // the lease, its TTL and the reason.
  const std::optional<StoreError>& lost() const;

  // Stops renewing and revokes the lease in the background (bounded), so that its keys go at once.
  void close();

  struct State;  // opaque: what the renewal coroutines share with this object

 private:
  std::shared_ptr<State> state_;
};

}  // namespace dist::store::etcd
