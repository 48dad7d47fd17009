#include "dist/sdk/ddp.h"

#include <stdexcept>

#include "device_memory.h"

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
    : group_(group),
      memory_(group.device_buffers()
                  ? detail::BucketMemory::device(options.stream, group.cuda_device())
                  : detail::BucketMemory::host()),
      params_(std::move(parameters)) {
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
         buckets_.back().elements * sizeof(float) + bytes > cap_of(buckets_.size() - 1))) {
      buckets_.emplace_back();
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.elements);
    b.params.push_back(k);
    b.elements += params_[k].value.size();
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& b : buckets_) {
    b.flat = static_cast<float*>(memory_->allocate(b.elements * sizeof(float)));
  }
  check_same_buckets_on_every_rank();

  // Start from rank 0's parameters, one broadcast per bucket.
  for (auto& b : buckets_) {
    copy_in(b, /*values=*/true);
    memory_->complete(
        group_.broadcast_async(b.flat, b.elements, DataType::kFloat32, 0, memory_->stream()));
    copy_out(b, /*values=*/true);
  }
  reset_pass();
}

// Every rank must have built the same buckets: compare a digest of the layout.
void DistributedDataParallel::check_same_buckets_on_every_rank() {
  std::uint64_t digest = 0xCBF29CE484222325ull;
  for (const auto& b : buckets_) {
    digest = fnv1a(digest, b.params.size());
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      digest = fnv1a(digest, b.params[i]);
      digest = fnv1a(digest, params_[b.params[i]].value.size());
    }
  }
  const auto mine = static_cast<std::int64_t>(digest);
  std::vector<std::int64_t> all(static_cast<std::size_t>(group_.size()));
  const std::size_t all_bytes = all.size() * sizeof(std::int64_t);
  void* in = memory_->allocate(sizeof mine);
  void* out = memory_->allocate(all_bytes);
  memory_->copy(in, &mine, sizeof mine);
  memory_->complete(group_.all_gather_async(in, out, 1, DataType::kInt64, memory_->stream()));
  memory_->copy(all.data(), out, all_bytes);
  memory_->synchronize();
  for (int r = 0; r < group_.size(); ++r) {
    if (all[static_cast<std::size_t>(r)] != all[0]) {
      throw std::runtime_error(
          "DDP: rank " + std::to_string(r) +
          " has different parameters or buckets than rank 0 (do all ranks build the same model?)");
    }
  }
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

void DistributedDataParallel::copy_in(const Bucket& b, bool values) {
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    const Parameter& p = params_[b.params[i]];
    const std::span<const float> from = values ? p.value : p.grad;
    memory_->copy(b.flat + b.offsets[i], from.data(), from.size_bytes());
  }
}

void DistributedDataParallel::copy_out(const Bucket& b, bool values) {
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    const Parameter& p = params_[b.params[i]];
    const std::span<float> to = values ? p.value : p.grad;
    memory_->copy(to.data(), b.flat + b.offsets[i], to.size_bytes());
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
    copy_in(b, /*values=*/false);
    b.work = group_.all_reduce_async(b.flat, b.elements, DataType::kFloat32, ReduceOp::kAvg,
                                     memory_->stream());
    b.launched = true;
  }
}

void DistributedDataParallel::synchronize() {
  if (!sync_enabled_) return;
  for (auto& b : buckets_) b.pending = 0;  // unmarked parameters go with what they hold
  launch_ready_buckets();
  for (auto& b : buckets_) {
    memory_->complete(b.work);
    copy_out(b, /*values=*/false);
  }
  reset_pass();
}

std::vector<std::vector<std::size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::size_t>> layout;
  for (const auto& b : buckets_) layout.push_back(b.params);
  return layout;
}

}  // namespace dist::sdk
