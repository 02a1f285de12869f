// Llama-family decoder (Llama 2/3, Mistral, Qwen2): RMSNorm, rotary embeddings, SwiGLU
// MLP, causal (grouped-query) attention. Names and layouts follow Hugging Face's
// LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/model/hf_config.h"  // LlamaConfig
#include "worker/model/causal_lm.h"

namespace zenflow::model {

// Random init from `seed` (normal(0, initializer_range) for matrices, ones for norms,
// zeros for biases), on the CPU in fp32. Deterministic for a given config and seed (and
// LibTorch's CPU generator). parameters() order: embed_tokens, then per layer
// input_layernorm, q (+bias), k (+bias), v (+bias), o (+bias), post_attention_layernorm,
// gate (+bias), up (+bias), down (+bias); model.norm; lm_head unless tie_word_embeddings
// (then the embedding doubles as the output head and is listed once).
// llama_parameter_shapes (common/model/model_shapes.h) lists the same names and shapes
// without LibTorch for the CLI; tests/test_model_shapes.cpp keeps the two equal.
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

// Number of scalars in parameters() for `config` (what make_llama would allocate):
// the sum over llama_parameter_shapes (common/model/model_shapes.h).
int64_t llama_parameter_count(const LlamaConfig& config);

// Rotary inverse frequencies [head_dim / 2] (fp32, CPU) for `config`, rope scaling
// applied, computed as HF's rope init functions do (in fp32).
at::Tensor llama_inv_freq(const LlamaConfig& config);

}  // namespace zenflow::model
