// `zenflow bench optimizer-node`: a zenflow-optimizer node's window step against the
// in-process host optimizer at equal threads, the round trip of one window over UCX, and
// the CPU an attached but idle node burns (docs/benchmarks.md, the optimizer node's targets).
//
// Both sides run the same fused window-end AdamW job over `--elements` fp32 elements (bf16
// gradients, bf16 output, as a bf16 model's boundary), pinned to the same core. The node's
// figure is the seconds it reports for the step (DONE); the round trip adds sending the
// gradient and receiving the parameters. Medians of --repeats after one warm-up.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "client/commands.h"
#include "bench/local_node.h"
#include "worker/engine/host_optimizer.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/stall_clock.h"
#include "worker/transport/remote_host_optimizer.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;

struct NodeBenchOptions {
  int64_t elements = 16 << 20;
  int threads = 1;
  std::string tls = "tcp";
  int repeats = 3;
  double idle_seconds = 10;
  bool json = false;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int64_t cpu_ticks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), {});
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(s.substr(close + 2));
  std::string field;
  int64_t utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoll(field);
    if (i == 15) stime = std::stoll(field);
  }
  return utime + stime;
}

engine::StepJob window_job(int64_t n, const std::vector<uint16_t>& grad, std::vector<uint16_t>& out) {
  engine::StepJob job;
  job.acc = static_cast<int>(engine::HostBuf::kAcc0);
  job.grad_scale = 0.25f;
  const int64_t span = 1 << 20;  // matrices of 1M elements
  for (int64_t b = 0; b < n; b += span) {
    engine::StepJob::Span s;
    s.offset = b;
    s.n = std::min(span, n - b);
    s.grad = engine::GradRef::bf16(grad.data() + b);
    s.half_out = out.data() + b;
    s.coeffs = engine::AdamWCoeffs::make(engine::AdamWParams{}, 10);
    job.spans.push_back(s);
  }
  return job;
}

int run_node_bench(const NodeBenchOptions& o) {
  setenv("UCX_TLS", o.tls == "sm" ? "sm,tcp" : o.tls.c_str(), 1);
  setenv("UCX_NET_DEVICES", "lo", 1);
  if (o.tls == "sm") setenv("UCX_TCP_PUT_ENABLE", "n", 1);
  const std::vector<int> cores = engine::available_cores();
  const int core = cores.empty() ? 0 : cores.back();
  const fs::path dir = fs::temp_directory_path() / ("zenflow-bench-node-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::vector<uint16_t> grad(static_cast<size_t>(o.elements), 0x3c00), out(static_cast<size_t>(o.elements));
  engine::HostStateLayout layout;
  layout.elements = o.elements;
  for (int64_t b = 0; b < o.elements; b += 1 << 20) layout.segments.push_back(b);

  nlohmann::json j;
  j["bench"] = "optimizer-node";
  j["elements"] = o.elements;
  j["threads"] = o.threads;
  j["tls"] = o.tls;
  std::vector<double> local_s, node_s, round_s;
  {
    engine::InProcessHostOptions io;
    io.threads = o.threads;
    io.cores = std::vector<int>(static_cast<size_t>(o.threads), core);
    io.first_touch = true;
    auto local = engine::make_in_process_host_optimizer(io, layout);
    for (int r = 0; r <= o.repeats; ++r) {
      auto w = local->submit(window_job(o.elements, grad, out));
      w->wait();
      if (r > 0) local_s.push_back(w->run_seconds());
    }
  }
  LocalOptimizerNode node(dir, {"--threads", std::to_string(o.threads), "--cores", std::to_string(core)});
  {
    transport::RemoteHostOptions ro;
    ro.addresses = {node.address()};
    ro.job = "bench";
    auto remote = transport::make_remote_host_optimizer(ro, layout);
    for (int r = 0; r <= o.repeats; ++r) {
      engine::Stopwatch sw;
      auto w = remote->submit(window_job(o.elements, grad, out));
      w->wait();
      if (r > 0) {
        round_s.push_back(sw.seconds());
        node_s.push_back(w->run_seconds());
      }
    }
    const int64_t t0 = cpu_ticks(node.pid());
    std::this_thread::sleep_for(std::chrono::duration<double>(o.idle_seconds));
    const int64_t t1 = cpu_ticks(node.pid());
    j["idle_attached_core_share"] = static_cast<double>(t1 - t0) / static_cast<double>(sysconf(_SC_CLK_TCK)) / o.idle_seconds;
    j["network_bytes"] = {{"sent", remote->network_bytes_sent()}, {"received", remote->network_bytes_received()}};
  }
  const double n = static_cast<double>(o.elements);
  j["in_process_seconds"] = local_s;
  j["node_seconds"] = node_s;
  j["round_trip_seconds"] = round_s;
  j["in_process_elements_per_s"] = n / median(local_s);
  j["node_elements_per_s"] = n / median(node_s);
  j["node_vs_in_process"] = median(local_s) / median(node_s);
  j["round_trip_gb_per_s"] = n * 4 / median(round_s) / 1e9;  // 2 B gradient out + 2 B parameter back
  fs::remove_all(dir);
  if (o.json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("window step, %lld elements, %d thread(s) on core %d, UCX %s:\n", static_cast<long long>(o.elements),
                o.threads, core, o.tls.c_str());
    std::printf("  in-process  %8.1f M elements/s (median of %d)\n", j["in_process_elements_per_s"].get<double>() / 1e6,
                o.repeats);
    std::printf("  node        %8.1f M elements/s  (%.0f%% of in-process)\n", j["node_elements_per_s"].get<double>() / 1e6,
                100 * j["node_vs_in_process"].get<double>());
    std::printf("  round trip  %8.3f s  (%.2f GB/s of gradients and parameters)\n", median(round_s),
                j["round_trip_gb_per_s"].get<double>());
    std::printf("  idle attached node: %.2f%% of a core over %.0f s\n",
                100 * j["idle_attached_core_share"].get<double>(), o.idle_seconds);
  }
  return kExitOk;
}

const CommandRegistrar kRegisterNodeBench(56, [](CommandContext& ctx) {
  auto opts = std::make_shared<NodeBenchOptions>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "optimizer-node", "A zenflow-optimizer node's window step vs the in-process host optimizer, and its idle CPU");
  cmd->add_option("--elements", opts->elements, "Host-owned elements of the window step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1} << 16, int64_t{1} << 34));
  cmd->add_option("--threads", opts->threads, "Compute threads on both sides")->capture_default_str()->check(CLI::Range(1, 256));
  cmd->add_option("--tls", opts->tls, "tcp | sm")->capture_default_str()->check(CLI::IsMember({"tcp", "sm"}));
  cmd->add_option("--repeats", opts->repeats, "Timed windows (median)")->capture_default_str()->check(CLI::Range(1, 100));
  cmd->add_option("--idle-seconds", opts->idle_seconds, "How long to watch the attached idle node")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 600.0));
  cmd->add_flag("--json", opts->json, "One JSON object");
  CommandContext* c = &ctx;
  cmd->callback([opts, c] {
    try {
      c->exit_code = run_node_bench(*opts);
    } catch (const std::exception& e) {
      std::cerr << "zenflow bench optimizer-node: " << e.what() << "\n";
      c->exit_code = kExitFailure;
    }
  });
});

}  // namespace
}  // namespace zenflow::cli
