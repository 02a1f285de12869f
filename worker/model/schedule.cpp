// Learning-rate schedules: linear warm-up, then cosine, linear or constant.
#include "worker/model/schedule.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace zenflow::model {

double lr_at(const ScheduleConfig& config, int64_t step) {
  if (config.kind != "cosine" && config.kind != "linear" && config.kind != "constant")
    throw std::invalid_argument("schedule: unknown kind '" + config.kind +
                                "' (expected cosine, linear or constant)");
  if (config.warmup_steps < 0)
    throw std::invalid_argument("schedule: warmup_steps must be >= 0, got " +
                                std::to_string(config.warmup_steps));
  if (step < 0)
    throw std::invalid_argument("schedule: step must be >= 0, got " + std::to_string(step));
  const double lr = config.lr;
  if (step < config.warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(config.warmup_steps);
  if (config.kind == "constant") return lr;

  const int64_t decay_span = std::max<int64_t>(1, config.total_steps - config.warmup_steps - 1);
  const double progress = std::clamp(
      static_cast<double>(step - config.warmup_steps) / static_cast<double>(decay_span), 0.0, 1.0);
  const double min_lr = lr * config.min_lr_ratio;
  if (config.kind == "cosine")
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
  return lr - (lr - min_lr) * progress;  // linear
}

}  // namespace zenflow::model
