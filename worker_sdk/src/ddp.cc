#include "dist/sdk/ddp.h"
#include "dist/sdk/progress.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "compression/compressor.h"
#include "compression/ops.h"
#include "device_memory.h"
#include "progress_slot.h"

namespace dist::sdk {
namespace {

std::uint64_t fnv1a(std::uint64_t h, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xFF;
    h *= 0x100000001B3ull;
  }
  return h;
}

std::uint64_t fnv1a(std::uint64_t h, std::string_view text) {
  for (const char c : text) h = fnv1a(h, static_cast<unsigned char>(c));
  return h;
}

template <typename T>
void make_parameter(std::string name, std::span<T> value, std::span<T> grad,
                    std::vector<std::size_t> shape, Parameter& p) {
  p.name = std::move(name);
  p.value = value.data();
  p.grad = grad.data();
  p.count = value.size();
  p.grad_count = grad.size();
  p.type = data_type_of<T>();
  p.shape = std::move(shape);
}

// "DDPSTAT" and the compressors' state format (compressor.h: kStateFormat) as a digit.
constexpr char kStateMagic[8] = {'D', 'D', 'P', 'S',
                                 'T', 'A', 'T', static_cast<char>('0' + detail::kStateFormat)};

}  // namespace

Parameter::Parameter(std::string name, std::span<float> value, std::span<float> grad,
                     std::vector<std::size_t> shape) {
  make_parameter(std::move(name), value, grad, std::move(shape), *this);
}
Parameter::Parameter(std::string name, std::span<Half> value, std::span<Half> grad,
                     std::vector<std::size_t> shape) {
  make_parameter(std::move(name), value, grad, std::move(shape), *this);
}
Parameter::Parameter(std::string name, std::span<BFloat16> value, std::span<BFloat16> grad,
                     std::vector<std::size_t> shape) {
  make_parameter(std::move(name), value, grad, std::move(shape), *this);
}

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group,
                                                 std::vector<Parameter> parameters,
                                                 DdpOptions options)
    : group_(group),
      options_(options),
      memory_(group.device_buffers()
                  ? detail::BucketMemory::device(options.stream, group.cuda_device())
                  : detail::BucketMemory::host()),
      params_(std::move(parameters)) {
  for (const auto& p : params_) {
    if (p.count != p.grad_count) {
      throw std::invalid_argument("parameter '" + p.name + "' has " + std::to_string(p.count) +
                                  " values but " + std::to_string(p.grad_count) + " gradients");
    }
  }
  if (options.compression.lossy() && options.sync.local()) {
    throw std::invalid_argument("DDP: compression '" + options.compression.to_string() +
                                "' applies to gradients, which sync '" + options.sync.to_string() +
                                "' does not exchange: use one or the other");
  }
  build_buckets(options);
  check_same_buckets_on_every_rank();

  // Start from rank 0's parameters, one broadcast per bucket.
  for (auto& b : buckets_) {
    copy_in(b, /*values=*/true);
    memory_->complete(group_.broadcast_async(b.flat, b.elements, b.type, 0, memory_->stream()));
    copy_out(b, /*values=*/true);
  }
  if (options.compression.lossy() || options.sync.local()) {
    ops_ = group.device_buffers() ? detail::make_device_ops(group, options.stream)
                                  : detail::make_host_ops(group);
  }
  if (options.compression.lossy()) {
    std::size_t matrices = 0;  // PowerSGD's compressed ones
    for (std::size_t i = 0; i < buckets_.size(); ++i) {
      detail::BucketLayout layout{buckets_[i].type, buckets_[i].elements, {}};
      for (std::size_t j = 0; j < buckets_[i].params.size(); ++j) {
        const Parameter& p = params_[buckets_[i].params[j]];
        layout.tensors.push_back(
            {buckets_[i].offsets[j], p.count, p.shape.empty() ? 0 : p.shape[0]});
      }
      if (options.compression.kind == Compression::Kind::kPowerSgd) {
        matrices += detail::plan_powersgd(layout, options.compression.rank).matrices.size();
      }
      compressors_.push_back(detail::make_compressor(options.compression, *ops_, layout, i));
    }
    if (options.compression.kind == Compression::Kind::kPowerSgd && matrices == 0 &&
        group_.rank() == 0) {
      warn_powersgd_compresses_nothing();
    }
    if (group_.rank() == 0) say_dense_buckets();
  }
  reset_pass();
  transport_start_ = group_.transport_bytes_sent();
}

// PowerSGD sends a parameter whole unless it knows it as a matrix (Parameter::shape) large enough
// for the rank to pay: silently sending everything whole would be a surprise.
void DistributedDataParallel::warn_powersgd_compresses_nothing() const {
  std::size_t shaped = 0;
  for (const auto& p : params_) shaped += p.shape.size() >= 2 ? 1 : 0;
  std::fprintf(stderr,
               "dist-sdk: warning: %s compresses nothing here: %s, so every bucket is sent whole "
               "(as much as without compression)\n",
               options_.compression.to_string().c_str(),
               shaped == 0 ? "no parameter has a shape of two or more dimensions (give "
                             "Parameter::shape, e.g. {rows, cols})"
                           : "every matrix is too small for its rank to send less");
}

// A sparse mode that sends more than dense at this world size averages those buckets whole: said,
// since the user asked for compression.
void DistributedDataParallel::say_dense_buckets() const {
  const auto dense = std::count_if(compressors_.begin(), compressors_.end(),
                                   [](const auto& c) { return c->always_dense(); });
  if (dense == 0) return;
  std::fprintf(stderr,
               "dist-sdk: note: %s would send more than a dense all-reduce in a world of %d "
               "(each rank's entries x %d ranks >= the bucket's size) in %zu of %zu bucket(s): "
               "they are averaged whole instead (a smaller ratio compresses them)\n",
               options_.compression.to_string().c_str(), group_.size(), group_.size(),
               static_cast<std::size_t>(dense), compressors_.size());
}

// Buckets in reverse registration order. A parameter opens a new bucket when it would take a
// non-empty bucket past its cap (the first bucket's cap is smaller, so reduction starts early),
// or when its element type differs from the bucket's.
void DistributedDataParallel::build_buckets(const DdpOptions& options) {
  bucket_of_.assign(params_.size(), 0);
  for (std::size_t k = params_.size(); k-- > 0;) {
    const Parameter& p = params_[k];
    const std::size_t bytes = p.count * element_size(p.type);
    const auto cap_of = [&](std::size_t bucket) {
      return bucket == 0 ? options.first_bucket_cap_bytes : options.bucket_cap_bytes;
    };
    if (buckets_.empty() ||
        (!buckets_.back().params.empty() &&
         (buckets_.back().type != p.type ||
          buckets_.back().elements * element_size(p.type) + bytes > cap_of(buckets_.size() - 1)))) {
      buckets_.emplace_back();
    }
    Bucket& b = buckets_.back();
    b.type = p.type;
    b.offsets.push_back(b.elements);
    b.params.push_back(k);
    b.elements += p.count;
    bucket_of_[k] = buckets_.size() - 1;
  }
  for (auto& b : buckets_) {
    b.flat = static_cast<std::byte*>(memory_->allocate(b.elements * element_size(b.type)));
  }
}

// Every rank must have built the same buckets with the same compression and sync: compare a
// digest of them.
void DistributedDataParallel::check_same_buckets_on_every_rank() {
  std::uint64_t digest = 0xCBF29CE484222325ull;
  for (const auto& b : buckets_) {
    digest = fnv1a(digest, b.params.size());
    digest = fnv1a(digest, static_cast<std::uint64_t>(b.type));
    for (std::size_t i = 0; i < b.params.size(); ++i) {
      digest = fnv1a(digest, b.params[i]);
      digest = fnv1a(digest, params_[b.params[i]].count);
    }
  }
  digest = fnv1a(digest, options_.compression.to_string());
  digest = fnv1a(digest, options_.sync.to_string());
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
      throw std::runtime_error("DDP: rank " + std::to_string(r) +
                               " has different parameters, buckets, compression or sync than "
                               "rank 0 (do all ranks build the same model with the same options?)");
    }
  }
}

DistributedDataParallel::~DistributedDataParallel() {
  for (auto& b : buckets_) {
    if (b.launched && compressors_.empty()) {
      try {
        b.work.wait();
      } catch (...) {  // the group is failing anyway; never throw from a destructor
      }
    }
  }
  if (ops_) {
    try {
      ops_->drain();
    } catch (...) {  // as above
    }
  }
}

void DistributedDataParallel::copy_in(const Bucket& b, bool values) {
  const std::size_t size = element_size(b.type);
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    const Parameter& p = params_[b.params[i]];
    memory_->copy(b.flat + b.offsets[i] * size, values ? p.value : p.grad, p.count * size);
  }
}

void DistributedDataParallel::copy_out(const Bucket& b, bool values) {
  const std::size_t size = element_size(b.type);
  for (std::size_t i = 0; i < b.params.size(); ++i) {
    const Parameter& p = params_[b.params[i]];
    memory_->copy(values ? p.value : p.grad, b.flat + b.offsets[i] * size, p.count * size);
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
  if (!sync_enabled_ || options_.sync.local()) return;
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
    launch(next_launch_++);
  }
}

void DistributedDataParallel::launch(std::size_t index) {
  Bucket& b = buckets_[index];
  copy_in(b, /*values=*/false);
  b.launched = true;
  if (compressors_.empty()) {
    b.work = group_.all_reduce_async(b.flat, b.elements, b.type, ReduceOp::kAvg, memory_->stream());
    plain_bytes_ += detail::ring_all_reduce_bytes(b.elements * element_size(b.type), group_.size());
    return;
  }
  detail::BucketCompressor* compressor = compressors_[index].get();
  std::byte* flat = b.flat;
  ops_->post([compressor, flat] { compressor->exchange(flat); });
}

void DistributedDataParallel::synchronize() {
  if (!sync_enabled_) return;
  // The step's own work ends here, where it may start waiting for its peers (the agent's
  // straggler measure; on the device, the stream's time).
  memory_->step_ended();
  ++stats_.steps;
  if (options_.sync.local()) {
    reset_pass();
    return;
  }
  for (auto& b : buckets_) b.pending = 0;  // unmarked parameters go with what they hold
  launch_ready_buckets();
  if (!compressors_.empty()) {
    ops_->drain();
    for (auto& b : buckets_) copy_out(b, /*values=*/false);
    if (!group_.device_buffers()) say_skipped_updates();
  } else {
    for (auto& b : buckets_) {
      memory_->complete(b.work);
      copy_out(b, /*values=*/false);
    }
  }
  stats_.bytes_sent = plain_bytes_ + (ops_ ? ops_->bytes_sent() : 0);
  reset_pass();
}

CommunicationStats DistributedDataParallel::stats() const {
  CommunicationStats s = stats_;
  for (const auto& c : compressors_) {
    const auto events = c->events();
    s.nonfinite_skipped += events.skipped;
    s.nonfinite_cleaned += events.cleaned;
    s.dense_exchanges += events.dense;
  }
  const auto transport = group_.transport_bytes_sent();
  if (transport && transport_start_) s.transport_bytes_sent = *transport - *transport_start_;
  return s;
}

// Host buffers: the guard's counters are plain memory, read at no cost after the drain.
void DistributedDataParallel::say_skipped_updates() {
  std::uint64_t skipped = 0;
  for (const auto& c : compressors_) skipped += c->events().skipped;
  if (skipped == skipped_said_) return;
  std::fprintf(stderr,
               "dist-sdk: rank %d: step %llu: %llu bucket(s) averaged to inf or NaN (%s): their "
               "update is skipped (gradients zeroed), their residual and compression state reset "
               "(%llu so far)\n",
               group_.rank(), static_cast<unsigned long long>(stats_.steps),
               static_cast<unsigned long long>(skipped - skipped_said_),
               options_.compression.to_string().c_str(), static_cast<unsigned long long>(skipped));
  skipped_said_ = skipped;
}

void DistributedDataParallel::after_step() {
  switch (options_.sync.kind) {
    case SyncStrategy::Kind::kEveryStep:
      break;
    case SyncStrategy::Kind::kPartial: {
      const auto chunks = static_cast<std::uint64_t>(options_.sync.chunks);
      average_values(local_steps_++ % chunks, chunks);
      break;
    }
    case SyncStrategy::Kind::kLocalSgd:
      if (++local_steps_ % static_cast<std::uint64_t>(options_.sync.period) == 0) {
        average_values(0, 1);
      }
      break;
  }
  sdk::step();  // the agent's hang and straggler detection counts it (dist/sdk/progress.h)
  if (detail::progress_slot()) memory_->step_began();
}

void DistributedDataParallel::average_parameters() {
  average_values(0, 1);
}

// Through the Ops when there are (local strategies, lossy compression): each bucket's slice summed
// in its type (Ops::all_sum; two ranks: one all-gather) in a job of its own, then divided and cast
// back; else the group's all-reduce.
void DistributedDataParallel::average_values(std::uint64_t chunk, std::uint64_t chunks) {
  auto slice = [&](const Bucket& b) {
    return std::pair{b.elements * chunk / chunks, b.elements * (chunk + 1) / chunks};
  };
  if (!ops_) {
    for (auto& b : buckets_) {
      const auto [begin, end] = slice(b);
      if (end == begin) continue;
      const std::size_t size = element_size(b.type);
      copy_in(b, /*values=*/true);
      memory_->complete(group_.all_reduce_async(b.flat + begin * size, end - begin, b.type,
                                                ReduceOp::kAvg, memory_->stream()));
      copy_out(b, /*values=*/true);
      plain_bytes_ += detail::ring_all_reduce_bytes((end - begin) * size, group_.size());
    }
    stats_.bytes_sent = plain_bytes_;
    return;
  }
  if (sums_.empty()) {
    for (const auto& b : buckets_) sums_.push_back(ops_->allocate_floats(b.elements));
  }
  const float inverse = 1.0f / static_cast<float>(group_.size());
  for (std::size_t i = 0; i < buckets_.size(); ++i) {
    const Bucket& b = buckets_[i];
    const auto [begin, end] = slice(b);
    if (end == begin) continue;
    copy_in(b, /*values=*/true);
    detail::Ops* ops = ops_.get();
    std::byte* values = b.flat + begin * element_size(b.type);
    const DataType type = b.type;
    const std::size_t count = end - begin;
    float* sum = sums_[i];
    ops->post([=] {
      ops->all_sum(values, type, count, sum);
      ops->scale(sum, count, inverse);
      ops->narrow(sum, values, type, count);
    });
  }
  ops_->drain();
  for (const auto& b : buckets_) {
    const auto [begin, end] = slice(b);
    if (end != begin) copy_out(b, /*values=*/true);
  }
  stats_.bytes_sent = plain_bytes_ + ops_->bytes_sent();
}

std::string DistributedDataParallel::state() const {
  std::string out(kStateMagic, sizeof kStateMagic);
  const std::string compression = options_.compression.to_string();
  const std::string sync = options_.sync.to_string();
  detail::put_u64(out, compression.size());
  out += compression;
  detail::put_u64(out, sync.size());
  out += sync;
  detail::put_u64(out, static_cast<std::uint64_t>(group_.size()));
  detail::put_u64(out, local_steps_);
  detail::put_u64(out, compressors_.size());
  for (const auto& c : compressors_) c->save(out);
  return out;
}

void DistributedDataParallel::load_state(std::string_view state) {
  auto fail = [](const std::string& why) { throw std::invalid_argument("DDP state: " + why); };
  try {
    // Every format up to this build's loads.
    const int format = state.size() < sizeof kStateMagic ? 0 : state[sizeof kStateMagic - 1] - '0';
    if (format < 1 || std::memcmp(state.data(), kStateMagic, sizeof kStateMagic - 1) != 0) {
      fail("not a DistributedDataParallel state");
    }
    if (format > detail::kStateFormat) {
      fail("format " + std::to_string(format) + ", newer than this build's " +
           std::to_string(detail::kStateFormat) + " (saved by a newer dist-launch)");
    }
    state.remove_prefix(sizeof kStateMagic);
    auto text = [&] {
      const std::uint64_t n = detail::take_u64(state);
      if (state.size() < n) fail("truncated");
      std::string s(state.substr(0, n));
      state.remove_prefix(n);
      return s;
    };
    const std::string compression = text(), sync = text();
    if (compression != options_.compression.to_string() || sync != options_.sync.to_string()) {
      fail("saved with compression '" + compression + "' and sync '" + sync +
           "', but this DDP has compression '" + options_.compression.to_string() + "' and sync '" +
           options_.sync.to_string() + "'");
    }
    // Residuals (lossy compression) are a rank's own; without them the state holds nothing of the
    // world, so that a job resumed or regrouped in another world size takes it.
    const std::uint64_t world = detail::take_u64(state);
    if (world != static_cast<std::uint64_t>(group_.size()) && !compressors_.empty()) {
      fail("saved by a rank of a world of " + std::to_string(world) + ", this one has " +
           std::to_string(group_.size()) + " (residuals belong to their rank)");
    }
    const std::uint64_t steps = detail::take_u64(state);
    if (detail::take_u64(state) != compressors_.size()) fail("another number of buckets");
    for (const auto& c : compressors_) c->load(state, format);
    if (!state.empty()) fail("trailing bytes");
    local_steps_ = steps;
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.rfind("DDP state: ", 0) == 0) throw;
    fail(what + " (a state of another model?)");
  }
}

std::vector<std::vector<std::size_t>> DistributedDataParallel::bucket_layout() const {
  std::vector<std::vector<std::size_t>> layout;
  for (const auto& b : buckets_) layout.push_back(b.params);
  return layout;
}

}  // namespace dist::sdk
