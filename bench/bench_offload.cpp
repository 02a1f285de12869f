// `zenflow bench offload`: device vs offload vs zenflow on the same model, data and host
// kernels, in one process; one JSON object per mode, then a comparison object. With
// --vs-node, each host-optimizer mode also runs against a zenflow-optimizer node on this
// machine, in-process and node runs alternating: the step time a node adds.
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "client/commands.h"
#include "worker/rank/run_output.h"
#include "common/job_spec.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/rank/trainer.h"
#if ZENFLOW_HAVE_UCX
#include "bench/local_node.h"
#endif
#if ZENFLOW_HAVE_METRICS
#include "common/metrics/exposition.h"
#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/version.h"
#include "worker/rank/run_metrics.h"
#endif

namespace zenflow::cli {
namespace {

// A Llama-2 shape (heads of 128, vocab 32000) in bf16 at sequence 2048 with activation
// checkpointing, on one GPU.
std::string gpu_llama_preset(const std::string& name, int hidden, int layers, int intermediate, int micro_batch,
                             int steps, const std::string& mode = "zenflow", const std::string& train_extra = "") {
  const std::string heads = std::to_string(hidden / 128);
  return "name: bench-" + name + "\nmodel: {arch: llama, config: {hidden_size: " + std::to_string(hidden) +
         ", num_hidden_layers: " + std::to_string(layers) + ", num_attention_heads: " + heads +
         ", num_key_value_heads: " + heads + ", intermediate_size: " + std::to_string(intermediate) +
         ", vocab_size: 32000, max_position_embeddings: 4096}}\n"
         "data: {train: DATA, tokenizer: byte, val_fraction: 0.05}\n"
         "train: {steps: " + std::to_string(steps) + ", micro_batch: " + std::to_string(micro_batch) +
         ", seq_len: 2048, lr: 1.0e-5, schedule: constant, warmup_steps: 0, grad_clip: 1.0, seed: 1, "
         "device: cuda, dtype: bfloat16, activation_checkpointing: true" + train_extra + "}\n"
         "optimizer:\n  mode: " + mode + "\n  zenflow: {topk_ratio: 0.1, select_strategy: auto, update_interval: 4, "
         "full_warm_up_rounds: 1, overlap_step: true}\n"
         "  host: {threads: auto, reserved_cores: auto}\n"
         "checkpoint: {every_steps: 0}\n";
}

// Presets: YAML job specs validated by the same parser users go through.
const std::map<std::string, std::string>& presets() {
  static const std::map<std::string, std::string> p = {
      // Few tokens per step: the host optimizer is as large a share of an offload step
      // as a CPU-only machine allows (one compute core, one host-optimizer core).
      {"small-batch", R"(name: bench-small-batch
model: {arch: llama, config: {hidden_size: 1024, num_hidden_layers: 4, num_attention_heads: 8,
        intermediate_size: 2752, max_position_embeddings: 64}}
data: {train: DATA, tokenizer: byte, val_fraction: 0.05}
train: {steps: 20, micro_batch: 1, seq_len: 16, lr: 1.0e-4, schedule: constant, warmup_steps: 0,
        grad_clip: 1.0, seed: 1, compute_threads: 1, device: cpu}
optimizer:
  mode: zenflow
  zenflow: {topk_ratio: 0.1, select_strategy: auto, update_interval: 4, full_warm_up_rounds: 1,
            overlap_step: true}
  host: {threads: 1, reserved_cores: auto}
checkpoint: {every_steps: 0}
)"},
      // Fine-tuning, the regime ZenFlow is for: a base model is pre-trained once in
      // device mode on one text (PRETRAIN steps), then every mode fine-tunes that same
      // base on another text; final losses are compared.
      {"convergence", R"(name: bench-convergence
model: {arch: llama, config: {hidden_size: 128, num_hidden_layers: 2, num_attention_heads: 4,
        intermediate_size: 344, max_position_embeddings: 128}}
data: {train: FINETUNE_DATA, tokenizer: byte, val_fraction: 0.1}
train: {steps: 200, micro_batch: 8, seq_len: 64, lr: 1.0e-3, schedule: cosine, warmup_steps: 10,
        grad_clip: 1.0, seed: 1, device: cpu, compute_threads: 1}
optimizer:
  mode: zenflow
  zenflow: {topk_ratio: 0.1, select_strategy: auto, update_interval: 4, full_warm_up_rounds: 1,
            overlap_step: true}
  host: {threads: 1, reserved_cores: auto}
checkpoint: {every_steps: 0}
)"},
      // ~1B-parameter Llama shape in bf16 on one GPU, sequence 1024.
      {"gpu-1b", R"(name: bench-gpu-1b
model: {arch: llama, config: {hidden_size: 2048, num_hidden_layers: 16, num_attention_heads: 16,
        num_key_value_heads: 16, intermediate_size: 5504, vocab_size: 32000,
        max_position_embeddings: 1024}}
data: {train: DATA, tokenizer: byte, val_fraction: 0.05}
train: {steps: 20, micro_batch: 8, seq_len: 1024, lr: 1.0e-4, schedule: constant, warmup_steps: 0,
        grad_clip: 1.0, seed: 1, device: cuda, dtype: bfloat16}
optimizer:
  mode: zenflow
  zenflow: {topk_ratio: 0.1, select_strategy: auto, update_interval: 4, full_warm_up_rounds: 1,
            overlap_step: true}
  host: {threads: auto, reserved_cores: auto}
checkpoint: {every_steps: 0}
)"},
      // Llama-2-7B's shape: the model our users rent one GPU for. Device mode needs ~16
      // bytes a parameter on the GPU (~110 GB): an 80 GB card runs offload and zenflow only.
      {"gpu-7b", gpu_llama_preset("gpu-7b", 4096, 32, 11008, 4, 8)},
      {"gpu-13b", gpu_llama_preset("gpu-13b", 5120, 40, 13824, 2, 6)},
      // Llama-2-13B on one GPU with its weights in host memory (train.offload_parameters,
      // offload mode): the device holds two layers' weights and gradients, not 52 GB.
      {"gpu-13b-1gpu", gpu_llama_preset("gpu-13b-1gpu", 5120, 40, 13824, 4, 4, "offload", ", offload_parameters: true")},
  };
  return p;
}

std::string default_data() {
  struct stat st;
  if (stat("/usr/share/common-licenses", &st) == 0) return "/usr/share/common-licenses";
  return std::string(ZENFLOW_SOURCE_DIR) + "/worker/rank";  // any machine that built us has this
}

struct BenchArgs {
  std::string preset = "small-batch";
  std::string modes = "device,offload,zenflow";
  int64_t steps = 0;
  std::string data;
  std::string finetune_data = "/usr/share/common-licenses/Apache-2.0";
  int64_t pretrain_steps = 300;
  std::vector<std::string> sets;
  bool json = false;
  bool metrics = false;     // each mode also with metrics on, as under `zenflow run --metrics-port`
  int64_t metrics_pairs = 2;  // off/on runs per mode, alternating
  std::string vs_node;        // tcp | sm: also against a local zenflow-optimizer node
  int64_t node_pairs = 3;     // in-process/node runs per mode, alternating
};

double median(const std::vector<double>& v) { return percentile(v, 0.5); }

#if ZENFLOW_HAVE_METRICS
// What `zenflow run --metrics-port` adds to a run: a registry, RunMetrics fed every step,
// the /metrics server, and here a scrape every second (Prometheus's default is 15 s).
class MetricsOn {
 public:
  explicit MetricsOn(const std::string& job_id)
      : run_metrics_(registry_, job_id), server_(registry_) {
    metrics::register_build_info(registry_, kVersion);
    scraper_ = std::thread([this] {
      while (!stop_.load()) {
        const auto next = std::chrono::steady_clock::now() + std::chrono::seconds(1);
        while (!stop_.load() && std::chrono::steady_clock::now() < next)
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (stop_.load()) break;
        bytes_ += metrics::render_text(registry_).size();
        ++scrapes_;
      }
    });
  }
  ~MetricsOn() {
    stop_.store(true);
    scraper_.join();
  }
  TrainingObserver* observer() { return &run_metrics_; }
  int64_t scrapes() const { return scrapes_; }
  int64_t scrape_bytes() const { return scrapes_ > 0 ? static_cast<int64_t>(bytes_ / scrapes_) : 0; }

 private:
  metrics::MetricsRegistry registry_;
  RunMetrics run_metrics_;
  metrics::MetricsServer server_;
  std::atomic<bool> stop_{false};
  std::thread scraper_;
  int64_t scrapes_ = 0;
  size_t bytes_ = 0;
};

// Seconds one RunMetrics::on_step takes (the training thread's whole cost of metrics),
// measured on a registry of its own over many calls.
double on_step_seconds() {
  metrics::MetricsRegistry registry;
  RunMetrics m(registry, "bench");
  RunFacts facts;
  m.on_start(facts);
  TrainingStep step;
  step.times.wall_seconds = 0.01;
  step.tokens = 16;
  constexpr int kCalls = 1'000'000;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kCalls; ++i) {
    step.step = i;
    m.on_step(step);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / kCalls;
}
#endif

std::vector<std::string> split_csv(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

nlohmann::json mode_json(const RunSummary& s) {
  nlohmann::json j = summary_json(s);
  j.erase("losses");
  const double n = static_cast<double>(std::max<size_t>(1, s.step_seconds.size()));
  // Per training step: the end-of-run flush of the last window is not a step.
  nlohmann::json bytes = nlohmann::json::object();
  for (int d = 0; d < engine::kNumDirections; ++d)
    bytes[engine::direction_name(static_cast<engine::Direction>(d))] =
        static_cast<double>(s.totals.transfer_bytes[d] - s.finish_times.transfer_bytes[d]) / n;
  j["transfer_bytes_per_step"] = bytes;
  double stall = 0;
  for (double x : s.totals.stall_seconds) stall += x;
  j["stall_fraction"] = s.totals.wall_seconds > 0 ? stall / s.totals.wall_seconds : 0;
  return j;
}

#if ZENFLOW_HAVE_UCX
// Of a run's accounted time (compute, device optimizer, every stall), the share the training
// thread waited for the host optimizer's window step and for the network.
double exposed_host_share(const RunSummary& s) {
  const engine::StepTimes& t = s.totals;
  double all = t.compute_seconds + t.device_optimizer_seconds;
  for (double x : t.stall_seconds) all += x;
  const double host = t.stall_seconds[static_cast<int>(engine::StallCause::kHostOptimizer)] +
                      t.stall_seconds[static_cast<int>(engine::StallCause::kNetwork)];
  return all > 0 ? host / all : 0;
}

// `spec` in-process and against a zenflow-optimizer node on this machine, `a.node_pairs`
// pairs whose order alternates (pair 0: in-process first, where `first` is that run), so
// that a drift of the machine's speed falls on both. The node process runs only on the
// cores the in-process host optimizer had, with as many threads: the resources are the
// same, only where the host state lives and how the gradients reach it differ.
nlohmann::json compare_with_node(const BenchArgs& a, const JobSpec& spec, const RunOptions& opts,
                                 const RunSummary& first) {
  setenv("UCX_TLS", a.vs_node == "sm" ? "sm,tcp" : "tcp", 1);  // before any Transport, the node's too
  setenv("UCX_NET_DEVICES", "lo", 0);
  std::vector<int> cores = spec.optimizer.host.reserved_cores;
  if (spec.optimizer.host.reserved_cores_auto) {  // trainer.cpp's plan: the last cores
    const std::vector<int> all = engine::available_cores();
    const size_t n = std::min(all.size(), static_cast<size_t>(std::max<int64_t>(1, first.host_threads)));
    cores.assign(all.end() - static_cast<long>(n), all.end());
  }
  std::string core_list;
  for (int c : cores) core_list += (core_list.empty() ? "" : ",") + std::to_string(c);
  const std::filesystem::path scratch = std::filesystem::temp_directory_path();
  const LocalOptimizerNode node(
      scratch, {"--threads", std::to_string(std::max<int64_t>(1, first.host_threads)), "--cores", core_list},
      cores);
  JobSpec remote = spec;
  remote.optimizer.host.addresses = {node.address()};
  std::cerr << "bench offload: " << spec.optimizer.mode << " against a node at " << node.address()
            << " (UCX_TLS=" << getenv("UCX_TLS") << ", cores " << core_list << "), " << a.node_pairs
            << " pairs\n";

  std::vector<RunSummary> in_process = {first}, with_node;
  for (int64_t pair = 0; pair < a.node_pairs; ++pair) {
    const bool node_first = pair % 2 == 1;
    for (int k = 0; k < 2; ++k) {
      const bool on_node = (k == 0) == node_first;
      if (pair == 0 && !on_node) continue;  // `first`
      std::cerr << "bench offload: " << spec.optimizer.mode << (on_node ? " with the node" : " in-process")
                << " (pair " << pair + 1 << ")\n";
      RunSummary s = run_training(on_node ? remote : spec, opts);
      nlohmann::json j = mode_json(s);
      j["preset"] = a.preset;
      j["pair"] = pair + 1;
      if (a.json) std::cout << j.dump() << std::endl;
      (on_node ? with_node : in_process).push_back(std::move(s));
    }
  }
  auto each = [](const std::vector<RunSummary>& runs, auto field) {
    std::vector<double> v;
    for (const RunSummary& r : runs) v.push_back(field(r));
    return v;
  };
  const auto step = [](const RunSummary& r) { return r.step_seconds_median; };
  const std::vector<double> local_steps = each(in_process, step), node_steps = each(with_node, step);
  std::vector<double> per_pair;
  for (size_t i = 0; i < node_steps.size(); ++i) per_pair.push_back(node_steps[i] / local_steps[i] - 1);
  bool same_loss = true;
  for (const auto* runs : {&in_process, &with_node})
    for (const RunSummary& r : *runs) same_loss &= r.final_loss == first.final_loss;
  const RunSummary& last = with_node.back();
  const double steps = static_cast<double>(std::max<size_t>(1, last.step_seconds.size()));
  nlohmann::json v = {
      {"transport", a.vs_node},
      {"ucx_tls", getenv("UCX_TLS")},
      {"node_cores", cores},
      {"pairs", a.node_pairs},
      {"step_seconds_median", {{"in_process", local_steps}, {"node", node_steps}}},
      {"added_step_time", median(node_steps) / median(local_steps) - 1},
      {"added_step_time_per_pair", per_pair},
      {"exposed_host_and_network_share",
       {{"in_process", median(each(in_process, exposed_host_share))},
        {"node", median(each(with_node, exposed_host_share))}}},
      {"host_state_bytes", {{"in_process", first.host_state_bytes}, {"node", last.host_state_bytes}}},
      {"network_bytes_per_step",
       {{"sent", static_cast<double>(last.network_bytes_sent) / steps},
        {"received", static_cast<double>(last.network_bytes_received) / steps}}},
      {"same_final_loss", same_loss}};
  char line[256];
  std::snprintf(
      line, sizeof line,
      "bench offload: %s with a node over %s: step %+.1f%% (medians %.4f s vs %.4f s in-process), exposed "
      "host_optimizer + network %.1f%% vs %.1f%%, final losses %s\n",
      spec.optimizer.mode.c_str(), a.vs_node.c_str(), 100 * v["added_step_time"].get<double>(),
      median(node_steps), median(local_steps),
      100 * v["exposed_host_and_network_share"]["node"].get<double>(),
      100 * v["exposed_host_and_network_share"]["in_process"].get<double>(),
      same_loss ? "identical" : "DIFFER");
  std::cerr << line;
  return v;
}
#endif

int run_bench(const BenchArgs& a) {
  auto it = presets().find(a.preset);
  if (it == presets().end()) {
    std::cerr << "zenflow bench offload: unknown preset '" << a.preset
              << "' (available: small-batch, convergence, gpu-1b, gpu-7b, gpu-13b, gpu-13b-1gpu)\n";
    return kExitBadInput;
  }
  std::string yaml = it->second;
  const std::string data = a.data.empty() ? default_data() : a.data;
  const bool finetune = yaml.find("FINETUNE_DATA") != std::string::npos;
  if (finetune) {
    yaml.replace(yaml.find("FINETUNE_DATA"), 13, a.finetune_data);
  } else {
    yaml.replace(yaml.find("DATA"), 4, data);
  }
  std::vector<std::pair<std::string, at::Tensor>> base_weights;
  if (finetune) {
    // Pre-train the shared base model once, in device mode, on the pre-training text.
    std::vector<std::string> sets = a.sets;
    sets.push_back("optimizer.mode=device");
    sets.push_back("data.train=" + data);
    sets.push_back("train.steps=" + std::to_string(a.pretrain_steps));
    sets.push_back("train.lr=3.0e-3");
    JobSpec base = parse_job_spec(yaml, sets, ".");
    RunOptions opts;
    opts.resume = false;
    opts.write_checkpoints = false;
    opts.evaluate = false;
    opts.final_weights = &base_weights;
    std::cerr << "bench offload: pre-training the base model (" << a.pretrain_steps << " steps, device mode, "
              << data << ")\n";
    RunSummary s = run_training(base, opts);
    std::cerr << "bench offload: base model loss " << s.final_loss << "; fine-tuning on " << a.finetune_data << "\n";
  }
  std::map<std::string, RunSummary> results;
  std::map<std::string, int64_t> bytes_per_elem;
  nlohmann::json metrics_overhead = nlohmann::json::object();
#if !ZENFLOW_HAVE_UCX
  if (!a.vs_node.empty()) {
    std::cerr << "zenflow bench offload: --vs-node: this build has no UCX transport (built with "
                 "ZENFLOW_UCX=OFF)\n";
    return kExitBadInput;
  }
#endif
  nlohmann::json vs_node = nlohmann::json::object();
#if !ZENFLOW_HAVE_METRICS
  if (a.metrics) {
    std::cerr << "zenflow bench offload: --metrics: this build has no metrics (civetweb was not found)\n";
    return kExitBadInput;
  }
#endif
  for (const std::string& mode : split_csv(a.modes)) {
    std::vector<std::string> sets = a.sets;
    sets.push_back("optimizer.mode=" + mode);
    if (a.steps > 0) sets.push_back("train.steps=" + std::to_string(a.steps));
    JobSpec spec;
    try {
      spec = parse_job_spec(yaml, sets, ".");
    } catch (const SpecError& e) {
      std::cerr << "zenflow bench offload: " << e.what() << "\n";
      return kExitBadInput;
    }
    RunOptions opts;
    opts.resume = false;
    opts.write_checkpoints = false;
    opts.evaluate = finetune;
    opts.initial_weights = base_weights;
    std::cerr << "bench offload: " << a.preset << " / " << mode << " (" << spec.train.steps << " steps)\n";
    RunSummary s = run_training(spec, opts);
    nlohmann::json j = mode_json(s);
    j["preset"] = a.preset;
    if (a.metrics) j["metrics"] = "off";
    if (a.json) {
      std::cout << j.dump() << std::endl;
    } else {
      print_summary_table(std::cout, spec, s);
    }
    results[mode] = s;
#if ZENFLOW_HAVE_UCX
    if (!a.vs_node.empty() && mode != "device") {
      vs_node[mode] = compare_with_node(a, spec, opts, s);
      if (a.json)
        std::cout << nlohmann::json({{"preset", a.preset}, {"mode", mode}, {"vs_node", vs_node[mode]}}).dump()
                  << std::endl;
    }
#endif
#if ZENFLOW_HAVE_METRICS
    if (!a.metrics) continue;
    // Off and on alternate, so that a drift of the machine's speed falls on both.
    std::vector<double> off = s.step_seconds, on;
    bool same_losses = true;
    int64_t scrapes = 0, scrape_bytes = 0;
    for (int64_t pair = 0; pair < a.metrics_pairs; ++pair) {
      if (pair > 0) {
        std::cerr << "bench offload: " << a.preset << " / " << mode << " metrics off (pair " << pair + 1 << ")\n";
        const RunSummary again = run_training(spec, opts);
        off.insert(off.end(), again.step_seconds.begin(), again.step_seconds.end());
        same_losses &= again.final_loss == s.final_loss;
      }
      std::cerr << "bench offload: " << a.preset << " / " << mode << " metrics on (pair " << pair + 1 << ")\n";
      MetricsOn metrics_on(spec.name);
      RunOptions with = opts;
      with.observer = metrics_on.observer();
      const RunSummary m = run_training(spec, with);
      on.insert(on.end(), m.step_seconds.begin(), m.step_seconds.end());
      same_losses &= m.final_loss == s.final_loss;
      scrapes += metrics_on.scrapes();
      scrape_bytes = std::max(scrape_bytes, metrics_on.scrape_bytes());
    }
    const double off_median = median(off), on_median = median(on), per_step = on_step_seconds();
    nlohmann::json overhead = {{"step_seconds_median_off", off_median},
                               {"step_seconds_median_on", on_median},
                               {"relative_overhead", off_median > 0 ? on_median / off_median - 1 : 0.0},
                               {"steps_off", off.size()},
                               {"steps_on", on.size()},
                               {"on_step_seconds", per_step},
                               {"on_step_share_of_step", off_median > 0 ? per_step / off_median : 0.0},
                               {"scrapes", scrapes},
                               {"scrape_bytes", scrape_bytes},
                               {"same_final_loss", same_losses}};
    metrics_overhead[mode] = overhead;
    std::cout << nlohmann::json({{"preset", a.preset}, {"mode", mode}, {"metrics_overhead", overhead}}).dump()
              << std::endl;
#endif
  }
  // The comparison the paper's claims are about.
  nlohmann::json cmp;
  cmp["preset"] = a.preset;
  cmp["comparison"] = true;
  auto med = [&](const std::string& m) { return results.at(m).step_seconds_median; };
  if (results.count("device") && results.count("offload") && results.count("zenflow")) {
    const double extra = med("offload") - med("device");
    cmp["offload_overhead_removed"] = extra > 0 ? (med("offload") - med("zenflow")) / extra : 0.0;
    cmp["practicality_zenflow"] = med("device") / med("zenflow");
    cmp["practicality_offload"] = med("device") / med("offload");
    cmp["speedup_zenflow_over_offload"] = med("offload") / med("zenflow");
  }
  for (const auto& [mode, s] : results) {
    const double n = static_cast<double>(std::max<size_t>(1, s.step_seconds.size()));
    const double model_bytes = static_cast<double>(s.split_params) * (s.device == "cpu" ? 4.0 : 2.0);
    if (model_bytes > 0)
      cmp["transfer_per_step_over_model_size"][mode] =
          (static_cast<double>(s.totals.transfer_bytes[0] + s.totals.transfer_bytes[1] -
                               s.finish_times.transfer_bytes[0] - s.finish_times.transfer_bytes[1]) /
           n) /
          model_bytes;
    cmp["final_loss"][mode] = s.final_loss;
    if (s.val_loss >= 0) cmp["val_loss"][mode] = s.val_loss;
  }
  if (results.count("device")) {
    const RunSummary& d = results.at("device");
    for (const auto& [mode, s] : results) {
      cmp["final_loss_rel_diff_vs_device"][mode] = (s.final_loss - d.final_loss) / d.final_loss;
      if (s.val_loss >= 0 && d.val_loss > 0)
        cmp["val_loss_rel_diff_vs_device"][mode] = (s.val_loss - d.val_loss) / d.val_loss;
    }
  }
  if (a.metrics) cmp["metrics_overhead"] = metrics_overhead;
  if (!vs_node.empty()) cmp["vs_node"] = vs_node;
  std::cout << cmp.dump() << std::endl;
  return kExitOk;
}

CommandRegistrar reg(60, [](CommandContext& ctx) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand("offload", "device vs offload vs zenflow, same model and data");
  cmd->add_option("--preset", args->preset, "small-batch | convergence | gpu-1b | gpu-7b | gpu-13b | gpu-13b-1gpu");
  cmd->add_option("--modes", args->modes, "Comma-separated modes");
  cmd->add_option("--steps", args->steps, "Steps per mode (default: the preset's)");
  cmd->add_option("--data", args->data, "Training text (default /usr/share/common-licenses)");
  cmd->add_option("--set", args->sets, "Override a preset key (repeatable)");
  cmd->add_option("--finetune-data", args->finetune_data, "convergence: the fine-tuning text");
  cmd->add_option("--pretrain-steps", args->pretrain_steps, "convergence: pre-training steps of the base model");
  cmd->add_flag("--json", args->json, "One JSON object per mode (and a comparison) on stdout");
  cmd->add_flag("--metrics", args->metrics,
                "Also run each mode with metrics on, as under `zenflow run --metrics-port` (registry, "
                "per-step updates, /metrics server, a scrape a second): median step time off vs on");
  cmd->add_option("--metrics-pairs", args->metrics_pairs, "--metrics: off/on runs per mode, alternating (default 2)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}));
  cmd->add_option("--vs-node", args->vs_node,
                  "Also run each host-optimizer mode against a zenflow-optimizer node on this machine, over "
                  "UCX tcp (lo) or sm, pinned to the cores the in-process host optimizer had")
      ->check(CLI::IsMember({"tcp", "sm"}));
  cmd->add_option("--node-pairs", args->node_pairs,
                  "--vs-node: in-process/node runs per mode, alternating (default 3)")
      ->check(CLI::Range(int64_t{1}, int64_t{100}));
  cmd->callback([args, &ctx] { ctx.exit_code = run_bench(*args); });
});

}  // namespace
}  // namespace zenflow::cli
