// Proof that some ranks can never go on: their collectives can never match (the hang detector
// ends ranks by default only on such proof, or on a stopped process: hang_detector.h). Plain
// values in, plain answers out.
//
// Each rank says, for every process group it is in, how many collectives it issued there (torch:
// the group's own sequence number, the same count on every rank; the SDK: its one sequence as
// group 0), and the one it is blocked in, when it is: the same in two looks seconds apart, its
// process idle meanwhile. Two things cannot end:
//   - ranks blocked in the same collective of a group (the same number) with different
//     operations (an all_reduce against a barrier): the ranks in the minority's operation (all of
//     them when there is no majority) are the cause;
//   - a cycle of waits: rank A blocked in collective n of a group that rank B, a member of it, has
//     not issued yet (B issued fewer), and B blocked in one that A has not issued, and so on back
//     to A. Nobody in the cycle can issue what the next one waits for. The ranks of the cycle whose
//     count in a group it waits in differs from the majority's are the cause (they went past a
//     collective the others wait in, or issued one too many); without a majority (two ranks),
//     all of the cycle.
// A rank waiting for one that is not blocked (computing, writing a checkpoint, asleep) proves
// nothing: that one may come. And torch's counts are comparable across ranks only while nobody can
// move: torch numbers a send or a receive in its group's sequence on its two ranks only (gloo), so
// that after one the same number is another collective on the group's other ranks, and a rank
// that issued fewer may have issued what a peer waits in. So the proofs take only the ranks that
// stand still: blocked in a group every member of which is blocked too (all of its ranks known,
// by its size), and so on for the groups those wait in. Such ranks can never go on, whatever the
// numbers say; the numbers only tell which of them are the cause. A rank whose main thread waits
// while another thread of its own may issue a collective (kActivityThreads) is not blocked here.
// The SDK's one sequence (group 0) numbers every collective of a rank's, on every rank alike: its
// waits prove as they are.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dist::agent {

struct CollectiveState {
  int rank = 0;
  std::map<std::uint64_t, std::uint64_t> seqs;   // group id -> collectives issued on it
  std::vector<std::uint64_t> order;              // its groups' ids, in the order it made them
  std::map<std::uint64_t, std::uint32_t> sizes;  // group id -> ranks in it (absent or 0: unknown)
  struct Wait {
    std::uint64_t group = 0;
    std::uint64_t seq = 0;  // the collective's number in that group
    std::uint32_t op = 0;   // worker_contract.h's Collective
    double seconds = 0;     // blocked in it for
  };
  std::optional<Wait> wait;  // blocked, stably and idle, by itself alone; none otherwise
};

struct Mismatch {
  std::vector<int> causes;    // ranks, ascending
  std::vector<int> involved;  // every rank of the proof, causes included, ascending
  std::string why;            // one sentence naming the ranks and collectives
};

std::optional<Mismatch> prove_mismatch(const std::vector<CollectiveState>& ranks);

// "all_reduce", "barrier", ... for worker_contract.h's Collective; "a collective" for kOther,
// "none" for kNone and values it does not know.
std::string collective_name(std::uint32_t op);

// " of process group 1" (group_label); "" for the SDK's one sequence, group 0.
std::string group_text(std::uint64_t group, const std::vector<std::uint64_t>& order);
// "process group 2": torch's own number of the group (its name, the same on every rank), else its
// place in `order` (a rank's groups), else "a process group".
std::string group_label(std::uint64_t group, const std::vector<std::uint64_t>& order);
// "all_reduce #17 of process group 1".
std::string collective_text(std::uint32_t op, std::uint64_t seq, std::uint64_t group,
                            const std::vector<std::uint64_t>& order);

}  // namespace dist::agent
