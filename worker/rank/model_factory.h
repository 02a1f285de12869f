// The model and the data a job spec asks for: the single place that turns ModelSpec and
// DataSpec into a CausalLM and train/validation TokenDatasets.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "common/job_spec.h"
#include "worker/model/causal_lm.h"
#include "worker/model/dataset.h"
#include "worker/model/hf_model.h"
#include "worker/model/tokenizer.h"

namespace zenflow {

// The spec is checked first, against config.json alone, by hf_config_from_spec
// (common/model/spec_model_config.h), whose errors this throws before any weight is read.
// model.from set: loads that Hugging Face directory (load_hf_model) onto `device` in
// `dtype` (Undefined: the checkpoint's dtype); config.json decides the architecture, and
// model.config must be empty. When the spec wrote model.arch (arch_given) it must match
// the directory's (mistral and qwen2 count as llama), else std::invalid_argument
// "model.arch: 'gpt2' contradicts model.from (DIR/config.json is a llama model); remove
// model.arch or change it". The model's vocab_size must be >= `tokenizer_vocab`.
// Otherwise random init from `seed` (on the CPU in fp32, then moved to device/dtype when
// given) of model.arch with model.config's keys, as llama_config_from_spec /
// gpt2_config_from_spec map them (vocab_size defaults to tokenizer_vocab and may not be
// smaller).
// `info` (optional) receives everything but the model: config (config.json as read, or
// generated for random init), arch, model_type, checkpoint_dtype (kFloat for random
// init) and source_dir. Throws std::invalid_argument("model.<key>: ...") for spec
// problems and std::runtime_error naming the file for checkpoint problems.
std::unique_ptr<model::CausalLM> make_model_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab,
                                                      uint64_t seed, model::LoadedModel* info,
                                                      at::Device device = at::kCPU,
                                                      at::ScalarType dtype = at::ScalarType::Undefined);

// What make_model_from_spec would build (LoadedModel without the model), without
// loading or allocating any weight (the same spec checks and errors); used by export and
// by the memory preflight (worker/rank/preflight.h).
model::LoadedModel describe_model_from_spec(const ModelSpec& spec, int64_t tokenizer_vocab);

// The datasets of data.format:
//   text    make_text_dataset (a file, or a directory's files sorted by name);
//   jsonl   make_jsonl_dataset: {"text"} lines packed, or {"prompt", "completion"}
//           lines one example each with the loss on the completion only;
//   tokens  make_token_file_dataset (.u16/.u32 binary token ids, checked < vocab).
// Validation: data.val (the same format, used whole) when given, otherwise the last
// ceil(val_fraction * n) examples of train (split_dataset). Returns {train, val}; val
// may be empty (size 0) when train has a single example. Throws std::runtime_error
// naming the file (and line / offset) on bad data.
std::pair<std::shared_ptr<model::TokenDataset>, std::shared_ptr<model::TokenDataset>> make_dataset_from_spec(
    const DataSpec& d, const model::Tokenizer& tok, int64_t seq_len, int64_t vocab);

}  // namespace zenflow
