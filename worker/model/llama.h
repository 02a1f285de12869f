// Llama-family decoder (Llama 2/3, Mistral, Qwen2): RMSNorm, rotary embeddings, SwiGLU
// MLP, causal (grouped-query) attention. Names and layouts follow Hugging Face's
// LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "worker/model/causal_lm.h"

namespace zenflow::model {

// HF's rope_scaling. "default" (no scaling), "linear" (inv_freq / factor) and "llama3"
// (_compute_llama3_parameters: low frequencies divided by factor, high ones kept, a
// smooth blend between the wavelengths original_max_position_embeddings /
// low_freq_factor and original_max_position_embeddings / high_freq_factor).
struct RopeScaling {
  std::string rope_type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 128;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 4;
  int64_t intermediate_size = 344;
  int64_t max_position_embeddings = 1024;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  double initializer_range = 0.02;
  // 0: hidden_size / num_attention_heads. Otherwise q_proj is [heads * head_dim, hidden]
  // and o_proj [hidden, heads * head_dim] (Mistral-Nemo, Llama 3.2 style configs).
  int64_t head_dim = 0;
  RopeScaling rope_scaling;
  // Biases on q/k/v_proj (Qwen2, or Llama's attention_bias), on o_proj (Llama's
  // attention_bias only) and on gate/up/down_proj (Llama's mlp_bias). Zero at init.
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  // > 0: query i attends only keys j with i - sliding_window < j <= i (Mistral's
  // sliding_window, as in current transformers' sliding-window mask). 0: full causal.
  int64_t sliding_window = 0;

  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

// Random init from `seed` (normal(0, initializer_range) for matrices, ones for norms,
// zeros for biases), on the CPU in fp32. Deterministic for a given config and seed (and
// LibTorch's CPU generator). parameters() order: embed_tokens, then per layer
// input_layernorm, q (+bias), k (+bias), v (+bias), o (+bias), post_attention_layernorm,
// gate (+bias), up (+bias), down (+bias); model.norm; lm_head unless tie_word_embeddings
// (then the embedding doubles as the output head and is listed once).
// Attention uses matmul + fp32 masked softmax on LibTorch 1.x and the fused
// scaled_dot_product_attention on 2.x. Throws std::invalid_argument for an
// inconsistent config (e.g. heads not dividing hidden_size, an odd head dimension, an
// unknown rope_type).
// forward() is not thread-safe (it caches rotary tables); call it from one thread.
std::unique_ptr<CausalLM> make_llama(const LlamaConfig& config, uint64_t seed);

// The same model with uninitialized parameters (at::empty) of `options` (dtype, device;
// the meta device gives names and shapes without memory), for loaders that overwrite
// every parameter. Parameters require grad.
std::unique_ptr<CausalLM> make_llama_uninitialized(const LlamaConfig& config,
                                                   const at::TensorOptions& options);

// Number of scalars in parameters() for `config` (what make_llama would allocate).
int64_t llama_parameter_count(const LlamaConfig& config);

// Rotary inverse frequencies [head_dim / 2] (fp32, CPU) for `config`, rope scaling
// applied, computed as HF's rope init functions do (in fp32).
at::Tensor llama_inv_freq(const LlamaConfig& config);

}  // namespace zenflow::model
