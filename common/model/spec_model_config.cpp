// Job spec model section -> config.json (see spec_model_config.h).
#include "common/model/spec_model_config.h"

#include <filesystem>
#include <stdexcept>
#include <string>

namespace zenflow::model {
namespace {

int64_t vocab_for(const ModelSpec& m, int64_t tokenizer_vocab) {
  const auto it = m.config.find("vocab_size");
  if (it == m.config.end()) return tokenizer_vocab;
  const auto v = static_cast<int64_t>(it->second);
  if (v < tokenizer_vocab)
    throw std::invalid_argument("model.config.vocab_size: " + std::to_string(v) +
                                " is smaller than the tokenizer's " + std::to_string(tokenizer_vocab));
  return v;
}

// Config errors of the model checks, renamed after the spec section.
template <typename F>
auto as_spec_error(F&& make) -> decltype(make()) {
  try {
    return make();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.rfind("model.", 0) == 0) throw;
    throw std::invalid_argument("model.config: " + what);
  }
}

nlohmann::json config_of_directory(const ModelSpec& spec, int64_t tokenizer_vocab) {
  if (!spec.config.empty())
    throw std::invalid_argument("model.config: cannot be combined with model.from (" + spec.from +
                                "/config.json decides the model's shape)");
  nlohmann::json config = read_hf_config(spec.from);
  const std::string where = (std::filesystem::path(spec.from) / "config.json").string();
  const std::string type = hf_model_type(config, where);
  const std::string arch = type == "gpt2" ? "gpt2" : "llama";
  if (spec.arch_given && spec.arch != arch)
    throw std::invalid_argument("model.arch: '" + spec.arch + "' contradicts model.from (" + spec.from +
                                "/config.json is a " + type + " model); remove model.arch or change it");
  const int64_t vocab = arch == "gpt2" ? gpt2_config_from_hf(config, where).vocab_size
                                       : llama_config_from_hf(config, where).vocab_size;
  if (vocab < tokenizer_vocab)
    throw std::invalid_argument("model.from: " + spec.from + " has vocab_size " + std::to_string(vocab) +
                                ", smaller than the tokenizer's " + std::to_string(tokenizer_vocab));
  return config;
}

}  // namespace

LlamaConfig llama_config_from_spec(const ModelSpec& m, int64_t tokenizer_vocab) {
  LlamaConfig c;
  c.vocab_size = vocab_for(m, tokenizer_vocab);
  for (const auto& [key, value] : m.config) {
    const auto i = static_cast<int64_t>(value);
    if (key == "hidden_size")
      c.hidden_size = i;
    else if (key == "num_hidden_layers")
      c.num_hidden_layers = i;
    else if (key == "num_attention_heads")
      c.num_attention_heads = i;
    else if (key == "num_key_value_heads")
      c.num_key_value_heads = i;
    else if (key == "intermediate_size")
      c.intermediate_size = i;
    else if (key == "max_position_embeddings")
      c.max_position_embeddings = i;
    else if (key == "rope_theta")
      c.rope_theta = value;
    else if (key == "rms_norm_eps")
      c.rms_norm_eps = value;
    else if (key == "tie_word_embeddings")
      c.tie_word_embeddings = value != 0;
    else if (key == "initializer_range")
      c.initializer_range = value;
    else if (key != "vocab_size")
      throw std::invalid_argument("model.config." + key + ": not a llama setting");
  }
  if (m.config.count("num_attention_heads") && !m.config.count("num_key_value_heads"))
    c.num_key_value_heads = c.num_attention_heads;
  return c;
}

GPT2Config gpt2_config_from_spec(const ModelSpec& m, int64_t tokenizer_vocab) {
  GPT2Config c;
  c.vocab_size = vocab_for(m, tokenizer_vocab);
  for (const auto& [key, value] : m.config) {
    const auto i = static_cast<int64_t>(value);
    if (key == "hidden_size")
      c.n_embd = i;
    else if (key == "num_hidden_layers")
      c.n_layer = i;
    else if (key == "num_attention_heads")
      c.n_head = i;
    else if (key == "intermediate_size")
      c.n_inner = i;
    else if (key == "max_position_embeddings")
      c.n_positions = i;
    else if (key == "tie_word_embeddings")
      c.tie_word_embeddings = value != 0;
    else if (key == "initializer_range")
      c.initializer_range = value;
    else if (key != "vocab_size")
      throw std::invalid_argument("model.config." + key + ": not a gpt2 setting");
  }
  return c;
}

nlohmann::json hf_config_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab) {
  if (!spec.from.empty()) return config_of_directory(spec, tokenizer_vocab);
  if (spec.arch == "llama")
    return as_spec_error([&] { return hf_config_json(llama_config_from_spec(spec, tokenizer_vocab)); });
  if (spec.arch == "gpt2")
    return as_spec_error([&] { return hf_config_json(gpt2_config_from_spec(spec, tokenizer_vocab)); });
  throw std::invalid_argument("model.arch: '" + spec.arch + "' is not llama or gpt2");
}

}  // namespace zenflow::model
