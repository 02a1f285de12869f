// What the engine needs from a data-parallel group (docs/semantics.md §2, docs/design.md §5).
//
// The engine stays transport-free: the worker adapts its c10d Communicator to this
// interface (worker/distributed/engine_collectives.h); tests may provide their own.
// With a group of W > 1 ranks, ZenFlowOptimizer
//   * all-reduces (sums) per-column importance scores, so every rank selects the same
//     columns from every rank's gradients — traffic class kSelection;
//   * all-reduces the selected columns' gradients (the device updater stays
//     replicated) and reduce-scatters the host-owned columns' gradients to the rank
//     that owns them (ZeRO-2: each rank's host updater holds 1/W of the host state) —
//     kGradients;
//   * all-gathers the host updaters' results at window boundaries, and moves optimizer
//     state of columns that change owner on re-selection — kParameters.
// Every rank calls the same collectives in the same order (c10d's rule); the engine
// guarantees it because every decision is taken from all-reduced values.
//
// Tensors are dense, contiguous and on the engine's device. Implementations block until
// the collective completed and throw std::runtime_error when it failed (a lost peer).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace zenflow::engine {

enum class CollectiveTraffic { kGradients, kSelection, kParameters };

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // In-place sum over all ranks; every rank receives the identical result.
  virtual void allreduce_sum_(at::Tensor& t, CollectiveTraffic traffic) = 0;
  // Mean over all ranks of a flat buffer; returns this rank's shard: elements
  // [offset(rank), offset(rank) + shard_sizes[rank]), offset(r) = sum(shard_sizes[0..r)).
  virtual at::Tensor reduce_scatter_mean(const at::Tensor& flat, const std::vector<int64_t>& shard_sizes,
                                         CollectiveTraffic traffic) = 0;
  // Every rank passes its shard; returns the shards of all ranks concatenated in rank order.
  virtual at::Tensor all_gather(const at::Tensor& shard, const std::vector<int64_t>& shard_sizes,
                                CollectiveTraffic traffic) = 0;
};

}  // namespace zenflow::engine
