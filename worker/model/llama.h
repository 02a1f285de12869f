// Llama-style decoder: RMSNorm, rotary embeddings, SwiGLU MLP, causal (grouped-query)
// attention. Parameter names and layouts follow Hugging Face's LlamaForCausalLM.
#pragma once

#include <cstdint>
#include <memory>

#include "worker/model/causal_lm.h"

namespace zenflow::model {

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
};

// Random init from `seed` (normal(0, initializer_range) for matrices, ones for norms),
// on the CPU in fp32. Deterministic for a given config and seed (and LibTorch's CPU
// generator). parameters() order: embed_tokens, then per layer input_layernorm, q, k, v,
// o, post_attention_layernorm, gate, up, down; model.norm; lm_head unless
// tie_word_embeddings (then the embedding doubles as the output head and is listed once).
// Attention uses matmul + fp32 masked softmax on LibTorch 1.x and the fused
// scaled_dot_product_attention (is_causal) on 2.x. Throws std::invalid_argument for an
// inconsistent config (e.g. heads not dividing hidden_size).
// forward() is not thread-safe (it caches rotary tables); call it from one thread.
std::unique_ptr<CausalLM> make_llama(const LlamaConfig& config, uint64_t seed);

// Number of scalars in parameters() for `config` (what make_llama would allocate).
int64_t llama_parameter_count(const LlamaConfig& config);

}  // namespace zenflow::model
