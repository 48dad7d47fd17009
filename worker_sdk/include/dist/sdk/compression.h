// How DistributedDataParallel communicates: gradient compression and synchronisation strategies,
// one of each per job, written as short specs on command lines ("topk:0.01", "local-sgd:8").
//
// Compression (of the gradients DDP averages every step):
//   none            full precision (the default)
//   fp16, bf16      each bucket cast to 16 bits before its all-reduce (divided by the world size
//                   first, as torch's fp16 hook does, so the sum cannot overflow). fp16 over host
//                   buffers scales dynamically: a step whose average overflowed (skipped, as
//                   below) halves the bucket's scale (down to 1/256), 1000 clean steps double it,
//                   up to 1
//   topk:RATIO      each rank sends the k = ceil(RATIO x n) largest-magnitude entries of each
//                   bucket (index and value), 0 < RATIO <= 1; the others wait in the residual
//   threshold:T     each rank sends the entries whose magnitude is at least T (T > 0)
//   powersgd:RANK[:WARMUP]
//                   PowerSGD (Vogels et al., torch's powerSGD_hook): every 2-D parameter M
//                   (shape[0] x the rest) is sent as P = M Q and Q = M^T P of rank RANK, with warm
//                   start (Q kept from the last step); one-dimensional parameters, and those where
//                   (rows + cols) x RANK x 2 >= rows x cols, are sent uncompressed. The first
//                   WARMUP steps (none when omitted) are averaged whole, as torch's
//                   start_powerSGD_iter
// The sparse modes send (index, value) pairs, all-gathered: k pairs from each of the world's W
// ranks cost as much as a ring all-reduce of the bucket in float32 once k x W reaches n. A bucket
// where they would cost more is averaged whole instead, by that all-reduce (top-k: decided once,
// and said; threshold: at each step, from the largest count), with nothing left in its residual.
// Every lossy mode keeps an error-feedback residual per bucket: what a step did not send is added
// to the next step's gradient, so nothing is lost for good. An inf or NaN never poisons that
// state: a bucket whose average holds one is not applied (its averaged gradients are zeros, as a
// skipped step's) and its residual and PowerSGD's Q are reset on every rank; the events are counted
// (CommunicationStats) and, with host buffers, said on stderr.
//
// Synchronisation:
//   every-step      gradients averaged every step (the default; compression applies here)
//   partial:CHUNKS  SINGA's partial update: every rank steps with its own gradients, then one of
//                   CHUNKS slices of the parameters is averaged (slice s mod CHUNKS at step s)
//   local-sgd:K     local SGD: every rank steps with its own gradients; all parameters are
//                   averaged every K steps
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dist::sdk {

struct Compression {
  enum class Kind { kNone, kFp16, kBf16, kTopK, kThreshold, kPowerSgd };
  Kind kind = Kind::kNone;
  double ratio = 0;          // kTopK
  float threshold = 0;       // kThreshold
  int rank = 0;              // kPowerSgd
  std::uint64_t seed = 0;    // kPowerSgd: the random start of Q (the same on every rank)
  std::uint64_t warmup = 0;  // kPowerSgd: the first steps, averaged whole (0: none)

  // Parses a spec as above; std::invalid_argument with a one-line message on anything else.
  static Compression parse(std::string_view spec);
  // The spec this parses from.
  std::string to_string() const;
  // Keeps a residual (fp16, bf16, topk, threshold, powersgd).
  bool lossy() const { return kind != Kind::kNone; }
  bool operator==(const Compression&) const = default;
};

struct SyncStrategy {
  enum class Kind { kEveryStep, kPartial, kLocalSgd };
  Kind kind = Kind::kEveryStep;
  int chunks = 0;  // kPartial
  int period = 0;  // kLocalSgd

  static SyncStrategy parse(std::string_view spec);
  std::string to_string() const;
  // Gradients stay on each rank; parameters are averaged after the optimizer step instead.
  bool local() const { return kind != Kind::kEveryStep; }
  bool operator==(const SyncStrategy&) const = default;
};

}  // namespace dist::sdk
