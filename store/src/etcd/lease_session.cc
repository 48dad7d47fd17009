#include "dist/store/etcd/lease_session.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <random>

namespace dist::store::etcd {
namespace {

namespace asio = boost::asio;

// How long close() gives revoking the lease before leaving it to expire.
constexpr std::chrono::milliseconds kRevokeTimeout{2'000};

std::string hex(std::int64_t id) {
  char buffer[17];
  std::snprintf(buffer, sizeof buffer, "%llx", static_cast<unsigned long long>(id));
  return buffer;
}

}  // namespace

struct LeaseSession::State {
  std::shared_ptr<Client> client;
  std::chrono::seconds ttl{0};
  std::function<void()> on_lost;
  Cancellation renewals;
  std::int64_t id = 0;
  std::chrono::seconds granted_ttl{0};
  std::size_t renewals_unanswered = 0;  // renewals sent since the last answer
  std::optional<StoreError> lost;
  bool closed = false;

  void lose(const std::string& reason) {
    if (lost || closed) return;
    lost.emplace(StoreErrc::kConnectionLost,
                 client->describe() + ": lease " + hex(id) + " of this session (TTL " +
                     std::to_string(granted_ttl.count()) + " s) is gone (" + reason +
                     "), and its ephemeral keys with it; open a new session");
    renewals.cancel();
    if (on_lost) on_lost();
  }
};

namespace {

using StatePtr = std::shared_ptr<LeaseSession::State>;

// One renewal, given up when the lease's TTL has passed since it was sent: by then its answer no
// longer matters (a later renewal, or etcd's expiry, has decided). `skip`: the renewals sent since
// the last answer, so that while they wait (on a member that stopped answering) this one starts at
// the next member.
Task<void> renew(StatePtr s, Clock::time_point sent) {
  const std::size_t skip = s->renewals_unanswered++;
  try {
    const auto left =
        co_await s->client->lease_keep_alive(s->id, s->renewals, sent + s->granted_ttl, skip);
    s->renewals_unanswered = 0;
    if (left.count() == 0) s->lose("etcd expired it: no renewal reached it within its TTL");
  } catch (const StoreError&) {
    // The session ended (cancelled), or no member answered in time: the next renewal is due.
  }
}

// Renews the lease every TTL/3 until the session ends (see the header).
Task<void> keep_alive(StatePtr s, Clock::time_point granted) {
  asio::steady_timer timer(s->client->executor());
  const auto period = std::chrono::duration_cast<std::chrono::milliseconds>(s->granted_ttl) / 3;
  // The first renewal comes between half a period and a period after the grant: sessions that
  // took their leases together (a round's joiners) do not all renew in the same instant.
  static std::minstd_rand jitter{std::random_device{}()};
  auto next = granted + period / 2 +
              std::chrono::milliseconds(std::uniform_int_distribution<long>(
                  0, std::max<long>(1, period.count() / 2))(jitter));
  while (!s->renewals.cancelled()) {
    timer.expires_at(next);
    {
      const auto stop = s->renewals.on_cancel([&timer] { timer.cancel(); });
      boost::system::error_code ignored;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ignored));
    }
    if (s->renewals.cancelled()) co_return;
    const auto sent = Clock::now();
    asio::co_spawn(s->client->executor(), renew(s, sent), asio::detached);
    next = sent + period;
  }
}

Task<void> revoke(std::shared_ptr<Client> client, std::int64_t id) {
  Cancellation none;  // bounded by its deadline only
  try {
    co_await client->lease_revoke(id, none, Clock::now() + kRevokeTimeout);
  } catch (const StoreError&) {
    // The lease expires by itself.
  }
}

Task<std::int64_t> grant(StatePtr s, Cancellation& cancel) {
  if (s->lost) throw *s->lost;
  if (s->id != 0) co_return s->id;
  const auto granted = Clock::now();
  const auto lease = co_await s->client->lease_grant(s->ttl, cancel);
  s->id = lease.id;
  s->granted_ttl = lease.ttl;
  asio::co_spawn(s->client->executor(), keep_alive(s, granted), asio::detached);
  co_return s->id;
}

}  // namespace

LeaseSession::LeaseSession(std::shared_ptr<Client> client, std::chrono::seconds ttl,
                           std::function<void()> on_lost)
    : state_(std::make_shared<State>()) {
  state_->client = std::move(client);
  state_->ttl = ttl;
  state_->on_lost = std::move(on_lost);
}

LeaseSession::~LeaseSession() {
  close();
}

Task<std::int64_t> LeaseSession::ensure(Cancellation& cancel) {
  return grant(state_, cancel);
}

std::int64_t LeaseSession::id() const {
  return state_->id;
}

void LeaseSession::lose(const std::string& reason) {
  state_->lose(reason);
}

const std::optional<StoreError>& LeaseSession::lost() const {
  return state_->lost;
}

void LeaseSession::close() {
  if (state_->closed) return;
  state_->closed = true;
  state_->on_lost = nullptr;
  state_->renewals.cancel();
  if (state_->id != 0) {
    asio::co_spawn(state_->client->executor(), revoke(state_->client, state_->id), asio::detached);
  }
}

}  // namespace dist::store::etcd
