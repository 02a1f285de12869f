// Preflight tests: exact parameter counts, the engine's host memory, refusal of oversized jobs, warnings,
// dtype errors, model.arch vs model.from.
#include <c10/core/GradMode.h>  // c10::NoGradGuard
#include <gtest/gtest.h>
#include <torch/version.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/input_file.h"
#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "tests/support/thread_collectives.h"
#include "worker/engine/streamed_parameters.h"
#include "worker/engine/zenflow_optimizer.h"
#include "worker/model/causal_lm.h"
#include "worker/model/hf_model.h"
#include "worker/rank/model_factory.h"
#include "worker/rank/preflight.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGiB = int64_t{1} << 30;

JobSpec job(const std::string& model_yaml, const std::vector<std::string>& sets = {}) {
  return parse_job_spec("name: t\ndata: {train: corpus.txt}\nmodel: " + model_yaml + "\n", sets, "/base");
}

MemoryEstimate estimate(const JobSpec& spec, int64_t world = 1, bool cuda = false, int dtype_bytes = 4) {
  return estimate_job_memory(spec, describe_model_from_spec(spec.model, 256), world, cuda, dtype_bytes);
}

int64_t built_parameters(const JobSpec& spec) {
  int64_t n = 0;
  for (const auto& p : make_model_from_spec(spec.model, 256, 1, nullptr)->parameters()) n += p.tensor.numel();
  return n;
}

// The message of the std::invalid_argument `f` throws, or "".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(Preflight, ParameterCountEqualsTheBuiltModelExactly) {
  const char* models[] = {
      "{arch: llama, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4}}",
      "{arch: llama, config: {hidden_size: 32, num_hidden_layers: 3, num_attention_heads: 4, "
      "num_key_value_heads: 2, intermediate_size: 40, tie_word_embeddings: true}}",
      "{arch: llama, config: {hidden_size: 48, num_hidden_layers: 1, num_attention_heads: 2, vocab_size: "
      "300}}",
      "{arch: gpt2, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
      "max_position_embeddings: 128}}",
      "{arch: gpt2, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
      "max_position_embeddings: 128, intermediate_size: 50, tie_word_embeddings: false}}",
  };
  for (const char* m : models) {
    const JobSpec spec = job(m);
    const MemoryEstimate e = estimate(spec);
    EXPECT_EQ(e.parameters, built_parameters(spec)) << m;
    EXPECT_EQ(e.weight_bytes, e.parameters * 4) << m;
    EXPECT_EQ(e.gradient_bytes, e.parameters * 4) << m;
    EXPECT_EQ(estimate(spec, 1, false, 2).weight_bytes, e.parameters * 2) << m;
  }
}

// The engine's own count of the host buffers it allocated, for the same job.
std::unique_ptr<engine::ZenFlowOptimizer> engine_for(const JobSpec& spec, at::ScalarType dtype = at::kFloat) {
  auto lm = make_model_from_spec(spec.model, 256, 1, nullptr);
  std::vector<engine::ParamSpec> params;
  for (auto& nt : lm->parameters()) {
    engine::ParamSpec p;
    p.name = nt.name;
    p.param = nt.tensor.detach().to(dtype).requires_grad_(true);
    params.push_back(p);
  }
  engine::EngineOptions o;
  o.mode = engine::parse_optimizer_mode(spec.optimizer.mode);
  o.topk_ratio = spec.optimizer.zenflow.topk_ratio;
  o.min_split_numel = spec.optimizer.zenflow.min_split_numel;
  o.device_staging_bytes = spec.optimizer.host.device_staging_mib << 20;
  o.huge_pages = false;
  return std::make_unique<engine::ZenFlowOptimizer>(params, o);
}

int64_t engine_host_bytes(const JobSpec& spec, at::ScalarType dtype = at::kFloat) {
  return engine_for(spec, dtype)->host_state_bytes();
}

TEST(Preflight, HostOptimizerBytesMatchTheEngineAndOrderTheModes) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4}}";
  const JobSpec zen = job(model);
  const JobSpec off = job(model, {"optimizer.mode=offload"});
  const JobSpec dev = job(model, {"optimizer.mode=device"});
  const MemoryEstimate z = estimate(zen), o = estimate(off), d = estimate(dev);
  EXPECT_EQ(z.host_optimizer_bytes, engine_host_bytes(zen));
  EXPECT_EQ(o.host_optimizer_bytes, engine_host_bytes(off));
  EXPECT_EQ(d.host_optimizer_bytes, 0);
  // Offload also hosts the norms, but opens no windows: no accumulators, no last
  // gradients, one ring slot (16 bytes per fp32 element where zenflow's split ones take 36).
  EXPECT_LT(o.host_optimizer_bytes, z.host_optimizer_bytes);
  EXPECT_EQ(z.host_optimizer_bytes % 36, 0);
  EXPECT_GT(z.host_optimizer_bytes, d.host_optimizer_bytes);
  // Device mode keeps fp32 m and v of every parameter on the device; + a master copy in 16-bit.
  EXPECT_EQ(d.device_optimizer_bytes, d.parameters * 8);
  EXPECT_EQ(estimate(dev, 1, false, 2).device_optimizer_bytes, d.parameters * 12);
  EXPECT_LT(z.device_optimizer_bytes, d.device_optimizer_bytes);
  // On the CPU everything is host memory.
  EXPECT_EQ(z.total_host_bytes, z.host_optimizer_bytes + z.total_device_bytes);
  EXPECT_EQ(z.total_device_bytes,
            z.weight_bytes + z.gradient_bytes + z.device_optimizer_bytes + z.activation_bytes);

  // Two ranks: each holds half of the host state (master, m, v, a ring slot: 16 bytes per
  // fp32 element) plus a packing buffer (4) that one rank does not need.
  const MemoryEstimate o2 = estimate(off, 2);
  const int64_t split = o.host_optimizer_bytes / 16;
  EXPECT_EQ(o.host_optimizer_bytes, split * 16);
  EXPECT_EQ(o2.host_optimizer_bytes, (split + 1) / 2 * 20);
}

// optimizer.host.device_staging_mib: on a GPU the staging is the budget (at most the split
// gradient's size) instead of three split-sized buffers; on the host a ring slot, an output buffer and both last-gradient
// buffers go (32 -> 24 bytes per split bf16 element), as the engine counts its own buffers.
TEST(Preflight, ChunkedDeviceStagingIsTheBudgetOnTheGpuAndLessOnTheHost) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4}}";
  const JobSpec whole = job(model);
  const JobSpec chunked = job(model, {"optimizer.host.device_staging_mib=8"});
  const MemoryEstimate w = estimate(whole, 1, true, 2), c = estimate(chunked, 1, true, 2);
  const int64_t split = w.host_optimizer_bytes / 32;
  EXPECT_EQ(w.host_optimizer_bytes, split * 32);
  EXPECT_EQ(c.host_optimizer_bytes, split * 24);
  // 8 MiB is more than this model's split gradient: four chunks of a quarter of it.
  const int64_t chunks = 4 * ((split + 3) / 4) * 2;
  EXPECT_LT(chunks, int64_t{8} << 20);
  EXPECT_EQ(w.device_optimizer_bytes - c.device_optimizer_bytes, 3 * 2 * split - chunks);
  EXPECT_EQ(w.total_device_bytes - c.total_device_bytes, 3 * 2 * split - chunks);
  // The engine's own count, bf16 and fp32 weights (fp32: 20 + 4 + 4 for the packed master
  // against whole staging's 20 + 16).
  EXPECT_EQ(estimate(chunked, 1, false, 2).host_optimizer_bytes, engine_host_bytes(chunked, at::kBFloat16));
  EXPECT_EQ(estimate(whole, 1, false, 2).host_optimizer_bytes, engine_host_bytes(whole, at::kBFloat16));
  EXPECT_EQ(estimate(chunked).host_optimizer_bytes, engine_host_bytes(chunked));
  EXPECT_EQ(estimate(chunked).host_optimizer_bytes * 36, estimate(whole).host_optimizer_bytes * 28);
  // On the CPU device the chunks are host memory the estimate counts, as the engine does.
  EXPECT_EQ(estimate(chunked, 1, false, 2).device_optimizer_bytes - estimate(whole, 1, false, 2).device_optimizer_bytes,
            engine_for(chunked, at::kBFloat16)->device_bytes().buffers);
  EXPECT_EQ(estimate(chunked).device_optimizer_bytes - estimate(whole).device_optimizer_bytes,
            engine_for(chunked)->device_bytes().buffers);
  // Unsharded data-parallel ranks stage for the reduce-scatter: refused before the model
  // loads, as the engine would refuse it; device mode stages nothing, so it stands.
  EXPECT_NE(error_of([&] { estimate(chunked, 2, true, 2); })
                .find("optimizer.host.device_staging_mib needs one rank's engine: with 2 data-parallel ranks"),
            std::string::npos);
  EXPECT_EQ(error_of([&] {
              estimate(job(model, {"optimizer.host.device_staging_mib=8", "optimizer.mode=device"}), 2, true, 2);
            }),
            "");
  EXPECT_EQ(error_of([&] {
              estimate(job(model, {"optimizer.host.device_staging_mib=8", "train.shard=gradients"}), 2, true, 2);
            }),
            "");
}

// A job that lacks only what whole-gradient staging takes is refused naming
// optimizer.host.device_staging_mib (exit 2 like every preflight refusal), with the bytes it
// would save; one that lacks more is refused as before; with the key set the estimate is
// what the suggestion promised.
TEST(Preflight, AJobShortOnlyByWholeStagingIsToldToStageInChunks) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 2048, num_hidden_layers: 16, num_attention_heads: 16, "
      "intermediate_size: 5632, vocab_size: 32000}}";
  const JobSpec whole = job(model, {"train.micro_batch=1", "train.seq_len=512"});
  const MemoryEstimate gpu = estimate(whole, 1, true, 2);
  const int64_t split = gpu.host_optimizer_bytes / 32;
  EXPECT_EQ(gpu.host_optimizer_bytes, split * 32);
  EXPECT_EQ(gpu.chunked_staging_saves_device, 3 * 2 * split - kGiB);  // three whole stages against 1 GiB
  EXPECT_EQ(gpu.chunked_staging_saves_host, split * 8);               // 32 -> 24 B per split element
  const int64_t host = gpu.total_host_bytes, fits = gpu.total_device_bytes - gpu.chunked_staging_saves_device;
  std::string msg = error_of([&] { check_job_fits(whole, gpu, host, fits); });
  EXPECT_EQ(msg.rfind("optimizer.host.device_staging_mib: the job needs an estimated " +
                          format_bytes(gpu.total_device_bytes) + " of device memory",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("staging whole gradients takes " + format_bytes(gpu.chunked_staging_saves_device) +
                     " of it that optimizer.host.device_staging_mib: 1024 would not"),
            std::string::npos)
      << msg;
  msg = error_of([&] { check_job_fits(whole, gpu, host, fits - 1); });
  EXPECT_EQ(msg.rfind(gpu.dominant_key + ": ", 0), 0u) << msg;
  // Host memory: short by no more than what chunked staging saves there.
  const MemoryEstimate init_free = estimate(job(model, {"train.micro_batch=1", "train.seq_len=512"}), 1, false, 2);
  msg = error_of([&] {
    check_job_fits(whole, init_free, init_free.total_host_bytes - init_free.chunked_staging_saves_host, 0);
  });
  EXPECT_EQ(msg.rfind("optimizer.host.device_staging_mib: the job needs an estimated", 0), 0u) << msg;
  EXPECT_NE(msg.find("of host memory"), std::string::npos) << msg;
  // Set, the estimate is the promised one and nothing more is suggested.
  const MemoryEstimate chunked =
      estimate(job(model, {"train.micro_batch=1", "train.seq_len=512", "optimizer.host.device_staging_mib=1024"}), 1,
               true, 2);
  EXPECT_EQ(chunked.total_device_bytes, fits);
  EXPECT_EQ(chunked.host_optimizer_bytes, gpu.host_optimizer_bytes - gpu.chunked_staging_saves_host);
  EXPECT_EQ(chunked.chunked_staging_saves_device, 0);
  EXPECT_EQ(error_of([&] { check_job_fits(whole, chunked, host, fits); }), "");
  // Unsharded ranks cannot stage in chunks: nothing is suggested.
  EXPECT_EQ(estimate(whole, 2, true, 2).chunked_staging_saves_device, 0);
}

TEST(Preflight, OversizedModelIsRefusedNamingTheKeyTheEstimateAndTheLimit) {
  // Within the spec's bounds, but ~7e13 parameters.
  const JobSpec huge =
      job("{arch: llama, config: {hidden_size: 131072, num_hidden_layers: 1024, num_attention_heads: 1024}}");
  const MemoryEstimate e = estimate(huge);
  const int64_t H = 131072, I = 344, V = 256;
  EXPECT_EQ(e.parameters, 1024 * (4 * H * H + 3 * I * H + 2 * H) + 2 * V * H + H);
  EXPECT_EQ(e.model_key, "model.config.num_hidden_layers");
  EXPECT_EQ(e.dominant_key, "model.config.num_hidden_layers");
  const std::string msg = error_of([&] { check_job_fits(huge, e, 16 * kGiB, 0); });
  EXPECT_EQ(msg.rfind("model.config.num_hidden_layers: the job needs an estimated " +
                          format_bytes(e.total_host_bytes) + " of host memory (parameters 7.1e13: weights " +
                          format_bytes(e.weight_bytes) + ", gradients " + format_bytes(e.gradient_bytes) +
                          ", optimizer state ",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("), more than the 16 GiB available"), std::string::npos) << msg;

  // hidden_size drives a wide, shallow model.
  const JobSpec wide =
      job("{arch: llama, config: {hidden_size: 131072, num_hidden_layers: 2, num_attention_heads: 4}}");
  EXPECT_EQ(estimate(wide).dominant_key, "model.config.hidden_size");
  EXPECT_EQ(error_of([&] {
              check_job_fits(wide, estimate(wide), 16 * kGiB, 0);
            }).rfind("model.config.hidden_size: the job needs an estimated ", 0),
            0u);
  // The batch drives activations of a tiny model; the sequence length the attention matrix.
  const JobSpec batch =
      job("{arch: gpt2, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4}}",
          {"train.micro_batch=65536", "train.seq_len=64"});
  EXPECT_EQ(estimate(batch).dominant_key, "train.micro_batch");
  EXPECT_EQ(error_of([&] {
              check_job_fits(batch, estimate(batch), 16 * kGiB, 0);
            }).rfind("train.micro_batch: the job needs an estimated ", 0),
            0u);
  const JobSpec longseq =
      job("{arch: llama, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
          "max_position_embeddings: 1048576}}",
          {"train.micro_batch=1", "train.seq_len=1048576"});
  EXPECT_EQ(estimate(longseq).activation_key, "train.seq_len");
  // Nothing overflows at every bound at once: the sums saturate.
  const JobSpec all =
      job("{arch: llama, config: {hidden_size: 131072, num_hidden_layers: 1024, num_attention_heads: 4096, "
          "intermediate_size: 1048576, vocab_size: 16777216, max_position_embeddings: 1048576}}",
          {"train.micro_batch=65536", "train.seq_len=1048576"});
  const MemoryEstimate a = estimate(all);
  EXPECT_GT(a.parameters, 0);
  EXPECT_EQ(a.activation_bytes, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(a.total_host_bytes, std::numeric_limits<int64_t>::max());
  EXPECT_NE(error_of([&] { check_job_fits(all, a, 16 * kGiB, 0); }), "");
}

TEST(Preflight, TinyJobFitsAndAvailableMemoryIsReadFromTheSystem) {
  const JobSpec tiny =
      job("{arch: llama, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4}}");
  const int64_t avail = available_host_memory_bytes();
  EXPECT_GT(avail, 0);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t total_kb = 0;
  while (meminfo >> key && key != "MemTotal:") {
  }
  meminfo >> total_kb;
  EXPECT_LE(avail, total_kb * 1024);
  EXPECT_EQ(error_of([&] { check_job_fits(tiny, estimate(tiny), avail, 0); }), "");
  EXPECT_EQ(error_of([&] { check_job_fits(tiny, estimate(tiny), 0, 0); }), "");  // unknown: not checked
  // The limit is compared with the total, to the byte.
  const MemoryEstimate e = estimate(tiny);
  EXPECT_EQ(error_of([&] { check_job_fits(tiny, e, e.total_host_bytes, 0); }), "");
  EXPECT_NE(error_of([&] { check_job_fits(tiny, e, e.total_host_bytes - 1, 0); }), "");
}

// train.offload_parameters: the device holds the runner's ring (two of the largest unit's
// weights) and two consecutive units' gradients, exactly what a StreamedParameters runner
// over the built model holds after a forward and backward; the weights, their gradients and
// the staging are host memory. A 7B that no 24 GB GPU holds whole fits one with it.
TEST(Preflight, OffloadParametersHoldsTwoUnitsOnTheDeviceAsTheRunnerDoes) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, "
      "tie_word_embeddings: false}}";
  const std::vector<std::string> streamed = {"optimizer.mode=offload", "train.activation_checkpointing=true",
                                             "train.offload_parameters=true", "train.micro_batch=2",
                                             "train.seq_len=8"};
  const JobSpec spec = job(model, streamed);
  const JobSpec resident = job(model, {"optimizer.mode=offload", "train.activation_checkpointing=true"});
  const MemoryEstimate est = estimate(spec, 1, true, 4), whole = estimate(resident, 1, true, 4);
  EXPECT_EQ(whole.weight_bytes, est.parameters * 4);
  EXPECT_EQ(est.device_optimizer_bytes, 0);  // the engine runs on the host: no device staging
  EXPECT_EQ(est.streamed_host_bytes, 2 * est.parameters * 4 + est.gradient_bytes);
  // The engine runs on the CPU device over the host leaves: no device staging, on the host
  // either (one rank).
  EXPECT_EQ(est.total_host_bytes, std::max(est.host_optimizer_bytes + est.streamed_host_bytes, est.init_host_bytes));
  EXPECT_LT(est.host_optimizer_bytes, whole.host_optimizer_bytes + whole.device_optimizer_bytes);

  std::unique_ptr<model::CausalLM> lm = make_model_from_spec(spec.model, 256, 1, nullptr);
  engine::StreamedParameters runner(*lm, at::Device(at::kCPU), nullptr);
  lm->set_activation_checkpointing(true);
  runner.begin_step();
  const at::Tensor ids = at::randint(0, 256, {2, 8}, at::kLong);
  model::causal_lm_loss(lm->forward(ids), ids).backward();
  runner.finish_backward();
  EXPECT_EQ(est.weight_bytes, runner.ring_bytes());
  EXPECT_EQ(est.gradient_bytes, runner.gradients_in_flight_bytes());
  EXPECT_EQ(est.streamed_host_bytes - est.gradient_bytes, 2 * runner.host_bytes());
  EXPECT_EQ(est.gradient_bytes, runner.staging_bytes());

  // Llama-2-7B, bf16, micro-batch 1 x 2048 tokens on a 24 GB GPU: resident, the weights and
  // gradients alone are 25 GiB; streamed, the device holds a few layers' worth.
  const std::string llama7b =
      "{arch: llama, config: {hidden_size: 4096, num_hidden_layers: 32, num_attention_heads: 32, "
      "intermediate_size: 11008, vocab_size: 32000, max_position_embeddings: 4096}}";
  const std::vector<std::string> big = {"optimizer.mode=offload", "train.activation_checkpointing=true",
                                        "train.micro_batch=1", "train.seq_len=2048"};
  std::vector<std::string> big_streamed = big;
  big_streamed.push_back("train.offload_parameters=true");
  const MemoryEstimate on = estimate(job(llama7b, big_streamed), 1, true, 2), off = estimate(job(llama7b, big), 1, true, 2);
  const int64_t gpu = 24 * 1000 * 1000 * int64_t{1000};
  EXPECT_GT(off.total_device_bytes, gpu);
  EXPECT_LT(on.total_device_bytes, gpu / 4);
  EXPECT_EQ(error_of([&] { check_job_fits(job(llama7b, big_streamed), on, 512 * kGiB, gpu); }), "");
  EXPECT_NE(error_of([&] { check_job_fits(job(llama7b, big), off, 512 * kGiB, gpu); }), "");
  std::printf("[figure] Llama-2-7B bf16, 1 x 2048 tokens: device %.1f GiB resident, %.1f GiB streamed "
              "(weights ring %.2f GiB, gradients in flight %.2f GiB); host %.1f GiB\n",
              static_cast<double>(off.total_device_bytes) / kGiB, static_cast<double>(on.total_device_bytes) / kGiB,
              static_cast<double>(on.weight_bytes) / kGiB, static_cast<double>(on.gradient_bytes) / kGiB,
              static_cast<double>(on.total_host_bytes) / kGiB);
}

// Two layers of hidden 64, zenflow mode, the weights streamed by column.
JobSpec streamed_zenflow_spec(bool tied = false) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4, "
      "tie_word_embeddings: " + std::string(tied ? "true" : "false") + "}}";
  return job(model, {"optimizer.mode=zenflow", "train.activation_checkpointing=true", "train.offload_parameters=true",
                     "train.micro_batch=2", "train.seq_len=8", "optimizer.zenflow.min_split_numel=1024"});
}

// A model, its StreamedParameters runner (by column) and a zenflow engine over it (one of
// `collectives`' ranks, or one rank), after two steps: warm-up, then the first selection.
// `streamed` false: the same model and engine without the runner (every weight resident).
struct StreamedZenflow {
  std::unique_ptr<model::CausalLM> lm;
  std::unique_ptr<engine::StreamedParameters> runner;
  std::unique_ptr<engine::ZenFlowOptimizer> opt;
  std::vector<engine::StepReport> reports;  // of every step() taken
  StreamedZenflow(const JobSpec& spec, engine::Collectives* collectives = nullptr,
                  engine::StallClock* clock = nullptr, bool streamed = true, double grad_clip = 0.0) {
    lm = make_model_from_spec(spec.model, 256, 1, nullptr);
    if (streamed) runner = std::make_unique<engine::StreamedParameters>(*lm, at::Device(at::kCPU), clock, 1024);
    lm->set_activation_checkpointing(true);
    std::vector<engine::ParamSpec> params;
    for (auto& nt : lm->parameters()) {
      engine::ParamSpec p;
      p.name = nt.name;
      p.param = nt.tensor;
      params.push_back(p);
    }
    engine::EngineOptions o;
    o.mode = engine::OptimizerMode::kZenFlow;
    o.min_split_numel = 1024;
    o.columns_streamed = streamed;
    o.huge_pages = false;
    o.grad_clip = grad_clip;
    opt = std::make_unique<engine::ZenFlowOptimizer>(params, o, clock, collectives);
    if (runner) runner->attach(opt.get());
    for (int step = 0; step < 2; ++step) {
      backward(static_cast<int>(spec.train.grad_accum));
      this->step();
    }
  }
  // One step's forwards and backwards (`micro_batches` of them), before its engine step.
  void backward(int micro_batches) {
    opt->zero_grad();
    if (runner) runner->begin_step();
    for (int m = 0; m < micro_batches; ++m) {
      const at::Tensor ids = at::randint(0, 256, {2, 8}, at::kLong);
      model::causal_lm_loss(lm->forward(ids), ids).backward();
      if (runner) runner->finish_backward();
    }
  }
  void step() { reports.push_back(opt->step({1e-3, 0})); }
};

// One rank with clipping: the gradient norm, and so the clipping factor, is the same bits with
// the weights streamed (each split matrix's selected columns on the device, the others on the
// host) as with the whole gradient resident, from warm-up through the first selection to the
// windows after it (a split matrix's norm is summed column by column either way).
TEST(StreamedZenflowNorm, OneRankGradientNormIsTheResidentOnesBitForBit) {
  JobSpec spec = streamed_zenflow_spec();
  spec.train.grad_accum = 2;
  std::unique_ptr<StreamedZenflow> runs[2];
  for (int streamed = 0; streamed < 2; ++streamed) {
    at::manual_seed(7);
    runs[streamed] = std::make_unique<StreamedZenflow>(spec, nullptr, nullptr, streamed == 1, /*grad_clip=*/1e-3);
    for (int step = 0; step < 6; ++step) {
      runs[streamed]->backward(2);
      runs[streamed]->step();
    }
  }
  const std::vector<engine::StepReport>& resident = runs[0]->reports;
  const std::vector<engine::StepReport>& streamed = runs[1]->reports;
  ASSERT_EQ(resident.size(), 8u);
  ASSERT_EQ(streamed.size(), 8u);
  for (size_t i = 0; i < resident.size(); ++i) {
    EXPECT_GT(resident[i].grad_norm, 1e-2) << "step " << i + 1;  // clipped: the factor is in every weight
    EXPECT_EQ(streamed[i].grad_norm, resident[i].grad_norm) << "step " << i + 1;
  }
  runs[1]->opt->sync_parameters();  // the host columns' weights into the host parameters
  const std::vector<model::NamedTensor> a = runs[0]->lm->parameters(), b = runs[1]->lm->parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(at::equal(a[i].tensor.cpu(), b[i].tensor.cpu())) << a[i].name;
}

// Zenflow mode's unit gradients leave for the host inside the backward, a compute region:
// what the training thread spends on them is the compute's wait, moved from compute to
// transfer_d2h (as the runner moves the weights' to weight_stream), not time on top of
// the compute (which once made a step's stalls and compute exceed its wall time). Every
// host column's gradient is counted once a micro-batch (after the first selection, the
// nine tenths of each split matrix the host owns).
TEST(StreamedZenflowClock, UnitGradientsAreTheComputesWaitNotTimeOnTopOfIt) {
  engine::StallClock clock;
  StreamedZenflow z(streamed_zenflow_spec(), nullptr, &clock);
  int64_t host_columns_bytes = 0, split_bytes = 0;
  const std::vector<model::NamedTensor> params = z.lm->parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (!z.opt->streams_columns(i)) continue;
    const at::Tensor& w = params[i].tensor;
    host_columns_bytes += w.size(0) * z.opt->streamed_columns(i).host_columns.numel() * w.element_size();
    split_bytes += w.numel() * w.element_size();
  }
  ASSERT_GT(host_columns_bytes, 0.85 * static_cast<double>(split_bytes));
  ASSERT_LT(host_columns_bytes, split_bytes);
  for (int micro_batches : {1, 3}) {
    clock.begin_step();
    z.backward(micro_batches);
    const engine::StepTimes t = clock.end_step();
    const double d2h = t.stall_seconds[static_cast<int>(engine::StallCause::kTransferD2H)];
    const double weights = t.stall_seconds[static_cast<int>(engine::StallCause::kWeightStream)];
    EXPECT_GT(d2h, 0);
    EXPECT_NEAR(t.compute_seconds, -(d2h + weights), 1e-9) << micro_batches;  // moved, not added
    EXPECT_EQ(t.stall_total(), d2h + weights);
    EXPECT_EQ(t.transfer_bytes[static_cast<int>(engine::Direction::kD2H)], micro_batches * host_columns_bytes);
    z.opt->step({1e-3, 0});
  }
}

// Zenflow mode streams only the split matrices' host-owned columns: preflight's device
// weights and gradients are what a runner and an engine over the built model hold after a
// step of warm-up (ring sized for every column landed), its host bytes theirs; the device
// keeps each split matrix's selected tenth. With accumulation, the host also stages the
// later micro-batches' unit gradients (two slots of the largest unit's); a tied embedding's
// two uses reach the engine summed, and stage nothing.
TEST(Preflight, OffloadParametersInZenflowModeCountsWhatTheRunnerAndTheEngineHold) {
  int64_t host_once = 0;
  for (const auto& [accum, tied] : {std::pair<int64_t, bool>{1, false}, {2, false}, {1, true}}) {
    SCOPED_TRACE("grad_accum " + std::to_string(accum) + (tied ? ", tied" : ""));
    JobSpec spec = streamed_zenflow_spec(tied);
    spec.train.grad_accum = accum;
    const MemoryEstimate est = estimate(spec, 1, true, 4);
    StreamedZenflow z(spec);
    const engine::StreamedParameters& runner = *z.runner;
    const engine::ZenFlowOptimizer& opt = *z.opt;
    const engine::EngineDeviceBytes dev = opt.device_bytes();
    EXPECT_GT(dev.selected_weights, 0);
    EXPECT_EQ(est.weight_bytes, runner.ring_bytes() + dev.selected_weights + runner.device_leaf_bytes());
    // On a GPU (as estimated here) also the unit before's host columns until their D2H lands
    // (in warm-up every column: a quarter of the ring, two slots of a unit whole and landed).
    EXPECT_EQ(est.gradient_bytes, runner.gradients_in_flight_bytes() + dev.selected_gradients +
                                      runner.device_leaf_bytes() + runner.ring_bytes() / 4);
    EXPECT_EQ(est.host_optimizer_bytes + est.streamed_host_bytes, opt.host_state_bytes() + runner.host_bytes())
        << accum;
    EXPECT_EQ(est.device_optimizer_bytes, dev.optimizer_state + dev.buffers);
    if (accum == 1 && !tied) host_once = opt.host_state_bytes();
    if (accum == 2) {
      EXPECT_EQ(opt.host_state_bytes() - host_once, 2 * runner.ring_bytes() / 4);  // a ring slot: 2 x a unit
    }
  }

  // Llama-2-7B, bf16, 1 x 2048 tokens: zenflow keeps a tenth of every matrix and its AdamW
  // state on the device, streamed or not; streaming drops the other nine tenths and their
  // gradients, and the staging of whole gradients.
  const std::string llama7b =
      "{arch: llama, config: {hidden_size: 4096, num_hidden_layers: 32, num_attention_heads: 32, "
      "intermediate_size: 11008, vocab_size: 32000, max_position_embeddings: 4096}}";
  const std::vector<std::string> big = {"optimizer.mode=zenflow", "train.activation_checkpointing=true",
                                        "train.micro_batch=1", "train.seq_len=2048"};
  std::vector<std::string> big_streamed = big;
  big_streamed.push_back("train.offload_parameters=true");
  const MemoryEstimate on = estimate(job(llama7b, big_streamed), 1, true, 2), off = estimate(job(llama7b, big), 1, true, 2);
  EXPECT_LT(on.total_device_bytes, off.total_device_bytes / 3);
  EXPECT_LT(on.weight_bytes, off.weight_bytes / 4);
  EXPECT_LT(on.device_optimizer_bytes, off.device_optimizer_bytes);  // no whole-gradient staging
  std::printf("[figure] Llama-2-7B bf16, 1 x 2048 tokens, zenflow: device %.1f GiB resident, %.1f GiB streamed "
              "(weights %.2f GiB, gradients %.2f GiB, optimizer state %.2f GiB); host %.1f GiB\n",
              static_cast<double>(off.total_device_bytes) / kGiB, static_cast<double>(on.total_device_bytes) / kGiB,
              static_cast<double>(on.weight_bytes) / kGiB, static_cast<double>(on.gradient_bytes) / kGiB,
              static_cast<double>(on.device_optimizer_bytes) / kGiB, static_cast<double>(on.total_host_bytes) / kGiB);
}

// The same on two data-parallel ranks (threads with in-process collectives): each rank's host
// holds its share of the host state, the step's gradient of every rank's host columns, its
// reduced shard of them and every rank's host columns' weights (what streams); the device the
// same as one rank's. The estimate's share is half the split elements; the ranks' shares add
// up to them.
TEST(Preflight, OffloadParametersInZenflowModeOnTwoRanksCountsWhatEachRankHolds) {
  const JobSpec spec = streamed_zenflow_spec();
  const MemoryEstimate est = estimate(spec, 2, true, 4);
  zenflow::test_support::ThreadGroup group(2);
  int64_t host[2] = {0, 0}, device_weights[2] = {0, 0}, split = 0;
  std::string failure[2];
  auto rank = [&](int r) {
    try {
      zenflow::test_support::ThreadCollectives coll(group, r);
      StreamedZenflow z(spec, &coll);
      host[r] = z.opt->host_state_bytes() + z.runner->host_bytes();
      device_weights[r] = z.runner->ring_bytes() + z.opt->device_bytes().selected_weights + z.runner->device_leaf_bytes();
      if (r == 0) split = z.opt->split_elements();
    } catch (const std::exception& e) {
      failure[r] = e.what();
    }
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  ASSERT_EQ(failure[0], "");
  ASSERT_EQ(failure[1], "");
  ASSERT_EQ(split % 2, 0);
  EXPECT_EQ(2 * (est.host_optimizer_bytes + est.streamed_host_bytes), host[0] + host[1]);
  EXPECT_EQ(est.weight_bytes, device_weights[0]);
  EXPECT_EQ(device_weights[0], device_weights[1]);
}

// The largest Llama-2 shape one 80 GB GPU trains with train.offload_parameters (offload
// mode, bf16, 1 x 2048 tokens): the device holds two of its layers' weights, two layers'
// gradients and the activations, so a 70B fits with room to spare (resident, not even its
// weights do); what bounds the model is host memory, about 16 B per parameter.
TEST(Preflight, OffloadParametersFitsLlama2_70BOnOne80GBGpuAndHostMemoryBoundsIt) {
  struct Shape {
    const char* name;
    const char* config;
  };
  const Shape shapes[] = {
      {"13B", "{arch: llama, config: {hidden_size: 5120, num_hidden_layers: 40, num_attention_heads: 40, "
              "intermediate_size: 13824, vocab_size: 32000, max_position_embeddings: 4096}}"},
      {"70B", "{arch: llama, config: {hidden_size: 8192, num_hidden_layers: 80, num_attention_heads: 64, "
              "num_key_value_heads: 8, intermediate_size: 28672, vocab_size: 32000, max_position_embeddings: 4096}}"},
  };
  const std::vector<std::string> base = {"optimizer.mode=offload", "train.activation_checkpointing=true",
                                         "train.micro_batch=1", "train.seq_len=2048"};
  const int64_t gpu = 80 * 1000 * 1000 * int64_t{1000};
  for (const Shape& sh : shapes) {
    std::vector<std::string> streamed = base;
    streamed.push_back("train.offload_parameters=true");
    const MemoryEstimate on = estimate(job(sh.config, streamed), 1, true, 2);
    const MemoryEstimate off = estimate(job(sh.config, base), 1, true, 2);
    EXPECT_GT(off.total_device_bytes, gpu) << sh.name;  // neither fits resident
    EXPECT_LT(on.total_device_bytes, gpu / 4) << sh.name;
    // Host: bf16 weights and gradients, fp32 master, m and v: at least 16 B per parameter.
    EXPECT_GE(on.total_host_bytes, 16 * on.parameters) << sh.name;
    EXPECT_EQ(error_of([&] { check_job_fits(job(sh.config, streamed), on, on.total_host_bytes + kGiB, gpu); }), "")
        << sh.name;
    const std::string short_host = error_of(
        [&] { check_job_fits(job(sh.config, streamed), on, on.total_host_bytes - kGiB, gpu); });
    EXPECT_NE(short_host.find("host"), std::string::npos) << sh.name << ": " << short_host;
    std::printf("[figure] Llama-2-%s bf16, 1 x 2048 tokens, offload_parameters: device %.1f GiB of 80 GB "
                "(resident: %.1f GiB), host %.0f GiB (%.1f B per parameter)\n",
                sh.name, static_cast<double>(on.total_device_bytes) / kGiB,
                static_cast<double>(off.total_device_bytes) / kGiB, static_cast<double>(on.total_host_bytes) / kGiB,
                static_cast<double>(on.total_host_bytes) / static_cast<double>(on.parameters));
  }
}

TEST(Preflight, OnCudaHostAndDeviceAreCheckedSeparately) {
  const JobSpec spec =
      job("{arch: llama, config: {hidden_size: 64, num_hidden_layers: 2, num_attention_heads: 4}}");
  const MemoryEstimate cpu = estimate(spec, 1, false, 2);
  const MemoryEstimate gpu = estimate(spec, 1, true, 2);
  EXPECT_TRUE(gpu.device_is_cuda);
  EXPECT_EQ(gpu.init_host_bytes, gpu.parameters * 4);  // the fp32 random init on the host
  EXPECT_EQ(gpu.total_host_bytes, std::max(gpu.host_optimizer_bytes, gpu.init_host_bytes));
  EXPECT_GT(gpu.total_device_bytes, cpu.total_device_bytes);  // device staging of split gradients
  EXPECT_EQ(error_of([&] { check_job_fits(spec, gpu, gpu.total_host_bytes, gpu.total_device_bytes); }), "");
  // A tiny model's device memory is mostly activations.
  EXPECT_EQ(gpu.dominant_key, gpu.activation_key);
  const std::string msg = error_of([&] { check_job_fits(spec, gpu, 64 * kGiB, 1024); });
  EXPECT_EQ(msg.rfind(gpu.dominant_key + ": the job needs an estimated " +
                          format_bytes(gpu.total_device_bytes) + " of device memory (parameters ",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("more than the 1 KiB available"), std::string::npos) << msg;
  const std::string host_msg = error_of([&] { check_job_fits(spec, gpu, 1024, 0); });
  EXPECT_NE(host_msg.find("of host memory (parameters "), std::string::npos) << host_msg;
}

TEST(Preflight, WarningsNameTheKeyAndWhatReallyHappens) {
  const JobSpec quiet = job("{arch: llama}");
  EXPECT_EQ(preflight_warnings(quiet, false, 2), std::vector<std::string>{});
  EXPECT_EQ(preflight_warnings(job("{arch: llama}", {"optimizer.host.threads=1"}), false, 2),
            std::vector<std::string>{});

  const JobSpec noisy = job(
      "{arch: llama}", {"optimizer.host.threads=64", "optimizer.host.nodes=2", "train.compute_threads=8",
                        "train.autocast=bfloat16", "cost.instance_type=p4d.24xlarge", "cost.usd_per_hour=32",
                        "resources.workers=3", "resources.host_memory_gb=48", "resources.priority=5"});
  const std::vector<std::string> expected = {
      "optimizer.host.threads: 64 requested but this process has 2 cores; using 1 and leaving the rest for "
      "compute",
      "optimizer.host.nodes: 2 requested, but only a coordinator assigns optimizer nodes (zenflow submit); name them in "
      "optimizer.host.addresses (the host optimizer runs in this process)",
      "train.compute_threads: 8 requested but this process has 2 cores; the threads will share them",
      "train.autocast: bfloat16 is ignored on the CPU (autocast is CUDA-only); the CPU computes in the "
      "weights' dtype (float32)",
      "resources.workers: 3 requested, but zenflow run starts the ranks of one machine "
      "(resources.gpus_per_worker, or --nproc); zenflow submit places it on that many workers",
      "resources.host_memory_gb: not enforced by zenflow run (a coordinator places by it); the memory "
      "check uses the memory this machine has available",
      "resources.priority: ignored by zenflow run (a coordinator queues by it)",
  };
  EXPECT_EQ(preflight_warnings(noisy, false, 2), expected);
  // A rank the worker agent started was placed by a coordinator: no resources.* warnings.
  ::setenv("ZENFLOW_SCHEDULED", "1", 1);
  EXPECT_EQ(preflight_warnings(noisy, false, 2).size(), expected.size() - 3);
  ::unsetenv("ZENFLOW_SCHEDULED");
  // On CUDA autocast takes effect.
  const auto on_cuda = preflight_warnings(noisy, true, 2);
  EXPECT_EQ(on_cuda.size(), expected.size() - 1);
  // One core: the host optimizer shares it.
  EXPECT_EQ(
      preflight_warnings(job("{arch: llama}", {"optimizer.host.threads=4"}), false, 1),
      std::vector<std::string>{
          "optimizer.host.threads: 4 requested but this process has 1 core; using 1, shared with compute"});
  // Settings with no effect in their context.
  EXPECT_EQ(preflight_warnings(job("{arch: llama}", {"optimizer.mode=device", "optimizer.host.threads=2",
                                                     "optimizer.host.reserved_cores=[0]"}),
                               false, 8),
            (std::vector<std::string>{
                "optimizer.host.threads: ignored: optimizer.mode device has no host optimizer",
                "optimizer.host.reserved_cores: ignored: optimizer.mode device has no host optimizer"}));
  EXPECT_EQ(
      preflight_warnings(
          job("{arch: llama}", {"optimizer.host.threads=2", "optimizer.host.reserved_cores=[0]"}), false, 8),
      std::vector<std::string>{"optimizer.host.threads: ignored: optimizer.host.reserved_cores gives the "
                               "host optimizer 1 core(s)"});
}

TEST(Preflight, Float16OnTheCpuIsAnErrorNamingTrainDtype) {
  // LibTorch 1.13's CPU kernels have no fp16 matmul, softmax or norms (probed, not assumed).
  const std::string msg =
      error_of([&] { preflight_errors(job("{arch: llama}", {"train.dtype=float16"}), false); });
  EXPECT_EQ(msg.rfind("train.dtype: float16 cannot train on the CPU with this LibTorch (", 0), 0u) << msg;
  EXPECT_NE(msg.find("'Half'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("; use float32 or auto on the CPU, or a GPU"), std::string::npos) << msg;
  EXPECT_EQ(error_of([&] { preflight_errors(job("{arch: llama}", {"train.dtype=bfloat16"}), false); }), "");
  {
    const c10::NoGradGuard no_grad;  // the probe turns autograd on for itself
    EXPECT_EQ(error_of([&] { preflight_errors(job("{arch: llama}", {"train.dtype=bfloat16"}), false); }), "");
  }
  EXPECT_EQ(error_of([&] { preflight_errors(job("{arch: llama}", {"train.dtype=float32"}), false); }), "");
  EXPECT_EQ(error_of([&] { preflight_errors(job("{arch: llama}", {"train.dtype=float16"}), true); }), "");
}

TEST(Preflight, ModelArchContradictingModelFromIsAnErrorAndTheDirectoryIsEstimated) {
  const fs::path dir = fs::temp_directory_path() / ("zenflow_preflight_" + std::to_string(::getpid()));
  remove_tree(dir);
  fs::create_directories(dir);
  const JobSpec random =
      job("{arch: gpt2, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4}}");
  model::LoadedModel info;
  auto lm = make_model_from_spec(random.model, 256, 1, &info);
  const std::string model_dir = (dir / "gpt2").string();
  model::export_hf_model(*lm, info.config, model_dir, at::kFloat, "");

  ModelSpec m;
  m.from = model_dir;
  m.arch = "llama";
  m.arch_given = true;
  const std::string expected = "model.arch: 'llama' contradicts model.from (" + model_dir +
                               "/config.json is a gpt2 model); remove model.arch or change it";
  EXPECT_EQ(error_of([&] { describe_model_from_spec(m, 256); }), expected);
  EXPECT_EQ(error_of([&] { make_model_from_spec(m, 256, 1, nullptr); }), expected);
  m.arch = "gpt2";
  EXPECT_EQ(error_of([&] { describe_model_from_spec(m, 256); }), "");
  m.arch = "llama";
  m.arch_given = false;  // config.json decides
  EXPECT_EQ(error_of([&] { make_model_from_spec(m, 256, 1, nullptr); }), "");

  // The estimate of a model directory: the same count, and model.from is the key to change.
  // (A tiny batch, so that the weights, not the activations, dominate.)
  JobSpec from_dir = parse_job_spec(
      "name: t\ndata: {train: c}\nmodel: {from: " + model_dir + "}\ntrain: {micro_batch: 1, seq_len: 2}\n",
      {}, "/base");
  EXPECT_FALSE(from_dir.model.arch_given);
  const MemoryEstimate e = estimate(from_dir);
  EXPECT_EQ(e.parameters, built_parameters(random));
  EXPECT_EQ(e.model_key, "model.from");
  EXPECT_EQ(error_of([&] { check_job_fits(from_dir, e, 1024, 0); }).rfind("model.from: the job needs", 0),
            0u);
  remove_tree(dir);
}

// train.activation_checkpointing: the estimate keeps each layer's input and one layer's
// intermediates (and on LibTorch 1.x one layer's attention probabilities) instead of every
// layer's; nothing else changes.
TEST(Preflight, ActivationCheckpointingKeepsOneLayersIntermediatesInTheEstimate) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 64, num_hidden_layers: 4, num_attention_heads: 4, "
      "intermediate_size: 128}}";
  const JobSpec plain = job(model, {"train.micro_batch=2", "train.seq_len=32"});
  const JobSpec ckpt =
      job(model, {"train.micro_batch=2", "train.seq_len=32", "train.activation_checkpointing=true"});
  for (const bool cuda : {false, true}) {
    SCOPED_TRACE(cuda ? "cuda" : "cpu");
    const int e = cuda ? 2 : 4;
    const MemoryEstimate a = estimate(plain, 1, cuda, e);
    const MemoryEstimate b = estimate(ckpt, 1, cuda, e);
    const int64_t B = 2, T = 32, H = 64, I = 128, L = 4, heads = 4;
    const int64_t per_layer = B * T * (16 * H + 4 * I) * e;
    int64_t fewer = per_layer * (L - 1) - B * T * H * e * L;
#if !(TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
    fewer += B * heads * T * T * (4 + (e == 2 ? e : 0)) * (L - 1);
#endif
    EXPECT_EQ(a.activation_bytes - b.activation_bytes, fewer);
    EXPECT_EQ(a.total_device_bytes - b.total_device_bytes, fewer);
    EXPECT_EQ(a.weight_bytes, b.weight_bytes);
    EXPECT_EQ(a.device_optimizer_bytes, b.device_optimizer_bytes);
  }
}

// train.shard on 4 ranks: parameters divides the weights, gradients and device optimizer
// state by 4 (the engine stages its own rows only) and adds four of the largest unit's
// weights; gradients keeps the whole weights beside the rank's rows and one unit's
// gradients for the reduce-scatter. One rank has nothing to shard across.
TEST(Preflight, ShardingDividesWhatEachRankHolds) {
  const std::string model =
      "{arch: llama, config: {hidden_size: 64, num_hidden_layers: 4, num_attention_heads: 4, "
      "intermediate_size: 128}}";
  const std::vector<std::string> base = {"optimizer.mode=zenflow", "train.activation_checkpointing=true"};
  auto with = [&](const char* shard) {
    std::vector<std::string> sets = base;
    sets.push_back(std::string("train.shard=") + shard);
    return job(model, sets);
  };
  for (const bool cuda : {false, true}) {
    SCOPED_TRACE(cuda ? "cuda" : "cpu");
    const int e = cuda ? 2 : 4;
    const MemoryEstimate none = estimate(with("none"), 4, cuda, e);
    const MemoryEstimate params = estimate(with("parameters"), 4, cuda, e);
    const MemoryEstimate grads = estimate(with("gradients"), 4, cuda, e);
    const int64_t P = none.parameters, H = 64, V = 256, L = 4;
    EXPECT_EQ(none.weight_bytes, P * e);
    EXPECT_EQ(params.weight_bytes, P * e / 4);
    EXPECT_EQ(params.gradient_bytes, P * e / 4);
    EXPECT_EQ(grads.weight_bytes, P * e + P * e / 4);
    EXPECT_EQ(grads.gradient_bytes, P * e / 4);
    const int64_t unit = std::max(V * H + H, (P - V * H) / L);
    EXPECT_EQ(params.shard_buffer_bytes, 4 * unit * e);
    EXPECT_EQ(grads.shard_buffer_bytes, unit * e);
    EXPECT_EQ(none.shard_buffer_bytes, 0);
    EXPECT_LT(params.device_optimizer_bytes, none.device_optimizer_bytes / 3);
    // The host state was 1/4 already; a sharded rank's one-rank engine needs no packed
    // output buffer (capacity x e) that the partitioned engine of `none` does.
    const int64_t split = estimate(with("none"), 1, cuda, e).host_optimizer_bytes / (e == 4 ? 36 : 32);
    EXPECT_EQ(none.host_optimizer_bytes - params.host_optimizer_bytes, (split + 3) / 4 * e);
    EXPECT_LT(params.total_device_bytes, none.total_device_bytes);
    EXPECT_EQ(params.total_device_bytes, params.weight_bytes + params.gradient_bytes + params.device_optimizer_bytes +
                                             params.activation_bytes + params.shard_buffer_bytes);
    const MemoryEstimate one = estimate(with("parameters"), 1, cuda, e);
    EXPECT_EQ(one.weight_bytes, P * e);
    EXPECT_EQ(one.shard_buffer_bytes, 0);
  }
}

}  // namespace
}  // namespace zenflow
