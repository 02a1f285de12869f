// The job profile: steady steps from the observer, probes on the job's own cores.
#include "worker/rank/job_profiler.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "common/version.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/device_ops.h"
#include "worker/engine/host_optimizer.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/model/hf_model.h"
#include "worker/model/tokenizer.h"
#include "worker/rank/model_factory.h"
#include "worker/rank/preflight.h"

namespace zenflow {
namespace {

using engine::StallCause;
using engine::StepTimes;
using engine::Stopwatch;

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const size_t c = line.find(':');
      return c == std::string::npos ? line : line.substr(c + 2);
    }
  return "unknown CPU";
}

std::string gpu_name() {
  FILE* f = ::popen("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1", "r");
  if (!f) return "";
  char buf[256] = {0};
  std::string out = std::fgets(buf, sizeof buf, f) ? buf : "";
  ::pclose(f);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

void sync(const at::Device& d) {
  if (d.is_cuda()) at::empty({1}, at::TensorOptions().device(d)).cpu();  // a blocking read drains the stream
}

// Median seconds of `reps` calls of fn after one warm-up call.
template <class F>
double time_median(const at::Device& d, int reps, F&& fn) {
  fn();
  sync(d);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    Stopwatch sw;
    fn();
    sync(d);
    t.push_back(sw.seconds());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

int64_t cfg_int(const nlohmann::json& c, std::initializer_list<const char*> keys) {
  for (const char* k : keys)
    if (c.contains(k) && c[k].is_number_integer()) return c[k].get<int64_t>();
  return 0;
}

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The steady step over windows of `u` steps: for each position in the window (a zenflow
// boundary is the last), the median over windows of every quantity, then their mean over
// the positions. Medians, because other processes on a shared host stall single steps.
StepTimes window_median(const std::vector<StepTimes>& steps, size_t begin, int64_t u, int64_t* used) {
  const size_t U = static_cast<size_t>(u), windows = (steps.size() - begin) / U;
  StepTimes m;
  for (size_t pos = 0; pos < U; ++pos) {
    auto med = [&](auto get) {
      std::vector<double> v;
      for (size_t w = 0; w < windows; ++w) v.push_back(get(steps[begin + w * U + pos]));
      return median_of(v) / static_cast<double>(U);
    };
    m.wall_seconds += med([](const StepTimes& s) { return s.wall_seconds; });
    m.compute_seconds += med([](const StepTimes& s) { return s.compute_seconds; });
    m.device_optimizer_seconds += med([](const StepTimes& s) { return s.device_optimizer_seconds; });
    for (int c = 0; c < engine::kNumStallCauses; ++c)
      m.stall_seconds[c] += med([c](const StepTimes& s) { return s.stall_seconds[c]; });
    for (int d = 0; d < engine::kNumDirections; ++d)
      m.transfer_bytes[d] += static_cast<int64_t>(
          std::llround(med([d](const StepTimes& s) { return static_cast<double>(s.transfer_bytes[d]); })));
  }
  *used = static_cast<int64_t>(windows * U);
  return m;
}

// Host AdamW elements/s through the engine's own host updater (InProcessHostOptimizer:
// its driver thread, its pool of `threads` workers pinned to `cores`; its arrays are
// touched by the first, untimed, step), one step job over
// `n` elements in spans of the job's mean split-parameter size, each after an idle gap as
// long as a step's forward and backward (so the workers' wake-up is in it, as in training).
double host_adam_rate(int threads, const std::vector<int>& cores, int64_t n, int64_t span_elements,
                      double gap_s) {
  engine::InProcessHostOptions o;
  o.threads = threads;
  o.cores = cores;
  engine::HostStateLayout layout;
  layout.elements = n;
  std::unique_ptr<engine::HostOptimizer> host = engine::make_in_process_host_optimizer(o, layout);
  engine::HostThreadPool touch(threads, cores);
  engine::HostBuffer g(n, &touch, true);
  const engine::AdamWCoeffs c = engine::AdamWCoeffs::make(engine::AdamWParams{}, 10);
  auto job = [&] {
    engine::StepJob j;
    const int64_t each = std::max<int64_t>(4096, span_elements);
    for (int64_t b = 0; b < n; b += each) {
      engine::StepJob::Span sp;
      sp.offset = b;
      sp.grad = engine::GradRef::f32(g.data() + b);
      sp.n = std::min(each, n - b);
      sp.coeffs = c;
      j.spans.push_back(sp);
    }
    return j;
  };
  const engine::StepJob proto = job();
  std::vector<double> t;
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(gap_s));
    Stopwatch sw;
    host->submit(proto)->wait();
    if (i > 0) t.push_back(sw.seconds());
  }
  std::sort(t.begin(), t.end());
  return static_cast<double>(n) / t[t.size() / 2];
}

}  // namespace

ProfileObserver::ProfileObserver() : cores_(engine::available_cores()) {}

void ProfileObserver::on_start(const RunFacts& facts) {
  capacity_ = static_cast<size_t>(std::max<int64_t>(0, facts.total_steps - facts.start_step));
  steps_.clear();
  steps_.reserve(capacity_);
  host_steps_.clear();
  host_steps_.reserve(capacity_);
  first_step_ = facts.start_step + 1;
}

void ProfileObserver::on_step(const TrainingStep& step) noexcept {
  if (steps_.size() < capacity_) {  // reserved: no allocation
    steps_.push_back(step.times);
    host_steps_.push_back(step.host_step_seconds);
  }
}

advisor::JobProfile build_job_profile(const JobSpec& spec, const RunSummary& sum,
                                      const ProfileObserver& obs) {
  advisor::JobProfile p;
  p.job = spec.name;
  const bool cuda = sum.device.rfind("cuda", 0) == 0;
  const at::Device device = cuda ? at::Device(sum.device) : at::Device(at::kCPU);
  const std::vector<int> avail =
      obs.process_cores().empty() ? engine::available_cores() : obs.process_cores();
  p.measured_on.cpu_model = cpu_model_name();
  p.measured_on.cores = static_cast<int64_t>(avail.size());
  p.measured_on.gpu = cuda ? gpu_name() : "";
  p.measured_on.device = cuda ? "cuda" : "cpu";
  p.measured_on.host =
      p.measured_on.cpu_model + ", " + std::to_string(avail.size()) + " cores, " +
      (cuda ? (p.measured_on.gpu.empty() ? std::string("a CUDA GPU") : p.measured_on.gpu) : "no GPU");
  p.measured_on.date = advisor::today_utc();
  p.measured_on.zenflow_version = kVersion;

  // The model.
  const auto tokenizer = model::load_tokenizer(spec.data.tokenizer);
  const model::LoadedModel described = describe_model_from_spec(spec.model, tokenizer->vocab_size());
  p.model.arch = described.arch;
  p.model.parameters = sum.params;
  p.model.split_parameters = sum.split_params;
  p.model.layers = cfg_int(described.config, {"num_hidden_layers", "n_layer"});
  p.model.hidden = cfg_int(described.config, {"hidden_size", "n_embd"});
  p.model.vocab = cfg_int(described.config, {"vocab_size"});
  const int dtype_bytes = (spec.train.dtype == "float32" || (spec.train.dtype == "auto" && !cuda)) ? 4 : 2;
  p.model.weight_dtype_bytes = dtype_bytes;

  // The settings that ran, with the core binding (trainer.cpp's plan_cores: the host
  // optimizer on the last cores, or optimizer.host.reserved_cores).
  const auto& z = spec.optimizer.zenflow;
  p.run.mode = spec.optimizer.mode;
  p.run.micro_batch = spec.train.micro_batch;
  p.run.grad_accum = spec.train.grad_accum;
  p.run.seq_len = spec.train.seq_len;
  p.run.world_size = sum.world_size;
  p.run.update_interval = spec.optimizer.mode == "zenflow" && z.update_interval > 0 ? z.update_interval : 1;
  p.run.topk_ratio = spec.optimizer.mode == "zenflow" ? z.topk_ratio : 0;
  p.run.host_threads = sum.host_threads;
  p.run.compute_threads = sum.compute_threads;
  p.run.steps = spec.train.steps;
  std::vector<int> host_cores;
  if (sum.host_threads > 0) {
    if (!spec.optimizer.host.reserved_cores_auto) {
      for (int c : spec.optimizer.host.reserved_cores) host_cores.push_back(c);
    } else {
      host_cores.assign(avail.end() - std::min<long>(sum.host_threads, static_cast<long>(avail.size())),
                        avail.end());
    }
  }
  for (int c : host_cores) p.run.host_cores.push_back(c);
  for (int c : avail)
    if (std::find(host_cores.begin(), host_cores.end(), c) == host_cores.end())
      p.run.compute_cores.push_back(c);
  if (p.run.compute_cores.empty())
    for (int c : avail) p.run.compute_cores.push_back(c);

  // Steady steps: after warm-up, and after the first window (the pipeline filling).
  const int64_t u = p.run.update_interval;
  const int64_t warm = spec.optimizer.mode == "zenflow" ? z.full_warm_up_rounds : 0;
  const size_t begin =
      static_cast<size_t>(std::max<int64_t>(0, warm - (obs.first_step() - 1)) + (u > 1 ? u : 2));
  const auto& steps = obs.steps();
  if (steps.size() < begin + 2 * static_cast<size_t>(u))
    throw std::runtime_error(
        "--profile: train.steps " + std::to_string(spec.train.steps) +
        " leaves too few steady steps; profiling needs at least " +
        std::to_string(begin + 2 * static_cast<size_t>(u) + static_cast<size_t>(obs.first_step() - 1)) +
        " (warm-up, one window to fill the pipeline, two to measure)");
  int64_t used = 0;
  const StepTimes m = window_median(steps, begin, u, &used);
  p.step.steps_measured = used;
  p.step.tokens_per_step = sum.tokens_per_step;
  p.step.step_seconds = m.wall_seconds;
  p.step.compute_seconds = m.compute_seconds;
  p.step.device_optimizer_seconds = m.device_optimizer_seconds;
  double parts = m.compute_seconds + m.device_optimizer_seconds;
  for (int c = 0; c < engine::kNumStallCauses; ++c) {
    const auto cause = static_cast<StallCause>(c);
    if (cause == StallCause::kCheckpoint || cause == StallCause::kCheckpointUpload) continue;
    p.step.stall_seconds[engine::stall_cause_name(cause)] = m.stall_seconds[c];
    parts += m.stall_seconds[c];
  }
  p.step.other_seconds =
      std::max(0.0, m.wall_seconds - parts - m.stall_seconds[static_cast<int>(StallCause::kCheckpoint)] -
                        m.stall_seconds[static_cast<int>(StallCause::kCheckpointUpload)]);
  p.step.step_seconds = parts + p.step.other_seconds;  // checkpoints are not a step's
  p.step.d2h_bytes = m.transfer_bytes[0];
  p.step.h2d_bytes = m.transfer_bytes[1] + m.transfer_bytes[2];  // the streamed weights are H2D too
  const double ran = static_cast<double>(std::max<int64_t>(1, sum.steps - sum.start_step));
  p.step.collective_bytes["gradients"] =
      static_cast<int64_t>(static_cast<double>(sum.comm_gradient_bytes) / ran);
  p.step.collective_bytes["selection"] =
      static_cast<int64_t>(static_cast<double>(sum.comm_selection_bytes) / ran);
  p.step.collective_bytes["parameters"] =
      static_cast<int64_t>(static_cast<double>(sum.comm_parameter_bytes) / ran);
  {
    // The host AdamW steps as they ran in training (each window's, applied at the boundary;
    // offload's, every step): the advisor calibrates the probes' host rate with it.
    std::vector<double> host;
    for (size_t i = begin; i < steps.size() && i < obs.host_step_seconds().size(); ++i)
      if (obs.host_step_seconds()[i] >= 0) host.push_back(obs.host_step_seconds()[i]);
    p.step.host_step_seconds = host.empty() ? -1 : median_of(host);
  }
  if (u > 1) {
    std::vector<double> boundary, accumulation;
    for (size_t i = begin; i < steps.size(); ++i)
      ((i - begin) % static_cast<size_t>(u) == static_cast<size_t>(u) - 1 ? boundary : accumulation)
          .push_back(steps[i].wall_seconds);
    p.step.boundary_step_seconds = median_of(boundary);
    p.step.accumulation_step_seconds = median_of(accumulation);
  }

  // Probes. GEMM at the job's shapes: [tokens of a micro-batch, hidden] x [hidden, 4 hidden].
  const int compute_threads = static_cast<int>(std::max<int64_t>(1, sum.compute_threads));
  const int64_t rows = std::max<int64_t>(16, spec.train.micro_batch * spec.train.seq_len);
  const int64_t hidden = std::max<int64_t>(64, p.model.hidden);
  const auto opts = at::TensorOptions().device(device).dtype(cuda ? at::kBFloat16 : at::kFloat);
  {
    at::Tensor a = at::randn({rows, hidden}, opts), b = at::randn({hidden, 4 * hidden}, opts);
    std::vector<int> counts;
    for (int t = 1; t < compute_threads; t *= 2) counts.push_back(t);
    counts.push_back(compute_threads);
    if (cuda) counts = {compute_threads};
    for (int t : counts) {
      at::set_num_threads(t);
      const double s = time_median(device, 5, [&] { (void)at::mm(a, b); });
      p.probes.gemm_gflops[t] = 2.0 * static_cast<double>(rows * hidden * 4 * hidden) / s / 1e9;
    }
    at::Tensor a2 = at::randn({2 * rows, hidden}, opts);
    const double s2 = time_median(device, 5, [&] { (void)at::mm(a2, b); });
    p.probes.gemm_gflops_twice_the_tokens =
        2.0 * static_cast<double>(2 * rows * hidden * 4 * hidden) / s2 / 1e9;
    at::set_num_threads(compute_threads);
  }
  // The GEMM share of compute: 6 x GEMM parameters (all but the input embedding) x tokens.
  const double gemm_params =
      static_cast<double>(std::max<int64_t>(0, sum.params - p.model.vocab * p.model.hidden));
  const double tokens_rank =
      static_cast<double>(spec.train.micro_batch * spec.train.grad_accum * spec.train.seq_len);
  const double gemm_s = 6.0 * gemm_params * tokens_rank / (p.probes.gemm_gflops[compute_threads] * 1e9);
  p.step.gemm_share = p.step.compute_seconds > 0 ? std::min(1.0, gemm_s / p.step.compute_seconds) : 0;
  // Device AdamW and streaming, the engine's own kernels on the device.
  {
    const int64_t n = std::clamp<int64_t>(sum.params, 1 << 20, 16 << 20);
    const auto f32 = at::TensorOptions().device(device).dtype(at::kFloat);
    at::Tensor w = at::randn({n}, f32), g = at::randn({n}, f32).mul_(1e-2), mm = at::zeros({n}, f32),
               vv = at::zeros({n}, f32);
    const engine::AdamWCoeffs c = engine::AdamWCoeffs::make(engine::AdamWParams{}, 10);
    const double s =
        time_median(device, 5, [&] { engine::device_ops::dense_adamw(w, g, at::Tensor(), mm, vv, c, 1.0f); });
    p.probes.device_adamw_elements_per_second = static_cast<double>(n) / s;
    const double add = time_median(device, 5, [&] { mm.add_(g); });
    p.probes.device_memory_gbps = 12.0 * static_cast<double>(n) / add / 1e9;
    // Copies each way: device <-> host staging (pinned on CUDA), as the engine's transfers.
    at::Tensor host = at::empty({n}, at::TensorOptions().dtype(at::kFloat).pinned_memory(cuda));
    const double d2h = time_median(device, 5, [&] { host.copy_(g, /*non_blocking=*/false); });
    const double h2d = time_median(device, 5, [&] { mm.copy_(host, false); });
    p.probes.d2h_gbps = 4.0 * static_cast<double>(n) / d2h / 1e9;
    p.probes.h2d_gbps = 4.0 * static_cast<double>(n) / h2d / 1e9;
  }
  // Host AdamW at 1, 2, 4 ... cores: the job's host cores first, then the rest.
  {
    std::vector<int> order = host_cores;
    for (int c : avail)
      if (std::find(order.begin(), order.end(), c) == order.end()) order.push_back(c);
    const int64_t n =
        std::clamp<int64_t>(sum.split_params > 0 ? sum.split_params : sum.params, 1 << 20, 16 << 20);
    std::vector<int> counts;
    for (int t = 1; t < static_cast<int>(order.size()); t *= 2) counts.push_back(t);
    counts.push_back(static_cast<int>(order.size()));
    for (int t : counts) {
      std::vector<int> cores(order.begin(), order.begin() + t);
      const int64_t params_2d = std::max<int64_t>(1, 7 * std::max<int64_t>(1, p.model.layers) + 2);
      p.probes.host_adam_elements_per_second[t] =
          host_adam_rate(t, cores, n, n / params_2d, std::min(0.05, p.step.compute_seconds));
    }
  }

  // Host and device bytes per parameter for every mode (preflight's accounting), as on a
  // GPU with 16-bit weights: what the advisor's fit checks need.
  for (const char* mode : {"device", "offload", "zenflow"}) {
    JobSpec s = spec;
    s.optimizer.mode = mode;
    const MemoryEstimate e1 = estimate_job_memory(s, described, 1, /*device_is_cuda=*/true, 2);
    const MemoryEstimate e2 = estimate_job_memory(s, described, 2, /*device_is_cuda=*/true, 2);
    const double n = static_cast<double>(std::max<int64_t>(1, e1.parameters));
    auto dev = [](const MemoryEstimate& e) {
      return static_cast<double>(e.weight_bytes + e.gradient_bytes + e.device_optimizer_bytes);
    };
    advisor::ModeMemory mm;
    mm.host_bytes_per_parameter = static_cast<double>(e1.host_optimizer_bytes) / n;
    mm.device_bytes_per_parameter = dev(e1) / n;
    // bytes(W) = fixed + partitioned / W, from W = 1 and W = 2.
    mm.host_partitioned =
        std::clamp(2.0 * static_cast<double>(e1.host_optimizer_bytes - e2.host_optimizer_bytes) / n, 0.0,
                   mm.host_bytes_per_parameter);
    mm.device_partitioned = std::clamp(2.0 * (dev(e1) - dev(e2)) / n, 0.0, mm.device_bytes_per_parameter);
    p.memory[mode] = mm;
  }
  p.activation_bytes = static_cast<double>(
      estimate_job_memory(spec, described, sum.world_size, cuda, dtype_bytes).activation_bytes);
  return p;
}

std::string write_job_profile(const JobSpec& spec, const advisor::JobProfile& profile) {
  namespace fs = std::filesystem;
  const fs::path dir = spec.checkpoint.dir.empty() ? fs::path(".") : fs::path(spec.checkpoint.dir);
  fs::create_directories(dir);
  const fs::path out = dir / kProfileFileName,
                 tmp = dir / (std::string(kProfileFileName) + ".tmp." + std::to_string(::getpid()));
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f << profile.to_yaml();
    if (!f) throw std::runtime_error(tmp.string() + ": cannot write the profile");
  }
  fs::rename(tmp, out);
  return out.string();
}

}  // namespace zenflow
