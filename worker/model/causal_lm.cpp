// The language-model loss shared by every CausalLM.
#include "worker/model/causal_lm.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

namespace zenflow::model {

at::Tensor causal_lm_loss(const at::Tensor& logits, const at::Tensor& targets) {
  if (logits.dim() != 3 || targets.dim() != 2 || logits.size(0) != targets.size(0) ||
      logits.size(1) != targets.size(1))
    throw std::invalid_argument(
        "causal_lm_loss: expected logits [B, T, V] and targets [B, T], got " +
        std::to_string(logits.dim()) + "-D logits and " + std::to_string(targets.dim()) +
        "-D targets of mismatched shape");
  const int64_t V = logits.size(2);
  return at::cross_entropy_loss(logits.reshape({-1, V}).to(at::kFloat),
                                targets.reshape({-1}).to(at::kLong), /*weight=*/{},
                                at::Reduction::Mean, /*ignore_index=*/-100);
}

std::vector<NamedTensor> NamedParameterModel::parameters() {
  std::vector<NamedTensor> out;
  out.reserve(params_.size());
  for (const auto& p : params_) out.push_back({p.first, p.second});
  return out;
}

void NamedParameterModel::replace_parameters(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() != params_.size())
    throw std::invalid_argument("replace_parameters: " + std::to_string(tensors.size()) + " tensors for " +
                                std::to_string(params_.size()) + " parameters");
  for (size_t i = 0; i < params_.size(); ++i) params_[i].second = tensors[i];
}

at::Tensor NamedParameterModel::run_unit(UnitKind kind, const LayerBody& body, const at::Tensor& x,
                                         const std::vector<at::Tensor>& weights) const {
  const bool checkpoint = kind == UnitKind::kLayer && checkpoint_layers_;
  if (runner_) return runner_->run(kind, body, x, weights, checkpoint);
  return checkpoint ? checkpointed_layer(body, x, weights) : body(x, weights);
}

void NamedParameterModel::to(at::Device device, at::ScalarType dtype) {
  for (auto& p : params_) {
    if (p.second.device() == device && p.second.scalar_type() == dtype) continue;
    p.second = p.second.detach().to(device, dtype).requires_grad_(true);
  }
}

}  // namespace zenflow::model
