// What a job costs across its attempts: the arithmetic, apart from the coordinator's state
// so that it is tested on crafted numbers (tests/test_job_cost.cpp).
//
// A job is charged while it holds workers: from an attempt's start (placement) to its end,
// at its rate (usd_per_hour: the instance price x the job's share of it, x its workers;
// common/pricing.h). Queue time is free. Restarts and preemptions are charged like any
// other held time, and what they waste is shown as its own cause, usd_lost_to_restarts:
// the steps a resumed attempt repeats (the previous attempt reached step P, the next one
// resumed from its checkpoint at R < P: P - R steps) and the resumed attempt's start-up
// until its first step (loading, rendezvous, restoring the checkpoint).
#pragma once

#include <cstdint>

namespace zenflow {
struct ResolvedPrice;
}

namespace zenflow::server {

// The job's rate while it holds workers: each of its `workers` is charged its share of an
// instance (instance_share: gpus_per_worker of the instance's GPUs; a CPU job, which uses
// no GPU, the whole instance); a price of the spec's own (cost.usd_per_hour) is per worker
// in full. 0 when not priced.
double job_usd_per_hour(const ResolvedPrice& price, int64_t workers, int64_t gpus_per_worker, bool uses_gpus);

// usd_per_hour over [start_ms, end_ms]; 0 for an empty or reversed interval.
double held_usd(double usd_per_hour, int64_t start_ms, int64_t end_ms);

// What one restart wasted (see above), at usd_per_hour: (repeated steps x step_seconds +
// startup_seconds) of held time. Negative inputs count as 0.
double restart_loss_usd(double usd_per_hour, int64_t previous_step, int64_t resumed_step, double step_seconds,
                        double startup_seconds);

// A resumed attempt's start-up, from its first progress report: the time since placement
// less the steps it has done since (steps_done x step_seconds); never negative.
double startup_seconds(int64_t attempt_start_ms, int64_t now_ms, int64_t steps_done, double step_seconds);

// The figures status and metrics show.
struct CostFigures {
  double usd = 0;                   // ended attempts + the running one so far
  double usd_lost_to_stalls = 0;    // usd x the exposed stall share
  double usd_lost_to_restarts = 0;  // as recorded
  double usd_per_1m_tokens = 0;     // 0 when no tokens are known
  int64_t tokens = 0;               // step x tokens per step
};
// `ended_usd`: the ended attempts' sum; the running attempt (running_since_ms > 0) adds its
// held time until now_ms. tokens_per_step 0: unknown.
CostFigures cost_figures(double usd_per_hour, double ended_usd, int64_t running_since_ms, int64_t now_ms,
                         double stall_share, int64_t step, double tokens_per_step, double usd_lost_to_restarts);

}  // namespace zenflow::server
