// `zenflow bench model-load`: time and peak RSS of loading a Hugging Face model directory
// (optionally generating a ~1B-parameter bf16 Llama checkpoint to load first).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "client/commands.h"
#include "worker/rank/error_text.h"
#include "worker/model/hf_model.h"
#include "worker/model/safetensors.h"

namespace zenflow::cli {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct ModelLoadArgs {
  std::string dir;
  bool generate = false;
  std::string device = "cpu";
  std::string dtype = "auto";
};

// A TinyLlama-1.1B-shaped config: 1,100,048,384 parameters, 2.2 GB in bf16.
json llama_1b_config() {
  zenflow::model::LlamaConfig c;
  c.vocab_size = 32000;
  c.hidden_size = 2048;
  c.intermediate_size = 5632;
  c.num_hidden_layers = 22;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 4;
  c.max_position_embeddings = 2048;
  return zenflow::model::hf_config_json(c, "llama");
}

// Random bf16 weights (normal(0, 0.02), norms 1), written tensor by tensor's worth of
// memory: the whole model is held once, in bf16.
void generate(const fs::path& dir) {
  fs::create_directories(dir);
  json config = llama_1b_config();
  config["torch_dtype"] = "bfloat16";
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";
  auto meta = zenflow::model::make_hf_architecture(config, at::TensorOptions().device(at::kMeta));
  at::Generator gen = at::detail::createCPUGenerator(1);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& p : meta->parameters()) {
    at::Tensor t = at::empty(p.tensor.sizes(), at::TensorOptions().dtype(at::kBFloat16));
    if (t.dim() == 1) {
      t.fill_(1.0);
    } else {
      t.normal_(0.0, 0.02, gen);
    }
    tensors.emplace_back(p.name, t);
  }
  zenflow::model::write_safetensors((dir / "model.safetensors").string(), tensors, {{"format", "pt"}});
}

// A field of /proc/self/status in bytes ("VmRSS", "VmHWM").
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1)) * 1024;
  return -1;
}

int run_model_load(const ModelLoadArgs& a) {
  try {
    if (a.generate && !fs::exists(fs::path(a.dir) / "config.json")) {
      const auto t0 = std::chrono::steady_clock::now();
      generate(a.dir);
      std::cerr << "zenflow bench model-load: generated " << a.dir << " in "
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                << " s; run again (without --generate) for a clean RSS figure\n";
      return kExitOk;
    }
    zenflow::model::HfLoadOptions options;
    options.device = at::Device(a.device);
    if (a.dtype != "auto") options.dtype = zenflow::model::hf_dtype_from_name(a.dtype);
    int64_t file_bytes = 0;
    for (const auto& e : fs::directory_iterator(a.dir))
      if (e.path().extension() == ".safetensors") file_bytes += static_cast<int64_t>(e.file_size());

    { std::ofstream("/proc/self/clear_refs") << "5"; }  // resets VmHWM to the current RSS
    const int64_t rss_before = status_bytes("VmRSS");
    const auto t0 = std::chrono::steady_clock::now();
    zenflow::model::LoadedModel m = zenflow::model::load_hf_model(a.dir, options);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const int64_t peak = status_bytes("VmHWM");
    const int64_t rss_after = status_bytes("VmRSS");
    int64_t params = 0, param_bytes = 0;
    for (const auto& p : m.model->parameters()) {
      params += p.tensor.numel();
      param_bytes += p.tensor.numel() * static_cast<int64_t>(p.tensor.element_size());
    }
    const double gb = 1e9;
    std::cout << json{{"dir", a.dir},
                      {"model_type", m.model_type},
                      {"parameters", params},
                      {"checkpoint_dtype", zenflow::model::hf_dtype_name(m.checkpoint_dtype)},
                      {"device", a.device},
                      {"dtype",
                       zenflow::model::hf_dtype_name(m.model->parameters().front().tensor.scalar_type())},
                      {"file_gb", file_bytes / gb},
                      {"parameter_gb", param_bytes / gb},
                      {"load_seconds", seconds},
                      {"load_gb_per_s", file_bytes / gb / seconds},
                      {"rss_before_gb", rss_before / gb},
                      {"peak_rss_gb", peak / gb},
                      {"rss_after_gb", rss_after / gb},
                      {"peak_rss_over_file", static_cast<double>(peak) / static_cast<double>(file_bytes)}}
                     .dump(2)
              << "\n";
    return kExitOk;
  } catch (const std::exception& e) {
    std::cerr << "zenflow bench model-load: " << error_text(e) << "\n";
    return kExitFailure;
  }
}

const CommandRegistrar kBenchModelLoad(45, [](CommandContext& ctx) {
  auto args = std::make_shared<ModelLoadArgs>();
  CLI::App* cmd = ctx.bench->add_subcommand(
      "model-load", "Load time and peak RSS of a Hugging Face model directory (JSON)");
  cmd->add_option("dir", args->dir, "Model directory (config.json + safetensors)")->required();
  cmd->add_flag("--generate", args->generate,
                "Write a random ~1.1B-parameter bf16 Llama (TinyLlama shape) into DIR first, then exit");
  cmd->add_option("--device", args->device, "Load onto this device (cpu, cuda)");
  cmd->add_option("--dtype", args->dtype,
                  "Parameter dtype: auto (the checkpoint's), float32, bfloat16, float16")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}));
  CommandContext* context = &ctx;
  cmd->callback([args, context] { context->exit_code = run_model_load(*args); });
});

}  // namespace
}  // namespace zenflow::cli
