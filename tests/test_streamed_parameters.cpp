// train.offload_parameters through `zenflow run` (engine/streamed_parameters.h): the weights
// stay in host memory and each unit's are copied into a two-slot device ring before its
// forward and again before its recomputing backward; the gradients go to the host unit by
// unit. On the CPU the copies are memcpys through the same path, so a run with it must
// equal the run without it bit for bit (activation checkpointing on in both), on 1 and 2
// ranks, with tied embeddings (a parameter two units use) and gradient accumulation; the
// bytes it moves and the device memory it holds are exact formulas of the model's shapes;
// checkpoints resume across the setting exactly; what it does not combine with is refused
// naming the keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/checkpoint_names.h"
#include "tests/support/ranks.h"
#include "tests/support/scratch.h"
#include "tests/support/zenflow_run.h"
#include "worker/model/safetensors.h"

namespace fs = std::filesystem;
using zenflow::test_support::run_json;

namespace {

struct Case {
  const char* name;
  int ranks;
  bool tied;
  int grad_accum;
  const char* grad_clip;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Two decoder layers (units: the embedding, two layers, the head), fp32 on the CPU. AdamW's
// eps is of the order of the gradients, so an update depends on their scale.
std::string spec_text(const fs::path& ckpt, bool offload_parameters, const Case& c, const std::string& mode = "offload") {
  return "name: streamed\n"
         "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4, "
         "intermediate_size: 64, max_position_embeddings: 32, tie_word_embeddings: " +
         std::string(c.tied ? "true" : "false") +
         "}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: 10, micro_batch: 2, grad_accum: " + std::to_string(c.grad_accum) +
         ", seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu, compute_threads: 1, grad_clip: " + c.grad_clip +
         ", activation_checkpointing: true, offload_parameters: " + (offload_parameters ? "true" : "false") +
         "}\n"
         "optimizer: {mode: " + mode + ", eps: 1.0e-3, host: {threads: 1}}\n"
         "checkpoint: {every_steps: 0, dir: " + ckpt.string() + "}\n";
}

fs::path step_dir(const fs::path& ckpt, int step) { return ckpt / zenflow::checkpoint_step_name(step); }

// Every tensor of the two safetensors files equal, bit for bit (at::equal: NaN != NaN).
void expect_files_equal(const fs::path& got_file, const fs::path& want_file, const std::string& what) {
  zenflow::model::SafetensorsFile got(got_file.string()), want(want_file.string());
  ASSERT_EQ(got.names(), want.names()) << what;
  for (const auto& name : want.names()) {
    const at::Tensor x = got.tensor(name), y = want.tensor(name);
    ASSERT_EQ(x.sizes(), y.sizes()) << what << ": " << name;
    EXPECT_TRUE(at::equal(x, y)) << what << ": " << name << " differs by " << (x - y).abs().max().item<double>();
  }
}

// Two engine states equal column for column: each matrix's host-owned columns may be stored in
// another order (a resumed engine stores them ascending, a running one where re-selections
// put them), so its host arrays are compared by column; everything else bit for bit.
void expect_engine_states_equal(const fs::path& got_file, const fs::path& want_file) {
  zenflow::model::SafetensorsFile got(got_file.string()), want(want_file.string());
  ASSERT_EQ(got.names(), want.names());
  auto by_column = [](zenflow::model::SafetensorsFile& f, const std::string& name) {
    const std::string matrix = name.substr(0, name.rfind('/') + 1);
    const at::Tensor order = std::get<1>(f.tensor(matrix + "host_cols").sort());
    return f.tensor(name).index_select(1, order);
  };
  for (const auto& name : want.names()) {
    const bool host_array = name.rfind("split/", 0) == 0 &&
                            (name.size() > 12 && (name.find("/host_master") != std::string::npos ||
                                                  name.find("/host_m") != std::string::npos ||
                                                  name.find("/host_v") != std::string::npos ||
                                                  name.substr(name.rfind('/')) == "/acc"));
    const bool order = name.substr(name.rfind('/')) == "/host_cols";
    const at::Tensor x = order ? std::get<0>(got.tensor(name).sort())
                         : host_array ? by_column(got, name)
                                      : got.tensor(name);
    const at::Tensor y = order ? std::get<0>(want.tensor(name).sort())
                         : host_array ? by_column(want, name)
                                      : want.tensor(name);
    ASSERT_EQ(x.sizes(), y.sizes()) << name;
    EXPECT_TRUE(at::equal(x, y)) << "engine state: " << name;
  }
}

// Bytes of the model's units in the order the forward runs them: the embedding, each
// decoder layer, the head (final norm and the output projection, or the tied embedding).
std::vector<int64_t> unit_bytes(const fs::path& model_file) {
  zenflow::model::SafetensorsFile model(model_file.string());
  std::map<int, int64_t> layers;
  int64_t embed = 0, head = 0;
  for (const auto& name : model.names()) {
    const at::Tensor t = model.tensor(name);
    const auto b = static_cast<int64_t>(t.nbytes());
    if (name == "model.embed_tokens.weight") {
      embed += b;
    } else if (name.rfind("model.layers.", 0) == 0) {
      layers[std::stoi(name.substr(13))] += b;
    } else {
      head += b;  // model.norm.weight, lm_head.weight
    }
  }
  std::vector<int64_t> units{embed};
  for (const auto& [i, b] : layers) units.push_back(b);
  const bool tied = std::find(model.names().begin(), model.names().end(), "lm_head.weight") == model.names().end();
  units.push_back(head + (tied ? embed : 0));  // the head reads the embedding when tied
  return units;
}

// --- Zenflow mode: the selected columns stay on the device, the others stream ---

struct ZenCase {
  const char* name;
  const char* update_interval;  // "auto" or a number
  bool overlap;
  bool tied;
  int grad_accum;
  const char* grad_clip;
  int ranks = 1;
};

void PrintTo(const ZenCase& c, std::ostream* os) { *os << c.name; }

// Every matrix of at least 512 elements is split (every 2-D one of this model), 10% of its
// columns selected; re-selected at every window (step strategy: every update_interval
// steps; auto: whenever the selected share of the window's importance is below 1).
std::string zen_spec_text(const fs::path& ckpt, bool offload_parameters, const ZenCase& c) {
  const Case base{c.name, 1, c.tied, c.grad_accum, c.grad_clip};
  std::string text = spec_text(ckpt, offload_parameters, base, "zenflow");
  const std::string u = c.update_interval;
  const std::string select = u == "auto" ? "select_strategy: auto, reselect_threshold: 1.0"
                                         : "select_strategy: step, select_interval: " + u;
  const std::string zen = "optimizer: {mode: zenflow, eps: 1.0e-3, host: {threads: 1}, zenflow: {topk_ratio: 0.1, "
                          "min_split_numel: 512, update_interval: " + u + ", overlap_step: " +
                          (c.overlap ? "true" : "false") + ", " + select + "}}\n";
  const size_t at = text.find("optimizer: {");
  text.replace(at, text.find('\n', at) + 1 - at, zen);
  return text;
}

class StreamedParametersMatchDeviceResident : public ::testing::TestWithParam<Case> {};

TEST_P(StreamedParametersMatchDeviceResident, BitIdenticalWeightsLossesAndEngineStateAfterTenSteps) {
  const Case c = GetParam();
  if (c.ranks > 1) REQUIRE_GLOO();
  const fs::path dir = zenflow::test_support::fresh_scratch_dir(std::string("streamed-") + c.name);
  nlohmann::json runs[2];
  for (int on = 0; on < 2; ++on) {
    const std::string spec = (dir / (on ? "on.yaml" : "off.yaml")).string();
    std::ofstream(spec) << spec_text(dir / (on ? "on" : "off"), on == 1, c);
    runs[on] = run_json(spec, c.ranks, "--no-resume");
    ASSERT_EQ(runs[on]["exit"], 0) << runs[on]["stderr"];
    ASSERT_EQ(runs[on]["losses"].size(), 10u);
    EXPECT_EQ(runs[on]["offload_parameters"], on == 1);
  }
  const std::vector<double> off = runs[0]["losses"].get<std::vector<double>>(),
                            on = runs[1]["losses"].get<std::vector<double>>();
  for (size_t i = 0; i < off.size(); ++i) EXPECT_EQ(on[i], off[i]) << "step " << i + 1;
  EXPECT_EQ(runs[1]["val_loss"].get<double>(), runs[0]["val_loss"].get<double>());
  expect_files_equal(step_dir(dir / "on", 10) / "model.safetensors", step_dir(dir / "off", 10) / "model.safetensors",
                     "weights");
  for (int r = 0; r < c.ranks; ++r) {  // each rank's engine shard (its host columns)
    const std::string engine = zenflow::checkpoint_shard_name(r);
    expect_files_equal(step_dir(dir / "on", 10) / engine, step_dir(dir / "off", 10) / engine, "engine " + engine);
  }

  // What moved, per step, on rank 0 (the totals hold the 10 steps and the end-of-run flush,
  // which moves nothing in offload mode): every unit's weights twice per micro-batch, each
  // gradient once (tied: the sum of its uses), and no H2D of the host step's result.
  const std::vector<int64_t> units = unit_bytes(step_dir(dir / "on", 10) / "model.safetensors");
  ASSERT_FALSE(units.empty());
  int64_t streamed = 0;
  for (int64_t b : units) streamed += b;
  zenflow::model::SafetensorsFile model((step_dir(dir / "on", 10) / "model.safetensors").string());
  int64_t params = 0;
  for (const auto& name : model.names()) params += static_cast<int64_t>(model.tensor(name).nbytes());
  const nlohmann::json& bytes = runs[1]["transfer_bytes"];
  EXPECT_EQ(bytes["h2d_weights"].get<int64_t>(), 10 * c.grad_accum * 2 * streamed);
  EXPECT_EQ(bytes["d2h"].get<int64_t>(), 10 * c.grad_accum * params);
  EXPECT_EQ(bytes["h2d"].get<int64_t>(), 0);
  EXPECT_EQ(runs[0]["transfer_bytes"]["h2d_weights"].get<int64_t>(), 0);
  EXPECT_GT(runs[0]["transfer_bytes"]["h2d"].get<int64_t>(), 0);  // the engine's, without streaming
  // Nothing crossed to the device but the weights: no `transfer_h2d` stall (the engine's
  // apply into the host leaves is host optimizer work), the compute's waits for them
  // counted as `weight_stream`.
  EXPECT_EQ(runs[1]["stall_seconds"]["transfer_h2d"].get<double>(), 0.0);
  EXPECT_GT(runs[1]["stall_seconds"]["weight_stream"].get<double>(), 0.0);
  EXPECT_EQ(runs[0]["stall_seconds"]["weight_stream"].get<double>(), 0.0);

  // On the device: the ring (two slots of the largest unit) and the gradients of at most two
  // consecutive units (one landing, one leaving); the model's weights and gradients are not.
  const int64_t largest = *std::max_element(units.begin(), units.end());
  EXPECT_EQ(runs[1]["device_memory_bytes"]["parameters"].get<int64_t>(), 2 * largest);
  int64_t pair = 0;
  for (size_t u = 0; u + 1 < units.size(); ++u) pair = std::max(pair, units[u] + units[u + 1]);
  if (!c.tied) {
    EXPECT_EQ(runs[1]["device_memory_bytes"]["gradients"].get<int64_t>(), pair);
  }
  EXPECT_LE(runs[1]["device_memory_bytes"]["gradients"].get<int64_t>(), pair);
  EXPECT_EQ(runs[0]["device_memory_bytes"]["parameters"].get<int64_t>(), params);
  EXPECT_LT(2 * largest, params);
  EXPECT_EQ(runs[1]["streamed_weight_bytes"].get<int64_t>(), params);
  std::printf("[figure] %s: streamed %lld B/step (2 x %lld B of weights x %d micro-batches), device weights %lld B "
              "against %lld B resident\n",
              c.name, static_cast<long long>(c.grad_accum * 2 * streamed), static_cast<long long>(streamed),
              c.grad_accum, static_cast<long long>(2 * largest), static_cast<long long>(params));
}

INSTANTIATE_TEST_SUITE_P(Cases, StreamedParametersMatchDeviceResident,
                         ::testing::Values(Case{"rank1", 1, false, 1, "0.0"},
                                           Case{"rank1_tied_accum2_clip", 1, true, 2, "1.0e-3"},
                                           Case{"ranks2", 2, false, 1, "0.0"},
                                           Case{"ranks2_tied_clip", 2, true, 1, "1.0e-3"}),
                         [](const auto& info) { return std::string(info.param.name); });

// Steps 1-5 with the setting `first`, resumed with `then` for steps 6-10: the same losses and
// weights, bit for bit, as `then` run straight through. The first run goes on to step 10 and
// its step-10 checkpoint is removed, so the resumed one is a periodic step-5 checkpoint.
// Zenflow mode: windows of 4 overlapped, so the step-5 checkpoint is mid-window with a host
// step in flight. `ranks`: data-parallel ranks of every run (each rank's engine shard compared).
void expect_resume_exact(bool first, bool then, bool zenflow = false, int ranks = 1);

TEST(StreamedParameters, ACheckpointWrittenWithItResumesWithoutItExactly) { expect_resume_exact(true, false); }
TEST(StreamedParameters, ACheckpointWrittenWithoutItResumesWithItExactly) { expect_resume_exact(false, true); }
TEST(StreamedParameters, ZenflowCheckpointMidWindowWrittenWithItResumesWithoutItExactly) {
  expect_resume_exact(true, false, true);
}
TEST(StreamedParameters, ZenflowCheckpointMidWindowWrittenWithoutItResumesWithItExactly) {
  expect_resume_exact(false, true, true);
}
TEST(StreamedParameters, ZenflowOnTwoRanksCheckpointMidWindowResumesAcrossTheSettingExactly) {
  REQUIRE_GLOO();
  expect_resume_exact(true, false, true, 2);
  expect_resume_exact(false, true, true, 2);
}

void expect_resume_exact(bool first, bool then, bool zenflow, int ranks) {
  const Case c{"resume", 1, false, 1, "1.0"};
  const fs::path dir = zenflow::test_support::fresh_scratch_dir(std::string("streamed-resume-") +
                                                                (zenflow ? "zen-" : "") + (first ? "on" : "off") +
                                                                (then ? "on" : "off") + std::to_string(ranks));
  const std::string spec = (dir / "job.yaml").string(), straight_spec = (dir / "straight.yaml").string();
  if (zenflow) {
    std::ofstream(spec) << zen_spec_text(dir / "ckpt", first, ZenCase{"resume", "4", true, false, 1, "0.0"});
    std::ofstream(straight_spec) << zen_spec_text(dir / "straight", then, ZenCase{"resume", "4", true, false, 1, "0.0"});
  } else {
    std::ofstream(spec) << spec_text(dir / "ckpt", first, c);
    std::ofstream(straight_spec) << spec_text(dir / "straight", then, c);
  }
  const nlohmann::json head =
      run_json(spec, ranks, "--no-resume --set checkpoint.every_steps=5 --set checkpoint.keep=10");
  ASSERT_EQ(head["exit"], 0) << head["stderr"];
  fs::remove_all(step_dir(dir / "ckpt", 10));
  const nlohmann::json resumed =
      run_json(spec, ranks, std::string("--set train.offload_parameters=") + (then ? "true" : "false"));
  ASSERT_EQ(resumed["exit"], 0) << resumed["stderr"];
  EXPECT_EQ(resumed["start_step"], 5);
  EXPECT_EQ(resumed["offload_parameters"], then);
  const nlohmann::json straight = run_json(straight_spec, ranks, "--no-resume");
  ASSERT_EQ(straight["exit"], 0) << straight["stderr"];
  const std::vector<double> got = resumed["losses"].get<std::vector<double>>(),
                            want = straight["losses"].get<std::vector<double>>();
  ASSERT_EQ(got.size(), 5u);
  ASSERT_EQ(want.size(), 10u);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], want[5 + i]) << "step " << 6 + i;
  expect_files_equal(step_dir(dir / "ckpt", 10) / "model.safetensors",
                     step_dir(dir / "straight", 10) / "model.safetensors", "weights");
  if (zenflow)
    for (int r = 0; r < ranks; ++r)
      expect_engine_states_equal(step_dir(dir / "ckpt", 10) / zenflow::checkpoint_shard_name(r),
                                 step_dir(dir / "straight", 10) / zenflow::checkpoint_shard_name(r));
  else
    expect_files_equal(step_dir(dir / "ckpt", 10) / "engine.safetensors",
                       step_dir(dir / "straight", 10) / "engine.safetensors", "engine state");
}

// What it does not combine with: exit 2 before anything runs, naming the keys.
TEST(StreamedParameters, RefusedWhereItDoesNotApplyNamingTheKeys) {
  const fs::path dir = zenflow::test_support::fresh_scratch_dir("streamed-refused");
  const Case c{"refused", 1, false, 1, "1.0"};
  struct Refusal {
    std::string mode, flags;
    std::vector<std::string> named;
  };
  const Refusal refusals[] = {
      {"device", "", {"train.offload_parameters", "optimizer.mode", "device"}},
      {"zenflow", "--set optimizer.host.device_staging_mib=64",
       {"train.offload_parameters", "optimizer.host.device_staging_mib"}},
      {"offload", "--set train.activation_checkpointing=false",
       {"train.offload_parameters", "train.activation_checkpointing"}},
      {"offload", "--set train.shard=parameters", {"train.offload_parameters", "train.shard"}},
      {"offload", "--set optimizer.host.nodes=1", {"train.offload_parameters", "optimizer.host.nodes"}},
  };
  for (const Refusal& r : refusals) {
    const std::string spec = (dir / (r.mode + ".yaml")).string();
    std::ofstream(spec) << spec_text(dir / "ckpt", true, c, r.mode);
    const nlohmann::json j = run_json(spec, 1, "--no-resume " + r.flags);
    EXPECT_EQ(j["exit"], 2) << r.mode << " " << r.flags << ": " << j["stderr"];
    for (const std::string& n : r.named)
      EXPECT_NE(j["stderr"].get<std::string>().find(n), std::string::npos) << n << " in: " << j["stderr"];
  }
  EXPECT_FALSE(fs::exists(dir / "ckpt"));  // nothing ran
}

class StreamedColumnsMatchDeviceResident : public ::testing::TestWithParam<ZenCase> {};

// The same run with and without train.offload_parameters in zenflow mode: the same losses,
// weights and engine state (every rank's shard) bit for bit, with clipping too (the gradient
// norm is summed column by column either way); what moved (one rank): every micro-batch
// streams the host-owned columns' weights twice and sends their gradients once, and the
// engine's H2D of the host step's result is gone; on the device, the selected columns, the
// parameters never split and the ring.
TEST_P(StreamedColumnsMatchDeviceResident, SameRunStepByStepWithOnlyTheHostColumnsMoving) {
  const ZenCase c = GetParam();
  if (c.ranks > 1) REQUIRE_GLOO();
  const fs::path dir = zenflow::test_support::fresh_scratch_dir(std::string("streamed-zen-") + c.name);
  nlohmann::json runs[2];
  for (int on = 0; on < 2; ++on) {
    const std::string spec = (dir / (on ? "on.yaml" : "off.yaml")).string();
    std::ofstream(spec) << zen_spec_text(dir / (on ? "on" : "off"), on == 1, c);
    runs[on] = run_json(spec, c.ranks, "--no-resume");
    ASSERT_EQ(runs[on]["exit"], 0) << runs[on]["stderr"];
    ASSERT_EQ(runs[on]["losses"].size(), 10u);
    EXPECT_EQ(runs[on]["offload_parameters"], on == 1);
  }
  EXPECT_GT(runs[1]["reselections"].get<int64_t>(), 0);
  EXPECT_EQ(runs[1]["reselections"], runs[0]["reselections"]);
  const std::vector<double> off = runs[0]["losses"].get<std::vector<double>>(),
                            on = runs[1]["losses"].get<std::vector<double>>();
  for (size_t i = 0; i < off.size(); ++i) EXPECT_EQ(on[i], off[i]) << "step " << i + 1;
  const fs::path on_dir = step_dir(dir / "on", 10), off_dir = step_dir(dir / "off", 10);
  EXPECT_EQ(runs[1]["val_loss"].get<double>(), runs[0]["val_loss"].get<double>());
  expect_files_equal(on_dir / "model.safetensors", off_dir / "model.safetensors", "weights");
  for (int r = 0; r < c.ranks; ++r)
    expect_files_equal(on_dir / zenflow::checkpoint_shard_name(r), off_dir / zenflow::checkpoint_shard_name(r),
                       "engine state of rank " + std::to_string(r));

  const nlohmann::json& bytes = runs[1]["transfer_bytes"];
  EXPECT_GT(bytes["d2h"].get<int64_t>(), 0);
  if (c.ranks == 1) {
    EXPECT_EQ(bytes["h2d"].get<int64_t>(), 0);  // nothing goes back after a host step
    if (!c.tied) {  // each matrix in one unit: its host columns stream twice, their gradients leave once
      EXPECT_EQ(bytes["h2d_weights"].get<int64_t>(), 2 * bytes["d2h"].get<int64_t>());
    }
  } else if (!c.tied && c.grad_accum == 1) {
    // Every rank's host columns: their weights stream twice, their gradients leave once and come
    // back up once for the reduce-scatter through the device (which sends this rank's shard down
    // again); after each host step this rank's shard goes up and every rank's comes down.
    const int64_t weights = bytes["h2d_weights"].get<int64_t>() / 2;
    EXPECT_GT(bytes["h2d"].get<int64_t>(), weights);
    EXPECT_GT(bytes["d2h"].get<int64_t>(), weights);
    EXPECT_LT(bytes["d2h"].get<int64_t>(), 3 * weights);
  }
  EXPECT_GT(runs[0]["transfer_bytes"]["h2d"].get<int64_t>(), 0);

  // Device parameters: 10% of each split matrix's columns, every parameter that is not split,
  // and the ring: two slots of the largest unit's matrices whole and their host columns
  // landed (all of them during warm-up), so 2 x 2 x the largest unit's split bytes.
  zenflow::model::SafetensorsFile model((on_dir / "model.safetensors").string());
  int64_t selected = 0, always = 0, all = 0;
  std::map<std::string, int64_t> split_of_unit;
  for (const auto& name : model.names()) {
    const at::Tensor t = model.tensor(name);
    all += static_cast<int64_t>(t.nbytes());
    if (t.dim() == 2 && t.numel() >= 512) {
      selected += t.size(0) * (t.size(1) / 10) * static_cast<int64_t>(t.element_size());
      const std::string unit = name.rfind("model.layers.", 0) == 0 ? name.substr(0, name.find('.', 13))
                               : name == "lm_head.weight"          ? "head"
                                                                   : "embed";
      split_of_unit[unit] += static_cast<int64_t>(t.nbytes());
    } else {
      always += static_cast<int64_t>(t.nbytes());
    }
  }
  if (c.tied) split_of_unit["head"] += split_of_unit["embed"];
  int64_t largest = 0;
  for (const auto& [unit, b] : split_of_unit) largest = std::max(largest, b);
  const int64_t params = runs[1]["device_memory_bytes"]["parameters"].get<int64_t>();
  EXPECT_EQ(params, selected + always + 2 * 2 * largest);
  EXPECT_LT(selected + always, all / 5);
  EXPECT_EQ(runs[0]["device_memory_bytes"]["parameters"].get<int64_t>(), all);
  std::printf("[figure] zenflow %s: device weights %lld B (selected %lld + never split %lld + ring %lld) against "
              "%lld B resident; per step h2d_weights %lld B, d2h %lld B, engine h2d 0 (resident: %lld B)\n",
              c.name, static_cast<long long>(params), static_cast<long long>(selected), static_cast<long long>(always),
              static_cast<long long>(4 * largest), static_cast<long long>(all),
              static_cast<long long>(bytes["h2d_weights"].get<int64_t>() / 10),
              static_cast<long long>(bytes["d2h"].get<int64_t>() / 10),
              static_cast<long long>(runs[0]["transfer_bytes"]["h2d"].get<int64_t>() / 10));
}

INSTANTIATE_TEST_SUITE_P(Cases, StreamedColumnsMatchDeviceResident,
                         ::testing::Values(ZenCase{"u1", "1", false, false, 1, "0.0"},
                                           ZenCase{"u4", "4", false, false, 1, "0.0"},
                                           ZenCase{"u4_overlap", "4", true, false, 1, "0.0"},
                                           ZenCase{"auto_overlap", "auto", true, false, 1, "0.0"},
                                           ZenCase{"u2_overlap_tied_accum2", "2", true, true, 2, "0.0"},
                                           ZenCase{"u2_overlap_clip", "2", true, false, 1, "1.0e-3"},
                                           ZenCase{"auto_tied_accum2_clip", "auto", true, true, 2, "1.0e-3"},
                                           ZenCase{"ranks2_u2_overlap_clip", "2", true, false, 1, "1.0e-3", 2},
                                           ZenCase{"ranks2_auto_overlap_tied_accum2", "auto", true, true, 2, "0.0", 2},
                                           ZenCase{"ranks2_u1", "1", false, false, 1, "0.0", 2}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
