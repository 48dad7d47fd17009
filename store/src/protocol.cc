#include "protocol.h"

#include <array>

namespace dist::store::wire {
namespace {

static_assert(
    [] {
      for (std::size_t i = 0; i < std::size(kOps); ++i) {
        if (static_cast<std::size_t>(kOps[i].op) != i) return false;
      }
      return std::size(kOps) == static_cast<std::size_t>(Op::kDeleteAllExcept) + 1;
    }(),
    "kOps lists every Op once, in the enum's order");

// Byte to operation, per dialect, built from kOps (-1: no such operation).
using ByteTable = std::array<std::int8_t, 256>;
constexpr ByteTable by_byte(bool legacy) {
  ByteTable table{};
  table.fill(-1);
  for (const OpInfo& info : kOps) {
    const std::int16_t byte = legacy ? info.legacy_byte : info.current_byte;
    if (byte >= 0) table[static_cast<std::size_t>(byte)] = static_cast<std::int8_t>(info.op);
  }
  return table;
}
constexpr ByteTable kLegacyOps = by_byte(true);
constexpr ByteTable kCurrentOps = by_byte(false);

}  // namespace

std::optional<Op> decode_op(Dialect dialect, std::uint8_t byte) {
  const std::int8_t op = (dialect == Dialect::kLegacy ? kLegacyOps : kCurrentOps)[byte];
  if (op < 0) return std::nullopt;
  return static_cast<Op>(op);
}

std::uint8_t encode_op(Op op) {
  const OpInfo& info = op_info(op);
  return static_cast<std::uint8_t>(info.current_byte >= 0 ? info.current_byte : info.legacy_byte);
}

}  // namespace dist::store::wire
