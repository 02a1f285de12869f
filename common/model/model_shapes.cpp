// Parameter names and shapes of the Llama-family and GPT-2 decoders (see model_shapes.h).
#include "common/model/model_shapes.h"

#include <string>
#include <utility>
#include <vector>

namespace zenflow::model {

int64_t ParameterShape::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

std::vector<ParameterShape> llama_parameter_shapes(const LlamaConfig& config) {
  check_llama_config(config);
  const int64_t V = config.vocab_size;
  const int64_t H = config.hidden_size;
  const int64_t I = config.intermediate_size;
  const int64_t q_out = config.num_attention_heads * config.resolved_head_dim();
  const int64_t kv_out = config.num_key_value_heads * config.resolved_head_dim();
  std::vector<ParameterShape> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    out.push_back({std::move(name), std::move(shape)});
  };
  add("model.embed_tokens.weight", {V, H});
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {H});
    add(p + "self_attn.q_proj.weight", {q_out, H});
    if (config.qkv_bias) add(p + "self_attn.q_proj.bias", {q_out});
    add(p + "self_attn.k_proj.weight", {kv_out, H});
    if (config.qkv_bias) add(p + "self_attn.k_proj.bias", {kv_out});
    add(p + "self_attn.v_proj.weight", {kv_out, H});
    if (config.qkv_bias) add(p + "self_attn.v_proj.bias", {kv_out});
    add(p + "self_attn.o_proj.weight", {H, q_out});
    if (config.o_bias) add(p + "self_attn.o_proj.bias", {H});
    add(p + "post_attention_layernorm.weight", {H});
    add(p + "mlp.gate_proj.weight", {I, H});
    if (config.mlp_bias) add(p + "mlp.gate_proj.bias", {I});
    add(p + "mlp.up_proj.weight", {I, H});
    if (config.mlp_bias) add(p + "mlp.up_proj.bias", {I});
    add(p + "mlp.down_proj.weight", {H, I});
    if (config.mlp_bias) add(p + "mlp.down_proj.bias", {H});
  }
  add("model.norm.weight", {H});
  if (!config.tie_word_embeddings) add("lm_head.weight", {V, H});
  return out;
}

std::vector<ParameterShape> gpt2_parameter_shapes(const GPT2Config& config) {
  check_gpt2_config(config);
  const int64_t V = config.vocab_size;
  const int64_t E = config.n_embd;
  const int64_t I = config.inner_size();
  std::vector<ParameterShape> out;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    out.push_back({std::move(name), std::move(shape)});
  };
  add("transformer.wte.weight", {V, E});
  add("transformer.wpe.weight", {config.n_positions, E});
  for (int64_t l = 0; l < config.n_layer; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    add(p + "ln_1.weight", {E});
    add(p + "ln_1.bias", {E});
    add(p + "attn.c_attn.weight", {E, 3 * E});
    add(p + "attn.c_attn.bias", {3 * E});
    add(p + "attn.c_proj.weight", {E, E});
    add(p + "attn.c_proj.bias", {E});
    add(p + "ln_2.weight", {E});
    add(p + "ln_2.bias", {E});
    add(p + "mlp.c_fc.weight", {E, I});
    add(p + "mlp.c_fc.bias", {I});
    add(p + "mlp.c_proj.weight", {I, E});
    add(p + "mlp.c_proj.bias", {E});
  }
  add("transformer.ln_f.weight", {E});
  add("transformer.ln_f.bias", {E});
  if (!config.tie_word_embeddings) add("lm_head.weight", {V, E});
  return out;
}

std::vector<ParameterShape> hf_parameter_shapes(const nlohmann::json& config, const std::string& where) {
  if (hf_model_type(config, where) == "gpt2")
    return gpt2_parameter_shapes(gpt2_config_from_hf(config, where));
  return llama_parameter_shapes(llama_config_from_hf(config, where));
}

int64_t parameter_count(const std::vector<ParameterShape>& shapes) {
  int64_t n = 0;
  for (const ParameterShape& s : shapes) n += s.numel();
  return n;
}

}  // namespace zenflow::model
