// make_model_from_spec / make_dataset_from_spec: job spec -> model and datasets (see model_factory.h).
#include "worker/rank/model_factory.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "common/model/spec_model_config.h"
#include "worker/model/gpt2.h"
#include "worker/model/llama.h"

namespace zenflow {

model::LoadedModel describe_model_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab) {
  if (!spec.from.empty()) {
    // The spec against DIR/config.json (model.config empty, model.arch, vocab_size), then
    // the weights' headers.
    model::hf_config_from_spec(spec, tokenizer_vocab);
    return model::describe_hf_model(spec.from);
  }
  model::LoadedModel info;
  info.config = model::hf_config_from_spec(spec, tokenizer_vocab);
  info.arch = spec.arch;
  info.model_type = spec.arch;
  info.checkpoint_dtype = at::kFloat;
  return info;
}

std::unique_ptr<model::CausalLM> make_model_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab,
                                                      uint64_t seed, model::LoadedModel* info,
                                                      at::Device device, at::ScalarType dtype) {
  std::unique_ptr<model::CausalLM> lm;
  model::LoadedModel described;
  if (!spec.from.empty()) {
    // The spec's checks (its vocab_size is the model's), before any weight is read.
    model::hf_config_from_spec(spec, tokenizer_vocab);
    model::HfLoadOptions options;
    options.device = device;
    options.dtype = dtype;
    model::LoadedModel loaded = model::load_hf_model(spec.from, options);
    lm = std::move(loaded.model);
    described = std::move(loaded);
  } else {
    // Every spec and config check, named after the spec: the configs built next are the
    // ones it checked, so their constructors find nothing more to refuse.
    described = describe_model_from_spec(spec, tokenizer_vocab);
    lm = spec.arch == "gpt2" ? model::make_gpt2(model::gpt2_config_from_spec(spec, tokenizer_vocab), seed)
                             : model::make_llama(model::llama_config_from_spec(spec, tokenizer_vocab), seed);
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
