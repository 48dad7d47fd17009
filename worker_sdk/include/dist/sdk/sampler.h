// DistributedSampler with PyTorch's exact semantics: the same indices, in the same order, for the
// same (dataset size, world, rank, seed, epoch, shuffle, drop_last).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dist::sdk {

struct SamplerOptions {
  std::size_t dataset_size = 0;
  int num_replicas = 1;  // world size
  int rank = 0;
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

class DistributedSampler {
 public:
  explicit DistributedSampler(SamplerOptions options);  // throws std::invalid_argument

  // The shuffle is seeded with seed + epoch: call before each epoch, as with PyTorch.
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }

  // This rank's indices for the current epoch:
  // - shuffled (torch.randperm with a generator seeded seed + epoch) or in order;
  // - padded to a multiple of the world by repeating the head, or cut to one (drop_last);
  // - then every num_replicas-th index from position rank.
  std::vector<std::size_t> indices() const;

  // Indices per rank per epoch (the same on every rank).
  std::size_t num_samples() const { return num_samples_; }

 private:
  SamplerOptions options_;
  std::uint64_t epoch_ = 0;
  std::size_t num_samples_ = 0;
};

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist(), for n below 2^32 / 20.
std::vector<std::size_t> torch_randperm(std::size_t n, std::uint64_t seed);

}  // namespace dist::sdk
