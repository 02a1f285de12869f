// A UnitRunner whose units compute with weights made just before each one runs, from the
// parameter tensors the model holds (the leaves the optimizer updates), which are not
// those weights: row shards gathered from the data-parallel ranks
// (worker/distributed/sharded_parameters.h, ZeRO-3) or host copies streamed to the device
// (worker/engine/streamed_parameters.h, train.offload_parameters). This class is the
// autograd side they share; they say how weights are made and where gradients go.
//
// A unit runs as one autograd function of its input and its parameter tensors:
//   * forward: materialize() its weights and run the body on them. A unit that recomputes
//     (recomputes(checkpoint)) keeps only its input and lets the weights go; one that does
//     not keeps its graph, and its weights with it, until its backward.
//   * backward: a recomputing unit materializes its weights again and runs its body once
//     more (under the forward's autocast and RNG state, layer_checkpoint.h); then the
//     gradients of the input and of the weights. A parameter several units use (tied
//     embeddings) gets the sum of its gradients from every use, in backward order, once:
//     when its last use's backward is done (what autograd's input buffer makes for a
//     leaf used twice), and only then goes to gradients_ready().
// With grad mode off (evaluation) a unit is body(x, materialize(idx)).
//
// UnitSequence is the order units materialized in during the last micro-batch (from one
// embedding unit to the next), for a runner that starts each unit's transfer while the one
// before it computes.
//
// Threads: the training thread and autograd's (which run a unit's backward while the
// training thread waits in backward()); never two at once.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <unordered_map>
#include <vector>

#include "worker/model/causal_lm.h"

namespace zenflow::model {

class MaterializedUnits : public UnitRunner {
 public:
  at::Tensor run(UnitKind kind, const LayerBody& body, const at::Tensor& x, const std::vector<at::Tensor>& weights,
                 bool checkpoint) final;

 protected:
  // `params`: how many parameter tensors there are.
  explicit MaterializedUnits(size_t params);

  // The tensors the model holds as its parameters, in order (what a unit is given as its
  // weights): a runner registers them before the model runs. `runner` names it in errors.
  void register_leaves(const std::vector<at::Tensor>& leaves, const char* runner);
  // The weights parameters `idx` compute with, now (a unit's, in its order).
  virtual std::vector<at::Tensor> materialize(const std::vector<size_t>& idx) = 0;
  // The gradients of parameters `idx` whose every use this step is done (the sum over the
  // uses; undefined: none reached them) -> what each parameter tensor receives from
  // autograd (undefined: nothing).
  virtual std::vector<at::Tensor> gradients_ready(const std::vector<size_t>& idx,
                                                  const std::vector<at::Tensor>& grads) = 0;
  // Whether a unit recomputes in its backward; `checkpoint`: the model would checkpoint it.
  virtual bool recomputes(bool checkpoint) const = 0;
  // A forward begins (the embedding unit runs).
  virtual void forward_begins() {}

  // Before each step's first forward: no use counted, no gradient pending.
  void reset_uses();

 private:
  struct Unit;  // the autograd function of one unit
  // A unit's backward: its weights' gradients -> per weight what autograd gives its tensor.
  std::vector<at::Tensor> backward_done(const std::vector<size_t>& idx, const std::vector<at::Tensor>& grads);

  // The parameter index of a weight tensor a unit was given; std::logic_error for one that
  // was not registered.
  size_t index_of(const at::Tensor& weight) const;

  const char* runner_ = "MaterializedUnits";
  std::unordered_map<const c10::TensorImpl*, size_t> by_leaf_;
  std::vector<int> uses_;             // per parameter: forwards whose backward is still to come
  std::vector<at::Tensor> pending_;   // per parameter: the gradient of the backwards done so far
};

class UnitSequence {
 public:
  // A forward begins: the sequence so far is the last micro-batch's.
  void restart();
  // Records `idx` as the next unit to materialize; returns the unit after it in the last
  // micro-batch's sequence when that had `idx` at this position, else null.
  const std::vector<size_t>* record(const std::vector<size_t>& idx);

 private:
  std::vector<std::vector<size_t>> last_, now_;
};

}  // namespace zenflow::model
