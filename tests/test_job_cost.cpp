// The cost of a job across attempts (server/job_cost.h), on a crafted run whose every
// number is known: exact to the cent.
#include <gtest/gtest.h>

#include "common/pricing.h"
#include "server/job_cost.h"

namespace zenflow::server {
namespace {

constexpr double kCent = 0.005;  // "to the cent": within half a cent

// p5.48xlarge at $98.32/h for its 8 GPUs; the job: 1 worker x 2 GPUs.
ResolvedPrice p5() {
  ResolvedPrice p;
  p.priced = true;
  p.usd_per_hour = 98.32;
  p.gpus_of_instance = 8;
  p.instance = "p5.48xlarge";
  return p;
}

TEST(JobCost, RateIsTheSharePerWorker) {
  EXPECT_DOUBLE_EQ(job_usd_per_hour(p5(), 1, 2, true), 24.58);
  EXPECT_DOUBLE_EQ(job_usd_per_hour(p5(), 3, 8, true), 3 * 98.32);  // whole instances
  EXPECT_DOUBLE_EQ(job_usd_per_hour(p5(), 2, 2, false), 2 * 98.32);  // CPU ranks hold the machine
  ResolvedPrice own;
  own.priced = true;
  own.usd_per_hour = 3.6;  // cost.usd_per_hour: the job's own rate, per worker, in full
  EXPECT_DOUBLE_EQ(job_usd_per_hour(own, 2, 4, true), 7.2);
  EXPECT_EQ(job_usd_per_hour(ResolvedPrice{}, 4, 8, true), 0);
}

// Attempt 1 holds the worker 70 min and reaches step 700 (6 s steps; its last checkpoint
// was at 600). Its worker is lost; attempt 2 resumes from 600, reports its first progress
// 90 s after placement with 5 steps done (so 60 s of start-up), and runs 20 min in all to
// step 1000. 8,192 tokens per step; 20% of the time exposed stalls.
TEST(JobCost, CraftedRunWithARestartIsExactToTheCent) {
  const double rate = job_usd_per_hour(p5(), 1, 2, true);
  const int64_t t0 = 1'700'000'000'000;
  const int64_t a1_end = t0 + 70 * 60'000;
  const double attempt1 = held_usd(rate, t0, a1_end);
  EXPECT_NEAR(attempt1, 28.68, kCent);
  const int64_t a2_start = a1_end + 5 * 60'000;  // queued 5 min: not charged
  const double startup = startup_seconds(a2_start, a2_start + 90'000, 5, 6.0);
  EXPECT_DOUBLE_EQ(startup, 60.0);
  const double lost = restart_loss_usd(rate, 700, 600, 6.0, startup);
  EXPECT_NEAR(lost, 4.51, kCent);  // (100 x 6 s + 60 s) at $24.58/h

  // While attempt 2 runs, 10 minutes in.
  CostFigures mid = cost_figures(rate, attempt1, a2_start, a2_start + 10 * 60'000, 0.2, 800, 8192, lost);
  EXPECT_NEAR(mid.usd, 32.77, kCent);  // 80 min at $24.58/h
  // At the end: 90 min held in all.
  const int64_t a2_end = a2_start + 20 * 60'000;
  const double ended = attempt1 + held_usd(rate, a2_start, a2_end);
  CostFigures end = cost_figures(rate, ended, 0, a2_end + 3'600'000, 0.2, 1000, 8192, lost);
  EXPECT_NEAR(end.usd, 36.87, kCent);  // not a cent more for the hour after it ended
  EXPECT_NEAR(end.usd_lost_to_stalls, 7.37, kCent);
  EXPECT_NEAR(end.usd_lost_to_restarts, 4.51, kCent);
  EXPECT_EQ(end.tokens, 8'192'000);
  EXPECT_NEAR(end.usd_per_1m_tokens, 4.50, kCent);
}

TEST(JobCost, NothingNegativeOrUnknownIsCharged) {
  EXPECT_EQ(held_usd(10, 5000, 1000), 0);           // reversed interval
  EXPECT_EQ(restart_loss_usd(10, 500, 700, 1, 0), 0);  // resumed past the old step: nothing repeated
  EXPECT_EQ(restart_loss_usd(-10, 700, 500, 1, 0), 0);
  EXPECT_EQ(startup_seconds(10'000, 11'000, 5, 1.0), 0);  // steps account for more than the time
  const CostFigures f = cost_figures(10, 1, 0, 0, 0.5, 0, 0, 0);
  EXPECT_EQ(f.tokens, 0);
  EXPECT_EQ(f.usd_per_1m_tokens, 0);
  EXPECT_DOUBLE_EQ(f.usd_lost_to_stalls, 0.5);
}

}  // namespace
}  // namespace zenflow::server
