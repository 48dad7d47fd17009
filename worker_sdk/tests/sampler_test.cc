// DistributedSampler against PyTorch's own, case by case, through a real torch in Python.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "dist/sdk/sampler.h"

namespace dist::sdk {
namespace {

struct Case {
  std::size_t n;
  int world;
  bool shuffle;
  bool drop_last;
  std::uint64_t seed;
  std::uint64_t epoch;
};

const Case kCases[] = {
    {10, 3, true, false, 0, 0},     {10, 3, true, true, 0, 1},   {7, 3, true, false, 5, 2},
    {3, 5, true, false, 1, 0},      {3, 5, false, false, 0, 0},  {11, 4, true, true, 42, 7},
    {11, 4, false, true, 0, 0},     {100, 1, true, false, 3, 3}, {1797, 2, true, false, 0, 9},
    {1797, 8, true, true, 1234, 4}, {64, 8, true, false, 0, 0},  {5, 2, true, false, 9, 1000},
};

// {"n,world,shuffle,drop_last,seed,epoch": [[rank 0 indices], [rank 1 indices], ...], ...}
constexpr const char* kTorchScript = R"PY(
import json, sys
from torch.utils.data.distributed import DistributedSampler
out = {}
for case in json.loads(sys.argv[1]):
    n, world, shuffle, drop_last, seed, epoch = case
    per_rank = []
    for rank in range(world):
        s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=bool(shuffle),
                               seed=seed, drop_last=bool(drop_last))
        s.set_epoch(epoch)
        per_rank.append(list(s))
    out[",".join(map(str, case))] = per_rank
print(json.dumps(out))
)PY";

std::string run_torch(const std::string& cases_json) {
  std::string script = kTorchScript;
  std::string command = "/usr/bin/python3 -c '" + script + "' '" + cases_json + "' 2>/dev/null";
  FILE* pipe = ::popen(command.c_str(), "r");
  std::string out;
  std::array<char, 65536> buffer{};
  while (pipe && std::fgets(buffer.data(), buffer.size(), pipe)) out += buffer.data();
  const int status = pipe ? ::pclose(pipe) : -1;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? out : "";
}

TEST(DistributedSampler, MatchesPyTorchExactly) {
  nlohmann::json cases = nlohmann::json::array();
  for (const Case& c : kCases) {
    cases.push_back({c.n, c.world, c.shuffle ? 1 : 0, c.drop_last ? 1 : 0, c.seed, c.epoch});
  }
  const std::string torch_out = run_torch(cases.dump());
  if (torch_out.empty()) GTEST_SKIP() << "no torch in /usr/bin/python3 to compare against";
  const nlohmann::json expected = nlohmann::json::parse(torch_out);

  for (const Case& c : kCases) {
    const std::string key = std::to_string(c.n) + "," + std::to_string(c.world) + "," +
                            (c.shuffle ? "1" : "0") + "," + (c.drop_last ? "1" : "0") + "," +
                            std::to_string(c.seed) + "," + std::to_string(c.epoch);
    SCOPED_TRACE(key);
    for (int rank = 0; rank < c.world; ++rank) {
      DistributedSampler sampler({c.n, c.world, rank, c.shuffle, c.seed, c.drop_last});
      sampler.set_epoch(c.epoch);
      const auto mine = sampler.indices();
      const auto theirs =
          expected.at(key).at(static_cast<std::size_t>(rank)).get<std::vector<std::size_t>>();
      EXPECT_EQ(mine, theirs) << "rank " << rank;
      EXPECT_EQ(sampler.num_samples(), theirs.size()) << "rank " << rank;
    }
  }
}

TEST(DistributedSampler, RanksPartitionTheDataWhenNothingIsPadded) {
  std::vector<int> seen(12, 0);
  for (int rank = 0; rank < 4; ++rank) {
    DistributedSampler s({12, 4, rank, true, 7, false});
    s.set_epoch(3);
    for (auto i : s.indices()) ++seen[i];
  }
  for (int count : seen) EXPECT_EQ(count, 1);
}

TEST(DistributedSampler, RejectsARankOutsideTheWorld) {
  EXPECT_THROW(DistributedSampler({10, 2, 2, true, 0, false}), std::invalid_argument);
}

}  // namespace
}  // namespace dist::sdk
