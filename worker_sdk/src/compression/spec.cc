// Parsing and printing of the compression and synchronisation specs (compression.h).
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "dist/sdk/compression.h"

namespace dist::sdk {
namespace {

constexpr const char* kCompressionSpecs =
    "none, fp16, bf16, topk:RATIO, threshold:T, powersgd:RANK[:WARMUP]";
constexpr const char* kSyncSpecs = "every-step, partial:CHUNKS, local-sgd:K";
constexpr int kMaxRank = 1024;

[[noreturn]] void bad(const char* what, std::string_view spec, const std::string& why,
                      const char* specs) {
  throw std::invalid_argument(std::string(what) + " spec '" + std::string(spec) + "': " + why +
                              " (specs: " + specs + ")");
}

// "name:value" into its two halves; no colon: value is empty and has_value false.
struct Split {
  std::string_view name, value;
  bool has_value = false;
};
Split split(std::string_view spec) {
  const auto colon = spec.find(':');
  if (colon == std::string_view::npos) return {spec, {}, false};
  return {spec.substr(0, colon), spec.substr(colon + 1), true};
}

template <typename T>
bool parse_number(std::string_view text, T& out) {
  if (text.empty()) return false;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  return error == std::errc() && end == text.data() + text.size();
}

template <typename T>
std::string number_text(T value) {
  char buffer[64];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return error == std::errc() ? std::string(buffer, end) : std::string("?");
}

int positive_int(const char* what, std::string_view spec, const Split& s, const char* name, int max,
                 const char* specs) {
  int value = 0;
  if (!s.has_value || !parse_number(s.value, value) || value < 1 || value > max) {
    bad(what, spec, std::string(name) + " must be an integer from 1 to " + std::to_string(max),
        specs);
  }
  return value;
}

}  // namespace

Compression Compression::parse(std::string_view spec) {
  constexpr const char* kWhat = "compression";
  const Split s = split(spec);
  Compression c;
  auto no_value = [&](Kind kind) {
    if (s.has_value)
      bad(kWhat, spec, "'" + std::string(s.name) + "' takes no value", kCompressionSpecs);
    c.kind = kind;
    return c;
  };
  if (s.name == "none") return no_value(Kind::kNone);
  if (s.name == "fp16") return no_value(Kind::kFp16);
  if (s.name == "bf16") return no_value(Kind::kBf16);
  if (s.name == "topk") {
    if (!s.has_value || !parse_number(s.value, c.ratio) || !std::isfinite(c.ratio) ||
        c.ratio <= 0 || c.ratio > 1) {
      bad(kWhat, spec, "RATIO must be a number in (0, 1], such as topk:0.01", kCompressionSpecs);
    }
    c.kind = Kind::kTopK;
    return c;
  }
  if (s.name == "threshold") {
    if (!s.has_value || !parse_number(s.value, c.threshold) || !std::isfinite(c.threshold) ||
        c.threshold <= 0) {
      bad(kWhat, spec, "T must be a positive number, such as threshold:0.001", kCompressionSpecs);
    }
    c.kind = Kind::kThreshold;
    return c;
  }
  if (s.name == "powersgd") {  // RANK[:WARMUP]
    const Split rank = split(s.value);
    c.rank = positive_int(kWhat, spec, {s.name, rank.name, s.has_value}, "RANK", kMaxRank,
                          kCompressionSpecs);
    if (rank.has_value && (!parse_number(rank.value, c.warmup) || c.warmup < 1)) {
      bad(kWhat, spec, "WARMUP must be a positive number of steps, such as powersgd:2:1000",
          kCompressionSpecs);
    }
    c.kind = Kind::kPowerSgd;
    return c;
  }
  bad(kWhat, spec, "unknown compression", kCompressionSpecs);
}

std::string Compression::to_string() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kFp16:
      return "fp16";
    case Kind::kBf16:
      return "bf16";
    case Kind::kTopK:
      return "topk:" + number_text(ratio);
    case Kind::kThreshold:
      return "threshold:" + number_text(threshold);
    case Kind::kPowerSgd:
      return "powersgd:" + std::to_string(rank) +
             (warmup ? ":" + std::to_string(warmup) : std::string());
  }
  return "?";
}

SyncStrategy SyncStrategy::parse(std::string_view spec) {
  constexpr const char* kWhat = "sync";
  const Split s = split(spec);
  SyncStrategy out;
  if (s.name == "every-step") {
    if (s.has_value) bad(kWhat, spec, "'every-step' takes no value", kSyncSpecs);
    return out;
  }
  if (s.name == "partial") {
    out.chunks =
        positive_int(kWhat, spec, s, "CHUNKS", std::numeric_limits<int>::max(), kSyncSpecs);
    out.kind = Kind::kPartial;
    return out;
  }
  if (s.name == "local-sgd") {
    out.period = positive_int(kWhat, spec, s, "K", std::numeric_limits<int>::max(), kSyncSpecs);
    out.kind = Kind::kLocalSgd;
    return out;
  }
  bad(kWhat, spec, "unknown strategy", kSyncSpecs);
}

std::string SyncStrategy::to_string() const {
  switch (kind) {
    case Kind::kEveryStep:
      return "every-step";
    case Kind::kPartial:
      return "partial:" + std::to_string(chunks);
    case Kind::kLocalSgd:
      return "local-sgd:" + std::to_string(period);
  }
  return "?";
}

}  // namespace dist::sdk
