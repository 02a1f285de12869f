// Learning-rate schedule values at hand-computed steps.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "worker/model/schedule.h"

namespace zm = zenflow::model;

namespace {

zm::ScheduleConfig config(const char* kind) {
  zm::ScheduleConfig c;
  c.kind = kind;
  c.lr = 1e-3;
  c.warmup_steps = 10;
  c.total_steps = 111;  // decay span = 111 - 10 - 1 = 100 steps
  c.min_lr_ratio = 0.1;
  return c;
}

}  // namespace

TEST(Schedule, WarmUpIsLinearFromLrOverWarmupToLr) {
  for (const char* kind : {"cosine", "linear", "constant"}) {
    const auto c = config(kind);
    EXPECT_NEAR(zm::lr_at(c, 0), 1e-4, 1e-15) << kind;
    EXPECT_NEAR(zm::lr_at(c, 4), 5e-4, 1e-15) << kind;
    EXPECT_NEAR(zm::lr_at(c, 9), 1e-3, 1e-15) << kind;
  }
}

TEST(Schedule, CosineDecaysToMinLrAtLastStep) {
  const auto c = config("cosine");
  EXPECT_NEAR(zm::lr_at(c, 10), 1e-3, 1e-15);
  // progress 0.25: 1e-4 + 9e-4 * 0.5 * (1 + cos(pi / 4))
  EXPECT_NEAR(zm::lr_at(c, 35), 8.681980515339464e-4, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 60), 5.5e-4, 1e-15);  // progress 0.5
  // progress 0.75: 1e-4 + 4.5e-4 * (1 - cos(pi / 4))
  EXPECT_NEAR(zm::lr_at(c, 85), 2.318019484660536e-4, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 110), 1e-4, 1e-15);  // total_steps - 1
  EXPECT_NEAR(zm::lr_at(c, 500), 1e-4, 1e-15);  // clamped past the end
}

TEST(Schedule, LinearDecaysToMinLrAtLastStep) {
  const auto c = config("linear");
  EXPECT_NEAR(zm::lr_at(c, 10), 1e-3, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 35), 7.75e-4, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 60), 5.5e-4, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 110), 1e-4, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 1000), 1e-4, 1e-15);
}

TEST(Schedule, ConstantHoldsLrAfterWarmUp) {
  const auto c = config("constant");
  EXPECT_DOUBLE_EQ(zm::lr_at(c, 10), 1e-3);
  EXPECT_DOUBLE_EQ(zm::lr_at(c, 110), 1e-3);
  EXPECT_DOUBLE_EQ(zm::lr_at(c, 5000), 1e-3);
}

TEST(Schedule, NoWarmUpStartsAtFullLr) {
  zm::ScheduleConfig c;
  c.kind = "cosine";
  c.lr = 2.0;
  c.warmup_steps = 0;
  c.total_steps = 5;  // decay span 4
  c.min_lr_ratio = 0.0;
  EXPECT_DOUBLE_EQ(zm::lr_at(c, 0), 2.0);
  EXPECT_NEAR(zm::lr_at(c, 2), 1.0, 1e-15);
  EXPECT_NEAR(zm::lr_at(c, 4), 0.0, 1e-15);
  c.total_steps = 1;  // a one-step run stays at lr
  EXPECT_DOUBLE_EQ(zm::lr_at(c, 0), 2.0);
}

TEST(Schedule, UnknownKindAndNegativeStepThrow) {
  auto c = config("cosine");
  c.kind = "exponential";
  try {
    zm::lr_at(c, 0);
    FAIL() << "expected std::invalid_argument";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("exponential"), std::string::npos) << e.what();
  }
  EXPECT_THROW(zm::lr_at(config("cosine"), -1), std::invalid_argument);
}
