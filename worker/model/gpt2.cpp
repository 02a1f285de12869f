// GPT-2 in plain ATen ops, equation for equation Hugging Face's GPT2LMHeadModel.
#include "worker/model/gpt2.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/model/model_shapes.h"
#include "worker/model/attention.h"
#include "worker/model/layer_checkpoint.h"

namespace zenflow::model {
namespace {

// HF Conv1D: x @ W + b with W [in, out].
at::Tensor conv1d(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  return at::matmul(x, weight) + bias;
}

struct Init {
  bool random = true;
  uint64_t seed = 0;
  at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
};

class GPT2 final : public NamedParameterModel {
 public:
  GPT2(const GPT2Config& config, const Init& init) : config_(config) {
    check_gpt2_config(config_);
    create_parameters(init);
  }

  at::Tensor forward(const at::Tensor& input_ids) override {
    if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong)
      throw std::invalid_argument("GPT2::forward: input_ids must be a [B, T] int64 tensor, got " +
                                  std::to_string(input_ids.dim()) + "-D " +
                                  std::string(c10::toString(input_ids.scalar_type())));
    const int64_t T = input_ids.size(1);
    if (T > config_.n_positions)
      throw std::invalid_argument("GPT2::forward: sequence length " + std::to_string(T) +
                                  " exceeds n_positions " + std::to_string(config_.n_positions));
    const int64_t E = config_.n_embd;
    const double eps = config_.layer_norm_epsilon;

    at::Tensor x = run_unit(
        UnitKind::kEmbedding,
        [](const at::Tensor& ids, const std::vector<at::Tensor>& w) {
          const at::Tensor positions = at::arange(ids.size(1), ids.options());
          return at::embedding(w[0], ids) + at::embedding(w[1], positions);  // [B, T, E]
        },
        input_ids, {*wte_, *wpe_});
    for (size_t l = 0; l < layers_.size(); ++l)
      x = run_unit(
          UnitKind::kLayer,
          [this, l](const at::Tensor& in, const std::vector<at::Tensor>& w) { return block(in, fields_.bound(w), l); },
          x, fields_.weights(layers_[l]));
    return run_unit(
        UnitKind::kHead,
        [E, eps](const at::Tensor& in, const std::vector<at::Tensor>& w) {
          return at::linear(at::layer_norm(in, {E}, w[0], w[1], eps), w[2]);  // [B, T, V]
        },
        x, {*ln_f_w_, *ln_f_b_, config_.tie_word_embeddings ? *wte_ : *lm_head_});
  }

  int64_t vocab_size() const override { return config_.vocab_size; }

 private:
  struct Layer {
    const at::Tensor *ln_1_w = nullptr, *ln_1_b = nullptr;
    const at::Tensor *c_attn_w = nullptr, *c_attn_b = nullptr;
    const at::Tensor *attn_c_proj_w = nullptr, *attn_c_proj_b = nullptr;
    const at::Tensor *ln_2_w = nullptr, *ln_2_b = nullptr;
    const at::Tensor *c_fc_w = nullptr, *c_fc_b = nullptr;
    const at::Tensor *mlp_c_proj_w = nullptr, *mlp_c_proj_b = nullptr;
  };

  // Transformer block `l`: x [B, T, E] -> [B, T, E].
  at::Tensor block(at::Tensor x, const Layer& L, size_t l) const {
    const int64_t B = x.size(0);
    const int64_t T = x.size(1);
    const int64_t E = config_.n_embd;
    const int64_t nH = config_.n_head;
    const int64_t hd = E / nH;
    const double eps = config_.layer_norm_epsilon;
    at::Tensor h = at::layer_norm(x, {E}, *L.ln_1_w, *L.ln_1_b, eps);
    const at::Tensor qkv = conv1d(h, *L.c_attn_w, *L.c_attn_b);  // [B, T, 3E]: q | k | v
    auto heads = [&](int64_t i) { return qkv.narrow(-1, i * E, E).view({B, T, nH, hd}).transpose(1, 2); };
    double scale = config_.scale_attn_weights ? 1.0 / std::sqrt(static_cast<double>(hd)) : 1.0;
    if (config_.scale_attn_by_inverse_layer_idx) scale /= static_cast<double>(l + 1);
    at::Tensor a = causal_attention(heads(0), heads(1), heads(2), scale, /*sliding_window=*/0);
    a = a.transpose(1, 2).reshape({B, T, E});
    x = x + conv1d(a, *L.attn_c_proj_w, *L.attn_c_proj_b);

    h = at::layer_norm(x, {E}, *L.ln_2_w, *L.ln_2_b, eps);
    h = activation(conv1d(h, *L.c_fc_w, *L.c_fc_b));
    x = x + conv1d(h, *L.mlp_c_proj_w, *L.mlp_c_proj_b);
    return x;
  }

  at::Tensor activation(const at::Tensor& x) const {
    const std::string& a = config_.activation_function;
    if (a == "gelu_new" || a == "gelu_pytorch_tanh") return at::gelu(x, "tanh");
    if (a == "gelu") return at::gelu(x);
    if (a == "relu") return at::relu(x);
    return at::silu(x);
  }

  void create_parameters(const Init& init) {
    const int64_t V = config_.vocab_size;
    const int64_t E = config_.n_embd;
    const int64_t I = config_.inner_size();
    at::Generator gen = at::detail::createCPUGenerator(init.seed);
    const at::TensorOptions opts = init.options;
    const double std_dev = config_.initializer_range;
    const double proj_std = std_dev / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
    auto matrix = [&](int64_t rows, int64_t cols, double sd) {
      at::Tensor t = at::empty({rows, cols}, opts);
      if (init.random) t.normal_(0.0, sd, gen);
      return t.requires_grad_(true);
    };
    auto filled = [&](int64_t n, double value) {
      at::Tensor t = init.random ? at::full({n}, value, opts) : at::empty({n}, opts);
      return t.requires_grad_(true);
    };

    std::vector<std::pair<int64_t, const at::Tensor * Layer::*>> slots;
    auto add = [&](std::string name, at::Tensor t, int64_t layer, const at::Tensor* Layer::*field) {
      params_.emplace_back(std::move(name), std::move(t));
      slots.emplace_back(layer, field);
    };
    add("transformer.wte.weight", matrix(V, E, std_dev), -1, nullptr);
    add("transformer.wpe.weight", matrix(config_.n_positions, E, std_dev), -1, nullptr);
    for (int64_t l = 0; l < config_.n_layer; ++l) {
      const std::string p = "transformer.h." + std::to_string(l) + ".";
      add(p + "ln_1.weight", filled(E, 1.0), l, &Layer::ln_1_w);
      add(p + "ln_1.bias", filled(E, 0.0), l, &Layer::ln_1_b);
      add(p + "attn.c_attn.weight", matrix(E, 3 * E, std_dev), l, &Layer::c_attn_w);
      add(p + "attn.c_attn.bias", filled(3 * E, 0.0), l, &Layer::c_attn_b);
      add(p + "attn.c_proj.weight", matrix(E, E, proj_std), l, &Layer::attn_c_proj_w);
      add(p + "attn.c_proj.bias", filled(E, 0.0), l, &Layer::attn_c_proj_b);
      add(p + "ln_2.weight", filled(E, 1.0), l, &Layer::ln_2_w);
      add(p + "ln_2.bias", filled(E, 0.0), l, &Layer::ln_2_b);
      add(p + "mlp.c_fc.weight", matrix(E, I, std_dev), l, &Layer::c_fc_w);
      add(p + "mlp.c_fc.bias", filled(I, 0.0), l, &Layer::c_fc_b);
      add(p + "mlp.c_proj.weight", matrix(I, E, proj_std), l, &Layer::mlp_c_proj_w);
      add(p + "mlp.c_proj.bias", filled(E, 0.0), l, &Layer::mlp_c_proj_b);
    }
    add("transformer.ln_f.weight", filled(E, 1.0), -1, nullptr);
    add("transformer.ln_f.bias", filled(E, 0.0), -1, nullptr);
    if (!config_.tie_word_embeddings) add("lm_head.weight", matrix(V, E, std_dev), -1, nullptr);

    layers_.assign(static_cast<size_t>(config_.n_layer), Layer{});
    for (size_t i = 0; i < params_.size(); ++i)
      if (slots[i].first >= 0)
        layers_[static_cast<size_t>(slots[i].first)].*(slots[i].second) = &params_[i].second;
    for (const auto& slot : slots)
      if (slot.first == 0) fields_.fields.push_back(slot.second);
    wte_ = &params_[0].second;
    wpe_ = &params_[1].second;
    const size_t ln_f = params_.size() - (config_.tie_word_embeddings ? 2 : 3);
    ln_f_w_ = &params_[ln_f].second;
    ln_f_b_ = &params_[ln_f + 1].second;
    lm_head_ = config_.tie_word_embeddings ? nullptr : &params_.back().second;
  }

  GPT2Config config_;
  at::Tensor *wte_ = nullptr, *wpe_ = nullptr;
  std::vector<Layer> layers_;
  LayerFields<Layer> fields_;  // the weights a layer has (the same in every layer)
  at::Tensor *ln_f_w_ = nullptr, *ln_f_b_ = nullptr;
  at::Tensor* lm_head_ = nullptr;
};

}  // namespace

std::unique_ptr<CausalLM> make_gpt2(const GPT2Config& config, uint64_t seed) {
  Init init;
  init.seed = seed;
  return std::make_unique<GPT2>(config, init);
}

std::unique_ptr<CausalLM> make_gpt2_uninitialized(const GPT2Config& config,
                                                  const at::TensorOptions& options) {
  Init init;
  init.random = false;
  init.options = options;
  return std::make_unique<GPT2>(config, init);
}

int64_t gpt2_parameter_count(const GPT2Config& config) {
  return parameter_count(gpt2_parameter_shapes(config));
}

}  // namespace zenflow::model
