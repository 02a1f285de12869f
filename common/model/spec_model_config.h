// A job spec's model section as a Hugging Face config.json object, without LibTorch: the
// config describe_model_from_spec (worker/rank/model_factory.h) returns, so the CLI can size a
// job (common/model/model_shapes.h) without building the model.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>

#include "common/job_spec.h"
#include "common/model/hf_config.h"

namespace zenflow::model {

// The configs of a random-init model (model.from empty) with model.config's keys:
//   llama: the HF LlamaConfig keys of ModelSpec (hidden_size, ..., tie_word_embeddings);
//          num_key_value_heads defaults to num_attention_heads when that is given;
//   gpt2:  hidden_size -> n_embd, num_hidden_layers -> n_layer, num_attention_heads ->
//          n_head, intermediate_size -> n_inner, max_position_embeddings -> n_positions,
//          vocab_size, initializer_range, tie_word_embeddings.
// vocab_size defaults to `tokenizer_vocab` and may not be smaller. Throw
// std::invalid_argument("model.config.<key>: ...") for a key the arch does not have or
// a vocab_size below the tokenizer's; the config itself is not checked here.
// worker/rank/model_factory.cpp builds its random-init models from these.
LlamaConfig llama_config_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab);
GPT2Config gpt2_config_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab);

// The config.json of the model `spec` describes, as describe_model_from_spec(spec,
// tokenizer_vocab).config: model.from's DIR/config.json as read (model.config must be
// empty; model.arch, when the spec wrote it, must match the directory's; vocab_size
// must be >= tokenizer_vocab), or hf_config_json of the random-init config of
// model.arch. Unlike describe_model_from_spec it reads no safetensors header: a
// directory whose weights are missing or misshapen still gets its config here.
// Throws std::invalid_argument("model.<key>: ...") for spec problems, InputError or
// std::runtime_error naming DIR/config.json for file problems.
nlohmann::json hf_config_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab);

}  // namespace zenflow::model
