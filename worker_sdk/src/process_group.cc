#include <bit>
#include <cmath>
#include <cstring>
#include <mutex>
#include <vector>

#include "dist/sdk/process_group.h"

namespace dist::sdk {
namespace {

// A collective completed by a host thread (Gloo's communication thread, or the caller's). The
// thread that runs it holds a Work of its own until it ran, so what keep_alive() holds lives that
// long too.
class FutureState final : public Work::State {
 public:
  explicit FutureState(std::shared_future<void> done) : done_(std::move(done)) {}
  void wait() override { done_.get(); }
  bool ready() override {
    return done_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  }
  void wait_on(CudaStream) override { wait(); }  // host memory: the host is the only reader
  void keep_alive(std::shared_ptr<const void> owner) override {
    std::lock_guard lock(mutex_);
    owners_.push_back(std::move(owner));
  }

 private:
  std::shared_future<void> done_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<const void>> owners_;
};

}  // namespace

Work::Work(std::shared_future<void> done)
    : state_(std::make_shared<FutureState>(std::move(done))) {}

void Work::wait() const {
  if (state_) state_->wait();
}

bool Work::ready() const {
  return !state_ || state_->ready();
}

void Work::wait_on(CudaStream stream) const {
  if (state_) state_->wait_on(stream);
}

void Work::keep_alive(std::shared_ptr<const void> owner) const {
  if (state_) state_->keep_alive(std::move(owner));  // nothing pending: released at once
}

void ProcessGroup::check_gather_sizes(std::size_t per_rank, std::size_t whole) const {
  if (whole != per_rank * static_cast<std::size_t>(size())) {
    throw std::invalid_argument("buffer of " + std::to_string(whole) + " elements; a group of " +
                                std::to_string(size()) + " needs " +
                                std::to_string(per_rank * static_cast<std::size_t>(size())));
  }
}

std::size_t element_size(DataType type) {
  switch (type) {
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt8:
    case DataType::kUInt8:
      return 1;
  }
  return 1;
}

// IEEE 754 binary16 conversions, round to nearest even.
Half Half::from_float(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or nan
    return {static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u : 0u))};
  }
  if (abs >= 0x477FF000u) return {static_cast<std::uint16_t>(sign | 0x7C00u)};  // overflow
  if (abs < 0x38800000u) {  // subnormal or zero in half
    const float magnitude = std::bit_cast<float>(abs);
    const auto sub = static_cast<std::uint32_t>(std::nearbyint(magnitude * 16777216.0f));
    return {static_cast<std::uint16_t>(sign | sub)};
  }
  std::uint32_t rounded = abs + 0xFFFu + ((abs >> 13) & 1u);  // round half to even
  rounded -= 0x38000000u;                                     // rebias 127 -> 15
  return {static_cast<std::uint16_t>(sign | (rounded >> 13))};
}

float Half::to_float() const {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1Fu;
  const std::uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

// bfloat16: float32's upper half, rounded to nearest even; a NaN stays a (quiet) NaN.
BFloat16 BFloat16::from_float(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return {static_cast<std::uint16_t>((x >> 16) | 0x40u)};
  const std::uint32_t rounded = x + 0x7FFFu + ((x >> 16) & 1u);
  return {static_cast<std::uint16_t>(rounded >> 16)};
}

float BFloat16::to_float() const {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

}  // namespace dist::sdk
