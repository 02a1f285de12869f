#include "server/job_cost.h"

#include <algorithm>
#include <cmath>

#include "common/pricing.h"

namespace zenflow::server {

namespace {
double nonnegative(double x) { return std::isfinite(x) && x > 0 ? x : 0; }
}  // namespace

double job_usd_per_hour(const ResolvedPrice& price, int64_t workers, int64_t gpus_per_worker, bool uses_gpus) {
  if (!price.priced) return 0;
  const double share = instance_share(uses_gpus ? std::max<int64_t>(0, gpus_per_worker) : 0, price.gpus_of_instance);
  return nonnegative(price.usd_per_hour) * share * static_cast<double>(std::max<int64_t>(1, workers));
}

double held_usd(double usd_per_hour, int64_t start_ms, int64_t end_ms) {
  if (end_ms <= start_ms) return 0;
  return nonnegative(usd_per_hour) * static_cast<double>(end_ms - start_ms) / 3.6e6;
}

double restart_loss_usd(double usd_per_hour, int64_t previous_step, int64_t resumed_step, double step_seconds,
                        double startup_seconds) {
  const double repeated = static_cast<double>(std::max<int64_t>(0, previous_step - std::max<int64_t>(0, resumed_step)));
  return nonnegative(usd_per_hour) * (repeated * nonnegative(step_seconds) + nonnegative(startup_seconds)) / 3600.0;
}

double startup_seconds(int64_t attempt_start_ms, int64_t now_ms, int64_t steps_done, double step_seconds) {
  const double since = static_cast<double>(now_ms - attempt_start_ms) / 1000.0;
  return nonnegative(since - static_cast<double>(std::max<int64_t>(0, steps_done)) * nonnegative(step_seconds));
}

CostFigures cost_figures(double usd_per_hour, double ended_usd, int64_t running_since_ms, int64_t now_ms,
                         double stall_share, int64_t step, double tokens_per_step, double usd_lost_to_restarts) {
  CostFigures f;
  f.usd = nonnegative(ended_usd) + (running_since_ms > 0 ? held_usd(usd_per_hour, running_since_ms, now_ms) : 0);
  f.usd_lost_to_stalls = f.usd * std::min(1.0, nonnegative(stall_share));
  f.usd_lost_to_restarts = nonnegative(usd_lost_to_restarts);
  if (tokens_per_step > 0 && step > 0) {
    f.tokens = static_cast<int64_t>(std::llround(static_cast<double>(step) * tokens_per_step));
    if (f.tokens > 0) f.usd_per_1m_tokens = f.usd * 1e6 / static_cast<double>(f.tokens);
  }
  return f;
}

}  // namespace zenflow::server
