// Hugging Face config.json <-> the model configs of the decoders zenflow builds, without
// LibTorch: the one parser and validator of model configs (worker/model builds tensors
// from these structs; the CLI counts parameters from them, common/model/model_shapes.h).
//
// Supported model_type values (or, without one, architectures[0]): llama
// (LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM) — all
// LlamaConfig — and gpt2 (GPT2LMHeadModel, GPT2Config). Every function is pure (or reads
// one file) and safe to call from any thread.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

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

// Throw std::invalid_argument("LlamaConfig: ..." / "GPT2Config: ...") for an
// inconsistent config (a size <= 0, heads not dividing hidden_size, an odd head
// dimension, an unknown rope_type or activation, ...); return normally otherwise.
void check_llama_config(const LlamaConfig& config);
void check_gpt2_config(const GPT2Config& config);

// config.json objects -> model configs. The parsers apply the defaults of the
// corresponding transformers config class for absent (or null) keys and throw
// std::runtime_error("<where>: ...") naming the key for wrong types, missing required
// keys (vocab_size, hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads; GPT-2: vocab_size), unsupported settings (hidden_act other than
// silu, rope types other than default/linear/llama3, qwen2 use_sliding_window), configs
// check_*_config refuses, and unknown model types. Accept both rope_theta/rope_scaling
// and transformers 5's rope_parameters. `where` names the file in messages.
std::string hf_model_type(const nlohmann::json& config,
                          const std::string& where = "config.json");  // llama|mistral|qwen2|gpt2
LlamaConfig llama_config_from_hf(const nlohmann::json& config, const std::string& where = "config.json");
GPT2Config gpt2_config_from_hf(const nlohmann::json& config, const std::string& where = "config.json");

// Model configs -> config.json objects (what an exported model directory holds).
// model_type: llama | mistral | qwen2 (written as given; qkv_bias must match qwen2).
// Throw std::invalid_argument for an inconsistent config or model_type.
nlohmann::json hf_config_json(const LlamaConfig& config, const std::string& model_type = "llama");
nlohmann::json hf_config_json(const GPT2Config& config);

// DIR/config.json, parsed. Throws InputError (common/input_file.h) when it is missing,
// not a regular file or too large, and std::runtime_error("DIR/config.json: ...") when it
// is not a JSON object.
nlohmann::json read_hf_config(const std::string& dir);

}  // namespace zenflow::model
