// zenflow advise: the profile, the step-time model against its own calibration, against
// runs on this machine, against DeepSpeed's published figures; fit checks; bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/advisor/advice.h"
#include "common/advisor/hardware.h"
#include "common/advisor/job_profile.h"
#include "common/advisor/model_memory.h"
#include "common/advisor/step_model.h"
#include "common/pricing.h"
#include "tests/support/error_of.h"
#include "tests/support/shell.h"

namespace zenflow::advisor {
namespace {

namespace fs = std::filesystem;
using test_support::read_file;
using test_support::run;
using test_support::write_file;

const std::string kZenflow = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";

// A model whose optimizer state is large next to its compute (3.7M parameters, 16 tokens
// a step), so that the modes differ by more than this shared machine's noise.
std::string job_yaml(const fs::path& dir) {
  return "name: advise-cpu\n"
         "model: {arch: llama, config: {hidden_size: 384, num_hidden_layers: 2, num_attention_heads: 4,\n"
         "        intermediate_size: 1024, max_position_embeddings: 64}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: 25, micro_batch: 1, seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu,\n"
         "        compute_threads: 1}\n"
         "optimizer: {mode: zenflow, zenflow: {topk_ratio: 0.1, update_interval: 4, full_warm_up_rounds: "
         "1}}\n"
         "checkpoint: {dir: " +
         dir.string() + ", every_steps: 0}\n";
}

// One configuration of this machine: `run_sets` for zenflow run, `model_sets` for the model.
struct Config {
  std::string name;
  std::vector<std::string> run_sets;
  std::vector<std::string> model_sets;
};

fs::path scratch() {
  const fs::path d = fs::temp_directory_path() / ("zenflow-advise-test-" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

JobProfile profile_run(const fs::path& base, const Config& c, int round) {
  const fs::path dir = base / (c.name + "-" + std::to_string(round));
  const fs::path spec = base / "job.yaml";
  if (!fs::exists(spec)) write_file(spec, job_yaml(base / "runs"));
  std::string cmd =
      kZenflow + " run " + spec.string() + " --fresh --quiet --profile --set checkpoint.dir=" + dir.string();
  for (const std::string& s : c.run_sets) cmd += " --set " + s;
  std::string out;
  const int rc = run(cmd + " 2>&1", &out);
  EXPECT_EQ(rc, 0) << cmd << "\n" << out;
  return JobProfile::load((dir / "profile.yaml").string());
}

Scenario scenario_for(const JobProfile& calib, const Config& c) {
  Scenario s = scenario_of(calib);
  for (const std::string& kv : c.model_sets) apply_setting(s, kv);
  return s;
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t i = static_cast<size_t>(pos);
  return i + 1 < v.size() ? v[i] + (pos - static_cast<double>(i)) * (v[i + 1] - v[i]) : v.back();
}

// Calibrated on one configuration (zenflow, U=4, micro-batch 1, the host optimizer on its
// own core), predicted on nine others, each run here: median |error| <= 15%, P90 <= 30%,
// and the modes in the predicted order.
//
// Paired by round, so that load drifting over the minutes the test takes on this shared
// 2-core machine cancels instead of biasing: a round runs the calibration, the nine
// configurations with the calibration again in their middle, and the calibration a third
// time; each prediction of the round is made from the round's median calibration run and
// scored against the same round's run of its configuration. A configuration's error is the
// median over the rounds. A round whose calibration runs differ by more than kDisturbed
// (slowest / fastest) was disturbed from outside (the load changed within it) and is run
// again, up to kMaxRounds.
//
// The median, not the fastest: a slowdown that lasts most of a round slows most of its
// configurations, and the one calibration run it missed would make all of them look slower
// than predicted (two CI runs failed so, median |error| 17%, with first and last calibration
// runs within 20% of each other).
TEST(AdvisorLocal, PredictsOtherConfigurationsOfThisMachine) {
  const fs::path base = scratch();
  const std::vector<Config> configs = {
      {"zenflow-u4", {}, {}},
      {"zenflow-u2", {"optimizer.zenflow.update_interval=2"}, {"update_interval=2"}},
      {"zenflow-u8", {"optimizer.zenflow.update_interval=8", "train.steps=49"}, {"update_interval=8"}},
      {"zenflow-b2", {"train.micro_batch=2"}, {"micro_batch=2"}},
      {"zenflow-2host",
       {"optimizer.host.reserved_cores=[0,1]"},
       {"host_threads=2", "host_shares_compute_cores=true"}},
      {"offload", {"optimizer.mode=offload"}, {"mode=offload"}},
      {"offload-b2", {"optimizer.mode=offload", "train.micro_batch=2"}, {"mode=offload", "micro_batch=2"}},
      {"offload-2host",
       {"optimizer.mode=offload", "optimizer.host.reserved_cores=[0,1]"},
       {"mode=offload", "host_threads=2", "host_shares_compute_cores=true"}},
      {"device", {"optimizer.mode=device"}, {"mode=device"}},
      {"device-b2", {"optimizer.mode=device", "train.micro_batch=2"}, {"mode=device", "micro_batch=2"}},
  };
  constexpr int kRounds = 5, kMaxRounds = 9;
  constexpr double kDisturbed = 0.20;
  struct Round {
    JobProfile calib;
    double calib_spread = 0;           // slowest / fastest calibration run - 1
    std::vector<double> predicted;     // per config (index 0: the calibration itself)
    std::vector<double> measured;
  };
  std::vector<Round> kept;
  int runs = 0, disturbed = 0;
  for (int round = 0; round < kMaxRounds && static_cast<int>(kept.size()) < kRounds; ++round) {
    Round r;
    std::vector<JobProfile> calibs = {profile_run(base, configs[0], runs++)};
    std::vector<JobProfile> measured(configs.size());
    for (size_t i = 1; i < configs.size(); ++i) {
      measured[i] = profile_run(base, configs[i], runs++);
      if (i == configs.size() / 2) calibs.push_back(profile_run(base, configs[0], runs++));
    }
    calibs.push_back(profile_run(base, configs[0], runs++));
    std::vector<JobProfile> by_speed = calibs;
    std::sort(by_speed.begin(), by_speed.end(), [](const JobProfile& a, const JobProfile& b) {
      return a.step.step_seconds < b.step.step_seconds;
    });
    r.calib = by_speed[by_speed.size() / 2];
    measured[0] = r.calib;
    r.calib_spread = by_speed.back().step.step_seconds / by_speed.front().step.step_seconds - 1;
    const Instance local = local_instance(r.calib, nullptr);
    for (size_t i = 0; i < configs.size(); ++i) {
      r.predicted.push_back(predict(r.calib, local, scenario_for(r.calib, configs[i]), r.calib.run.steps).step_seconds);
      r.measured.push_back(measured[i].step.step_seconds);
    }
    std::printf("round %d: calibration runs %.2f / %.2f / %.2f ms (spread %.0f%%)%s\n", round + 1,
                calibs[0].step.step_seconds * 1e3, calibs[1].step.step_seconds * 1e3,
                calibs[2].step.step_seconds * 1e3, 100 * r.calib_spread,
                r.calib_spread > kDisturbed ? ": disturbed, run again" : "");
    if (r.calib_spread > kDisturbed) {
      ++disturbed;
      continue;
    }
    kept.push_back(std::move(r));
  }
  if (static_cast<int>(kept.size()) < kRounds) {
    // The machine, not the model: within most rounds the load changed between the two
    // calibration runs, so a round's runs are not comparable with each other.
    std::error_code ec;
    fs::remove_all(base, ec);
    GTEST_SKIP() << "too noisy to measure: " << disturbed << " of " << disturbed + kept.size()
                 << " rounds had calibration runs more than " << 100 * kDisturbed << "% apart";
  }
  auto median = [](std::vector<double> v) { return percentile(std::move(v), 0.5); };
  // Its own configuration: within 2% (the calibration reproduces its input), every round.
  for (const Round& r : kept) EXPECT_NEAR(r.predicted[0], r.measured[0], 0.02 * r.measured[0]);

  std::vector<double> errors;
  // Base configs: predicted (median over rounds), measured (the fastest run: a disturbed run
  // is only ever slower, and a mode's runs are spread over the rounds, so its median can
  // still be a disturbed one; the calibration check above sees only the three calibration runs
  // of each round).
  std::map<std::string, std::pair<double, double>> by_mode;
  std::printf("\n%-15s %10s %10s %8s %8s   %s\n", "config", "predicted", "measured", "error", "spread",
              "(ms per step, medians over the rounds; error: median of the rounds' errors; spread: of "
              "the measured runs, slowest / fastest - 1)");
  for (size_t i = 0; i < configs.size(); ++i) {
    std::vector<double> pred, meas, err;
    for (const Round& r : kept) {
      pred.push_back(r.predicted[i]);
      meas.push_back(r.measured[i]);
      err.push_back((r.predicted[i] - r.measured[i]) / r.measured[i]);
    }
    const double e = median(err);
    const double spread = *std::max_element(meas.begin(), meas.end()) / *std::min_element(meas.begin(), meas.end()) - 1;
    std::printf("%-15s %10.2f %10.2f %+7.1f%% %7.0f%%%s\n", configs[i].name.c_str(), median(pred) * 1e3,
                median(meas) * 1e3, 100 * e, 100 * spread, i == 0 ? "   (calibration)" : "");
    if (i > 0) errors.push_back(std::fabs(e));
    if (configs[i].name == "zenflow-u4" || configs[i].name == "offload" || configs[i].name == "device")
      by_mode[configs[i].name == "zenflow-u4" ? "zenflow" : configs[i].name] = {
          median(pred), *std::min_element(meas.begin(), meas.end())};
  }
  const double med = percentile(errors, 0.5), p90 = percentile(errors, 0.9);
  std::printf("held-out configurations: %zu, median |error| %.1f%%, P90 %.1f%%; %zu rounds kept, %d disturbed\n",
              errors.size(), 100 * med, 100 * p90, kept.size(), disturbed);
  EXPECT_LE(med, 0.15);
  EXPECT_LE(p90, 0.30);
  std::vector<std::string> predicted_order = {"device", "offload", "zenflow"},
                           measured_order = predicted_order;
  std::sort(predicted_order.begin(), predicted_order.end(),
            [&](const std::string& a, const std::string& b) { return by_mode[a].first < by_mode[b].first; });
  std::sort(measured_order.begin(), measured_order.end(), [&](const std::string& a, const std::string& b) {
    return by_mode[a].second < by_mode[b].second;
  });
  std::printf("modes, fastest first: predicted %s < %s < %s, measured (fastest runs) %s < %s < %s\n",
              predicted_order[0].c_str(), predicted_order[1].c_str(), predicted_order[2].c_str(),
              measured_order[0].c_str(), measured_order[1].c_str(), measured_order[2].c_str());
  // Every pair of modes that differs by more than the noise floor (10%, docs/benchmarks.md §5)
  // both as measured and as predicted is predicted in the measured order; a pair closer than
  // that on either side is a tie (on this machine's tiny model offload and zenflow are within
  // a few percent of each other).
  for (const auto& [a, ta] : by_mode)
    for (const auto& [b, tb] : by_mode) {
      if (a >= b || std::fabs(ta.second - tb.second) <= 0.10 * std::min(ta.second, tb.second) ||
          std::fabs(ta.first - tb.first) <= 0.10 * std::min(ta.first, tb.first))
        continue;
      EXPECT_EQ(ta.first < tb.first, ta.second < tb.second)
          << a << " vs " << b << ": predicted " << ta.first << " / " << tb.first << ", measured " << ta.second
          << " / " << tb.second;
    }
  std::error_code ec;
  fs::remove_all(base, ec);
}

// The host AdamW step as it ran in training (StepProfile::host_step_seconds) calibrates the
// probes for the modes whose host step runs as the profile's did: from a zenflow profile,
// zenflow's host step with the host on the compute cores (exposed: no overlap) scales with
// it, offload's (run while the device waits, as the probe runs) keeps the probe's rate, the
// calibration point still reproduces itself, and a profile without it (an older one) falls
// back to the probe. The key round-trips through the YAML and may be absent.
TEST(AdvisorModel, HostStepInTrainingCalibratesTheProbesOfItsRegime) {
  const fs::path base = scratch();
  const JobProfile p = profile_run(base, {"calib", {"train.steps=13"}, {}}, 0);
  ASSERT_GT(p.step.host_step_seconds, 0) << "a zenflow run records its host steps";
  EXPECT_EQ(JobProfile::parse(p.to_yaml(), "p.yaml").step.host_step_seconds, p.step.host_step_seconds);
  const Instance local = local_instance(p, nullptr);
  Scenario offload = scenario_of(p);
  offload.mode = "offload";
  auto host_stall = [&](const JobProfile& q) {
    return predict(q, local, offload, 10).stall_seconds.at("host_optimizer");
  };
  JobProfile slow = p, older = p;
  slow.step.host_step_seconds = 2 * p.step.host_step_seconds;
  older.step.host_step_seconds = -1;
  Scenario shared = scenario_of(p);
  shared.host_shares_compute_cores = true;  // no overlap: the window's host step is exposed
  auto zenflow_host = [&](const JobProfile& q) {
    return predict(q, local, shared, 10).stall_seconds.at("host_optimizer");
  };
  ASSERT_GT(zenflow_host(p), 0);
  EXPECT_NEAR(zenflow_host(slow), 2 * zenflow_host(p), 1e-9 * zenflow_host(p));
  EXPECT_NEAR(host_stall(slow), host_stall(p), 1e-9 * host_stall(p));
  // Without it: the probe's rate at the job's host cores over the host-owned elements.
  const double probe = older.probes.host_adam_elements_per_second.at(std::max<int64_t>(1, p.run.host_threads));
  EXPECT_NEAR(host_stall(older), static_cast<double>(p.model.split_parameters) / probe,
              0.01 * host_stall(older));
  for (const JobProfile& q : {p, slow, older}) {
    const Prediction self = predict(q, local, scenario_of(q), q.run.steps);
    EXPECT_NEAR(self.step_seconds, q.step.step_seconds, 0.02 * q.step.step_seconds);
  }
  std::string yaml = p.to_yaml();
  const size_t at = yaml.find("  host_step_seconds:");
  ASSERT_NE(at, std::string::npos);
  yaml.erase(at, yaml.find('\n', at) + 1 - at);
  EXPECT_EQ(JobProfile::parse(yaml, "p.yaml").step.host_step_seconds, -1);
  std::error_code ec;
  fs::remove_all(base, ec);
}

// A micro-batch's tokens speed the GEMMs up as far as the profile's second GEMM probe (twice
// the tokens) says: compute for micro-batch 2 is fg x 2 / growth + (1 - fg), with the growth
// 2^a, a = log2(rate at twice the tokens / rate at the job's), clamped to [0, 1]. A profile
// without that probe (older ones) keeps the rate fixed. On this machine's 384 x 2 llama the
// rate grew 1.5x from 16 to 32 tokens, and the fixed rate overpredicted micro-batch 2 by 19-34%.
TEST(AdvisorModel, GemmRateGrowsWithAMicroBatchsTokensAsProbed) {
  const fs::path base = scratch();
  const JobProfile p = profile_run(base, {"calib", {"train.steps=13", "optimizer.mode=device"}, {}}, 0);
  ASSERT_GT(p.probes.gemm_gflops_twice_the_tokens, 0) << "the profiler probes the GEMM at twice the tokens";
  EXPECT_EQ(JobProfile::parse(p.to_yaml(), "p.yaml").probes.gemm_gflops_twice_the_tokens,
            p.probes.gemm_gflops_twice_the_tokens);
  const Instance local = local_instance(p, nullptr);
  const double fg = p.step.gemm_share;
  ASSERT_GT(fg, 0.1);
  ASSERT_EQ(p.probes.gemm_gflops.count(p.run.compute_threads), 1u);
  const double g1 = p.probes.gemm_gflops.at(p.run.compute_threads);
  Scenario b2 = scenario_of(p);
  b2.micro_batch = 2 * p.run.micro_batch;
  auto compute = [&](double twice, const Scenario& s) {
    JobProfile q = p;
    q.probes.gemm_gflops_twice_the_tokens = twice;
    return predict(q, local, s, 10).compute_seconds;
  };
  const double c = p.step.compute_seconds;
  for (const auto& [twice, growth] :
       std::vector<std::pair<double, double>>{{std::sqrt(2.0) * g1, std::sqrt(2.0)},  // a = 0.5
                                              {g1 * 1.5, 1.5},                        // a = log2(1.5)
                                              {4 * g1, 2.0},    // a = 2 -> 1: the time does not grow
                                              {0.5 * g1, 1.0},  // slower with more tokens -> a = 0
                                              {0.0, 1.0}}) {    // not probed: a fixed rate
    EXPECT_NEAR(compute(twice, scenario_of(p)), c, 1e-9 * c) << twice;
    EXPECT_NEAR(compute(twice, b2), c * (fg * 2 / growth + (1 - fg)), 1e-9 * c) << twice;
  }
  std::string yaml = p.to_yaml();
  const size_t at = yaml.find("  gemm_gflops_twice_the_tokens:");
  ASSERT_NE(at, std::string::npos);
  const size_t end = yaml.find('\n', at) + 1;
  std::string negative = yaml;
  negative.replace(at, end - at, "  gemm_gflops_twice_the_tokens: -3\n");
  yaml.erase(at, end - at);
  EXPECT_EQ(JobProfile::parse(yaml, "p.yaml").probes.gemm_gflops_twice_the_tokens, 0);
  try {
    JobProfile::parse(negative, "p.yaml");
    ADD_FAILURE() << "a negative GEMM rate was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("gemm_gflops_twice_the_tokens"), std::string::npos) << e.what();
  }
  std::error_code ec;
  fs::remove_all(base, ec);
}

// A profile from DeepSpeed's published Qwen2.5-1.5B figures (docs/benchmarks.md §2, §5) for its
// core-binding run on 2 x A100-40GB (2 x EPYC 7742): no offload measured at 240 ms.
JobProfile qwen_profile() {
  JobProfile p;
  p.job = "qwen2.5-1.5b";
  p.measured_on = {"2x EPYC 7742, 128 cores, 2x A100-SXM4-40GB",
                   "AMD EPYC 7742",
                   128,
                   "NVIDIA A100-SXM4-40GB",
                   "cuda",
                   "2026-11-29",
                   "published"};
  p.model = {"qwen2", 1540000000, 1400000000, 28, 1536, 151936, 2};
  p.run.mode = "device";
  p.run.micro_batch = 8, p.run.seq_len = 512, p.run.world_size = 2, p.run.steps = 100;
  p.run.update_interval = 1, p.run.topk_ratio = 0;
  p.step.steps_measured = 10;
  p.step.tokens_per_step = 8 * 512 * 2;
  p.step.step_seconds = 0.240;
  p.step.compute_seconds = 0.240;  // the whole ZeRO-2 step: no split is published
  for (const std::string& c : kStallCauses) p.step.stall_seconds[c] = 0;
  p.step.gemm_share = 0.8;
  p.memory["device"] = {0, 16, 0, 12};
  p.memory["offload"] = {16, 4, 16, 0};
  p.memory["zenflow"] = {20, 5, 20, 0};
  return p;
}

InstancePrice two_a100_row() {
  InstancePrice r;
  r.name = "2xA100-EPYC7742";
  r.provider = "onprem";
  r.gpu_model = "A100-SXM4-40GB";
  r.gpu_count = 2;
  r.gpu_memory_gib = 40;
  r.vcpus = 128;  // 64 physical cores: 32 per rank
  r.ram_gib = 1024;
  r.pcie_gen = 4;  // 25 GB/s each way
  r.on_demand_usd_per_hour = 5.0;
  r.source = "DeepSpeed blogs/zenflow-corebinding (Qwen2.5-1.5B on 2x A100-40GB)";
  r.date = "2026-11-29";
  r.verified = true;
  MeasuredHost m;
  m.date = "2026-11-29";
  m.host = "2x EPYC 7742 (derived from ZeRO-Offload 1365 ms, docs/benchmarks.md §5)";
  m.host_adam_elements_per_second = {{32, 0.77e9}};  // per rank, all 32 of its cores
  m.mem_bw_gbps = 300;
  r.measured = m;
  return r;
}

TEST(AdvisorPublished, ReproducesDeepSpeedQwen15BCoreBinding) {
  const JobProfile p = qwen_profile();
  const Instance in = instance_from_catalog(two_a100_row(), "2026-12-01");
  Scenario s = scenario_of(p);
  s.ranks = 2;
  std::map<std::string, double> t;
  for (const char* mode : {"device", "offload", "zenflow"}) {
    Scenario m = s;
    m.mode = mode;
    if (m.mode == "zenflow")
      m.update_interval = 4, m.topk_ratio = 0.1;  // pt_reserved_cores_perc 0.5: half the cores
    const Prediction pr = predict(p, in, m, 100);
    t[mode] = pr.step_seconds;
    std::printf("  %s: compute %.0f, device optimizer %.0f, other %.0f ms; stalls", mode,
                pr.compute_seconds * 1e3, pr.device_optimizer_seconds * 1e3, pr.other_seconds * 1e3);
    for (const auto& [cause, sec] : pr.stall_seconds)
      if (sec > 0) std::printf(" %s %.0f", cause.c_str(), sec * 1e3);
    std::printf(" ms\n");
  }
  std::printf(
      "Qwen2.5-1.5B, 2xA100: device %.0f ms (published 240), offload %.0f ms (1365), zenflow %.0f ms (569)\n",
      t["device"] * 1e3, t["offload"] * 1e3, t["zenflow"] * 1e3);
  EXPECT_NEAR(t["device"], 0.240, 0.2 * 0.240);
  EXPECT_NEAR(t["offload"], 1.365, 0.2 * 1.365);
  EXPECT_NEAR(t["zenflow"], 0.569, 0.2 * 0.569);
  EXPECT_LT(t["device"], t["zenflow"]);
  EXPECT_LT(t["zenflow"], t["offload"]);
}

// A GPU profile predicts itself on its own GPU: the local instance (the profile's probes,
// measured at the job's shapes, far below the datasheet) and a catalog row of the same
// model both reproduce the measured step within 2%. The model once set the profile GPU's
// datasheet against the local instance's probe, and the H200 check's calibration came out
// +20%; here (probe 180 of the datasheet's 312 TFLOP/s) the compute came out 1.6x.
TEST(AdvisorModel, AGpuProfilePredictsItselfOnItsOwnGpu) {
  JobProfile p = qwen_profile();
  p.step.steps_measured = 10;
  p.probes.gemm_gflops = {{16, 180000}};  // job-shaped GEMM: 180 TFLOP/s
  p.probes.device_memory_gbps = 1300;
  p.probes.d2h_gbps = p.probes.h2d_gbps = 20;
  p.probes.device_adamw_elements_per_second = 4e10;
  p.probes.host_adam_elements_per_second = {{16, 0.5e9}};
  InstancePrice one_a100 = two_a100_row();
  one_a100.gpu_count = 1;
  for (const Instance& in : {local_instance(p, nullptr), instance_from_catalog(one_a100, "2026-12-01")}) {
    const Prediction self = predict(p, in, scenario_of(p), p.run.steps);
    EXPECT_NEAR(self.compute_seconds, p.step.compute_seconds, 0.02 * p.step.compute_seconds) << in.name;
    EXPECT_NEAR(self.step_seconds, p.step.step_seconds, 0.02 * p.step.step_seconds) << in.name;
  }
  // Another model is still scaled by the two datasheets: an H100's 989 against 312 TFLOP/s.
  InstancePrice h100 = one_a100;
  h100.gpu_model = "H100-SXM";
  const Prediction faster =
      predict(p, instance_from_catalog(h100, "2026-12-01"), scenario_of(p), p.run.steps);
  EXPECT_LT(faster.compute_seconds, 0.5 * p.step.compute_seconds);
}

PricingCatalog shipped_catalog() {
  return PricingCatalog::load(std::string(ZENFLOW_SOURCE_DIR) + "/deploy/pricing.yaml");
}

// A 70B job on every catalog instance: never recommended where host RAM cannot hold its
// offloaded state; device mode never offered (fits) where the model does not fit the GPUs.
TEST(AdvisorFits, SeventyBillionNeedsHostRamAndDeviceModeNeedsGpuMemory) {
  JobProfile p = qwen_profile();
  const PricingCatalog cat = shipped_catalog();
  for (const double params : {7e9, 70e9}) {
    std::vector<Prediction> preds;
    for (const InstancePrice& row : cat.instances()) {
      if (row.gpu_count == 0) continue;
      const Instance in = instance_from_catalog(row, "2026-12-01");
      for (const char* mode : {"device", "offload", "zenflow"}) {
        Scenario s = scenario_of(p);
        s.mode = mode, s.parameters = params, s.ranks = 0, s.update_interval = 4, s.topk_ratio = 0.1;
        const Prediction pr = predict(p, in, s, 1000);
        const double host_state_gib = p.memory.at(mode).host_bytes_per_parameter * params / (1 << 30);
        if (std::string(mode) != "device" && host_state_gib > row.ram_gib.value_or(0)) {
          EXPECT_FALSE(pr.fits) << row.name;
        }
        const double device_gib = p.memory.at("device").device_per_rank(pr.ranks) * params / (1 << 30);
        if (std::string(mode) == "device" && device_gib > row.gpu_memory_gib.value_or(0)) {
          EXPECT_FALSE(pr.fits) << row.name;
        }
        preds.push_back(pr);
      }
    }
    const Advice a = rank(preds, 1000, std::nullopt, std::nullopt);
    // 7B has an answer; 70B's bf16 weights and gradients (4 B/parameter, not partitioned by
    // this engine) exceed every GPU of the catalog, so it may have none.
    if (params == 7e9) {
      ASSERT_GE(a.best, 0);
    }
    if (a.best >= 0) {
      const Prediction& best = a.predictions[a.best];
      EXPECT_TRUE(best.fits);
      EXPECT_LE(best.host_ram_gib, 0.9 * cat.find_instance(best.instance)->ram_gib.value_or(0));
    }
    for (int i : a.ranking) EXPECT_TRUE(a.predictions[i].fits);
    if (params == 70e9)
      for (const Prediction& pr : a.predictions)
        if (pr.mode == "device") {
          EXPECT_FALSE(pr.fits) << pr.instance << ": 70B with fp32 state on 8 GPUs";
        }
  }
}

// Two made-up instances whose GPUs hold 70B for offload (4 B/parameter) but not for device
// mode: the cheaper one lacks the host RAM for the offloaded state and must not win.
TEST(AdvisorFits, SeventyBillionGoesWhereTheHostRamIs) {
  const JobProfile p = qwen_profile();
  std::vector<Prediction> preds;
  for (const auto& [name, ram, price] : {std::make_tuple("big-gpu-small-ram", 512.0, 10.0),
                                         std::make_tuple("big-gpu-big-ram", 4096.0, 50.0)}) {
    InstancePrice r = two_a100_row();
    r.name = name, r.gpu_model = "H200-141GB", r.gpu_count = 8, r.gpu_memory_gib = 300, r.ram_gib = ram;
    r.vcpus = 192, r.on_demand_usd_per_hour = price, r.measured.reset();
    for (const char* mode : {"device", "offload", "zenflow"}) {
      Scenario s = scenario_of(p);
      s.mode = mode, s.parameters = 70e9, s.ranks = 0, s.update_interval = 4, s.topk_ratio = 0.1;
      preds.push_back(predict(p, instance_from_catalog(r, "2026-12-01"), s, 1000));
    }
  }
  for (const Prediction& pr : preds) {
    if (pr.mode == "device" || pr.instance == "big-gpu-small-ram") {
      EXPECT_FALSE(pr.fits) << pr.instance << " " << pr.mode;
    }
  }
  const Advice a = rank(preds, 1000, std::nullopt, std::nullopt);
  ASSERT_GE(a.best, 0);
  EXPECT_EQ(a.predictions[a.best].instance, "big-gpu-big-ram");
  EXPECT_NE(a.predictions[a.best].mode, "device");
}

using zenflow::test_support::error_of;

TEST(AdvisorInputs, RejectsAnotherVersionAMissingPriceSourceAndANegativePrice) {
  const std::string yaml = qwen_profile().to_yaml();
  EXPECT_NO_THROW(JobProfile::parse(yaml, "p.yaml"));
  std::string v2 = yaml;
  v2.replace(v2.find("zenflow_profile: 1"), 18, "zenflow_profile: 2");
  EXPECT_NE(error_of([&] { JobProfile::parse(v2, "p.yaml"); }).find("p.yaml: zenflow_profile: version 2"),
            std::string::npos);
  std::string neg = yaml;
  neg.replace(neg.find("data: 0"), 7, "data: -1");
  EXPECT_EQ(error_of([&] { JobProfile::parse(neg, "p.yaml"); }),
            "p.yaml: step.stall_seconds.data: must be >= 0, got -1");
  const std::string row =
      "instances:\n  - name: x\n    provider: aws\n    region: null\n    gpu_model: H100\n    gpu_count: 1\n"
      "    gpu_memory_gib: 80\n    vcpus: 16\n    ram_gib: 256\n    nic_gbps: null\n    pcie_gen: 5\n"
      "    on_demand_usd_per_hour: PRICE\n    spot_usd_per_hour: null\nSOURCE    date: 2026-11-29\n    "
      "verified: true\n"
      "    note: null\n";
  auto with = [&](const std::string& price, const std::string& source) {
    std::string r = row;
    r.replace(r.find("PRICE"), 5, price);
    r.replace(r.find("SOURCE"), 6, source);
    return r;
  };
  EXPECT_NO_THROW(PricingCatalog::parse(with("6.88", "    source: \"x\"\n"), "c.yaml"));
  EXPECT_EQ(error_of([&] { PricingCatalog::parse(with("6.88", ""), "c.yaml"); }),
            "c.yaml: instances[0].source: required");
  EXPECT_EQ(error_of([&] { PricingCatalog::parse(with("-1", "    source: \"x\"\n"), "c.yaml"); }),
            "c.yaml: instances[0].on_demand_usd_per_hour: must be >= 0, got -1");
  // A measured block that is not a number, with its key path.
  std::string bad = with("1", "    source: \"x\"\n") +
                    "    measured: {date: 2026-12-01, host: h, host_adam_elements_per_second: {2: fast}}\n";
  EXPECT_EQ(
      error_of([&] { PricingCatalog::parse(bad, "c.yaml"); }),
      "c.yaml: instances[0].measured.host_adam_elements_per_second.2: must be a finite number, got fast");
  Scenario s;
  EXPECT_EQ(error_of([&] { apply_setting(s, "topk_ratio=2"); }), "topk_ratio: must be in [0, 1], got 2");
  EXPECT_EQ(error_of([&] { apply_setting(s, "parameters=7Q"); }),
            "parameters: must be a count like 7e9 or 7B, got 7Q");
}

TEST(AdvisorInputs, FlagsOldPricesAndAssumedConstants) {
  InstancePrice r = two_a100_row();
  r.measured.reset();
  r.date = "2026-01-01";
  const Instance in = instance_from_catalog(r, "2026-12-01");
  ASSERT_FALSE(in.flags.empty());
  EXPECT_NE(in.flags[0].find("days old"), std::string::npos);
  Scenario s = scenario_of(qwen_profile());
  s.mode = "offload";
  const Prediction p = predict(qwen_profile(), in, s, 10);
  EXPECT_FALSE(p.assumed.empty());  // host memory bandwidth is not in the catalog
  const Advice a = rank({p}, 10, std::nullopt, std::nullopt);
  bool stale = false;
  for (const std::string& n : a.notes) stale |= n.find("days old") != std::string::npos;
  EXPECT_TRUE(stale);
}

// Meta's Llama-3-8B config.json (the keys that size it).
const char* kLlama3_8B = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
  "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192,
  "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": false,
  "torch_dtype": "bfloat16"})";
// Llama-2-70B's.
const char* kLlama2_70B = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
  "intermediate_size": 28672, "vocab_size": 32000, "max_position_embeddings": 4096,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": false})";

fs::path write_config(const fs::path& dir, const std::string& name, const std::string& json) {
  fs::create_directories(dir);
  const fs::path path = dir / name;
  write_file(path, json);
  return path;
}

// `zenflow advise` of qwen_profile() with a model config; its JSON, or its stderr when it fails.
int advise_cli(const fs::path& dir, const fs::path& config, const std::string& flags, nlohmann::json* out,
               std::string* text) {
  const fs::path profile = dir / "profile.yaml";
  write_file(profile, qwen_profile().to_yaml());
  const std::string cmd =
      kZenflow + " advise " + profile.string() + " --model-config " + config.string() + " " + flags + " 2>&1";
  const int rc = run(cmd, text);
  if (rc == 0 && out && flags.find("--json") != std::string::npos) *out = nlohmann::json::parse(*text);
  return rc;
}

TEST(AdvisorModelConfig, Llama3_8BHasItsExactShapes) {
  const fs::path dir = scratch();
  const ModelShape m = load_model_shape(write_config(dir, "config.json", kLlama3_8B).string());
  EXPECT_EQ(m.arch, "llama");
  EXPECT_NEAR(static_cast<double>(m.parameters), 8.03e9, 0.005 * 8.03e9);
  EXPECT_EQ(m.parameters, 8030261248);  // meta-llama/Meta-Llama-3-8B's safetensors
  EXPECT_EQ(m.attention_width(), 4096);
  // Every matrix is split (the 65 norm weights are not): embeddings, lm_head, 7 per layer.
  EXPECT_EQ(m.split_matrices.size(), 2u + 7u * 32u);
  EXPECT_EQ(m.split_parameters(), m.parameters - 65 * 4096);
  // Top 10% of columns: floor(409.6) of q/k/v/o/gate/up's 4096 inputs, 1433 of down's 14336.
  EXPECT_EQ(m.selected_parameters(0.1),
            2 * 128256 * 409 + 32 * ((4096 + 1024 + 1024 + 4096 + 14336 + 14336) * 409 + 4096 * 1433));
  // One layer's saved tensors per token (bf16): two RMSNorms 2 x 8 x 4096, q/k/v/out and
  // o_proj's input 5 x 2 x 4096, the logsumexp 4 x 32, SwiGLU 4 x 2 x 14336.
  EXPECT_EQ(m.layer_activation_bytes_per_token(2), 65536 + 40960 + 128 + 114688);
  EXPECT_EQ(m.head_activation_bytes_per_token(2), 8 * 4096 + 12 * 128256);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// GPT-2 (124M, tied embeddings) through the same path: its own layer's saved tensors (two
// LayerNorm inputs, c_attn's and c_fc's inputs, the fused qkv, SDPA's output and c_proj's
// input: 9 x 2 x 768; GELU's input and output 2 x 2 x 3072; LayerNorm statistics and the
// logsumexp).
TEST(AdvisorModelConfig, Gpt2HasItsOwnLayers) {
  const fs::path dir = scratch();
  const ModelShape m = load_model_shape(
      write_config(dir, "config.json", R"({"model_type": "gpt2", "vocab_size": 50257, "n_positions": 1024,
        "n_embd": 768, "n_layer": 12, "n_head": 12})")
          .string());
  EXPECT_EQ(m.arch, "gpt2");
  EXPECT_EQ(m.parameters, 124439808);
  EXPECT_EQ(m.layer_activation_bytes_per_token(2), 9 * 2 * 768 + 2 * 2 * 3072 + 16 + 4 * 12);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// A rank's memory by kind for Llama-3-8B on one GPU, zenflow at top-k 10%: bf16 weights and
// gradients, fp32 master + m + v of the selected columns and the norms, the engine's device
// staging of split gradients (two stages and the H2D buffer), activations with and without
// checkpointing. W = 8 partitions the H2D buffer and the host state, and adds the
// all-reduce buffer of the selected columns.
TEST(AdvisorModelConfig, RankMemoryFollowsTheEngineAndTheForward) {
  const fs::path dir = scratch();
  const ModelShape m = load_model_shape(write_config(dir, "config.json", kLlama3_8B).string());
  RankJob job;
  job.mode = "zenflow", job.micro_batch = 8, job.seq_len = 512, job.topk_ratio = 0.1;
  const double P = 8030261248.0, split = static_cast<double>(m.split_parameters());
  const double sel = static_cast<double>(m.selected_parameters(0.1));
  const RankMemory one = rank_memory(m, job);
  EXPECT_DOUBLE_EQ(one.weights, 2 * P);
  EXPECT_DOUBLE_EQ(one.gradients, 2 * P);
  EXPECT_DOUBLE_EQ(one.optimizer_state, 12 * (P - split + sel));
  EXPECT_DOUBLE_EQ(one.transfer_staging, 3 * 2 * split);
  EXPECT_DOUBLE_EQ(one.collective_buffers, 0);
  EXPECT_DOUBLE_EQ(one.host_optimizer, split * (20 + 8 + 4));
  const double tokens = 8 * 512;
  EXPECT_DOUBLE_EQ(one.activations, tokens * (32 * 221312.0 + 8 * 4096 + 12 * 128256));
  job.activation_checkpointing = true;
  const RankMemory ckpt = rank_memory(m, job);
  EXPECT_DOUBLE_EQ(ckpt.activations, tokens * (32 * 2 * 4096.0 + 221312 + 8 * 4096 + 12 * 128256));
  EXPECT_LT(ckpt.activations, 0.25 * one.activations);
  job.ranks = 8;
  const RankMemory eight = rank_memory(m, job);
  EXPECT_DOUBLE_EQ(eight.transfer_staging, 2 * 2 * split + 2 * std::ceil(split / 8));
  EXPECT_DOUBLE_EQ(eight.collective_buffers, 2 * (P - split + sel) + kNcclBufferBytes);
  EXPECT_DOUBLE_EQ(eight.host_optimizer, std::ceil(split / 8) * (20 + 8 + 4 + 2));
  job.ranks = 1, job.mode = "device";
  EXPECT_DOUBLE_EQ(rank_memory(m, job).optimizer_state, 12 * P);
  EXPECT_DOUBLE_EQ(rank_memory(m, job).transfer_staging, 0);
  job.mode = "offload";
  EXPECT_DOUBLE_EQ(rank_memory(m, job).optimizer_state, 0);
  // No windows: one device stage and the H2D buffer; master, m, v and one ring slot and
  // one output buffer (bf16) on the host.
  EXPECT_DOUBLE_EQ(rank_memory(m, job).transfer_staging, 2 * 2 * P);
  EXPECT_DOUBLE_EQ(rank_memory(m, job).host_optimizer, P * (12 + 2 + 2));
  // Zenflow with streamed weights: the selected columns and the unsplit parameters (weights,
  // gradients, AdamW state) stay, a ring of two slots of the largest unit whole and landed,
  // one unit's gradient; no staging; the host gets the parameter tensors and the step's
  // host gradient beside the engine's state and two output buffers.
  job.mode = "zenflow", job.offload_parameters = true;
  const RankMemory z = rank_memory(m, job);
  const double unit = 2.0 * static_cast<double>(m.largest_unit_parameters());
  EXPECT_DOUBLE_EQ(z.weights, 2 * (P - split + sel) + 4 * unit);
  EXPECT_DOUBLE_EQ(z.gradients, 2 * (P - split + sel) + 2 * unit);  // and the unit before's D2H in flight
  EXPECT_DOUBLE_EQ(z.optimizer_state, one.optimizer_state);
  EXPECT_DOUBLE_EQ(z.transfer_staging, 0);
  EXPECT_DOUBLE_EQ(z.host_optimizer, split * (20 + 8 + 4 + 2) + 2 * split);
  job.grad_accum = 4;  // the later micro-batches' unit gradients stage on the host: two slots of a unit
  EXPECT_DOUBLE_EQ(rank_memory(m, job).host_optimizer, z.host_optimizer + 2 * unit);
  job.grad_accum = 1;
  EXPECT_LT(z.device_total() - z.activations, 0.35 * (one.device_total() - one.activations));
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// `zenflow advise --json` of qwen_profile() for Llama-3-8B with `flags`.
nlohmann::json advise_llama3(const fs::path& dir, const std::string& flags) {
  nlohmann::json a;
  std::string text;
  EXPECT_EQ(advise_cli(dir, write_config(dir, "config.json", kLlama3_8B), flags + " --json", &a, &text), 0)
      << text;
  return a;
}

const nlohmann::json& row(const nlohmann::json& advice, const std::string& instance,
                          const std::string& mode) {
  for (const nlohmann::json& r : advice["predictions"])
    if (r["instance"] == instance && r["mode"] == mode) return r;
  throw std::runtime_error("no row " + instance + " " + mode);
}

// Llama-3-8B at 8192 tokens a sequence, the profile's global batch of 16 sequences: zenflow
// fits 8 x H200 (p5en.48xlarge) only with activation checkpointing (2 sequences per GPU in
// one micro-batch: 31 GiB of activations; without checkpointing a micro-batch of 1 keeps 66),
// and the advisor says it assumed it. One 80 GB GPU (p5.4xlarge) holds it only with chunked
// device staging (optimizer.host.device_staging_mib): whole staging of the split gradients
// (two stages of every split element and the H2D buffer, 44.9 GiB in bf16) next to the weights
// and gradients (15 GiB each) and the top-10% state (9 GiB) is 84 GiB before activations, and
// its host state (32 B per split element, 243 GiB) exceeds p5.4xlarge's usable RAM; chunked,
// the device stages through 1 GiB and the host keeps 24 B per split element (184 GiB).
// Llama-2-7B's.
const char* kLlama2_7B = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
  "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096,
  "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu", "tie_word_embeddings": false})";

// Llama-2-7B on one 24 GB GPU (an A10G row with the host RAM its optimizer state needs, in a
// catalog of the test's own): its bf16 weights and gradients alone are 25 GiB, so no mode
// holds it resident; offload mode with train.offload_parameters does (two layers' weights
// and gradients on the device), and the advisor recommends it, saying so. Fixed off, the
// same row does not fit and the GPU memory says why.
TEST(AdvisorModelConfig, Llama2_7BFitsOne24GBGpuOnlyWithItsWeightsStreamed) {
  const fs::path dir = scratch();
  write_file(dir / "catalog.yaml",
             "instances:\n"
             "  - {name: a10g-288g, provider: test, region: null, gpu_model: A10G-24GB, gpu_count: 1,\n"
             "     gpu_memory_gib: 24, vcpus: 64, ram_gib: 288, nic_gbps: null, pcie_gen: 4,\n"
             "     on_demand_usd_per_hour: 4.0, spot_usd_per_hour: null, source: test, date: 2026-12-07,\n"
             "     verified: false, note: test row}\n");
  const fs::path config = write_config(dir, "config.json", kLlama2_7B);
  const std::string flags = "--catalog " + (dir / "catalog.yaml").string() +
                            " --instance a10g-288g --set seq_len=2048 --set micro_batch=1 --set grad_accum=4";
  nlohmann::json a;
  std::string text;
  ASSERT_EQ(advise_cli(dir, config, flags + " --json", &a, &text), 0) << text;
  const nlohmann::json& off = row(a, "a10g-288g", "offload");
  ASSERT_TRUE(off["fits"].get<bool>()) << off["why_not"];
  EXPECT_TRUE(off["offload_parameters"].get<bool>());
  EXPECT_TRUE(off["activation_checkpointing"].get<bool>());
  const double P = 6738415616.0, unit = std::floor((P - 32000.0 * 4096) / 32);  // ModelShape::largest_unit_parameters
  EXPECT_DOUBLE_EQ(off["gpu_memory_parts_gib"]["weights"].get<double>(), 2 * unit * 2 / (1 << 30));
  EXPECT_DOUBLE_EQ(off["gpu_memory_parts_gib"]["gradients"].get<double>(), 2 * unit * 2 / (1 << 30));
  EXPECT_DOUBLE_EQ(off["gpu_memory_parts_gib"]["optimizer_state"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(off["gpu_memory_parts_gib"]["transfer_staging"].get<double>(), 0);
  // Each micro-batch streams the weights twice: what the compute does not hide of 4 x 2 x 13.5 GB
  // over the row's H2D bandwidth (here it hides all of it; at 256 tokens, not).
  const auto streamed_stall = [&](const nlohmann::json& r) {
    return std::max(0.0, r["grad_accum"].get<double>() * 2 * P * 2 /
                                 (r["inputs"]["h2d_gbps"]["value"].get<double>() * 1e9) -
                             r["compute_seconds"].get<double>());
  };
  EXPECT_NEAR(off["stall_seconds"]["weight_stream"].get<double>(), streamed_stall(off), 1e-9);
  EXPECT_DOUBLE_EQ(off["stall_seconds"]["transfer_h2d"].get<double>(), 0);  // the host step's result stays there
  nlohmann::json short_seqs;
  ASSERT_EQ(advise_cli(dir, config,
                       "--catalog " + (dir / "catalog.yaml").string() +
                           " --instance a10g-288g --set seq_len=256 --set micro_batch=1 --set grad_accum=1 --json",
                       &short_seqs, &text),
            0)
      << text.substr(0, 2000);
  const nlohmann::json& short_off = row(short_seqs, "a10g-288g", "offload");
  ASSERT_TRUE(short_off["offload_parameters"].get<bool>());
  EXPECT_GT(short_off["stall_seconds"]["weight_stream"].get<double>(), 0);
  EXPECT_NEAR(short_off["stall_seconds"]["weight_stream"].get<double>(), streamed_stall(short_off), 1e-9);
  // Offload mode's host state (16 bytes per parameter, no windows) and the streamed weights
  // and gradients fit 90% of 288 GiB with whole staging, which the engine (on the CPU device
  // here) keeps in host memory.
  EXPECT_EQ(off["device_staging_mib"], 0);
  EXPECT_LT(off["host_ram_gib"].get<double>(), 0.9 * 288);
  EXPECT_FALSE(row(a, "a10g-288g", "device")["fits"].get<bool>());
  // Zenflow fits too, streaming only the unselected columns (2 x 0.9 of the split matrices per
  // micro-batch) and keeping the selected tenth with its AdamW state on the GPU; its host
  // step runs once a window instead of every step, so it is the recommendation.
  const nlohmann::json& zen = row(a, "a10g-288g", "zenflow");
  ASSERT_TRUE(zen["fits"].get<bool>()) << zen["why_not"];
  EXPECT_TRUE(zen["offload_parameters"].get<bool>());
  EXPECT_EQ(zen["device_staging_mib"], 0);  // the spec refuses chunked staging with it
  EXPECT_LT(zen["gpu_memory_gib"].get<double>(), 0.9 * 24);
  EXPECT_GT(zen["gpu_memory_gib"].get<double>(), off["gpu_memory_gib"].get<double>());  // the resident tenth
  EXPECT_DOUBLE_EQ(zen["stall_seconds"]["transfer_h2d"].get<double>(), 0);
  EXPECT_EQ(a["recommendation"]["instance"], "a10g-288g");
  EXPECT_EQ(a["recommendation"]["mode"], "zenflow");
  bool note = false;
  for (const nlohmann::json& n : a["notes"])
    note |= n.get<std::string>().find("streamed: train.offload_parameters: true") != std::string::npos;
  EXPECT_TRUE(note) << a["notes"];

  nlohmann::json resident;
  ASSERT_EQ(advise_cli(dir, config, flags + " --set offload_parameters=false --json", &resident, &text), 0)
      << text.substr(0, 2000);
  const nlohmann::json& r = row(resident, "a10g-288g", "offload");
  EXPECT_FALSE(r["fits"].get<bool>());
  EXPECT_FALSE(r["offload_parameters"].get<bool>());
  EXPECT_NE(r["why_not"][0].get<std::string>().find("GPU memory"), std::string::npos) << r["why_not"];
  EXPECT_FALSE(row(resident, "a10g-288g", "zenflow")["fits"].get<bool>());
  std::printf("[figure] Llama-2-7B, 4 x 2048 tokens a step on one A10G: offload streamed %.1f GiB of GPU memory, "
              "%.2f s/step (weight_stream %.2f s); zenflow streamed %.1f GiB, %.2f s/step (weight_stream %.2f s); "
              "resident offload %.1f GiB\n",
              off["gpu_memory_gib"].get<double>(), off["step_seconds"].get<double>(),
              off["stall_seconds"]["weight_stream"].get<double>(), zen["gpu_memory_gib"].get<double>(),
              zen["step_seconds"].get<double>(), zen["stall_seconds"]["weight_stream"].get<double>(),
              r["gpu_memory_gib"].get<double>());
}

TEST(AdvisorModelConfig, Llama3_8BFitsZenflowWithActivationCheckpointing) {
  const fs::path dir = scratch();
  nlohmann::json a = advise_llama3(dir, "--set seq_len=8192 --set shard=none");
  const nlohmann::json& h200 = row(a, "p5en.48xlarge", "zenflow");
  EXPECT_TRUE(h200["fits"].get<bool>()) << h200["why_not"];
  EXPECT_TRUE(h200["activation_checkpointing"].get<bool>());
  EXPECT_EQ(h200["ranks"], 8);
  EXPECT_EQ(h200["micro_batch"], 2);
  EXPECT_EQ(h200["grad_accum"], 1);
  EXPECT_NEAR(h200["gpu_memory_parts_gib"]["activations"].get<double>(),
              2 * 8192 * (32 * 2 * 4096.0 + 221312 + 8 * 4096 + 12 * 128256) / (1 << 30), 1e-9);
  EXPECT_EQ(h200["device_staging_mib"], 0);  // 8 unsharded ranks: whole staging, their only kind
  const nlohmann::json& h100 = row(a, "p5.4xlarge", "zenflow");
  EXPECT_TRUE(h100["fits"].get<bool>()) << h100["why_not"];
  EXPECT_EQ(h100["ranks"], 1);
  EXPECT_TRUE(h100["activation_checkpointing"].get<bool>());
  EXPECT_EQ(h100["device_staging_mib"], kChunkedStagingMib);
  EXPECT_DOUBLE_EQ(h100["gpu_memory_parts_gib"]["transfer_staging"].get<double>(), 1.0);
  const double split = 8030261248.0 - 65 * 4096;
  EXPECT_NEAR(h100["host_ram_gib"].get<double>(), split * 24 / (1 << 30) + 4, 1e-6);
  EXPECT_LT(h100["gpu_memory_gib"].get<double>(), 0.9 * 80);
  // The cheapest row that fits (per million tokens): since offload mode keeps no window state
  // (16 host bytes per element, not 36), an 8 x H100 row trains it in offload mode for less.
  const nlohmann::json& best = row(a, a["recommendation"]["instance"].get<std::string>(),
                                   a["recommendation"]["mode"].get<std::string>());
  EXPECT_TRUE(best["fits"].get<bool>());
  for (const nlohmann::json& r : a["predictions"])
    if (r["fits"].get<bool>() && !r["usd_per_1m_tokens"].is_null()) {
      EXPECT_GE(r["usd_per_1m_tokens"].get<double>(), best["usd_per_1m_tokens"].get<double>()) << r["instance"];
    }
  EXPECT_LT(best["usd_per_1m_tokens"].get<double>(), h100["usd_per_1m_tokens"].get<double>());
  bool staging_note = false;
  for (const nlohmann::json& n : a["notes"])
    staging_note |= n.get<std::string>().find("staging 1024 MiB: optimizer.host.device_staging_mib: 1024") !=
                    std::string::npos;
  EXPECT_TRUE(staging_note) << a["notes"];
  // Whole staging on one GPU: the staging and the host RAM say why not.
  const nlohmann::json whole = advise_llama3(
      dir, "--set seq_len=8192 --set shard=none --set device_staging_mib=0 --set offload_parameters=false");
  const nlohmann::json& h100_whole = row(whole, "p5.4xlarge", "zenflow");
  EXPECT_FALSE(h100_whole["fits"].get<bool>());
  EXPECT_NEAR(h100_whole["gpu_memory_parts_gib"]["transfer_staging"].get<double>(), 44.9, 0.05);
  EXPECT_NE(h100_whole["why_not"][0].get<std::string>().find("transfer staging 44.9"), std::string::npos)
      << h100_whole["why_not"];
  EXPECT_NE(h100_whole["why_not"][1].get<std::string>().find("host RAM"), std::string::npos)
      << h100_whole["why_not"];
  for (const nlohmann::json& r : whole["predictions"])
    if (r["ranks"] == 1) {
      EXPECT_FALSE(r["fits"].get<bool>()) << r["instance"] << " " << r["mode"];
    }
  // The table says it too: a ckpt column and the note on what checkpointing costs.
  std::string text;
  ASSERT_EQ(advise_cli(dir, dir / "config.json", "--set seq_len=8192 --set shard=none", nullptr, &text), 0) << text;
  EXPECT_NE(text.find("ckpt"), std::string::npos) << text;
  EXPECT_NE(text.find("note: ckpt yes: activation checkpointing assumed"), std::string::npos) << text;
  // Fixed off by --set, the same row no longer fits.
  a = advise_llama3(dir, "--set seq_len=8192 --set train.activation_checkpointing=false --set shard=none");
  EXPECT_FALSE(row(a, "p5en.48xlarge", "zenflow")["fits"].get<bool>());
  // Free to shard, an 8-GPU row keeps 1/8 of the gradients and optimizer state per GPU: zenflow
  // then fits 8 x H100 (p5.48xlarge) with its weights resident, where unsharded it fits only
  // with them streamed (ZenflowStreamsOnEightUnshardedGpusOffloadModeOnOne), more slowly.
  EXPECT_FALSE(row(advise_llama3(dir, "--set seq_len=8192 --set shard=none --set offload_parameters=false"),
                   "p5.48xlarge", "zenflow")["fits"]
                   .get<bool>());
  a = advise_llama3(dir, "--set seq_len=8192");
  const nlohmann::json& sharded = row(a, "p5.48xlarge", "zenflow");
  EXPECT_TRUE(sharded["fits"].get<bool>()) << sharded["why_not"];
  EXPECT_NE(sharded["shard"], "none");
  EXPECT_NEAR(sharded["gpu_memory_parts_gib"]["gradients"].get<double>(), 2 * 8030261248.0 / 8 / (1 << 30), 1e-6);
  EXPECT_FALSE(sharded["offload_parameters"].get<bool>());
  EXPECT_LT(sharded["step_seconds"].get<double>(),
            row(advise_llama3(dir, "--set seq_len=8192 --set shard=none"), "p5.48xlarge", "zenflow")["step_seconds"]
                .get<double>());
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// Zenflow mode streams its weights on several GPUs too: every rank streams every rank's
// unselected columns. Llama-3-8B at 8192 tokens a sequence on 8 x H100 (p5.48xlarge), unsharded:
// resident, the device staging of the split gradients beside the weights and gradients leaves
// no room; streamed it fits. Its figures: what each rank's host holds (its share of the state,
// every rank's columns' weights and gradients, the parameter tensors), no device staging, the
// host columns' gradients D2H every micro-batch, and the exchange's PCIe crossings (all of
// them up and this rank's down each step for the reduce-scatter, the reverse each window for
// the all-gather) booked as allreduce, as the engine books them. Offload mode is never
// streamed on several GPUs (the trainer refuses it); asked to, the row says why. Settings the
// job spec refuses together make a row that does not fit, naming them.
TEST(AdvisorModelConfig, ZenflowStreamsOnEightUnshardedGpusOffloadModeOnOne) {
  const fs::path dir = scratch();
  const std::string base = "--set seq_len=8192 --set shard=none --set update_interval=4";
  const nlohmann::json a = advise_llama3(dir, base);
  const nlohmann::json resident = advise_llama3(dir, base + " --set offload_parameters=false");
  const nlohmann::json& zen = row(a, "p5.48xlarge", "zenflow");
  const nlohmann::json& res = row(resident, "p5.48xlarge", "zenflow");
  ASSERT_TRUE(zen["fits"].get<bool>()) << zen["why_not"];
  EXPECT_TRUE(zen["offload_parameters"].get<bool>());
  EXPECT_EQ(zen["ranks"], 8);
  EXPECT_EQ(zen["shard"], "none");
  EXPECT_FALSE(res["fits"].get<bool>());
  EXPECT_NE(res["why_not"][0].get<std::string>().find("transfer staging"), std::string::npos) << res["why_not"];
  const ModelShape m = load_model_shape((dir / "config.json").string());
  const double P = 8030261248.0, gib = 1 << 30;
  const double split = static_cast<double>(m.split_parameters()), sel = static_cast<double>(m.selected_parameters(0.1));
  const double unit = 2.0 * static_cast<double>(m.largest_unit_parameters());
  const nlohmann::json& parts = zen["gpu_memory_parts_gib"];
  EXPECT_NEAR(parts["weights"].get<double>(), (2 * (P - split + sel) + 4 * unit) / gib, 1e-9);
  // The unit's gradient whole, and the unit before's host columns until their D2H lands.
  EXPECT_NEAR(parts["gradients"].get<double>(), (2 * (P - split + sel) + 2 * unit) / gib, 1e-9);
  EXPECT_DOUBLE_EQ(parts["transfer_staging"].get<double>(), 0);
  // A rank's host: its share of master, m, v, two accumulators, two ring slots, two last
  // gradients, two output buffers and its host gradient (34 B per element), the parameter
  // tensors, every rank's columns' step gradient and weights (2 B each per split element).
  EXPECT_NEAR(zen["host_ram_gib"].get<double>(), 8 * (std::ceil(split / 8) * 34 + 3 * 2 * split) / gib + 4, 1e-6);
  // One crossing of the unselected 90% of the split matrices, each way.
  const double d = 0.9 * split * 2 / (zen["inputs"]["d2h_gbps"]["value"].get<double>() * 1e9);
  const double h = 0.9 * split * 2 / (zen["inputs"]["h2d_gbps"]["value"].get<double>() * 1e9);
  const nlohmann::json& stall = zen["stall_seconds"];
  EXPECT_NEAR(stall["transfer_d2h"].get<double>(), d * zen["grad_accum"].get<double>(), 1e-12);
  EXPECT_DOUBLE_EQ(stall["transfer_h2d"].get<double>(), 0);
  // The collectives' own time (the ring's two passes over the bf16 gradients less half of
  // two thirds of the compute) and the crossings: U = 4, W = 8.
  const double coll = std::max(0.0, P * 2 * 2 * 7 / 8 / (zen["inputs"]["busbw_gbps"]["value"].get<double>() * 1e9) -
                                        0.5 * zen["compute_seconds"].get<double>() * 2 / 3);
  EXPECT_NEAR(stall["allreduce"].get<double>(), coll + h * (1 + 1.0 / 32) + d * (1.0 / 8 + 1.0 / 4), 1e-12);
  EXPECT_GT(stall["allreduce"].get<double>(), 0.25);
  // Offload mode: never streamed on 8 GPUs; on one, as before.
  for (const nlohmann::json& r : a["predictions"])
    if (r["mode"] == "offload" && r["ranks"] != 1) {
      EXPECT_FALSE(r["offload_parameters"].get<bool>()) << r["instance"];
    }
  const nlohmann::json asked = advise_llama3(dir, base + " --set mode=offload --set offload_parameters=true");
  const nlohmann::json& eight = row(asked, "p5.48xlarge", "offload");
  EXPECT_FALSE(eight["fits"].get<bool>());
  EXPECT_FALSE(eight["offload_parameters"].get<bool>());
  EXPECT_NE(eight["why_not"].dump().find("offload mode streams the weights on one GPU only, not 8"), std::string::npos)
      << eight["why_not"];
  EXPECT_TRUE(row(asked, "p5.4xlarge", "offload")["offload_parameters"].get<bool>());
  // Contradictions: every row says which, none is left blank.
  const nlohmann::json both = advise_llama3(dir, "--set shard=gradients --set offload_parameters=true");
  ASSERT_FALSE(both["predictions"].empty());
  for (const nlohmann::json& r : both["predictions"]) {
    ASSERT_FALSE(r["instance"].get<std::string>().empty());
    if (r["mode"] == "device") continue;  // device mode ignores offload_parameters
    EXPECT_FALSE(r["fits"].get<bool>()) << r["instance"];
    EXPECT_EQ(r["why_not"][0], "the job spec refuses it: train.offload_parameters does not combine with train.shard: "
                               "gradients")
        << r["instance"] << " " << r["mode"];
    EXPECT_TRUE(r["activation_checkpointing"].get<bool>()) << r["instance"];
  }
  const nlohmann::json staged =
      advise_llama3(dir, "--set mode=zenflow --set device_staging_mib=1024 --set shard=none --set offload_parameters=false");
  for (const nlohmann::json& r : staged["predictions"]) {
    ASSERT_FALSE(r["instance"].get<std::string>().empty());
    if (r["ranks"] == 1) {
      EXPECT_EQ(r["why_not"].dump().find("refuses"), std::string::npos) << r["why_not"];
      continue;
    }
    EXPECT_FALSE(r["fits"].get<bool>());
    EXPECT_EQ(r["why_not"][0], "the job spec refuses it: optimizer.host.device_staging_mib needs one rank or "
                               "train.shard (" + std::to_string(r["ranks"].get<int64_t>()) + " unsharded ranks)");
  }
  EXPECT_EQ(row(staged, "p5.4xlarge", "zenflow")["device_staging_mib"], 1024);
  std::printf("[figure] Llama-3-8B, 8192 tokens, on 8 x H100 unsharded: zenflow streamed %.1f GiB of GPU memory, "
              "%.2f s/step (allreduce %.2f s, transfer_d2h %.2f s, weight_stream %.2f s), host %.0f GiB; "
              "sharded resident %.2f s/step\n",
              zen["gpu_memory_gib"].get<double>(), zen["step_seconds"].get<double>(), stall["allreduce"].get<double>(),
              stall["transfer_d2h"].get<double>(), stall["weight_stream"].get<double>(),
              zen["host_ram_gib"].get<double>(),
              row(advise_llama3(dir, "--set seq_len=8192 --set update_interval=4"), "p5.48xlarge", "zenflow")["step_seconds"]
                  .get<double>());
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// Every row trains the profile's global batch (micro-batch 8 x 2 ranks = 16 sequences): the
// 8-GPU row 2 per GPU, the 1-GPU row 16 as accumulated micro-batches, the same tokens a step,
// so the job's $ compare. The output says so.
TEST(AdvisorModelConfig, EightGpusTrainTheGlobalBatchOfOne) {
  const fs::path dir = scratch();
  const nlohmann::json a = advise_llama3(dir, "");
  const nlohmann::json& eight = row(a, "p5.48xlarge", "zenflow");
  const nlohmann::json& one = row(a, "p5.4xlarge", "zenflow");
  EXPECT_EQ(eight["ranks"], 8);
  EXPECT_EQ(one["ranks"], 1);
  EXPECT_EQ(eight["micro_batch"].get<int64_t>() * eight["grad_accum"].get<int64_t>() * 8, 16);
  EXPECT_EQ(one["micro_batch"].get<int64_t>() * one["grad_accum"].get<int64_t>(), 16);
  EXPECT_EQ(eight["tokens_per_step"], 16 * 512);
  EXPECT_EQ(one["tokens_per_step"], 16 * 512);
  for (const nlohmann::json& r : a["predictions"]) {
    EXPECT_EQ(r["global_batch"], 16);
    EXPECT_EQ(r["tokens_per_step"], 16 * 512) << r["instance"];
  }
  bool said = false;
  for (const nlohmann::json& n : a["notes"])
    said |= n.get<std::string>().find("global batch held at 16 sequences") != std::string::npos;
  EXPECT_TRUE(said) << a["notes"];
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// Llama-2-70B's bf16 weights and gradients alone (257 GiB) exceed every GPU of the catalog:
// unsharded nothing fits. With train.shard: parameters an 8-GPU row keeps 1/8 of the weights,
// gradients and device optimizer state per GPU, and with chunked device staging
// (optimizer.host.device_staging_mib) zenflow fits 8 x H100 (p5.48xlarge, 2 TiB of RAM): the
// host state is 24 B per split element (1.5 TiB) and the device stages through 1 GiB; so does
// Azure's 8 x H100 (1900 GiB), not 8 x A100 (1152 GiB). With whole staging no zenflow row fits, and
// the advisor names why (offload mode aside, which fits 8 x H200): the host state (32 B per
// element, 2.0 TiB) exceeds the largest host's usable RAM, and the device staging of the split gradients (3 x 2 B per element of
// the rank's rows, 48 GiB) an 80 GB GPU.
TEST(AdvisorModelConfig, Llama2_70BFitsEightH100sShardedWithChunkedStaging) {
  const fs::path dir = scratch();
  nlohmann::json a;
  std::string text;
  const fs::path cfg = write_config(dir, "config.json", kLlama2_70B);
  ASSERT_EQ(advise_cli(dir, cfg, "--json --set shard=none", &a, &text), 0) << text;
  EXPECT_TRUE(a["best"].is_null());
  for (const nlohmann::json& r : a["predictions"]) {
    EXPECT_FALSE(r["fits"].get<bool>()) << r["instance"] << " " << r["mode"];
    if (r["offload_parameters"].get<bool>()) {  // a row's least GPU memory: streamed weights
      // Offload: one GPU only (the trainer refuses more), where the host RAM alone says no;
      // zenflow: its resident tenth (12 B of AdamW state and 4 of weight and gradient per
      // element) does not fit one 80 GB GPU either, and on 8 GPUs every rank's host keeps
      // every rank's columns' weights and gradients besides its share of the state.
      const std::string why = r["why_not"].dump();
      EXPECT_NE(why.find("host RAM"), std::string::npos) << why;
      if (r["mode"] == "offload") {
        EXPECT_EQ(r["ranks"], 1);
        EXPECT_NE(r["why_not"][0].get<std::string>().find("host RAM"), std::string::npos) << why;
      } else {
        EXPECT_EQ(r["mode"], "zenflow");
        if (r["ranks"] == 1) {
          EXPECT_NE(r["why_not"][0].get<std::string>().find("GPU memory"), std::string::npos) << why;
        }
      }
      continue;
    }
    EXPECT_NEAR(r["gpu_memory_parts_gib"]["weights"].get<double>(), 2 * 68976648192.0 / (1 << 30), 1e-6);
  }
  const double gib = 1 << 30;
  ASSERT_EQ(advise_cli(dir, cfg, "--json --set device_staging_mib=0", &a, &text), 0) << text;
  for (const nlohmann::json& r : a["predictions"]) {
    // Offload mode keeps no window state (16 host bytes per element): 8 x H200 (141 GB each,
    // 2 TiB of RAM) hold it sharded with whole staging; nothing else does.
    const bool h200_offload = r["mode"] == "offload" && r["ranks"] == 8 &&
                              (r["instance"] == "p5en.48xlarge" || r["instance"] == "ND96isr_H200_v5");
    EXPECT_EQ(r["fits"].get<bool>(), h200_offload) << r["instance"] << " " << r["mode"] << " " << r["why_not"];
    if (r["ranks"] != 8) continue;
    EXPECT_EQ(r["shard"], "parameters") << r["instance"];  // the least GPU memory of the settings
    EXPECT_NEAR(r["gpu_memory_parts_gib"]["weights"].get<double>(), 2 * 68976648192.0 / 8 / gib, 1e-6);
    EXPECT_NEAR(r["gpu_memory_parts_gib"]["gradients"].get<double>(), 2 * 68976648192.0 / 8 / gib, 1e-6);
  }
  const nlohmann::json& whole = row(a, "p5.48xlarge", "zenflow");
  EXPECT_NEAR(whole["gpu_memory_parts_gib"]["transfer_staging"].get<double>(), 3 * 2 * 68976648192.0 / 8 / gib,
              0.5);
  bool host_ram = false;
  for (const nlohmann::json& w : whole["why_not"])
    host_ram |= w.get<std::string>().find("host RAM") != std::string::npos;
  EXPECT_TRUE(host_ram) << whole["why_not"];

  ASSERT_EQ(advise_cli(dir, cfg, "--json", &a, &text), 0) << text;
  const nlohmann::json& zen = row(a, "p5.48xlarge", "zenflow");
  EXPECT_TRUE(zen["fits"].get<bool>()) << zen["why_not"];
  EXPECT_EQ(zen["ranks"], 8);
  EXPECT_EQ(zen["shard"], "parameters");
  EXPECT_TRUE(zen["activation_checkpointing"].get<bool>());
  EXPECT_EQ(zen["device_staging_mib"], kChunkedStagingMib);
  EXPECT_DOUBLE_EQ(zen["gpu_memory_parts_gib"]["transfer_staging"].get<double>(), 1.0);
  const double split = 68976648192.0 - (2 * 80 + 1) * 8192;  // every matrix; not the 161 norms
  EXPECT_NEAR(zen["host_ram_gib"].get<double>(), 8 * std::ceil(split / 8) * 24 / gib + 4, 1e-6);
  EXPECT_LT(zen["host_ram_gib"].get<double>(), 0.9 * 2048);
  EXPECT_LT(zen["gpu_memory_gib"].get<double>(), 0.9 * 80);
  EXPECT_FALSE(a["best"].is_null());
  EXPECT_TRUE(row(a, "ND96isr_H100_v5", "zenflow")["fits"].get<bool>());  // Azure's 8 x H100, 1900 GiB
  const nlohmann::json& a100 = row(a, "p4de.24xlarge", "zenflow");      // 8 x A100 80 GB, 1152 GiB
  EXPECT_FALSE(a100["fits"].get<bool>());
  bool a100_ram = false;
  for (const nlohmann::json& w : a100["why_not"])
    a100_ram |= w.get<std::string>().find("host RAM") != std::string::npos;
  EXPECT_TRUE(a100_ram) << a100["why_not"];
  ASSERT_EQ(advise_cli(dir, cfg, "", nullptr, &text), 0) << text;
  EXPECT_NE(text.find("params"), std::string::npos) << text;
  EXPECT_NE(text.find("staging 1024 MiB"), std::string::npos) << text;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// A bad config.json is bad input (exit 2) with the path and the key; so are the settings
// that contradict it.
TEST(AdvisorModelConfig, MalformedConfigNamesThePathAndTheKey) {
  const fs::path dir = scratch();
  std::string bad = kLlama3_8B;
  bad.replace(bad.find("\"hidden_size\": 4096"), 19, "\"hidden_size\": \"4k\"");
  const fs::path cfg = write_config(dir, "bad.json", bad);
  std::string text;
  EXPECT_EQ(advise_cli(dir, cfg, "", nullptr, &text), 2);
  EXPECT_NE(text.find(cfg.string() + ": key 'hidden_size' must be an integer, got \"4k\""), std::string::npos)
      << text;
  std::string missing = kLlama3_8B;
  missing.replace(missing.find("\"num_hidden_layers\": 32, "), 25, "");
  EXPECT_EQ(error_of([&] { load_model_shape(write_config(dir, "missing.json", missing).string()); }),
            (dir / "missing.json").string() + ": required key 'num_hidden_layers' is missing");
  EXPECT_EQ(error_of([&] { load_model_shape((dir / "absent.json").string()); }),
            (dir / "absent.json").string() + ": no such file or directory");
  EXPECT_EQ(advise_cli(dir, write_config(dir, "notjson.json", "{\"hidden_size\": "), "", nullptr, &text), 2);
  EXPECT_NE(text.find("notjson.json: not valid JSON"), std::string::npos) << text;
  EXPECT_EQ(advise_cli(dir, write_config(dir, "ok.json", kLlama3_8B), "--set parameters=7B", nullptr, &text),
            2);
  const fs::path profile = dir / "profile.yaml";
  EXPECT_EQ(
      run(kZenflow + " advise " + profile.string() + " --set activation_checkpointing=true 2>&1", &text), 2);
  EXPECT_NE(text.find("needs --model-config"), std::string::npos) << text;
  EXPECT_EQ(run(kZenflow + " advise " + profile.string() + " --set device_staging_mib=1024 2>&1", &text), 2);
  EXPECT_NE(text.find("--set device_staging_mib needs --model-config"), std::string::npos) << text;
  EXPECT_EQ(advise_cli(dir, dir / "ok.json", "--set device_staging_mib=-4", nullptr, &text), 2);
  EXPECT_NE(text.find("device_staging_mib: must be"), std::string::npos) << text;
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
}  // namespace zenflow::advisor
