// GPT-2 decoder: learned positions, pre-LayerNorm blocks, GELU MLP, fused qkv c_attn.
// Names and layouts follow Hugging Face's GPT2LMHeadModel, including Conv1D weights
// stored [in, out] (y = x W + b).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/model/hf_config.h"  // GPT2Config
#include "worker/model/causal_lm.h"

namespace zenflow::model {

// Random init from `seed` as HF's GPT2PreTrainedModel._init_weights: normal(0,
// initializer_range) for wte, wpe, c_attn and c_fc weights; normal(0, initializer_range /
// sqrt(2 * n_layer)) for both c_proj weights; zeros for biases; LayerNorm weight 1 and
// bias 0. On the CPU in fp32; deterministic for a config and seed.
// parameters() order: transformer.wte.weight, transformer.wpe.weight, then per layer
// transformer.h.{i}.ln_1.{weight,bias}, attn.c_attn.{weight [E, 3E], bias}, attn.c_proj.
// {weight [E, E], bias}, ln_2.{weight,bias}, mlp.c_fc.{weight [E, I], bias},
// mlp.c_proj.{weight [I, E], bias}; transformer.ln_f.{weight,bias}; lm_head.weight [V, E]
// only when tie_word_embeddings is false (otherwise wte is the output head).
// gpt2_parameter_shapes (common/model/model_shapes.h) lists the same without LibTorch;
// tests/test_model_shapes.cpp keeps the two equal.
// No dropout (fine-tuning runs with it off). Throws std::invalid_argument for an
// inconsistent config or an unsupported activation. forward() is not thread-safe.
std::unique_ptr<CausalLM> make_gpt2(const GPT2Config& config, uint64_t seed);

// The same model with uninitialized parameters (at::empty) of `options`, for loaders
// that overwrite every parameter (the meta device gives names and shapes only).
std::unique_ptr<CausalLM> make_gpt2_uninitialized(const GPT2Config& config, const at::TensorOptions& options);

// Number of scalars in parameters() for `config`: the sum over gpt2_parameter_shapes.
int64_t gpt2_parameter_count(const GPT2Config& config);

}  // namespace zenflow::model
