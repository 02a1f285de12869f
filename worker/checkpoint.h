// Training checkpoints: atomic directories step-NNNNNNNN/ under checkpoint.dir.
//
// A checkpoint directory holds model.safetensors (the model's named tensors, Hugging Face
// names), engine.safetensors (the ZenFlow engine state, semantics §7) and trainer.json (step, loader position, loss
// history, job name). It is written to a temporary directory, every file fsynced, then
// renamed into place, so a crash never leaves a half-written checkpoint under the final
// name. Only the training thread writes; readers never see partial directories.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace zenflow {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

struct Checkpoint {
  std::string path;  // the step directory
  int64_t step = 0;
  NamedTensors model;
  NamedTensors engine;
  nlohmann::json trainer;
};

// Writes step directory `dir/step-<step>` atomically, then deletes the oldest complete
// checkpoints beyond `keep`. Throws std::runtime_error naming the path on I/O failure;
// on failure the previous checkpoints are untouched.
std::string write_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                             const NamedTensors& engine, const nlohmann::json& trainer, int64_t keep);

// Loads the newest readable checkpoint in `dir`. A damaged one (missing or truncated
// file, bad JSON) is skipped with a warning through `warn`, falling back to the previous.
// Returns nullopt when `dir` holds none.
std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir,
                                                 const std::function<void(const std::string&)>& warn);

// Step directories in `dir`, ascending by step (complete ones only: no .tmp suffix).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

}  // namespace zenflow
