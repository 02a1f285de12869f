// Llama decoder in plain ATen ops, equation for equation Hugging Face's LlamaForCausalLM.
#include "worker/model/llama.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::model {
namespace {

void check_config(const LlamaConfig& c) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("LlamaConfig: " + what); };
  auto positive = [&](const char* name, int64_t v) {
    if (v <= 0) fail(std::string(name) + " must be > 0, got " + std::to_string(v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("num_key_value_heads", c.num_key_value_heads);
  positive("intermediate_size", c.intermediate_size);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (c.hidden_size % c.num_attention_heads != 0)
    fail("hidden_size (" + std::to_string(c.hidden_size) +
         ") must be divisible by num_attention_heads (" + std::to_string(c.num_attention_heads) +
         ")");
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    fail("num_attention_heads (" + std::to_string(c.num_attention_heads) +
         ") must be divisible by num_key_value_heads (" + std::to_string(c.num_key_value_heads) +
         ")");
  if ((c.hidden_size / c.num_attention_heads) % 2 != 0)
    fail(
        "head dimension hidden_size / num_attention_heads must be even for rotary "
        "embeddings, got " +
        std::to_string(c.hidden_size / c.num_attention_heads));
  if (!(c.rope_theta > 0)) fail("rope_theta must be > 0");
  if (!(c.rms_norm_eps > 0)) fail("rms_norm_eps must be > 0");
  if (!(c.initializer_range >= 0)) fail("initializer_range must be >= 0");
}

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

class Llama final : public CausalLM {
 public:
  Llama(const LlamaConfig& config, uint64_t seed) : config_(config) {
    check_config(config_);
    head_dim_ = config_.hidden_size / config_.num_attention_heads;
    init(seed);
  }

  at::Tensor forward(const at::Tensor& input_ids) override {
    if (input_ids.dim() != 2 || input_ids.scalar_type() != at::kLong)
      throw std::invalid_argument("Llama::forward: input_ids must be a [B, T] int64 tensor, got " +
                                  std::to_string(input_ids.dim()) + "-D " +
                                  std::string(c10::toString(input_ids.scalar_type())));
    const int64_t B = input_ids.size(0);
    const int64_t T = input_ids.size(1);
    if (T > config_.max_position_embeddings)
      throw std::invalid_argument("Llama::forward: sequence length " + std::to_string(T) +
                                  " exceeds max_position_embeddings " +
                                  std::to_string(config_.max_position_embeddings));
    const int64_t nH = config_.num_attention_heads;
    const int64_t nKV = config_.num_key_value_heads;
    const int64_t hd = head_dim_;
    const double eps = config_.rms_norm_eps;

    at::Tensor x = at::embedding(*embed_tokens_, input_ids);  // [B, T, H]
    const auto rope = rotary(T, x.device(), x.scalar_type());
    const at::Tensor& cos = rope.first;  // [T, hd]
    const at::Tensor& sin = rope.second;

    for (const Layer& L : layers_) {
      at::Tensor h = rms_norm(x, *L.input_layernorm, eps);
      at::Tensor q = at::linear(h, *L.q_proj).view({B, T, nH, hd}).transpose(1, 2);
      at::Tensor k = at::linear(h, *L.k_proj).view({B, T, nKV, hd}).transpose(1, 2);
      at::Tensor v = at::linear(h, *L.v_proj).view({B, T, nKV, hd}).transpose(1, 2);
      q = q * cos + rotate_half(q) * sin;
      k = k * cos + rotate_half(k) * sin;
      if (nKV != nH) {  // HF repeat_kv: query head j reads kv head j / (nH / nKV)
        k = k.repeat_interleave(nH / nKV, /*dim=*/1);
        v = v.repeat_interleave(nH / nKV, /*dim=*/1);
      }
      at::Tensor attn = attention(q, k, v);  // [B, nH, T, hd]
      attn = attn.transpose(1, 2).reshape({B, T, nH * hd});
      x = x + at::linear(attn, *L.o_proj);

      h = rms_norm(x, *L.post_attention_layernorm, eps);
      at::Tensor mlp = at::silu(at::linear(h, *L.gate_proj)) * at::linear(h, *L.up_proj);
      x = x + at::linear(mlp, *L.down_proj);
    }
    x = rms_norm(x, *norm_, eps);
    const at::Tensor& head = config_.tie_word_embeddings ? *embed_tokens_ : *lm_head_;
    return at::linear(x, head);  // [B, T, V]
  }

  std::vector<NamedTensor> parameters() override {
    std::vector<NamedTensor> out;
    out.reserve(params_.size());
    for (const auto& p : params_) out.push_back({p.first, p.second});
    return out;
  }

  int64_t vocab_size() const override { return config_.vocab_size; }

  void to(at::Device device, at::ScalarType dtype) override {
    for (auto& p : params_) {
      if (p.second.device() == device && p.second.scalar_type() == dtype) continue;
      p.second = p.second.detach().to(device, dtype).requires_grad_(true);
    }
  }

  void train(bool on) override { training_ = on; }  // no dropout: nothing changes

 private:
  // Pointers into params_; params_ never grows after init, so they stay valid.
  struct Layer {
    at::Tensor* input_layernorm;
    at::Tensor* q_proj;
    at::Tensor* k_proj;
    at::Tensor* v_proj;
    at::Tensor* o_proj;
    at::Tensor* post_attention_layernorm;
    at::Tensor* gate_proj;
    at::Tensor* up_proj;
    at::Tensor* down_proj;
  };

  void init(uint64_t seed) {
    const int64_t V = config_.vocab_size;
    const int64_t H = config_.hidden_size;
    const int64_t I = config_.intermediate_size;
    const int64_t q_out = config_.num_attention_heads * head_dim_;
    const int64_t kv_out = config_.num_key_value_heads * head_dim_;
    at::Generator gen = at::detail::createCPUGenerator(seed);
    const double std_dev = config_.initializer_range;
    auto matrix = [&](int64_t rows, int64_t cols) {
      at::Tensor t = at::empty({rows, cols}, at::TensorOptions().dtype(at::kFloat));
      t.normal_(0.0, std_dev, gen);
      return t.requires_grad_(true);
    };
    auto ones = [](int64_t n) {
      return at::ones({n}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
    };

    const size_t count = 1 + 9 * static_cast<size_t>(config_.num_hidden_layers) + 1 +
                         (config_.tie_word_embeddings ? 0 : 1);
    params_.reserve(count);
    params_.emplace_back("model.embed_tokens.weight", matrix(V, H));
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      params_.emplace_back(p + "input_layernorm.weight", ones(H));
      params_.emplace_back(p + "self_attn.q_proj.weight", matrix(q_out, H));
      params_.emplace_back(p + "self_attn.k_proj.weight", matrix(kv_out, H));
      params_.emplace_back(p + "self_attn.v_proj.weight", matrix(kv_out, H));
      params_.emplace_back(p + "self_attn.o_proj.weight", matrix(H, q_out));
      params_.emplace_back(p + "post_attention_layernorm.weight", ones(H));
      params_.emplace_back(p + "mlp.gate_proj.weight", matrix(I, H));
      params_.emplace_back(p + "mlp.up_proj.weight", matrix(I, H));
      params_.emplace_back(p + "mlp.down_proj.weight", matrix(H, I));
    }
    params_.emplace_back("model.norm.weight", ones(H));
    if (!config_.tie_word_embeddings) params_.emplace_back("lm_head.weight", matrix(V, H));
    if (params_.size() != count) throw std::logic_error("Llama: parameter count mismatch");

    embed_tokens_ = &params_[0].second;
    for (int64_t l = 0; l < config_.num_hidden_layers; ++l) {
      const size_t b = 1 + 9 * static_cast<size_t>(l);
      layers_.push_back(Layer{&params_[b].second, &params_[b + 1].second, &params_[b + 2].second,
                              &params_[b + 3].second, &params_[b + 4].second,
                              &params_[b + 5].second, &params_[b + 6].second,
                              &params_[b + 7].second, &params_[b + 8].second});
    }
    const size_t after_layers = 1 + 9 * static_cast<size_t>(config_.num_hidden_layers);
    norm_ = &params_[after_layers].second;
    lm_head_ = config_.tie_word_embeddings ? nullptr : &params_[after_layers + 1].second;
  }

  // HF LlamaRotaryEmbedding: inv_freq = 1 / theta^(2i/hd) and angles in fp32,
  // emb = cat(freqs, freqs), cos/sin cast to the activations' dtype. Cached per (T,
  // device, dtype) because the trainer calls forward with one shape again and again.
  std::pair<at::Tensor, at::Tensor> rotary(int64_t T, at::Device device, at::ScalarType dtype) {
    if (rope_cos_.defined() && rope_cos_.size(0) == T && rope_cos_.device() == device &&
        rope_cos_.scalar_type() == dtype)
      return {rope_cos_, rope_sin_};
    at::Tensor exponent =
        at::arange(0, head_dim_, 2, at::TensorOptions().dtype(at::kLong)).to(at::kFloat) /
        static_cast<double>(head_dim_);
    at::Tensor inv_freq = 1.0 / at::pow(config_.rope_theta, exponent);
    at::Tensor t = at::arange(T, at::TensorOptions().dtype(at::kLong)).to(at::kFloat);
    at::Tensor freqs = at::outer(t, inv_freq);  // [T, hd/2]
    at::Tensor emb = at::cat({freqs, freqs}, -1);
    rope_cos_ = emb.cos().to(device, dtype);
    rope_sin_ = emb.sin().to(device, dtype);
    return {rope_cos_, rope_sin_};
  }

  // Causal softmax attention with scale 1/sqrt(hd); q, k, v are [B, nH, T, hd].
  at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
    // Fused kernels (flash / memory-efficient on CUDA); the same equation.
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true);
#else
    const int64_t T = q.size(2);
    const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
    // Softmax in fp32 as HF does, then back to the activations' dtype.
    at::Tensor scores = (at::matmul(q, k.transpose(-2, -1)) * scale).to(at::kFloat);
    if (!causal_mask_.defined() || causal_mask_.size(0) != T || causal_mask_.device() != q.device())
      causal_mask_ =
          at::ones({T, T}, at::TensorOptions().dtype(at::kBool).device(q.device())).triu(1);
    scores = scores.masked_fill(causal_mask_, -std::numeric_limits<float>::infinity());
    at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
    return at::matmul(probs, v);
#endif
  }

  LlamaConfig config_;
  int64_t head_dim_ = 0;
  bool training_ = true;
  std::vector<std::pair<std::string, at::Tensor>> params_;
  at::Tensor* embed_tokens_ = nullptr;
  std::vector<Layer> layers_;
  at::Tensor* norm_ = nullptr;
  at::Tensor* lm_head_ = nullptr;
  at::Tensor rope_cos_, rope_sin_;
  at::Tensor causal_mask_;
};

}  // namespace

std::unique_ptr<CausalLM> make_llama(const LlamaConfig& config, uint64_t seed) {
  return std::make_unique<Llama>(config, seed);
}

int64_t llama_parameter_count(const LlamaConfig& config) {
  check_config(config);
  const int64_t V = config.vocab_size;
  const int64_t H = config.hidden_size;
  const int64_t I = config.intermediate_size;
  const int64_t hd = H / config.num_attention_heads;
  const int64_t q_out = config.num_attention_heads * hd;
  const int64_t kv_out = config.num_key_value_heads * hd;
  const int64_t per_layer = 2 * H                         // two RMSNorm weights
                            + q_out * H + 2 * kv_out * H  // q, k, v
                            + H * q_out                   // o
                            + 3 * I * H;                  // gate, up, down
  return V * H + config.num_hidden_layers * per_layer + H +
         (config.tie_word_embeddings ? 0 : V * H);
}

}  // namespace zenflow::model
