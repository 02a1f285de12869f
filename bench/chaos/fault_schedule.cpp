// The seeded fault schedule (fault_schedule.h).
#include "bench/chaos/fault_schedule.h"

#include <array>
#include <cstdio>

namespace zenflow::chaos {
namespace {

// splitmix64: tiny, and the same numbers everywhere (std::uniform_int_distribution is not).
class SplitMix {
 public:
  explicit SplitMix(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi] (the modulo bias is irrelevant at these ranges).
  int64_t between(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(next() % uint64_t(hi - lo + 1));
  }

 private:
  uint64_t state_;
};

// How long each kind holds, in ms: long enough for partitions to outlast the lease (the
// coordinator declares the agent LOST), short enough for stopped ranks to stay under the
// lease plus the checker's slack.
std::pair<int64_t, int64_t> duration_range(FaultKind k) {
  switch (k) {
    case FaultKind::kCoordinatorKill:
      return {500, 3000};
    case FaultKind::kCoordinatorStop:
      return {1000, 5000};
    case FaultKind::kAgentKill:
      return {500, 3000};
    case FaultKind::kAgentStop:
      return {1000, 6000};
    case FaultKind::kRankKill:
      return {0, 0};
    case FaultKind::kRankStop:
      return {500, 3000};
    case FaultKind::kNodeKill:
      return {500, 3000};
    case FaultKind::kNodeStop:
      return {500, 3000};
    case FaultKind::kPartitionBlackhole:
      return {2000, 10000};
    case FaultKind::kPartitionReset:
      return {2000, 10000};
    case FaultKind::kDiskFull:
      return {3000, 8000};
    case FaultKind::kCoordinatorRestartInPartition:
      return {6000, 12000};
  }
  return {0, 0};
}

}  // namespace

const char* fault_kind_name(FaultKind kind) {
  switch (kind) {
    case FaultKind::kCoordinatorKill:
      return "coordinator_kill";
    case FaultKind::kCoordinatorStop:
      return "coordinator_stop";
    case FaultKind::kAgentKill:
      return "agent_kill";
    case FaultKind::kAgentStop:
      return "agent_stop";
    case FaultKind::kRankKill:
      return "rank_kill";
    case FaultKind::kRankStop:
      return "rank_stop";
    case FaultKind::kNodeKill:
      return "node_kill";
    case FaultKind::kNodeStop:
      return "node_stop";
    case FaultKind::kPartitionBlackhole:
      return "partition_blackhole";
    case FaultKind::kPartitionReset:
      return "partition_reset";
    case FaultKind::kDiskFull:
      return "disk_full";
    case FaultKind::kCoordinatorRestartInPartition:
      return "coordinator_restart_in_partition";
  }
  return "unknown";
}

std::vector<Fault> make_schedule(uint64_t seed, double minutes, const ScheduleOptions& o) {
  SplitMix rng(seed);
  const int64_t end_ms = static_cast<int64_t>(minutes * 60'000);
  std::vector<Fault> out;
  std::array<FaultKind, kFaultKinds> round{};
  size_t next_in_round = round.size();
  int64_t t = o.warmup_ms;
  for (;;) {
    if (next_in_round == round.size()) {  // a new round: every kind once, shuffled
      for (int i = 0; i < kFaultKinds; ++i) round[size_t(i)] = static_cast<FaultKind>(i);
      for (size_t i = round.size() - 1; i > 0; --i)
        std::swap(round[i], round[size_t(rng.between(0, int64_t(i)))]);
      next_in_round = 0;
    }
    Fault f;
    f.kind = round[next_in_round++];
    const auto [lo, hi] = duration_range(f.kind);
    f.duration_ms = rng.between(lo, hi);
    f.agent = static_cast<int>(rng.between(0, o.agents - 1));
    f.at_ms = t;
    if (f.at_ms + f.duration_ms >= end_ms) break;
    out.push_back(f);
    t = f.at_ms + f.duration_ms + rng.between(o.min_gap_ms, o.max_gap_ms);
  }
  return out;
}

std::string describe(const Fault& f) {
  char buf[160];
  const bool targets_agent = f.kind == FaultKind::kAgentKill || f.kind == FaultKind::kAgentStop ||
                             f.kind == FaultKind::kRankKill || f.kind == FaultKind::kRankStop ||
                             f.kind == FaultKind::kPartitionBlackhole ||
                             f.kind == FaultKind::kPartitionReset || f.kind == FaultKind::kDiskFull ||
                             f.kind == FaultKind::kCoordinatorRestartInPartition;
  std::string target = targets_agent ? "w" + std::to_string(f.agent + 1) : "";
  if (f.kind == FaultKind::kCoordinatorKill || f.kind == FaultKind::kCoordinatorStop) target = "coordinator";
  if (f.kind == FaultKind::kNodeKill || f.kind == FaultKind::kNodeStop) target = "node-1";
  if (f.kind == FaultKind::kRankKill || f.kind == FaultKind::kRankStop)
    target = "rank on w" + std::to_string(f.agent + 1);
  std::snprintf(buf, sizeof buf, "+%.3fs %s %s for %.3fs", double(f.at_ms) / 1000, fault_kind_name(f.kind),
                target.c_str(), double(f.duration_ms) / 1000);
  return buf;
}

}  // namespace zenflow::chaos
