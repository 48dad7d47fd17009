#include "lifecycle/events.h"

#include "dist/store/errors.h"

namespace dist::agent {

event::RendezvousFailed failure_event(std::exception_ptr e) {
  using Kind = event::RendezvousFailed::Kind;
  try {
    std::rethrow_exception(e);
  } catch (const JobOverError& error) {
    return {error.succeeded() ? Kind::kJobDone : Kind::kJobOver, error.what()};
  } catch (const RoundAbortedError& error) {
    return {Kind::kRoundAborted, error.what()};
  } catch (const store::StoreError& error) {
    if (error.code() == store::StoreErrc::kCancelled) return {Kind::kCancelled, ""};
    return {Kind::kError, error.what()};
  } catch (const std::exception& error) {
    return {Kind::kError, error.what()};
  }
}

}  // namespace dist::agent
