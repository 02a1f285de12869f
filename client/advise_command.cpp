// `zenflow advise PROFILE|RUN_DIR|JOB_ID`: which instance and which optimizer mode,
// predicted from the job's own measured profile (common/advisor), in dollars. A JOB_ID is
// a job of a coordinator, which keeps the profile of its newest attempt that trained long
// enough (the worker agent runs rank 0 with --profile-if-possible and uploads it).
// --model-config sizes the job for a Hugging Face model's exact shapes (its config.json)
// instead of the profiled model scaled; every row trains the job's global batch.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "client/commands.h"
#include "common/advisor/advice.h"
#include "common/advisor/hardware.h"
#include "common/advisor/job_profile.h"
#include "common/advisor/model_memory.h"
#include "common/advisor/step_model.h"
#include "common/pricing.h"

namespace zenflow::cli {
namespace {

struct AdviseArgs {
  std::string profile;  // a profile.yaml, a run directory, or a coordinator's job id
  CoordinatorFlags coordinator;
  std::vector<std::string> catalogs;
  std::string instance;      // "" every catalog instance; "local": this host
  std::string model_config;  // a config.json (or its directory): the model's exact shapes
  std::vector<std::string> sets;
  double deadline_hours = 0;
  double budget_usd = 0;
  int64_t steps = 0;
  bool json = false;
};

// A coordinator's job id ("j-000042"), not a path: what `zenflow submit` prints.
bool looks_like_job_id(const std::string& s) {
  if (s.size() < 3 || s.rfind("j-", 0) != 0) return false;
  return std::all_of(s.begin() + 2, s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

int advise(const AdviseArgs& a) {
  namespace fs = std::filesystem;
  using namespace advisor;
  std::string path = a.profile;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path = (fs::path(path) / "profile.yaml").string();
  JobProfile profile;
  PricingCatalog catalog;
  if (!fs::exists(path, ec) && looks_like_job_id(a.profile)) {
#ifdef ZENFLOW_HAVE_SERVICES
    std::string yaml;
    if (int rc = fetch_job_profile(a.coordinator, a.profile, &yaml); rc != kExitOk) return rc;
    try {
      profile = JobProfile::parse(yaml, "the profile the coordinator keeps for job " + a.profile);
    } catch (const ProfileError& e) {
      std::cerr << "zenflow: invalid profile: " << e.what() << "\n";
      return kExitBadInput;
    }
#else
    std::cerr << "zenflow: " << a.profile << ": no such file, and this zenflow was built without the services "
                 "(ZENFLOW_SERVICES=OFF), so it cannot ask a coordinator for the job's profile\n";
    return kExitBadInput;
#endif
  } else {
    try {
      profile = JobProfile::load(path);
    } catch (const ProfileError& e) {
      std::cerr << "zenflow: invalid profile: " << e.what() << "\n";
      if (!fs::exists(path, ec)) std::cerr << "zenflow: make one with: zenflow run JOB.yaml --profile\n";
      return kExitBadInput;
    }
  }
  try {
    const std::string shipped = std::string(ZENFLOW_SOURCE_DIR) + "/deploy/pricing.yaml";
    if (fs::exists(shipped, ec)) catalog = PricingCatalog::load(shipped);
    for (const std::string& f : a.catalogs) catalog.merge(PricingCatalog::load(f));
  } catch (const PricingError& e) {
    std::cerr << "zenflow: invalid pricing catalog: " << e.what() << "\n";
    return kExitBadInput;
  }
  Scenario base = scenario_of(profile);
  std::vector<std::string> gpu_sets;  // --set applies to every instance; host/compute threads are local facts
  bool mode_fixed = false;
  try {
    for (const std::string& s : a.sets) {
      apply_setting(base, s);
      if (s.rfind("mode=", 0) == 0 || s.rfind("optimizer.mode=", 0) == 0) mode_fixed = true;
    }
  } catch (const std::invalid_argument& e) {
    std::cerr << "zenflow: " << e.what() << "\n";
    return kExitBadInput;
  }
  // Whether --set gave `key` (as itself, or under its spec section: train.shard for shard).
  auto explicitly = [&](const std::string& key) {
    for (const std::string& s : a.sets) {
      const std::string k = s.substr(0, s.find('='));
      if (k == key || (k.size() > key.size() && k.compare(k.size() - key.size() - 1, std::string::npos, "." + key) == 0))
        return true;
    }
    return false;
  };
  std::string model_line;
  if (!a.model_config.empty()) {
    if (explicitly("parameters")) {
      std::cerr << "zenflow: --set parameters and --model-config both size the model: give one\n";
      return kExitBadInput;
    }
    try {
      base.model = load_model_shape(a.model_config);
    } catch (const ModelConfigError& e) {
      std::cerr << "zenflow: invalid model config: " << e.what() << "\n";
      return kExitBadInput;
    }
    char n[32];
    std::snprintf(n, sizeof n, "%.3g", static_cast<double>(base.model->parameters));
    model_line = base.model->arch + ", " + n + " parameters, " + std::to_string(base.model->layers) +
                 " layers, hidden " + std::to_string(base.model->hidden) + " (" + base.model->source + ")";
  } else if (explicitly("activation_checkpointing")) {
    std::cerr << "zenflow: --set activation_checkpointing needs --model-config (activations are counted "
                 "from the model's layer shapes)\n";
    return kExitBadInput;
  } else if (explicitly("shard")) {
    std::cerr << "zenflow: --set shard needs --model-config (what a rank holds is counted from the model's "
                 "shapes)\n";
    return kExitBadInput;
  } else if (explicitly("device_staging_mib")) {
    std::cerr << "zenflow: --set device_staging_mib needs --model-config (the staging is counted from the "
                 "model's shapes)\n";
    return kExitBadInput;
  } else if (explicitly("offload_parameters")) {
    std::cerr << "zenflow: --set offload_parameters needs --model-config (the streamed layers are counted from "
                 "the model's shapes)\n";
    return kExitBadInput;
  }
  // Every row trains the job's global batch: W GPUs share it instead of each taking its own.
  base.global_batch = base.micro_batch * base.grad_accum * std::max<int64_t>(1, base.ranks);
  std::vector<Instance> instances;
  const std::string today = today_utc();
  if (a.instance == "local") {
    instances.push_back(local_instance(profile, catalog.find_instance("local")));
  } else {
    for (const InstancePrice& row : catalog.instances()) {
      if (!a.instance.empty() && row.name != a.instance) continue;
      if (row.gpu_count <= 0 && a.instance.empty()) continue;
      instances.push_back(row.name == "local" ? local_instance(profile, &row)
                                              : instance_from_catalog(row, today));
    }
    if (instances.empty()) {
      std::cerr << "zenflow: --instance " << a.instance
                << ": not in the catalog (or 'local' for this host)\n";
      return kExitBadInput;
    }
  }
  const int64_t steps = a.steps > 0 ? a.steps : std::max<int64_t>(1, profile.run.steps);
  std::vector<Prediction> preds;
  for (const Instance& in : instances) {
    for (const char* mode : {"device", "offload", "zenflow"}) {
      if (mode_fixed && base.mode != mode) continue;
      Scenario s = base;
      s.mode = mode;
      if (!in.cpu_device) {
        if (!explicitly("host_threads")) s.host_threads = 0;
        if (!explicitly("ranks")) s.ranks = 0;
        s.host_shares_compute_cores = false;
      }
      if (std::string(mode) == "zenflow" && profile.run.mode != "zenflow") {
        if (!explicitly("update_interval")) s.update_interval = 4;
        if (!explicitly("topk_ratio")) s.topk_ratio = 0.1;
      }
      preds.push_back(predict(profile, in, s, steps));
    }
  }
  Advice advice = rank(std::move(preds), steps,
                       a.deadline_hours > 0 ? std::optional<double>(a.deadline_hours) : std::nullopt,
                       a.budget_usd > 0 ? std::optional<double>(a.budget_usd) : std::nullopt);
  advice.model = model_line;
  if (a.json)
    std::cout << advice_json(advice, profile).dump(2) << std::endl;
  else
    print_advice(std::cout, advice, profile);
  return kExitOk;
}

CommandRegistrar reg(45, [](CommandContext& ctx) {
  auto args = std::make_shared<AdviseArgs>();
  CLI::App* cmd = ctx.root->add_subcommand(
      "advise",
      "Which instance and optimizer mode for a job: step time by stall cause and $, from its profile");
  cmd->add_option("profile", args->profile,
                  "profile.yaml from `zenflow run --profile`, the run directory holding it, or a coordinator's "
                  "job id (j-NNNNNN: the profile it keeps of the job's newest attempt)")
      ->required();
#ifdef ZENFLOW_HAVE_SERVICES
  add_coordinator_flags(cmd, args->coordinator);
#endif
  cmd->add_option("--catalog", args->catalogs,
                  "Catalog merged by name over the shipped deploy/pricing.yaml (repeatable; e.g. the row "
                  "`zenflow profile-host` wrote)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--instance", args->instance,
                  "Only this catalog instance, or 'local' (this host: the profile's probes, or a catalog row "
                  "named local)");
  cmd->add_option("--set", args->sets,
                  "Ask about the job with another setting: mode, micro_batch, grad_accum, seq_len, ranks, "
                  "update_interval, topk_ratio, host_threads, compute_threads, parameters (7B), "
                  "activation_checkpointing, shard (none, gradients, parameters), device_staging_mib (0: whole "
                  "gradients, or MiB of chunked device staging) and offload_parameters (true, false: offload mode's "
                  "weights streamed from host memory); the last four with --model-config; default: only "
                  "where needed (repeatable)");
  cmd->add_option(
      "--model-config", args->model_config,
      "A Hugging Face config.json (Llama, Mistral, Qwen2, GPT-2) or its model directory: size the "
      "job for that model's exact shapes (parameters, FLOPs, activations per layer) instead of "
      "the profiled model scaled");
  auto* deadline =
      cmd->add_option("--deadline", args->deadline_hours, "Hours: the cheapest answer that finishes in time")
          ->check(CLI::PositiveNumber);
  cmd->add_option("--budget", args->budget_usd, "USD: the fastest answer within the budget")
      ->check(CLI::PositiveNumber)
      ->excludes(deadline);
  cmd->add_option("--steps", args->steps, "Optimizer steps of the job (default: the profile's train.steps)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--json", args->json, "Everything as one JSON object (stdout)");
  cmd->callback([args, &ctx] { ctx.exit_code = advise(*args); });
});

}  // namespace
}  // namespace zenflow::cli
