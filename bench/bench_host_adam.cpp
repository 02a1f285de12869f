// `zenflow bench host-adam`: the host AdamW, accumulate and fused window-end kernels,
// timed against an in-place acc += g pass (the memory roofline) in the same run.
//
// Every variant runs through the same HostThreadPool and HostBuffers the host updater
// uses (pinned workers, first touch by those workers, optional huge pages). Each
// repetition times the roofline pass and the variant back to back, so drifting memory
// bandwidth on a shared host affects both; figures are medians after warm-up.
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "client/commands.h"
#include "worker/engine/accumulate_kernel.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/host_isa.h"
#include "worker/engine/host_thread_pool.h"

namespace zenflow::cli {
namespace {

using engine::AdamWCoeffs;
using engine::AdamWParams;
using engine::AdamWSpan;
using engine::GradRef;
using engine::HalfKind;
using engine::HostBuffer;
using engine::HostThreadPool;
using Json = nlohmann::ordered_json;

struct HostAdamOptions {
  std::vector<std::string> elements{"16M"};
  int threads = 0;  // 0: every available core
  std::string variant = "all";
  std::string grad = "f32";
  std::string huge_pages = "on";
  std::string isa;  // empty: the process default (CPUID or ZENFLOW_HOST_ISA)
  int reps = 10;
  int warmup = 2;
  bool json = false;
  bool vs_torch = false;
};

// "16M" -> 16 * 2^20; plain integers pass through; K, M, G are binary multiples.
int64_t parse_elements(const std::string& text) {
  if (text.empty()) throw std::invalid_argument("--elements: empty value");
  int64_t multiplier = 1;
  std::string digits = text;
  const char suffix = text.back();
  if (suffix == 'K' || suffix == 'k') multiplier = int64_t{1} << 10;
  if (suffix == 'M' || suffix == 'm') multiplier = int64_t{1} << 20;
  if (suffix == 'G' || suffix == 'g') multiplier = int64_t{1} << 30;
  if (multiplier != 1) digits.pop_back();
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(digits, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != digits.size() || digits.empty() || value <= 0)
    throw std::invalid_argument("--elements: '" + text + "' is not a positive count (e.g. 1000000, 16M, 1G)");
  return value * multiplier;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Deterministic pseudo-random value in [-1, 1) for element i of stream `seed`.
float noise(uint64_t i, uint64_t seed) {
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

// The host state of one benchmark size, allocated and first-touched by the pool.
struct HostState {
  int64_t n;
  HostBuffer p, m, v, g, acc, half, g16;
  HostState(int64_t elements, HostThreadPool& pool, bool huge, bool bf16_grad)
      : n(elements),
        p(elements, &pool, huge),
        m(elements, &pool, huge),
        v(elements, &pool, huge),
        g(elements, &pool, huge),
        acc(elements, &pool, huge),
        half((elements + 1) / 2, &pool, huge),
        g16(bf16_grad ? (elements + 1) / 2 : 0, &pool, huge) {
    struct Fill {
      HostState* s;
    } const fill{this};
    pool.parallel_for(n, engine::kHostChunkAlign, [&fill](int64_t b, int64_t e) {
      HostState& s = *fill.s;
      uint16_t* g16 = reinterpret_cast<uint16_t*>(s.g16.data());
      for (int64_t i = b; i < e; ++i) {
        const auto u = static_cast<uint64_t>(i);
        s.p.data()[i] = noise(u, 1);
        s.m.data()[i] = 1e-3f * noise(u, 2);
        s.v.data()[i] = 1e-6f * (1.5f + noise(u, 3));
        s.g.data()[i] = 1e-2f * noise(u, 4);
        s.acc.data()[i] = 1e-2f * noise(u, 5);
        if (g16 != nullptr) g16[i] = engine::float_to_bf16(1e-2f * noise(u, 6));
      }
    });
  }
  GradRef grad(bool bf16) const {
    return bf16 ? GradRef::bf16(reinterpret_cast<const uint16_t*>(g16.data())) : GradRef::f32(g.data());
  }
  AdamWSpan span(bool bf16_grad, bool half_out) const {
    AdamWSpan s;
    s.p = p.data();
    s.m = m.data();
    s.v = v.data();
    s.grad = grad(bf16_grad);
    s.half_out = half_out ? reinterpret_cast<uint16_t*>(half.data()) : nullptr;
    s.half_kind = HalfKind::kBF16;
    s.n = n;
    return s;
  }
};

struct Measurement {
  double seconds = 0;           // median
  double roofline_seconds = 0;  // median of the interleaved acc += g passes
};

// Times `fn` and the acc += g roofline pass alternately.
Measurement measure(const HostAdamOptions& o, HostThreadPool& pool, HostState& s,
                    const std::function<void()>& fn) {
  // The roofline's own accumulator and gradient: acc and g of this state, scale 1.
  auto roofline = [&] { engine::accumulate(pool, s.acc.data(), GradRef::f32(s.g.data()), s.n, 1.0f, false); };
  for (int i = 0; i < o.warmup; ++i) {
    roofline();
    fn();
  }
  std::vector<double> t, r;
  for (int i = 0; i < o.reps; ++i) {
    r.push_back(seconds_of(roofline));
    t.push_back(seconds_of(fn));
  }
  return {median(t), median(r)};
}

Json line(const std::string& variant, int64_t n, int threads, const std::string& isa,
          double bytes_per_element, const Measurement& m, const HostAdamOptions& o) {
  Json j;
  j["variant"] = variant;
  j["elements"] = n;
  j["threads"] = threads;
  j["isa"] = isa;
  j["grad_dtype"] = o.grad;
  j["huge_pages"] = o.huge_pages == "on";
  j["reps"] = o.reps;
  j["seconds_median"] = m.seconds;
  j["elements_per_second"] = static_cast<double>(n) / m.seconds;
  j["bytes_per_element"] = bytes_per_element;
  j["gb_per_second"] = bytes_per_element * static_cast<double>(n) / m.seconds / 1e9;
  if (m.roofline_seconds > 0) {
    const double roof_gbs = 12.0 * static_cast<double>(n) / m.roofline_seconds / 1e9;
    j["roofline"] = {{"pass", "acc+=g"},
                     {"bytes_per_element", 12},
                     {"seconds_median", m.roofline_seconds},
                     {"gb_per_second", roof_gbs},
                     {"ratio", j["gb_per_second"].get<double>() / roof_gbs}};
  }
  return j;
}

void print(const Json& j, bool json) {
  if (j.is_null()) return;
  if (json) {
    std::cout << j.dump() << std::endl;
    return;
  }
  std::printf("%-12s n=%-10lld threads=%d isa=%-7s %9.3f ms  %6.3f G elem/s  %6.1f GB/s",
              j["variant"].get<std::string>().c_str(), static_cast<long long>(j["elements"].get<int64_t>()),
              j["threads"].get<int>(), j["isa"].get<std::string>().c_str(),
              j["seconds_median"].get<double>() * 1e3, j["elements_per_second"].get<double>() / 1e9,
              j["gb_per_second"].get<double>());
  if (j.contains("roofline"))
    std::printf("  (%.2f of acc+=g at %.1f GB/s)", j["roofline"]["ratio"].get<double>(),
                j["roofline"]["gb_per_second"].get<double>());
  if (j.contains("vs_separate"))
    std::printf("  [separate acc+adamw_bf16: %.3f ms, saved %.1f B/elem-equiv]",
                j["vs_separate"]["seconds"].get<double>() * 1e3,
                j["vs_separate"]["saved_bytes_per_element_at_roofline"].get<double>());
  std::printf("\n");
  std::fflush(stdout);
}

// LibTorch's own AdamW on one parameter of n elements (what a plain LibTorch loop does).
Json torch_line(int64_t n, int threads, const HostAdamOptions& o) {
  at::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  torch::Tensor p = torch::rand({n}, torch::kFloat32).sub_(0.5);
  p.set_requires_grad(true);
  p.mutable_grad() = torch::rand({n}, torch::kFloat32).mul_(1e-2);
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
  for (int i = 0; i < o.warmup; ++i) opt.step();
  std::vector<double> t;
  for (int i = 0; i < o.reps; ++i) t.push_back(seconds_of([&] { opt.step(); }));
  Measurement m;
  m.seconds = median(t);
  Json j = line("torch_adamw", n, threads, "libtorch", 28.0, m, o);
  j["grad_dtype"] = "f32";
  j["huge_pages"] = false;
  return j;
}

// The fixed cost of one parallel_for (an empty chunk function): back to back, while
// the workers still poll, and after an idle gap that lets them sleep on the futex.
// It bounds how small the host updater's per-call chunks can usefully be.
Json pool_latency_line(HostThreadPool& pool, const HostAdamOptions& o) {
  auto empty_call = [&] { pool.parallel_for(pool.size() * 16, 16, [](int64_t, int64_t) {}); };
  std::vector<double> hot, cold;
  for (int i = 0; i < o.warmup + 10 * o.reps; ++i) {
    const double t = seconds_of(empty_call);
    if (i >= o.warmup) hot.push_back(t);
  }
  for (int i = 0; i < o.reps; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    cold.push_back(seconds_of(empty_call));
  }
  Json j;
  j["variant"] = "pool_call";
  j["threads"] = pool.size();
  j["back_to_back_us_median"] = median(hot) * 1e6;
  j["after_idle_us_median"] = median(cold) * 1e6;
  if (!o.json) {
    std::printf("pool_call    threads=%d  back-to-back %.1f us, after idle %.1f us (medians)\n", pool.size(),
                median(hot) * 1e6, median(cold) * 1e6);
    std::fflush(stdout);
    return Json();
  }
  return j;
}

int run_host_adam(const HostAdamOptions& o) {
  if (!o.isa.empty()) engine::set_host_isa(engine::parse_host_isa(o.isa));
  std::vector<int> cores = engine::available_cores();
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::max<size_t>(cores.size(), 1));
  if (static_cast<int>(cores.size()) > threads) cores.resize(static_cast<size_t>(threads));
  HostThreadPool pool(threads, cores);
  const std::string isa = engine::host_isa_name(engine::active_host_isa());
  const bool huge = o.huge_pages == "on";
  const bool bf16 = o.grad == "bf16";
  const double g_bytes = bf16 ? 2.0 : 4.0;
  const bool all = o.variant == "all";
  auto wanted = [&](const char* v) { return all || o.variant == v; };

  AdamWParams params;
  params.lr = 1e-3;
  params.weight_decay = 0.01;
  const AdamWCoeffs coeffs = AdamWCoeffs::make(params, 10);

  if (o.variant == "pool") {
    print(pool_latency_line(pool, o), o.json);
    return kExitOk;
  }
  for (const std::string& text : o.elements) {
    const int64_t n = parse_elements(text);
    HostState s(n, pool, huge, bf16);
    std::map<std::string, double> seconds;
    double roof_seconds = 0;
    auto report = [&](const std::string& variant, double bytes, const Measurement& m) {
      seconds[variant] = m.seconds;
      roof_seconds = m.roofline_seconds;
      Json j = line(variant, n, threads, isa, bytes, m, o);
      if (variant == "fused" && seconds.count("accumulate") && seconds.count("adamw_bf16")) {
        // What the window end costs without fusion: accumulate the last gradient, then
        // AdamW over the accumulator with the bf16 copy.
        const double separate = seconds["accumulate"] + seconds["adamw_bf16"];
        const double roof_bytes_per_s = 12.0 * static_cast<double>(n) / roof_seconds;
        j["vs_separate"] = {{"seconds", separate},
                            {"bytes_per_element", (8.0 + g_bytes) + 30.0},
                            {"saved_seconds", separate - m.seconds},
                            {"saved_fraction", (separate - m.seconds) / separate},
                            {"saved_bytes_per_element_at_roofline",
                             (separate - m.seconds) * roof_bytes_per_s / static_cast<double>(n)}};
      }
      print(j, o.json);
    };

    if (wanted("adamw")) {
      const AdamWSpan span = s.span(bf16, false);
      report("adamw", 24.0 + g_bytes,
             measure(o, pool, s, [&] { engine::adamw_step(pool, span, coeffs, 1.0f); }));
    }
    if (wanted("adamw_bf16")) {
      const AdamWSpan span = s.span(bf16, true);
      report("adamw_bf16", 26.0 + g_bytes,
             measure(o, pool, s, [&] { engine::adamw_step(pool, span, coeffs, 1.0f); }));
    }
    if (wanted("accumulate")) {
      const GradRef g = s.grad(bf16);
      report("accumulate", 8.0 + g_bytes,
             measure(o, pool, s, [&] { engine::accumulate(pool, s.acc.data(), g, n, 0.25f, false); }));
    }
    if (o.variant == "accumulate_overwrite") {
      const GradRef g = s.grad(bf16);
      report("accumulate_overwrite", 4.0 + g_bytes,
             measure(o, pool, s, [&] { engine::accumulate(pool, s.acc.data(), g, n, 0.25f, true); }));
    }
    if (wanted("fused")) {
      const AdamWSpan span = s.span(bf16, true);
      report("fused", 30.0 + g_bytes,
             measure(o, pool, s, [&] { engine::adamw_window_end(pool, span, s.acc.data(), coeffs, 0.25f); }));
    }
    if (o.vs_torch) print(torch_line(n, threads, o), o.json);
  }
  return kExitOk;
}

const CommandRegistrar kRegisterHostAdam(50, [](CommandContext& ctx) {
  auto opts = std::make_shared<HostAdamOptions>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "host-adam", "Host AdamW / accumulate / fused window-end kernels vs the acc+=g roofline");
  cmd->add_option("--elements", opts->elements,
                  "Element counts (repeatable or comma-separated; K/M/G suffixes are binary)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) {
            try {
              parse_elements(v);
            } catch (const std::exception& e) {
              return std::string(e.what());
            }
            return std::string();
          },
          "COUNT"));
  cmd->add_option("--threads", opts->threads, "Pool threads (default: every available core)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--variant", opts->variant,
                  "adamw|adamw_bf16|accumulate|fused|all (the first four); also "
                  "accumulate_overwrite (a window's first gradient) and pool (the fixed "
                  "cost of one parallel_for)")
      ->capture_default_str()
      ->check(CLI::IsMember(
          {"adamw", "adamw_bf16", "accumulate", "fused", "all", "accumulate_overwrite", "pool"}));
  cmd->add_option("--grad", opts->grad, "Gradient dtype: f32|bf16")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--huge-pages", opts->huge_pages, "Transparent huge pages for the buffers: on|off")
      ->capture_default_str()
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--isa", opts->isa, "Force the kernel build: scalar|avx2|avx512")
      ->check(CLI::IsMember({"scalar", "avx2", "avx512"}));
  cmd->add_option("--reps", opts->reps, "Timed repetitions (median reported)")
      ->capture_default_str()
      ->check(CLI::Range(1, 100000));
  cmd->add_option("--warmup", opts->warmup, "Untimed repetitions first")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_flag("--json", opts->json, "One JSON object per line");
  cmd->add_flag("--vs-torch", opts->vs_torch, "Also time LibTorch's torch::optim::AdamW");
  CommandContext* c = &ctx;
  cmd->callback([opts, c] { c->exit_code = run_host_adam(*opts); });
});

}  // namespace
}  // namespace zenflow::cli
