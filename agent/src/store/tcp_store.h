// The rendezvous store interface over the job's TCPStore: the hosting agent's store or an external
// dist-rendezvous. Keys go under "rdzv/<run id>/"; ephemeral keys live with the connection.
#pragma once

#include <memory>
#include <string>

#include "dist/store/async_client.h"
#include "store/store.h"

namespace dist::agent {

class TcpRendezvousStore : public RendezvousStore {
 public:
  // Not yet connected: open() connects, and close() may end it at any time, open() included.
  TcpRendezvousStore(boost::asio::any_io_executor executor, store::ClientOptions options,
                     std::string run_id);
  Task<void> open() override;

  Task<void> set(std::string key, std::string value) override;
  Task<void> set_ephemeral(std::string key, std::string value) override;
  Task<void> multi_set(std::vector<std::pair<std::string, std::string>> items) override;
  Task<std::optional<std::string>> try_get(std::string key) override;
  Task<std::vector<std::optional<std::string>>> multi_get(std::vector<std::string> keys) override;
  Task<std::int64_t> add(std::string key, std::int64_t delta) override;
  Task<std::string> compare_set(std::string key, std::string expected,
                                std::string desired) override;
  Task<bool> check(std::vector<std::string> keys) override;
  Task<bool> delete_key(std::string key) override;
  Task<bool> wait(std::vector<std::string> keys, std::chrono::milliseconds timeout) override;
  Task<std::optional<std::size_t>> wait_deleted(std::vector<std::string> keys,
                                                std::chrono::milliseconds timeout) override;
  Task<std::unique_ptr<RendezvousStore>> open_another() override;
  Task<std::unique_ptr<RendezvousStore>> open_watcher() override;
  void close() override;
  std::string describe() const override;

 private:
  TcpRendezvousStore(store::AsyncStoreClient lane, std::string run_id);
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> full(std::vector<std::string> keys) const;

  store::AsyncStoreClient client_;
  std::string run_id_;
  std::string prefix_;
};

}  // namespace dist::agent
