// ddp_train: data-parallel training of a small MLP (64-128-10, ReLU, softmax cross-entropy, SGD
// with momentum) on the digits data set, with the worker SDK: dist-launch's environment, a Gloo
// process group, DistributedSampler, DDP and checkpoint/resume. --backend nccl trains on the GPU
// instead (device_mlp.h: the same model as kernels, DDP over an NCCL group, one GPU per rank).
//
//   dist-launch --nproc-per-node 2 --max-restarts 1 --no-python build/bin/ddp_train
//       --checkpoint-dir /tmp/ckpt --crash-at-step 300      (one command line)
//
// The global batch is the same whatever the world size (each rank takes global/world samples).
// The last line prints the final test accuracy and the SHA-256 of the final weights, so runs can be
// compared exactly: a run that crashed and resumed from its checkpoint ends bit-identical to one
// that did not (on the GPU too, whose digest differs from the CPU's: other rounding).
//
// --compression SPEC and --sync SPEC choose DDP's gradient compression and synchronisation
// (dist/sdk/compression.h); rank 0 prints the bytes it sent per step ("all-reduce bytes per step
// N", by the ring formulas, and over Gloo "transport bytes per step M", what its sockets sent
// for them). With either, every rank checkpoints its own state (residuals, local weights) in
// ddp_train.rank<R>.ckpt beside rank 0's ddp_train.ckpt.
//
// --in-place, under dist-launch --restart-policy in-place: a crashed rank is replaced alone; the
// others keep their processes, rebuild their group with the replacement and give it the model, the
// momentum, the step and the epoch's loss sums (dist/sdk/recovery.h), so the run still ends with
// the digest of a run that never crashed. Each rank prints "ddp_train: rank R pid P generation G"
// when it starts and when it finishes.
#include <openssl/evp.h>
#include <unistd.h>
#include <zlib.h>

#include <CLI/CLI.hpp>
#include <Eigen/Dense>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <sstream>

#include "device_mlp.h"
#include "dist/sdk/checkpoint.h"
#include "dist/sdk/compression.h"
#include "dist/sdk/ddp.h"
#include "dist/sdk/error_file.h"
#include "dist/sdk/init.h"
#include "dist/sdk/process_group.h"
#include "dist/sdk/recovery.h"
#include "dist/sdk/sampler.h"
#include "dist/sdk/snapshot.h"

namespace {

using namespace dist;
using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixMap = Eigen::Map<Matrix>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;

constexpr int kInputs = 64, kClasses = 10;
constexpr std::size_t kTestRows = 360;
constexpr std::uint64_t kSplitSeed = 20261122;

struct Options {
  std::string data = DIST_EXAMPLE_DATA;
  int epochs = 30;
  int global_batch = 32;
  int hidden = 128;
  float lr = 0.1f;
  float momentum = 0.9f;
  std::uint64_t seed = 0;
  std::string checkpoint_dir;
  int checkpoint_every = 50;     // steps
  long crash_at_step = -1;       // on attempt 0, the last rank exits here
  long hang_at_step = -1;        // on attempt 0, the last rank stops making progress here
  long nan_at_step = -1;         // the last rank's batch holds a NaN at this step (a bad batch)
  std::string backend = "gloo";  // or nccl: the model on this rank's GPU
  bool in_place = false;         // survivors keep training when a peer fails (recovery.h)
  bool timestamps = false;       // the wall clock of a crash and of each process's first step
  sdk::Compression compression;
  sdk::SyncStrategy sync;
  bool snapshots = false;  // also dist-launch snapshots (--snapshot-memory) at checkpoints
};

struct Dataset {
  Matrix x;  // rows of 64 pixels scaled to 0..1
  std::vector<int> y;
};

// Reads the gzip'd CSV and splits it (a fixed permutation) into train and test.
std::pair<Dataset, Dataset> load_digits(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (!file) throw std::runtime_error("cannot open the data set '" + path + "' (see --data)");
  std::vector<std::vector<float>> rows;
  std::vector<int> labels;
  char line[4096];
  while (gzgets(file, line, sizeof line)) {
    std::stringstream fields(line);
    std::string field;
    std::vector<float> row;
    while (std::getline(fields, field, ',')) row.push_back(std::stof(field));
    if (row.size() != kInputs + 1) continue;
    labels.push_back(static_cast<int>(row.back()));
    row.pop_back();
    rows.push_back(std::move(row));
  }
  gzclose(file);
  if (rows.size() <= kTestRows) throw std::runtime_error("'" + path + "' has too few rows");
  const auto order = sdk::torch_randperm(rows.size(), kSplitSeed);
  auto take = [&](std::size_t begin, std::size_t end) {
    Dataset d{Matrix(static_cast<Eigen::Index>(end - begin), kInputs), {}};
    for (std::size_t i = begin; i < end; ++i) {
      const auto& row = rows[order[i]];
      for (int c = 0; c < kInputs; ++c) {
        d.x(static_cast<Eigen::Index>(i - begin), c) = row[static_cast<std::size_t>(c)] / 16.0f;
      }
      d.y.push_back(labels[order[i]]);
    }
    return d;
  };
  return {take(0, rows.size() - kTestRows), take(rows.size() - kTestRows, rows.size())};
}

// The model's parameters and gradients live in flat vectors the SDK can see; Eigen maps them.
struct Mlp {
  int hidden;
  std::vector<float> w1, b1, w2, b2, dw1, db1, dw2, db2, v_w1, v_b1, v_w2, v_b2;

  explicit Mlp(int h, std::uint64_t seed)
      : hidden(h),
        w1(static_cast<std::size_t>(h * kInputs)),
        b1(static_cast<std::size_t>(h)),
        w2(static_cast<std::size_t>(kClasses * h)),
        b2(kClasses),
        dw1(w1.size()),
        db1(b1.size()),
        dw2(w2.size()),
        db2(b2.size()),
        v_w1(w1.size()),
        v_b1(b1.size()),
        v_w2(w2.size()),
        v_b2(b2.size()) {
    std::mt19937 g(static_cast<std::uint32_t>(seed));
    auto init = [&](std::vector<float>& v, int fan_in) {  // PyTorch's Linear default range
      const float bound = 1.0f / std::sqrt(static_cast<float>(fan_in));
      std::uniform_real_distribution<float> u(-bound, bound);
      for (auto& x : v) x = u(g);
    };
    init(w1, kInputs);
    init(b1, kInputs);
    init(w2, h);
    init(b2, h);
  }

  MatrixMap W1() { return {w1.data(), hidden, kInputs}; }
  MatrixMap W2() { return {w2.data(), kClasses, hidden}; }

  std::vector<sdk::Parameter> parameters() {
    const auto h = static_cast<std::size_t>(hidden);
    return {{"w1", w1, dw1, {h, kInputs}},
            {"b1", b1, db1},
            {"w2", w2, dw2, {kClasses, h}},
            {"b2", b2, db2}};
  }

  // Logits for a batch of rows, and the hidden activations the backward pass needs.
  Matrix forward(const Matrix& x, Matrix* hidden_out) {
    Matrix h = (x * W1().transpose()).rowwise() + VectorMap(b1.data(), hidden).transpose();
    h = h.cwiseMax(0.0f);
    Matrix logits = (h * W2().transpose()).rowwise() + VectorMap(b2.data(), kClasses).transpose();
    if (hidden_out) *hidden_out = std::move(h);
    return logits;
  }

  // Mean cross-entropy over the batch; gradients written to d*, each layer's announced to DDP
  // as soon as it is computed (the last layer first), so its all-reduce overlaps the rest.
  float backward(const Matrix& x, const std::vector<int>& y, sdk::DistributedDataParallel& ddp) {
    Matrix h;
    Matrix p = forward(x, &h);
    const auto n = static_cast<float>(x.rows());
    float loss = 0;
    for (Eigen::Index r = 0; r < p.rows(); ++r) {
      const float max = p.row(r).maxCoeff();
      p.row(r) = (p.row(r).array() - max).exp();
      const float sum = p.row(r).sum();
      p.row(r) /= sum;
      const int label = y[static_cast<std::size_t>(r)];
      loss -= std::log(std::max(p(r, label), 1e-12f));
      p(r, label) -= 1.0f;
    }
    p /= n;  // d loss / d logits
    MatrixMap(dw2.data(), kClasses, hidden) = p.transpose() * h;
    VectorMap(db2.data(), kClasses) = p.colwise().sum().transpose();
    ddp.grad_ready(3);
    ddp.grad_ready(2);
    Matrix dh = (p * W2()).cwiseProduct((h.array() > 0.0f).cast<float>().matrix());
    MatrixMap(dw1.data(), hidden, kInputs) = dh.transpose() * x;
    VectorMap(db1.data(), hidden) = dh.colwise().sum().transpose();
    ddp.grad_ready(1);
    ddp.grad_ready(0);
    return loss / n;
  }

  void sgd_step(float lr, float momentum) {  // PyTorch's SGD: v = m v + g; p -= lr v
    auto step = [&](std::vector<float>& p, std::vector<float>& g, std::vector<float>& v) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        v[i] = momentum * v[i] + g[i];
        p[i] -= lr * v[i];
      }
    };
    step(w1, dw1, v_w1);
    step(b1, db1, v_b1);
    step(w2, dw2, v_w2);
    step(b2, db2, v_b2);
  }

  float accuracy(const Dataset& d) {
    const Matrix logits = forward(d.x, nullptr);
    int correct = 0;
    for (Eigen::Index r = 0; r < logits.rows(); ++r) {
      Eigen::Index best;
      logits.row(r).maxCoeff(&best);
      correct += best == d.y[static_cast<std::size_t>(r)] ? 1 : 0;
    }
    return static_cast<float>(correct) / static_cast<float>(logits.rows());
  }

  ddp_train::HostTensors tensors() { return {&w1, &b1, &w2, &b2, &v_w1, &v_b1, &v_w2, &v_b2}; }

  sdk::Checkpoint checkpoint(std::uint64_t step) const {
    return {step,
            {{"w1", w1},
             {"b1", b1},
             {"w2", w2},
             {"b2", b2},
             {"momentum/w1", v_w1},
             {"momentum/b1", v_b1},
             {"momentum/w2", v_w2},
             {"momentum/b2", v_b2}}};
  }
  void restore(const sdk::Checkpoint& c) {
    auto load = [&](const char* name, std::vector<float>& into) {
      const auto& v = c.tensors.at(name);
      if (v.size() != into.size()) {
        throw std::runtime_error(std::string("checkpoint tensor '") + name +
                                 "' does not fit this model (--hidden changed?)");
      }
      into = v;
    };
    load("w1", w1), load("b1", b1), load("w2", w2), load("b2", b2);
    load("momentum/w1", v_w1), load("momentum/b1", v_b1), load("momentum/w2", v_w2);
    load("momentum/b2", v_b2);
  }

  std::string weights_sha256() const {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int length = 0;
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
    for (const auto* v : {&w1, &b1, &w2, &b2}) {
      EVP_DigestUpdate(ctx, v->data(), v->size() * sizeof(float));
    }
    EVP_DigestFinal_ex(ctx, digest, &length);
    EVP_MD_CTX_free(ctx);
    char hex[2 * EVP_MAX_MD_SIZE + 1];
    for (unsigned i = 0; i < length; ++i) std::snprintf(hex + 2 * i, 3, "%02x", digest[i]);
    return std::string(hex, 2 * length);
  }
};

long long wall_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Rank 0's checkpoint is ddp_train.ckpt; another rank's own, ddp_train.rank<R>.ckpt.
std::filesystem::path checkpoint_path(const Options& o, int rank) {
  if (o.checkpoint_dir.empty()) return {};
  const std::string name =
      rank == 0 ? "ddp_train.ckpt" : "ddp_train.rank" + std::to_string(rank) + ".ckpt";
  return std::filesystem::path(o.checkpoint_dir) / name;
}

// Restores the model and DDP's state from `path` when it exists; returns the step to resume at.
// Every rank must resume at the same step.
std::uint64_t resume(const std::filesystem::path& path, sdk::ProcessGroup& group, Mlp& model,
                     sdk::DistributedDataParallel& ddp) {
  std::uint64_t step = 0;
  if (!path.empty()) {
    if (auto c = sdk::load_checkpoint(path)) {
      model.restore(*c);
      if (const auto state = c->blobs.find("ddp"); state != c->blobs.end()) {
        ddp.load_state(state->second);
      }
      step = c->step;
    }
  }
  std::vector<std::int64_t> low{static_cast<std::int64_t>(step)}, high = low;
  group.all_reduce(std::span<std::int64_t>(low), sdk::ReduceOp::kMin);
  group.all_reduce(std::span<std::int64_t>(high), sdk::ReduceOp::kMax);
  if (low[0] != high[0]) {
    throw std::runtime_error("the ranks' checkpoints are of different steps (" +
                             std::to_string(low[0]) + " to " + std::to_string(high[0]) + ") in " +
                             path.parent_path().string() + ": delete them to start over");
  }
  if (group.rank() == 0 && step > 0) {
    std::printf("resumed from %s at step %llu\n", path.c_str(), (unsigned long long)step);
  }
  return step;
}

// --snapshots: the newest snapshot every rank has (each keeps its two newest), when it is newer
// than `step` (the disk's); restores the model from it and returns its step, else returns `step`.
// Snapshots hold the weights only, never DDP's state (hence not with a lossy --compression or a
// local --sync, where that state differs between ranks).
std::uint64_t resume_from_snapshot(sdk::ProcessGroup& group, Mlp& model, std::uint64_t step) {
  const std::vector<std::uint64_t> own = sdk::snapshot_steps();
  std::vector<std::int64_t> newest{own.empty() ? 0 : static_cast<std::int64_t>(own.back())};
  group.all_reduce(std::span<std::int64_t>(newest), sdk::ReduceOp::kMin);
  const auto candidate = static_cast<std::uint64_t>(newest[0]);
  std::optional<sdk::Checkpoint> s;
  if (candidate > step) s = sdk::load_snapshot(candidate);
  std::vector<std::int64_t> everyone{s && s->step == candidate ? 1 : 0};
  group.all_reduce(std::span<std::int64_t>(everyone), sdk::ReduceOp::kMin);
  if (everyone[0] == 0) return step;
  model.restore(*s);
  if (group.rank() == 0) {
    std::printf("resumed from a snapshot at step %llu\n", (unsigned long long)candidate);
  }
  return candidate;
}

// The last lines: every rank's digest (they must all agree), rank 0's accuracy, throughput and
// bytes sent.
void finish(const Options& o, sdk::Distributed& dist, Mlp& model, sdk::DistributedDataParallel& ddp,
            const Dataset& test_set, std::uint64_t samples, double train_seconds) {
  const sdk::CommunicationStats sent = ddp.stats();  // the training steps' traffic only
  if (o.sync.local()) ddp.average_parameters();      // one model on every rank
  std::printf("rank %d weights sha256 %s\n", dist.env.rank, model.weights_sha256().c_str());
  if (dist.env.rank != 0) return;
  std::printf("throughput %.0f samples/s (%llu samples in %.3f s of training steps)\n",
              static_cast<double>(samples) / train_seconds, (unsigned long long)samples,
              train_seconds);
  std::printf("all-reduce bytes per step %llu (compression %s, sync %s, %llu steps)\n",
              (unsigned long long)sent.bytes_per_step(), o.compression.to_string().c_str(),
              o.sync.to_string().c_str(), (unsigned long long)sent.steps);
  if (o.compression.lossy()) {  // on the device the guard says nothing per step: here, once
    std::printf("inf/NaN guard: %llu bucket update(s) skipped, %llu residual(s) cleaned\n",
                (unsigned long long)sent.nonfinite_skipped,
                (unsigned long long)sent.nonfinite_cleaned);
  }
  if (const auto measured = sent.transport_bytes_per_step()) {  // Gloo: what its sockets sent
    std::printf(
        "transport bytes per step %llu (the group's TCP payload, the per-epoch loss "
        "all-reduce included)\n",
        (unsigned long long)*measured);
  }
  std::printf("final test accuracy %.4f weights sha256 %s\n", model.accuracy(test_set),
              model.weights_sha256().c_str());
}

// What decides what the loop runs next: the step (with it the epoch and the sampler's position),
// the epochs reported, the last checkpoint's step and this epoch's loss sums. Under --in-place it
// is, with the model and the optimizer's momentum, what a replacement receives.
struct Progress {
  std::uint64_t step = 0;
  std::uint64_t epochs_reported = 0;
  std::uint64_t checkpointed = 0;
  float loss_sum = 0;
  std::uint64_t batches = 0;
};

// --in-place: the model, the optimizer's momentum, the progress and DDP's state, registered with
// the SDK's recovery (dist/sdk/recovery.h).
void register_state(sdk::RecoverableState& state, Mlp& model, Progress& p,
                    std::optional<sdk::DistributedDataParallel>& ddp) {
  const std::pair<const char*, std::vector<float>*> tensors[] = {{"w1", &model.w1},
                                                                 {"b1", &model.b1},
                                                                 {"w2", &model.w2},
                                                                 {"b2", &model.b2},
                                                                 {"momentum/w1", &model.v_w1},
                                                                 {"momentum/b1", &model.v_b1},
                                                                 {"momentum/w2", &model.v_w2},
                                                                 {"momentum/b2", &model.v_b2}};
  for (const auto& [name, tensor] : tensors) state.add(name, std::span<float>(*tensor));
  state.add("step", p.step);
  state.add("epochs_reported", p.epochs_reported);
  state.add("checkpointed", p.checkpointed);
  state.add("batches", p.batches);
  state.add("loss_sum", p.loss_sum);
  state.add_blob(
      "ddp", [&] { return ddp->state(); },
      [&](const std::string& saved) { ddp->load_state(saved); });
}

// Says why this rank fails: one line on stderr (one write: the agent stops this worker when a peer
// fails, and a line cut between two writes would say "error: " and nothing else) and the error
// file.
void report_failure(const std::string& what) {
  const std::string line = "ddp_train: error: " + what + "\n";
  [[maybe_unused]] const auto written = ::write(STDERR_FILENO, line.data(), line.size());
  sdk::write_error_file(what);
}

// A failure already said (by train(), while the group was still up).
struct ReportedFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int train_with(const Options& o, sdk::Distributed& dist) {
  const bool on_gpu = o.backend == "nccl";
  const sdk::WorkerEnv& env = dist.env;  // (its generation advances at each in-place recovery)
  if (o.global_batch % env.world_size != 0) {
    throw std::runtime_error("--global-batch " + std::to_string(o.global_batch) +
                             " is not divisible by the world size " +
                             std::to_string(env.world_size));
  }
  const bool chief = env.rank == 0;
  const long pid = static_cast<long>(::getpid());

  const auto [train_set, test_set] = load_digits(o.data);
  Mlp model(o.hidden, o.seed);
  const std::size_t local_batch = static_cast<std::size_t>(o.global_batch / env.world_size);
  std::unique_ptr<ddp_train::DeviceMlp> gpu;  // --backend nccl: the model lives there
  if (on_gpu) {
    gpu = ddp_train::make_device_mlp(dist.group->cuda_device(), kInputs, o.hidden, kClasses,
                                     local_batch);
    gpu->upload(model.tensors());
  }
  sdk::DdpOptions ddp_options = gpu ? gpu->ddp_options() : sdk::DdpOptions{};
  ddp_options.compression = o.compression;
  ddp_options.sync = o.sync;
  // DDP holds the group: under --in-place it is made again with each new generation's group.
  std::optional<sdk::DistributedDataParallel> ddp;
  const auto build_ddp = [&](sdk::ProcessGroup& g) {
    ddp.emplace(g, gpu ? gpu->parameters() : model.parameters(), ddp_options);
  };
  Progress p;
  std::optional<sdk::InPlaceRecovery> recovery;
  if (o.in_place) {
    std::printf("ddp_train: rank %d pid %ld generation %d (in place)\n", env.rank, pid,
                env.generation);
    std::fflush(stdout);
    recovery.emplace(dist);
    register_state(recovery->state(), model, p, ddp);
    recovery->on_group(build_ddp, [&] { ddp.reset(); });
    recovery->start();  // a replacement receives the survivors' state here
  } else {
    build_ddp(*dist.group);
  }
  // Residuals and local weights differ between ranks: then every rank checkpoints its own.
  const bool own_state = o.compression.lossy() || o.sync.local();
  const std::filesystem::path ckpt_path = checkpoint_path(o, own_state ? env.rank : 0);
  sdk::DistributedSampler sampler({static_cast<std::size_t>(train_set.x.rows()), env.world_size,
                                   env.rank, true, o.seed, false});
  const std::size_t steps_per_epoch = (sampler.num_samples() + local_batch - 1) / local_batch;
  if (env.generation == 0) {
    p.step = resume(ckpt_path, *dist.group, model, *ddp);
    if (o.snapshots) p.step = resume_from_snapshot(*dist.group, model, p.step);
    p.checkpointed = p.step;
    p.epochs_reported = p.step / steps_per_epoch;
    if (gpu && p.step > 0) gpu->upload(model.tensors());  // the checkpoint's weights on the device
  }
  if (chief && env.generation == 0) {
    std::printf(
        "ddp_train: %d ranks, %zu train / %zu test rows, global batch %d (%zu per rank), "
        "%zu steps per epoch, attempt %d\n",
        env.world_size, static_cast<std::size_t>(train_set.x.rows()),
        static_cast<std::size_t>(test_set.x.rows()), o.global_batch, local_batch, steps_per_epoch,
        env.restart_count);
  }

  // The loop runs units, each decided by the progress alone. Each unit issues its collectives
  // before it changes the progress or the model, so that a unit a failed peer interrupted left
  // them as they were and can run again (--in-place: recovery.h).
  const std::uint64_t total_steps = steps_per_epoch * static_cast<std::uint64_t>(o.epochs);
  double train_seconds = 0;   // in training steps only (not evaluation or checkpoints)
  std::uint64_t samples = 0;  // global samples trained on
  std::vector<std::size_t> indices;
  std::uint64_t indices_epoch = ~std::uint64_t{0};
  std::string first_step_since = "start";
  // --timestamps, after a step: the first of this process (or since its recovery), the crash
  // step once trained again. bench/recovery_bench.py reads these lines.
  const auto stamp = [&] {
    const auto done = static_cast<long>(p.step) - 1;
    if (!first_step_since.empty()) {
      std::printf("ddp_train: rank %d step %ld done at wall_ns %lld (first since %s)\n", env.rank,
                  done, wall_ns(), first_step_since.c_str());
    }
    if (done == o.crash_at_step) {
      std::printf("ddp_train: rank %d step %ld done at wall_ns %lld (the crash step)\n", env.rank,
                  done, wall_ns());
    }
    std::fflush(stdout);
    first_step_since.clear();
  };
  const auto train_step = [&] {
    const std::uint64_t epoch = p.step / steps_per_epoch;
    if (epoch != indices_epoch) {
      sampler.set_epoch(epoch);
      indices = sampler.indices();
      indices_epoch = epoch;
    }
    const std::size_t begin = (p.step % steps_per_epoch) * local_batch;
    const std::size_t end = std::min(indices.size(), begin + local_batch);
    Matrix x(static_cast<Eigen::Index>(end - begin), kInputs);
    std::vector<int> y;
    for (std::size_t i = begin; i < end; ++i) {
      x.row(static_cast<Eigen::Index>(i - begin)) =
          train_set.x.row(static_cast<Eigen::Index>(indices[i]));
      y.push_back(train_set.y[indices[i]]);
    }
    if (env.restart_count == 0 && env.generation == 0 &&
        static_cast<long>(p.step) == o.crash_at_step && env.rank == env.world_size - 1) {
      const std::string what = "InjectedCrash: --crash-at-step " + std::to_string(p.step) +
                               " on rank " + std::to_string(env.rank);
      std::fprintf(stderr, "ddp_train: injected crash at step %llu on rank %d%s\n",
                   (unsigned long long)p.step, env.rank,
                   o.timestamps ? (" at wall_ns " + std::to_string(wall_ns())).c_str() : "");
      sdk::write_error_file(what,
                            "ddp_train.cc: train(), attempt 0, step " + std::to_string(p.step));
      std::fflush(stdout);
      std::_Exit(3);
    }
    if (env.restart_count == 0 && env.generation == 0 &&
        static_cast<long>(p.step) == o.hang_at_step && env.rank == env.world_size - 1) {
      std::fprintf(stderr, "ddp_train: injected hang at step %llu on rank %d\n",
                   (unsigned long long)p.step, env.rank);
      for (;;) ::pause();  // what a rank stuck outside any collective looks like
    }
    if (static_cast<long>(p.step) == o.nan_at_step && env.rank == env.world_size - 1) {
      x(0, 0) = std::numeric_limits<float>::quiet_NaN();  // every gradient of this rank is NaN
      std::fprintf(stderr, "ddp_train: a NaN in rank %d's batch at step %llu\n", env.rank,
                   (unsigned long long)p.step);
    }
    const auto step_start = std::chrono::steady_clock::now();
    const float loss =
        gpu ? gpu->backward(x.data(), y.data(), y.size(), *ddp) : model.backward(x, y, *ddp);
    ddp->synchronize();
    gpu ? gpu->sgd_step(o.lr, o.momentum) : model.sgd_step(o.lr, o.momentum);
    ddp->after_step();
    train_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    samples += static_cast<std::uint64_t>(x.rows()) * static_cast<std::uint64_t>(env.world_size);
    if (std::isfinite(loss)) p.loss_sum += loss;  // a bad batch's loss says nothing of the model
    ++p.batches;
    ++p.step;
    if (o.timestamps) stamp();
    if (o.snapshots && p.step % static_cast<std::uint64_t>(o.checkpoint_every) == 0) {
      if (gpu) gpu->download(model.tensors());
      sdk::save_snapshot(model.checkpoint(p.step));  // every rank its own, no barrier
    }
  };
  const auto checkpoint = [&] {
    if (gpu) gpu->download(model.tensors());
    if (chief || own_state) {
      sdk::Checkpoint c = model.checkpoint(p.step);
      c.blobs["ddp"] = ddp->state();
      sdk::save_checkpoint(ckpt_path, c);
    }
    dist.group->barrier();  // no rank runs ahead of a checkpoint that is not on disk yet
    p.checkpointed = p.step;
  };
  const auto report_epoch = [&] {
    std::vector<float> mean_loss{p.batches ? p.loss_sum / static_cast<float>(p.batches) : 0.0f};
    if (gpu) {
      mean_loss[0] = gpu->average(*dist.group, mean_loss[0]);
      gpu->download(model.tensors());  // for the accuracy
    } else {
      dist.group->all_reduce(std::span<float>(mean_loss), sdk::ReduceOp::kAvg);
    }
    if (chief) {
      std::printf("epoch %2d  loss %.4f  test accuracy %.4f\n",
                  static_cast<int>(p.epochs_reported) + 1, mean_loss[0], model.accuracy(test_set));
      std::fflush(stdout);
    }
    p.loss_sum = 0;
    p.batches = 0;
    ++p.epochs_reported;
  };
  const int world_size = env.world_size;
  const auto run = [&](const std::function<void()>& unit) {
    if (!recovery) return unit();
    if (recovery->run(unit)) return;
    if (o.timestamps) first_step_since = "recovery";
    // A regrouped job (a node lost or joined) goes on in another world (recovery.h): this
    // example's sampler, batch and epochs are sized for the world it started in, so it stops
    // rather than train on a wrong shard; the agent then restarts the group, sized anew.
    if (env.world_size != world_size) {
      throw std::runtime_error("the job regrouped this worker as rank " + std::to_string(env.rank) +
                               " of " + std::to_string(env.world_size) + " (was " +
                               std::to_string(world_size) +
                               " ranks): ddp_train shards its data for the world it started in; "
                               "the group restarts from its last checkpoint");
    }
  };
  while (true) {
    const bool checkpoint_due = !ckpt_path.empty() && p.step > p.checkpointed &&
                                p.step % static_cast<std::uint64_t>(o.checkpoint_every) == 0;
    if (checkpoint_due) {
      run(checkpoint);
    } else if (p.epochs_reported < p.step / steps_per_epoch) {
      run(report_epoch);
    } else if (p.step < total_steps) {
      run(train_step);
    } else {
      break;
    }
  }
  finish(o, dist, model, *ddp, test_set, samples, train_seconds);
  if (o.in_place) {
    std::printf("ddp_train: rank %d pid %ld generation %d finished\n", env.rank, pid,
                env.generation);
  }
  std::fflush(stdout);
  dist.group->barrier();
  return 0;
}

// Under dist-launch, or alone (then rank 0 of 1 with a private store). A failure is said while
// this rank's group is up: its peers see it gone (and fail, and the agent stops the rest) only
// after its error file exists, so the report names it as the root cause, not a peer's "connection
// reset" (a failure said after the unwinding closed the group's sockets raced the agent's stop).
int train(const Options& o) {
  sdk::Distributed dist =
      sdk::init(o.backend == "nccl" ? sdk::Backend::kNccl : sdk::Backend::kGloo);
  try {
    return train_with(o, dist);
  } catch (const std::exception& e) {
    report_failure(e.what());
    throw ReportedFailure(e.what());
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "ddp_train: data-parallel MLP training on the digits data set (run under dist-launch "
      "--no-python, or alone)"};
  app.add_option("--data", o.data, "digits.csv.gz")->capture_default_str();
  app.add_option("--epochs", o.epochs)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--global-batch", o.global_batch)
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--hidden", o.hidden)->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--lr", o.lr)->capture_default_str();
  app.add_option("--momentum", o.momentum)->capture_default_str();
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "Save and resume from here");
  app.add_option("--checkpoint-every", o.checkpoint_every, "Steps between checkpoints")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--crash-at-step", o.crash_at_step,
                 "On restart attempt 0, the last rank exits with code 3 at this step");
  app.add_option("--hang-at-step", o.hang_at_step,
                 "On restart attempt 0, the last rank stops making progress at this step (its "
                 "peers wait for it in their next all-reduce): for dist-launch's hang detection");
  app.add_option("--nan-at-step", o.nan_at_step,
                 "The last rank's batch holds a NaN at this step (a bad batch): what DDP and its "
                 "compression make of an inf or NaN gradient");
  app.add_option("--backend", o.backend,
                 "gloo: the model on the CPU; nccl: on this rank's GPU, DDP over NCCL")
      ->check(CLI::IsMember({"gloo", "nccl"}))
      ->capture_default_str();
  std::string compression = "none", sync = "every-step";
  app.add_option("--compression", compression,
                 "Gradient compression: none, fp16, bf16, topk:RATIO, threshold:T, "
                 "powersgd:RANK[:WARMUP]")
      ->capture_default_str();
  app.add_option("--sync", sync, "Synchronisation: every-step, partial:CHUNKS, local-sgd:K")
      ->capture_default_str();
  app.add_flag("--timestamps", o.timestamps,
               "Print the wall clock of an injected crash, of each process's first step (after its "
               "start, or after an in-place recovery) and of --crash-at-step's step once trained: "
               "bench/recovery_bench.py");
  app.add_flag("--in-place", o.in_place,
               "Under dist-launch --restart-policy in-place: when a peer fails, keep this process, "
               "rebuild the group with its replacement and give it the model, the optimizer's "
               "state and the step (the step in flight is run again)");
  app.add_flag("--snapshots", o.snapshots,
               "Also keep snapshots in dist-launch's memory (--snapshot-memory) at checkpoint "
               "steps, and resume from the newest that every rank has");
  try {
    app.parse(argc, argv);
    o.compression = sdk::Compression::parse(compression);
    o.sync = sdk::SyncStrategy::parse(sync);
    if (o.compression.lossy() && o.sync.local()) {
      throw std::invalid_argument("--compression " + compression +
                                  " compresses gradients, which --sync " + sync +
                                  " does not exchange: use one or the other");
    }
    if (o.in_place && (o.backend != "gloo" || o.compression.lossy() || o.sync.local())) {
      throw std::invalid_argument(
          "--in-place gives a replacement a survivor's state, which must be every rank's: the "
          "model in host memory (--backend gloo) and no per-rank residuals or weights (no lossy "
          "--compression, --sync every-step)");
    }
    if (o.snapshots && (o.compression.lossy() || o.sync.local())) {
      throw std::invalid_argument(
          "--snapshots keeps the weights only, not the per-rank state of --compression " +
          compression + " or --sync " + sync + ": use --checkpoint-dir alone");
    }
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "ddp_train: error: " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "ddp_train: error: " << e.what() << "\n";
    return 2;
  }
  try {
    return train(o);
  } catch (const ReportedFailure&) {
    return 1;
  } catch (const std::exception& e) {
    report_failure(e.what());
    return 1;
  }
}
