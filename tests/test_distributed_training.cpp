// Data-parallel training through `zenflow run --nproc 2` (Gloo on 127.0.0.1): 2 ranks x
// micro-batch b must equal 1 rank x micro-batch 2b on the same data order.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
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

std::string spec_text(const std::string& mode, const std::string& ckpt, int micro_batch, const std::string& zen) {
  return "name: dp\n"
         "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4, "
         "intermediate_size: 64, max_position_embeddings: 32}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: 10, micro_batch: " + std::to_string(micro_batch) +
         ", seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu, compute_threads: 1, grad_clip: 1.0}\n"
         "optimizer: {mode: " + mode + ", zenflow: {" + zen + ", min_split_numel: 512}, host: {threads: 1}}\n"
         "checkpoint: {every_steps: 0, dir: " + ckpt + "}\n";
}

int run_zenflow(const std::string& spec_path, int nproc) {
  const std::string cmd = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow run " + spec_path +
                          " --no-resume --quiet --nproc " + std::to_string(nproc) + " >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

using zenflow::test_support::run_json;

// Expects `got` within 1% of `want` at every step (step numbers from `first_step`);
// returns the worst relative difference.
double expect_losses_track(const std::vector<double>& got, const std::vector<double>& want, int first_step) {
  double worst = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double rel = std::abs(got[i] - want[i]) / want[i];
    EXPECT_LE(rel, 0.01) << "step " << first_step + static_cast<int>(i);
    worst = std::max(worst, rel);
  }
  return worst;
}

struct Case {
  const char* name;
  const char* mode;
  const char* zen;
};

class TwoRanksEqualOneRankOfDoubleBatch : public ::testing::TestWithParam<Case> {};

TEST_P(TwoRanksEqualOneRankOfDoubleBatch, ParametersAgreeAfterTenSteps) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const Case c = GetParam();
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-" + std::string(c.name) + "-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  const std::string one = (dir / "one.yaml").string(), two = (dir / "two.yaml").string();
  std::ofstream(one) << spec_text(c.mode, (dir / "one").string(), 4, c.zen);
  std::ofstream(two) << spec_text(c.mode, (dir / "two").string(), 2, c.zen);
  ASSERT_EQ(run_zenflow(one, 1), 0);
  ASSERT_EQ(run_zenflow(two, 2), 0);
  zenflow::model::SafetensorsFile a((dir / "one" / "step-00000010" / "model.safetensors").string());
  zenflow::model::SafetensorsFile b((dir / "two" / "step-00000010" / "model.safetensors").string());
  ASSERT_EQ(a.names(), b.names());
  for (const auto& name : a.names()) {
    const at::Tensor x = a.tensor(name), y = b.tensor(name);
    // Relative to the tensor's norm: Adam normalises updates, so elements whose gradient is
    // ~0 amplify reduction-order rounding (2 ranks sum two halves of the batch).
    const double err = (x - y).norm().item<double>() / y.norm().item<double>();
    EXPECT_LE(err, 1e-5) << name;
  }
  zenflow::remove_tree(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, TwoRanksEqualOneRankOfDoubleBatch,
    ::testing::Values(Case{"device", "device", "update_interval: 1"},
                      Case{"offload", "offload", "update_interval: 1"},
                      Case{"zenflow", "zenflow",
                           "update_interval: 1, overlap_step: false, full_warm_up_rounds: 0, "
                           "select_strategy: step, select_interval: 1"}),
    [](const auto& info) { return std::string(info.param.name); });

// Two ranks whose gradients the reducer's hooks all-reduce as backward produces them: with
// activation checkpointing each weight's gradient still arrives once, so the weights after
// ten zenflow steps are bit-identical to the same run without it.
TEST(DistributedTraining, ActivationCheckpointingOnTwoRanksChangesNoWeight) {
  REQUIRE_GLOO();
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-ac-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  const std::string zen = "update_interval: 2, overlap_step: true, full_warm_up_rounds: 1";
  const std::string plain = (dir / "plain.yaml").string(), ckpt = (dir / "ckpt.yaml").string();
  std::ofstream(plain) << spec_text("zenflow", (dir / "plain").string(), 2, zen);
  std::string text = spec_text("zenflow", (dir / "ckpt").string(), 2, zen);
  text.replace(text.find("grad_clip: 1.0}"), 15, "grad_clip: 1.0, activation_checkpointing: true}");
  std::ofstream(ckpt) << text;
  ASSERT_EQ(run_zenflow(plain, 2), 0);
  ASSERT_EQ(run_zenflow(ckpt, 2), 0);
  zenflow::model::SafetensorsFile a((dir / "plain" / "step-00000010" / "model.safetensors").string());
  zenflow::model::SafetensorsFile b((dir / "ckpt" / "step-00000010" / "model.safetensors").string());
  ASSERT_EQ(a.names(), b.names());
  for (const auto& name : a.names()) EXPECT_TRUE(at::equal(a.tensor(name), b.tensor(name))) << name;
  zenflow::remove_tree(dir);
}

// Kill one rank of a running `zenflow run --nproc 2`: the job fails fast, naming the rank.
TEST(DistributedTraining, KilledRankFailsTheJobNamingIt) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-kill-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  zenflow::test_support::expect_killed_rank_fails_the_job(spec_text("device", (dir / "ckpt").string(), 2, "update_interval: 1"), dir);
  zenflow::remove_tree(dir);
}

// ZenFlow with windows of 4 and overlap: ranks select from summed scores, so the run
// is not the 1-rank run exactly; the ranks must stay bit-identical (the run's weight
// fingerprints agree) and the loss must track the 1-rank run within 1% at every step.
TEST(DistributedTraining, ZenFlowWithOverlapKeepsRanksIdenticalAndTracksOneRank) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-u4-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  const std::string zen = "update_interval: 4, overlap_step: true, topk_ratio: 0.1, select_strategy: auto";
  const std::string one = (dir / "one.yaml").string(), two = (dir / "two.yaml").string();
  std::ofstream(one) << spec_text("zenflow", (dir / "one").string(), 4, zen);
  std::ofstream(two) << spec_text("zenflow", (dir / "two").string(), 2, zen);
  const nlohmann::json a = run_json(one, 1, "--no-resume");
  const nlohmann::json b = run_json(two, 2, "--no-resume");
  ASSERT_EQ(a["exit"], 0) << a["stderr"];
  ASSERT_EQ(b["exit"], 0) << b["stderr"];
  EXPECT_EQ(b["world_size"], 2);
  EXPECT_TRUE(b["ranks_identical"].get<bool>());
  const auto la = a["losses"].get<std::vector<double>>(), lb = b["losses"].get<std::vector<double>>();
  ASSERT_EQ(la.size(), 10u);
  ASSERT_EQ(lb.size(), 10u);
  const double worst = expect_losses_track(lb, la, 1);
  std::printf("[figure] 2 ranks vs 1 rank, U=4 overlap: worst per-step loss difference %.3g%%\n", 100 * worst);
  // Selection scores cost a sliver of what gradients cost (here ~out/1 per matrix).
  const double sel = b["comm_bytes"]["selection"].get<double>(), grad = b["comm_bytes"]["gradients"].get<double>();
  EXPECT_GT(sel, 0);
  EXPECT_LT(sel * 10, grad);
  // Each rank holds half the host optimizer state, plus one packed send buffer.
  EXPECT_LE(b["host_state_bytes"].get<double>(), 0.6 * a["host_state_bytes"].get<double>());
  zenflow::remove_tree(dir);
}

// A 2-rank checkpoint (one engine shard per rank) resumed by 1 rank: the optimizer state
// is re-sharded and training continues as the 2 ranks continue from the same checkpoint,
// within 1% at every step (they differ only in how selection scores are reduced).
TEST(DistributedTraining, TwoRankCheckpointResumesOnOneRank) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-reshard-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  const std::string zen = "update_interval: 4, overlap_step: true, topk_ratio: 0.1";
  const std::string spec = (dir / "job.yaml").string();
  std::ofstream(spec) << spec_text("zenflow", (dir / "ckpt").string(), 2, zen);
  // Steps 1-10 on 2 ranks: the checkpoint at step 10 holds two engine shards.
  const nlohmann::json first = run_json(spec, 2, "--no-resume --set train.schedule=constant");
  ASSERT_EQ(first["exit"], 0) << first["stderr"];
  const fs::path ck = dir / "ckpt" / "step-00000010";
  EXPECT_TRUE(fs::exists(ck / "engine.safetensors"));
  EXPECT_TRUE(fs::exists(ck / "engine-rank-00001.safetensors"));
  fs::copy(dir / "ckpt", dir / "ckpt2", fs::copy_options::recursive);
  // Steps 11-20: on 1 rank with the same global batch, and on 2 ranks from the copy.
  const std::string twenty = "--set train.steps=20 --set train.schedule=constant";
  const nlohmann::json one = run_json(spec, 1, twenty + " --set train.micro_batch=4");
  ASSERT_EQ(one["exit"], 0) << one["stderr"];
  EXPECT_NE(one["stderr"].get<std::string>().find("re-sharded the optimizer state of 2 ranks over 1"),
            std::string::npos)
      << one["stderr"];
  const nlohmann::json two = run_json(spec, 2, twenty + " --set checkpoint.dir=" + (dir / "ckpt2").string());
  ASSERT_EQ(two["exit"], 0) << two["stderr"];
  EXPECT_EQ(one["start_step"], 10);
  EXPECT_EQ(two["start_step"], 10);
  const auto l1 = one["losses"].get<std::vector<double>>(), l2 = two["losses"].get<std::vector<double>>();
  ASSERT_EQ(l1.size(), 10u);
  ASSERT_EQ(l2.size(), 10u);
  const double worst = expect_losses_track(l1, l2, 11);
  std::printf("[figure] resumed on 1 rank vs on 2 ranks from one 2-rank checkpoint: worst loss difference %.3g%%\n",
              100 * worst);
  zenflow::remove_tree(dir);
}

// Resuming 2 ranks from a periodic 2-rank checkpoint (taken mid-window, a host step in
// flight) reproduces the uninterrupted run exactly, step by step.
TEST(DistributedTraining, SameWorldResumeIsExact) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-resume-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  const std::string spec = (dir / "job.yaml").string();
  std::ofstream(spec) << spec_text("zenflow", (dir / "ckpt").string(), 2,
                                   "update_interval: 4, overlap_step: true, topk_ratio: 0.1");
  const std::string flags = "--set train.steps=20 --set checkpoint.every_steps=5 --set checkpoint.keep=10";
  const nlohmann::json straight = run_json(spec, 2, "--no-resume " + flags);
  ASSERT_EQ(straight["exit"], 0) << straight["stderr"];
  for (const char* later : {"step-00000015", "step-00000020"}) zenflow::remove_tree(dir / "ckpt" / later);
  const nlohmann::json resumed = run_json(spec, 2, flags);
  ASSERT_EQ(resumed["exit"], 0) << resumed["stderr"];
  EXPECT_EQ(resumed["start_step"], 10);
  const auto a = straight["losses"].get<std::vector<double>>(), b = resumed["losses"].get<std::vector<double>>();
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(b[i], a[10 + i]) << "step " << 11 + i;
  // A checkpoint whose rank-1 shard is damaged is skipped: the ranks resume from the one before.
  for (const char* later : {"step-00000015", "step-00000020"}) zenflow::remove_tree(dir / "ckpt" / later);
  fs::resize_file(dir / "ckpt" / "step-00000010" / "engine-rank-00001.safetensors", 100);
  const nlohmann::json fallback = run_json(spec, 2, flags);
  ASSERT_EQ(fallback["exit"], 0) << fallback["stderr"];
  EXPECT_EQ(fallback["start_step"], 5);
  EXPECT_NE(fallback["stderr"].get<std::string>().find("damaged"), std::string::npos) << fallback["stderr"];
  const auto c = fallback["losses"].get<std::vector<double>>();
  ASSERT_EQ(c.size(), 15u);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], a[5 + i]) << "step " << 6 + i;
  zenflow::remove_tree(dir);
}

// Without --nproc, resources.gpus_per_worker ranks start on this machine.
TEST(DistributedTraining, GpusPerWorkerChoosesTheRankCount) {
  REQUIRE_GLOO();  // ranks on the CPU talk through Gloo
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-gpw-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  const std::string spec = (dir / "job.yaml").string();
  std::ofstream(spec) << spec_text("offload", (dir / "ckpt").string(), 2, "update_interval: 1")
                      << "resources: {gpus_per_worker: 2}\n";
  const std::string cmd = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow run " + spec +
                          " --quiet --json --no-resume --set train.steps=2 2>/dev/null";
  std::string out;
  ASSERT_EQ(zenflow::test_support::run(cmd, &out), 0);
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_TRUE(j["ranks_identical"].get<bool>());
  zenflow::remove_tree(dir);
}

}  // namespace
