// Training checkpoints: atomic directories step-NNNNNNNN/ under checkpoint.dir.
//
// A checkpoint directory holds model.safetensors (the model's named tensors, Hugging Face
// names), engine.safetensors (the ZenFlow engine state, semantics §7; with W data-parallel
// ranks, rank 0's shard, and engine-rank-NNNNN.safetensors the shards of ranks 1..W-1)
// and trainer.json (step, world_size, loader position, loss history, job name). It is
// written to a temporary directory, every file fsynced, then renamed into place, so a
// crash never leaves a half-written checkpoint under the final name; readers never see
// partial directories.
//
// Several ranks write one checkpoint together into a directory they share:
//   every rank:    engine = optimizer.state_dict()
//   rank 0:        begin_checkpoint(dir, step)                      then a barrier
//   rank r > 0:    write_engine_shard(dir, step, r, engine)         then a barrier
//   rank 0:        commit_checkpoint(dir, step, ..., world_size)    (checks every shard)
// One rank: write_checkpoint() does all of it.
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
  int64_t world_size = 1;                  // ranks that wrote it
  NamedTensors model;
  std::vector<std::string> engine_shards;  // per rank that wrote it: its engine state file
  nlohmann::json trainer;
};

// Writes step directory `dir/step-<step>` atomically, then deletes the oldest complete
// checkpoints beyond `keep`. Throws std::runtime_error naming the path on I/O failure;
// on failure the previous checkpoints are untouched.
std::string write_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                             const NamedTensors& engine, const nlohmann::json& trainer, int64_t keep);

// The steps of a checkpoint written by several ranks (see above). begin_checkpoint
// (re)creates the temporary directory; commit_checkpoint writes rank 0's files, checks
// that the shards of ranks 1..world_size-1 are there, renames and rotates.
void begin_checkpoint(const std::string& dir, int64_t step);
void write_engine_shard(const std::string& dir, int64_t step, int rank, const NamedTensors& engine);
std::string commit_checkpoint(const std::string& dir, int64_t step, const NamedTensors& model,
                              const NamedTensors& engine, const nlohmann::json& trainer, int64_t keep,
                              int world_size);

// Reads one rank's engine state of a loaded checkpoint (rank < c.world_size).
NamedTensors load_engine_shard(const Checkpoint& c, int rank);

// Loads the newest readable checkpoint in `dir` (its model and trainer state; the engine
// shards are validated, and read with load_engine_shard). A damaged one (missing or
// truncated file, bad JSON) is skipped with a warning through `warn`, falling back to
// the previous.
// Returns nullopt when `dir` holds none.
std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir,
                                                 const std::function<void(const std::string&)>& warn);

// Step directories in `dir`, ascending by step (complete ones only: no .tmp suffix).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

}  // namespace zenflow
