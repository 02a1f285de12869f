// The chaos harness's fault schedule: which fault hits which process or link when, as a
// pure function of a seed and the length of the run, so that a seed printed by a failing
// run reproduces its faults exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zenflow::chaos {

// What a fault does. Every fault but a rank's ends by itself after Fault::duration_ms
// (killed processes are restarted, stopped ones continued, links healed, disks freed).
enum class FaultKind {
  kCoordinatorKill,                // SIGKILL; restarted on the same database and port after duration
  kCoordinatorStop,                // SIGSTOP, SIGCONT after duration
  kAgentKill,                      // SIGKILL an agent; restarted under the same name after duration
  kAgentStop,                      // SIGSTOP / SIGCONT an agent
  kRankKill,                       // SIGKILL a rank (the one under the target agent, else any live one)
  kRankStop,                       // SIGSTOP / SIGCONT a rank
  kNodeKill,                       // SIGKILL the optimizer node; restarted under the same name
  kNodeStop,                       // SIGSTOP / SIGCONT the optimizer node
  kPartitionBlackhole,             // the agent's link forwards nothing (connections kept open)
  kPartitionReset,                 // the agent's link resets every connection, and every new one
  kDiskFull,                       // the agent's work dir (a small tmpfs) filled, then freed
  kCoordinatorRestartInPartition,  // a blackhole partition of the agent, during which the
                                   // coordinator is killed and restarted
};
inline constexpr int kFaultKinds = 12;

// "coordinator_kill", "partition_blackhole", ...: the names the JSON report counts by.
const char* fault_kind_name(FaultKind kind);

struct Fault {
  int64_t at_ms = 0;  // from the start of the fault phase
  FaultKind kind = FaultKind::kCoordinatorKill;
  int agent = -1;           // target agent index (0-based) for agent, rank, link and disk faults
  int64_t duration_ms = 0;  // how long the fault holds before it is undone
};

struct ScheduleOptions {
  int agents = 3;
  int64_t warmup_ms = 6000;   // no fault before this (the first jobs start)
  int64_t min_gap_ms = 2000;  // quiet time between one fault's end and the next one
  int64_t max_gap_ms = 6000;
};

// The faults of a `minutes`-long fault phase for `seed`: one after another (none
// overlaps another), every one ending before the phase ends, kinds drawn in rounds that
// each hold every kind once in a seeded order (a run of 12 faults sees every kind).
// Uses its own generator (splitmix64), so the schedule is the same on every platform.
std::vector<Fault> make_schedule(uint64_t seed, double minutes, const ScheduleOptions& options = {});

// "+12.345s agent_kill w2 for 1.500s": one line, the form a failing run prints.
std::string describe(const Fault& fault);

}  // namespace zenflow::chaos
