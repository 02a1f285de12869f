// Data-parallel sharding of a model's parameters, gradients and optimizer state across the
// ranks of a Communicator (train.shard; docs/semantics.md §10, docs/design.md §5.2).
//
// Every parameter is cut into world_size contiguous ranges of rows (dim 0; a 1-D parameter's
// rows are its elements), Communicator::even_shards(rows): rank r owns rows [lo_r, hi_r).
// The model's parameter tensors are replaced by this rank's shards (fresh leaves with
// requires_grad): the optimizer sees only them, and every optimizer state is 1/W. The
// model's units (causal_lm.h: the embedding, each decoder layer, the head) run through this
// object, which gives each unit's body the full weights:
//   * kGradients (ZeRO-2): every rank keeps the full weights too (not trainable; refreshed
//     by all_gather_weights() after each optimizer step). A unit's forward keeps its graph
//     (or recomputes, under activation checkpointing) and its backward reduce-scatters the
//     full weight gradients (mean over ranks) into the shards: no full gradient outlives
//     its unit's backward.
//   * kParameters (ZeRO-3): the full weights exist only while a unit runs: they are
//     all-gathered before its forward and freed after it, gathered again for its backward,
//     which recomputes the unit (so train.activation_checkpointing is required by the job
//     spec), and freed once the gradients are reduce-scattered.
// A unit's weights move as one collective each way (their shards concatenated rank by rank).
// Every rank runs the same units in the same order, so the collectives match (c10d's rule).
// Prefetching (kParameters): the sequence of gathers of the last micro-batch (its units'
// forwards, then their backwards in reverse) is replayed: a gather that is where the
// sequence had it launches the next one asynchronously (all_gather_async; NCCL's own
// stream on a GPU), which then overlaps this unit's compute; comm_seconds() counts only
// the time a rank was blocked. A sequence that changes (evaluation, a checkpoint's
// gathers) costs one gather that waits unused.
//
// Numbers: the reduce-scatter averages as the unsharded GradReducer does (sum, then divide by
// W), in another order of additions: a sharded run equals the unsharded one within float
// rounding (tests/test_sharded_training.cpp: 1e-6 relative).
//
// zenflow (semantics.md §10): split matrices are row-sharded too, so every rank holds all
// the columns of its rows and the selection (of columns) is the same everywhere: the unit's
// backward sums every rank's column scores of its local gradient (ShardOptions) as the
// unsharded engine's all-reduce does, and the engine selects from them.
//
// Checkpoints: full_tensor() and gather_engine_state() rebuild what a one-rank run holds
// (collectives: every rank calls them, in the same order); slice_rows() and
// slice_engine_state() cut it back, so a checkpoint moves across shard settings and rank
// counts. merge_engine_shards() turns the engine shards of an unsharded W-rank run into
// the one-rank state.
//
// Threads: the training thread (autograd may run the backward on its device threads; the
// collectives are issued one at a time in backward order). Errors: std::invalid_argument
// when a parameter has fewer rows than there are ranks; std::runtime_error from the
// Communicator when a peer is lost.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "worker/distributed/communicator.h"
#include "worker/model/causal_lm.h"
#include "worker/model/materialized_units.h"

namespace zenflow::distributed {

enum class ShardMode { kGradients, kParameters };
ShardMode parse_shard_mode(const std::string& s);  // "gradients" | "parameters"

struct ShardOptions {
  ShardMode mode = ShardMode::kParameters;
  // zenflow's selection (semantics §2, §10): every 2-D parameter's column importance of
  // each rank's own local gradient (L2: sum of squares, or L1), summed over the ranks in
  // the unit's backward, before the gradients are averaged: column_scores().
  bool column_scores = false;
  bool l1 = false;
};

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

class ShardedParameters final : public model::MaterializedUnits {
 public:
  // Cuts `model`'s parameters (on the Communicator's device), gives the model this rank's
  // shards and makes itself the model's unit runner. The model must outlive this object,
  // which detaches itself from the model when destroyed.
  ShardedParameters(Communicator& comm, model::CausalLM& model, ShardOptions options);
  ~ShardedParameters() override;  // waits for a prefetch still in flight
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // kGradients: the updated shards into every rank's full weights (after each optimizer
  // step, and after shards were loaded). kParameters: nothing.
  void all_gather_weights();

  ShardMode mode() const { return mode_; }
  // ShardOptions::column_scores: parameter i's scores of this step so far (fp32 [columns]
  // on the device, identical on every rank), the tensor ParamSpec::column_scores takes;
  // undefined for a 1-D parameter or without the option.
  at::Tensor column_scores(size_t i) const { return params_[i].scores; }
  // Before each step's first forward: the scores to zero, no gradient pending.
  void begin_step();
  int64_t full_numel(size_t i) const;
  size_t size() const { return params_.size(); }
  const std::string& name(size_t i) const { return params_[i].name; }
  // Parameter i's full tensor: gathered (a collective) or, kGradients, the kept copy.
  at::Tensor full_tensor(size_t i);
  // This rank's rows of a full tensor of parameter i's shape (or of any tensor with as
  // many rows): rows [lo, hi), a view.
  at::Tensor slice_rows(size_t i, const at::Tensor& full) const;

  // The engine's state_dict() of this rank (its shards) -> what a one-rank engine over the
  // full parameters holds (a collective); and back.
  NamedTensors gather_engine_state(const NamedTensors& local);
  NamedTensors slice_engine_state(const NamedTensors& full) const;

  // Device bytes: this rank's shards; the kept full weights (kGradients, else 0); the most
  // bytes of gathered weights and their flat transfer buffer held at once.
  int64_t shard_bytes() const;
  int64_t kept_full_bytes() const;
  int64_t gathered_peak_bytes() const { return gathered_peak_; }
  // Seconds blocked in the gathers and reduce-scatters so far (a prefetched gather counts
  // only the wait for what it did not hide).
  double comm_seconds() const { return comm_seconds_; }

 private:
  struct Param {
    std::string name;
    std::vector<int64_t> full_shape;
    std::vector<int64_t> rows;        // per rank
    std::vector<int64_t> row_offset;  // per rank and one past the last: where its rows begin
    int64_t row_numel = 1;            // elements per row
    at::Tensor shard;           // the leaf the optimizer updates
    at::Tensor full;            // kGradients: the kept full weights
    at::Tensor scores;          // ShardOptions::column_scores, 2-D parameters
  };

  // MaterializedUnits: a parameter several units use (tied embeddings) is scored and
  // reduce-scattered once, when its last use's backward is done, as the sum an unsharded
  // run's .grad holds.
  bool recomputes(bool checkpoint) const override { return checkpoint || mode_ == ShardMode::kParameters; }
  void forward_begins() override { sequence_.restart(); }
  // Elements per rank of parameters `idx` together (the layout of their collectives: each
  // rank's rows of every one of them, rank after rank).
  std::vector<int64_t> rank_sizes(const std::vector<size_t>& idx) const;
  // The inverse: `flat` in that layout -> per parameter, each rank's rows (views).
  std::vector<std::vector<at::Tensor>> unpack(const std::vector<size_t>& idx, const at::Tensor& flat) const;
  // The full weights of shards `idx` (gathered in one collective, or the kept copies).
  std::vector<at::Tensor> materialize(const std::vector<size_t>& idx) override;
  // The local full gradients of parameters `idx` (their last use's backward done) -> their
  // shard gradients.
  std::vector<at::Tensor> gradients_ready(const std::vector<size_t>& idx,
                                          const std::vector<at::Tensor>& grads) override;
  // Adds the column scores of the local full gradients `grads` (undefined = zeros) of
  // parameters `idx`, summed over the ranks in one collective, into their scores.
  void add_column_scores(const std::vector<size_t>& idx, const std::vector<at::Tensor>& grads);
  // Full gradients (undefined = zeros) of parameters `idx` -> this rank's shard gradients,
  // mean over ranks, in one collective.
  std::vector<at::Tensor> reduce_scatter(const std::vector<size_t>& idx, const std::vector<at::Tensor>& grads);

  // A gather in flight: parameters `idx`, their shards concatenated rank by rank into `flat`.
  struct Gather {
    std::vector<size_t> idx;
    CommWork work;
    std::shared_ptr<at::Tensor> flat;
    int64_t bytes = 0;  // of the gathered buffer
  };
  Gather launch_gather(const std::vector<size_t>& idx);
  at::Tensor finish_gather(Gather& g);

  Communicator& comm_;
  model::CausalLM& model_;
  ShardMode mode_;
  ShardOptions options_;
  int world_, rank_;
  std::vector<Param> params_;
  std::unordered_map<std::string, size_t> by_name_;
  int64_t gathered_peak_ = 0;
  model::UnitSequence sequence_;  // the gathers of the last micro-batch, to prefetch
  std::unique_ptr<Gather> prefetched_;
  double comm_seconds_ = 0;
};

// The engine state of the W shards (index = rank) of an unsharded run (each holds its
// ranks' host-owned columns, `host_cols`) as one rank holds it: every column in order.
NamedTensors merge_engine_shards(const std::vector<NamedTensors>& shards);

}  // namespace zenflow::distributed
