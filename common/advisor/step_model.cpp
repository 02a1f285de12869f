// The step-time model: raw terms from constants, scaled by the profile's calibration.
#include "common/advisor/step_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <vector>

namespace zenflow::advisor {
namespace {

constexpr double kAssumedMfu = 0.40;             // Llama-3.1 38-43% (docs/benchmarks.md §5, PaLM App. B)
constexpr double kDeviceStreamEfficiency = 0.8;  // of HBM bandwidth for 28 B/element AdamW
constexpr double kBackwardOverlap = 0.5;         // of backward that hides collectives (DDP buckets)
constexpr double kGpuMemoryUsable = 0.9;         // CUDA context, fragmentation
constexpr double kHostRamUsable = 0.9;
constexpr double kHostRamBaseGib = 4;   // per node: the process, the dataset, the OS
constexpr int64_t kGpuWeightBytes = 2;  // bf16 weights and gradients on a GPU
// Activation checkpointing runs each layer's forward again in backward: one more forward,
// a third of forward + backward's FLOPs.
constexpr double kRecomputeFactor = 4.0 / 3.0;
constexpr double kGib = 1024.0 * 1024.0 * 1024.0;

// GPU name as nvidia-smi writes it ("NVIDIA H100 80GB HBM3") -> the table's entry.
const GpuSpec* spec_for_device_name(const std::string& name) {
  if (const GpuSpec* g = find_gpu_spec(name)) return g;
  for (const char* key : {"GH200", "H200", "H100", "A100", "L40S", "A10G", "L4"}) {
    if (name.find(key) == std::string::npos) continue;
    std::string n = key;
    if (n == "H100" && name.find("PCIe") == std::string::npos) n = "H100-SXM";
    if (n == "A100") n = name.find("80") != std::string::npos ? "A100-SXM4-80GB" : "A100-SXM4-40GB";
    return find_gpu_spec(n);
  }
  return nullptr;
}

// PaLM App. B: 6 per parameter (forward + backward) and attention's scores and values, 12 L
// x (heads x head_dim) x seq: the T^2 term.
double flops_per_token(double params, double layers, double attention_width, double seq) {
  return 6.0 * params + 12.0 * layers * attention_width * seq;
}

// GEMM GFLOP/s at `threads` from the probe (linear beyond the measured counts).
double gemm_rate(const std::map<int64_t, double>& g, int64_t threads) {
  if (g.empty()) return 1;
  auto it = g.find(threads);
  if (it != g.end()) return it->second;
  auto last = std::prev(g.end());
  auto first = g.begin();
  if (threads > last->first)
    return last->second * static_cast<double>(threads) / static_cast<double>(last->first);
  return first->second * static_cast<double>(threads) / static_cast<double>(first->first);
}

// The model's size as asked: a model config's exact shapes, else the profile's model with
// `parameters` scaled (layers and hidden by the cube root).
struct Shape {
  double params, split, layers, hidden, attention_width;
};
Shape shape_of(const JobProfile& p, const Scenario& s) {
  if (s.model) {
    const ModelShape& m = *s.model;
    return {static_cast<double>(m.parameters), static_cast<double>(m.split_parameters()),
            static_cast<double>(m.layers), static_cast<double>(m.hidden),
            static_cast<double>(m.attention_width())};
  }
  const double n0 = static_cast<double>(p.model.parameters);
  const double n = s.parameters > 0 ? s.parameters : n0;
  const double grow = std::cbrt(n / n0);
  const double split_frac = static_cast<double>(p.model.split_parameters) / n0;
  const double hidden = static_cast<double>(p.model.hidden) * grow;
  return {n, n * split_frac, static_cast<double>(p.model.layers) * grow, hidden, hidden};
}

// The terms of one step before calibration.
struct Terms {
  double compute = 0, dopt = 0, dopt_passes = 0, d2h = 0, h2d = 0, host_win = 0, host_sync = 0, coll = 0,
         data = 0, other = 0;
  double split_elems = 0;  // per rank, host-owned elements
  int64_t U = 1;
  bool overlap = false;  // zenflow: the host window overlaps the next U - 1 steps
  double eta = 1;
  double d2h_bytes = 0, h2d_bytes = 0;
};

struct Context {
  const JobProfile& p;
  const Instance& in;
  const Scenario& s;
  bool same_device;  // the profile was measured on this kind of device: its compute calibrates
  int64_t W;
  std::vector<std::string>* assumed;
  std::map<std::string, Sourced>* inputs;
};

void note(Context& c, const std::string& key, const Sourced& v) {
  (*c.inputs)[key] = v;
  if (v.origin == Origin::kAssumed) {
    const std::string line = key + " = " + std::to_string(v.value) + " (" + v.source + ")";
    if (std::find(c.assumed->begin(), c.assumed->end(), line) == c.assumed->end()) c.assumed->push_back(line);
  }
}

Terms raw_terms(Context& c) {
  const JobProfile& p = c.p;
  const Instance& in = c.in;
  const Scenario& s = c.s;
  Terms t;
  const Shape sh = shape_of(p, s);
  const Shape ref = shape_of(p, scenario_of(p));
  const double tok = static_cast<double>(s.micro_batch * s.grad_accum * s.seq_len);
  const double tok_ref = static_cast<double>(p.run.micro_batch * p.run.grad_accum * p.run.seq_len);
  const double f =
      flops_per_token(sh.params, sh.layers, sh.attention_width, static_cast<double>(s.seq_len)) * tok;
  const double f_ref =
      flops_per_token(ref.params, ref.layers, ref.attention_width, static_cast<double>(p.run.seq_len)) *
      tok_ref;
  const double fg = p.step.gemm_share;
  // The GEMM rate grows with a micro-batch's tokens while the weights, not the arithmetic,
  // bound it: rate ~ tokens^a, with a from the probe at the job's tokens and at twice them
  // (0: arithmetic-bound, 1: the time does not grow at all). Measured here, llama 384 x 2 on
  // one core: 60 -> 92 GFLOP/s from 16 to 32 tokens (a = 0.62), and compute from micro-batch
  // 1 to 2 grew 1.28x, where a fixed rate predicted 1.71x.
  const double m = static_cast<double>(s.micro_batch * s.seq_len);
  const double m_ref = static_cast<double>(p.run.micro_batch * p.run.seq_len);
  const double g1 = gemm_rate(p.probes.gemm_gflops, p.run.compute_threads);
  const double g2 = p.probes.gemm_gflops_twice_the_tokens;
  const double a = g2 > 0 && g1 > 0 ? std::clamp(std::log2(g2 / g1), 0.0, 1.0) : 0.0;
  const double gemm_rate_growth = std::pow(m / m_ref, a);
  // The rest of compute (norms, activations, optimizer-free elementwise work, dispatch) is
  // bound by streaming the weights once per micro-batch: it scales with parameters and
  // micro-batches, not tokens (measured here: micro-batch 1 -> 2 costs 1.5-1.65x, not 2x).
  const double rest =
      sh.params * static_cast<double>(s.grad_accum) / (ref.params * static_cast<double>(p.run.grad_accum));
  // Compute.
  if (in.cpu_device) {
    const int64_t ct = s.compute_threads > 0 ? s.compute_threads : p.run.compute_threads;
    t.compute = p.step.compute_seconds * (fg * f / f_ref / gemm_rate_growth * g1 /
                                              gemm_rate(p.probes.gemm_gflops, std::max<int64_t>(1, ct)) +
                                          (1 - fg) * rest);
  } else if (c.same_device) {
    // The profile's GPU against the instance's, like with like: both datasheets where both
    // models are known (the same model: 1). Else the profile GPU's datasheet against the
    // instance's figure. The local instance's figures are the profile's probes, measured at
    // the job's shapes, far below a datasheet: set against the datasheet they scaled the
    // profile's own compute up (the H200 check's calibration came out +20%).
    const GpuSpec* g = spec_for_device_name(p.measured_on.gpu);
    const GpuSpec* gi = spec_for_device_name(in.gpu_model);
    double peak_ratio = 1, hbm_ratio = 1;
    if (g && gi) {
      peak_ratio = g->peak_bf16_tflops / gi->peak_bf16_tflops;
      hbm_ratio = g->hbm_gbps / gi->hbm_gbps;
    } else if (g) {
      peak_ratio = g->peak_bf16_tflops / in.peak_tflops.value;
      hbm_ratio = g->hbm_gbps / in.hbm_gbps.value;
    }
    t.compute = p.step.compute_seconds *
                (fg * f / f_ref / gemm_rate_growth * peak_ratio + (1 - fg) * rest * hbm_ratio);
    note(c, "peak_bf16_tflops", in.peak_tflops);
    note(c, "hbm_gbps", in.hbm_gbps);
  } else {
    t.compute = f / (in.peak_tflops.value * 1e12 * kAssumedMfu);
    note(c, "peak_bf16_tflops", in.peak_tflops);
    note(c, "mfu",
         Sourced{kAssumedMfu, Origin::kAssumed,
                 "the profile was measured on the CPU: GPU compute from FLOPs at Llama-3.1's MFU"});
  }
  if (s.activation_checkpointing.value_or(false)) {
    t.compute *= kRecomputeFactor;
    note(c, "activation_checkpointing_compute_factor",
         Sourced{kRecomputeFactor, Origin::kAssumed, "activation checkpointing: one more forward"});
  }
  // Device optimizer.
  const double n_r_split = (s.mode == "offload" ? sh.params : sh.split) / static_cast<double>(c.W);
  const double n_always = s.mode == "offload" ? 0 : sh.params - sh.split;
  double adam_rate, stream_bw;
  if (in.cpu_device) {
    adam_rate = p.probes.device_adamw_elements_per_second;
    stream_bw = p.probes.device_memory_gbps * 1e9;
  } else {
    stream_bw = in.hbm_gbps.value * 1e9 * kDeviceStreamEfficiency;
    adam_rate = stream_bw / 28.0;
    note(c, "device_stream_efficiency",
         Sourced{kDeviceStreamEfficiency, Origin::kAssumed, "AdamW at 80% of HBM bandwidth"});
  }
  adam_rate = std::max(adam_rate, 1.0);
  stream_bw = std::max(stream_bw, 1.0);
  const double r = s.topk_ratio;
  // The device optimizer: AdamW of the device-updated elements at the probed rate, plus the
  // passes every step makes over the gradients (clipping's norm and scale, 8 B/element;
  // zenflow's column scores and gathers, 12 B/split element), which calibration scales.
  const double adam_elems =
      s.mode == "device" ? sh.params : (s.mode == "offload" ? 0.0 : n_always + r * sh.split);
  t.dopt = adam_elems / adam_rate;
  t.dopt_passes = (8.0 * sh.params + (s.mode == "zenflow" ? 12.0 * sh.split : 0.0)) / stream_bw;
  // PCIe (on a CPU device: the engine's copies).
  const double b = in.cpu_device ? static_cast<double>(p.model.weight_dtype_bytes) : kGpuWeightBytes;
  t.U = s.mode == "zenflow" ? std::max<int64_t>(1, s.update_interval) : 1;
  if (s.mode == "offload") t.d2h_bytes = t.h2d_bytes = n_r_split * b;
  if (s.mode == "zenflow") {
    t.d2h_bytes = (1 - r) * n_r_split * b;
    t.h2d_bytes = (1 - r) * n_r_split * b / static_cast<double>(t.U);
  }
  note(c, "d2h_gbps", in.d2h_gbps);
  note(c, "h2d_gbps", in.h2d_gbps);
  t.d2h = t.d2h_bytes / std::max(in.d2h_gbps.value * 1e9, 1.0);
  t.h2d = t.h2d_bytes / std::max(in.h2d_gbps.value * 1e9, 1.0);
  // Host optimizer.
  t.split_elems = n_r_split;
  if (s.mode != "device") {
    double cores;
    if (in.cpu_device) {
      cores =
          static_cast<double>(s.host_threads > 0 ? s.host_threads : std::max<int64_t>(1, p.run.host_threads));
    } else {
      const double per_rank = static_cast<double>(in.physical_cores) / static_cast<double>(c.W);
      cores = s.host_threads > 0 ? static_cast<double>(s.host_threads)
                                 : (s.mode == "offload" ? per_rank : std::max(1.0, per_rank / 2));
    }
    const Sourced rate = in.host_adam_rate(cores, 1.0 / static_cast<double>(std::max<int64_t>(1, c.W)), p);
    note(c, "host_adam_elements_per_second", rate);
    if (!in.cpu_device) note(c, "host_mem_bw_gbps", in.host_mem_bw_gbps);
    const double elems = s.mode == "zenflow" ? (1 - r) * n_r_split : n_r_split;
    const double secs = elems / std::max(rate.value, 1.0);
    if (s.mode == "offload")
      t.host_sync = secs;
    else
      t.host_win = secs, t.overlap = !s.host_shares_compute_cores;
  }
  // Collectives (ring, nccl-tests PERFORMANCE.md): all-reduce 2(W-1)/W, RS + AG (W-1)/W each.
  if (c.W > 1) {
    note(c, "busbw_gbps", in.busbw_gbps);
    const double wf = static_cast<double>(c.W - 1) / static_cast<double>(c.W);
    // train.shard: parameters gathers the weights twice (forward, recomputing backward) and
    // reduce-scatters the gradients: 3 model-sized transfers where all-reduce's ring makes 2.
    const double transfers = s.shard.value_or("none") == "parameters" ? 3 : 2;
    const double bytes = sh.params * b * transfers * wf;
    const double coll = bytes / (in.busbw_gbps.value * 1e9);
    t.coll = std::max(0.0, coll - kBackwardOverlap * t.compute * 2.0 / 3.0);
    note(c, "backward_overlap",
         Sourced{kBackwardOverlap, Origin::kAssumed, "share of backward hiding collectives"});
  }
  // Data and the rest: as measured (data scales with the tokens).
  t.data = p.step.stall_seconds.count("data") ? p.step.stall_seconds.at("data") * tok / tok_ref : 0;
  if (c.same_device) t.other = p.step.other_seconds;
  return t;
}

double gpu_busy(const Terms& t) {
  return t.compute + t.dopt + t.dopt_passes + t.d2h + t.h2d + t.coll + t.data + t.other;
}
double host_exposed(const Terms& t) {
  if (t.host_win <= 0) return 0;
  if (!t.overlap || t.U <= 1) return t.host_win / static_cast<double>(t.U);
  return std::max(0.0, t.host_win - t.eta * static_cast<double>(t.U - 1) * gpu_busy(t)) /
         static_cast<double>(t.U);
}

struct Calibration {
  double passes = 1, adam = 1, d2h = 1, h2d = 1, host = 1, coll = 1, eta = 1;
  // The host AdamW step as it ran in training against the probe's rate at the same cores
  // (StepProfile::host_step_seconds). It carries over to the modes whose host step runs as
  // the profile's did: zenflow's runs while the device computes the next window (sharing
  // memory bandwidth and caches with it: on this VM 1.5-2x slower than probed), offload's
  // while the device waits (as the probe does). Across the two, the probe stands.
  double host_run = 1;
  bool host_run_measured = false;
  bool eta_fitted = false;
};

double ratio(double measured, double modeled) { return modeled > 1e-12 ? measured / modeled : 1.0; }

Calibration calibrate(const JobProfile& p, const Instance& in, std::vector<std::string>* assumed) {
  Calibration k;
  const Scenario s0 = scenario_of(p);
  std::vector<std::string> ignored;
  std::map<std::string, Sourced> ignored_inputs;
  // The instance's own constants: on the profile's host they reproduce its measurement; on
  // another instance of the same kind the factors carry the engine's efficiency over.
  Context c{p, in, s0, true, p.run.world_size, &ignored, &ignored_inputs};
  Terms t = raw_terms(c);
  const auto& st = p.step.stall_seconds;
  auto meas = [&](const char* cause) { return st.count(cause) ? st.at(cause) : 0.0; };
  k.passes = std::max(0.0, ratio(p.step.device_optimizer_seconds - t.dopt, t.dopt_passes));
  if (p.step.device_optimizer_seconds < t.dopt)
    k.adam = ratio(p.step.device_optimizer_seconds, t.dopt), k.passes = 0;
  k.d2h = ratio(meas("transfer_d2h"), t.d2h);
  k.h2d = ratio(meas("transfer_h2d"), t.h2d);
  k.coll = ratio(meas("allreduce") + meas("network"), t.coll);
  const double host_modeled = p.run.mode == "offload" ? t.host_sync : t.host_win;
  if (p.step.host_step_seconds > 0 && host_modeled > 1e-12 && p.run.mode != "device") {
    k.host_run = p.step.host_step_seconds / host_modeled;
    k.host_run_measured = true;
    t.host_sync *= k.host_run, t.host_win *= k.host_run;
  }
  if (p.run.mode == "offload") k.host = ratio(meas("host_optimizer"), t.host_sync);
  if (p.run.mode == "zenflow" && t.U > 1 && t.overlap) {
    t.dopt *= k.adam, t.dopt_passes *= k.passes, t.d2h *= k.d2h, t.h2d *= k.h2d, t.coll *= k.coll;
    const double h = meas("host_optimizer");
    const double busy = static_cast<double>(t.U - 1) * gpu_busy(t);
    if (h > 0.01 * p.step.step_seconds && busy > 0) {
      k.eta = std::clamp((t.host_win - h * static_cast<double>(t.U)) / busy, 0.0, 2.0);
      k.eta_fitted = true;
    } else {
      k.eta = std::max(1.0, busy > 0 ? t.host_win / busy : 1.0);
    }
  } else if (p.run.mode == "zenflow") {
    k.host = ratio(meas("host_optimizer"), t.host_win / static_cast<double>(t.U));
  }
  if (!k.eta_fitted && assumed)
    assumed->push_back(
        "eta = 1 (zenflow's host step hidden behind the next window: not identifiable from a " + p.run.mode +
        " profile)");
  return k;
}

int64_t parse_count(const std::string& key, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || x < 0)
    throw std::invalid_argument(key + ": must be an integer >= 0, got " + v);
  return x;
}

}  // namespace

Scenario scenario_of(const JobProfile& p) {
  Scenario s;
  s.mode = p.run.mode;
  s.micro_batch = p.run.micro_batch;
  s.grad_accum = p.run.grad_accum;
  s.seq_len = p.run.seq_len;
  s.ranks = p.run.world_size;
  s.update_interval = p.run.update_interval;
  s.topk_ratio = p.run.mode == "zenflow" ? p.run.topk_ratio : 0.1;
  s.host_threads = p.run.host_threads;
  s.compute_threads = p.run.compute_threads;
  std::vector<int64_t> shared;
  for (int64_t h : p.run.host_cores)
    if (std::find(p.run.compute_cores.begin(), p.run.compute_cores.end(), h) != p.run.compute_cores.end())
      shared.push_back(h);
  s.host_shares_compute_cores = !shared.empty();
  return s;
}

void apply_setting(Scenario& s, const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) throw std::invalid_argument("--set " + kv + ": expected key=value");
  const std::string key = kv.substr(0, eq), v = kv.substr(eq + 1);
  auto positive = [&](int64_t x) {
    if (x < 1) throw std::invalid_argument(key + ": must be >= 1, got " + v);
    return x;
  };
  if (key == "mode" || key == "optimizer.mode") {
    if (v != "device" && v != "offload" && v != "zenflow")
      throw std::invalid_argument(key + ": must be device, offload or zenflow, got " + v);
    s.mode = v;
  } else if (key == "micro_batch" || key == "train.micro_batch") {
    s.micro_batch = positive(parse_count(key, v));
  } else if (key == "grad_accum" || key == "train.grad_accum") {
    s.grad_accum = positive(parse_count(key, v));
  } else if (key == "seq_len" || key == "train.seq_len") {
    s.seq_len = positive(parse_count(key, v));
  } else if (key == "ranks") {
    s.ranks = positive(parse_count(key, v));
  } else if (key == "update_interval" || key == "optimizer.zenflow.update_interval") {
    s.update_interval = positive(parse_count(key, v));
  } else if (key == "host_threads" || key == "optimizer.host.threads") {
    s.host_threads = positive(parse_count(key, v));
  } else if (key == "compute_threads" || key == "train.compute_threads") {
    s.compute_threads = positive(parse_count(key, v));
  } else if (key == "host_shares_compute_cores") {
    s.host_shares_compute_cores = v == "true" || v == "1";
  } else if (key == "activation_checkpointing" || key == "train.activation_checkpointing") {
    if (v != "true" && v != "false") throw std::invalid_argument(key + ": must be true or false, got " + v);
    s.activation_checkpointing = v == "true";
  } else if (key == "shard" || key == "train.shard") {
    if (v != "none" && v != "gradients" && v != "parameters")
      throw std::invalid_argument(key + ": must be none, gradients or parameters, got " + v);
    s.shard = v;
  } else if (key == "device_staging_mib" || key == "optimizer.host.device_staging_mib") {
    const int64_t mib = parse_count(key, v);
    if (mib < 0 || mib > (1 << 20))
      throw std::invalid_argument(key + ": must be 0 (whole gradients) to 1048576 MiB, got " + v);
    s.device_staging_mib = mib;
  } else if (key == "offload_parameters" || key == "train.offload_parameters") {
    if (v != "true" && v != "false") throw std::invalid_argument(key + ": must be true or false, got " + v);
    s.offload_parameters = v == "true";
  } else if (key == "topk_ratio" || key == "optimizer.zenflow.topk_ratio") {
    char* end = nullptr;
    const double r = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || !(r >= 0 && r <= 1))
      throw std::invalid_argument(key + ": must be in [0, 1], got " + v);
    s.topk_ratio = r;
  } else if (key == "parameters") {
    char* end = nullptr;
    double n = std::strtod(v.c_str(), &end);
    const std::string suffix = end ? std::string(end) : "";
    if (suffix == "B" || suffix == "b")
      n *= 1e9;
    else if (suffix == "M" || suffix == "m")
      n *= 1e6;
    else if (!suffix.empty())
      n = -1;
    if (!(n > 0) || !std::isfinite(n))
      throw std::invalid_argument(key + ": must be a count like 7e9 or 7B, got " + v);
    s.parameters = n;
  } else {
    throw std::invalid_argument(
        "--set " + key +
        ": unknown key (mode, micro_batch, grad_accum, seq_len, ranks, update_interval, "
        "topk_ratio, host_threads, compute_threads, parameters, activation_checkpointing, shard, "
        "device_staging_mib, offload_parameters)");
  }
}

namespace {

std::string fmt1(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", x);
  return b;
}

// The job's global batch on W ranks: global_batch / W sequences each (rounded up), in the
// largest micro-batches of at most the job's that divide them.
void share_global_batch(Scenario& s, int64_t W, Prediction& out) {
  const int64_t per_rank = (s.global_batch + W - 1) / W;
  int64_t mb = std::max<int64_t>(1, std::min(s.micro_batch, per_rank));
  while (per_rank % mb != 0) --mb;
  s.micro_batch = mb;
  s.grad_accum = per_rank / mb;
  out.global_batch = s.global_batch;
  if (per_rank * W != s.global_batch)
    out.flags.push_back("global batch " + std::to_string(s.global_batch) + " does not divide over " +
                        std::to_string(W) + " GPUs: " + std::to_string(per_rank * W) + " sequences a step");
}

// What does not fit the GPU, part by part (a model config's memory model).
std::string gpu_memory_parts(const RankMemory& m, bool checkpointing) {
  return "weights " + fmt1(m.weights / kGib) + ", gradients " + fmt1(m.gradients / kGib) +
         ", optimizer state " + fmt1(m.optimizer_state / kGib) + ", transfer staging " +
         fmt1(m.transfer_staging / kGib) + ", collective buffers " + fmt1(m.collective_buffers / kGib) +
         ", activations " + fmt1(m.activations / kGib) + (checkpointing ? " with" : " without") +
         " activation checkpointing";
}

// Can W ranks run `mode` with train.offload_parameters? Zenflow mode on any number; offload
// mode on one GPU, or CPU ranks: on several GPUs the trainer refuses it (its gradients are
// on the host, where NCCL does not reduce them).
bool can_stream(const std::string& mode, int64_t W, bool cpu_device) {
  return mode == "zenflow" || (mode == "offload" && (W <= 1 || cpu_device));
}

// One answer for W ranks, the batch already shared out and checkpointing decided.
Prediction predict_on_ranks(const JobProfile& p, const Instance& in, const Scenario& s, int64_t W,
                            int64_t steps, Prediction out) {
  out.ranks = W;
  out.micro_batch = s.micro_batch;
  out.grad_accum = s.grad_accum;
  out.activation_checkpointing = s.activation_checkpointing.value_or(false);
  out.shard = s.shard.value_or("none");
  out.device_staging_mib = s.device_staging_mib.value_or(0);
  const bool stream_asked = s.offload_parameters.value_or(false) && s.model && s.mode != "device";
  out.offload_parameters = stream_asked && can_stream(s.mode, W, in.cpu_device);
  // Chunked staging (one rank's engine: W = 1 or sharded) waits on the compute stream for
  // every copy beyond its four chunks: the whole transfer is exposed, whatever the profile's
  // (overlapped) copies measured.
  const bool chunked = out.device_staging_mib > 0 && !in.cpu_device && s.mode != "device" &&
                       (W <= 1 || out.shard != "none");
  const bool profile_gpu = p.measured_on.device == "cuda";
  const bool same_device = in.cpu_device ? p.measured_on.device == "cpu" : profile_gpu;
  Context c{p, in, s, same_device, W, &out.assumed, &out.inputs};
  Terms t = raw_terms(c);
  // Calibration: the profile's device, and for the per-mode terms the profile's mode.
  if (same_device) {
    const Calibration k = calibrate(p, in, s.mode == p.run.mode ? &out.assumed : nullptr);
    // The device's passes over the gradients and its copies: the same engine code in every
    // mode, so their efficiency against the probes carries over.
    t.dopt_passes *= k.passes;
    if (p.run.mode != "device" && !chunked) t.d2h *= k.d2h, t.h2d *= k.h2d;
    const bool same_host_regime = (s.mode == "zenflow") == (p.run.mode == "zenflow");
    if (same_host_regime) t.host_sync *= k.host_run, t.host_win *= k.host_run;
    if (k.host_run_measured && same_host_regime && s.mode != "device")
      out.inputs["host_adam_in_training_factor"] =
          Sourced{k.host_run, Origin::kMeasured,
                  "the profile's host AdamW step in training against the probe at its cores"};
    if (s.mode == p.run.mode) {
      t.dopt *= k.adam;
      t.coll *= k.coll;
      t.host_sync *= k.host;
      if (!t.overlap || t.U <= 1) t.host_win *= k.host;
      out.calibrated = true;
    }
    t.eta = k.eta;
  }
  out.compute_seconds = t.compute;
  out.device_optimizer_seconds = t.dopt + t.dopt_passes;
  out.other_seconds = t.other;
  for (const std::string& cause : kStallCauses) out.stall_seconds[cause] = 0;
  out.stall_seconds["transfer_d2h"] = t.d2h;
  out.stall_seconds["transfer_h2d"] = t.h2d;
  out.stall_seconds["host_optimizer"] = t.host_sync + host_exposed(t);
  out.stall_seconds[in.cpu_device || W <= 8 ? "allreduce" : "network"] = t.coll;
  out.stall_seconds["data"] = t.data;
  if (out.offload_parameters) {
    // The host step's result stays on the host (no H2D); every micro-batch streams what the
    // host owns of each unit's weights twice (offload: every weight; zenflow: the split
    // matrices' unselected columns), hidden behind the compute up to the H2D bandwidth, and
    // sends their gradients D2H.
    const double e = static_cast<double>(in.cpu_device ? p.model.weight_dtype_bytes : kGpuWeightBytes);
    const double host_owned =
        s.mode == "zenflow" ? static_cast<double>(s.model->split_parameters() -
                                                  s.model->selected_parameters(s.topk_ratio))
                            : static_cast<double>(s.model->parameters);
    const double streamed = 2 * host_owned * e * static_cast<double>(s.grad_accum);
    out.stall_seconds["transfer_h2d"] = 0;
    out.stall_seconds["transfer_d2h"] = t.d2h * static_cast<double>(s.grad_accum);
    if (W > 1 && s.mode == "zenflow") {
      // Every rank streams every rank's host columns, so every rank's backward sends all of
      // their gradients D2H; the step reduce-scatters them through the device (all of them
      // up, this rank's shard down) and, after each host step (once a window), all-gathers
      // the updated columns the same way (this rank's up, all of them down). The engine
      // books both exchanges as allreduce.
      // d, h: one crossing of every rank's host columns each way (t.d2h, t.h2d are this
      // rank's share, and h2d once a window).
      const double wv = static_cast<double>(W), U = static_cast<double>(t.U);
      const double d = t.d2h * wv, h = t.h2d * wv * U;
      out.stall_seconds["transfer_d2h"] = d * static_cast<double>(s.grad_accum);
      out.stall_seconds[in.cpu_device || W <= 8 ? "allreduce" : "network"] +=
          h * (1 + 1 / (wv * U)) + d * (1 / wv + 1 / U);
      out.assumed.push_back(
          "streamed weights on " + std::to_string(W) +
          " ranks: the host columns' gradients and weights cross PCIe through the device for the reduce-scatter "
          "and the all-gather");
    }
    out.stall_seconds["weight_stream"] = std::max(0.0, streamed / std::max(in.h2d_gbps.value * 1e9, 1.0) - t.compute);
    out.assumed.push_back("streamed weights overlap the compute up to the H2D bandwidth (train.offload_parameters)");
  }
  for (const auto& [cause, sec] : out.stall_seconds) out.stall_total += sec;
  out.step_seconds = t.compute + out.device_optimizer_seconds + t.other + out.stall_total;
  out.tokens_per_step = s.micro_batch * s.grad_accum * s.seq_len * W;

  // Fits: GPU memory, host RAM, cores per GPU.
  if (s.model) {
    RankJob job;
    job.mode = s.mode;
    job.ranks = W;
    job.micro_batch = s.micro_batch, job.seq_len = s.seq_len, job.grad_accum = s.grad_accum;
    job.topk_ratio = s.topk_ratio;
    job.activation_checkpointing = out.activation_checkpointing;
    job.shard = out.shard;
    job.device_staging_bytes = static_cast<double>(out.device_staging_mib) * (1 << 20);
    job.offload_parameters = out.offload_parameters;
    job.cuda = !in.cpu_device;
    job.dtype_bytes = in.cpu_device ? p.model.weight_dtype_bytes : kGpuWeightBytes;
    out.memory = rank_memory(*s.model, job);
    out.gpu_memory_gib = out.memory->device_total() / kGib;
    out.host_ram_gib = static_cast<double>(W) * out.memory->host_optimizer / kGib + kHostRamBaseGib;
    if (job.cuda && W > 1)
      out.assumed.push_back("NCCL buffers = " + fmt1(kNcclBufferBytes / kGib) +
                            " GiB per GPU (channels x peers x NCCL_BUFFSIZE)");
    if (job.cuda)
      out.assumed.push_back(
          "attention keeps no [T, T] probabilities (LibTorch >= 2.1's fused scaled_dot_product_attention)");
  } else {
    const Shape sh = shape_of(p, s);
    const auto mem = p.memory.count(s.mode) ? p.memory.at(s.mode) : ModeMemory{};
    const double act =
        p.activation_bytes * static_cast<double>(s.micro_batch * s.seq_len) /
        static_cast<double>(p.run.micro_batch * p.run.seq_len) *
        std::pow(sh.params / static_cast<double>(p.model.parameters), 2.0 / 3.0) *
        (in.cpu_device ? 1.0
                       : static_cast<double>(kGpuWeightBytes) /
                             static_cast<double>(std::max<int64_t>(1, p.model.weight_dtype_bytes)));
    out.gpu_memory_gib = (mem.device_per_rank(W) * sh.params + act) / kGib;
    out.host_ram_gib = static_cast<double>(W) * mem.host_per_rank(W) * sh.params / kGib + kHostRamBaseGib;
  }
  if (in.cpu_device) out.host_ram_gib += out.gpu_memory_gib;
  if (!in.cpu_device && in.gpu_memory_gib > 0 && out.gpu_memory_gib > kGpuMemoryUsable * in.gpu_memory_gib) {
    out.fits = false;
    out.why_not.push_back(
        "GPU memory: needs " + fmt1(out.gpu_memory_gib) + " GiB per GPU" +
        (out.memory ? " (" + gpu_memory_parts(*out.memory, out.activation_checkpointing) + ")"
                    : std::string()) +
        ", has " + fmt1(in.gpu_memory_gib) + " GiB (" + fmt1(kGpuMemoryUsable * 100) + "% usable)");
  }
  if (in.host_ram_gib > 0 && out.host_ram_gib > kHostRamUsable * in.host_ram_gib) {
    out.fits = false;
    out.why_not.push_back("host RAM: needs " + fmt1(out.host_ram_gib) + " GiB for " + s.mode +
                          " state, has " + fmt1(in.host_ram_gib) + " GiB");
  }
  out.host_cores_per_rank = in.cpu_device ? static_cast<double>(in.physical_cores)
                                          : static_cast<double>(in.physical_cores) / static_cast<double>(W);
  if (!in.cpu_device && s.mode != "device" && in.physical_cores > 0 && out.host_cores_per_rank < 2) {
    out.fits = false;
    out.why_not.push_back("cores: " + fmt1(out.host_cores_per_rank) + " physical cores per GPU, " + s.mode +
                          " needs >= 2 (the training thread and the host optimizer)");
  }
  if (stream_asked && !out.offload_parameters) {
    out.fits = false;
    out.why_not.push_back("train.offload_parameters: offload mode streams the weights on one GPU only, not " +
                          std::to_string(W) + " (its gradients are on the host, where NCCL does not reduce them)");
  }
  if (!in.cpu_device && in.gpus == 0) {
    out.fits = false;
    out.why_not.push_back("no GPU");
  }
  // Cost.
  out.job_seconds = out.step_seconds * static_cast<double>(std::max<int64_t>(0, steps));
  if (in.has_price) {
    out.priced = true;
    out.usd_per_hour = in.usd_per_hour.value * instance_share(in.cpu_device ? 0 : W, in.gpus);
    out.job_usd = out.usd_per_hour * out.job_seconds / 3600.0;
    out.usd_per_1m_tokens =
        out.usd_per_hour * out.step_seconds / 3600.0 / static_cast<double>(out.tokens_per_step) * 1e6;
    out.usd_lost_to_stalls = out.step_seconds > 0 ? out.job_usd * out.stall_total / out.step_seconds : 0;
    out.inputs["usd_per_hour"] = in.usd_per_hour;
  }
  return out;
}

// Of two settings of one job: the one that fits, then the faster, then (neither fitting)
// the one needing less GPU memory. Ties keep the first.
bool better(const Prediction& a, const Prediction& b) {
  if (a.fits != b.fits) return a.fits;
  if (a.fits) return a.step_seconds < b.step_seconds;
  return a.gpu_memory_gib < b.gpu_memory_gib;
}

}  // namespace

Prediction predict(const JobProfile& p, const Instance& in, const Scenario& s_in, int64_t steps) {
  Prediction out;
  Scenario s = s_in;
  out.instance = in.name;
  out.mode = s.mode;
  out.flags = in.flags;
  const int64_t W = in.cpu_device ? std::max<int64_t>(1, s.ranks)
                                  : (s.ranks > 0 ? std::min<int64_t>(s.ranks, std::max<int64_t>(1, in.gpus))
                                                 : std::max<int64_t>(1, in.gpus));
  if (s.global_batch > 0) share_global_batch(s, W, out);
  if (!s.model) return predict_on_ranks(p, in, s, W, steps, out);
  // The rank's sequences per step in the fastest setting that fits: micro-batches of at most
  // the job's that divide them, with or without activation checkpointing (unless fixed).
  const int64_t per_rank = s.micro_batch * s.grad_accum;
  std::vector<bool> checkpointing = {false, true};
  if (s.activation_checkpointing) checkpointing = {*s.activation_checkpointing};
  std::vector<std::string> shards = {"none"};
  if (s.shard) shards = {*s.shard};
  else if (W > 1) shards = {"none", "gradients", "parameters"};
  std::vector<int64_t> stagings = {0};
  if (s.device_staging_mib) stagings = {*s.device_staging_mib};
  else if (!in.cpu_device && s.mode != "device") stagings = {0, kChunkedStagingMib};
  std::vector<bool> streamings = {false};
  if (s.offload_parameters)  // device mode ignores it; predict_on_ranks says where offload mode cannot
    streamings = {*s.offload_parameters && s.mode != "device"};
  else if (!in.cpu_device && can_stream(s.mode, W, in.cpu_device)) streamings = {false, true};
  // What the job spec (or the engine) refuses of a combination: empty if nothing.
  auto refusal = [&](bool ckpt, const std::string& shard, int64_t staging, bool streamed) -> std::string {
    if (shard == "parameters" && !ckpt)  // a recomputing backward
      return "train.shard: parameters needs train.activation_checkpointing: true";
    if (staging > 0 && W > 1 && shard == "none" && s.mode != "device")  // zenflow_optimizer.h
      return "optimizer.host.device_staging_mib needs one rank or train.shard (" + std::to_string(W) +
             " unsharded ranks)";
    // Streamed offload mode's engine runs on the host: its staging (chunked or not) is host memory.
    if (streamed && !ckpt) return "train.offload_parameters needs train.activation_checkpointing: true";
    if (streamed && shard != "none") return "train.offload_parameters does not combine with train.shard: " + shard;
    if (streamed && s.mode == "zenflow" && staging > 0)
      return "train.offload_parameters in zenflow mode does not combine with optimizer.host.device_staging_mib";
    return "";
  };
  std::optional<Prediction> best;
  std::optional<std::pair<Scenario, std::string>> refused;
  for (int64_t mb = s.micro_batch; mb >= 1; --mb) {
    if (per_rank % mb != 0) continue;
    for (const bool ckpt : checkpointing)
      for (const std::string& shard : shards)
        for (const int64_t staging : stagings)
          for (const bool streamed : streamings) {
            Scenario c = s;
            c.micro_batch = mb, c.grad_accum = per_rank / mb, c.activation_checkpointing = ckpt, c.shard = shard;
            c.device_staging_mib = staging;
            c.offload_parameters = streamed;
            if (std::string why = refusal(ckpt, shard, staging, streamed); !why.empty()) {
              if (mb == s.micro_batch) refused.emplace(c, std::move(why));  // the last: the most allowed
              continue;
            }
            Prediction pr = predict_on_ranks(p, in, c, W, steps, out);
            if (!best || better(pr, *best)) best = std::move(pr);
          }
  }
  if (best) return *best;
  // The settings given contradict each other: the job's micro-batch with checkpointing (as
  // allowed), not fitting, says why.
  Prediction pr = predict_on_ranks(p, in, refused->first, W, steps, out);
  pr.fits = false;
  pr.why_not.insert(pr.why_not.begin(), "the job spec refuses it: " + refused->second);
  return pr;
}

}  // namespace zenflow::advisor
