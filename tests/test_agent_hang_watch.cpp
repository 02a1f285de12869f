// The agent's hang rule (worker/agent/hang_watch.h) on an injected clock: no process, no
// sleeping; every time point is written out.
#include <gtest/gtest.h>

#include <limits>

#include "common/job_spec.h"
#include "worker/agent/hang_watch.h"

namespace zenflow::agent {
namespace {

using namespace std::chrono_literals;
using Clock = HangWatch::Clock;

const Clock::time_point t0 = Clock::time_point(1000s);  // the attempt's start

TEST(HangWatch, AConfiguredTimeoutHoldsAfterTheFirstStepAndThreeTimesItBefore) {
  HangWatch w(30s, t0);
  EXPECT_EQ(w.timeout(), 30s);
  EXPECT_EQ(w.bound(), 90s);  // kFirstStepHangFactor x 30 s before any step
  EXPECT_FALSE(w.check(t0 + 90s));
  const auto before = w.check(t0 + 90s + 1ms);
  ASSERT_TRUE(before);
  EXPECT_EQ(before->step, 0);
  EXPECT_EQ(before->since, t0);
  EXPECT_EQ(before->silent, 90001ms);
  EXPECT_EQ(before->timeout, 30s);

  w.on_step(1, 0.5, t0 + 40s);
  EXPECT_EQ(w.bound(), 30s);
  EXPECT_FALSE(w.check(t0 + 70s));
  const auto after = w.check(t0 + 70s + 1ms);
  ASSERT_TRUE(after);
  EXPECT_EQ(after->step, 1);
  EXPECT_EQ(after->since, t0 + 40s);
  EXPECT_EQ(after->silent, 30001ms);
}

TEST(HangWatch, EachNewStepRestartsTheSilenceButARepeatedOneDoesNot) {
  HangWatch w(30s, t0);
  w.on_step(5, 1.0, t0 + 10s);
  w.on_step(6, 1.0, t0 + 35s);
  EXPECT_FALSE(w.check(t0 + 60s));  // 25 s after step 6
  w.on_step(6, 1.0, t0 + 60s);      // the same step again: no progress
  w.on_step(4, 1.0, t0 + 61s);      // an older one: none either
  const auto h = w.check(t0 + 66s);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->step, 6);
  EXPECT_EQ(h->since, t0 + 35s);
  EXPECT_EQ(h->silent, 31s);
}

TEST(HangWatch, ACommittedCheckpointIsProgress) {
  HangWatch w(30s, t0);
  w.on_step(100, 1.0, t0 + 10s);
  w.on_checkpoint(t0 + 35s);  // a slow save after step 100
  EXPECT_FALSE(w.check(t0 + 65s));
  const auto h = w.check(t0 + 66s);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->step, 100);
  EXPECT_EQ(h->since, t0 + 35s);
}

TEST(HangWatch, AutoIsTheLargerOfTenMedianStepsAndFiveMinutes) {
  HangWatch w(0s, t0);
  // Before any step: 3 x the auto minimum.
  EXPECT_EQ(w.timeout(), std::chrono::seconds(ResourcesSpec::kAutoHangTimeoutSeconds));
  EXPECT_EQ(w.bound(), 900s);
  // Fast steps: the 300 s floor holds.
  w.on_step(1, 2.0, t0 + 1s);
  EXPECT_EQ(w.timeout(), 300s);
  EXPECT_EQ(w.bound(), 300s);
  // Median of {2, 40, 45, 50, 1000} is 45: 10 x 45 = 450 s. One outlier moves nothing.
  w.on_step(2, 40.0, t0 + 2s);
  w.on_step(3, 45.0, t0 + 3s);
  w.on_step(4, 50.0, t0 + 4s);
  w.on_step(5, 1000.0, t0 + 5s);
  EXPECT_EQ(w.timeout(), 450s);
  EXPECT_FALSE(w.check(t0 + 5s + 450s));
  const auto h = w.check(t0 + 5s + 451s);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->step, 5);
  EXPECT_EQ(h->timeout, 450s);
  // An even count takes the mean of the middle two: {2, 40, 45, 50, 60, 1000} -> 47.5 -> 475 s.
  w.on_step(6, 60.0, t0 + 6s);
  EXPECT_EQ(w.timeout(), 475s);
}

TEST(HangWatch, AConfiguredTimeoutIgnoresTheStepTimes) {
  HangWatch w(45s, t0);
  w.on_step(1, 100.0, t0 + 1s);  // 10 x 100 s would be 1000 s under auto
  EXPECT_EQ(w.timeout(), 45s);
}

TEST(HangWatch, TheMedianIsTakenOverTheLatestReportsOnly) {
  HangWatch w(0s, t0);
  // A slow start (100 s steps), then a long run of 50 s steps: the window forgets the start.
  for (int i = 1; i <= 100; ++i) w.on_step(i, 100.0, t0 + std::chrono::seconds(i));
  EXPECT_EQ(w.timeout(), 1000s);
  for (int i = 101; i <= 100 + static_cast<int>(HangWatch::kStepSecondsWindow); ++i)
    w.on_step(i, 50.0, t0 + std::chrono::seconds(i));
  EXPECT_EQ(w.timeout(), 500s);
}

TEST(HangWatch, NonPositiveOrNonFiniteStepTimesDoNotCount) {
  HangWatch w(0s, t0);
  w.on_step(1, 0.0, t0 + 1s);
  w.on_step(2, -3.0, t0 + 2s);
  w.on_step(3, std::numeric_limits<double>::quiet_NaN(), t0 + 3s);
  EXPECT_EQ(w.timeout(), 300s);
  w.on_step(4, 60.0, t0 + 4s);
  EXPECT_EQ(w.timeout(), 600s);
}

}  // namespace
}  // namespace zenflow::agent
