// ZenFlowOptimizer: the split device/host optimizer of docs/semantics.md.
//
// One class, three modes (EngineOptions::mode):
//   kDevice  — plain AdamW on the device for every parameter (the no-offload reference);
//   kOffload — ZeRO-Offload: every gradient to the host, one synchronous host AdamW per
//              step over every parameter, parameters back to the device;
//   kZenFlow — the top-k gradient columns of each large matrix are updated on the device
//              every step; the rest are accumulated on the host and updated once per
//              window, overlapped with the next window when overlap_step is set.
// All modes use the same AdamW kernel and the same host machinery; only the schedule
// differs, so the modes can be compared step for step.
//
// Columns: a 2-D parameter W[out, in] is split along dim 1 (input channel j). 1-D and
// small parameters (numel < min_split_numel) are always-device in kZenFlow mode.
//
// Choices the semantics leave open, fixed here (and pinned by the tests):
//  - The first selection happens on the first step after warm-up, before that step's
//    update, from that step's gradient. Later re-selections are decided at window
//    boundaries from the window's summed column scores and take effect from the next step.
//  - Re-selection happens at a boundary after the in-flight host step (window k-1) was
//    waited for and applied, before window k is handed over; nothing is drained. Columns
//    entering the device first get window k's host step (computed on the device, same
//    formula and step count); columns leaving it take the entering ones' host slots and
//    get their first host step at the next boundary; every other host column keeps its
//    slot and gets window k's step one window later, as at any boundary. Master, m, v move
//    with the column; nothing is zeroed. A re-selection costs O(changed columns).
//  - select_interval 0 ("auto"): every 10 windows for kStep, every epoch for kEpoch.
//  - finish() closes a still-open window with the mean of its steps so far.
//  - Host-owned columns are stored packed row-major ([out, n_host] per matrix); every
//    staging buffer is packed over all matrices, so each transfer is one copy.
//
// Data parallelism (a Collectives group of W > 1 ranks; collectives.h): the caller
// averages the gradients of the always-device parameters (GradReducer); the engine
// handles the split ones. Column scores are all-reduced (sum of the ranks' local
// scores, §2); selected columns' gradients are all-reduced and updated on every rank
// (replicated); host-owned columns are partitioned ZeRO-2 style: the columns of each
// matrix are cut into W contiguous ranges balanced by bytes (a matrix with fewer
// columns than ranks goes whole to the least-loaded rank), rank r's host updater owns
// the host-owned columns inside its ranges (master, m, v, accumulators: ~1/W of the
// single-rank host memory), their gradients are reduce-scattered (mean) to it, and
// at every window boundary the updated columns are all-gathered into every rank's
// weights. Gradient clipping uses the global norm (replicated part + all-reduced norm
// of the shards). A column keeps its owner rank while it stays host-owned; columns
// entering the selected set are all-reduced from their owner to every rank. Ranks stay
// bitwise identical. state_dict() then holds this rank's shard of the host state;
// load_state_shards() re-shards the shards written by any number of ranks.
//
// Usage (training thread):
//   ZenFlowOptimizer opt(params, options, &clock);
//   for each step: zero_grad(); forward/backward; opt.step({lr, epoch});
//   opt.finish();  // waits for the in-flight host step and applies it
//
// Thread safety: every method is called from the training thread. The host updater
// runs on its own threads (HostOptimizer) and touches only host buffers.
//
// Errors: std::invalid_argument for bad options or parameters (naming them);
// std::runtime_error for a state_dict that does not match the parameters.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/engine_defaults.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/collectives.h"
#include "worker/engine/device_streams.h"
#include "worker/engine/host_optimizer.h"
#include "worker/engine/selection_plan.h"  // SelectStrategy
#include "worker/engine/stall_clock.h"

namespace zenflow::engine {

enum class OptimizerMode { kDevice, kOffload, kZenFlow };
enum class Importance { kL2, kL1 };

OptimizerMode parse_optimizer_mode(const std::string& s);  // "device" | "offload" | "zenflow"

// The engine's settings. Hyper-parameters default to common/engine_defaults.h, as the job
// spec's do (trainer.cpp's engine_options() copies a spec into them).
struct EngineOptions {
  OptimizerMode mode = OptimizerMode::kZenFlow;
  double beta1 = engine_defaults::kBeta1;
  double beta2 = engine_defaults::kBeta2;
  double eps = engine_defaults::kEps;
  double grad_clip = 0.0;  // global L2 norm; 0 disables

  double topk_ratio = engine_defaults::kTopkRatio;
  SelectStrategy select_strategy = SelectStrategy::kAuto;
  int64_t select_interval = 0;  // 0 = auto: 10 windows for kStep, 1 epoch for kEpoch
  int64_t update_interval = engine_defaults::kUpdateInterval;  // 0 = auto (Zen-auto)
  int64_t full_warm_up_rounds = engine_defaults::kFullWarmUpRounds;
  bool overlap_step = engine_defaults::kOverlapStep;
  Importance importance = Importance::kL2;
  double reselect_threshold = engine_defaults::kReselectThreshold;
  double auto_ratio = engine_defaults::kAutoRatio;
  int64_t max_update_interval = engine_defaults::kMaxUpdateInterval;
  int64_t min_split_numel = engine_defaults::kMinSplitNumel;

  int host_threads = 1;
  std::vector<int> host_cores;  // cores reserved for the host updater; empty = unpinned
  bool huge_pages = engine_defaults::kHugePages;
  // Where the host state lives and the host jobs run: empty = in this process
  // (host_threads on host_cores); otherwise this factory's backend, e.g. remote
  // zenflow-optimizer nodes (worker/transport/remote_host_optimizer.h). The engine never
  // sees how a backend moves data.
  HostOptimizerFactory host_backend;
  // CUDA: a streaming backend's gradients pass through this many pinned host buffers of
  // its chunk size (8 MiB for remote nodes: 96 MiB), the only host memory they take:
  // enough sends in flight to keep a link busy; fewer make the training thread wait
  // sooner. (On the CPU device the staging is host memory and is sent in place.)
  int stream_ring_chunks = 12;
  // optimizer.host.device_staging_mib: 0 stages each gradient's host-owned columns in two
  // device buffers of the whole packed size and each host result in a third, so a step's
  // D2H overlaps the next step's compute (3 x 2 B per split element in bf16). > 0, with
  // one rank (or train.shard) and an in-process backend: the device stages them through 4
  // buffers of a quarter of this many bytes each (at least one matrix row, at most a quarter
  // of the split elements: never more than one whole gradient), gathering and
  // copying chunk by chunk; the compute stream waits for the copies beyond those buffers
  // (the `transfer_d2h` / `transfer_h2d` stalls) and a finished host step's H2D is no
  // longer started before the boundary. The host keeps one gradient ring slot, one output
  // buffer and no last-gradient buffers (24 instead of 32 B per split bf16 element): a
  // window's last gradient is accumulated and its step reads the accumulator. Numbers are
  // identical either way; on the CPU device the copies take another path.
  int64_t device_staging_bytes = 0;
  // train.shard (worker/distributed/sharded_parameters.h): the parameters are this rank's
  // row shards of the model's, their gradients already averaged over the ranks, and the
  // engine updates them as one rank would; the Collectives group only sums the squared
  // gradient norm (clipping and skipping see the whole model's norm), and zenflow's
  // selection reads ParamSpec::column_scores (the whole matrix's), so every rank decides
  // alike and selects what an unsharded run selects.
  bool parameters_sharded = false;
  // train.offload_parameters (streamed_parameters.h): the parameters are host copies that
  // a StreamedParameters runner streams to the device, whose gradients it brought to the
  // host (and counted); the engine runs over them on the CPU, and its staging and the host
  // step's result moving into them are memory copies, not PCIe transfers: it counts no
  // transfer bytes.
  bool parameters_on_host = false;
  // train.offload_parameters in zenflow mode (streamed_parameters.h; docs/design.md §5.3):
  // the split matrices' parameter tensors are host tensors (the model's dtype) that hold
  // their weights only when sync_parameters() wrote them there (checkpoints, export); the
  // engine keeps each one's selected columns on the device ([out, k], streamed_columns())
  // and its host-owned columns packed in host memory (the host step's output buffer, which
  // the runner streams to the device before each unit runs: nothing else goes back). Their
  // gradients come unit by unit (add_unit_gradient): selected columns stay on the device,
  // the rest go to the host, landing one unit later (unit_gradients_given); no gradient of
  // theirs is ever whole on the device. The other
  // parameters are on the device and get their gradients as usual. With several ranks every
  // rank streams every rank's host columns (all-gathered after each host step, matrix by
  // matrix through the device) and sends the gradients of all of them to the host, where the
  // step reduce-scatters them matrix by matrix through the device (the host-owned columns'
  // gradient crosses PCIe three times, not once: a reduce-scatter on the device unit by unit is
  // not built). The in-process host backend and whole staging only (std::invalid_argument
  // otherwise). Numbers: those of the same run without it, bit for bit on the CPU (clipping
  // too: a split matrix's gradient norm is summed column by column either way).
  bool columns_streamed = false;
};

// Whether zenflow mode splits a parameter of this shape (the rule the engine applies; for a
// runner that must know before the engine exists).
bool zenflow_splits(at::IntArrayRef shape, int64_t min_split_numel);

// EngineOptions::columns_streamed: what a runner assembles a split matrix's weights from.
struct StreamedColumns {
  at::Tensor selected_weights;  // [out, k] on the device, the model's dtype (k may be 0)
  at::Tensor selected;          // int64 [k] on the device: their columns
  at::Tensor host_weights;      // [out, n] host (pinned on CUDA): the host-owned columns (every rank's)
  at::Tensor host_columns;      // int64 [n] on the device: their columns, in that order
  // What host_weights is part of (streamed_copy): an output buffer (0, 1) with one rank; with
  // several, 2: every rank's columns as all-gathered, rewritten at the end of a step.
  int buffer = 0;
};

struct ParamSpec {
  std::string name;
  at::Tensor param;  // a leaf with requires_grad; updated in place
  bool weight_decay = true;
  double weight_decay_value = 0.0;
  // EngineOptions::parameters_sharded: `param` holds some rows of the model's parameter,
  // which has full_numel elements (what min_split_numel is held against; 0: param.numel()),
  // and column_scores (fp32 [columns] on the device) is, by the time step() runs, this
  // step's column importance of the whole matrix: the sum over the ranks of each rank's
  // scores of its own local gradient, as the unsharded engine's all-reduce makes it. The
  // engine reads it instead of scoring the (averaged) shard gradient, and scales it in place
  // when it clips. Undefined: the scores come from the gradient.
  int64_t full_numel = 0;
  at::Tensor column_scores;
};

struct StepContext {
  double lr = 1e-3;
  int64_t epoch = 0;  // data epoch of this step's batch (select_strategy epoch/auto)
};

struct StepReport {
  bool skipped = false;         // non-finite gradient: nothing was updated
  double grad_norm = 0.0;       // global L2 norm before clipping
  bool boundary = false;        // this step closed a window
  bool reselected = false;      // the selection changed after this step
  int64_t staleness_windows = 0;  // windows of host updates missing from the weights this step's gradient was computed with
  // The same in steps: the steps of the window(s) whose host step the weights miss (with
  // update_interval auto, 0 after a resume until the first boundary: their length is unknown).
  int64_t staleness_steps = 0;
  // A host AdamW window finished and was applied during this step: the seconds it ran on
  // the host (HostWork::run_seconds); negative otherwise.
  double host_step_seconds = -1;
};

// host_state_bytes() by what the bytes hold (zenflow_host_memory_bytes{kind}).
struct HostMemoryBytes {
  int64_t master = 0;            // fp32 master weights of this rank's host columns
  int64_t moments = 0;           // AdamW m and v of them
  int64_t accumulators = 0;      // the two window gradient accumulators
  int64_t transfer_buffers = 0;  // gradient staging, host output: pinned_host_bytes() on CUDA
};

// What the engine itself keeps on the training device (device_memory_bytes in the run
// summary, zenflow_device_memory_bytes{kind}). On the CPU device, host memory like the rest.
struct EngineDeviceBytes {
  // The device updater's fp32 master, m and v (the selected columns of split matrices, all
  // of the always-device parameters) and the column-importance accumulators.
  int64_t optimizer_state = 0;
  // Device-side transfer buffers: gradient staging for the D2H copy and the H2D landing
  // buffer of the host step's result (CUDA).
  int64_t buffers = 0;
  // EngineOptions::columns_streamed: the split matrices' selected columns' weights and this
  // step's gradient of them (the rest of their weights and gradients are host memory).
  int64_t selected_weights = 0;
  int64_t selected_gradients = 0;
};

class ZenFlowOptimizer {
 public:
  // `clock` (not owned, may be null) receives device-optimizer time, stalls and bytes.
  // `collectives` (not owned, may be null = one rank) is the data-parallel group.
  ZenFlowOptimizer(std::vector<ParamSpec> params, const EngineOptions& options,
                   StallClock* clock = nullptr, Collectives* collectives = nullptr);
  ~ZenFlowOptimizer();
  ZenFlowOptimizer(const ZenFlowOptimizer&) = delete;
  ZenFlowOptimizer& operator=(const ZenFlowOptimizer&) = delete;

  // Sets every parameter's gradient to zero (allocating it on first use).
  void zero_grad();

  // One optimizer step with the gradients currently in the parameters' .grad().
  StepReport step(const StepContext& ctx);

  // EngineOptions::columns_streamed (the index is the parameter's in the constructor's list):
  // whether it is a split matrix whose columns are streamed; its weights' parts, valid until
  // the next step(); a copy out of host_weights (the engine's next write into that buffer, a
  // host step's or an all-gather's, waits for the last one); one unit's gradient of it (on the device, [out, in] or its
  // parameter's shape): added to what this step's earlier micro-batches gave.
  bool streams_columns(size_t param) const;
  StreamedColumns streamed_columns(size_t param) const;
  void streamed_copy(int buffer, const CopyHandle& copy);
  void add_unit_gradient(size_t param, const at::Tensor& grad);
  // Around a unit's add_unit_gradient calls (`params`: its streamed matrices): before them,
  // the unit before's host columns land in the step's host gradient (on CUDA their D2H ran
  // behind this unit's backward) and the host staging is sized for this unit; after them,
  // this unit's go in flight. land_unit_gradients(): every one given lands (after a
  // backward; step() and zero_grad() do too).
  void unit_gradients_coming(const std::vector<size_t>& params);
  void unit_gradients_given();
  void land_unit_gradients();
  // Device bytes of the packed host columns whose D2H is in flight (the unit before's, until
  // unit_gradients_coming lands them): on CUDA they outlive their unit's backward; 0 on the
  // CPU, where the copies are done when made.
  int64_t unit_gradients_in_flight_bytes() const;
  // Writes every streamed matrix's current weights into its parameter tensor (on the host),
  // e.g. before a checkpoint; a no-op without columns_streamed.
  void sync_parameters();

  // Waits for the in-flight host step (if any) and applies it to the device weights,
  // so the weights reflect every gradient seen. Call before evaluation or export.
  void finish();

  // Asks the host backend whether the state it holds is still there (a read of one
  // element; a remote backend asks its node, waiting at most until it would declare the
  // node lost): throws HostBackendLost naming the node when it is gone, else returns.
  // For after a failure elsewhere whose cause may be a lost node, e.g. a collective that
  // failed because a peer rank lost the same node first and left the group.
  void check_host_backend();

  // Engine state (semantics §7), valid at any step: waits for in-flight host work
  // (without applying it, so the trajectory is unchanged) and returns named CPU
  // tensors. load_state() restores it into an optimizer built with the same
  // parameters and options.
  std::vector<std::pair<std::string, at::Tensor>> state_dict();
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);
  // The same from the state_dict()s of all ranks of a run with any number of ranks
  // (index = old rank): every host-owned column is taken from the shard that holds it.
  void load_state_shards(const std::vector<std::vector<std::pair<std::string, at::Tensor>>>& shards);

  // --- Introspection for tests, benchmarks and metrics ---
  const EngineOptions& options() const;
  int64_t steps() const;            // non-skipped steps taken
  int64_t skipped_steps() const;
  int64_t host_steps() const;       // host AdamW steps (bias-correction count)
  int64_t windows_completed() const;
  int64_t max_staleness_windows() const;
  bool at_boundary() const;         // no window is open (nothing accumulated)
  // Sorted selected column indices of parameter `name` (empty when not split).
  std::vector<int64_t> selected_columns(const std::string& name) const;
  bool is_split(const std::string& name) const;
  double selected_ratio() const;    // selected elements / split elements
  int64_t host_state_bytes() const; // host master + m + v + accumulators + staging
  int64_t pinned_host_bytes() const; // page-locked staging (CUDA; plain memory on CPU)
  HostMemoryBytes host_memory_bytes() const;  // host_state_bytes() by kind; they sum to it
  EngineDeviceBytes device_bytes() const;
  int64_t split_elements() const;
  int64_t reselections() const;
  int world_size() const;           // data-parallel ranks the host state is partitioned over
  // The host backend (null when nothing is split): its description and network bytes.
  // Do not submit to it.
  const HostOptimizer* host_optimizer() const;
  // Host-owned columns of `name` whose host state this rank holds, in storage order.
  std::vector<int64_t> owned_host_columns(const std::string& name) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zenflow::engine
