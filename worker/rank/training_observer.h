// What the training loop reports, once per step, to whoever watches a run (metrics, ...).
//
// run_training() calls a TrainingObserver from one place: on_start() once, when setup is
// done and the first step begins; on_step() after every step of this process; on_eval()
// after each periodic evaluation (train.eval_every; the final validation loss is the
// RunSummary's, computed after on_finish); on_finish() once, when the loop has ended and
// the last window and final checkpoint are done (not when run_training throws). All of
// them run on the training thread, one at a time. on_step() is on the hot path: an
// implementation must not block, lock or allocate there.
// Light on purpose (no LibTorch): metrics code includes it.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/engine/stall_clock.h"

namespace zenflow {

// This rank's training-device memory by what it holds (the run summary's and --json's
// device_memory_bytes, zenflow_device_memory_bytes{kind}). -1: not known (yet).
struct DeviceMemoryBytes {
  int64_t parameters = 0;             // the model's weights on the device
  int64_t gradients = 0;              // their gradient buffers
  int64_t optimizer_state = 0;        // the device updater's master, m, v and selection scores
  int64_t communication_buffers = 0;  // gradient staging, the H2D buffer, data-parallel buckets
  // The most one micro-batch's forward and backward held at once beyond what was alive when
  // it began: saved activations, the backward's temporaries, a checkpointed layer's
  // recompute. Measured on micro-batches whose gradient buffers already existed.
  int64_t activations_peak = -1;
  // The most the device held at once during the run (CUDA: the caching allocator's peak;
  // CPU: every tensor the process allocated from the metered allocator on, host optimizer
  // state included, since there the host is the device).
  int64_t total_peak = -1;
};

// What a run is, known when training starts. Bytes are this rank's.
struct RunFacts {
  int64_t rank = 0;
  int64_t world_size = 1;
  bool device_is_cuda = false;  // the ranks use a GPU each (the cost share, common/pricing.h)
  int64_t start_step = 0;   // resumed from (0 = fresh)
  int64_t total_steps = 0;  // train.steps
  int64_t tokens_per_step = 0;  // the global batch's token positions (RunSummary::tokens_per_step)
  // Host optimizer state by kind (they sum to RunSummary::host_state_bytes).
  int64_t host_master_bytes = 0;
  int64_t host_moments_bytes = 0;
  int64_t host_accumulator_bytes = 0;
  int64_t pinned_host_bytes = 0;        // transfer buffers, page-locked (CUDA)
  int64_t host_staging_bytes = 0;       // transfer buffers in plain memory (CPU device)
  int64_t host_total_memory_bytes = 0;  // the machine's RAM (0 = unknown)
  // Known at the start but for the peaks (-1 here; each step brings them).
  DeviceMemoryBytes device_memory;
};

// One step of this process, as it ended.
struct TrainingStep {
  int64_t step = 0;         // 1-based steps done
  engine::StepTimes times;  // this step's wall, compute, device optimizer, stalls, bytes
  int64_t tokens = 0;       // this rank's tokens (the ranks' sum is the global batch's)
  double loss = 0;          // the global batch's mean loss (the same on every rank)
  double lr = 0;
  bool skipped = false;         // non-finite loss or gradients: nothing was updated
  int64_t staleness_steps = 0;  // steps of host updates the weights missed (engine StepReport)
  double selected_ratio = 0;    // selected elements / split elements after the step
  double host_step_seconds = -1;  // a host AdamW window applied in this step ran this long (< 0: none)
  // Bytes sent to / received from remote optimizer nodes so far (cumulative; 0 in-process).
  int64_t network_bytes_sent = 0;
  int64_t network_bytes_received = 0;
  // The device memory peaks so far (DeviceMemoryBytes; -1: not measured).
  int64_t activations_peak_bytes = -1;
  int64_t total_peak_bytes = -1;
};

// How the loop ended.
struct TrainingEnd {
  int64_t steps = 0;  // last step reached
  bool interrupted = false;
  engine::StepTimes finish;  // the end of the run: last window's flush, final checkpoint
};

class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // May allocate and throw (setup); a throw ends run_training with it.
  virtual void on_start(const RunFacts& facts) = 0;
  // Hot path: no lock, no allocation, no throw.
  virtual void on_step(const TrainingStep& step) noexcept = 0;
  // `step`: the steps done when the validation loss was measured. Default: nothing.
  virtual void on_eval(int64_t step, double val_loss) noexcept {}
  virtual void on_finish(const TrainingEnd& end) = 0;
};

// Passes every call to each of its observers, in the order they were added (not owned;
// they must outlive it). Adds nothing to the hot path but the loop over them.
class FanoutObserver : public TrainingObserver {
 public:
  void add(TrainingObserver* observer) { observers_.push_back(observer); }

  void on_start(const RunFacts& facts) override {
    for (TrainingObserver* o : observers_) o->on_start(facts);
  }
  void on_step(const TrainingStep& step) noexcept override {
    for (TrainingObserver* o : observers_) o->on_step(step);
  }
  void on_eval(int64_t step, double val_loss) noexcept override {
    for (TrainingObserver* o : observers_) o->on_eval(step, val_loss);
  }
  void on_finish(const TrainingEnd& end) override {
    for (TrainingObserver* o : observers_) o->on_finish(end);
  }

 private:
  std::vector<TrainingObserver*> observers_;
};

}  // namespace zenflow
