// Training checkpoints: atomic, checksummed directories step-NNNNNNNN/ under checkpoint.dir.
//
// A checkpoint directory holds model.safetensors (the model's named tensors, Hugging Face
// names), engine.safetensors (the ZenFlow engine state, docs/semantics.md; with W data-parallel
// ranks, rank 0's shard, and engine-rank-NNNNN.safetensors the shards of ranks 1..W-1),
// trainer.json (step, world_size, loader position, loss history, job name), run.yaml (the
// resolved job spec) and manifest.json, written last: the size and CRC32C of every other
// file, the step, the number of ranks and the job's identity (the spec keys that must not
// change across a resume, job_identity()). It is written to a temporary directory, every
// file fsynced, then renamed into place, so a crash never leaves a half-written checkpoint
// under the final name. A checkpoint is never replaced: committing a step that already has
// a directory is an error.
//
// Loading trusts nothing: a checkpoint is usable only when its manifest parses, the
// directory name, the manifest and trainer.json agree on the step and ranks, every file
// has its recorded size and checksum, trainer.json's fields are in range and every
// floating-point tensor (weights and optimizer state) is finite. Anything else makes it
// damaged: it is skipped with a warning naming the file and the reason, renamed
// step-NNNNNNNN.damaged (kept for inspection, never overwritten), and the previous one is
// tried.
//
// Several ranks write one checkpoint together into a directory they share:
//   every rank:    engine = optimizer.state_dict()
//   rank 0:        begin_checkpoint(dir, step)                      then a barrier
//   rank r > 0:    write_engine_shard(dir, step, r, engine)         then a barrier
//   rank 0:        commit_checkpoint(dir, step, contents, ...)      (checks every shard)
// One rank: write_checkpoint() does all of it.
//
// While a run uses checkpoint.dir it holds CheckpointDirLock on it, so a second run on the
// same directory fails naming the owner (at once, or after waiting for it: lock_checkpoint_dir).
//
// Fencing: a process that may lose its right to write the job (`zenflow run --lease-fd`: the
// worker agent's lease can expire, and another attempt of the job then owns it) passes a
// CommitFence to commit_checkpoint. The fence decides at the last moment, and holds its
// decision while the checkpoint becomes visible, so no checkpoint appears after the right
// was lost, however the loss races the save.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zenflow {

struct JobSpec;

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// A resume that cannot proceed without the user's say-so: every checkpoint damaged, or the
// spec changed in a key that matters. Bad input (exit 2), not a runtime failure.
class ResumeRefused : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// checkpoint.dir is locked by another run (its host and pid are in the message).
class CheckpointDirBusy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// commit_checkpoint was refused by its CommitFence: nothing was committed (the temporary
// directory was removed). The process no longer owns the job; it must end without writing.
class CommitFenced : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs `publish` (the rename that makes a checkpoint visible, and the rotation of old ones)
// if and only if this process may still commit, and returns whether it ran. While it runs,
// the fence's owner must not revoke the right (a lease holds off its expiry until it
// returns), so "may commit" and "committed" are one decision. An empty fence always allows.
// `publish` may throw; the fence passes the exception on.
using CommitFence = std::function<bool(const std::function<void()>& publish)>;

// What one commit writes besides the other ranks' engine shards.
struct CheckpointContents {
  NamedTensors model;
  NamedTensors engine;       // rank 0's engine shard
  nlohmann::json trainer = nlohmann::json::object();   // loader_epoch, loader_index, losses, job, mode
  std::string run_yaml;      // the resolved job spec (to_yaml)
  nlohmann::json identity = nlohmann::json::object();  // job_identity() of the run
};

struct Checkpoint {
  std::string path;  // the step directory
  int64_t step = 0;
  int64_t world_size = 1;                  // ranks that wrote it
  NamedTensors model;
  std::vector<std::string> engine_shards;  // per rank that wrote it: its engine state file
  nlohmann::json trainer;                  // trainer.json, validated
  int64_t loader_epoch = 0;
  int64_t loader_index = 0;
  std::vector<double> losses;
  nlohmann::json identity;                 // from the manifest
};

// Writes step directory `dir/step-<step>` atomically, then deletes the oldest complete
// checkpoints beyond `keep`. Throws std::runtime_error naming the path on I/O failure, or
// when `dir/step-<step>` already exists; on failure the previous checkpoints are untouched.
std::string write_checkpoint(const std::string& dir, int64_t step, const CheckpointContents& contents, int64_t keep);

// The steps of a checkpoint written by several ranks (see above). begin_checkpoint
// (re)creates the temporary directory; write_engine_shard writes a shard and its checksum;
// commit_checkpoint writes rank 0's files, checks that the shards of ranks
// 1..world_size-1 are there with their checksums, writes the manifest, then, through
// `fence`, renames and rotates. When the fence refuses, it removes the temporary directory
// and throws CommitFenced; the previous checkpoints are untouched.
//
// Ranks that do not share rank 0's directory (checkpoint.dir: s3:// across workers, each
// with its own staging directory) write their shard into their own copy of `dir` (the
// temporary directory is created there) and send it to the bucket themselves; rank 0 is
// given their shards' checksums (`elsewhere`, gathered over the ranks' communicator) and
// puts them in the manifest without reading the files.
struct ShardChecksum {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};
void begin_checkpoint(const std::string& dir, int64_t step);
ShardChecksum write_engine_shard(const std::string& dir, int64_t step, int rank, const NamedTensors& engine);
std::string commit_checkpoint(const std::string& dir, int64_t step, const CheckpointContents& contents,
                              int64_t keep, int world_size, const CommitFence& fence = {},
                              const std::map<int, ShardChecksum>& elsewhere = {});
// The path write_engine_shard wrote rank `rank`'s shard of step `step` to.
std::string engine_shard_path(const std::string& dir, int64_t step, int rank);

// Elements of `t` that are NaN or Inf (0 for non-floating types). CPU contiguous tensors are
// scanned over their raw exponent bits at memory speed, without a temporary tensor. What a
// checkpoint may not hold: commit callers check with it, load_checkpoint refuses them.
int64_t count_non_finite(const at::Tensor& t);

// Reads one rank's engine state of a loaded checkpoint (rank < c.world_size).
NamedTensors load_engine_shard(const Checkpoint& c, int rank);

// Verifies one step directory as described above and loads its model and trainer state
// (the engine shards are verified, and read with load_engine_shard). Throws
// std::runtime_error "<file>: <reason>" when it is damaged.
//
// `needed`, when set, says which engine shards this process reads (the checkpoint's number
// of ranks, a shard's rank): the others are neither required on disk nor verified. A
// worker that stages a bucket's checkpoint holds only its own ranks' shards (the manifest
// still lists them all).
using ShardFilter = std::function<bool(int64_t checkpoint_world_size, int rank)>;
Checkpoint load_checkpoint(const std::string& step_dir, const ShardFilter& needed = {});

struct CheckpointScan {
  std::optional<Checkpoint> checkpoint;  // the newest usable one
  // Damaged checkpoints found in this scan or earlier ones (step-*.damaged*), by path.
  std::vector<std::string> damaged;
};

// Finds and loads the newest usable checkpoint in `dir`, newest first; each damaged one is
// reported through `warn` ("checkpoint DIR is damaged (FILE: REASON); trying the previous
// one") and, when `quarantine`, renamed step-NNNNNNNN.damaged (a free .damaged.N name if
// that exists). Only the run that holds the directory's lock may quarantine.
CheckpointScan scan_checkpoints(const std::string& dir, const std::function<void(const std::string&)>& warn,
                                bool quarantine, const ShardFilter& needed = {});

// scan_checkpoints without quarantine: the newest usable checkpoint, or nullopt.
std::optional<Checkpoint> load_latest_checkpoint(const std::string& dir,
                                                 const std::function<void(const std::string&)>& warn);

// Step directories in `dir`, ascending by step (complete ones only: no .tmp/.damaged suffix).
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir);

// Whether `name`, an entry of checkpoint.dir, is one a run writes there (what a fresh start
// sets aside): step-N, step-N.tmp, step-N.damaged[.K] (N, K digits), steps.jsonl
// (step_log.h), profile.yaml and its temporary profile.yaml.tmp.PID (job_profiler.h). Not
// the lock file, earlier superseded-* directories, or anything else.
bool is_run_file(const std::string& name);

// Moves every entry of `dir` that is_run_file() (step-* directories, the other names regular
// files; never a symbolic link) into a new dir/superseded-YYYYmmdd-HHMMSS/
// (.N appended when that name exists) and returns that directory, or "" when there was
// nothing to move. Nothing is deleted, and nothing else in `dir` is touched: a run that
// starts fresh (`zenflow run --fresh`, holding the directory's lock) keeps what an earlier
// run wrote, out of the way of its resume, its report and its profile. Throws
// std::runtime_error naming the path when a move fails.
std::string supersede_checkpoints(const std::string& dir);

// The spec keys a resume must not change (model, data, mode, topk_ratio, update_interval,
// seq_len, global batch = micro_batch x grad_accum x ranks), as a JSON object of
// "key.path" -> value.
nlohmann::json job_identity(const JobSpec& spec, int64_t world_size);

// Keys whose values differ between two identities, "key: OLD -> NEW" each, in key order,
// leaving out the `allowed` ones (train.micro_batch or train.grad_accum allow the global
// batch they change).
std::vector<std::string> identity_changes(const nlohmann::json& saved, const nlohmann::json& now,
                                          const std::vector<std::string>& allowed = {});

// An exclusive advisory lock (flock) on dir/.zenflow.lock, released when the object is
// destroyed or the process dies (even by SIGKILL: the kernel drops it). The file records
// the owner's host, pid and start time. Construction creates `dir` if needed and throws
// CheckpointDirBusy naming the owner when another process holds the lock, or
// std::runtime_error when the lock file cannot be created or was not written by zenflow.
class CheckpointDirLock {
 public:
  explicit CheckpointDirLock(const std::string& dir);
  ~CheckpointDirLock();
  CheckpointDirLock(const CheckpointDirLock&) = delete;
  CheckpointDirLock& operator=(const CheckpointDirLock&) = delete;

  static constexpr const char* kFileName = ".zenflow.lock";

 private:
  int fd_ = -1;
};

// CheckpointDirLock on `dir`, waiting up to `wait` for another process to let go of it
// (polling every 100 ms; the lock file is reopened each time). `on_wait` is called once,
// with the CheckpointDirBusy message, when the first try finds the directory busy and
// `wait` > 0. Throws the last CheckpointDirBusy when the directory is still busy after
// `wait` (at once with `wait` 0), and whatever CheckpointDirLock throws otherwise.
std::unique_ptr<CheckpointDirLock> lock_checkpoint_dir(
    const std::string& dir, std::chrono::milliseconds wait,
    const std::function<void(const std::string&)>& on_wait = {});

}  // namespace zenflow
