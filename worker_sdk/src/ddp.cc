#include "dist/sdk/ddp.h"

#include <algorithm>
#include <stdexcept>

namespace dist::sdk {
namespace {

std::uint64_t fnv1a(std::uint64_t h, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xFF;
    h *= 0x100000001B3ull;
  }
  return h;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group,
                                                 std::vector<Parameter> parameters,
                                                 DdpOptions options)
    : group_(group), params_(std::move(parameters)) {
  for (const auto& p : params_) {
    if (p.value.size() != p.grad.size()) {
      throw std::invalid_argument("parameter '" + p.name + "' has " +
                                  std::to_string(p.value.size()) + " values but " +
                                  std::to_string(p.grad.size()) + " gradients");
    }
  }
  // Buckets in reverse registration order. A parameter opens a new bucket when it would take a
  // non-empty bucket past its cap (the first bucket's cap is smaller, so reduction starts early).
  bucket_of_.assign(params_.size(), 0);
  for (std::size_t k = params_.size(); k-- > 0;) {
    const std::size_t bytes = params_[k].value.size() * sizeof(float);
    const auto cap_of = [&](std::size_t bucket) {
      return bucket == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    };
    if (buckets_.empty() ||
        (!buckets_.back().params.empty() &&
         buckets_.back().flat.size() * sizeof(float) + bytes > cap_of(buckets_.size() - 1))) {
      buckets_.emplace_back();
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.flat.size());
    b.params.push_back(k);
    b.flat.resize(b.flat.size() + params_[k].value.size());
    bucket_of_[k] = buckets_.size() - 1;
  }

  // Every rank must have built the same buckets: compare a digest of the layout.
  std::uint64_t digest = 0xCBF29CE484222325ull;
  for (const auto& b : buckets_) {
    digest = fnv1a(digest, b.params.size());
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      digest = fnv1a(digest, b.params[i]);
      digest = fnv1a(digest, params_[b.params[i]].value.size());
    }
  }
  std::vector<std::int64_t> mine{static_cast<std::int64_t>(digest)};
  std::vector<std::int64_t> all(static_cast<std::size_t>(group_.size()));
  group_.all_gather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  for (int r = 0; r < group_.size(); ++r) {
    if (all[static_cast<std::size_t>(r)] != all[0]) {
      throw std::runtime_error(
          "DDP: rank " + std::to_string(r) +
          " has different parameters or buckets than rank 0 (do all ranks build the same model?)");
    }
  }

  // Start from rank 0's parameters, one broadcast per bucket.
  for (auto& b : buckets_) {
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      const auto& v = params_[b.params[i]].value;
      std::copy(v.begin(), v.end(), b.flat.begin() + static_cast<std::ptrdiff_t>(b.offsets[i]));
    }
    group_.broadcast(std::span<float>(b.flat), 0);
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      auto& v = params_[b.params[i]].value;
      std::copy_n(b.flat.begin() + static_cast<std::ptrdiff_t>(b.offsets[i]), v.size(), v.begin());
    }
  }
  reset_pass();
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& b : buckets_) {
    if (b.launched) {
      try {
        b.work.wait();
      } catch (...) {  // the group is failing anyway; never throw from a destructor
      }
    }
  }
}

void DistributedDataParallel::reset_pass() {
  ready_.assign(params_.size(), false);
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
  }
  next_launch_ = 0;
}

void DistributedDataParallel::grad_ready(std::size_t index) {
  if (!sync_enabled_) return;
  if (index >= params_.size()) {
    throw std::out_of_range("DDP: no parameter " + std::to_string(index));
  }
  if (ready_[index]) {
    throw std::logic_error("DDP: parameter '" + params_[index].name +
                           "' marked ready twice in one backward pass");
  }
  ready_[index] = true;
  --buckets_[bucket_of_[index]].pending;
  launch_ready_buckets();
}

void DistributedDataParallel::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      const auto& g = params_[b.params[i]].grad;
      std::copy(g.begin(), g.end(), b.flat.begin() + static_cast<std::ptrdiff_t>(b.offsets[i]));
    }
    b.work =
        group_.all_reduce_async(b.flat.data(), b.flat.size(), DataType::kFloat32, ReduceOp::kAvg);
    b.launched = true;
  }
}

void DistributedDataParallel::synchronize() {
  if (!sync_enabled_) return;
  for (auto& b : buckets_) b.pending = 0;  // unmarked parameters go with what they hold
  launch_ready_buckets();
  for (auto& b : buckets_) {
    b.work.wait();
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      auto& g = params_[b.params[i]].grad;
      std::copy_n(b.flat.begin() + static_cast<std::ptrdiff_t>(b.offsets[i]), g.size(), g.begin());
    }
  }
  reset_pass();
}

std::vector<std::vector<std::size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::size_t>> layout;
  for (const auto& b : buckets_) layout.push_back(b.params);
  return layout;
}

}  // namespace dist::sdk
