// The job spec users write (docs/design.md §6): parsed from YAML, validated, overridable.
// Every key with its type, default, bounds and meaning: docs/spec.md, generated from the
// field table in job_spec.cpp (one row per key) that parsing, to_yaml and operator== use.
//
// parse_job_spec() either returns a fully validated JobSpec or throws SpecError whose
// message names the key path and the reason, e.g.
//   "optimizer.zenflow.topk_ratio: must be in [0, 1], got 1.5".
// Unknown keys, repeated keys, wrong types and out-of-range values are all rejected.
// "auto" values are kept as "auto" here (the runtime resolves them); numeric fields that
// accept "auto" use the *_auto flags below. A key written with no value (`val:`) counts as
// omitted for the optional strings (model.from, data.val, checkpoint.dir,
// cost.instance_type, cost.usd_per_hour) and whole sections; for any other key it is an
// error. Integers may be written 100 or 1e2, never 2.5; numbers must be finite. Every
// integer has an upper bound that fits its type and is generous for real jobs (so a typo
// like num_hidden_layers: 1e9 is a spec error, not an allocation the kernel kills): the
// message is "must be in [lo, hi], got X". With these bounds micro_batch * grad_accum *
// seq_len <= 2^52 fits int64 (times up to 2^11 ranks).
//
// name: 1 to 128 characters, a letter or digit, then letters, digits, '.', '_', '-' (so
// never "." or ".."; it names the default checkpoint directory runs/<name>). Paths are at
// most 4096 bytes as written, cost.instance_type at most 128 characters.
//
// After parsing, every path written in the spec or a --set (model.from, data.train,
// data.val, data.tokenizer unless "byte", checkpoint.dir) is resolved against the spec's
// directory, and checkpoint.dir is never empty: an absent one is runs/<name> under the
// current directory of the process that reads the spec (parse_job_spec leaves it relative,
// "runs/<name>", whatever base_dir is; load_job_spec makes it absolute; the coordinator,
// which parses with base_dir "." and requires absolute paths, refuses it, so a submitted
// spec always names its directory). checkpoint.dir may not be "/", $HOME, the spec's
// directory (base_dir) or an existing non-directory (compared after
// std::filesystem::weakly_canonical): zenflow writes step-N directories and its lock there
// and prunes old ones.
//
// parse_job_spec does not check that the input paths exist (tests use made-up ones); it
// reads the file system only for the checkpoint.dir rule. check_spec_paths does the
// existence checks; load_job_spec calls it.
// Thread-safety: all functions may be called concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/engine_defaults.h"

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
  // Whether `arch` decides the model: true when the spec wrote model.arch, and always when
  // `from` is empty. With `from` set and arch_given, the directory's architecture must be
  // `arch` (make_model_from_spec checks); without arch_given config.json decides. Code that
  // fills in `from` itself sets arch_given = false unless it means `arch` to be checked.
  bool arch_given = true;
  std::string from;  // directory with config.json + safetensors; empty = random init
  // Size overrides / random-init config (keys of a HF config.json: hidden_size,
  // num_hidden_layers, num_attention_heads, num_key_value_heads, intermediate_size,
  // vocab_size, max_position_embeddings, rope_theta, rms_norm_eps, tie_word_embeddings,
  // initializer_range). Only keys the user wrote are present. Sizes are integers >= 1 with
// upper bounds (hidden_size <= 131072, num_hidden_layers <= 1024, ...: docs/spec.md);
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
  // Each decoder layer's forward keeps only its input; backward recomputes the rest.
  bool activation_checkpointing = false;
  // Data-parallel sharding (docs/semantics.md §10): none | gradients (each rank keeps its
  // shard of the gradients and optimizer state) | parameters (of the weights too).
  std::string shard = "none";
  // The weights in host memory, each unit's streamed to the device just before it runs
  // (forward and recomputing backward); optimizer.mode offload (docs/design.md §5.3).
  bool offload_parameters = false;
};

struct ZenflowSpec {
  double topk_ratio = engine_defaults::kTopkRatio;
  std::string select_strategy = "auto";  // auto | step | epoch
  bool select_interval_auto = true;
  int64_t select_interval = 0;
  bool update_interval_auto = false;
  int64_t update_interval = engine_defaults::kUpdateInterval;
  int64_t full_warm_up_rounds = engine_defaults::kFullWarmUpRounds;
  bool overlap_step = engine_defaults::kOverlapStep;
  std::string importance = "l2";  // l2 | l1
  double reselect_threshold = engine_defaults::kReselectThreshold;
  double auto_ratio = engine_defaults::kAutoRatio;
  int64_t max_update_interval = engine_defaults::kMaxUpdateInterval;
  int64_t min_split_numel = engine_defaults::kMinSplitNumel;
};

struct HostSpec {
  bool threads_auto = true;
  int64_t threads = 0;
  bool reserved_cores_auto = true;
  std::vector<int> reserved_cores;  // explicit core ids
  int64_t nodes = 0;                // remote optimizer nodes (UCX); 0 = in-process
  // Explicit zenflow-optimizer nodes (HOST:PORT), each rank's host state split over them
  // (one list: every rank uses all of them); empty = `nodes` from a coordinator, or in-process.
  std::vector<std::string> addresses;
  std::string token_file;  // the token the nodes require (resolved against the spec's directory)
  // What a lost node leads to, tried in order: "spare" (another node the coordinator
  // assigns), "in_process" (when this host has the RAM), "fail".
  std::vector<std::string> on_node_loss = {"spare", "in_process", "fail"};
  bool huge_pages = engine_defaults::kHugePages;
  // Device memory for staging the host-owned columns' gradients and results; 0: whole
  // gradients (EngineOptions::device_staging_bytes).
  int64_t device_staging_mib = 0;
};

struct OptimizerSpec {
  std::string mode = "zenflow";  // zenflow | offload | device
  double beta1 = engine_defaults::kBeta1;
  double beta2 = engine_defaults::kBeta2;
  double eps = engine_defaults::kEps;
  ZenflowSpec zenflow;
  HostSpec host;
};

struct ResourcesSpec {
  int64_t workers = 1;
  int64_t gpus_per_worker = 1;
  bool host_memory_gb_auto = true;
  double host_memory_gb = 0;
  int64_t priority = 0;
  // Restarts after a lost worker or a crashed rank before the job is FAILED (0 = never
  // restart). Preemption is not a failure and does not count.
  int64_t max_restarts = 3;
  // An attempt whose progress stops for this many seconds is killed and requeued ("hung at
  // step N"). "auto" (0 here): the larger of 10 x the attempt's median step time and
  // kAutoHangTimeoutSeconds. Before the first step the bound is kFirstStepHangFactor times it.
  int64_t hang_timeout = 0;
  static constexpr int64_t kMinHangTimeoutSeconds = 30;
  static constexpr int64_t kAutoHangTimeoutSeconds = 300;
  static constexpr int64_t kFirstStepHangFactor = 3;
};

struct CheckpointSpec {
  std::string dir;            // when not given: runs/<name> under the current directory (above)
  int64_t every_steps = 100;  // 0 disables periodic checkpoints
  int64_t keep = 3;
  int64_t upload_mib_per_s = 0;  // s3://: the background upload's bandwidth cap; 0: none
  // Not a key: the spec named no dir, so it is the default runs/<name> (what `zenflow submit`
  // tells a coordinator, which may put the job's checkpoints under its --checkpoint-root).
  bool dir_defaulted = false;
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
// SpecError("<yaml>", "line L, column C: <libyaml's message>").
JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides = {},
                       const std::string& base_dir = ".");

// Where a spec is parsed. kRunsHere (parse_job_spec above): checkpoint.dir's rules are
// checked on this machine's file system (symlinks resolved, $HOME, an existing
// non-directory). kRunsElsewhere (the coordinator, which stores and schedules specs that
// workers run): only the lexical ones (not "/", not the spec's directory as written); the
// worker checks the rest where the directory lives. Nothing else differs.
enum class SpecSite { kRunsHere, kRunsElsewhere };
JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                       const std::string& base_dir, SpecSite site);

// Reads the file at `path` with read_regular_file (a FIFO, a device, a directory or a file
// over kMaxSpecBytes is refused at once, never read or waited on) and parses it; relative
// paths in it resolve against the file's directory (made absolute), an absent checkpoint.dir
// is the current directory's runs/<name> (made absolute), and check_spec_paths
// runs on the result. Every problem throws SpecError: the file's own (InputError) as
// SpecError(path, reason), e.g. "/x/job.yaml: is a FIFO, expected a regular file"; YAML
// syntax errors name `path` instead of "<yaml>". (A checkpoint's run.yaml, whose inputs
// may be gone, is read with parse_job_spec instead: see worker/rank/run_export.)
JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides = {});

// Checks that the input paths of `spec` exist and have the right kind, so a typo is a spec
// error naming the key rather than a runtime error after start-up:
//   data.train, data.val (when given)  a regular file or a directory;
//   data.tokenizer (unless "byte")     a regular file, or a directory with tokenizer.json;
//   model.from (when given)            a directory.
// Throws SpecError(key, reason + ": " + absolute path), e.g.
//   "data.train: no such file or directory: /jobs/data/train.txt",
//   "data.tokenizer: is a FIFO, expected a regular file: /jobs/tok".
// Reads only metadata (stat); never opens a file.
void check_spec_paths(const JobSpec& spec);

// Every path the spec reads or writes, with its key, in this order: model.from, data.train,
// data.val, data.tokenizer (unless "byte"), checkpoint.dir, optimizer.host.token_file; the
// empty ones left out. What a
// worker's allowed roots must cover (check_allowed_roots; the coordinator's placement).
std::vector<std::pair<const char*, std::string>> confined_paths(const JobSpec& spec);

// Every confined_paths() entry lies under one of `roots` (common/allowed_roots.h,
// path_within), symlinks resolved: a worker runs specs others wrote, and confines them to
// the directories it was given (zenflow-worker --allowed-root; the agent passes them to its
// ranks in ZENFLOW_ALLOWED_ROOTS, colon-separated). Throws SpecError naming the key, the
// path and the roots; opens nothing. No roots: no rule.
void check_allowed_roots(const JobSpec& spec, const std::vector<std::string>& roots);
// ZENFLOW_ALLOWED_ROOTS split at ':' (empty entries dropped); none when unset.
std::vector<std::string> allowed_roots_from_env();

// The spec as block YAML with every field written out (auto values as "auto", an unset
// cost.usd_per_hour as null, numbers in their shortest exact form; model.arch only when
// arch_given), for job records and logs. parse_job_spec(to_yaml(s)) == s for any spec
// parse_job_spec returned (paths that are still relative, from a relative base_dir or the
// default checkpoint.dir, need base_dir "." the second time).
std::string to_yaml(const JobSpec& spec);

// The job-spec reference: a markdown table with one row per key (its YAML path, type,
// default, bounds and meaning), made from the same field table that parses the spec,
// to_yaml writes and operator== compares. docs/spec.md carries it between its
// "job-spec keys" markers; tests/test_job_spec.cpp checks that the two agree.
std::string job_spec_reference_markdown();

// Field-by-field equality (exact for doubles): every member a key of the spec fills.
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
