// Llama-family decoder in plain ATen ops, equation for equation Hugging Face's
// LlamaForCausalLM (and Mistral / Qwen2, which differ only in config).
#include "worker/model/llama.h"

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

// HF LlamaRMSNorm: normalise in fp32, cast back to the input dtype, then scale.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  const auto input_dtype = x.scalar_type();
  at::Tensor h = x.to(at::kFloat);
  at::Tensor variance = h.pow(2).mean({-1}, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(input_dtype);
}

// HF rotate_half: cat(-x[..., d/2:], x[..., :d/2]).
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor* weight, const at::Tensor* bias) {
  return bias ? at::linear(x, *weight, *bias) : at::linear(x, *weight);
}

// How parameters are created: random (make_llama) or left uninitialized (loaders).
struct Init {
  bool random = true;
  uint64_t seed = 0;
  at::TensorOptions options = at::TensorOptions().dtype(at::kFloat);
};

class Llama final : public NamedParameterModel {
 public:
  Llama(const LlamaConfig& config, const Init& init) : config_(config) {
    check_llama_config(config_);
    head_dim_ = config_.resolved_head_dim();
    create_parameters(init);
  }

  at::Tensor forward(const at::Tensor& input_ids) override {
    if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong)
      throw std::invalid_argument("Llama::forward: input_ids must be a [B, T] int64 tensor, got " +
                                  std::to_string(input_ids.dim()) + "-D " +
                                  std::string(c10::toString(input_ids.scalar_type())));
    const int64_t T = input_ids.size(1);
    if (T > config_.max_position_embeddings)
      throw std::invalid_argument("Llama::forward: sequence length " + std::to_string(T) +
                                  " exceeds max_position_embeddings " +
                                  std::to_string(config_.max_position_embeddings));
    const double eps = config_.rms_norm_eps;

    at::Tensor x = run_unit(
        UnitKind::kEmbedding,
        [](const at::Tensor& ids, const std::vector<at::Tensor>& w) { return at::embedding(w[0], ids); },
        input_ids, {*embed_tokens_});  // [B, T, H]
    const auto rope = rotary(T, x.device(), x.scalar_type());
    const at::Tensor& cos = rope.first;  // [T, hd]
    const at::Tensor& sin = rope.second;

    for (const Layer& L : layers_)
      x = run_unit(
          UnitKind::kLayer,
          [this, cos, sin](const at::Tensor& in, const std::vector<at::Tensor>& w) {
            return decoder_layer(in, fields_.bound(w), cos, sin);
          },
          x, fields_.weights(L));
    const at::Tensor& head = config_.tie_word_embeddings ? *embed_tokens_ : *lm_head_;
    return run_unit(
        UnitKind::kHead,
        [eps](const at::Tensor& in, const std::vector<at::Tensor>& w) {
          return at::linear(rms_norm(in, w[0], eps), w[1]);  // [B, T, V]
        },
        x, {*norm_, head});
  }

  int64_t vocab_size() const override { return config_.vocab_size; }

 private:
  // Indices into params_ (pointers are resolved after params_ stops growing); a
  // bias is nullptr when the config has none.
  struct Layer {
    const at::Tensor* input_layernorm = nullptr;
    const at::Tensor *q_proj = nullptr, *q_bias = nullptr;
    const at::Tensor *k_proj = nullptr, *k_bias = nullptr;
    const at::Tensor *v_proj = nullptr, *v_bias = nullptr;
    const at::Tensor *o_proj = nullptr, *o_bias = nullptr;
    const at::Tensor* post_attention_layernorm = nullptr;
    const at::Tensor *gate_proj = nullptr, *gate_bias = nullptr;
    const at::Tensor *up_proj = nullptr, *up_bias = nullptr;
    const at::Tensor *down_proj = nullptr, *down_bias = nullptr;
  };

  // One decoder layer: x [B, T, H] -> [B, T, H].
  at::Tensor decoder_layer(at::Tensor x, const Layer& L, const at::Tensor& cos, const at::Tensor& sin) const {
    const int64_t B = x.size(0);
    const int64_t T = x.size(1);
    const int64_t nH = config_.num_attention_heads;
    const int64_t nKV = config_.num_key_value_heads;
    const int64_t hd = head_dim_;
    const double eps = config_.rms_norm_eps;
    const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
    at::Tensor h = rms_norm(x, *L.input_layernorm, eps);
    at::Tensor q = linear(h, L.q_proj, L.q_bias).view({B, T, nH, hd}).transpose(1, 2);
    at::Tensor k = linear(h, L.k_proj, L.k_bias).view({B, T, nKV, hd}).transpose(1, 2);
    at::Tensor v = linear(h, L.v_proj, L.v_bias).view({B, T, nKV, hd}).transpose(1, 2);
    q = q * cos + rotate_half(q) * sin;
    k = k * cos + rotate_half(k) * sin;
    if (nKV != nH) {  // HF repeat_kv: query head j reads kv head j / (nH / nKV)
      k = k.repeat_interleave(nH / nKV, /*dim=*/1);
      v = v.repeat_interleave(nH / nKV, /*dim=*/1);
    }
    at::Tensor attn = causal_attention(q, k, v, scale, config_.sliding_window);  // [B, nH, T, hd]
    attn = attn.transpose(1, 2).reshape({B, T, nH * hd});
    x = x + linear(attn, L.o_proj, L.o_bias);

    h = rms_norm(x, *L.post_attention_layernorm, eps);
    at::Tensor mlp = at::silu(linear(h, L.gate_proj, L.gate_bias)) * linear(h, L.up_proj, L.up_bias);
    x = x + linear(mlp, L.down_proj, L.down_bias);
    return x;
  }

  void create_parameters(const Init& init) {
    const int64_t V = config_.vocab_size;
    const int64_t H = config_.hidden_size;
    const int64_t I = config_.intermediate_size;
    const int64_t q_out = config_.num_attention_heads * head_dim_;
    const int64_t kv_out = config_.num_key_value_heads * head_dim_;
    at::Generator gen = at::detail::createCPUGenerator(init.seed);
    const double std_dev = config_.initializer_range;
    const at::TensorOptions opts = init.options;
    auto matrix = [&](int64_t rows, int64_t cols) {
      at::Tensor t = at::empty({rows, cols}, opts);
      if (init.random) t.normal_(0.0, std_dev, gen);
      return t.requires_grad_(true);
    };
    auto filled = [&](int64_t n, double value) {
      at::Tensor t = init.random ? at::full({n}, value, opts) : at::empty({n}, opts);
      return t.requires_grad_(true);
    };

    // Parameters are appended in parameters() order; slots remembers which field of
    // which layer each one fills.
    std::vector<std::pair<int64_t, const at::Tensor * Layer::*>> slots;
    auto add = [&](std::string name, at::Tensor t, int64_t layer, const at::Tensor* Layer::*field) {
      params_.emplace_back(std::move(name), std::move(t));
      slots.emplace_back(layer, field);
    };
    add("model.embed_tokens.weight", matrix(V, H), -1, nullptr);
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", filled(H, 1.0), l, &Layer::input_layernorm);
      add(p + "self_attn.q_proj.weight", matrix(q_out, H), l, &Layer::q_proj);
      if (config_.qkv_bias) add(p + "self_attn.q_proj.bias", filled(q_out, 0.0), l, &Layer::q_bias);
      add(p + "self_attn.k_proj.weight", matrix(kv_out, H), l, &Layer::k_proj);
      if (config_.qkv_bias) add(p + "self_attn.k_proj.bias", filled(kv_out, 0.0), l, &Layer::k_bias);
      add(p + "self_attn.v_proj.weight", matrix(kv_out, H), l, &Layer::v_proj);
      if (config_.qkv_bias) add(p + "self_attn.v_proj.bias", filled(kv_out, 0.0), l, &Layer::v_bias);
      add(p + "self_attn.o_proj.weight", matrix(H, q_out), l, &Layer::o_proj);
      if (config_.o_bias) add(p + "self_attn.o_proj.bias", filled(H, 0.0), l, &Layer::o_bias);
      add(p + "post_attention_layernorm.weight", filled(H, 1.0), l, &Layer::post_attention_layernorm);
      add(p + "mlp.gate_proj.weight", matrix(I, H), l, &Layer::gate_proj);
      if (config_.mlp_bias) add(p + "mlp.gate_proj.bias", filled(I, 0.0), l, &Layer::gate_bias);
      add(p + "mlp.up_proj.weight", matrix(I, H), l, &Layer::up_proj);
      if (config_.mlp_bias) add(p + "mlp.up_proj.bias", filled(I, 0.0), l, &Layer::up_bias);
      add(p + "mlp.down_proj.weight", matrix(H, I), l, &Layer::down_proj);
      if (config_.mlp_bias) add(p + "mlp.down_proj.bias", filled(H, 0.0), l, &Layer::down_bias);
    }
    add("model.norm.weight", filled(H, 1.0), -1, nullptr);
    if (!config_.tie_word_embeddings) add("lm_head.weight", matrix(V, H), -1, nullptr);

    layers_.assign(static_cast<size_t>(config_.num_hidden_layers), Layer{});
    for (size_t i = 0; i < params_.size(); ++i)
      if (slots[i].first >= 0)
        layers_[static_cast<size_t>(slots[i].first)].*(slots[i].second) = &params_[i].second;
    for (const auto& slot : slots)
      if (slot.first == 0) fields_.fields.push_back(slot.second);
    embed_tokens_ = &params_.front().second;
    lm_head_ = config_.tie_word_embeddings ? nullptr : &params_.back().second;
    norm_ = &params_[params_.size() - (config_.tie_word_embeddings ? 1 : 2)].second;
  }

  // HF LlamaRotaryEmbedding: angles t * inv_freq in fp32, emb = cat(freqs, freqs),
  // cos/sin cast to the activations' dtype. Cached per (T, device, dtype) because the
  // trainer calls forward with one shape again and again.
  std::pair<at::Tensor, at::Tensor> rotary(int64_t T, at::Device device, at::ScalarType dtype) {
    if (rope_cos_.defined() && rope_cos_.size(0) == T && rope_cos_.device() == device &&
        rope_cos_.scalar_type() == dtype)
      return {rope_cos_, rope_sin_};
    const at::Tensor inv_freq = llama_inv_freq(config_);
    at::Tensor t = at::arange(T, at::TensorOptions().dtype(at::kLong)).to(at::kFloat);
    at::Tensor freqs = at::outer(t, inv_freq);  // [T, hd/2]
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    rope_cos_ = emb.cos().to(device, dtype);
    rope_sin_ = emb.sin().to(device, dtype);
    return {rope_cos_, rope_sin_};
  }

  LlamaConfig config_;
  int64_t head_dim_ = 0;
  at::Tensor* embed_tokens_ = nullptr;
  std::vector<Layer> layers_;
  LayerFields<Layer> fields_;  // the weights a layer has (the same in every layer)
  at::Tensor* norm_ = nullptr;
  at::Tensor* lm_head_ = nullptr;
  at::Tensor rope_cos_, rope_sin_;
};

}  // namespace

at::Tensor llama_inv_freq(const LlamaConfig& config) {
  check_llama_config(config);
  const int64_t hd = config.resolved_head_dim();
  // _compute_default_rope_parameters: 1 / base^(arange(0, dim, 2).float() / dim).
  at::Tensor exponent =
      at::arange(0, hd, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) / static_cast<double>(hd);
  at::Tensor inv_freq = 1.0 / at::pow(config.rope_theta, exponent);
  const RopeScaling& r = config.rope_scaling;
  if (r.rope_type == "linear") return inv_freq / r.factor;
  if (r.rope_type != "llama3") return inv_freq;
  // _compute_llama3_parameters, step for step (fp32 tensors, Python-float scalars).
  const double old_context_len = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context_len / r.low_freq_factor;
  const double high_freq_wavelen = old_context_len / r.high_freq_factor;
  // Python's `scalar / tensor` is tensor.reciprocal() * scalar: mirrored for the same bits.
  const at::Tensor wavelen = inv_freq.reciprocal() * (2 * M_PI);
  at::Tensor inv_freq_llama = at::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  const at::Tensor smooth_factor =
      (wavelen.reciprocal() * old_context_len - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  const at::Tensor smoothed_inv_freq =
      (1 - smooth_factor) * inv_freq_llama / r.factor + smooth_factor * inv_freq_llama;
  const at::Tensor is_medium_freq =
      (wavelen < high_freq_wavelen).logical_not().logical_and((wavelen > low_freq_wavelen).logical_not());
  return at::where(is_medium_freq, smoothed_inv_freq, inv_freq_llama);
}

std::unique_ptr<CausalLM> make_llama(const LlamaConfig& config, uint64_t seed) {
  Init init;
  init.seed = seed;
  return std::make_unique<Llama>(config, init);
}

std::unique_ptr<CausalLM> make_llama_uninitialized(const LlamaConfig& config,
                                                   const at::TensorOptions& options) {
  Init init;
  init.random = false;
  init.options = options;
  return std::make_unique<Llama>(config, init);
}

int64_t llama_parameter_count(const LlamaConfig& config) {
  return parameter_count(llama_parameter_shapes(config));
}

}  // namespace zenflow::model
