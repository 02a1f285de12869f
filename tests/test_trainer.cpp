// Training loop: checkpoint/resume exactness, damaged-checkpoint fallback, byte accounting,
// what the reporter hears and the commit fence.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "common/job_spec.h"
#include "worker/rank/checkpoint.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/rank/run_reporter.h"
#include "worker/rank/trainer.h"

namespace fs = std::filesystem;
using namespace zenflow;

namespace {

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("zenflow-test-" + name + "-" + std::to_string(::getpid()));
  zenflow::remove_tree(p);
  fs::create_directories(p);
  return p.string();
}

std::string write_corpus(const std::string& dir) {
  std::string path = dir + "/corpus.txt";
  std::ofstream f(path);
  for (int i = 0; i < 200; ++i)
    f << "The quick brown fox " << i << " jumps over the lazy dog; zenflow trains on line " << i * 7 << ".\n";
  return path;
}

JobSpec tiny_spec(const std::string& dir, const std::string& extra_mode_yaml) {
  const std::string yaml = "name: t\n"
                           "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 2, "
                           "num_attention_heads: 4, intermediate_size: 64, max_position_embeddings: 32}}\n"
                           "data: {train: " + write_corpus(dir) + ", tokenizer: byte, val_fraction: 0.1}\n"
                           "train: {steps: 12, micro_batch: 4, seq_len: 16, lr: 3.0e-3, schedule: cosine, "
                           "warmup_steps: 2, grad_clip: 1.0, seed: 3, compute_threads: 1, device: cpu}\n"
                           "optimizer:\n  mode: zenflow\n  zenflow: {topk_ratio: 0.25, update_interval: 3, "
                           "full_warm_up_rounds: 1, overlap_step: true, select_strategy: auto, "
                           "min_split_numel: 512" + extra_mode_yaml + "}\n"
                           "  host: {threads: 1}\n"
                           "checkpoint: {dir: " + dir + "/ckpt, every_steps: 5, keep: 3}\n";
  return parse_job_spec(yaml, {}, dir);
}

RunOptions quiet() {
  RunOptions o;
  o.evaluate = false;
  return o;
}

// Every event a run reports, in order.
struct RecordingReporter : RunReporter {
  struct Event {
    std::string kind;  // start, step, log, checkpoint, finish
    int64_t step = 0;  // start: start_step; finish: steps
    int64_t total = 0;
    double loss = 0;
    std::string text;  // log: the line; checkpoint: the dir
    bool interrupted = false;
  };
  std::vector<Event> events;

  void on_start(int64_t start_step, int64_t total_steps) noexcept override {
    events.push_back({"start", start_step, total_steps, 0, "", false});
  }
  void on_step(const StepProgress& p) noexcept override {
    events.push_back({"step", p.step, p.total, p.loss, "", false});
  }
  void on_log(const std::string& line) noexcept override { events.push_back({"log", 0, 0, 0, line, false}); }
  void on_checkpoint(int64_t step, const std::string& dir) noexcept override {
    events.push_back({"checkpoint", step, 0, 0, dir, false});
  }
  void on_finish(int64_t steps, bool interrupted) noexcept override {
    events.push_back({"finish", steps, 0, 0, "", interrupted});
  }
  void on_resumed(int64_t step, int64_t total_steps, double loss) noexcept override {
    events.push_back({"resumed", step, total_steps, loss, "", false});
  }
  std::vector<Event> of(const std::string& kind) const {
    std::vector<Event> out;
    for (const Event& e : events)
      if (e.kind == kind) out.push_back(e);
    return out;
  }
};

RunOptions reported_to(RecordingReporter* reporter) {
  RunOptions o = quiet();
  o.reporter = reporter;
  return o;
}

}  // namespace

TEST(Trainer, ResumeAfterInterruptGivesTheSameLossesStepByStep) {
  const std::string dir = temp_dir("resume");
  JobSpec spec = tiny_spec(dir, "");
  RunOptions straight = quiet();
  straight.write_checkpoints = false;
  straight.resume = false;
  RunSummary a = run_training(spec, straight);
  ASSERT_EQ(a.losses.size(), 12u);

  RunOptions first = quiet();
  first.stop_after_steps = 7;  // mid-window (W=1, U=3): a host step is in flight
  RunSummary b1 = run_training(spec, first);
  EXPECT_TRUE(b1.interrupted);
  EXPECT_EQ(b1.steps, 7);
  auto cks = list_checkpoints(spec.checkpoint.dir);
  ASSERT_EQ(cks.size(), 2u);  // step 5 (periodic) and step 7 (interrupt)
  EXPECT_EQ(cks.back().first, 7);
  // Checkpoint time is accounted: the periodic one (step 5) in its step, the interrupt one
  // in the end of the run; a run without checkpoints shows none.
  const int ck = static_cast<int>(zenflow::engine::StallCause::kCheckpoint);
  EXPECT_GT(b1.totals.stall_seconds[ck] - b1.finish_times.stall_seconds[ck], 0.0);
  EXPECT_GT(b1.finish_times.stall_seconds[ck], 0.0);
  EXPECT_EQ(a.totals.stall_seconds[ck], 0.0);

  RunSummary b2 = run_training(spec, quiet());
  EXPECT_EQ(b2.start_step, 7);
  EXPECT_EQ(b2.steps, 12);
  ASSERT_EQ(b2.losses.size(), 5u);
  for (size_t i = 0; i < 7; ++i) EXPECT_DOUBLE_EQ(b1.losses[i], a.losses[i]) << "step " << i + 1;
  for (size_t i = 0; i < 5; ++i) EXPECT_DOUBLE_EQ(b2.losses[i], a.losses[7 + i]) << "step " << i + 8;
  zenflow::remove_tree(dir);
}

TEST(Trainer, DamagedNewestCheckpointFallsBackToThePreviousOne) {
  const std::string dir = temp_dir("damaged");
  JobSpec spec = tiny_spec(dir, "");
  RunOptions straight = quiet();
  straight.write_checkpoints = false;
  straight.resume = false;
  RunSummary a = run_training(spec, straight);

  RunOptions first = quiet();
  first.stop_after_steps = 7;
  run_training(spec, first);
  // Truncate the newest checkpoint's engine state.
  const std::string newest = list_checkpoints(spec.checkpoint.dir).back().second;
  fs::resize_file(newest + "/engine.safetensors", fs::file_size(newest + "/engine.safetensors") / 2);

  RecordingReporter reporter;
  RunOptions resume = reported_to(&reporter);
  RunSummary b = run_training(spec, resume);
  EXPECT_EQ(b.start_step, 5);
  bool warned = false;
  for (auto& w : reporter.of("log"))
    warned |=
        w.text.find("damaged") != std::string::npos && w.text.find("step-00000007") != std::string::npos;
  EXPECT_TRUE(warned);
  ASSERT_EQ(b.losses.size(), 7u);
  for (size_t i = 0; i < 7; ++i) EXPECT_DOUBLE_EQ(b.losses[i], a.losses[5 + i]) << "step " << i + 6;
  zenflow::remove_tree(dir);
}

// Every file under `dir` with its size and modification time, the lock file left out (each
// run records itself there): what "touched nothing" compares.
std::map<std::string, std::pair<uintmax_t, fs::file_time_type>> tree_of(const std::string& dir) {
  std::map<std::string, std::pair<uintmax_t, fs::file_time_type>> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() != CheckpointDirLock::kFileName)
      out[fs::relative(e.path(), dir).string()] = {e.is_regular_file() ? e.file_size() : 0, e.last_write_time()};
  return out;
}

// Rerunning a finished run (the same spec, or fewer train.steps) trains nothing and writes
// nothing: it says it is complete at the checkpoint's step, and reports it as a resume at
// the last step would (start, resumed, finish). More steps, or a newest checkpoint that is
// damaged, resume as before.
TEST(Trainer, AFinishedRunIsAlreadyCompleteAndTouchesNothing) {
  const std::string dir = temp_dir("complete");
  JobSpec spec = tiny_spec(dir, "");
  const RunSummary a = run_training(spec, quiet());
  ASSERT_EQ(a.steps, 12);
  EXPECT_FALSE(a.already_complete);
  const auto before = tree_of(spec.checkpoint.dir);

  RecordingReporter same;
  const RunSummary again = run_training(spec, reported_to(&same));
  EXPECT_TRUE(again.already_complete);
  EXPECT_EQ(again.start_step, 12);
  EXPECT_EQ(again.steps, 12);
  EXPECT_FALSE(again.interrupted);
  EXPECT_TRUE(again.losses.empty());
  EXPECT_DOUBLE_EQ(again.final_loss, a.losses.back());
  EXPECT_EQ(again.last_checkpoint, spec.checkpoint.dir + "/step-00000012");
  ASSERT_EQ(same.events.size(), 4u);
  EXPECT_EQ(same.events[0].kind, "log");
  EXPECT_EQ(same.events[0].text, "already complete at step 12; nothing to do (--fresh to start over)");
  EXPECT_EQ(same.events[1].kind, "start");
  EXPECT_EQ(same.events[1].step, 12);
  EXPECT_EQ(same.events[1].total, 12);
  EXPECT_EQ(same.events[2].kind, "resumed");
  EXPECT_EQ(same.events[2].step, 12);
  EXPECT_DOUBLE_EQ(same.events[2].loss, a.losses.back());
  EXPECT_EQ(same.events[3].kind, "finish");
  EXPECT_EQ(same.events[3].step, 12);
  EXPECT_FALSE(same.events[3].interrupted);

  JobSpec fewer = spec;
  fewer.train.steps = 5;
  RecordingReporter past;
  RunOptions o = reported_to(&past);
  o.start_over_hint = "another hint";
  EXPECT_TRUE(run_training(fewer, o).already_complete);
  ASSERT_FALSE(past.of("log").empty());
  EXPECT_EQ(past.of("log")[0].text, "already complete at step 12, past train.steps 5; nothing to do (another hint)");
  EXPECT_EQ(tree_of(spec.checkpoint.dir), before) << "a complete run touched its checkpoints";

  JobSpec more = spec;
  more.train.steps = 14;
  const RunSummary longer = run_training(more, quiet());
  EXPECT_FALSE(longer.already_complete);
  EXPECT_EQ(longer.start_step, 12);
  EXPECT_EQ(longer.steps, 14);

  // The newest (step 14) damaged: the usable one (12) is complete for 12 steps, not for 14.
  const std::string newest = list_checkpoints(spec.checkpoint.dir).back().second;
  fs::resize_file(newest + "/model.safetensors", fs::file_size(newest + "/model.safetensors") / 2);
  EXPECT_TRUE(run_training(spec, quiet()).already_complete);
  EXPECT_TRUE(fs::exists(newest + ".damaged"));  // quarantined, as a resume does
  const RunSummary redone = run_training(more, quiet());
  EXPECT_FALSE(redone.already_complete);
  EXPECT_EQ(redone.start_step, 12);
  EXPECT_EQ(redone.steps, 14);
  zenflow::remove_tree(dir);
}

// Semantics §6: D2H moves the unselected columns every step, H2D once per window.
TEST(Trainer, TransferBytesFollowTheSplit) {
  const std::string dir = temp_dir("bytes");
  JobSpec spec = tiny_spec(dir, "");
  spec.train.steps = 10;  // 1 warm-up step + 3 windows of 3
  RunOptions o = quiet();
  o.write_checkpoints = false;
  o.resume = false;
  RunSummary s = run_training(spec, o);
  // Split matrices of the tiny model (min_split_numel 512): embed [256,32], lm_head [256,32],
  // per layer q,k,v,o [32,32], gate/up [64,32], down [32,64].
  struct M { int64_t out, in; };
  std::vector<M> ms = {{256, 32}, {256, 32}};
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < 4; ++i) ms.push_back({32, 32});
    ms.push_back({64, 32});
    ms.push_back({64, 32});
    ms.push_back({32, 64});
  }
  int64_t all = 0, unsel = 0;
  for (auto& m : ms) {
    all += m.out * m.in;
    const int64_t k = std::max<int64_t>(1, static_cast<int64_t>(0.25 * static_cast<double>(m.in)));
    unsel += m.out * (m.in - k);
  }
  EXPECT_EQ(s.split_params, all);
  // Warm-up step: everything both ways. Then 9 steps of unselected D2H; 3 windows
  // of H2D, the last one applied by finish().
  EXPECT_EQ(s.totals.transfer_bytes[0], 4 * (all + 9 * unsel));
  EXPECT_EQ(s.totals.transfer_bytes[1], 4 * (all + 3 * unsel));
  zenflow::remove_tree(dir);
}

// Autocast is a CUDA feature: on the CPU the run is unchanged (fp32), bit for bit.
TEST(Trainer, AutocastIsIgnoredOnTheCpu) {
  const std::string dir = temp_dir("autocast");
  JobSpec spec = tiny_spec(dir, "");
  spec.train.steps = 4;
  RunOptions o = quiet();
  o.write_checkpoints = false;
  o.resume = false;
  RunSummary plain = run_training(spec, o);
  spec.train.autocast = "bfloat16";
  RunSummary cast = run_training(spec, o);
  ASSERT_EQ(plain.losses.size(), cast.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_DOUBLE_EQ(plain.losses[i], cast.losses[i]);
  EXPECT_THROW(parse_job_spec("name: x\ndata: {train: /tmp}\ntrain: {autocast: fp8}\n"), SpecError);
  zenflow::remove_tree(dir);
}

// A run pins the calling thread to its compute cores only while it lasts: the caller's next
// run (bench offload's next mode, a run resuming in-process after losing its optimizer node)
// plans from every core again, instead of putting compute and host optimizer on the one
// core the previous run left it.
TEST(Trainer, ARunGivesTheCallingThreadItsCoresBack) {
  const std::vector<int> before = engine::available_cores();
  if (before.size() < 2) GTEST_SKIP() << "needs two cores";
  struct CoresAtStart : RecordingReporter {
    std::vector<int> cores;
    void on_start(int64_t start_step, int64_t total_steps) noexcept override {
      cores = engine::available_cores();
      RecordingReporter::on_start(start_step, total_steps);
    }
  } during;
  const std::string dir = temp_dir("cores");
  JobSpec spec = tiny_spec(dir, "");  // host: {threads: 1}: the last core is the host's
  spec.train.steps = 2;
  RunOptions o = quiet();
  o.write_checkpoints = false;
  o.resume = false;
  o.reporter = &during;
  for (int run = 0; run < 2; ++run) {
    run_training(spec, o);
    EXPECT_EQ(during.cores, std::vector<int>(before.begin(), before.end() - 1)) << "run " << run;
    EXPECT_EQ(engine::available_cores(), before) << "after run " << run;
  }
  zenflow::remove_tree(dir);
}

// The reporter hears the run as it happened: start, every step with the summary's losses,
// each committed checkpoint, the finish last.
TEST(Trainer, TheReporterIsToldEveryStepAndCheckpoint) {
  const std::string dir = temp_dir("reporter");
  JobSpec spec = tiny_spec(dir, "");
  RecordingReporter reporter;
  RunOptions o = reported_to(&reporter);
  int fence_calls = 0;
  o.commit_fence = [&](const std::function<void()>& publish) {
    ++fence_calls;
    publish();
    return true;
  };
  RunSummary s = run_training(spec, o);
  ASSERT_FALSE(reporter.events.empty());
  EXPECT_EQ(reporter.events.front().kind, "start");
  EXPECT_EQ(reporter.events.front().step, 0);
  EXPECT_EQ(reporter.events.front().total, 12);
  const auto steps = reporter.of("step");
  ASSERT_EQ(steps.size(), 12u);
  for (size_t i = 0; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step, static_cast<int64_t>(i) + 1);
    EXPECT_EQ(steps[i].total, 12);
    EXPECT_DOUBLE_EQ(steps[i].loss, s.losses[i]) << "step " << i + 1;
  }
  // every_steps 5: steps 5 and 10, and the final one, each through the fence.
  const auto cks = reporter.of("checkpoint");
  const auto on_disk = list_checkpoints(spec.checkpoint.dir);
  ASSERT_EQ(cks.size(), 3u);
  ASSERT_EQ(on_disk.size(), 3u);
  for (size_t i = 0; i < cks.size(); ++i) {
    EXPECT_EQ(cks[i].step, on_disk[i].first);
    EXPECT_EQ(cks[i].text, on_disk[i].second);
  }
  EXPECT_EQ(cks.back().step, 12);
  EXPECT_EQ(fence_calls, 3);
  EXPECT_EQ(reporter.events.back().kind, "finish");
  EXPECT_EQ(reporter.events.back().step, 12);
  EXPECT_FALSE(reporter.events.back().interrupted);
  zenflow::remove_tree(dir);
}

// A fence that refuses (a lease gone) ends the run at its first checkpoint, with nothing
// committed and no temporary directory left behind.
TEST(Trainer, ARefusingCommitFenceEndsTheRunWithNothingCommitted) {
  const std::string dir = temp_dir("fenced");
  JobSpec spec = tiny_spec(dir, "");
  RecordingReporter reporter;
  RunOptions o = reported_to(&reporter);
  o.commit_fence = [](const std::function<void()>&) { return false; };
  EXPECT_THROW(run_training(spec, o), CommitFenced);
  EXPECT_TRUE(list_checkpoints(spec.checkpoint.dir).empty());
  for (const auto& e : fs::directory_iterator(spec.checkpoint.dir))
    EXPECT_EQ(e.path().filename().string().rfind("step-", 0), std::string::npos) << e.path();
  // It stopped at the first checkpoint (step 5), reporting steps up to 4 and no checkpoint.
  EXPECT_TRUE(reporter.of("checkpoint").empty());
  EXPECT_TRUE(reporter.of("finish").empty());
  ASSERT_FALSE(reporter.of("step").empty());
  EXPECT_EQ(reporter.of("step").back().step, 4);
  zenflow::remove_tree(dir);
}

// Device memory by kind, from the tensors themselves: fp32 weights and gradients, AdamW's
// m and v (no master for fp32 weights) for what the device updates, the column-importance
// scores of each split matrix; the peaks measured by the metered CPU allocator.
TEST(Trainer, DeviceMemoryIsAccountedByKind) {
  const std::string dir = temp_dir("device-memory");
  JobSpec spec = tiny_spec(dir, "");
  spec.train.steps = 4;
  RunOptions o = quiet();
  o.write_checkpoints = false;
  o.resume = false;

  spec.optimizer.mode = "device";
  const RunSummary device = run_training(spec, o);
  const DeviceMemoryBytes& d = device.device_memory;
  EXPECT_EQ(d.parameters, 4 * device.params);
  EXPECT_EQ(d.gradients, d.parameters);
  EXPECT_EQ(d.optimizer_state, 2 * d.parameters);
  EXPECT_EQ(d.communication_buffers, 0);
  EXPECT_GT(d.activations_peak, 0);
  EXPECT_GE(d.total_peak, d.parameters + d.gradients + d.optimizer_state + d.activations_peak);

  spec.optimizer.mode = "zenflow";
  const RunSummary zen = run_training(spec, o);
  const DeviceMemoryBytes& z = zen.device_memory;
  // Split matrices [out, in] with k = in / 4 selected columns: m, v of [out, k] and the
  // scores [in]; the 160 always-device elements (the norms): m, v.
  struct M { int64_t out, in; };
  std::vector<M> ms = {{256, 32}, {256, 32}};
  for (int l = 0; l < 2; ++l) {
    for (int i = 0; i < 4; ++i) ms.push_back({32, 32});
    ms.push_back({64, 32});
    ms.push_back({64, 32});
    ms.push_back({32, 64});
  }
  int64_t state = 0;
  for (const M& m : ms) state += 8 * m.out * (m.in / 4) + 4 * m.in;
  state += 8 * (zen.params - zen.split_params);
  EXPECT_EQ(zen.params - zen.split_params, 160);
  EXPECT_EQ(z.optimizer_state, state);
  EXPECT_EQ(z.parameters, d.parameters);
  EXPECT_EQ(z.gradients, d.gradients);
  EXPECT_LT(z.optimizer_state, d.optimizer_state / 3);  // a quarter of the columns, plus the scores
  zenflow::remove_tree(dir);
}
