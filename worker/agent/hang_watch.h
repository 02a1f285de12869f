// HangWatch: when an attempt counts as hung, from its rank 0's progress reports alone.
//
// The agent of rank 0 feeds it every step report (the step and its step_seconds) with the
// time it read it, and asks check(now) on its loop. The rule (resources.hang_timeout,
// common/job_spec.h ResourcesSpec):
//   timeout  resources.hang_timeout when set (> 0); else "auto": the larger of
//            10 x the median step_seconds reported so far and kAutoHangTimeoutSeconds;
//   bound    the timeout once a step was reported; kFirstStepHangFactor x the timeout
//            before (loading, rendezvous and the first step take longer than a step);
//   hung     no progress (a step past the last one, or a committed checkpoint) for longer
//            than the bound, counted from the last progress or, before any, from the start.
// Time is an input: nothing here reads a clock, so the rule is tested without processes.
//
// Thread safety: none; one owner (the agent's supervisor thread).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>

namespace zenflow::agent {

class HangWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // What check() found: the last step reported (0 before any), when progress stopped, how
  // long ago, and the timeout it was held to (resources.hang_timeout, or the auto one).
  struct Hang {
    int64_t step = 0;
    Clock::time_point since;
    std::chrono::milliseconds silent{0};
    std::chrono::seconds timeout{0};
  };

  // `configured_timeout`: resources.hang_timeout (Assignment.hang_timeout_seconds); 0 for auto.
  // `started`: when the attempt's ranks were started.
  HangWatch(std::chrono::seconds configured_timeout, Clock::time_point started);

  // A step report read at `at`. A step not past the last one is no progress (a repeated
  // report); its step_seconds still counts towards the median when positive.
  void on_step(int64_t step, double step_seconds, Clock::time_point at);
  // A checkpoint committed at `at`: progress, without a new step.
  void on_checkpoint(Clock::time_point at);

  // The timeout in force now (before the first step, check() allows kFirstStepHangFactor x it).
  std::chrono::seconds timeout() const;
  // The silence check() allows now: timeout(), or kFirstStepHangFactor x it before any step.
  std::chrono::milliseconds bound() const;
  // A hang when the silence up to `now` is longer than bound(); nullopt otherwise.
  std::optional<Hang> check(Clock::time_point now) const;

  // Step times the median is taken over: the latest ones (a run reports up to 4 a second for
  // days; the median of the latest few hundred is its pace).
  static constexpr size_t kStepSecondsWindow = 255;

 private:
  double median_step_seconds() const;  // 0 before any positive report

  const std::chrono::seconds configured_;
  Clock::time_point last_progress_;
  bool stepped_ = false;
  int64_t step_ = 0;
  std::deque<double> step_seconds_;
};

}  // namespace zenflow::agent
