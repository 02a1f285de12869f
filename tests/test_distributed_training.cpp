// Data-parallel training through `zenflow run --nproc 2` (Gloo on 127.0.0.1): 2 ranks x
// micro-batch b must equal 1 rank x micro-batch 2b on the same data order.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/remove_tree.h"
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

struct Case {
  const char* name;
  const char* mode;
  const char* zen;
};

class TwoRanksEqualOneRankOfDoubleBatch : public ::testing::TestWithParam<Case> {};

TEST_P(TwoRanksEqualOneRankOfDoubleBatch, ParametersAgreeAfterTenSteps) {
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

// Kill one rank of a running `zenflow run --nproc 2`: the job fails fast, naming the rank.
TEST(DistributedTraining, KilledRankFailsTheJobNamingIt) {
  const fs::path dir = fs::temp_directory_path() / ("zenflow-dp-kill-" + std::to_string(::getpid()));
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  std::string text = spec_text("device", (dir / "ckpt").string(), 2, "update_interval: 1");
  text.replace(text.find("steps: 10"), 9, "steps: 1000000");
  const std::string spec = (dir / "long.yaml").string();
  std::ofstream(spec) << text;
  const std::string log = (dir / "log.txt").string();
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    if (!freopen(log.c_str(), "w", stderr)) _exit(126);
    const std::string bin = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";
    execl(bin.c_str(), bin.c_str(), "run", spec.c_str(), "--nproc", "2", "--quiet", "--no-resume",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // The launcher's children are the ranks; wait (bounded) until training runs (job.yaml).
  std::vector<pid_t> ranks;
  for (int i = 0; i < 600 && (ranks.size() < 2 || !fs::exists(dir / "ckpt" / "job.yaml")); ++i) {
    usleep(50 * 1000);
    ranks.clear();
    std::ifstream children("/proc/" + std::to_string(launcher) + "/task/" + std::to_string(launcher) + "/children");
    for (pid_t p; children >> p;) ranks.push_back(p);
  }
  ASSERT_EQ(ranks.size(), 2u);
  usleep(500 * 1000);
  kill(ranks[1], SIGKILL);
  int status = 0;
  bool exited = false;
  for (int i = 0; i < 600 && !exited; ++i) {  // 30 s bound
    exited = waitpid(launcher, &status, WNOHANG) == launcher;
    if (!exited) usleep(50 * 1000);
  }
  if (!exited) {
    kill(launcher, SIGKILL);
    for (pid_t p : ranks) kill(p, SIGKILL);
    waitpid(launcher, &status, 0);
    FAIL() << "the job did not stop within 30 s of losing a rank";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  std::ifstream in(log);
  const std::string out((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(out.find("rank 1 (pid " + std::to_string(ranks[1]) + ") failed"), std::string::npos) << out;
  zenflow::remove_tree(dir);
}

}  // namespace
