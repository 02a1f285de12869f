// `zenflow bench shard`: what train.shard saves and costs, rank count by rank count. Each
// row is one `zenflow run --nproc N --json` (Gloo on 127.0.0.1 on the CPU) of the same
// Llama-shaped model with activation checkpointing on (train.shard: parameters needs it;
// on in every row, so sharding is the only difference) and the same micro-batch per rank,
// and reports rank 0's device memory by kind (DeviceMemoryBytes), the median step time and
// the share of the steps' time its gathers and reduce-scatters were blocked (exposed:
// they are not prefetched yet). Prints one JSON object.
//
//   zenflow bench shard [--ranks 1,2,4] [--shards none,gradients,parameters] [--mode device]
//                       [--hidden 256] [--layers 4] [--seq 128] [--micro-batch 2] [--steps 8]
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "client/commands.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;

struct ShardBenchArgs {
  std::string ranks = "1,2,4";
  std::string shards = "none,gradients,parameters";
  std::string mode = "device";
  int64_t hidden = 256, layers = 4, seq = 128, micro_batch = 2, steps = 8;
  std::string data;
  std::string dir;
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string quoted(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// The spec every row runs (train.shard and the checkpoint directory set per row).
std::string spec_text(const ShardBenchArgs& a, const std::string& data) {
  const int64_t heads = a.hidden >= 64 ? a.hidden / 64 : 1;
  std::ostringstream s;
  s << "name: bench-shard\n"
    << "model: {arch: llama, config: {hidden_size: " << a.hidden << ", num_hidden_layers: " << a.layers
    << ", num_attention_heads: " << heads << ", intermediate_size: " << a.hidden * 8 / 3
    << ", max_position_embeddings: " << a.seq << "}}\n"
    << "data: {train: " << quoted(data) << ", tokenizer: byte}\n"
    << "train: {steps: " << a.steps << ", micro_batch: " << a.micro_batch << ", seq_len: " << a.seq
    << ", lr: 1.0e-4, warmup_steps: 1, device: cpu, compute_threads: 1, activation_checkpointing: true}\n"
    << "optimizer: {mode: " << a.mode << ", host: {threads: 1}}\n"
    << "checkpoint: {every_steps: 0}\n";
  return s.str();
}

// One `zenflow run --json` row; its summary, or {"error": ...}.
nlohmann::json run_row(const std::string& zenflow, const fs::path& spec, int ranks, const std::string& shard,
                       const fs::path& ckpt) {
  const fs::path err = spec.parent_path() / ("stderr-" + shard + "-" + std::to_string(ranks) + ".txt");
  const std::string cmd = quoted(zenflow) + " run " + quoted(spec.string()) + " --quiet --json --no-resume --nproc " +
                          std::to_string(ranks) + " --set train.shard=" + shard +
                          " --set checkpoint.dir=" + quoted(ckpt.string()) + " 2>" + quoted(err.string());
  std::string out;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = pclose(p);
    if (status == 0) {
      try {
        return nlohmann::json::parse(out);
      } catch (const nlohmann::json::exception&) {
      }
    }
  }
  std::ifstream in(err);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {{"error", text.empty() ? "zenflow run failed" : text}};
}

int run_bench_shard(const ShardBenchArgs& a) {
  const fs::path bin = fs::read_symlink("/proc/self/exe").parent_path();
  const std::string zenflow = (bin / "zenflow").string();
  struct stat st;
  const std::string data = !a.data.empty() ? a.data
                           : stat("/usr/share/common-licenses", &st) == 0
                               ? std::string("/usr/share/common-licenses")
                               : std::string(ZENFLOW_SOURCE_DIR) + "/worker/rank";
  const fs::path dir = fs::absolute(a.dir.empty() ? fs::temp_directory_path() : fs::path(a.dir)) /
                       ("zenflow-bench-shard-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path spec = dir / "job.yaml";
  std::ofstream(spec) << spec_text(a, data);
  nlohmann::json rows = nlohmann::json::array();
  int failed = 0;
  for (const std::string& r : split_list(a.ranks)) {
    const int ranks = std::stoi(r);
    for (const std::string& shard : split_list(a.shards)) {
      if (ranks == 1 && shard != "none") continue;  // one rank has nothing to shard across
      std::cerr << "bench shard: " << ranks << " rank(s), shard " << shard << "\n";
      const nlohmann::json j = run_row(zenflow, spec, ranks, shard, dir / ("ckpt-" + shard + "-" + r));
      nlohmann::json row = {{"ranks", ranks}, {"shard", shard}};
      if (j.contains("error")) {
        row["error"] = j["error"];
        ++failed;
      } else {
        row["device_memory_bytes"] = j["device_memory_bytes"];
        const auto& m = j["device_memory_bytes"];
        row["parameters_plus_gradients_bytes"] = m["parameters"].get<int64_t>() + m["gradients"].get<int64_t>();
        row["step_seconds_median"] = j["step_seconds_median"];
        double steps_time = j["compute_seconds"].get<double>() + j["device_optimizer_seconds"].get<double>();
        for (const auto& [cause, s] : j["stall_seconds"].items()) steps_time += s.get<double>();
        const double comm = j["shard_comm_seconds"].get<double>();
        row["shard_comm_seconds"] = comm;
        row["shard_comm_exposed_share"] = steps_time > 0 ? comm / steps_time : 0.0;
        row["shard_gathered_peak_bytes"] = j["shard_gathered_peak_bytes"];
        row["host_state_bytes"] = j["host_state_bytes"];
        row["final_loss"] = j["final_loss"];
      }
      rows.push_back(row);
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  nlohmann::json out = {{"mode", a.mode},   {"hidden", a.hidden}, {"layers", a.layers},
                        {"seq_len", a.seq}, {"micro_batch_per_rank", a.micro_batch},
                        {"steps", a.steps}, {"rows", rows}};
  std::cout << out.dump(2) << std::endl;
  return failed == 0 ? kExitOk : kExitFailure;
}

CommandRegistrar reg(65, [](CommandContext& ctx) {
  auto args = std::make_shared<ShardBenchArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "shard", "train.shard by rank count: rank 0's device memory by kind, step time, exposed gathers (JSON)");
  cmd->add_option("--ranks", args->ranks, "Comma-separated rank counts");
  cmd->add_option("--shards", args->shards, "Comma-separated train.shard values");
  cmd->add_option("--mode", args->mode, "optimizer.mode")->check(CLI::IsMember({"device", "offload", "zenflow"}));
  cmd->add_option("--hidden", args->hidden, "hidden_size")->check(CLI::Range(int64_t{8}, int64_t{65536}));
  cmd->add_option("--layers", args->layers, "num_hidden_layers")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  cmd->add_option("--seq", args->seq, "seq_len")->check(CLI::Range(int64_t{2}, int64_t{1 << 20}));
  cmd->add_option("--micro-batch", args->micro_batch, "Sequences per rank per step")
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  cmd->add_option("--steps", args->steps, "Steps per row")->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  cmd->add_option("--data", args->data, "Training text (default /usr/share/common-licenses)");
  cmd->add_option("--dir", args->dir, "Scratch directory (default: the system's temporary directory)");
  cmd->callback([args, &ctx] { ctx.exit_code = run_bench_shard(*args); });
});

}  // namespace
}  // namespace zenflow::cli
