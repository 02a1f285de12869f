// The job spec users write (DESIGN.md §6): parsed from YAML, validated, overridable.
//
// parse_job_spec() either returns a fully validated JobSpec or throws SpecError whose
// message names the key path and the reason, e.g.
//   "optimizer.zenflow.topk_ratio: must be in [0, 1], got 1.5".
// Unknown keys, repeated keys, wrong types and out-of-range values are all rejected.
// "auto" values are kept as "auto" here (the runtime resolves them); numeric fields that
// accept "auto" use the *_auto flags below. A key written with no value (`val:`) counts as
// omitted for the optional strings (model.from, data.val, checkpoint.dir,
// cost.instance_type, cost.usd_per_hour) and whole sections; for any other key it is an
// error. Integers may be written 100 or 1e2, never 2.5; numbers must be finite.
//
// After parsing, every path (model.from, data.train, data.val, data.tokenizer unless
// "byte", checkpoint.dir) is resolved against the spec's directory, and checkpoint.dir is
// never empty. Thread-safety: all functions are pure and may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace zenflow {

class SpecError : public std::runtime_error {
 public:
  SpecError(const std::string& path, const std::string& reason)
      : std::runtime_error(path + ": " + reason), path_(path) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct ModelSpec {
  std::string arch = "llama";  // llama | gpt2
  std::string from;            // directory with config.json + safetensors; empty = random init
  // Size overrides / random-init config (keys of a HF config.json: hidden_size,
  // num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size,
  // vocab_size, max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings,
  // initializer_range). Only keys the user wrote are present. Sizes are integers >= 1;
  // rope_theta, rms_norm_eps, initializer_range are > 0; tie_word_embeddings is 0 or 1.
  // When both are given, hidden_size % num_attention_heads == 0 and
  // num_attention_heads % num_key_value_heads == 0, and train.seq_len <=
  // max_position_embeddings.
  std::map<std::string, double> config;
};

struct DataSpec {
  std::string train;               // file or directory (all regular files inside, sorted)
  std::string val;                 // optional; empty = hold out val_fraction of train
  std::string format = "text";     // text | jsonl | tokens
  std::string tokenizer = "byte";  // byte | PATH/tokenizer.json
  double val_fraction = 0.05;
};

struct TrainSpec {
  int64_t steps = 200;
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  int64_t seq_len = 128;
  double lr = 3.0e-4;
  std::string schedule = "cosine";  // cosine | linear | constant
  int64_t warmup_steps = 10;        // <= steps; when not written, min(10, steps)
  double min_lr_ratio = 0.1;
  double weight_decay = 0.0;
  double grad_clip = 1.0;  // 0 disables
  uint64_t seed = 1;
  int64_t eval_every = 0;  // 0: only at the end
  int64_t eval_batches = 4;
  std::string device = "auto";  // auto | cpu | cuda
  std::string dtype = "auto";   // auto | float32 | bfloat16 | float16 (weights on the device)
  // Mixed precision by autocast on CUDA (weights stay in `dtype`, matmuls run in this
  // dtype): none | bfloat16 | float16. Ignored on the CPU, which computes in fp32.
  std::string autocast = "none";
  int64_t compute_threads = 0;  // 0 = auto (cores minus the host optimizer's)
};

struct ZenflowSpec {
  double topk_ratio = 0.1;
  std::string select_strategy = "auto";  // auto | step | epoch
  bool select_interval_auto = true;
  int64_t select_interval = 0;
  bool update_interval_auto = false;
  int64_t update_interval = 4;
  int64_t full_warm_up_rounds = 1;
  bool overlap_step = true;
  std::string importance = "l2";  // l2 | l1
  double reselect_threshold = 0.9;
  double auto_ratio = 0.99;
  int64_t max_update_interval = 16;
  int64_t min_split_numel = 4096;
};

struct HostSpec {
  bool threads_auto = true;
  int64_t threads = 0;
  bool reserved_cores_auto = true;
  std::vector<int> reserved_cores;  // explicit core ids
  int64_t nodes = 0;                // remote optimizer nodes (UCX); 0 = in-process
  bool huge_pages = true;
};

struct OptimizerSpec {
  std::string mode = "zenflow";  // zenflow | offload | device
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  ZenflowSpec zenflow;
  HostSpec host;
};

struct ResourcesSpec {
  int64_t workers = 1;
  int64_t gpus_per_worker = 1;
  bool host_memory_gb_auto = true;
  double host_memory_gb = 0;
  int64_t priority = 0;
};

struct CheckpointSpec {
  std::string dir;            // parse_job_spec sets it to <spec dir>/runs/<name> when not given
  int64_t every_steps = 100;  // 0 disables periodic checkpoints
  int64_t keep = 3;
};

struct CostSpec {
  std::string instance_type;
  std::optional<double> usd_per_hour;  // overrides the pricing catalog
};

struct JobSpec {
  std::string name;
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  OptimizerSpec optimizer;
  ResourcesSpec resources;
  CheckpointSpec checkpoint;
  CostSpec cost;
};

// Parses YAML text. `overrides` are "key.path=value" strings (the CLI's --set), applied
// in order to the YAML tree before validation, creating missing intermediate mappings;
// the value is parsed as YAML (so `true`, `0.1`, `[1,2]`, `auto` work). An override of an
// unknown key is rejected by validation like any unknown key; one without '=' or with an
// empty path segment throws SpecError("--set", ...). `base_dir` resolves relative paths
// (lexically: "." + "data/x" gives "data/x"). YAML syntax errors throw
// SpecError("<yaml>", "line L, column C: <yaml-cpp message>").
JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides = {},
                       const std::string& base_dir = ".");

// Reads and parses the file at `path`; relative paths in it resolve against the file's
// directory (made absolute). A missing or unreadable file throws
// SpecError(path, "cannot read file"); YAML syntax errors name `path` instead of "<yaml>".
JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides = {});

// The spec as block YAML with every field written out (auto values as "auto", an unset
// cost.usd_per_hour as null, numbers in their shortest exact form), for job records and
// logs. parse_job_spec(to_yaml(s)) == s for any spec parse_job_spec returned (paths that
// are still relative, from a relative base_dir, need base_dir "." the second time).
std::string to_yaml(const JobSpec& spec);

// Field-by-field equality (exact for doubles).
bool operator==(const ModelSpec& a, const ModelSpec& b);
bool operator==(const DataSpec& a, const DataSpec& b);
bool operator==(const TrainSpec& a, const TrainSpec& b);
bool operator==(const ZenflowSpec& a, const ZenflowSpec& b);
bool operator==(const HostSpec& a, const HostSpec& b);
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b);
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b);
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b);
bool operator==(const CostSpec& a, const CostSpec& b);
bool operator==(const JobSpec& a, const JobSpec& b);
inline bool operator!=(const JobSpec& a, const JobSpec& b) { return !(a == b); }

}  // namespace zenflow
