// Learning-rate schedules with linear warm-up.
#pragma once

#include <cstdint>
#include <string>

namespace zenflow::model {

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | linear | constant
  double lr = 3e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.1;  // floor for cosine/linear, as a fraction of lr
};

// Learning rate of 0-based step `step`: linear warm-up from lr/warmup to lr over
// warmup_steps, then the decay kind down to lr * min_lr_ratio at total_steps - 1.
double lr_at(const ScheduleConfig& config, int64_t step);

}  // namespace zenflow::model
