#include "dist/sdk/sampler.h"

#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

namespace dist::sdk {

std::vector<std::size_t> torch_randperm(std::size_t n, std::uint64_t seed) {
  // PyTorch's CPU generator is MT19937 seeded with the low 32 bits of the seed; randperm for
  // small n is a forward Fisher-Yates drawing one 32-bit number per position.
  if (n >= std::size_t{0xFFFFFFFFu} / 20) {
    throw std::invalid_argument("torch_randperm: n = " + std::to_string(n) +
                                " uses torch's large-n algorithm, which is not reproduced");
  }
  std::mt19937 generator(static_cast<std::uint32_t>(seed));
  std::vector<std::size_t> r(n);
  std::iota(r.begin(), r.end(), std::size_t{0});
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const std::size_t z = generator() % (n - i);
    std::swap(r[i], r[z + i]);
  }
  return r;
}

DistributedSampler::DistributedSampler(SamplerOptions options) : options_(options) {
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas) {
    throw std::invalid_argument("DistributedSampler: rank " + std::to_string(options_.rank) +
                                " is not in a world of " + std::to_string(options_.num_replicas));
  }
  const std::size_t n = options_.dataset_size;
  const auto world = static_cast<std::size_t>(options_.num_replicas);
  if (options_.drop_last && n % world != 0) {
    num_samples_ = (n - world + world - 1) / world;  // ceil((n - world) / world)
    if (n < world) num_samples_ = 0;
  } else {
    num_samples_ = (n + world - 1) / world;
  }
}

std::vector<std::size_t> DistributedSampler::indices() const {
  const std::size_t n = options_.dataset_size;
  const auto world = static_cast<std::size_t>(options_.num_replicas);
  const std::size_t total = num_samples_ * world;
  std::vector<std::size_t> all;
  if (options_.shuffle) {
    all = torch_randperm(n, options_.seed + epoch_);
  } else {
    all.resize(n);
    std::iota(all.begin(), all.end(), std::size_t{0});
  }
  if (!options_.drop_last && n > 0) {
    // Pad by repeating the list from its head until the total is reached.
    for (std::size_t i = 0; all.size() < total; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(std::min(all.size(), total));
  }
  std::vector<std::size_t> mine;
  mine.reserve(num_samples_);
  for (std::size_t i = static_cast<std::size_t>(options_.rank); i < total; i += world) {
    mine.push_back(all[i]);
  }
  return mine;
}

}  // namespace dist::sdk
