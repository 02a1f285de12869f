// The fault-injection harness (issue 35, item 2): a coordinator, agents with one CPU slot
// each, an optimizer node and a partitionable TCP proxy per agent link, all on 127.0.0.1,
// running a stream of tiny CPU jobs while a seeded schedule (fault_schedule.h) kills,
// stops, partitions and fills them, and checking from the processes themselves
// (attempt_invariants.h, proc_sampler.h) that
//   - every acknowledged submit exists exactly once at the end (retries reuse request_id),
//   - no job ever has two live attempts, and no finished attempt runs again,
//   - no job stays RUNNING without a live rank beyond the lease plus a stated slack,
//   - every job ends SUCCEEDED with the final loss of an uninterrupted run, or FAILED or
//     CANCELLED with a readable reason,
//   - nothing is left running at the end.
// Every process it starts is its child (PR_SET_PDEATHSIG) and is stopped by PID, also
// when the run throws. Used by `zenflow bench chaos` and tests/chaos.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/chaos/attempt_invariants.h"
#include "bench/chaos/fault_schedule.h"

namespace zenflow::chaos {

struct ChaosOptions {
  uint64_t seed = 1;
  double minutes = 2;         // the fault phase; the drain after it is extra
  std::filesystem::path dir;  // the run's directory (created; must not exist yet)
  // Where zenflow, zenflow-coordinator, -worker and -optimizer are; copied into DIR/bin at
  // the start, so that a rebuild of the tree during the run does not change what runs.
  std::filesystem::path bin_dir;
  int agents = 3;
  bool optimizer_node = true;  // start one, and give some jobs optimizer.host.nodes: 1
  int64_t heartbeat_interval_ms = 500;
  int64_t lease_ms = 3000;
  // The checker's slack over the lease for "RUNNING without a live rank": the start of a
  // rank (exec, LibTorch) and the coordinator's reaction to a LOST worker.
  int64_t running_slack_ms = 5000;
  // How long a cut-off agent keeps its ranks (zenflow-worker --disconnected-grace): longer
  // than the lease, as in production (default 120 s), so that a coordinator that requeues a
  // LOST worker's job without waiting for the agent's fence runs it twice.
  double agent_disconnected_grace_s = 8;
  double drain_timeout_s = 120;  // after the fault phase, for every job to end
  // Fewer than the agents: a requeued job finds an idle agent at once.
  int max_jobs_in_flight = 2;
  // Progress lines (what is injected, what is seen); stderr when empty.
  std::function<void(const std::string&)> log;
};

// A fault as it was carried out.
struct InjectedFault {
  Fault fault;
  int64_t started_ms = 0;  // on the run's clock (0 = start of the fault phase)
  bool skipped = false;
  std::string detail;  // pids hit, or why it was skipped
};

struct ChaosReport {
  uint64_t seed = 0;
  double minutes = 0;
  std::vector<Fault> schedule;
  std::vector<InjectedFault> injected;
  std::vector<Violation> violations;
  std::map<std::string, std::string> notes;  // what the run could not do, and why
  int64_t jobs_submitted = 0;                // SubmitJob calls acknowledged (OK)
  int64_t submits_unacknowledged = 0;
  int64_t jobs_succeeded = 0, jobs_failed = 0, jobs_cancelled = 0, jobs_unfinished = 0;
  std::map<std::string, std::string> failure_reasons;  // job id -> last_error
  double wall_seconds = 0;
  std::filesystem::path dir;

  bool ok() const { return violations.empty(); }
  // The figures `zenflow bench chaos` prints: faults and violations by kind, jobs.
  nlohmann::json to_json() const;
  // For a failing run: the seed, the schedule, the faults as injected and every violation
  // with its evidence.
  std::string reproduction() const;
};

// Whether a FAILED or CANCELLED job's reason lets a human act: not empty, valid UTF-8, and
// more than an exit status ("exited with status 1", "killed by signal 9" say what ended,
// not what failed).
bool reason_is_actionable(const std::string& reason);

// Runs the whole thing and stops everything it started before returning. Throws
// std::runtime_error when the cluster cannot be started (nothing is judged then).
ChaosReport run_chaos(const ChaosOptions& options);

}  // namespace zenflow::chaos
