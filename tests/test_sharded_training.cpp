// Sharded data-parallel training (train.shard: gradients | parameters, ZeRO-2/3 style) through
// `zenflow run --nproc N` (Gloo on 127.0.0.1): every rank keeps only its rows of the gradients
// and optimizer state (gradients) or of the weights too (parameters), yet the weights after
// ten steps equal the unsharded run of as many ranks within float rounding, rank 0 holds
// about 1/N of them, and the checkpoints are in the one-rank format, so they resume under any
// shard setting and rank count.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/remove_tree.h"
#include "tests/support/killed_rank.h"
#include "tests/support/ranks.h"
#include "tests/support/shell.h"
#include "tests/support/zenflow_run.h"
#include "worker/model/safetensors.h"

namespace fs = std::filesystem;

namespace {

// Two decoder layers, so one gathered unit (the embedding, a layer, the head) is a fraction
// of the model. Activation checkpointing is on in every run: train.shard: parameters needs
// it, and with it on everywhere sharding is the only difference between the runs compared.
// AdamW's eps is 1e-3 (of the order of the gradients), so that an update depends on the
// gradient's scale: a reduce-scatter that summed instead of averaging changes the weights.
std::string spec_text(const std::string& mode, const std::string& ckpt, int micro_batch, const std::string& shard,
                      bool activation_checkpointing = true, const std::string& zen = "update_interval: 1",
                      const std::string& grad_clip = "1.0") {
  return "name: shard\n"
         "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
         "intermediate_size: 64, max_position_embeddings: 32}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: 10, micro_batch: " + std::to_string(micro_batch) +
         ", seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu, compute_threads: 1, grad_clip: " + grad_clip + ", "
         "activation_checkpointing: " + (activation_checkpointing ? "true" : "false") + ", shard: " + shard + "}\n"
         "optimizer: {mode: " + mode + ", eps: 1.0e-3, zenflow: {" + zen + ", min_split_numel: 512}, host: {threads: 1}}\n"
         "checkpoint: {every_steps: 0, dir: " + ckpt + "}\n";
}

using zenflow::test_support::run_json;

// A fresh temporary directory for one test, named after it and this process.
fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("zenflow-shard-" + name + "-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

fs::path step_dir(const fs::path& ckpt, int step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08d", step);
  return ckpt / buf;
}

// Expects every tensor of the two model.safetensors files (same names) within `tol` of each
// other, relative to the tensor's norm (Adam normalises updates, so elements whose gradient
// is ~0 amplify reduction-order rounding); returns the worst relative difference.
double expect_models_close(const fs::path& got_file, const fs::path& want_file, double tol, const std::string& what) {
  zenflow::model::SafetensorsFile got(got_file.string()), want(want_file.string());
  EXPECT_EQ(got.names(), want.names()) << what;
  if (got.names() != want.names()) return INFINITY;
  double worst = 0;
  for (const auto& name : want.names()) {
    const at::Tensor x = got.tensor(name), y = want.tensor(name);
    EXPECT_EQ(x.sizes(), y.sizes()) << what << ": " << name;
    if (x.sizes() != y.sizes()) return INFINITY;
    const double err = (x - y).norm().item<double>() / y.norm().item<double>();
    EXPECT_LE(err, tol) << what << ": " << name;
    worst = std::max(worst, std::isnan(err) ? INFINITY : err);
  }
  return worst;
}

// Expects `got` and `want` the same length and within `tol` relative at every step (step
// numbers from `first_step`); returns the worst relative difference.
double expect_losses_close(const nlohmann::json& got_json, const nlohmann::json& want_json, double tol,
                           int first_step, const std::string& what) {
  const auto got = got_json.get<std::vector<double>>(), want = want_json.get<std::vector<double>>();
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
    EXPECT_LE(rel, tol) << what << ": step " << first_step + static_cast<int>(i) << " " << got[i] << " vs "
                        << want[i];
    worst = std::max(worst, std::isnan(rel) ? INFINITY : rel);
  }
  return worst;
}

// A checkpoint in the one-rank format: the full weights and the whole optimizer state, no
// per-rank engine shards.
void expect_one_rank_format(const fs::path& step, const std::string& what) {
  EXPECT_TRUE(fs::exists(step / "model.safetensors")) << what;
  EXPECT_TRUE(fs::exists(step / "engine.safetensors")) << what;
  EXPECT_FALSE(fs::exists(step / "engine-rank-00001.safetensors")) << what;
}

// The losses of steps `first_step`.. of a run that started at step 0.
nlohmann::json losses_from(const nlohmann::json& summary, int first_step) {
  const auto all = summary["losses"].get<std::vector<double>>();
  const size_t from = std::min(all.size(), static_cast<size_t>(first_step - 1));
  return nlohmann::json(std::vector<double>(all.begin() + static_cast<std::ptrdiff_t>(from), all.end()));
}

double bytes_of(const nlohmann::json& summary, const char* kind) {
  return summary["device_memory_bytes"][kind].get<double>();
}

// ---------------------------------------------------------------------------------------
// (a) Sharded vs unsharded, same ranks: the same weights and losses step by step.

struct ShardCase {
  const char* name;
  int ranks;
  const char* mode;
  // 0: no clipping, so the updates see the gradients' scale (the mean over ranks); a tiny
  // clip is active at every step, so the updates see the global norm (every rank's shards).
  const char* grad_clip;
};

void PrintTo(const ShardCase& c, std::ostream* os) { *os << c.name; }

class ShardedTrainingMatchesUnsharded : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ShardedTrainingMatchesUnsharded, GradientsAndParametersShardsEqualShardNoneAfterTenSteps) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const ShardCase c = GetParam();
  const fs::path dir = fresh_dir(c.name);
  const char* shards[] = {"none", "gradients", "parameters"};
  nlohmann::json runs[3];
  for (int s = 0; s < 3; ++s) {
    const std::string spec = (dir / (std::string(shards[s]) + ".yaml")).string();
    std::ofstream(spec) << spec_text(c.mode, (dir / shards[s]).string(), 2, shards[s], true, "update_interval: 1",
                                     c.grad_clip);
    runs[s] = run_json(spec, c.ranks, "--no-resume");
    ASSERT_EQ(runs[s]["exit"], 0) << shards[s] << ": " << runs[s]["stderr"];
    EXPECT_EQ(runs[s]["shard"], shards[s]);
    EXPECT_EQ(runs[s]["world_size"], c.ranks);
    ASSERT_EQ(runs[s]["losses"].size(), 10u) << shards[s];
  }
  EXPECT_EQ(runs[0]["shard_gathered_peak_bytes"].get<double>(), 0);  // nothing gathered unsharded
  EXPECT_GT(runs[2]["shard_gathered_peak_bytes"].get<double>(), 0);   // parameters: every unit is gathered
  const fs::path none_step = step_dir(dir / "none", 10);
  // The unsharded run of several ranks writes one engine shard per rank; the sharded runs the
  // one-rank format.
  EXPECT_TRUE(fs::exists(none_step / "engine-rank-00001.safetensors"));
  double worst_w = 0, worst_l = 0;
  for (int s = 1; s < 3; ++s) {
    const std::string what = std::string(shards[s]) + " vs none";
    expect_one_rank_format(step_dir(dir / shards[s], 10), what);
    worst_w = std::max(worst_w, expect_models_close(step_dir(dir / shards[s], 10) / "model.safetensors",
                                                    none_step / "model.safetensors", 1e-6, what));
    worst_l = std::max(worst_l, expect_losses_close(runs[s]["losses"], runs[0]["losses"], 1e-6, 1, what));
  }
  std::printf("[figure] %d ranks %s: shard gradients/parameters vs none after 10 steps: worst weight %.3g, "
              "worst loss %.3g (relative)\n",
              c.ranks, c.mode, worst_w, worst_l);
  if (c.ranks == 2 && std::string(c.mode) == "device") {
    // 1 rank with twice the micro-batch: the same global batch, the same data order.
    const std::string spec = (dir / "one.yaml").string();
    std::ofstream(spec) << spec_text(c.mode, (dir / "one").string(), 4, "none", true, "update_interval: 1", c.grad_clip);
    const nlohmann::json one = run_json(spec, 1, "--no-resume");
    ASSERT_EQ(one["exit"], 0) << one["stderr"];
    EXPECT_EQ(one["world_size"], 1);
    const fs::path one_step = step_dir(dir / "one", 10);
    double worst = 0;
    for (int s = 1; s < 3; ++s) {
      const std::string what = std::string(shards[s]) + " on 2 ranks vs 1 rank of micro_batch 4";
      worst = std::max(worst, expect_models_close(step_dir(dir / shards[s], 10) / "model.safetensors",
                                                  one_step / "model.safetensors", 1e-5, what));
      expect_losses_close(runs[s]["losses"], one["losses"], 1e-5, 1, what);
      // engine.safetensors holds the whole optimizer state: the names and shapes of 1 rank's.
      zenflow::model::SafetensorsFile got((step_dir(dir / shards[s], 10) / "engine.safetensors").string());
      zenflow::model::SafetensorsFile want((one_step / "engine.safetensors").string());
      ASSERT_EQ(got.names(), want.names()) << what;
      for (const auto& name : want.names())
        EXPECT_EQ(got.tensor(name).sizes(), want.tensor(name).sizes()) << what << ": engine tensor " << name;
    }
    std::printf("[figure] 2 ranks sharded vs 1 rank of micro_batch 4 after 10 steps: worst weight %.3g\n", worst);
  }
  zenflow::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(RanksModes, ShardedTrainingMatchesUnsharded,
                         ::testing::Values(ShardCase{"ranks2_device", 2, "device", "0.0"},
                                           ShardCase{"ranks2_offload", 2, "offload", "0.0"},
                                           ShardCase{"ranks4_device", 4, "device", "1.0e-3"},
                                           ShardCase{"ranks4_offload", 4, "offload", "1.0e-3"}),
                         [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------
// (b) What rank 0 holds.

// 4 ranks sharding parameters: rank 0's weights and gradients are a quarter of the 1-rank
// run's plus the gathered units; sharding gradients: a quarter of the gradients (plus at
// most one row per tensor: even_shards gives the first rows % 4 ranks one row more), with
// the full weights kept.
TEST(ShardedTraining, RankZeroHoldsAQuarterOfTheModelOnFourRanks) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fresh_dir("memory");
  const std::string two_steps = "--no-resume --set train.steps=2";
  const std::string one_spec = (dir / "one.yaml").string(), params_spec = (dir / "params.yaml").string(),
                    grads_spec = (dir / "grads.yaml").string();
  std::ofstream(one_spec) << spec_text("device", (dir / "one").string(), 2, "none");
  std::ofstream(params_spec) << spec_text("device", (dir / "params").string(), 2, "parameters");
  std::ofstream(grads_spec) << spec_text("device", (dir / "grads").string(), 2, "gradients");
  const nlohmann::json one = run_json(one_spec, 1, two_steps);
  ASSERT_EQ(one["exit"], 0) << one["stderr"];
  const nlohmann::json params = run_json(params_spec, 4, two_steps);
  ASSERT_EQ(params["exit"], 0) << params["stderr"];
  const nlohmann::json grads = run_json(grads_spec, 4, two_steps);
  ASSERT_EQ(grads["exit"], 0) << grads["stderr"];
  EXPECT_EQ(params["shard"], "parameters");
  EXPECT_EQ(grads["shard"], "gradients");
  EXPECT_EQ(params["world_size"], 4);
  EXPECT_EQ(grads["world_size"], 4);

  const double full_p = bytes_of(one, "parameters"), full_g = bytes_of(one, "gradients");
  ASSERT_GT(full_p, 0);
  ASSERT_GT(full_g, 0);
  EXPECT_EQ(one["shard_gathered_peak_bytes"].get<double>(), 0);

  // Uneven shards: one row of every tensor is the slack (even_shards gives the first rows % 4
  // ranks one row more).
  zenflow::model::SafetensorsFile model((step_dir(dir / "one", 2) / "model.safetensors").string());
  double row_slack = 0;
  for (const auto& name : model.names()) {
    const at::Tensor t = model.tensor(name);
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    row_slack += static_cast<double>(t.numel() / std::max<int64_t>(1, rows)) *
                 static_cast<double>(std::max<int64_t>(4, static_cast<int64_t>(t.element_size())));
  }

  // shard: parameters. The shards are a quarter; the gathered units (the one running, the
  // next one prefetched, their flat buffers) are communication buffers, never the whole model.
  const double p = bytes_of(params, "parameters"), g = bytes_of(params, "gradients");
  const double gathered = params["shard_gathered_peak_bytes"].get<double>();
  EXPECT_GT(gathered, 0);
  EXPECT_LT(gathered, full_p);
  EXPECT_GE(bytes_of(params, "communication_buffers"), gathered);
  const double bound = (full_p + full_g) / 4 + 2 * row_slack;
  EXPECT_LE(p + g, bound);
  std::printf("[figure] 4 ranks shard parameters: rank 0 holds %.0f B of weights + gradients (bound %.0f B = "
              "1-rank unsharded %.0f B / 4 + a row per tensor each), gathered peak %.0f B\n",
              p + g, bound, full_p + full_g, gathered);

  // shard: gradients.
  const double gg = bytes_of(grads, "gradients"), gp = bytes_of(grads, "parameters");
  EXPECT_GT(gg, 0);
  EXPECT_LE(gg, full_g / 4 + row_slack);
  EXPECT_GE(gp, full_p);  // the full weights (and the updated shard) stay on every rank
  std::printf("[figure] 4 ranks shard gradients: rank 0 holds %.0f B of gradients (bound %.0f B = 1-rank %.0f B / 4 "
              "+ one row per tensor %.0f B); weights %.0f B vs 1-rank %.0f B\n",
              gg, full_g / 4 + row_slack, full_g, row_slack, gp, full_p);
  zenflow::remove_tree(dir);
}

// ---------------------------------------------------------------------------------------
// (c) Checkpoints resume across shard settings and rank counts (the global batch kept:
// micro_batch x ranks = 8 or 4). Steps 1-5 on one setting, 6-10 on another, against the
// uninterrupted run of the second setting: the same weights and losses within float
// rounding (1e-5 where the rank count changes, as N ranks vs 1 rank of N x the micro-batch).

// One setting of a run: its ranks, micro-batch and train.shard.
struct Leg {
  int ranks;
  int micro_batch;
  const char* shard;
};

std::string describe(const Leg& l) {
  return std::to_string(l.ranks) + " rank(s) shard " + l.shard;
}

// Steps 1-5 as `first`, resumed as `then` for steps 6-10, against `then` run straight
// through: losses 6-10 and the final weights within `tol`. The first run goes on to step 10
// and its step-10 checkpoint is removed, so the step-5 checkpoint is a periodic one (a run
// that ended at step 5 would have closed zenflow's open window early).
void expect_resume_matches(const std::string& name, const Leg& first, const Leg& then, double tol,
                           const std::string& mode = "device", const std::string& zen = "update_interval: 1") {
  const fs::path dir = fresh_dir(name);
  const std::string constant = "--set train.schedule=constant";
  const std::string spec = (dir / "job.yaml").string(), straight_spec = (dir / "straight.yaml").string();
  std::ofstream(spec) << spec_text(mode, (dir / "ckpt").string(), first.micro_batch, first.shard, true, zen);
  std::ofstream(straight_spec) << spec_text(mode, (dir / "straight").string(), then.micro_batch, then.shard, true,
                                            zen);
  const nlohmann::json head =
      run_json(spec, first.ranks, "--no-resume --set checkpoint.every_steps=5 --set checkpoint.keep=10 " + constant);
  ASSERT_EQ(head["exit"], 0) << head["stderr"];
  zenflow::remove_tree(step_dir(dir / "ckpt", 10));
  if (std::string(first.shard) != "none" || first.ranks == 1)
    expect_one_rank_format(step_dir(dir / "ckpt", 5), describe(first) + ", step 5");
  const nlohmann::json resumed =
      run_json(spec, then.ranks,
               constant + " --set train.shard=" + then.shard + " --set train.micro_batch=" +
                   std::to_string(then.micro_batch));
  ASSERT_EQ(resumed["exit"], 0) << resumed["stderr"];
  EXPECT_EQ(resumed["start_step"], 5);
  EXPECT_EQ(resumed["world_size"], then.ranks);
  EXPECT_EQ(resumed["shard"], then.shard);
  const nlohmann::json straight = run_json(straight_spec, then.ranks, "--no-resume " + constant);
  ASSERT_EQ(straight["exit"], 0) << straight["stderr"];
  ASSERT_EQ(straight["losses"].size(), 10u);
  ASSERT_EQ(resumed["losses"].size(), 5u);
  const std::string what = describe(first) + " (1-5) then " + describe(then) + " (6-10) vs " + describe(then);
  const double wl = expect_losses_close(resumed["losses"], losses_from(straight, 6), tol, 6, what);
  const double ww = expect_models_close(step_dir(dir / "ckpt", 10) / "model.safetensors",
                                        step_dir(dir / "straight", 10) / "model.safetensors", tol, what);
  std::printf("[figure] %s: worst loss %.3g, worst weight %.3g\n", what.c_str(), wl, ww);
  zenflow::remove_tree(dir);
}

TEST(ShardedTraining, FourRankParameterShardedCheckpointResumesOnOneUnshardedRank) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  expect_resume_matches("resume-4to1", {4, 2, "parameters"}, {1, 8, "none"}, 1e-5);
}

TEST(ShardedTraining, OneRankCheckpointResumesOnFourRanksShardingParameters) {
  REQUIRE_GLOO();
  expect_resume_matches("resume-1to4", {1, 8, "none"}, {4, 2, "parameters"}, 1e-5);
}

// Same ranks throughout: sharding is the only difference, float rounding the only effect.
TEST(ShardedTraining, TwoRankParameterShardedCheckpointResumesUnshardedOnTwoRanks) {
  REQUIRE_GLOO();
  expect_resume_matches("resume-2to2", {2, 2, "parameters"}, {2, 2, "none"}, 1e-6);
}

// An unsharded 2-rank offload checkpoint holds each rank's host columns (engine-rank-*): a
// sharded run merges them into the one-rank state before taking its rows.
TEST(ShardedTraining, UnshardedTwoRankOffloadCheckpointResumesShardingParameters) {
  REQUIRE_GLOO();
  expect_resume_matches("resume-offload", {2, 2, "none"}, {2, 2, "parameters"}, 1e-6, "offload");
}

// zenflow with windows of 4 and overlap, checkpointed at step 5: mid-window (accumulators
// held), a host step in flight, host columns partitioned by rank. Resumed sharding
// gradients, it continues as the sharded run would have.
TEST(ShardedTraining, UnshardedZenflowCheckpointMidWindowResumesShardingGradients) {
  REQUIRE_GLOO();
  expect_resume_matches("resume-zenflow", {2, 2, "none"}, {2, 2, "gradients"}, 1e-6, "zenflow",
                        "update_interval: 4, overlap_step: true, full_warm_up_rounds: 1, topk_ratio: 0.25");
}

// ---------------------------------------------------------------------------------------
// (d) Kill one rank of a running `zenflow run --nproc 2` sharding parameters (the ranks
// gather every unit's weights for its forward and backward): the job fails fast, naming it.
TEST(ShardedTraining, KilledRankWhileShardedFailsTheJobNamingIt) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fresh_dir("kill");
  zenflow::test_support::expect_killed_rank_fails_the_job(spec_text("device", (dir / "ckpt").string(), 2, "parameters"), dir);
  zenflow::remove_tree(dir);
}

// ---------------------------------------------------------------------------------------
// (e) zenflow on shards, and the spec's rules.

// The `split/<name>/sel` tensors (zenflow's selected columns of each split matrix) of a
// step's engine.safetensors, by name.
std::map<std::string, std::vector<int64_t>> selections(const fs::path& step) {
  zenflow::model::SafetensorsFile f((step / "engine.safetensors").string());
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& name : f.names()) {
    if (name.size() < 4 || name.compare(name.size() - 4, 4, "/sel") != 0) continue;
    const at::Tensor t = f.tensor(name).to(at::kLong).contiguous();
    out[name].assign(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
  }
  return out;
}

// zenflow on shards (semantics.md §10) with windows of 4, the host step overlapped with the
// next window and every window re-selecting: every rank scores its local gradient and the
// scores are summed over the ranks before any averaging, as unsharded, so a sharded run
// selects the same columns and ends with the same weights. The embeddings are tied: the
// shared matrix's gradient is scored once, summed over both of its units.
TEST(ShardedTraining, ZenflowWithWindowsOverlapAndReselectionOnShardsEqualsUnsharded) {
  REQUIRE_GLOO();
  const fs::path dir = fresh_dir("zenflow-u4");
  const std::string zen =
      "update_interval: 4, overlap_step: true, full_warm_up_rounds: 1, topk_ratio: 0.25, select_strategy: step, "
      "select_interval: 4";
  const char* shards[] = {"none", "gradients", "parameters"};
  nlohmann::json runs[3];
  for (int s = 0; s < 3; ++s) {
    std::string text = spec_text("zenflow", (dir / shards[s]).string(), 2, shards[s], true, zen, "0.0");
    text.replace(text.find("max_position_embeddings: 32}"), 28, "max_position_embeddings: 32, tie_word_embeddings: 1}");
    const std::string spec = (dir / (std::string(shards[s]) + ".yaml")).string();
    std::ofstream(spec) << text;
    runs[s] = run_json(spec, 2, "--no-resume");
    ASSERT_EQ(runs[s]["exit"], 0) << shards[s] << ": " << runs[s]["stderr"];
    EXPECT_EQ(runs[s]["shard"], shards[s]);
  }
  EXPECT_GE(runs[0]["reselections"].get<int>(), 1);  // the selection moved at least once
  const auto want = selections(step_dir(dir / "none", 10));
  ASSERT_FALSE(want.empty());
  double worst = 0;
  for (int s = 1; s < 3; ++s) {
    const std::string what = std::string("zenflow U=4 overlap, shard ") + shards[s] + " vs none";
    EXPECT_EQ(selections(step_dir(dir / shards[s], 10)), want) << what;
    EXPECT_EQ(runs[s]["reselections"], runs[0]["reselections"]) << what;
    worst = std::max(worst, expect_models_close(step_dir(dir / shards[s], 10) / "model.safetensors",
                                                step_dir(dir / "none", 10) / "model.safetensors", 1e-6, what));
    expect_losses_close(runs[s]["losses"], runs[0]["losses"], 1e-6, 1, what);
  }
  std::printf("[figure] 2 ranks zenflow U=4 overlap, re-selecting every window (%d re-selections): shard "
              "gradients/parameters vs none: the same selected columns, worst weight %.3g\n",
              runs[0]["reselections"].get<int>(), worst);
  zenflow::remove_tree(dir);
}

// optimizer.host.device_staging_mib on shards: every rank's one-rank engine stages its rows
// through four chunk buffers (of at least a row: many chunks a step here) and one host ring
// slot; losses and weights are bit-identical to whole staging, in zenflow with overlapped,
// re-selecting windows. With two unsharded ranks (a partitioned engine, whose staging is the
// reduce-scatter's input) it is refused, naming what to change.
TEST(ShardedTraining, ChunkedDeviceStagingOnShardsIsBitIdenticalAndRefusedUnsharded) {
  REQUIRE_GLOO();
  const fs::path dir = fresh_dir("chunked");
  const std::string zen =
      "update_interval: 4, overlap_step: true, full_warm_up_rounds: 1, topk_ratio: 0.25, select_strategy: step, "
      "select_interval: 4";
  nlohmann::json runs[2];
  for (int chunked = 0; chunked < 2; ++chunked) {
    std::string text = spec_text("zenflow", (dir / std::to_string(chunked)).string(), 2, "parameters", true, zen, "0.0");
    if (chunked) text.replace(text.find("host: {threads: 1}"), 18, "host: {threads: 1, device_staging_mib: 1}");
    const std::string spec = (dir / (std::to_string(chunked) + ".yaml")).string();
    std::ofstream(spec) << text;
    runs[chunked] = run_json(spec, 2, "--no-resume");
    ASSERT_EQ(runs[chunked]["exit"], 0) << runs[chunked]["stderr"];
  }
  EXPECT_GE(runs[0]["reselections"].get<int>(), 1);
  EXPECT_EQ(runs[1]["losses"], runs[0]["losses"]);
  EXPECT_EQ(zenflow::test_support::read_file(step_dir(dir / "1", 10) / "model.safetensors"),
            zenflow::test_support::read_file(step_dir(dir / "0", 10) / "model.safetensors"));
  std::string text = spec_text("zenflow", (dir / "none").string(), 2, "none", true, zen, "0.0");
  text.replace(text.find("host: {threads: 1}"), 18, "host: {threads: 1, device_staging_mib: 1}");
  const std::string spec = (dir / "none.yaml").string();
  std::ofstream(spec) << text;
  const nlohmann::json refused = run_json(spec, 2, "--no-resume");
  EXPECT_NE(refused["exit"], 0);
  EXPECT_NE(refused["stderr"].get<std::string>().find(
                "optimizer.host.device_staging_mib needs one rank's engine: with 2 data-parallel ranks"),
            std::string::npos)
      << refused["stderr"];
  zenflow::remove_tree(dir);
}

// zenflow with windows of one step and no overlap updates every column every step: on 4 ranks
// sharding parameters it is the unsharded device-mode run.
TEST(ShardedTraining, ZenflowUpdatingEveryStepOnShardsEqualsDeviceModeUnsharded) {
  REQUIRE_GLOO();
  const fs::path dir = fresh_dir("zenflow-u1");
  const std::string zen = "update_interval: 1, overlap_step: false, full_warm_up_rounds: 0, topk_ratio: 0.25";
  const std::string zspec = (dir / "zen.yaml").string(), dspec = (dir / "dev.yaml").string();
  std::ofstream(zspec) << spec_text("zenflow", (dir / "zen").string(), 2, "parameters", true, zen, "0.0");
  std::ofstream(dspec) << spec_text("device", (dir / "dev").string(), 2, "none", true, zen, "0.0");
  const nlohmann::json z = run_json(zspec, 4, "--no-resume");
  const nlohmann::json d = run_json(dspec, 4, "--no-resume");
  ASSERT_EQ(z["exit"], 0) << z["stderr"];
  ASSERT_EQ(d["exit"], 0) << d["stderr"];
  const double worst = expect_models_close(step_dir(dir / "zen", 10) / "model.safetensors",
                                           step_dir(dir / "dev", 10) / "model.safetensors", 1e-6,
                                           "zenflow U=1 shard parameters vs device none");
  expect_losses_close(z["losses"], d["losses"], 1e-6, 1, "zenflow U=1 shard parameters vs device none");
  std::printf("[figure] 4 ranks zenflow U=1 shard parameters vs device unsharded: worst weight %.3g\n", worst);
  zenflow::remove_tree(dir);
}

TEST(ShardedTraining, ShardingParametersWithoutActivationCheckpointingIsRefused) {
  const fs::path dir = fresh_dir("refuse-ac");
  const std::string spec = (dir / "job.yaml").string();
  std::ofstream(spec) << spec_text("device", (dir / "ckpt").string(), 2, "parameters", false);
  const nlohmann::json j = run_json(spec, 2, "--no-resume");
  EXPECT_EQ(j["exit"], 2) << j["stderr"];
  const std::string err = j["stderr"].get<std::string>();
  EXPECT_NE(err.find("train.shard"), std::string::npos) << err;
  EXPECT_NE(err.find("activation_checkpointing"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(step_dir(dir / "ckpt", 10)));  // nothing trained
  // The same through --set on a spec that has it on.
  const std::string on = (dir / "on.yaml").string();
  std::ofstream(on) << spec_text("device", (dir / "ckpt").string(), 2, "parameters", true);
  const nlohmann::json k = run_json(on, 2, "--no-resume --set train.activation_checkpointing=false");
  EXPECT_EQ(k["exit"], 2) << k["stderr"];
  EXPECT_NE(k["stderr"].get<std::string>().find("activation_checkpointing"), std::string::npos) << k["stderr"];
  zenflow::remove_tree(dir);
}

// Sharding only gradients keeps the full weights for the forward: it needs no activation
// checkpointing (each unit's backward runs the graph its forward kept), and without it the
// run is the unsharded one without it, in zenflow mode (tied embeddings, windows of 2)
// as in device mode.
TEST(ShardedTraining, ShardingGradientsWithoutActivationCheckpointingEqualsUnsharded) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fresh_dir("grads-no-ac");
  for (const char* mode : {"device", "zenflow"}) {
    nlohmann::json runs[2];
    const char* shards[] = {"none", "gradients"};
    for (int s = 0; s < 2; ++s) {
      const std::string name = std::string(mode) + "-" + shards[s];
      std::string text = spec_text(mode, (dir / name).string(), 2, shards[s], false,
                                   "update_interval: 2, full_warm_up_rounds: 1, topk_ratio: 0.25", "0.0");
      text.replace(text.find("max_position_embeddings: 32}"), 28, "max_position_embeddings: 32, tie_word_embeddings: 1}");
      const std::string spec = (dir / (name + ".yaml")).string();
      std::ofstream(spec) << text;
      runs[s] = run_json(spec, 2, "--no-resume");
      ASSERT_EQ(runs[s]["exit"], 0) << name << ": " << runs[s]["stderr"];
      EXPECT_EQ(runs[s]["shard"], shards[s]);
      EXPECT_FALSE(runs[s]["activation_checkpointing"].get<bool>());
    }
    const std::string what = std::string(mode) + ", no activation checkpointing: shard gradients vs none";
    expect_one_rank_format(step_dir(dir / (std::string(mode) + "-gradients"), 10), what);
    expect_models_close(step_dir(dir / (std::string(mode) + "-gradients"), 10) / "model.safetensors",
                        step_dir(dir / (std::string(mode) + "-none"), 10) / "model.safetensors", 1e-6, what);
    expect_losses_close(runs[1]["losses"], runs[0]["losses"], 1e-6, 1, what);
  }
  zenflow::remove_tree(dir);
}

}  // namespace

// `zenflow bench shard` runs the rows it is asked for and reports what rank 0 holds: two
// ranks sharding parameters hold less than one rank does, and the gathers took time.
TEST(ShardedTraining, BenchShardReportsEachRowsMemoryAndExposedGathers) {
  REQUIRE_GLOO();
  const fs::path dir = fresh_dir("bench");
  std::string out;
  const std::string cmd = std::string(ZENFLOW_BINARY_DIR) +
                          "/bin/zenflow bench shard --ranks 1,2 --shards none,parameters --hidden 32 --layers 2 "
                          "--seq 16 --steps 2 --dir " + dir.string() + " 2>/dev/null";
  ASSERT_EQ(zenflow::test_support::run(cmd, &out), 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["rows"].size(), 3u) << out;  // 1 rank none; 2 ranks none and parameters
  EXPECT_EQ(j["rows"][0]["ranks"], 1);
  EXPECT_EQ(j["rows"][2]["shard"], "parameters");
  const double one = j["rows"][0]["parameters_plus_gradients_bytes"].get<double>();
  const double two_none = j["rows"][1]["parameters_plus_gradients_bytes"].get<double>();
  const double two_sharded = j["rows"][2]["parameters_plus_gradients_bytes"].get<double>();
  EXPECT_EQ(two_none, one);  // unsharded, every rank holds everything
  EXPECT_LT(two_sharded, 0.6 * one);
  EXPECT_EQ(j["rows"][1]["shard_comm_seconds"].get<double>(), 0);
  EXPECT_GT(j["rows"][2]["shard_comm_seconds"].get<double>(), 0);
  const double share = j["rows"][2]["shard_comm_exposed_share"].get<double>();
  EXPECT_GT(share, 0);
  EXPECT_LT(share, 1);
  zenflow::remove_tree(dir);
}

// The other way: a sharded zenflow checkpoint mid-window (gathered into the one-rank state:
// accumulators, device state of the selected columns, the window's scores) resumed unsharded,
// which partitions the host columns by rank again.
TEST(ShardedTraining, ShardedZenflowCheckpointMidWindowResumesUnsharded) {
  REQUIRE_GLOO();
  expect_resume_matches("resume-zenflow-back", {2, 2, "parameters"}, {2, 2, "none"}, 1e-6, "zenflow",
                        "update_interval: 4, overlap_step: true, full_warm_up_rounds: 1, topk_ratio: 0.25");
}
