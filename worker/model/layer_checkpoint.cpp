// Activation checkpointing as a custom autograd function (see layer_checkpoint.h).
#include "worker/model/layer_checkpoint.h"

#include <ATen/core/Generator.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>
#include <optional>
#include <stdexcept>
#include <utility>

#include "worker/model/autocast_scope.h"

namespace zenflow::model {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A generator's state, set back for the recompute and restored after it.
struct RngState {
  at::Generator generator;
  at::Tensor state;

  static RngState of(at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    return {g, g.get_state()};
  }
  // Swaps `state` with the generator's: calling it twice restores both.
  void swap() {
    std::lock_guard<std::mutex> lock(generator.mutex());
    at::Tensor now = generator.get_state();
    generator.set_state(state);
    state = std::move(now);
  }
};

// What the backward needs besides the saved tensors; kept in the autograd context.
struct Recompute : torch::CustomClassHolder {
  LayerBody body;
  ForwardState state;
};

struct CheckpointedLayer : torch::autograd::Function<CheckpointedLayer> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList weights,
                               c10::intrusive_ptr<Recompute> recompute) {
    std::vector<at::Tensor> saved;
    saved.reserve(weights.size() + 1);
    saved.push_back(x);
    saved.insert(saved.end(), weights.begin(), weights.end());
    ctx->save_for_backward(saved);
    at::Tensor y = recompute->body(x, weights.vec());  // autograd is off inside a Function's forward
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(std::move(recompute));
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto recompute = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const variable_list saved = ctx->get_saved_variables();
    // Fresh leaves over the same storage: the recompute's graph ends at them, so the
    // gradients come back here rather than into the weights (autograd accumulates what
    // this returns, once, and a weight's hooks fire once).
    std::vector<at::Tensor> leaves;
    leaves.reserve(saved.size());
    for (const at::Tensor& t : saved) leaves.push_back(t.detach().requires_grad_(t.requires_grad()));
    const std::vector<at::Tensor> weights(leaves.begin() + 1, leaves.end());

    const at::Tensor y = recompute->state.replay([&] { return recompute->body(leaves[0], weights); });

    variable_list wanted;
    std::vector<size_t> index;
    for (size_t i = 0; i < leaves.size(); ++i)
      if (leaves[i].requires_grad()) {
        wanted.push_back(leaves[i]);
        index.push_back(i);
      }
    variable_list out(leaves.size() + 1);  // the last: the Recompute argument, no gradient
    if (wanted.empty()) return out;
    const variable_list grads = torch::autograd::grad({y}, wanted, {grad_out[0]}, /*retain_graph=*/false,
                                                      /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t k = 0; k < index.size(); ++k) out[index[k]] = grads[k];
    return out;
  }
};

}  // namespace

at::Tensor checkpointed_layer(const LayerBody& body, const at::Tensor& x, const std::vector<at::Tensor>& weights) {
  if (!c10::GradMode::is_enabled()) return body(x, weights);
  auto recompute = c10::make_intrusive<Recompute>();
  recompute->body = body;
  recompute->state = ForwardState::capture(x);
  return CheckpointedLayer::apply(x, at::TensorList(weights), std::move(recompute))[0];
}

struct ForwardState::Impl {
  AutocastState autocast;
  std::vector<RngState> rng;
};

ForwardState::ForwardState() = default;
ForwardState::~ForwardState() = default;
ForwardState::ForwardState(ForwardState&&) noexcept = default;
ForwardState& ForwardState::operator=(ForwardState&&) noexcept = default;

ForwardState ForwardState::capture(const at::Tensor& x) {
  ForwardState s;
  s.impl_ = std::make_unique<Impl>();
  if (x.is_cuda()) s.impl_->autocast = current_cuda_autocast();
  s.impl_->rng.push_back(RngState::of(at::globalContext().defaultGenerator(at::kCPU)));
  if (!x.is_cpu()) s.impl_->rng.push_back(RngState::of(at::globalContext().defaultGenerator(x.device())));
  return s;
}

at::Tensor ForwardState::replay(const std::function<at::Tensor()>& f) {
  if (!impl_) throw std::logic_error("ForwardState::replay: nothing was captured");
  at::Tensor y;
  for (RngState& r : impl_->rng) r.swap();
  try {
    at::AutoGradMode grad_on(true);
    CudaAutocast autocast(impl_->autocast.enabled, impl_->autocast.dtype);
    y = f();
  } catch (...) {
    for (RngState& r : impl_->rng) r.swap();
    throw;
  }
  for (RngState& r : impl_->rng) r.swap();
  return y;
}

}  // namespace zenflow::model
