// GPT-2 decoder: learned positions, pre-LayerNorm blocks, GELU MLP, fused qkv c_attn.
// Names and layouts follow Hugging Face's GPT2LMHeadModel, including Conv1D weights
// stored [in, out] (y = x W + b).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "worker/model/causal_lm.h"

namespace zenflow::model {

struct GPT2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;  // 0: 4 * n_embd
  double layer_norm_epsilon = 1e-5;
  // gelu_new / gelu_pytorch_tanh (tanh approximation), gelu (erf), relu, silu / swish.
  std::string activation_function = "gelu_new";
  double initializer_range = 0.02;
  bool tie_word_embeddings = true;
  bool scale_attn_weights = true;                // scores / sqrt(head_dim)
  bool scale_attn_by_inverse_layer_idx = false;  // and / (layer index + 1)

  int64_t inner_size() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
};

// Random init from `seed` as HF's GPT2PreTrainedModel._init_weights: normal(0,
// initializer_range) for wte, wpe, c_attn and c_fc weights; normal(0, initializer_range /
// sqrt(2 * n_layer)) for both c_proj weights; zeros for biases; LayerNorm weight 1 and
// bias 0. On the CPU in fp32; deterministic for a config and seed.
// parameters() order: transformer.wte.weight, transformer.wpe.weight, then per layer
// transformer.h.{i}.ln_1.{weight,bias}, attn.c_attn.{weight [E, 3E], bias}, attn.c_proj.
// {weight [E, E], bias}, ln_2.{weight,bias}, mlp.c_fc.{weight [E, I], bias},
// mlp.c_proj.{weight [I, E], bias}; transformer.ln_f.{weight,bias}; lm_head.weight [V, E]
// only when tie_word_embeddings is false (otherwise wte is the output head).
// No dropout (fine-tuning runs with it off). Throws std::invalid_argument for an
// inconsistent config or an unsupported activation. forward() is not thread-safe.
std::unique_ptr<CausalLM> make_gpt2(const GPT2Config& config, uint64_t seed);

// The same model with uninitialized parameters (at::empty) of `options`, for loaders
// that overwrite every parameter (the meta device gives names and shapes only).
std::unique_ptr<CausalLM> make_gpt2_uninitialized(const GPT2Config& config, const at::TensorOptions& options);

// Number of scalars in parameters() for `config`.
int64_t gpt2_parameter_count(const GPT2Config& config);

}  // namespace zenflow::model
