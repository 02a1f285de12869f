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

  // shard: parameters.
  const double p = bytes_of(params, "parameters"), g = bytes_of(params, "gradients");
  const double gathered = params["shard_gathered_peak_bytes"].get<double>();
  EXPECT_GT(gathered, 0);
  // One unit at a time (embedding, a layer, the head), never the whole model at once.
  EXPECT_LT(gathered, full_p);
  const double bound = (full_p + full_g) / 4 + gathered;
  EXPECT_LE(p + g, bound);
  std::printf("[figure] 4 ranks shard parameters: rank 0 holds %.0f B of weights + gradients "
              "(bound %.0f B = 1-rank unsharded %.0f B / 4 + gathered peak %.0f B)\n",
              p + g, bound, full_p + full_g, gathered);

  // shard: gradients. One row of every tensor is the slack of the uneven shards.
  zenflow::model::SafetensorsFile model((step_dir(dir / "one", 2) / "model.safetensors").string());
  double row_slack = 0;
  for (const auto& name : model.names()) {
    const at::Tensor t = model.tensor(name);
    const int64_t rows = t.dim() > 0 ? t.size(0) : 1;
    row_slack += static_cast<double>(t.numel() / std::max<int64_t>(1, rows)) *
                 static_cast<double>(std::max<int64_t>(4, static_cast<int64_t>(t.element_size())));
  }
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
// through: losses 6-10 and the final weights within `tol`.
void expect_resume_matches(const std::string& name, const Leg& first, const Leg& then, double tol) {
  const fs::path dir = fresh_dir(name);
  const std::string constant = "--set train.schedule=constant";
  const std::string spec = (dir / "job.yaml").string(), straight_spec = (dir / "straight.yaml").string();
  std::ofstream(spec) << spec_text("device", (dir / "ckpt").string(), first.micro_batch, first.shard);
  std::ofstream(straight_spec) << spec_text("device", (dir / "straight").string(), then.micro_batch, then.shard);
  const nlohmann::json head = run_json(spec, first.ranks, "--no-resume --set train.steps=5 " + constant);
  ASSERT_EQ(head["exit"], 0) << head["stderr"];
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
// (e) The spec's rules, before any rank starts: exit status 2, the message naming the keys.

TEST(ShardedTraining, ShardingWithZenflowModeIsRefused) {
  const fs::path dir = fresh_dir("refuse-zenflow");
  for (const char* shard : {"gradients", "parameters"}) {
    const std::string spec = (dir / (std::string(shard) + ".yaml")).string();
    std::ofstream(spec) << spec_text("zenflow", (dir / "ckpt").string(), 2, shard);
    const nlohmann::json j = run_json(spec, 2, "--no-resume");
    EXPECT_EQ(j["exit"], 2) << shard << ": " << j["stderr"];
    const std::string err = j["stderr"].get<std::string>();
    EXPECT_NE(err.find("train.shard"), std::string::npos) << shard << ": " << err;
    EXPECT_NE(err.find("optimizer.mode"), std::string::npos) << shard << ": " << err;
    EXPECT_FALSE(fs::exists(step_dir(dir / "ckpt", 10))) << shard;  // nothing trained
  }
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
// checkpointing, and such a run trains.
TEST(ShardedTraining, ShardingGradientsWithoutActivationCheckpointingTrains) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fresh_dir("grads-no-ac");
  const std::string spec = (dir / "job.yaml").string();
  std::ofstream(spec) << spec_text("offload", (dir / "ckpt").string(), 2, "gradients", false);
  const nlohmann::json j = run_json(spec, 2, "--no-resume --set train.steps=2");
  ASSERT_EQ(j["exit"], 0) << j["stderr"];
  EXPECT_EQ(j["shard"], "gradients");
  EXPECT_EQ(j["losses"].size(), 2u);
  expect_one_rank_format(step_dir(dir / "ckpt", 2), "2 ranks shard gradients, step 2");
  zenflow::remove_tree(dir);
}

}  // namespace
