// `zenflow run --profile`: the job's profile (common/advisor/job_profile.h), from the
// training loop's own steps and from probes run after training on the job's cores.
//
// ProfileObserver is one more TrainingObserver on the loop (training_observer.h): it keeps
// every step's StepTimes in a buffer sized at on_start, so on_step copies and nothing
// else. build_job_profile() then picks the steady steps (after warm-up and the first
// window), takes per position in a window of U steps the median over windows (so a zenflow
// boundary counts once per window and a step stalled by another process does not count),
// and runs the probes: GEMM at the job's shapes by compute threads, the
// device AdamW, copies each way, device streaming, host AdamW at 1, 2, 4 ... cores pinned to
// the job's host cores first. Call it on the thread that ran run_training (its compute
// cores are still pinned), on rank 0, after training. The probes take about a second.
#pragma once

#include <string>
#include <vector>

#include "common/advisor/job_profile.h"
#include "common/job_spec.h"
#include "worker/rank/trainer.h"
#include "worker/rank/training_observer.h"

namespace zenflow {

class ProfileObserver : public TrainingObserver {
 public:
  // Remembers the process's cores: construct it before run_training pins this thread.
  ProfileObserver();
  void on_start(const RunFacts& facts) override;
  void on_step(const TrainingStep& step) noexcept override;
  void on_finish(const TrainingEnd&) override {}

  const std::vector<engine::StepTimes>& steps() const { return steps_; }
  // Per step as steps(): the seconds the host AdamW window applied in it ran (< 0: none).
  const std::vector<double>& host_step_seconds() const { return host_steps_; }
  int64_t first_step() const { return first_step_; }
  const std::vector<int>& process_cores() const { return cores_; }

 private:
  std::vector<engine::StepTimes> steps_;
  std::vector<double> host_steps_;
  size_t capacity_ = 0;
  int64_t first_step_ = 0;  // 1-based step of steps_[0]
  std::vector<int> cores_;
};

// Throws std::runtime_error when the run has too few steps to profile (fewer than two
// steady windows), naming train.steps and the minimum.
advisor::JobProfile build_job_profile(const JobSpec& spec, const RunSummary& summary,
                                      const ProfileObserver& observer);

// The profile's name in checkpoint.dir (zenflow advise RUN_DIR reads it).
inline constexpr char kProfileFileName[] = "profile.yaml";

// kProfileFileName in checkpoint.dir (atomically: a temporary file, kProfileFileName +
// ".tmp.PID", renamed over it). Returns its path.
std::string write_job_profile(const JobSpec& spec, const advisor::JobProfile& profile);

}  // namespace zenflow
