// Job spec tests: DESIGN.md §6 parsing, defaults, rejection with key paths, --set, paths, to_yaml.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "common/job_spec.h"

namespace zenflow {
namespace {

// DESIGN.md §6, verbatim in style (flow maps, comments), with concrete values.
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
  EXPECT_EQ(s.checkpoint.dir, "/base/runs/m");
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
               "must be >= 1, got -5");
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
               "optimizer.host.reserved_cores", "core ids must be >= 0, got -1");
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
  expect_error("data: {train: x}\n", "name", "required");
  expect_error("name: ''\ndata: {train: x}\n", "name", "must be non-empty");
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
  expect_error(m + "train: {seq_len: 1}\n", "train.seq_len", "must be >= 2, got 1");
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
               "optimizer.zenflow.update_interval", "must be \"auto\" or an integer >= 1");
  expect_error(m + "optimizer: {zenflow: {reselect_threshold: 0}}\n",
               "optimizer.zenflow.reselect_threshold", "must be in (0, 1], got 0");
  expect_error(m + "optimizer: {host: {threads: 0}}\n", "optimizer.host.threads",
               "must be \"auto\" or an integer >= 1, got 0");
  expect_error(m + "optimizer: {eps: 0}\n", "optimizer.eps", "must be > 0");
  expect_error(m + "resources: {workers: 0}\n", "resources.workers", "must be >= 1");
  expect_error(m + "resources: {host_memory_gb: -2}\n", "resources.host_memory_gb",
               "must be > 0, got -2");
  expect_error(m + "checkpoint: {keep: 0}\n", "checkpoint.keep", "must be >= 1");
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
  JobSpec s = load_job_spec(good.string(), {"train.steps=7"});
  EXPECT_EQ(s.data.train, (dir / "corpus.txt").string());
  EXPECT_EQ(s.checkpoint.dir, (dir / "runs" / "m").string());
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
    EXPECT_STREQ(e.what(), (missing + ": cannot read file").c_str());
  }
  zenflow::remove_tree(dir);
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
resources: {workers: 3, gpus_per_worker: 0, host_memory_gb: 12.5, priority: -4}
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

}  // namespace
}  // namespace zenflow
