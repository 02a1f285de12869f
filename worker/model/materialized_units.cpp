// The autograd side of runners whose units compute with materialized weights (see
// materialized_units.h).
#include "worker/model/materialized_units.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace zenflow::model {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct MaterializedUnits::Unit : torch::autograd::Function<Unit> {
  struct Context : torch::CustomClassHolder {
    MaterializedUnits* owner = nullptr;
    LayerBody body;
    std::vector<size_t> idx;
    bool recompute = false;
    ForwardState state;  // recompute: the forward's autocast and RNG state
    // Not recomputing: the forward's own graph, from these leaves to y.
    at::Tensor y;
    std::vector<at::Tensor> leaves;  // x, then the materialized weights
  };

  // The graph's leaves: x (a gradient wanted where x wants one) and the weights.
  static void make_leaves(Context& c, const at::Tensor& x, const std::vector<at::Tensor>& weights) {
    c.leaves.push_back(x.detach().requires_grad_(x.requires_grad()));
    for (const at::Tensor& w : weights) c.leaves.push_back(w.detach().requires_grad_(true));
  }

  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                               c10::intrusive_ptr<Context> c) {
    std::vector<at::Tensor> weights = c->owner->materialize(c->idx);
    at::Tensor y;
    if (c->recompute) {
      c->state = ForwardState::capture(x);
      y = c->body(x, weights);  // grad mode is off in a Function's forward
      ctx->save_for_backward({x});
    } else {
      at::AutoGradMode grad_on(true);
      make_leaves(*c, x, weights);
      c->y = c->body(c->leaves[0], std::vector<at::Tensor>(c->leaves.begin() + 1, c->leaves.end()));
      y = c->y.detach();
    }
    ctx->saved_data["unit"] = c10::IValue::make_capsule(std::move(c));
    (void)params;
    return {y};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto c = c10::static_intrusive_pointer_cast<Context>(ctx->saved_data["unit"].toCapsule());
    if (c->recompute) {
      const at::Tensor x = ctx->get_saved_variables()[0];
      make_leaves(*c, x, c->owner->materialize(c->idx));
      const std::vector<at::Tensor> weights(c->leaves.begin() + 1, c->leaves.end());
      c->y = c->state.replay([&] { return c->body(c->leaves[0], weights); });
    }
    variable_list wanted;
    const bool want_x = c->leaves[0].requires_grad();
    if (want_x) wanted.push_back(c->leaves[0]);
    wanted.insert(wanted.end(), c->leaves.begin() + 1, c->leaves.end());
    variable_list grads = torch::autograd::grad({c->y}, wanted, {grad_out[0]}, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    // The weights and the graph go before the gradients are moved on.
    c->y = at::Tensor();
    c->leaves.clear();
    variable_list out;
    out.push_back(want_x ? grads[0] : at::Tensor());
    const std::vector<at::Tensor> weight_grads(grads.begin() + (want_x ? 1 : 0), grads.end());
    std::vector<at::Tensor> param_grads = c->owner->backward_done(c->idx, weight_grads);
    out.insert(out.end(), param_grads.begin(), param_grads.end());
    out.emplace_back();  // the Context argument
    return out;
  }
};

MaterializedUnits::MaterializedUnits(size_t params) : uses_(params, 0), pending_(params) {}

void MaterializedUnits::register_leaves(const std::vector<at::Tensor>& leaves, const char* runner) {
  if (leaves.size() != uses_.size())
    throw std::logic_error(std::string(runner) + ": " + std::to_string(leaves.size()) + " parameter tensors, " +
                           std::to_string(uses_.size()) + " expected");
  runner_ = runner;
  by_leaf_.clear();
  for (size_t i = 0; i < leaves.size(); ++i) by_leaf_[leaves[i].unsafeGetTensorImpl()] = i;
}

size_t MaterializedUnits::index_of(const at::Tensor& weight) const {
  auto it = by_leaf_.find(weight.unsafeGetTensorImpl());
  if (it == by_leaf_.end())
    throw std::logic_error(std::string(runner_) + ": a unit's weight is none of the parameter tensors it made");
  return it->second;
}

at::Tensor MaterializedUnits::run(UnitKind kind, const LayerBody& body, const at::Tensor& x,
                                  const std::vector<at::Tensor>& weights, bool checkpoint) {
  if (kind == UnitKind::kEmbedding) forward_begins();
  std::vector<size_t> idx;
  idx.reserve(weights.size());
  for (const at::Tensor& w : weights) idx.push_back(index_of(w));
  if (!c10::GradMode::is_enabled()) return body(x, materialize(idx));
  auto c = c10::make_intrusive<Unit::Context>();
  c->owner = this;
  c->body = body;
  c->idx = idx;
  c->recompute = recomputes(checkpoint);
  for (size_t i : idx) ++uses_[i];
  return Unit::apply(x, at::TensorList(weights), std::move(c))[0];
}

void MaterializedUnits::reset_uses() {
  for (size_t i = 0; i < uses_.size(); ++i) {
    uses_[i] = 0;
    pending_[i] = at::Tensor();
  }
}

std::vector<at::Tensor> MaterializedUnits::backward_done(const std::vector<size_t>& idx,
                                                         const std::vector<at::Tensor>& grads) {
  std::vector<size_t> ready;
  std::vector<at::Tensor> ready_grads;
  std::vector<int> position(idx.size(), -1);
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    at::Tensor g = grads[k];
    if (pending_[i].defined()) g = g.defined() ? pending_[i] + g : pending_[i];
    pending_[i] = at::Tensor();
    if (uses_[i] > 1) {  // another unit's backward still brings some: keep the sum so far
      --uses_[i];
      pending_[i] = g;
      continue;
    }
    uses_[i] = 0;
    position[k] = static_cast<int>(ready.size());
    ready.push_back(i);
    ready_grads.push_back(g);
  }
  std::vector<at::Tensor> out(idx.size());
  if (ready.empty()) return out;
  const std::vector<at::Tensor> given = gradients_ready(ready, ready_grads);
  for (size_t k = 0; k < idx.size(); ++k)
    if (position[k] >= 0) out[k] = given[static_cast<size_t>(position[k])];
  return out;
}

void UnitSequence::restart() {
  if (!now_.empty()) last_ = std::move(now_);
  now_.clear();
}

const std::vector<size_t>* UnitSequence::record(const std::vector<size_t>& idx) {
  const size_t pos = now_.size();
  now_.push_back(idx);
  if (pos + 1 < last_.size() && last_[pos] == idx) return &last_[pos + 1];
  return nullptr;
}

}  // namespace zenflow::model
