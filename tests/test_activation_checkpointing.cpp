// Activation checkpointing (train.activation_checkpointing): a checkpointed layer gives
// bit-identical losses and gradients on the CPU, each weight's gradient arrives once, the
// graph keeps far fewer bytes, and a run trains the same numbers in every optimizer mode.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "worker/model/causal_lm.h"
#include "worker/model/cpu_memory_meter.h"
#include "worker/model/gpt2.h"
#include "worker/model/layer_checkpoint.h"
#include "worker/model/llama.h"
#include "worker/rank/trainer.h"

namespace fs = std::filesystem;
namespace zm = zenflow::model;
using namespace zenflow;

namespace {

zm::LlamaConfig llama_config(int64_t layers) {
  zm::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.num_hidden_layers = layers;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;  // grouped-query attention
  c.intermediate_size = 48;
  c.max_position_embeddings = 64;
  c.qkv_bias = true;
  return c;
}

zm::GPT2Config gpt2_config() {
  zm::GPT2Config c;
  c.vocab_size = 60;
  c.n_positions = 48;
  c.n_embd = 32;
  c.n_layer = 3;
  c.n_head = 4;
  c.scale_attn_by_inverse_layer_idx = true;  // the body needs its layer's index
  return c;
}

at::Tensor random_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randint(V, {B, T}, gen, at::TensorOptions().dtype(at::kLong));
}

struct Pass {
  at::Tensor loss;
  std::map<std::string, at::Tensor> grads;
  std::map<std::string, int> hook_calls;
};

// Forward, loss and backward once, a hook on every weight counting its calls (as the data-
// parallel gradient reducer's hooks do).
Pass run_pass(zm::CausalLM& m, bool checkpointing, const at::Tensor& ids) {
  m.set_activation_checkpointing(checkpointing);
  Pass out;
  std::vector<std::pair<at::Tensor, unsigned>> hooks;
  for (auto& p : m.parameters()) {
    p.tensor.mutable_grad() = at::Tensor();
    out.hook_calls[p.name] = 0;
    int* calls = &out.hook_calls[p.name];
    hooks.emplace_back(p.tensor, p.tensor.register_hook([calls](const at::Tensor&) { ++*calls; }));
  }
  const at::Tensor input = ids.narrow(1, 0, ids.size(1) - 1);
  const at::Tensor target = ids.narrow(1, 1, ids.size(1) - 1);
  out.loss = zm::causal_lm_loss(m.forward(input), target);
  out.loss.backward();
  for (auto& p : m.parameters()) out.grads[p.name] = p.tensor.grad().clone();
  for (auto& h : hooks) h.first.remove_hook(h.second);
  return out;
}

void expect_identical(const Pass& plain, const Pass& ckpt) {
  EXPECT_TRUE(at::equal(plain.loss, ckpt.loss)) << plain.loss.item<double>() << " vs " << ckpt.loss.item<double>();
  ASSERT_EQ(plain.grads.size(), ckpt.grads.size());
  for (const auto& [name, g] : plain.grads) {
    ASSERT_TRUE(ckpt.grads.at(name).defined()) << name;
    EXPECT_TRUE(at::equal(g, ckpt.grads.at(name))) << name << ": max difference "
                                                    << (g - ckpt.grads.at(name)).abs().max().item<double>();
    EXPECT_EQ(ckpt.hook_calls.at(name), 1) << name;
    EXPECT_EQ(plain.hook_calls.at(name), 1) << name;
  }
}

}  // namespace

TEST(ActivationCheckpointing, LlamaLossAndEveryGradientAreBitIdenticalAndEachHookFiresOnce) {
  auto m = zm::make_llama(llama_config(3), 7);
  const at::Tensor ids = random_ids(3, 17, 64, 11);
  const Pass plain = run_pass(*m, false, ids);
  const Pass ckpt = run_pass(*m, true, ids);
  expect_identical(plain, ckpt);
  EXPECT_GT(plain.loss.item<double>(), 3.0);  // ~ln 64 for a random model: a real loss
}

TEST(ActivationCheckpointing, Gpt2LossAndEveryGradientAreBitIdenticalAndEachHookFiresOnce) {
  auto m = zm::make_gpt2(gpt2_config(), 5);
  const at::Tensor ids = random_ids(2, 20, 60, 3);
  expect_identical(run_pass(*m, false, ids), run_pass(*m, true, ids));
}

// Evaluation (grad mode off) runs the layers as they are: the same logits, no graph.
TEST(ActivationCheckpointing, WithoutGradModeItIsThePlainForward) {
  auto m = zm::make_llama(llama_config(2), 3);
  const at::Tensor ids = random_ids(2, 9, 64, 4);
  c10::NoGradGuard no_grad;
  m->set_activation_checkpointing(false);
  const at::Tensor a = m->forward(ids);
  m->set_activation_checkpointing(true);
  const at::Tensor b = m->forward(ids);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(b.requires_grad());
}

// A recompute that draws random numbers draws the same ones as the forward did, whatever
// was drawn in between, and leaves the generator where it was.
TEST(ActivationCheckpointing, TheRecomputeSeesTheForwardsRandomNumbers) {
  const at::Tensor w = at::randn({8, 8}).requires_grad_(true);
  const at::Tensor x = at::randn({4, 8}).requires_grad_(true);
  auto noisy = [](const at::Tensor& in, const std::vector<at::Tensor>& ws) {
    return at::linear(in, ws[0]) * at::rand({4, 8});  // a dropout-like mask
  };
  at::manual_seed(42);
  const at::Tensor plain = noisy(x, {w});
  plain.sum().backward();
  const at::Tensor plain_gw = w.grad().clone(), plain_gx = x.grad().clone();
  w.mutable_grad() = at::Tensor();
  x.mutable_grad() = at::Tensor();

  at::manual_seed(42);
  const at::Tensor ckpt = zm::checkpointed_layer(noisy, x, {w});
  const at::Tensor drawn_between = at::rand({3});
  const at::Tensor next_expected = at::rand({3});
  at::manual_seed(42);
  (void)at::rand({4, 8});
  const at::Tensor expect_between = at::rand({3});
  EXPECT_TRUE(at::equal(drawn_between, expect_between));
  // Reset to just after `drawn_between` for the check below: the backward must not move it.
  at::manual_seed(42);
  (void)at::rand({4, 8});
  (void)at::rand({3});
  ckpt.sum().backward();
  EXPECT_TRUE(at::equal(at::rand({3}), next_expected)) << "the recompute moved the generator";
  EXPECT_TRUE(at::equal(plain, ckpt));
  EXPECT_TRUE(at::equal(w.grad(), plain_gw));
  EXPECT_TRUE(at::equal(x.grad(), plain_gx));
}

// What a forward keeps for its backward, counted by the allocator: with checkpointing, a
// 4-layer model keeps each layer's input instead of its every intermediate.
TEST(ActivationCheckpointing, TheForwardKeepsAFractionOfTheBytes) {
  zm::CpuMemoryMeter::install();
  auto m = zm::make_llama(llama_config(4), 9);
  const at::Tensor ids = random_ids(8, 33, 64, 5);
  auto kept_by_forward = [&](bool checkpointing, bool gradients_exist) {
    m->set_activation_checkpointing(checkpointing);
    const int64_t before = zm::CpuMemoryMeter::live_bytes();
    at::Tensor loss = zm::causal_lm_loss(m->forward(ids.narrow(1, 0, 32)), ids.narrow(1, 1, 32));
    const int64_t kept = zm::CpuMemoryMeter::live_bytes() - before;
    loss.backward();
    loss = at::Tensor();
    if (gradients_exist) {  // (the first backward allocates them; they stay)
      EXPECT_LE(zm::CpuMemoryMeter::live_bytes() - before, 0) << "the backward freed what the forward kept";
    }
    return kept;
  };
  kept_by_forward(false, false);
  const int64_t plain = kept_by_forward(false, true);
  const int64_t ckpt = kept_by_forward(true, true);
  // Without: per layer ~20 tensors of [8, 32, 32..48] fp32 plus attention's; with: one [8, 32, 32]
  // per layer, plus the logits and what the loss keeps in both.
  const int64_t layer_input = 8 * 32 * 32 * 4;
  EXPECT_GE(ckpt, 4 * layer_input);
  EXPECT_GE(plain, 2 * ckpt) << "plain " << plain << " B, checkpointed " << ckpt << " B";
  EXPECT_GE(plain - ckpt, 4 * 10 * layer_input) << "plain " << plain << " B, checkpointed " << ckpt << " B";
}

namespace {

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("zenflow-test-ac-" + name + "-" + std::to_string(::getpid()));
  zenflow::remove_tree(p);
  fs::create_directories(p);
  return p.string();
}

JobSpec four_layer_spec(const std::string& dir, const std::string& mode) {
  {
    std::ofstream f(dir + "/corpus.txt");
    for (int i = 0; i < 300; ++i) f << "Line " << i << ": the layers are recomputed, the losses are the same " << i * 3 << ".\n";
  }
  const std::string yaml =
      "name: ac\n"
      "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 4, num_attention_heads: 4, "
      "num_key_value_heads: 2, intermediate_size: 64, max_position_embeddings: 64}}\n"
      "data: {train: " + dir + "/corpus.txt, tokenizer: byte, val_fraction: 0.1}\n"
      "train: {steps: 20, micro_batch: 8, grad_accum: 2, seq_len: 48, lr: 3.0e-3, warmup_steps: 2, grad_clip: 1.0, "
      "seed: 5, compute_threads: 1, device: cpu}\n"
      "optimizer:\n  mode: " + mode + "\n  zenflow: {topk_ratio: 0.25, update_interval: 3, full_warm_up_rounds: 1, "
      "overlap_step: true, select_strategy: auto, min_split_numel: 512}\n"
      "  host: {threads: 1}\n"
      "checkpoint: {dir: " + dir + "/ckpt}\n";
  return parse_job_spec(yaml, {}, dir);
}

}  // namespace

// 20 steps in each optimizer mode: every loss bit-identical with and without checkpointing,
// and the run's measured activation peak at least halved.
TEST(ActivationCheckpointing, RunsInEveryModeTrainTheSameLossesWithAtMostHalfTheActivationPeak) {
  for (const std::string mode : {"device", "offload", "zenflow"}) {
    SCOPED_TRACE(mode);
    const std::string dir = temp_dir(mode);
    JobSpec spec = four_layer_spec(dir, mode);
    RunOptions o;
    o.evaluate = false;
    o.write_checkpoints = false;
    o.resume = false;
    const RunSummary plain = run_training(spec, o);
    spec.train.activation_checkpointing = true;
    const RunSummary ckpt = run_training(spec, o);
    ASSERT_EQ(plain.losses.size(), 20u);
    ASSERT_EQ(ckpt.losses.size(), 20u);
    for (size_t i = 0; i < plain.losses.size(); ++i)
      EXPECT_EQ(plain.losses[i], ckpt.losses[i]) << "step " << i + 1;
    EXPECT_LT(plain.losses.back(), plain.losses.front());  // it trains
    EXPECT_FALSE(plain.activation_checkpointing);
    EXPECT_TRUE(ckpt.activation_checkpointing);
    ASSERT_GT(plain.device_memory.activations_peak, 0);
    ASSERT_GT(ckpt.device_memory.activations_peak, 0);
    EXPECT_GE(plain.device_memory.activations_peak, 2 * ckpt.device_memory.activations_peak)
        << "plain " << plain.device_memory.activations_peak << " B, checkpointed " << ckpt.device_memory.activations_peak << " B";
    zenflow::remove_tree(dir);
  }
}

// The key: a boolean, false unless written, and written back by to_yaml.
TEST(ActivationCheckpointing, TheSpecKeyIsABooleanDefaultingToFalse) {
  const std::string base = "name: x\ndata: {train: /tmp}\n";
  EXPECT_FALSE(parse_job_spec(base).train.activation_checkpointing);
  const JobSpec on = parse_job_spec(base + "train: {activation_checkpointing: true}\n");
  EXPECT_TRUE(on.train.activation_checkpointing);
  EXPECT_TRUE(parse_job_spec(to_yaml(on)).train.activation_checkpointing);
  try {
    parse_job_spec(base + "train: {activation_checkpointing: sometimes}\n");
    FAIL() << "accepted a non-boolean";
  } catch (const SpecError& e) {
    EXPECT_NE(std::string(e.what()).find("train.activation_checkpointing"), std::string::npos) << e.what();
  }
}
