// Every parameter of a model config as (name, shape), without LibTorch: what the CLI
// counts to size a job for placement, and what worker/model's parameter counts sum.
//
// The lists are exactly make_hf_architecture(config, options)->parameters()
// (worker/model/hf_model.h): the same names, shapes and order (tests/test_model_shapes.cpp
// pins it against the meta-device models). Pure functions, safe from any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model/hf_config.h"

namespace zenflow::model {

struct ParameterShape {
  std::string name;            // Hugging Face tensor name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // e.g. {4096, 4096}

  int64_t numel() const;
};

// Llama order: model.embed_tokens.weight, then per layer input_layernorm, q (+bias),
// k (+bias), v (+bias), o (+bias), post_attention_layernorm, gate (+bias), up (+bias),
// down (+bias); model.norm.weight; lm_head.weight unless tie_word_embeddings.
// GPT-2 order: transformer.wte, transformer.wpe, per layer ln_1, attn.c_attn,
// attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj (weight then bias, Conv1D weights [in, out]),
// transformer.ln_f; lm_head.weight unless tie_word_embeddings.
// Throw std::invalid_argument like check_llama_config / check_gpt2_config.
std::vector<ParameterShape> llama_parameter_shapes(const LlamaConfig& config);
std::vector<ParameterShape> gpt2_parameter_shapes(const GPT2Config& config);

// The parameters of the architecture a config.json describes (llama, mistral, qwen2 or
// gpt2). Throws std::runtime_error("<where>: ...") as the parsers of hf_config.h.
std::vector<ParameterShape> hf_parameter_shapes(const nlohmann::json& config,
                                                const std::string& where = "config.json");

// The sum of numel() over `shapes`.
int64_t parameter_count(const std::vector<ParameterShape>& shapes);

}  // namespace zenflow::model
