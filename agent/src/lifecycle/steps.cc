#include "lifecycle/steps.h"

#include <spdlog/spdlog.h>

#include "dist/store/errors.h"

namespace dist::agent {

void Steps::fire_and_forget(store::Task<void> task, std::string what) {
  boost::asio::co_spawn(io_, std::move(task), [what = std::move(what)](std::exception_ptr e) {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const store::StoreError& error) {
      if (error.code() != store::StoreErrc::kCancelled) {
        spdlog::warn("{}: {}", what, error.what());
      }
    } catch (const std::exception& error) {
      spdlog::warn("{}: {}", what, error.what());
    }
  });
}

}  // namespace dist::agent
