// Activation checkpointing of one decoder layer: its forward keeps only what goes in (the
// layer's input and its weights) and the backward runs the layer again, with autograd on,
// to get the intermediates it needs. The same kernels run in the same order, so on the
// CPU the recomputed intermediates, and therefore every gradient, are bit-identical to a
// run that kept them; the cost is one more forward of the layer.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

namespace zenflow::model {

// A layer as a function of its input and its weights. It reads nothing else that changes
// between the forward and the backward (constant tables it captures by value are fine).
using LayerBody = std::function<at::Tensor(const at::Tensor& x, const std::vector<at::Tensor>& weights)>;

// body(x, weights) with grad mode on, keeping for the backward only x and the weights.
// The backward recomputes body under the forward's CUDA autocast state and random-number
// state (the CPU's and that of x's device; the models draw none today, having no dropout)
// and returns the gradients of x and of each weight to autograd, which accumulates them
// into the weights as it would without checkpointing (hooks on a weight fire once).
// With grad mode off (evaluation) it is body(x, weights).
at::Tensor checkpointed_layer(const LayerBody& body, const at::Tensor& x, const std::vector<at::Tensor>& weights);

// What a recompute must run under to repeat a forward exactly: the forward's CUDA autocast
// state and random-number state (the CPU's and that of the input's device). For units that
// recompute in their backward (checkpointed_layer, sharded units).
class ForwardState {
 public:
  ForwardState();
  ~ForwardState();
  ForwardState(ForwardState&&) noexcept;
  ForwardState& operator=(ForwardState&&) noexcept;
  // The state now, before a forward over `x`.
  static ForwardState capture(const at::Tensor& x);
  // f() with grad mode on under the captured state; the current state is back afterwards
  // (also when f throws).
  at::Tensor replay(const std::function<at::Tensor()>& f);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zenflow::model

namespace zenflow::model {

// The weight fields of a model's layer struct (pointers to its `const at::Tensor*`
// members, those the config uses, in a fixed order): to list a layer's weights for
// checkpointed_layer and to make the copy of the layer its recompute reads.
template <typename Layer>
struct LayerFields {
  std::vector<const at::Tensor* Layer::*> fields;

  std::vector<at::Tensor> weights(const Layer& layer) const {
    std::vector<at::Tensor> out;
    out.reserve(fields.size());
    for (auto f : fields) out.push_back(*(layer.*f));
    return out;
  }
  // A layer reading `weights` (which must outlive it), in the order weights() lists them.
  Layer bound(const std::vector<at::Tensor>& weights) const {
    Layer layer{};
    for (size_t i = 0; i < fields.size(); ++i) layer.*fields[i] = &weights[i];
    return layer;
  }
};

}  // namespace zenflow::model
