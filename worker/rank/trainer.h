// The training loop of one job on one process: model, data, ZenFlow engine, checkpoints.
//
// run_training() builds everything from a validated JobSpec, resumes from the newest
// checkpoint in checkpoint.dir (unless told not to), trains, evaluates and returns a
// RunSummary; when that checkpoint is at or past train.steps it builds and writes nothing
// and returns at once (RunSummary::already_complete). It is what `zenflow run` executes in-process and what the worker agent
// runs, one rank per child process, for an assigned job. Thread safety: call from one
// thread; `stop` may be set from any thread (e.g. a signal handler): the loop then writes
// a checkpoint and returns with interrupted = true.
//
// Errors: std::invalid_argument (ResumeRefused among them) for a job that cannot run as
// specified — bad input; CheckpointDirBusy when another run holds checkpoint.dir (past
// RunOptions::lock_wait); CommitFenced when RunOptions::commit_fence refused a checkpoint
// (nothing was committed; the process no longer owns the job); std::runtime_error for
// runtime failures, including a run in which every step was skipped for non-finite values
// (it writes no final checkpoint).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "common/job_spec.h"
#include "worker/rank/checkpoint.h"
#include "worker/engine/stall_clock.h"
#include "worker/rank/run_reporter.h"
#include "worker/rank/training_observer.h"

namespace zenflow {

struct RunOptions {
  // Resume from checkpoint.dir when it holds one. false: start from step 0; checkpoints an
  // earlier run left there are moved into checkpoint.dir/superseded-*/ (never deleted).
  bool resume = true;
  // The data-parallel rendezvous generation (distributed::CommunicatorOptions::generation):
  // a run started again in the same rank processes (zenflow run's in-process resume after
  // a lost optimizer node) joins under a higher one.
  int64_t rendezvous_generation = 0;
  // Keys of job_identity() (checkpoint.h) a resume may find changed; any other change in
  // them makes the resume fail with ResumeRefused listing the changed keys.
  std::vector<std::string> allow_spec_change;
  bool write_checkpoints = true;  // periodic + final/interrupt checkpoints
  bool evaluate = true;           // validation loss at the end (and every eval_every)
  int64_t stop_after_steps = 0;   // > 0: stop (with checkpoint) after this many steps of this process
  // Start from these weights (by parameter name) instead of the random init, e.g. a
  // model trained earlier in this process. Every parameter must be present.
  std::vector<std::pair<std::string, at::Tensor>> initial_weights;
  // When set, receives the final weights (CPU copies) after training.
  std::vector<std::pair<std::string, at::Tensor>>* final_weights = nullptr;
  // When set (not owned; must outlive the call), told of the start, the steps, the
  // checkpoints, the info/warning lines and the end of the run (run_reporter.h).
  RunReporter* reporter = nullptr;
  // Consulted by rank 0 as each checkpoint is committed, at the rename that makes it
  // visible (checkpoint.h): when it refuses, nothing is committed and run_training throws
  // CommitFenced. Empty: every commit is allowed. `zenflow run --lease-fd` passes its Lease.
  CommitFence commit_fence;
  // Spec keys whose value is a local copy of an s3:// URI (object_cache.h), and the URI: the
  // job's identity (checkpoint.h, job_identity) records the URI, so a resume elsewhere,
  // from another copy, is the same job.
  std::map<std::string, std::string> input_uris;
  // checkpoint.dir's s3:// URI when the run works in a staging copy of it: what run.yaml
  // records (not part of the identity: a job keeps its checkpoints where they are).
  std::string checkpoint_uri;
  // Called by rank 0 after each checkpoint it committed (the step and its directory); returns
  // the seconds training waited before going on (checkpoint.dir: s3://, the previous
  // checkpoint's upload: stall cause checkpoint_upload). Empty: nothing.
  std::function<double(int64_t step, const std::string& dir)> on_checkpoint_committed;
  // checkpoint.dir staged per worker (s3:// with ranks on several workers, each worker its
  // own copy of the directory): ranks [0, ranks_beside_rank0) write their engine shards into
  // rank 0's copy, the others into their own worker's, and send them to the bucket through
  // on_shard_written (the step and the shard's file; returns the seconds training waited for
  // that rank's previous upload). Rank 0 gets their checksums over the communicator; a
  // resume reads (and requires) only this rank's shard when the ranks did not change, and
  // the ranks check that they resumed from the same step. 0: every rank shares rank 0's
  // directory (a local or shared checkpoint.dir).
  int64_t ranks_beside_rank0 = 0;
  std::function<double(int64_t step, const std::string& shard_file, uint32_t crc32c)> on_shard_written;
  // How long rank 0 waits for another process to release checkpoint.dir's lock before it
  // fails with CheckpointDirBusy (0: fail at once). A requeued attempt waits for the
  // previous attempt's processes to let go.
  std::chrono::milliseconds lock_wait{0};
  // Called once, when setup (model construction, loading, resume) is done and the first
  // step starts: from then on `stop` ends the run with a checkpoint. Before it, nothing has
  // been written but the directory's lock and quarantine renames, so a caller may simply
  // exit on a signal.
  std::function<void()> on_training_start;
  // When set (not owned; must outlive the call), told of the start, every step and the end
  // of training, on every rank (training_observer.h); e.g. RunMetrics for /metrics.
  TrainingObserver* observer = nullptr;
  // How the user starts over a run that is already complete, in its message
  // (already_complete_message); `zenflow run` says --fresh.
  std::string start_over_hint = "--fresh to start over";
};

struct RunSummary {
  std::string device;
  std::string mode;
  int64_t world_size = 1;         // data-parallel ranks
  int64_t params = 0;
  int64_t split_params = 0;       // elements in split matrices
  int64_t start_step = 0;         // step resumed from (0 = fresh)
  int64_t steps = 0;              // last step reached (1-based count)
  // The newest usable checkpoint was at or past train.steps: nothing was built or trained,
  // nothing written. start_step = steps = its step, final_loss its last loss (NaN when it
  // recorded none), last_checkpoint its directory; the timing and engine fields are empty.
  bool already_complete = false;
  int64_t skipped_steps = 0;
  int64_t tokens_per_step = 0;
  bool interrupted = false;
  double final_loss = 0;
  double val_loss = -1;           // < 0: not evaluated
  std::vector<double> losses;     // per step of this process, index 0 = start_step + 1
  std::vector<double> step_seconds;
  double step_seconds_median = 0;
  double step_seconds_p90 = 0;
  engine::StepTimes totals;       // compute, device optimizer, stalls, bytes (this process)
  engine::StepTimes finish_times; // of those, the end of the run: last window's flush, final checkpoint
  double wall_seconds = 0;
  int64_t host_state_bytes = 0;  // this rank's host optimizer state (1/W of it with W ranks)
  // Of those, the transfer buffers (gradient staging, host output): page-locked on CUDA,
  // registered once (zenflow_pinned_host_bytes).
  int64_t transfer_buffer_bytes = 0;
  DeviceMemoryBytes device_memory;  // this rank's, at the end (training_observer.h)
  bool activation_checkpointing = false;
  // train.shard, and with parameters (or gradients) sharded across the ranks: the most bytes of
  // gathered full weights a rank held at once (a unit's and the next one's prefetched, with
  // their transfer buffers) and the seconds its gathers and reduce-scatters blocked its
  // training steps (not evaluation's or checkpoints').
  std::string shard = "none";
  int64_t shard_gathered_peak_bytes = 0;
  double shard_comm_seconds = 0;
  // train.offload_parameters (engine/streamed_parameters.h): the weights' host bytes (the
  // leaves the optimizer updates) and the gradient staging's; 0 without it.
  bool offload_parameters = false;
  int64_t streamed_weight_bytes = 0;
  int64_t streamed_staging_bytes = 0;
  int64_t host_threads = 0;
  int64_t compute_threads = 0;
  // Where the host optimizer state lived (HostOptimizer::describe: "in-process", or the
  // optimizer nodes) and the bytes sent to / received from those nodes.
  std::string host_backend;
  std::vector<std::string> optimizer_nodes;
  int64_t network_bytes_sent = 0;
  int64_t network_bytes_received = 0;
  int64_t reselections = 0;
  int64_t max_staleness_windows = 0;
  // Data parallel: logical bytes of this process's collectives (communicator.h) by traffic.
  int64_t comm_gradient_bytes = 0;
  int64_t comm_selection_bytes = 0;
  int64_t comm_parameter_bytes = 0;
  bool ranks_identical = true;  // every rank ended with bit-identical weights (checked with W > 1)
  std::string last_checkpoint;
};

RunSummary run_training(const JobSpec& spec, const RunOptions& options,
                        const std::atomic<bool>* stop = nullptr);

// What a run that is already complete says: "already complete at step N; nothing to do
// (HINT)", naming train.steps when it is below N ("..., past train.steps T; ...").
std::string already_complete_message(int64_t step, int64_t train_steps, const std::string& start_over_hint);

// Tunes glibc malloc to keep freed memory mapped (called by run_training).
void keep_freed_host_memory();

// Median and 90th percentile of a sample (0 when empty).
double percentile(std::vector<double> values, double q);

}  // namespace zenflow
