// make_model_from_spec / make_dataset_from_spec: job spec -> model and datasets (see model_factory.h).
#include "worker/rank/model_factory.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "worker/model/gpt2.h"
#include "worker/model/llama.h"

namespace zenflow {
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

model::LlamaConfig llama_config(const ModelSpec& m, int64_t tokenizer_vocab) {
  model::LlamaConfig c;
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

model::GPT2Config gpt2_config(const ModelSpec& m, int64_t tokenizer_vocab) {
  model::GPT2Config c;
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

// Config errors from the model constructors, renamed after the spec section.
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

void check_from(const ModelSpec& spec) {
  if (!spec.config.empty())
    throw std::invalid_argument("model.config: cannot be combined with model.from (" + spec.from +
                                "/config.json decides the model's shape)");
}

// model.arch written next to model.from must agree with the directory (a silently
// ignored arch would train something other than what the spec says).
void check_arch(const ModelSpec& spec, const model::LoadedModel& info) {
  if (spec.arch_given && spec.arch != info.arch)
    throw std::invalid_argument("model.arch: '" + spec.arch + "' contradicts model.from (" + spec.from +
                                "/config.json is a " + info.model_type +
                                " model); remove model.arch or change it");
}

void check_vocab(const model::LoadedModel& info, int64_t model_vocab, int64_t tokenizer_vocab) {
  if (model_vocab < tokenizer_vocab)
    throw std::invalid_argument("model.from: " + info.source_dir + " has vocab_size " +
                                std::to_string(model_vocab) + ", smaller than the tokenizer's " +
                                std::to_string(tokenizer_vocab));
}

int64_t config_vocab(const model::LoadedModel& info) {
  return info.arch == "gpt2" ? model::gpt2_config_from_hf(info.config).vocab_size
                             : model::llama_config_from_hf(info.config).vocab_size;
}

}  // namespace

model::LoadedModel describe_model_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab) {
  if (!spec.from.empty()) {
    check_from(spec);
    model::LoadedModel info = model::describe_hf_model(spec.from);
    check_arch(spec, info);
    check_vocab(info, config_vocab(info), tokenizer_vocab);
    return info;
  }
  model::LoadedModel info;
  info.arch = spec.arch;
  info.model_type = spec.arch;
  info.checkpoint_dtype = at::kFloat;
  if (spec.arch == "llama") {
    info.config = as_spec_error([&] { return model::hf_config_json(llama_config(spec, tokenizer_vocab)); });
  } else if (spec.arch == "gpt2") {
    info.config = as_spec_error([&] { return model::hf_config_json(gpt2_config(spec, tokenizer_vocab)); });
  } else {
    throw std::invalid_argument("model.arch: '" + spec.arch + "' is not llama or gpt2");
  }
  return info;
}

std::unique_ptr<model::CausalLM> make_model_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab,
                                                      uint64_t seed, model::LoadedModel* info,
                                                      at::Device device, at::ScalarType dtype) {
  std::unique_ptr<model::CausalLM> lm;
  model::LoadedModel described;
  if (!spec.from.empty()) {
    check_from(spec);
    if (spec.arch_given) check_arch(spec, model::describe_hf_model(spec.from));  // before any weight is read
    model::HfLoadOptions options;
    options.device = device;
    options.dtype = dtype;
    model::LoadedModel loaded = model::load_hf_model(spec.from, options);
    check_vocab(loaded, loaded.model->vocab_size(), tokenizer_vocab);
    lm = std::move(loaded.model);
    described = std::move(loaded);
  } else {
    described = describe_model_from_spec(spec, tokenizer_vocab);
    lm = as_spec_error([&] {
      return spec.arch == "gpt2" ? model::make_gpt2(gpt2_config(spec, tokenizer_vocab), seed)
                                 : model::make_llama(llama_config(spec, tokenizer_vocab), seed);
    });
    if (device != at::Device(at::kCPU) || (dtype != at::ScalarType::Undefined && dtype != at::kFloat))
      lm->to(device, dtype == at::ScalarType::Undefined ? at::kFloat : dtype);
  }
  if (info) *info = std::move(described);
  return lm;
}

std::pair<std::shared_ptr<model::TokenDataset>, std::shared_ptr<model::TokenDataset>> make_dataset_from_spec(
    const DataSpec& d, const model::Tokenizer& tok, int64_t seq_len, int64_t vocab) {
  auto build = [&](const std::string& path) -> std::shared_ptr<model::TokenDataset> {
    if (d.format == "text") return model::make_text_dataset(path, tok, seq_len);
    if (d.format == "jsonl") return model::make_jsonl_dataset(path, tok, seq_len);
    if (d.format == "tokens") return model::make_token_file_dataset(path, seq_len, vocab);
    throw std::invalid_argument("data.format: '" + d.format + "' is not text, jsonl or tokens");
  };
  std::shared_ptr<model::TokenDataset> train = build(d.train);
  if (!d.val.empty()) return {train, build(d.val)};
  return model::split_dataset(train, d.val_fraction);
}

}  // namespace zenflow
