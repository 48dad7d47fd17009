// The snapshot files' constants, for the two C++ sides that read them: the workers' SDK
// (worker_sdk/src/snapshot.cc writes and reads them) and the agent (agent/src/warm/
// snapshot_store.cc persists them, checking each copy whole). docs/SNAPSHOTS.md is the format;
// python/dist_launch/snapshot.py holds the same values, written by contract/python_constants.py.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dist::snapshot_format {

inline constexpr int kFormat = 2;
inline constexpr char kMagic[8] = {'D', 'L', 'S', 'N', 'A', 'P', '0', '2'};
inline constexpr char kFooterTag[8] = {'D', 'L', 'S', 'N', 'A', 'P', 'O', 'K'};
inline constexpr std::size_t kPrefixBytes = 16;  // magic, header length (u64)
inline constexpr std::size_t kFooterBytes = 24;  // tag, the file's size (u64), save id (u64)
inline constexpr std::uint64_t kAlign = 64;      // of the skeleton and each tensor
inline constexpr std::uint64_t kMaxHeaderBytes = 1ULL << 30;
inline constexpr char kRankFolderPrefix[] = "rank_";  // rank_<global rank>
inline constexpr char kRanksFile[] =
    ".ranks";  // the ranks this node runs (the agent's), a line each
// A save rewrites (recycles) a file in place only under its exclusive flock, taken without
// waiting; a mapped load holds its shared flock. A file a load maps is renamed <this><its name>
// instead (out of the rank's saves, still counted in the memory they hold), and removed by a
// later save once nothing maps it. docs/SNAPSHOTS.md, "Mapped loads".
inline constexpr char kHeldPrefix[] = ".held.";

}  // namespace dist::snapshot_format
