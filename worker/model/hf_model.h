// Hugging Face model directories: config.json + safetensors in, the same out.
//
// Supported model_type values (or, without one, architectures[0]): llama
// (LlamaForCausalLM), mistral (MistralForCausalLM), qwen2 (Qwen2ForCausalLM) — all built
// by make_llama — and gpt2 (GPT2LMHeadModel, make_gpt2). Weights come from
// DIR/model.safetensors, or the shards of DIR/model.safetensors.index.json, read through
// the memory-mapped SafetensorsFile: each tensor is copied once, from the mapping
// straight into its parameter (converting dtype and device on the way), and its pages
// are dropped from the mapping right after, so the whole file is never resident twice.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/model/hf_config.h"
#include "worker/model/causal_lm.h"
#include "worker/model/gpt2.h"
#include "worker/model/llama.h"

namespace zenflow::model {

struct LoadedModel {
  std::unique_ptr<CausalLM> model;  // null from describe-only calls
  nlohmann::json config;            // config.json as read (or generated for random init)
  std::string arch;                 // "llama" (also for mistral, qwen2) or "gpt2"
  std::string model_type;           // llama | mistral | qwen2 | gpt2
  // The dtype the weights were stored in (of the embedding; kFloat for random init).
  at::ScalarType checkpoint_dtype = at::kFloat;
  std::string source_dir;  // the model directory; empty for random init
};

struct HfLoadOptions {
  at::Device device = at::kCPU;
  // Parameter dtype; Undefined keeps the checkpoint's (checkpoint_dtype).
  at::ScalarType dtype = at::ScalarType::Undefined;
};

// Loads a model directory. Before anything is allocated, checks that config.json is
// valid JSON describing a supported architecture and that every parameter the
// architecture expects exists with the expected shape and a floating dtype (F32, BF16,
// F16, F64), and that no other tensor is present except known buffers (rotary
// inv_freq; GPT-2's attn.bias / attn.masked_bias; lm_head.weight of a tied model).
// GPT-2 checkpoints may name tensors with or without the "transformer." prefix.
// Throws std::runtime_error naming the file and the first problem, e.g.
//   "DIR/model.safetensors: tensor 'model.layers.0.self_attn.k_proj.weight' has shape
//    [32, 64], expected [16, 64]"
// (a truncated or corrupt safetensors file is reported by SafetensorsFile the same way).
// The returned parameters require grad.
LoadedModel load_hf_model(const std::string& dir, const HfLoadOptions& options = {});

// Reads and checks DIR/config.json and the safetensors headers (dtype), without
// loading any weight: `model` is null. Throws like load_hf_model.
LoadedModel describe_hf_model(const std::string& dir);

// config.json <-> LlamaConfig / GPT2Config: hf_model_type, llama_config_from_hf,
// gpt2_config_from_hf, hf_config_json (common/model/hf_config.h, no LibTorch).

// The architecture a config.json describes, parameters uninitialized (at::empty) with
// `options`; `arch` receives "llama" or "gpt2" when not null.
std::unique_ptr<CausalLM> make_hf_architecture(const nlohmann::json& config, const at::TensorOptions& options,
                                               std::string* arch = nullptr);

// Writes a Hugging Face model directory `out_dir`:
//   config.json        `config` with torch_dtype set to `dtype`
//   model.safetensors  `tensors` (HF names) converted to `dtype`, metadata {"format": "pt"}
//   tokenizer files    tokenizer.json, tokenizer_config.json, special_tokens_map.json,
//                      vocab.json, merges.txt, tokenizer.model, added_tokens.json and
//                      generation_config.json, each copied when present in
//                      `tokenizer_source` (a directory, or a tokenizer.json path whose
//                      directory is searched and which is copied as tokenizer.json);
//                      empty: none.
// `tensors` must be exactly the parameters of the architecture `config` describes
// (names and shapes; checked first, error naming the tensor). dtype: kFloat, kBFloat16
// or kHalf. Atomic: everything is written and fsync'd in a sibling temporary directory
// that is then renamed to out_dir. out_dir must not exist or be an empty directory.
// Throws std::runtime_error naming the path on any problem (nothing is left behind).
void export_hf_model(const std::vector<NamedTensor>& tensors, const nlohmann::json& config,
                     const std::string& out_dir, at::ScalarType dtype, const std::string& tokenizer_source);

// The same for a model's current parameters.
void export_hf_model(CausalLM& model, const nlohmann::json& config, const std::string& out_dir,
                     at::ScalarType dtype, const std::string& tokenizer_source);

// "float32" | "bfloat16" | "float16" <-> ScalarType; throws std::invalid_argument.
at::ScalarType hf_dtype_from_name(const std::string& name);
std::string hf_dtype_name(at::ScalarType dtype);

}  // namespace zenflow::model
