// Job spec tests: docs/design.md §6 parsing, defaults, rejection with key paths, --set, paths, to_yaml.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/remove_tree.h"
#include "common/job_spec.h"

namespace zenflow {
namespace {

// The example of docs/design.md §6, verbatim in style (flow maps, comments), with concrete values.
const char* const kDesignSpec = R"(
name: tiny-demo
model:   {arch: llama, from: models/base, config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, tie_word_embeddings: true, rope_theta: 10000.0}}
data:    {train: data/train.txt, val: data/val.txt, format: text, tokenizer: byte}
train:   {steps: 200, micro_batch: 8, grad_accum: 1, seq_len: 128, lr: 3.0e-4,
          schedule: cosine, warmup_steps: 10, weight_decay: 0.0, grad_clip: 1.0, seed: 1}
optimizer:
  mode: zenflow            # zenflow | offload | device
  zenflow: {topk_ratio: 0.1, select_strategy: auto, select_interval: auto,
            update_interval: 4, full_warm_up_rounds: 1, overlap_step: true}
  host:    {threads: auto, reserved_cores: auto, nodes: 0}
resources: {workers: 1, gpus_per_worker: 1, host_memory_gb: auto, priority: 0}
checkpoint: {dir: ./runs/tiny-demo, every_steps: 100, keep: 3}
cost:      {instance_type: p4d.24xlarge}     # price from deploy/pricing catalog, overridable
)";

const char* const kMinimalSpec = "name: m\ndata: {train: corpus.txt}\n";

// Parses `yaml` (+ overrides) and returns the SpecError it must throw.
SpecError expect_rejected(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  try {
    JobSpec spec = parse_job_spec(yaml, overrides, "/base");
    ADD_FAILURE() << "accepted a spec that should be rejected:\n" << yaml;
  } catch (const SpecError& e) {
    return e;
  }
  return SpecError("<accepted>", "");
}

// Asserts the minimal spec plus `extra` (YAML lines) is rejected at `path` with `reason`.
void expect_error(const std::string& yaml, const std::string& path, const std::string& reason,
                  const std::vector<std::string>& overrides = {}) {
  SpecError e = expect_rejected(yaml, overrides);
  EXPECT_EQ(e.path(), path) << e.what();
  EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
      << "'" << e.what() << "' does not contain '" << reason << "'";
  EXPECT_EQ(std::string(e.what()).rfind(path + ": ", 0), 0u) << e.what();
}

TEST(JobSpec, DesignFlowStyleSpecParsesToItsValues) {
  JobSpec s = parse_job_spec(kDesignSpec, {}, "/jobs");
  EXPECT_EQ(s.name, "tiny-demo");
  EXPECT_EQ(s.model.arch, "llama");
  EXPECT_EQ(s.model.from, "/jobs/models/base");
  EXPECT_EQ(s.model.config.size(), 5u);
  EXPECT_EQ(s.model.config.at("hidden_size"), 64);
  EXPECT_EQ(s.model.config.at("num_hidden_layers"), 2);
  EXPECT_EQ(s.model.config.at("num_attention_heads"), 4);
  EXPECT_EQ(s.model.config.at("tie_word_embeddings"), 1);
  EXPECT_EQ(s.model.config.at("rope_theta"), 10000.0);
  EXPECT_EQ(s.data.train, "/jobs/data/train.txt");
  EXPECT_EQ(s.data.val, "/jobs/data/val.txt");
  EXPECT_EQ(s.data.format, "text");
  EXPECT_EQ(s.data.tokenizer, "byte");
  EXPECT_EQ(s.train.steps, 200);
  EXPECT_EQ(s.train.micro_batch, 8);
  EXPECT_EQ(s.train.grad_accum, 1);
  EXPECT_EQ(s.train.seq_len, 128);
  EXPECT_DOUBLE_EQ(s.train.lr, 3.0e-4);
  EXPECT_EQ(s.train.schedule, "cosine");
  EXPECT_EQ(s.train.warmup_steps, 10);
  EXPECT_EQ(s.train.weight_decay, 0.0);
  EXPECT_EQ(s.train.grad_clip, 1.0);
  EXPECT_EQ(s.train.seed, 1u);
  EXPECT_EQ(s.optimizer.mode, "zenflow");
  EXPECT_DOUBLE_EQ(s.optimizer.zenflow.topk_ratio, 0.1);
  EXPECT_EQ(s.optimizer.zenflow.select_strategy, "auto");
  EXPECT_TRUE(s.optimizer.zenflow.select_interval_auto);
  EXPECT_FALSE(s.optimizer.zenflow.update_interval_auto);
  EXPECT_EQ(s.optimizer.zenflow.update_interval, 4);
  EXPECT_EQ(s.optimizer.zenflow.full_warm_up_rounds, 1);
  EXPECT_TRUE(s.optimizer.zenflow.overlap_step);
  EXPECT_TRUE(s.optimizer.host.threads_auto);
  EXPECT_TRUE(s.optimizer.host.reserved_cores_auto);
  EXPECT_TRUE(s.optimizer.host.reserved_cores.empty());
  EXPECT_EQ(s.optimizer.host.nodes, 0);
  EXPECT_EQ(s.resources.workers, 1);
  EXPECT_EQ(s.resources.gpus_per_worker, 1);
  EXPECT_TRUE(s.resources.host_memory_gb_auto);
  EXPECT_EQ(s.resources.priority, 0);
  EXPECT_EQ(s.checkpoint.dir, "/jobs/runs/tiny-demo");
  EXPECT_EQ(s.checkpoint.every_steps, 100);
  EXPECT_EQ(s.checkpoint.keep, 3);
  EXPECT_EQ(s.cost.instance_type, "p4d.24xlarge");
  EXPECT_FALSE(s.cost.usd_per_hour.has_value());
}

TEST(JobSpec, BlockStyleEqualsFlowStyle) {
  const char* block = R"(
name: tiny-demo
model:
  arch: llama
  from: models/base
  config:
    hidden_size: 64
    num_hidden_layers: 2
    num_attention_heads: 4
    tie_word_embeddings: true
    rope_theta: 1e4
data:
  train: data/train.txt
  val: data/val.txt
optimizer:
  zenflow:
    update_interval: 4
checkpoint:
  dir: ./runs/tiny-demo
cost:
  instance_type: p4d.24xlarge
)";
  EXPECT_EQ(parse_job_spec(block, {}, "/jobs"), parse_job_spec(kDesignSpec, {}, "/jobs"));
}

TEST(JobSpec, OmittedKeysTakeTheDefaults) {
  JobSpec s = parse_job_spec(kMinimalSpec, {}, "/base");
  JobSpec d;  // the header's defaults
  EXPECT_EQ(s.model, d.model);
  EXPECT_EQ(s.train, d.train);
  EXPECT_EQ(s.optimizer, d.optimizer);
  EXPECT_EQ(s.resources, d.resources);
  EXPECT_EQ(s.cost, d.cost);
  EXPECT_EQ(s.data.val, "");
  EXPECT_EQ(s.data.format, "text");
  EXPECT_EQ(s.data.tokenizer, "byte");
  EXPECT_EQ(s.data.val_fraction, 0.05);
  // Not beside the spec: runs/<name> of the current directory (load_job_spec makes it absolute).
  EXPECT_EQ(s.checkpoint.dir, "runs/m");
  EXPECT_EQ(s.checkpoint.every_steps, 100);
  EXPECT_EQ(s.checkpoint.keep, 3);
  // Spot-check values the trainer relies on, so a changed default is noticed here.
  EXPECT_EQ(s.train.steps, 200);
  EXPECT_EQ(s.optimizer.mode, "zenflow");
  EXPECT_EQ(s.optimizer.zenflow.importance, "l2");
  EXPECT_EQ(s.optimizer.zenflow.min_split_numel, 4096);
}

TEST(JobSpec, RejectsUnknownTopLevelKey) {
  expect_error(std::string(kMinimalSpec) + "trian: {steps: 5}\n", "trian",
               "unknown key (allowed: name, model, data, train, optimizer, resources, "
               "checkpoint, cost)");
}

TEST(JobSpec, RejectsUnknownNestedKey) {
  expect_error(std::string(kMinimalSpec) + "optimizer: {zenflow: {topk: 0.2}}\n",
               "optimizer.zenflow.topk", "unknown key (allowed: topk_ratio, select_strategy");
}

TEST(JobSpec, RejectsTopkRatioOutOfRangeWithTheDesignMessage) {
  SpecError e =
      expect_rejected(std::string(kMinimalSpec) + "optimizer: {zenflow: {topk_ratio: 1.5}}\n");
  EXPECT_EQ(e.path(), "optimizer.zenflow.topk_ratio");
  EXPECT_STREQ(e.what(), "optimizer.zenflow.topk_ratio: must be in [0, 1], got 1.5");
}

TEST(JobSpec, RejectsNegativeSteps) {
  expect_error(std::string(kMinimalSpec) + "train: {steps: -5}\n", "train.steps",
               "must be in [1, 1000000000], got -5");
}

// train.shard: sharded parameters are gathered again for a recomputing backward, and the
// host state stays in the ranks.
TEST(JobSpec, ShardIsCheckedAgainstTheNodesAndCheckpointing) {
  expect_error(std::string(kMinimalSpec) + "train: {shard: parameters}\noptimizer: {mode: device}\n", "train.shard",
               "'parameters' needs train.activation_checkpointing: true");
  expect_error(std::string(kMinimalSpec) + "train: {shard: gradients}\noptimizer: {mode: offload, host: {nodes: 2}}\n",
               "train.shard", "does not work with remote optimizer nodes");
  expect_error(std::string(kMinimalSpec) + "train: {shard: zero3}\n", "train.shard", "zero3");
  const JobSpec ok = parse_job_spec(std::string(kMinimalSpec) +
                                        "train: {shard: parameters, activation_checkpointing: true}\n"
                                        "optimizer: {mode: offload}\n",
                                    {}, "/base");
  EXPECT_EQ(ok.train.shard, "parameters");
  EXPECT_EQ(parse_job_spec(std::string(kMinimalSpec) + "train: {shard: gradients}\n", {}, "/base").optimizer.mode,
            "zenflow");
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {}, "/base").train.shard, "none");
}

TEST(JobSpec, DeviceStagingIsMebibytesForTheInProcessHostOptimizer) {
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {}, "/base").optimizer.host.device_staging_mib, 0);
  EXPECT_EQ(parse_job_spec(std::string(kMinimalSpec) + "optimizer: {host: {device_staging_mib: 512}}\n", {}, "/base")
                .optimizer.host.device_staging_mib,
            512);
  expect_error(std::string(kMinimalSpec) + "optimizer: {host: {nodes: 2, device_staging_mib: 512}}\n",
               "optimizer.host.device_staging_mib", "remote optimizer nodes");
  expect_error(std::string(kMinimalSpec) + "optimizer: {host: {device_staging_mib: -1}}\n",
               "optimizer.host.device_staging_mib", "-1");
}

TEST(JobSpec, RejectsNonNumericSteps) {
  expect_error(std::string(kMinimalSpec) + "train: {steps: abc}\n", "train.steps",
               "must be an integer, got 'abc'");
}

TEST(JobSpec, RejectsNonIntegralMicroBatch) {
  expect_error(std::string(kMinimalSpec) + "train: {micro_batch: 2.5}\n", "train.micro_batch",
               "must be an integer, got '2.5'");
}

TEST(JobSpec, RejectsUnknownOptimizerMode) {
  expect_error(std::string(kMinimalSpec) + "optimizer: {mode: zero3}\n", "optimizer.mode",
               "must be one of zenflow, offload, device; got 'zero3'");
}

TEST(JobSpec, RejectsUnknownSchedule) {
  expect_error(std::string(kMinimalSpec) + "train: {schedule: exponential}\n", "train.schedule",
               "must be one of cosine, linear, constant");
}

TEST(JobSpec, RejectsSelectIntervalNotAMultipleOfUpdateInterval) {
  const std::string zen =
      "optimizer: {zenflow: {select_strategy: step, select_interval: 6, "
      "update_interval: 4}}\n";
  SpecError e = expect_rejected(std::string(kMinimalSpec) + zen);
  EXPECT_EQ(e.path(), "optimizer.zenflow.select_interval");
  const std::string what = e.what();
  EXPECT_NE(what.find("multiple of update_interval (4)"), std::string::npos) << what;
  EXPECT_NE(what.find("got 6"), std::string::npos) << what;
  // 8 is a multiple of 4; epoch strategy does not constrain S.
  JobSpec ok = parse_job_spec(std::string(kMinimalSpec) +
                              "optimizer: {zenflow: {select_strategy: step, select_interval: 8, "
                              "update_interval: 4}}\n");
  EXPECT_EQ(ok.optimizer.zenflow.select_interval, 8);
  EXPECT_NO_THROW(parse_job_spec(std::string(kMinimalSpec) +
                                 "optimizer: {zenflow: {select_strategy: epoch, "
                                 "select_interval: 3, update_interval: 4}}\n"));
}

TEST(JobSpec, RejectsBadReservedCores) {
  expect_error(std::string(kMinimalSpec) + "optimizer: {host: {reserved_cores: [0, -1]}}\n",
               "optimizer.host.reserved_cores", "core ids must be in [0, 65535], got -1 (item 1)");
  expect_error(std::string(kMinimalSpec) + "optimizer: {host: {reserved_cores: [2, 3, 2]}}\n",
               "optimizer.host.reserved_cores", "core id 2 appears twice");
  expect_error(std::string(kMinimalSpec) + "optimizer: {host: {reserved_cores: 3}}\n",
               "optimizer.host.reserved_cores", "must be \"auto\" or a non-empty list of core ids");
  JobSpec ok =
      parse_job_spec(std::string(kMinimalSpec) + "optimizer: {host: {reserved_cores: [1, 3]}}\n");
  EXPECT_FALSE(ok.optimizer.host.reserved_cores_auto);
  EXPECT_EQ(ok.optimizer.host.reserved_cores, (std::vector<int>{1, 3}));
}

TEST(JobSpec, RejectsYamlSyntaxErrorWithLineAndColumn) {
  SpecError e = expect_rejected("name: x\ntrain: {steps: 5\n");
  EXPECT_EQ(e.path(), "<yaml>");
  EXPECT_NE(std::string(e.what()).find("line "), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("column "), std::string::npos) << e.what();
}

TEST(JobSpec, RejectsMissingTrainData) {
  expect_error("name: m\ndata: {format: text}\n", "data.train", "required");
  expect_error("name: m\n", "data.train", "required");
}

TEST(JobSpec, RejectsMissingOrMalformedName) {
  expect_error("data: {train: x}\n", "name", "required (1 to 128 characters");
  expect_error("name: ''\ndata: {train: x}\n", "name", "must be 1 to 128 characters");
  expect_error("name: my job\ndata: {train: x}\n", "name", "got 'my job'");
}

TEST(JobSpec, RejectsBeta2OfOne) {
  expect_error(std::string(kMinimalSpec) + "optimizer: {beta2: 1}\n", "optimizer.beta2",
               "must be in [0, 1), got 1");
}

TEST(JobSpec, RejectsOtherOutOfRangeAndMistypedValues) {
  const std::string m = kMinimalSpec;
  expect_error(m + "train: {steps: 10, warmup_steps: 11}\n", "train.warmup_steps",
               "must be <= train.steps (10), got 11");
  expect_error(kMinimalSpec, "train.warmup_steps", "must be <= train.steps (5), got 8",
               {"train.steps=5", "train.warmup_steps=8"});
  expect_error(m + "train: {lr: 0}\n", "train.lr", "must be > 0, got 0");
  expect_error(m + "train: {lr: .nan}\n", "train.lr", "must be a finite number");
  expect_error(m + "train: {seq_len: 1}\n", "train.seq_len", "must be in [2, 1048576], got 1");
  expect_error(m + "train: {steps: }\n", "train.steps", "has no value");
  expect_error(m + "train: {device: tpu}\n", "train.device", "must be one of auto, cpu, cuda");
  expect_error("name: m\ndata: {train: x, val_fraction: 0.6}\n", "data.val_fraction",
               "must be in [0, 0.5], got 0.6");
  expect_error("name: m\ndata: {train: x, format: csv}\n", "data.format", "got 'csv'");
  expect_error(m + "model: {arch: bert}\n", "model.arch", "must be one of llama, gpt2");
  expect_error(m + "model: {config: {hidden_size: 64.5}}\n", "model.config.hidden_size",
               "must be an integer");
  expect_error(m + "model: {config: {hidden_layers: 2}}\n", "model.config.hidden_layers",
               "unknown key");
  expect_error(m + "model: {config: {hidden_size: 60, num_attention_heads: 8}}\n",
               "model.config.hidden_size", "multiple of num_attention_heads (8)");
  expect_error(m + "model: {config: {max_position_embeddings: 64}}\ntrain: {seq_len: 128}\n",
               "train.seq_len", "must be <= model.config.max_position_embeddings (64)");
  expect_error(m + "model: [llama]\n", "model", "must be a mapping, got a list");
  expect_error(m + "optimizer: {zenflow: {overlap_step: yes}}\n", "optimizer.zenflow.overlap_step",
               "must be true or false, got 'yes'");
  expect_error(m + "optimizer: {zenflow: {update_interval: 0}}\n",
               "optimizer.zenflow.update_interval", "must be \"auto\" or an integer in [1, 1000000], got 0");
  expect_error(m + "optimizer: {zenflow: {reselect_threshold: 0}}\n",
               "optimizer.zenflow.reselect_threshold", "must be in (0, 1], got 0");
  expect_error(m + "optimizer: {host: {threads: 0}}\n", "optimizer.host.threads",
               "must be \"auto\" or an integer in [1, 4096], got 0");
  expect_error(m + "optimizer: {eps: 0}\n", "optimizer.eps", "must be > 0");
  expect_error(m + "resources: {workers: 0}\n", "resources.workers", "must be in [1, 4096], got 0");
  expect_error(m + "resources: {host_memory_gb: -2}\n", "resources.host_memory_gb",
               "must be in (0, 1048576], got -2");
  expect_error(m + "checkpoint: {keep: 0}\n", "checkpoint.keep", "must be in [1, 1000000], got 0");
  expect_error(m + "cost: {usd_per_hour: -1}\n", "cost.usd_per_hour", "must be >= 0");
  expect_error(m + "train: {steps: 5}\ntrain: {steps: 6}\n", "train", "more than once");
}

TEST(JobSpec, IntegersMayUseExponentNotation) {
  JobSpec s = parse_job_spec(std::string(kMinimalSpec) + "train: {steps: 1e3, seed: +7}\n");
  EXPECT_EQ(s.train.steps, 1000);
  EXPECT_EQ(s.train.seed, 7u);
}

TEST(JobSpec, SetOverridesNestedValuesAndAuto) {
  JobSpec s = parse_job_spec(
      kDesignSpec,
      {"optimizer.zenflow.topk_ratio=0.25", "train.steps=50",
       "optimizer.zenflow.update_interval=auto", "optimizer.host.reserved_cores=[0,1]",
       "optimizer.zenflow.overlap_step=false", "optimizer.mode=offload"},
      "/jobs");
  EXPECT_DOUBLE_EQ(s.optimizer.zenflow.topk_ratio, 0.25);
  EXPECT_EQ(s.train.steps, 50);
  EXPECT_TRUE(s.optimizer.zenflow.update_interval_auto);
  EXPECT_EQ(s.optimizer.host.reserved_cores, (std::vector<int>{0, 1}));
  EXPECT_FALSE(s.optimizer.zenflow.overlap_step);
  EXPECT_EQ(s.optimizer.mode, "offload");
  // Values not overridden stay as written.
  EXPECT_EQ(s.train.micro_batch, 8);
  EXPECT_EQ(s.optimizer.zenflow.select_strategy, "auto");
}

TEST(JobSpec, SetCreatesMissingSectionsAndLaterOverridesWin) {
  JobSpec s = parse_job_spec(
      kMinimalSpec, {"resources.host_memory_gb=48", "train.lr=0.001", "train.lr=0.002"}, "/base");
  EXPECT_FALSE(s.resources.host_memory_gb_auto);
  EXPECT_EQ(s.resources.host_memory_gb, 48);
  EXPECT_EQ(s.train.lr, 0.002);
}

TEST(JobSpec, SetOfUnknownKeyIsRejectedWithItsPath) {
  expect_error(kMinimalSpec, "optimizer.zenflow.top_k", "unknown key",
               {"optimizer.zenflow.top_k=0.2"});
  expect_error(kMinimalSpec, "optimizer.zenflow.topk_ratio", "must be in [0, 1], got 2",
               {"optimizer.zenflow.topk_ratio=2"});
}

TEST(JobSpec, MalformedSetIsRejected) {
  expect_error(kMinimalSpec, "--set", "expected KEY.PATH=VALUE", {"train.steps"});
  expect_error(kMinimalSpec, "--set", "expected KEY.PATH=VALUE", {"train..steps=3"});
  expect_error(kMinimalSpec, "--set", "expected KEY.PATH=VALUE", {"=3"});
  // The offending path is the scalar that the override tried to descend into.
  expect_error(kMinimalSpec, "train.steps", "cannot set 'train.steps.x': not a mapping",
               {"train.steps=4", "train.steps.x=1"});
  expect_error(kMinimalSpec, "train.steps", "cannot parse --set value", {"train.steps=[1,"});
}

TEST(JobSpec, RelativePathsResolveAgainstBaseDir) {
  const std::string yaml = R"(
name: p
model: {from: ../models/m}
data: {train: corpus/, val: /abs/val.txt, tokenizer: tok/tokenizer.json}
checkpoint: {dir: out}
)";
  JobSpec s = parse_job_spec(yaml, {}, "/srv/jobs");
  EXPECT_EQ(s.model.from, "/srv/models/m");
  EXPECT_EQ(s.data.train, "/srv/jobs/corpus/");
  EXPECT_EQ(s.data.val, "/abs/val.txt");
  EXPECT_EQ(s.data.tokenizer, "/srv/jobs/tok/tokenizer.json");
  EXPECT_EQ(s.checkpoint.dir, "/srv/jobs/out");

  JobSpec here = parse_job_spec(yaml, {}, ".");
  EXPECT_EQ(here.data.train, "corpus/");
  EXPECT_EQ(here.checkpoint.dir, "out");
  EXPECT_EQ(here.data.tokenizer, "tok/tokenizer.json");
}

TEST(JobSpec, LoadResolvesAgainstTheFilesDirectoryAndNamesTheFileInErrors) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("zenflow_job_spec_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path good = dir / "job.yaml";
  std::ofstream(good) << kMinimalSpec;
  std::ofstream(dir / "corpus.txt") << "hello\n";
  JobSpec s = load_job_spec(good.string(), {"train.steps=7"});
  EXPECT_EQ(s.data.train, (dir / "corpus.txt").string());
  EXPECT_EQ(s.checkpoint.dir, (fs::current_path() / "runs" / "m").string());
  EXPECT_EQ(s.train.steps, 7);
  EXPECT_EQ(s.train.warmup_steps, 7);  // the default warm-up (10) shrinks to fit

  const fs::path bad = dir / "bad.yaml";
  std::ofstream(bad) << "name: [x\n";
  try {
    load_job_spec(bad.string());
    ADD_FAILURE() << "accepted bad YAML";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.path(), bad.string());
    EXPECT_NE(std::string(e.what()).find("line "), std::string::npos) << e.what();
  }

  const std::string missing = (dir / "missing.yaml").string();
  try {
    load_job_spec(missing);
    ADD_FAILURE() << "accepted a missing file";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.path(), missing);
    EXPECT_STREQ(e.what(), (missing + ": no such file or directory").c_str());
  }
  zenflow::remove_tree(dir);
}

// The checkout's examples/ are shared: a spec without checkpoint.dir trains into the runs/ of
// the directory it is run from, while a directory the spec (or a --set) writes keeps the
// rule of every path, the spec's directory.
TEST(JobSpec, AnAbsentCheckpointDirIsUnderTheCurrentDirectoryAWrittenOneBesideTheSpec) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("zenflow_job_spec_cwd_" + std::to_string(::getpid()));
  zenflow::remove_tree(root);
  fs::create_directories(root / "specs");
  fs::create_directories(root / "here");
  std::ofstream(root / "specs" / "corpus.txt") << "hello\n";
  std::ofstream(root / "specs" / "job.yaml") << kMinimalSpec;
  std::ofstream(root / "specs" / "explicit.yaml") << kMinimalSpec << "checkpoint: {dir: out}\n";
  const fs::path before = fs::current_path();
  fs::current_path(root / "here");
  const fs::path here = fs::current_path();  // symlinks of the temp dir resolved, as the process sees it
  const JobSpec plain = load_job_spec((root / "specs" / "job.yaml").string());
  const JobSpec named = load_job_spec("../specs/job.yaml", {"name=other"});
  const JobSpec written = load_job_spec((root / "specs" / "explicit.yaml").string());
  const JobSpec set = load_job_spec((root / "specs" / "job.yaml").string(), {"checkpoint.dir=out2"});
  fs::current_path(before);
  EXPECT_EQ(plain.checkpoint.dir, (here / "runs" / "m").string());
  EXPECT_EQ(named.checkpoint.dir, (here / "runs" / "other").string());
  EXPECT_EQ(plain.data.train, (root / "specs" / "corpus.txt").string());  // inputs: beside the spec
  EXPECT_EQ(written.checkpoint.dir, (root / "specs" / "out").string());
  EXPECT_EQ(set.checkpoint.dir, (root / "specs" / "out2").string());
  EXPECT_FALSE(fs::exists(root / "specs" / "runs"));  // reading a spec creates nothing
  // The coordinator's parse (base ".") does not resolve the default against its own
  // directory: it stays relative, which a submitted spec may not be (check_absolute).
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {}, ".", SpecSite::kRunsElsewhere).checkpoint.dir, "runs/m");
  // What zenflow submit sends names the directory: the resolved spec reads back the same.
  EXPECT_EQ(parse_job_spec(to_yaml(plain), {}, ".", SpecSite::kRunsElsewhere).checkpoint.dir,
            plain.checkpoint.dir);
  zenflow::remove_tree(root);
}

TEST(JobSpec, ToYamlRoundTripsEveryField) {
  // Every field away from its default, including awkward doubles and strings.
  const std::string yaml = R"(
name: rt.job_1
model: {arch: gpt2, from: "/m dir/x: y", config: {vocab_size: 256, hidden_size: 96,
        num_attention_heads: 6, num_key_value_heads: 2, rms_norm_eps: 1e-6,
        initializer_range: 0.02, tie_word_embeddings: false, max_position_embeddings: 512}}
data: {train: /d/train, val: /d/val, format: jsonl, tokenizer: /t/tokenizer.json, val_fraction: 0.1}
train: {steps: 321, micro_batch: 3, grad_accum: 5, seq_len: 64, lr: 3.0e-4, schedule: linear,
        warmup_steps: 7, min_lr_ratio: 0.3, weight_decay: 0.01, grad_clip: 0, seed: 12345678901,
        eval_every: 25, eval_batches: 2, device: cpu, dtype: bfloat16, compute_threads: 3}
optimizer:
  mode: offload
  beta1: 0.85
  beta2: 0.95
  eps: 1e-10
  zenflow: {topk_ratio: 0.3333333333333333, select_strategy: step, select_interval: 12,
            update_interval: 3, full_warm_up_rounds: 0, overlap_step: false, importance: l1,
            reselect_threshold: 0.8, auto_ratio: 0.95, max_update_interval: 9, min_split_numel: 17}
  host: {threads: 2, reserved_cores: [1, 0], nodes: 2, huge_pages: false}
resources: {workers: 3, gpus_per_worker: 0, host_memory_gb: 12.5, priority: -4, hang_timeout: 45}
checkpoint: {dir: /ck, every_steps: 0, keep: 9}
cost: {instance_type: "yes", usd_per_hour: 32.77}
)";
  JobSpec a = parse_job_spec(yaml, {}, "/base");
  const std::string text = to_yaml(a);
  JobSpec b = parse_job_spec(text, {}, "/elsewhere");
  EXPECT_EQ(a, b) << text;
  EXPECT_EQ(b.cost.instance_type, "yes");
  EXPECT_EQ(b.optimizer.zenflow.topk_ratio, 0.3333333333333333);
  EXPECT_EQ(b.train.seed, 12345678901u);
  EXPECT_EQ(b.model.from, "/m dir/x: y");
  EXPECT_EQ(b.resources.hang_timeout, 45);

  // Defaults and "auto" values survive too, as does a relative base directory.
  JobSpec c = parse_job_spec(kMinimalSpec, {}, "rel/dir");
  const std::string c_text = to_yaml(c);
  EXPECT_NE(c_text.find("select_interval: auto"), std::string::npos) << c_text;
  EXPECT_EQ(parse_job_spec(c_text, {}, "."), c) << c_text;
  // Changing any field changes equality (guards operator== itself).
  JobSpec d = c;
  d.optimizer.zenflow.min_split_numel += 1;
  EXPECT_NE(d, c);
}

// to_yaml writes its own YAML (not yaml-cpp's emitter): every string that YAML could read
// as something else, or that needs quoting or escapes, must read back as itself.
TEST(JobSpec, ToYamlQuotesEveryStringThatNeedsIt) {
  const std::vector<std::string> hostile = {
      "",        "yes",        "No",         "TRUE",       "null",          "~",        "on",
      "-x",      "+1",         ".5",         "12",         "1e3",           "a b",      " lead",
      "trail ",  "k: v",       "x#y",        "# c",        "[a, b]",        "{a: 1}",   "a,b",
      "q\"uote", "back\\slash", "new\nline", "tab\there", "\x01ctl",     "caf\xc3\xa9", "'single'",
      "&anchor", "*alias",     "!tag",       "%dir",       "@at",           "`tick`",   "|",
      ">",       "?",          "-",          "a:b",        "http://x/y?z=1"};
  for (const std::string& v : hostile) {
    JobSpec a = parse_job_spec(kMinimalSpec, {}, "/base");
    a.cost.instance_type = v;
    a.model.from = v.empty() ? "" : "/m/" + v;
    a.optimizer.host.addresses = {"127.0.0.1:4000", "node-2.local:4001"};  // (validated: no hostile ones)
    const std::string text = to_yaml(a);
    JobSpec b;
    try {
      b = parse_job_spec(text, {}, "/elsewhere");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "'" << v << "': " << e.what() << "\n" << text;
      continue;
    }
    EXPECT_EQ(b.cost.instance_type, v) << text;
    EXPECT_EQ(b.model.from, a.model.from) << text;
    EXPECT_EQ(b.optimizer.host.addresses, a.optimizer.host.addresses) << text;
  }
  // Plain where nothing else is possible: the stored spec stays readable.
  JobSpec c = parse_job_spec(kMinimalSpec, {}, "/base");
  const std::string text = to_yaml(c);
  EXPECT_NE(text.find("\n  train: /base/corpus.txt\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\n    select_interval: auto\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  usd_per_hour: ~\n"), std::string::npos) << text;
}

// ---- Hostile input: bounds, names, checkpoint.dir, spec files, input paths, arch ----

namespace fs = std::filesystem;

// A fresh scratch directory, removed at the end of the test.
struct ScratchDir {
  fs::path path;
  explicit ScratchDir(const std::string& tag)
      : path(fs::temp_directory_path() / ("zenflow_job_spec_" + tag + "_" + std::to_string(::getpid()))) {
    zenflow::remove_tree(path);
    fs::create_directories(path);
  }
  ~ScratchDir() { zenflow::remove_tree(path); }
};

// The message of the SpecError parse_job_spec(kMinimalSpec, {override}) throws, or "".
std::string set_error(const std::string& assignment, const std::string& base = "/base") {
  try {
    parse_job_spec(kMinimalSpec, {assignment}, base);
  } catch (const SpecError& e) {
    return e.what();
  }
  return "";
}

TEST(JobSpecBounds, EveryIntegerAcceptsItsBoundAndRejectsOneMore) {
  struct Bound {
    const char* key;
    const char* lo;
    const char* hi;
    const char* above;  // hi + 1
  };
  const Bound bounds[] = {
      {"train.steps", "1", "1000000000", "1000000001"},
      {"train.micro_batch", "1", "65536", "65537"},
      {"train.grad_accum", "1", "65536", "65537"},
      {"train.seq_len", "2", "1048576", "1048577"},
      {"train.eval_every", "0", "1000000000", "1000000001"},
      {"train.eval_batches", "1", "1000000", "1000001"},
      {"train.compute_threads", "0", "4096", "4097"},
      {"train.seed", "0", "9223372036854775807", "9223372036854775808"},
      {"model.config.hidden_size", "1", "131072", "131073"},
      {"model.config.num_hidden_layers", "1", "1024", "1025"},
      {"model.config.num_attention_heads", "1", "4096", "4097"},
      {"model.config.num_key_value_heads", "1", "4096", "4097"},
      {"model.config.intermediate_size", "1", "1048576", "1048577"},
      {"model.config.vocab_size", "1", "16777216", "16777217"},
      {"model.config.max_position_embeddings", "1", "4194304", "4194305"},
      {"optimizer.zenflow.full_warm_up_rounds", "0", "1000000", "1000001"},
      {"optimizer.zenflow.max_update_interval", "1", "1000000", "1000001"},
      {"optimizer.zenflow.min_split_numel", "1", "1099511627776", "1099511627777"},
      {"optimizer.host.nodes", "0", "1024", "1025"},
      {"resources.workers", "1", "4096", "4097"},
      {"resources.gpus_per_worker", "0", "64", "65"},
      {"resources.priority", "-1000000", "1000000", "1000001"},
      {"checkpoint.every_steps", "0", "1000000000", "1000000001"},
      {"checkpoint.keep", "1", "1000000", "1000001"},
  };
  for (const Bound& b : bounds) {
    const std::string key = b.key;
    EXPECT_EQ(set_error(key + "=" + b.hi), "") << key;
    // (max_position_embeddings 1 is below the default seq_len: train.seq_len says so.)
    if (key != "model.config.max_position_embeddings") {
      EXPECT_EQ(set_error(key + "=" + b.lo), "") << key;
    }
    EXPECT_EQ(set_error(key + "=" + b.above),
              key + ": must be in [" + b.lo + ", " + b.hi + "], got " + b.above);
  }
  EXPECT_EQ(set_error("resources.priority=-1000001"),
            "resources.priority: must be in [-1000000, 1000000], got -1000001");
  // The hostile review's values, in the notation it used.
  EXPECT_EQ(set_error("model.config.num_hidden_layers=1e9"),
            "model.config.num_hidden_layers: must be in [1, 1024], got 1e9");
  EXPECT_EQ(set_error("model.config.hidden_size=2e9"),
            "model.config.hidden_size: must be in [1, 131072], got 2e9");
  EXPECT_EQ(set_error("train.grad_accum=1e12"), "train.grad_accum: must be in [1, 65536], got 1e12");
  EXPECT_EQ(set_error("resources.gpus_per_worker=4294967298"),
            "resources.gpus_per_worker: must be in [0, 64], got 4294967298");
  // Beyond int64 is out of range, not "not an integer".
  EXPECT_EQ(set_error("train.steps=1e30"), "train.steps: must be in [1, 1000000000], got 1e30");
  EXPECT_EQ(set_error("train.steps=2.5"), "train.steps: must be an integer, got '2.5'");
  // warmup_steps may reach steps at the largest steps.
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {"train.steps=1e9", "train.warmup_steps=1e9"}).train.warmup_steps,
            1000000000);
}

// resources.hang_timeout: "auto" (the default, 0 in the spec) or whole seconds, at least 30
// (a shorter one would kill healthy attempts during a checkpoint or an evaluation).
// resources.host_memory_gb becomes int64 bytes: 1e300 was accepted, an undefined conversion.
TEST(JobSpecBounds, HostMemoryIsBoundedSoItsBytesFitAnInteger) {
  EXPECT_EQ(set_error("resources.host_memory_gb=1048576"), "");
  EXPECT_EQ(set_error("resources.host_memory_gb=1e300"),
            "resources.host_memory_gb: must be in (0, 1048576], got 1e300");
  EXPECT_EQ(set_error("resources.host_memory_gb=0"), "resources.host_memory_gb: must be in (0, 1048576], got 0");
}

TEST(JobSpecBounds, HangTimeoutIsAutoOrAtLeastThirtySeconds) {
  EXPECT_EQ(set_error("resources.hang_timeout=auto"), "");
  EXPECT_EQ(set_error("resources.hang_timeout=30"), "");
  EXPECT_EQ(set_error("resources.hang_timeout=29"),
            "resources.hang_timeout: must be \"auto\" or an integer in [30, 1000000000], got 29");
  EXPECT_EQ(set_error("resources.hang_timeout=1.5"),
            "resources.hang_timeout: must be \"auto\" or an integer in [30, 1000000000], got '1.5'");
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {}, ".").resources.hang_timeout, 0);
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {"resources.hang_timeout=600"}, ".").resources.hang_timeout, 600);
  EXPECT_NE(to_yaml(parse_job_spec(kMinimalSpec, {}, ".")).find("hang_timeout: auto"), std::string::npos);
}

TEST(JobSpecBounds, AutoIntegersCoreIdsAndListLengthsAreBounded) {
  EXPECT_EQ(set_error("optimizer.zenflow.select_interval=1000000000"), "");
  EXPECT_EQ(set_error("optimizer.zenflow.select_interval=1000000001"),
            "optimizer.zenflow.select_interval: must be \"auto\" or an integer in [1, 1000000000], "
            "got 1000000001");
  EXPECT_EQ(set_error("optimizer.zenflow.update_interval=1000000"), "");
  EXPECT_EQ(set_error("optimizer.zenflow.update_interval=1000001"),
            "optimizer.zenflow.update_interval: must be \"auto\" or an integer in [1, 1000000], got "
            "1000001");
  EXPECT_EQ(set_error("optimizer.host.threads=4096"), "");
  EXPECT_EQ(set_error("optimizer.host.threads=4097"),
            "optimizer.host.threads: must be \"auto\" or an integer in [1, 4096], got 4097");
  EXPECT_EQ(set_error("optimizer.host.threads=1e30"),
            "optimizer.host.threads: must be \"auto\" or an integer in [1, 4096], got 1e30");

  EXPECT_EQ(set_error("optimizer.host.reserved_cores=[65535]"), "");
  EXPECT_EQ(set_error("optimizer.host.reserved_cores=[3, 65536]"),
            "optimizer.host.reserved_cores: core ids must be in [0, 65535], got 65536 (item 1)");
  EXPECT_EQ(set_error("optimizer.host.reserved_cores=[99999999999999999999]"),
            "optimizer.host.reserved_cores: core ids must be in [0, 65535], got "
            "99999999999999999999 (item 0)");
  auto id_list = [](int n) {
    std::string list = "[";
    for (int i = 0; i < n; ++i) list += (i ? "," : "") + std::to_string(i);
    return list + "]";
  };
  EXPECT_EQ(set_error("optimizer.host.reserved_cores=" + id_list(4096)), "");
  EXPECT_EQ(set_error("optimizer.host.reserved_cores=" + id_list(4097)),
            "optimizer.host.reserved_cores: must list at most 4096 core ids, got 4097");
}

TEST(JobSpecBounds, PathsAndInstanceTypeAreBoundedAndLongValuesAreShortenedInMessages) {
  const std::string path4096 = "/" + std::string(4095, 'p');
  EXPECT_EQ(set_error("data.train=" + path4096), "");
  const std::string path4097 = path4096 + "p";
  EXPECT_EQ(set_error("data.train=" + path4097), "data.train: must be at most 4096 bytes, got '/" +
                                                     std::string(63, 'p') + "...' (4097 characters)");
  for (const char* key : {"data.val", "data.tokenizer", "model.from", "checkpoint.dir"}) {
    EXPECT_EQ(set_error(std::string(key) + "=" + path4097)
                  .rfind(std::string(key) + ": must be at most 4096 bytes", 0),
              0u)
        << key;
  }
  EXPECT_EQ(set_error("cost.instance_type=" + std::string(128, 'i')), "");
  EXPECT_EQ(set_error("cost.instance_type=" + std::string(129, 'i')),
            "cost.instance_type: must be at most 128 bytes, got '" + std::string(64, 'i') +
                "...' (129 characters)");
}

TEST(JobSpecName, MustBeASafeIdentifier) {
  const std::string rule =
      "must be 1 to 128 characters: a letter or digit, then letters, digits, '.', '_' or '-'; got ";
  for (const char* bad : {".", "..", "/x", "a/b", "-x", ".x", "_x", "x y", "x\\\\y"}) {
    expect_error("name: \"" + std::string(bad) + "\"\ndata: {train: x}\n", "name", rule);
  }
  SpecError dots = expect_rejected("name: ..\ndata: {train: x}\n");
  EXPECT_STREQ(dots.what(), ("name: " + rule + "'..'").c_str());
  const std::string n128 = "a" + std::string(127, 'b');
  EXPECT_EQ(parse_job_spec("name: " + n128 + "\ndata: {train: x}\n", {}, "/base").name, n128);
  expect_error("name: " + n128 + "c\ndata: {train: x}\n", "name", rule);
  for (const char* good : {"1a", "A.b_c-d", "x..y", "0"}) {
    EXPECT_EQ(parse_job_spec("name: " + std::string(good) + "\ndata: {train: x}\n", {}, "/base").name, good);
  }
  // A huge name is refused with a short message.
  const std::string huge(200000, 'n');
  SpecError e = expect_rejected("name: " + huge + "\ndata: {train: x}\n");
  EXPECT_LT(std::string(e.what()).size(), 300u);
  EXPECT_NE(std::string(e.what()).find("(200000 characters)"), std::string::npos) << e.what();
}

// $HOME set to `home` for the scope.
class ScopedHome {
 public:
  explicit ScopedHome(const fs::path& home) {
    const char* old = std::getenv("HOME");
    had_ = old != nullptr;
    if (had_) saved_ = old;
    ::setenv("HOME", home.c_str(), 1);
  }
  ~ScopedHome() {
    if (had_)
      ::setenv("HOME", saved_.c_str(), 1);
    else
      ::unsetenv("HOME");
  }

 private:
  bool had_ = false;
  std::string saved_;
};

// The error a minimal spec with checkpoint.dir `dir` gets ("" when accepted).
std::string checkpoint_dir_error(const std::string& dir, const std::string& base, SpecSite site) {
  try {
    parse_job_spec(std::string(kMinimalSpec) + "checkpoint: {dir: \"" + dir + "\"}\n", {}, base, site);
  } catch (const SpecError& e) {
    EXPECT_EQ(e.path(), "checkpoint.dir") << e.what();
    return std::string(e.what());
  }
  return std::string();
}

TEST(JobSpecCheckpointDir, RefusesRootHomeTheSpecsDirectoryAndNonDirectories) {
  ScratchDir scratch("ckdir");
  const fs::path base = scratch.path / "jobs";
  const fs::path home = scratch.path / "home";
  fs::create_directories(base);
  fs::create_directories(home);
  const ScopedHome scoped(home);
  auto error = [&](const std::string& dir) { return checkpoint_dir_error(dir, base.string(), SpecSite::kRunsHere); };
  const std::string use = "; use a subdirectory such as runs/m";
  EXPECT_EQ(error("/"), "checkpoint.dir: must not be the root directory (/)" + use);
  EXPECT_EQ(error("/.."), "checkpoint.dir: must not be the root directory (/)" + use);
  EXPECT_EQ(error(home.string()),
            "checkpoint.dir: must not be the home directory (" + home.string() + ")" + use);
  EXPECT_EQ(error(home.string() + "/"),
            "checkpoint.dir: must not be the home directory (" + home.string() + ")" + use);
  EXPECT_EQ(error("../home"), "checkpoint.dir: must not be the home directory (" + home.string() + ")" + use);
  const std::string own =
      "checkpoint.dir: must not be the directory holding the job spec (" + base.string() + ")" + use;
  EXPECT_EQ(error("."), own);
  EXPECT_EQ(error("./"), own);
  EXPECT_EQ(error("sub/.."), own);
  EXPECT_EQ(error(base.string()), own);
  // Through a symbolic link too (weakly_canonical).
  fs::create_directory_symlink(base, scratch.path / "link");
  EXPECT_EQ(error((scratch.path / "link").string()), own);
  // An existing file, a FIFO.
  std::ofstream(base / "notes.txt") << "mine\n";
  EXPECT_EQ(error("notes.txt"),
            "checkpoint.dir: is a regular file, expected a directory: " + (base / "notes.txt").string());
  ASSERT_EQ(::mkfifo((base / "pipe").c_str(), 0600), 0);
  EXPECT_EQ(error("pipe"), "checkpoint.dir: is a FIFO, expected a directory: " + (base / "pipe").string());
  // Subdirectories, existing or not, are fine; so is the parent's other child.
  EXPECT_EQ(error("runs/m"), "");
  fs::create_directories(base / "out");
  EXPECT_EQ(error("out"), "");
  EXPECT_EQ(error(home.string() + "/runs"), "");
  // The default (runs/<name> of the current directory) is never refused.
  EXPECT_EQ(parse_job_spec(kMinimalSpec, {}, base.string()).checkpoint.dir, "runs/m");
  // Through load_job_spec: the spec's directory is the file's.
  std::ofstream(base / "corpus.txt") << "text\n";
  std::ofstream(base / "job.yaml") << kMinimalSpec << "checkpoint: {dir: .}\n";
  try {
    load_job_spec((base / "job.yaml").string());
    ADD_FAILURE() << "checkpoint.dir: . beside the spec was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(std::string(e.what()), own);
  }
}

// Parsed where the spec does not run (the coordinator): the lexical rules hold, the ones
// about this machine's files are the worker's to check (its $HOME, its files).
TEST(JobSpecCheckpointDir, ElsewhereKeepsOnlyTheLexicalRules) {
  ScratchDir scratch("ckdir-elsewhere");
  const fs::path home = scratch.path / "home";
  fs::create_directories(home);
  std::ofstream(scratch.path / "notes.txt") << "mine\n";
  const ScopedHome scoped(home);
  auto error = [](const std::string& dir) { return checkpoint_dir_error(dir, ".", SpecSite::kRunsElsewhere); };
  const std::string use = "; use a subdirectory such as runs/m";
  EXPECT_EQ(error("/"), "checkpoint.dir: must not be the root directory (/)" + use);
  EXPECT_NE(error("//").find("must not be the root directory"), std::string::npos);
  EXPECT_EQ(error("/tmp/.."), "checkpoint.dir: must not be the root directory (/)" + use);
  const std::string own = "checkpoint.dir: must not be the directory holding the job spec (.)" + use;
  EXPECT_EQ(error("."), own);
  EXPECT_EQ(error("./"), own);
  EXPECT_EQ(error("sub/.."), own);
  // This machine's home and files are not the worker's.
  EXPECT_EQ(error(home.string()), "");
  EXPECT_EQ(error((scratch.path / "notes.txt").string()), "");
  EXPECT_EQ(error("runs/m"), "");
  // Here, the same spec is refused.
  EXPECT_NE(checkpoint_dir_error(home.string(), ".", SpecSite::kRunsHere), "");
}

// checkpoint.dir may be a bucket prefix: taken as written (not resolved against the spec's
// directory, not confined to a worker's roots), its syntax checked where it is read; the
// other path keys may not be one yet.
TEST(JobSpecCheckpointDir, AnS3PrefixIsTakenAsWrittenAndCheckedForSyntax) {
  for (SpecSite site : {SpecSite::kRunsHere, SpecSite::kRunsElsewhere}) {
    EXPECT_EQ(checkpoint_dir_error("s3://zf-runs/team/m", "/base", site), "");
    EXPECT_EQ(parse_job_spec(std::string(kMinimalSpec) + "checkpoint: {dir: s3://zf-runs/team/m}\n", {}, "/base", site)
                  .checkpoint.dir,
              "s3://zf-runs/team/m");
    EXPECT_EQ(checkpoint_dir_error("s3://zf-runs", "/base", site),
              "checkpoint.dir: must not be a whole bucket (s3://zf-runs); use a prefix such as s3://zf-runs/runs/m");
    EXPECT_EQ(checkpoint_dir_error("s3://zf-runs/", "/base", site),
              "checkpoint.dir: must not be a whole bucket (s3://zf-runs/); use a prefix such as s3://zf-runs/runs/m");
    EXPECT_EQ(checkpoint_dir_error("s3://ZF_runs/m", "/base", site),
              "checkpoint.dir: 's3://ZF_runs/m': the bucket name 'ZF_runs' is not 3-63 characters of a-z, 0-9, '.' "
              "and '-'");
  }
  // The data, the tokenizer and the model may come from a bucket too, taken as written.
  const JobSpec remote = parse_job_spec(
      "name: m\ndata: {train: s3://zf-data/corpus/, val: s3://zf-data/val.txt, tokenizer: s3://zf-data/tok.json}\n"
      "model: {from: s3://zf-models/llama}\n",
      {}, "/base");
  EXPECT_EQ(remote.data.train, "s3://zf-data/corpus/");
  EXPECT_EQ(remote.data.val, "s3://zf-data/val.txt");
  EXPECT_EQ(remote.data.tokenizer, "s3://zf-data/tok.json");
  EXPECT_EQ(remote.model.from, "s3://zf-models/llama");
  EXPECT_NO_THROW(check_spec_paths(remote));  // checked as the local copies they become
  EXPECT_EQ(expect_rejected("name: m\ndata: {train: s3://Bad_Bucket/x}\n").path(), "data.train");
  const SpecError e = expect_rejected(
      "name: m\ndata: {train: corpus.txt}\noptimizer: {mode: zenflow, host: {token_file: s3://zf-data/token}}\n");
  EXPECT_EQ(e.path(), "optimizer.host.token_file");
  EXPECT_EQ(std::string(e.what()),
            "optimizer.host.token_file: is an s3:// URI; this key takes a local path (got s3://zf-data/token)");
  // A worker's allowed roots confine local paths only.
  const JobSpec spec = parse_job_spec(std::string(kMinimalSpec) + "checkpoint: {dir: s3://zf-runs/m}\n", {}, "/base");
  for (const auto& [key, path] : confined_paths(spec)) EXPECT_NE(std::string(key), "checkpoint.dir") << path;
  EXPECT_NO_THROW(check_allowed_roots(spec, {"/base"}));
}

// Runs `f` on its own thread and waits at most `seconds`: a regression that blocks (a FIFO
// opened for reading) fails the test instead of hanging it. The thread is detached; a
// blocked one dies with the process.
std::string within(double seconds, std::function<std::string()> f) {
  auto result = std::make_shared<std::promise<std::string>>();
  std::future<std::string> done = result->get_future();
  std::thread([result, f = std::move(f)] { result->set_value(f()); }).detach();
  if (done.wait_for(std::chrono::duration<double>(seconds)) != std::future_status::ready) {
    return "<timed out>";
  }
  return done.get();
}

// load_job_spec(path)'s SpecError as "[key path] message" ("" when accepted).
std::string load_error(const std::string& path) {
  try {
    load_job_spec(path);
  } catch (const SpecError& e) {
    return "[" + e.path() + "] " + e.what();
  }
  return "";
}

TEST(JobSpecFile, FifoDeviceDirectoryAndOversizedSpecsAreRefusedAtOnce) {
  ScratchDir scratch("files");
  const std::string fifo = (scratch.path / "job.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(within(10, [=] { return load_error(fifo); }),
            "[" + fifo + "] " + fifo + ": is a FIFO, expected a regular file");
  EXPECT_EQ(within(10, [=] { return load_error("/dev/zero"); }),
            "[/dev/zero] /dev/zero: is a character device, expected a regular file");
  const std::string dir = scratch.path.string();
  EXPECT_EQ(within(10, [=] { return load_error(dir); }),
            "[" + dir + "] " + dir + ": is a directory, expected a regular file");

  std::ofstream(scratch.path / "corpus.txt") << "text\n";
  // Exactly 1 MiB is accepted; one byte more is refused before parsing.
  std::string text = kMinimalSpec;
  text += "#" + std::string((1 << 20) - text.size() - 2, 'x') + "\n";
  ASSERT_EQ(text.size(), 1u << 20);
  const std::string at_limit = (scratch.path / "big.yaml").string();
  std::ofstream(at_limit) << text;
  EXPECT_EQ(within(30, [=] { return load_error(at_limit); }), "");
  const std::string over = (scratch.path / "bigger.yaml").string();
  std::ofstream(over) << text << "\n";
  EXPECT_EQ(within(10, [=] { return load_error(over); }),
            "[" + over + "] " + over + ": is 1.0 MiB, larger than the 1 MiB limit for a job spec");
}

TEST(JobSpecPaths, CheckSpecPathsNamesTheKeyAndTheAbsolutePath) {
  ScratchDir scratch("paths");
  const fs::path d = scratch.path;
  std::ofstream(d / "corpus.txt") << "text\n";
  fs::create_directories(d / "corpus_dir");
  fs::create_directories(d / "model");
  fs::create_directories(d / "tok_dir");
  std::ofstream(d / "tok.json") << "{}";
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  auto error = [&](const std::string& extra) {
    const JobSpec spec = parse_job_spec("name: m\n" + extra, {}, d.string());
    try {
      check_spec_paths(spec);
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string abs = d.string() + "/";
  EXPECT_EQ(error("data: {train: corpus.txt}\n"), "");
  EXPECT_EQ(error("data: {train: corpus_dir, val: corpus.txt, tokenizer: tok.json}\nmodel: {from: model}\n"),
            "");
  EXPECT_EQ(error("data: {train: missing.txt}\n"),
            "data.train: no such file or directory: " + abs + "missing.txt");
  EXPECT_EQ(error("data: {train: fifo}\n"),
            "data.train: is a FIFO, expected a regular file or a directory: " + abs + "fifo");
  EXPECT_EQ(error("data: {train: corpus.txt, val: /dev/null}\n"),
            "data.val: is a character device, expected a regular file or a directory: /dev/null");
  EXPECT_EQ(error("data: {train: corpus.txt, val: nope}\n"),
            "data.val: no such file or directory: " + abs + "nope");
  EXPECT_EQ(error("data: {train: corpus.txt, tokenizer: fifo}\n"),
            "data.tokenizer: is a FIFO, expected a regular file or a directory: " + abs + "fifo");
  EXPECT_EQ(error("data: {train: corpus.txt, tokenizer: tok_dir}\n"),
            "data.tokenizer: no such file or directory: " + abs + "tok_dir/tokenizer.json");
  EXPECT_EQ(error("data: {train: corpus.txt, tokenizer: nope.json}\n"),
            "data.tokenizer: no such file or directory: " + abs + "nope.json");
  EXPECT_EQ(error("data: {train: corpus.txt}\nmodel: {from: corpus.txt}\n"),
            "model.from: is a regular file, expected a directory: " + abs + "corpus.txt");
  EXPECT_EQ(error("data: {train: corpus.txt}\nmodel: {from: gone}\n"),
            "model.from: no such file or directory: " + abs + "gone");
  EXPECT_EQ(error("data: {train: corpus.txt/x}\n"),
            "data.train: a component of the path is not a directory: " + abs + "corpus.txt/x");

  // load_job_spec runs the same checks: a spec error (exit 2), not a runtime error later.
  std::ofstream(d / "job.yaml") << "name: m\ndata: {train: missing.txt}\n";
  try {
    load_job_spec((d / "job.yaml").string());
    ADD_FAILURE() << "a missing data.train was accepted";
  } catch (const SpecError& e) {
    EXPECT_EQ(e.path(), "data.train");
    EXPECT_EQ(std::string(e.what()), "data.train: no such file or directory: " + abs + "missing.txt");
  }
}

TEST(JobSpecFile, ASpecInItsOwnCheckpointDirIsRefusedEvenWhenItLooksLikeZenflowsOutput) {
  // zenflow writes no spec beside its checkpoints (run.yaml lives inside each step
  // directory), so a spec file in checkpoint.dir is always the user's.
  ScratchDir scratch("record");
  const fs::path run = scratch.path / "runs" / "m";
  fs::create_directories(run);
  std::ofstream(scratch.path / "corpus.txt") << "text";
  JobSpec spec = parse_job_spec(std::string(kMinimalSpec) + "checkpoint: {dir: \"" + run.string() + "\"}\n",
                                {}, scratch.path.string());
  std::ofstream(run / "job.yaml") << to_yaml(spec);
  EXPECT_EQ(load_error((run / "job.yaml").string()),
            "[checkpoint.dir] checkpoint.dir: must not be the directory holding the job spec (" +
                run.string() + "); use a subdirectory such as runs/m");
}

// A worker confines the specs it runs to its allowed roots (zenflow-worker --allowed-root):
// every path the spec reads or writes, symlinks resolved, before anything is opened. Before,
// a remote spec's checkpoint.dir: /etc made a worker write /etc/steps.jsonl, and data.train:
// /etc/shadow was read as training data.
TEST(JobSpecPaths, PathsOutsideTheWorkersAllowedRootsAreRefusedNamingTheKey) {
  const fs::path root = fs::temp_directory_path() / ("zenflow-roots-" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "allowed" / "data");
  fs::create_directories(root / "elsewhere");
  fs::create_symlink(root / "elsewhere", root / "allowed" / "escape");  // a way out, inside
  const std::string allowed = (root / "allowed").string();
  auto error = [&](const std::string& set) {
    try {
      JobSpec spec = parse_job_spec(kMinimalSpec,
                                    {"checkpoint.dir=" + allowed + "/ck", "data.train=" + allowed + "/data", set},
                                    "/base", SpecSite::kRunsElsewhere);
      check_allowed_roots(spec, {allowed, "/usr/share/common-licenses"});
    } catch (const SpecError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error("data.train=/usr/share/common-licenses"), "");
  EXPECT_EQ(error("data.train=" + allowed + "/data"), "");
  EXPECT_EQ(error("checkpoint.dir=" + allowed), "") << "the root itself";
  EXPECT_EQ(error("data.train=/etc/shadow"),
            "data.train: /etc/shadow is outside the directories this worker allows (" + allowed +
                ", /usr/share/common-licenses; zenflow-worker --allowed-root)");
  EXPECT_EQ(error("checkpoint.dir=/etc").rfind("checkpoint.dir: /etc is outside", 0), 0u);
  EXPECT_EQ(error("checkpoint.dir=" + allowed + "/../elsewhere/ck").rfind("checkpoint.dir: ", 0), 0u);
  const std::string escaped = error("checkpoint.dir=" + allowed + "/escape/ck");
  EXPECT_NE(escaped.find("(" + (root / "elsewhere" / "ck").string() + ") is outside"), std::string::npos) << escaped;
  EXPECT_EQ(error("data.train=" + allowed + "x/data").rfind("data.train: ", 0), 0u) << "a sibling with the prefix";
  EXPECT_EQ(error("optimizer.host.token_file=/etc/shadow").rfind("optimizer.host.token_file: /etc/shadow is outside", 0),
            0u)
      << "the node token is read by the rank like any other file";
  EXPECT_EQ(error("optimizer.host.token_file=" + allowed + "/node.token"), "");
  // Through the environment the agent sets, load_job_spec applies it before checking paths.
  const fs::path spec_file = root / "allowed" / "job.yaml";
  std::ofstream(spec_file) << kMinimalSpec << "checkpoint: {dir: /etc}\n";
  ::setenv("ZENFLOW_ALLOWED_ROOTS", (allowed + "::/usr/share/common-licenses").c_str(), 1);
  std::string loaded;
  try {
    load_job_spec(spec_file.string(), {});
  } catch (const SpecError& e) {
    loaded = e.what();
  }
  ::unsetenv("ZENFLOW_ALLOWED_ROOTS");
  EXPECT_EQ(loaded.rfind("checkpoint.dir: /etc is outside", 0), 0u) << loaded;
  fs::remove_all(root);
}

TEST(JobSpecArch, ArchGivenRecordsWhetherArchDecidesAndRoundTrips) {
  JobSpec from_only = parse_job_spec("name: m\nmodel: {from: /models/x}\ndata: {train: t}\n", {}, "/base");
  EXPECT_FALSE(from_only.model.arch_given);
  JobSpec from_and_arch =
      parse_job_spec("name: m\nmodel: {arch: gpt2, from: /models/x}\ndata: {train: t}\n", {}, "/base");
  EXPECT_TRUE(from_and_arch.model.arch_given);
  EXPECT_EQ(from_and_arch.model.arch, "gpt2");
  JobSpec random_init = parse_job_spec(kMinimalSpec, {}, "/base");
  EXPECT_TRUE(random_init.model.arch_given);  // without from, arch always decides
  EXPECT_EQ(random_init.model, ModelSpec{});

  const std::string t1 = to_yaml(from_only);
  EXPECT_EQ(t1.find("arch:"), std::string::npos) << t1;
  // Read back with base "." (the default checkpoint.dir, runs/m, is relative: job_spec.h).
  EXPECT_EQ(parse_job_spec(t1, {}, "."), from_only) << t1;
  const std::string t2 = to_yaml(from_and_arch);
  EXPECT_NE(t2.find("arch: gpt2"), std::string::npos) << t2;
  EXPECT_EQ(parse_job_spec(t2, {}, "."), from_and_arch) << t2;
  EXPECT_NE(to_yaml(random_init).find("arch: llama"), std::string::npos);

  JobSpec other = from_only;
  other.model.arch_given = true;
  EXPECT_NE(other, from_only);
}

// docs/spec.md carries job_spec_reference_markdown(), the table made from the rows that parse
// specs: a key added to the field table without its documentation, or a documented key that
// is gone, fails here. ZENFLOW_WRITE_SPEC_DOC=1 rewrites the table in docs/spec.md instead.
TEST(JobSpecReference, DocsSpecMdCarriesTheTableTheFieldTableMakes) {
  const std::filesystem::path doc = std::filesystem::path(ZENFLOW_SOURCE_DIR) / "docs" / "spec.md";
  std::ifstream in(doc, std::ios::binary);
  ASSERT_TRUE(in) << doc;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin_marker = "<!-- BEGIN job-spec keys", end_marker = "<!-- END job-spec keys -->";
  const size_t comment = text.find(begin_marker);
  ASSERT_NE(comment, std::string::npos) << doc << " lacks " << begin_marker;
  const size_t begin = text.find("-->", comment) + 4;
  const size_t end = text.find(end_marker, begin);
  ASSERT_NE(end, std::string::npos) << doc << " lacks " << end_marker;
  const std::string table = job_spec_reference_markdown();
  if (std::getenv("ZENFLOW_WRITE_SPEC_DOC")) {
    std::ofstream(doc, std::ios::binary) << text.substr(0, begin) << table << text.substr(end);
    GTEST_SKIP() << "wrote " << doc;
  }
  // The first line that differs, rather than both tables whole.
  std::istringstream committed(text.substr(begin, end - begin)), made(table);
  std::string doc_line, row;
  for (int line = 1;; ++line) {
    const bool in_doc = static_cast<bool>(std::getline(committed, doc_line));
    const bool in_rows = static_cast<bool>(std::getline(made, row));
    if (!in_doc && !in_rows) break;
    if (!in_doc) doc_line = "(end of the table)";
    if (!in_rows) row = "(end of the table)";
    if (doc_line != row) {
      ADD_FAILURE() << "docs/spec.md's key table, line " << line << ":\n  docs/spec.md:  " << doc_line
                    << "\n  common/job_spec.cpp's rows make: " << row
                    << "\nregenerate it with ZENFLOW_WRITE_SPEC_DOC=1 build/bin/test_job_spec "
                       "--gtest_filter='JobSpecReference.*'";
      break;
    }
  }
}

// Each key a full spec writes back (to_yaml) has exactly one row, and each row is such a key:
// the reference walks the same rows as the parser and the writer.
TEST(JobSpecReference, HasOneRowPerKeyThatToYamlWrites) {
  // Every model.config key, and token_file, which to_yaml leaves out when empty.
  JobSpec spec = parse_job_spec(kDesignSpec,
                                {"model.config={hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, "
                                 "num_key_value_heads: 2, intermediate_size: 128, vocab_size: 256, "
                                 "max_position_embeddings: 128, rope_theta: 10000, rms_norm_eps: 1e-5, "
                                 "initializer_range: 0.02, tie_word_embeddings: true}",
                                 "optimizer.host.token_file=tok"},
                                "/base");
  std::vector<std::string> written;  // "section.key" for every scalar line of to_yaml
  std::vector<std::string> path;
  std::istringstream yaml(to_yaml(spec));
  for (std::string line; std::getline(yaml, line);) {
    const size_t indent = line.find_first_not_of(' ');
    const size_t colon = line.find(':');
    path.resize(indent / 2);
    const std::string key = line.substr(indent, colon - indent);
    if (colon + 1 == line.size()) {
      path.push_back(key);
      continue;
    }
    std::string full;
    for (const std::string& p : path) full += p + ".";
    written.push_back(full + key);
  }
  std::vector<std::string> rows;  // the first cell of each row of the table, unquoted
  std::istringstream table(job_spec_reference_markdown());
  for (std::string line; std::getline(table, line);) {
    if (line.rfind("| `", 0) == 0) rows.push_back(line.substr(3, line.find('`', 3) - 3));
  }
  std::sort(rows.begin(), rows.end());  // to_yaml writes model.config in name order
  std::sort(written.begin(), written.end());
  EXPECT_EQ(rows, written);
  // One row as a reader sees it: type, default, bounds, meaning.
  const std::string reference = job_spec_reference_markdown();
  EXPECT_NE(reference.find("| `optimizer.zenflow.update_interval` | integer or auto | `4` | [1, 1000000] | "),
            std::string::npos);
  EXPECT_NE(reference.find("| `data.train` | path | required | at most 4096 bytes | "), std::string::npos);
  EXPECT_NE(reference.find("| `resources.hang_timeout` | integer or auto | `auto` | [30, 1000000000] | "),
            std::string::npos);
}

}  // namespace
}  // namespace zenflow
