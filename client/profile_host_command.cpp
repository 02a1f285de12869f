// `zenflow profile-host`: the constants of this machine (host AdamW by core count, memory
// bandwidth; on a GPU host pinned H2D/D2H one way and both ways and bf16 GEMM), written as
// a pricing-catalog row with a `measured` block (common/pricing.h) for zenflow advise.
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "client/commands.h"
#include "client/verbs.h"
#include "common/advisor/job_profile.h"
#include "worker/engine/accumulate_kernel.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/device_streams.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/stall_clock.h"

namespace zenflow::cli {
namespace {

struct ProfileHostArgs {
  std::string name = "local";
  double usd_per_hour = -1;
  std::string out;
  int64_t elements = 16 << 20;
  int64_t copy_mib = 512;
};

std::string shell_line(const char* cmd) {
  FILE* f = ::popen(cmd, "r");
  if (!f) return "";
  char buf[512] = {0};
  std::string s = std::fgets(buf, sizeof buf, f) ? buf : "";
  ::pclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
  return s;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

template <class F>
double median_seconds(int reps, F&& fn) {
  fn();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    engine::Stopwatch sw;
    fn();
    t.push_back(sw.seconds());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string num(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.4g", x);
  return b;
}

int profile_host(const ProfileHostArgs& a) {
  const std::vector<int> cores = engine::available_cores();
  const int64_t n = a.elements;
  std::vector<std::pair<int, double>> adam;
  double mem_bw = 0;
  std::vector<int> counts;
  for (int t = 1; t < static_cast<int>(cores.size()); t *= 2) counts.push_back(t);
  counts.push_back(static_cast<int>(std::max<size_t>(1, cores.size())));
  for (int t : counts) {
    engine::HostThreadPool pool(
        t, std::vector<int>(cores.begin(), cores.begin() + std::min<size_t>(t, cores.size())));
    engine::HostBuffer p(n, &pool, true), m(n, &pool, true), v(n, &pool, true), g(n, &pool, true);
    engine::AdamWSpan span;
    span.p = p.data(), span.m = m.data(), span.v = v.data(), span.grad = engine::GradRef::f32(g.data()),
    span.n = n;
    const engine::AdamWCoeffs c = engine::AdamWCoeffs::make(engine::AdamWParams{}, 10);
    const double s = median_seconds(5, [&] { engine::adamw_step(pool, span, c, 1.0f); });
    adam.emplace_back(t, static_cast<double>(n) / s);
    std::cerr << "zenflow: host AdamW, " << t << " cores: " << num(static_cast<double>(n) / s / 1e9)
              << " G elem/s\n";
    if (t == counts.back()) {
      const double acc = median_seconds(
          5, [&] { engine::accumulate(pool, m.data(), engine::GradRef::f32(g.data()), n, 1.0f, false); });
      mem_bw = 12.0 * static_cast<double>(n) / acc / 1e9;  // acc += g: 12 B per element
      std::cerr << "zenflow: memory bandwidth (acc += g, " << t << " cores): " << num(mem_bw) << " GB/s\n";
    }
  }
  // The GPU: pinned copies one way and both at once on the engine's streams, bf16 GEMM.
  std::string gpu, h2d, d2h, bidir, tflops;
  int64_t gpus = 0;
  double gpu_gib = 0;
  if (engine::DeviceStreams::cuda_available()) {
    gpu = shell_line("nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1");
    gpus = std::max<int64_t>(1, std::atoll(shell_line("nvidia-smi -L 2>/dev/null | wc -l").c_str()));
    gpu_gib =
        std::atof(
            shell_line(
                "nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1")
                .c_str()) /
        1024.0;
    engine::DeviceStreams streams(at::Device(at::kCUDA, 0));
    const int64_t elems = a.copy_mib * (1 << 20) / 4;
    at::Tensor host_a = streams.alloc_host({elems}, at::kFloat),
               host_b = streams.alloc_host({elems}, at::kFloat);
    const auto dev = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kFloat);
    at::Tensor dev_a = at::zeros({elems}, dev), dev_b = at::zeros({elems}, dev);
    const double bytes = 4.0 * static_cast<double>(elems);
    const double t_h2d = median_seconds(5, [&] { streams.copy_h2d(host_a, dev_a).wait(); });
    const double t_d2h = median_seconds(5, [&] { streams.copy_d2h(dev_b, host_b).wait(); });
    const double t_both = median_seconds(5, [&] {
      engine::CopyHandle x = streams.copy_h2d(host_a, dev_a), y = streams.copy_d2h(dev_b, host_b);
      x.wait();
      y.wait();
    });
    h2d = num(bytes / t_h2d / 1e9), d2h = num(bytes / t_d2h / 1e9), bidir = num(2 * bytes / t_both / 1e9);
    const auto bf = at::TensorOptions().device(at::kCUDA, 0).dtype(at::kBFloat16);
    at::Tensor x = at::randn({8192, 8192}, bf), y = at::randn({8192, 8192}, bf);
    const double t_mm = median_seconds(5, [&] { (void)at::mm(x, y).sum().item<float>(); });
    tflops = num(2.0 * 8192.0 * 8192.0 * 8192.0 / t_mm / 1e12);
    std::cerr << "zenflow: " << gpu << ": H2D " << h2d << " GB/s, D2H " << d2h << " GB/s, both " << bidir
              << " GB/s, bf16 GEMM " << tflops << " TFLOP/s\n";
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const double ram_gib = static_cast<double>(pages) * static_cast<double>(page) / (1024.0 * 1024.0 * 1024.0);
  const std::string host =
      cpu_model() + ", " + std::to_string(cores.size()) + " cores, " + (gpu.empty() ? "no GPU" : gpu);
  const std::string today = advisor::today_utc();
  auto opt = [](const std::string& s) { return s.empty() ? std::string("null") : s; };
  std::string y;
  y += "# zenflow profile-host: this machine as a pricing-catalog row (zenflow advise --catalog FILE).\n";
  y += "instances:\n";
  y += "  - name: " + a.name + "\n";
  y += "    provider: onprem\n    region: null\n";
  y += "    gpu_model: \"" + (gpu.empty() ? std::string("none") : gpu) + "\"\n";
  y += "    gpu_count: " + std::to_string(gpus) + "\n";
  y += "    gpu_memory_gib: " + (gpus ? num(gpu_gib) : std::string("null")) + "\n";
  y += "    vcpus: " + std::to_string(cores.size()) + "\n";
  y += "    ram_gib: " + num(ram_gib) + "\n    nic_gbps: null\n    pcie_gen: null\n";
  y += "    on_demand_usd_per_hour: " + (a.usd_per_hour >= 0 ? num(a.usd_per_hour) : std::string("null")) +
       "\n";
  y += "    spot_usd_per_hour: null\n";
  y += "    source: \"zenflow profile-host on " + host +
       (a.usd_per_hour >= 0 ? "; price: --usd-per-hour" : "") + "\"\n";
  y += "    date: " + today + "\n    verified: " + (a.usd_per_hour >= 0 ? "true" : "false") + "\n";
  y += "    note: \"measured constants; vcpus are the cores this process could use\"\n";
  y += "    measured:\n      date: " + today + "\n      host: \"" + host + "\"\n";
  y += "      h2d_gbps: " + opt(h2d) + "\n      d2h_gbps: " + opt(d2h) + "\n      bidir_gbps: " + opt(bidir) +
       "\n";
  y += "      bf16_tflops: " + opt(tflops) + "\n      mem_bw_gbps: " + num(mem_bw) + "\n";
  y += "      host_adam_elements_per_second: {";
  for (size_t i = 0; i < adam.size(); ++i)
    y += (i ? ", " : "") + std::to_string(adam[i].first) + ": " + num(adam[i].second);
  y += "}\n";
  if (a.out.empty()) {
    std::cout << y;
  } else {
    std::ofstream f(a.out, std::ios::trunc);
    f << y;
    if (!f) {
      std::cerr << "zenflow: --out " << a.out << ": cannot write\n";
      return kExitFailure;
    }
    std::cerr << "zenflow: wrote " << a.out << " (zenflow advise PROFILE --catalog " << a.out
              << " --instance " << a.name << ")\n";
  }
  return kExitOk;
}

CommandRegistrar reg(train_verb("profile-host")->order, [](CommandContext& ctx) {
  auto args = std::make_shared<ProfileHostArgs>();
  CLI::App* cmd = ctx.root->add_subcommand("profile-host", train_verb("profile-host")->help);
  cmd->add_option("--name", args->name, "The row's instance name")->capture_default_str();
  cmd->add_option("--usd-per-hour", args->usd_per_hour,
                  "This machine's price (e.g. amortised capex); default: none")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--out", args->out, "Write the row here (default: stdout)");
  cmd->add_option("--elements", args->elements, "Host AdamW elements per probe")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1} << 16, int64_t{1} << 30));
  cmd->add_option("--copy-mib", args->copy_mib, "Pinned copy size on a GPU host (MiB)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16384));
  cmd->callback([args, &ctx] { ctx.exit_code = profile_host(*args); });
});

}  // namespace
}  // namespace zenflow::cli
