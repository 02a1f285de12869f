// `zenflow report`: the step log a run writes (worker/rank/step_log.h) and reading a run directory
// back (truncated, resumed, superseded, not a run),
// the page's figures, and a real run's page rendered by headless Chromium offline: its
// charts drawn (pixels of the series' colours in each plot) and its numbers those of the
// run's own `zenflow run --json`.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/remove_tree.h"
#include "common/report/report_html.h"
#include "common/report/run_record.h"
#include "tests/support/allocation_counter.h"
#include "tests/support/shell.h"
#include "worker/rank/step_log.h"

namespace fs = std::filesystem;
using nlohmann::json;
using zenflow::test_support::read_file;
using zenflow::test_support::write_file;

namespace zenflow::report {
namespace {

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("zenflow-report-" + std::to_string(::getpid()));
}

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override { remove_tree(scratch_dir()); }
};
[[maybe_unused]] const auto* const g_cleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

fs::path fresh_dir(const std::string& name) {
  const fs::path d = scratch_dir() / name;
  remove_tree(d);
  fs::create_directories(d);
  return d;
}

// --- lines as worker/rank/step_log.h writes them ---

std::string start_line(int64_t start_step, bool fresh = false, const std::string& price = "null") {
  return "{\"event\":\"start\",\"job\":\"j\",\"start_step\":" + std::to_string(start_step) +
         ",\"total_steps\":10,\"fresh\":" + (fresh ? "true" : "false") +
         ",\"world_size\":1,\"device_is_cuda\":false,\"tokens_per_step\":100,\"time\":1700000000,"
         "\"host_memory\":{\"master\":400,\"moments\":800,\"accumulators\":800,\"pinned\":0,\"staging\":96,"
         "\"host_total\":1073741824},\"price\":" +
         price + "}\n";
}

std::string step_line(int64_t step, double loss, double wall = 0.5, double stall = 0.125) {
  char buf[640];
  std::snprintf(
      buf, sizeof buf,
      "{\"event\":\"step\",\"step\":%lld,\"loss\":%.17g,\"lr\":0.001,\"tokens\":100,\"skipped\":false,"
      "\"staleness_steps\":0,\"selected_ratio\":0.1,\"wall\":%.17g,\"compute\":0.25,"
      "\"device_optimizer\":0.0625,\"stall\":{\"host_optimizer\":%.17g,\"transfer_d2h\":0,"
      "\"transfer_h2d\":0,\"network\":0,\"allreduce\":0,\"data\":0,\"checkpoint\":0},"
      "\"bytes\":{\"d2h\":1000,\"h2d\":24}}\n",
      static_cast<long long>(step), loss, wall, stall);
  return buf;
}

// $3600/h: a dollar a second.
const std::string kDollarPerSecond =
    "{\"usd_per_hour\":3600,\"instance_usd_per_hour\":3600,\"gpus_of_instance\":0,\"instance\":null,"
    "\"source\":\"cost.usd_per_hour\"}";

std::vector<double> losses(const RunRecord& r) {
  std::vector<double> out;
  for (const auto& s : r.steps) out.push_back(s.loss);
  return out;
}

TEST(RunRecord, TruncatedLastLineOfAKilledRunIsSkippedAndTheCompleteLinesKept) {
  std::string text = start_line(0) + step_line(1, 4) + step_line(2, 3) + step_line(3, 2);
  text += step_line(4, 1).substr(0, 60);  // killed in the middle of writing step 4
  const RunRecord r = parse_step_log(text, "steps.jsonl");
  EXPECT_EQ(losses(r), (std::vector<double>{4, 3, 2}));
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("line 5 is incomplete"), std::string::npos) << r.warnings[0];
  const RunTotals t = run_totals(r);
  EXPECT_EQ(t.steps, 3);
  EXPECT_EQ(t.final_loss, 2);
  EXPECT_EQ(t.state, "incomplete");
  EXPECT_EQ(t.tokens, 300);
  EXPECT_FALSE(t.priced);
  // The page renders from them, saying it is not priced.
  const std::string html = render_report_html(r);
  EXPECT_NE(html.find("id=\"steps\" data-value=\"3\""), std::string::npos);
  EXPECT_NE(html.find("id=\"cost-usd\">not priced<"), std::string::npos);
  EXPECT_NE(html.find("line 5 is incomplete"), std::string::npos);
}

TEST(RunRecord, RunWithNoStepYetRendersSayingSo) {
  const RunRecord r = parse_step_log(start_line(0), "steps.jsonl");
  EXPECT_TRUE(r.steps.empty());
  EXPECT_EQ(run_totals(r).state, "incomplete");
  const std::string html = render_report_html(r);
  EXPECT_NE(html.find("No step recorded yet."), std::string::npos);
  EXPECT_EQ(html.find("id=\"chart-loss\""), std::string::npos);
}

TEST(RunRecord, ResumeDropsTheStepsPastItsCheckpointAndKeepsTheLatestLineOfEachStep) {
  // Run 1 reaches step 5, its last checkpoint was step 3; run 2 resumes at 3 and goes to 6.
  std::string text = start_line(0, false, kDollarPerSecond);
  for (int s = 1; s <= 5; ++s) text += step_line(s, 10 - s);
  text += start_line(3, false, kDollarPerSecond);
  for (int s = 4; s <= 6; ++s) text += step_line(s, 100 + s, 1.0, 0.25);
  text += step_line(6, 7);  // the same step again: the latest line wins
  const RunRecord r = parse_step_log(text, "steps.jsonl");
  EXPECT_EQ(losses(r), (std::vector<double>{9, 8, 7, 104, 105, 7}));
  ASSERT_EQ(r.segments.size(), 2u);
  EXPECT_EQ(r.steps[3].segment, 1u);
  EXPECT_TRUE(r.warnings.empty());
  const RunTotals t = run_totals(r);
  EXPECT_EQ(t.steps, 6);
  // Paid for: every step line, also those a resume redid: run 1's five of 0.5 s, run 2's
  // three of 1 s and step 6's repeat of 0.5 s, at $1/s.
  EXPECT_TRUE(t.priced);
  EXPECT_DOUBLE_EQ(t.cost_usd, 2.5 + 3.0 + 0.5);
  EXPECT_DOUBLE_EQ(t.usd_lost_to_stalls, 5 * 0.125 + 3 * 0.25 + 0.125);
  EXPECT_EQ(t.tokens, 900);
  ASSERT_TRUE(t.usd_per_1m_tokens.has_value());
  EXPECT_DOUBLE_EQ(*t.usd_per_1m_tokens, 6.0 * 1e6 / 900);
}

TEST(RunRecord, FreshStartSupersedesWhatCameBefore) {
  const std::string text = start_line(0, false, kDollarPerSecond) + step_line(1, 5) + step_line(2, 4) +
                           start_line(0, true) + step_line(1, 50);
  const RunRecord r = parse_step_log(text, "steps.jsonl");
  EXPECT_EQ(losses(r), (std::vector<double>{50}));
  EXPECT_EQ(r.segments.size(), 1u);
  EXPECT_FALSE(run_totals(r).priced);
}

TEST(RunRecord, SummaryGivesTheRunsOwnFiguresAndItsValidationLoss) {
  const json summary = {{"steps", 2},
                        {"start_step", 0},
                        {"interrupted", false},
                        {"tokens", 200},
                        {"final_loss", 3},
                        {"val_loss", 2.75},
                        {"cost_usd", 0.125},
                        {"usd_per_hour", 3.6},
                        {"usd_lost_to_stalls", 0.0625},
                        {"usd_per_1m_tokens", 625}};
  const std::string text = start_line(0, false, kDollarPerSecond) + step_line(1, 4) +
                           "{\"event\":\"eval\",\"step\":1,\"val_loss\":3.5}\n" + step_line(2, 3) +
                           "garbage in the middle\n" +
                           json{{"event", "summary"}, {"summary", summary}}.dump() + "\n";
  const RunRecord r = parse_step_log(text, "steps.jsonl");
  ASSERT_EQ(r.warnings.size(), 1u);
  EXPECT_NE(r.warnings[0].find("line 5 is not a JSON object"), std::string::npos) << r.warnings[0];
  EXPECT_EQ(r.evals, (std::vector<std::pair<int64_t, double>>{{1, 3.5}, {2, 2.75}}));
  const RunTotals t = run_totals(r);
  EXPECT_EQ(t.state, "finished");
  EXPECT_EQ(t.val_loss, 2.75);
  EXPECT_EQ(t.cost_usd, 0.125);  // the summary's, not the steps' 1 s at $1/s
  EXPECT_EQ(t.usd_lost_to_stalls, 0.0625);
  EXPECT_EQ(t.usd_per_hour, 3.6);
  EXPECT_EQ(*t.usd_per_1m_tokens, 625);
  const std::string html = render_report_html(r);
  EXPECT_NE(html.find("id=\"cost-usd\" data-value=\"0.125\">$0.125000<"), std::string::npos);
  EXPECT_NE(html.find("id=\"val-loss\" data-value=\"2.75\">2.7500<"), std::string::npos);
}

TEST(RunRecord, PageIsSelfContainedAndItsDataCannotCloseTheScript) {
  RunRecord r = parse_step_log(start_line(0) + step_line(1, 4), "steps.jsonl");
  r.job = "</script><b>x";
  r.stall_causes.push_back("</script>");
  const std::string html = render_report_html(r);
  EXPECT_EQ(html.find("</script><b>"), std::string::npos);
  EXPECT_NE(html.find("&lt;/script&gt;&lt;b&gt;x"), std::string::npos);
  EXPECT_NE(html.find("var uPlot="), std::string::npos);  // inlined, not fetched
  EXPECT_EQ(html.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html.find("href=\"http"), std::string::npos);
  EXPECT_EQ(html.find("bytes-h2d-weights"), std::string::npos);  // nothing streamed: no tile
}

TEST(RunRecord, LongRunsAreDrawnFromAtMostMaxChartPoints) {
  std::string text = start_line(0);
  for (int s = 1; s <= 9000; ++s) text += step_line(s, 1);
  const std::string html = render_report_html(parse_step_log(text, "steps.jsonl"));
  EXPECT_NE(html.find("Each point is the mean of 3 consecutive steps."), std::string::npos);
  EXPECT_NE(html.find("id=\"steps\" data-value=\"9000\""), std::string::npos);
}

TEST(RunRecord, NotARunDirectoryNamesThePath) {
  const fs::path empty = fresh_dir("empty");
  try {
    read_run_record(empty.string());
    ADD_FAILURE() << "no error";
  } catch (const RunRecordError& e) {
    EXPECT_NE(std::string(e.what()).find(empty.string() + ": not a zenflow run directory"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(read_run_record((empty / "missing").string()), RunRecordError);
  write_file(empty / "file", "x");
  EXPECT_THROW(read_run_record((empty / "file").string()), RunRecordError);
}

TEST(RunRecord, RunFromBeforeTheStepLogIsReadFromItsNewestCheckpoint) {
  const fs::path dir = fresh_dir("old-run");
  fs::create_directories(dir / "step-00000002");
  fs::create_directories(dir / "step-00000003");
  fs::create_directories(dir / "step-00000004.damaged");
  write_file(dir / "step-00000002" / "trainer.json", R"({"job":"old","losses":[5,4]})");
  write_file(dir / "step-00000003" / "trainer.json", R"({"job":"old","losses":[5,4,3]})");
  const RunRecord r = read_run_record(dir.string());
  EXPECT_EQ(r.job, "old");
  EXPECT_EQ(losses(r), (std::vector<double>{5, 4, 3}));
  EXPECT_FALSE(r.from_step_log);
  EXPECT_EQ(run_totals(r).state, "checkpointed");
  EXPECT_NE(render_report_html(r).find("Not recorded: this run directory has no steps.jsonl"),
            std::string::npos);
}

// --- the writer: worker/rank/step_log.h ---

TEST(StepLog, LinesReadBackExactlyAndAStepAllocatesNothing) {
  using zenflow::test_support::g_allocations;
  using zenflow::test_support::g_count_allocations;
  const fs::path dir = fresh_dir("step-log");
  StepLog log((dir / StepLog::kFileName).string(), "job \"q\"", false,
              StepLogPrice{7.2, 8, "p4d.24xlarge", "catalog"});
  EXPECT_FALSE(log.writing());
  RunFacts f;
  f.world_size = 2;
  f.device_is_cuda = true;
  f.total_steps = 2;
  f.tokens_per_step = 64;
  f.host_master_bytes = 400;
  f.host_moments_bytes = 800;
  f.pinned_host_bytes = 96;
  log.on_start(f);
  ASSERT_TRUE(log.writing());
  TrainingStep s;
  s.step = 1;
  s.loss = 0.1;  // not exact in binary: must read back as the same double
  s.lr = 3e-4;
  s.times.wall_seconds = 1.0 / 3;
  s.times.compute_seconds = 0.25;
  s.times.stall_seconds[static_cast<int>(engine::StallCause::kHostOptimizer)] = 0.0625;
  s.times.stall_seconds[static_cast<int>(engine::StallCause::kCheckpoint)] = 1e-7;
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kD2H)] = 123456789012;
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kH2DWeights)] = 98765;
  g_allocations = 0;
  g_count_allocations = true;
  log.on_step(s);
  log.on_eval(1, 2.5);
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0);
  s.step = 2;
  s.loss = NAN;  // a skipped step's loss: null
  s.skipped = true;
  log.on_step(s);
  TrainingEnd end;
  end.steps = 2;
  end.finish.transfer_bytes[static_cast<int>(engine::Direction::kH2D)] = 4096;
  end.finish.transfer_bytes[static_cast<int>(engine::Direction::kH2DWeights)] = 7;
  log.on_finish(end);
  log.write_summary({{"steps", 2}, {"tokens", 128}, {"losses", {0.1, nullptr}}, {"cost_usd", 0.5}});

  const RunRecord r = read_run_record(dir.string());
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
  EXPECT_EQ(r.job, "job \"q\"");
  ASSERT_EQ(r.steps.size(), 2u);
  EXPECT_EQ(r.steps[0].loss, 0.1);
  EXPECT_EQ(r.steps[0].lr, 3e-4);
  EXPECT_EQ(r.steps[0].wall, 1.0 / 3);
  EXPECT_EQ(r.steps[0].tokens, 64);
  EXPECT_EQ(r.steps[0].bytes_d2h, 123456789012);
  EXPECT_EQ(r.steps[0].bytes_h2d, 0);
  EXPECT_EQ(r.steps[0].bytes_h2d_weights, 98765);  // streamed weights apart from the engine's H2D
  EXPECT_EQ(r.stall_causes,
            (std::vector<std::string>{"host_optimizer", "transfer_d2h", "transfer_h2d", "network", "allreduce", "data",
                                      "checkpoint", "checkpoint_upload", "weight_stream"}));
  EXPECT_EQ(r.steps[0].stall[0], 0.0625);
  EXPECT_EQ(r.steps[0].stall[6], 1e-7);
  EXPECT_TRUE(std::isnan(r.steps[1].loss));
  EXPECT_TRUE(r.steps[1].skipped);
  EXPECT_EQ(r.evals, (std::vector<std::pair<int64_t, double>>{{1, 2.5}}));
  ASSERT_EQ(r.segments.size(), 1u);
  const RunSegment& seg = r.segments[0];
  ASSERT_TRUE(seg.usd_per_hour.has_value());
  EXPECT_DOUBLE_EQ(*seg.usd_per_hour, 7.2 * 2 / 8);  // 2 of the instance's 8 GPUs
  EXPECT_EQ(seg.price_instance, "p4d.24xlarge");
  EXPECT_EQ(seg.finish_bytes_h2d, 4096);
  EXPECT_TRUE(seg.finished);
  ASSERT_TRUE(seg.summary.has_value());
  EXPECT_FALSE(seg.summary->contains("losses"));  // the step lines hold them
  EXPECT_EQ(seg.host_memory.front(), (std::pair<std::string, int64_t>{"master", 400}));
  const RunTotals t = run_totals(r);
  EXPECT_EQ(t.cost_usd, 0.5);
  EXPECT_EQ(t.tokens, 128);
  EXPECT_EQ(t.bytes_h2d, 4096);
  EXPECT_EQ(t.bytes_h2d_weights, 2 * 98765 + 7);  // both steps and the finish
  EXPECT_NE(render_report_html(r).find("id=\"bytes-h2d-weights\" data-value=\"197537\""), std::string::npos);
}

TEST(StepLog, AFailedWriteTurnsItOffAndNothingThrows) {
  StepLog log("/dev/full", "j", false, std::nullopt);
  log.on_start(RunFacts{});  // the start line meets ENOSPC
  EXPECT_FALSE(log.writing());
  log.on_step(TrainingStep{});
  log.write_summary(json::object());
  StepLog missing((scratch_dir() / "no-such-dir" / "steps.jsonl").string(), "j", false, std::nullopt);
  EXPECT_THROW(missing.on_start(RunFacts{}), std::runtime_error);
}

// --- the lines, writer to reader: common/report/step_log_lines.h ---

// One process's run as StepLog records it, every field a distinct number that binary
// floating point holds exactly (so the text is short and each field is told apart).
fs::path write_golden_run(const std::string& name) {
  const fs::path dir = fresh_dir(name);
  StepLog log((dir / StepLog::kFileName).string(), "golden \"run\"", true,
              StepLogPrice{3.2, 8, "p4d.24xlarge", "catalog"});
  RunFacts f;
  f.world_size = 2;
  f.device_is_cuda = true;
  f.start_step = 5;
  f.total_steps = 7;
  f.tokens_per_step = 64;
  f.host_master_bytes = 400;
  f.host_moments_bytes = 800;
  f.host_accumulator_bytes = 1200;
  f.pinned_host_bytes = 96;
  f.host_staging_bytes = 48;
  f.host_total_memory_bytes = 1 << 30;
  log.on_start(f);
  TrainingStep s;
  s.step = 6;
  s.loss = 2.5;
  s.lr = 0.0009765625;
  s.staleness_steps = 3;
  s.selected_ratio = 0.125;
  s.times.wall_seconds = 0.75;
  s.times.compute_seconds = 0.5;
  s.times.device_optimizer_seconds = 0.0625;
  const double stalls[] = {0.25,       0.0625,      0.03125,      0.015625,     0.0078125,
                           0.00390625, 0.001953125, 0.0009765625, 0.00048828125};
  static_assert(std::size(stalls) == engine::kNumStallCauses);
  std::copy(std::begin(stalls), std::end(stalls), s.times.stall_seconds.begin());
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kD2H)] = 4096;
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kH2D)] = 2048;
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kH2DWeights)] = 1024;
  log.on_step(s);
  log.on_eval(6, 2.25);
  s.step = 7;
  s.loss = NAN;
  s.skipped = true;
  log.on_step(s);
  TrainingEnd end;
  end.steps = 7;
  end.interrupted = true;
  end.finish.wall_seconds = 1.5;
  end.finish.stall_seconds[static_cast<int>(engine::StallCause::kCheckpoint)] = 0.5;
  end.finish.transfer_bytes[static_cast<int>(engine::Direction::kD2H)] = 16;
  end.finish.transfer_bytes[static_cast<int>(engine::Direction::kH2D)] = 8;
  end.finish.transfer_bytes[static_cast<int>(engine::Direction::kH2DWeights)] = 4;
  log.on_finish(end);
  log.write_summary(
      {{"steps", 7}, {"tokens", 128}, {"losses", {2.5, nullptr}}, {"cost_usd", 0.5}, {"interrupted", true}});
  return dir / StepLog::kFileName;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    out.push_back(text.substr(at, nl - at));
  EXPECT_EQ(at, text.size()) << "the last line has no newline";
  return out;
}

// The text of each event, key for key: a key renamed or moved in the writer fails here, and
// so does one renamed in step_log_lines.h for both sides (files already written keep the
// old name).
TEST(StepLogLines, TheWriterWritesTheDocumentedTextOfEachEvent) {
  std::vector<std::string> lines = lines_of(read_file(write_golden_run("golden-text")));
  ASSERT_EQ(lines.size(), 6u);
  lines[0] = std::regex_replace(lines[0], std::regex("\"time\":[0-9.e+]+,"), "\"time\":T,");
  EXPECT_EQ(lines[0],
            R"({"event":"start","job":"golden \"run\"","start_step":5,"total_steps":7,"fresh":true,)"
            R"("world_size":2,"device_is_cuda":true,"tokens_per_step":64,"time":T,)"
            R"("host_memory":{"master":400,"moments":800,"accumulators":1200,"pinned":96,"staging":48,)"
            R"("host_total":1073741824},"price":{"usd_per_hour":0.8,"instance_usd_per_hour":3.2,)"
            R"("gpus_of_instance":8,"instance":"p4d.24xlarge","source":"catalog"}})");
  const std::string stall =
      R"("stall":{"host_optimizer":0.25,"transfer_d2h":0.0625,"transfer_h2d":0.03125,"network":0.015625,)"
      R"("allreduce":0.0078125,"data":0.00390625,"checkpoint":0.001953125,"checkpoint_upload":0.0009765625,)"
      R"("weight_stream":0.00048828125},)"
      R"("bytes":{"d2h":4096,"h2d":2048,"h2d_weights":1024}})";
  EXPECT_EQ(
      lines[1],
      R"({"event":"step","step":6,"loss":2.5,"lr":0.0009765625,"tokens":64,"skipped":false,)"
      R"("staleness_steps":3,"selected_ratio":0.125,"wall":0.75,"compute":0.5,"device_optimizer":0.0625,)" +
          stall);
  EXPECT_EQ(lines[2], R"({"event":"eval","step":6,"val_loss":2.25})");
  EXPECT_EQ(
      lines[3],
      R"({"event":"step","step":7,"loss":null,"lr":0.0009765625,"tokens":64,"skipped":true,)"
      R"("staleness_steps":3,"selected_ratio":0.125,"wall":0.75,"compute":0.5,"device_optimizer":0.0625,)" +
          stall);
  EXPECT_EQ(lines[4],
            R"({"event":"finish","steps":7,"interrupted":true,"wall":1.5,"stall":{"host_optimizer":0,)"
            R"("transfer_d2h":0,"transfer_h2d":0,"network":0,"allreduce":0,"data":0,"checkpoint":0.5,)"
            R"("checkpoint_upload":0,"weight_stream":0},)"
            R"("bytes":{"d2h":16,"h2d":8,"h2d_weights":4}})");
  EXPECT_EQ(lines[5],
            R"({"event":"summary","summary":{"cost_usd":0.5,"interrupted":true,"steps":7,"tokens":128}})");
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Every field StepLog writes comes back with its value: each line through the contract's
// from_json (every field of every event), and the file through parse_step_log (what the
// record keeps). A field the writer and the reader name differently reads as its default.
TEST(StepLogLines, EveryFieldTheWriterWritesIsReadBackWithItsValue) {
  const double before = unix_seconds();
  const fs::path path = write_golden_run("golden-fields");
  const double after = unix_seconds();
  const std::vector<std::string> lines = lines_of(read_file(path));
  ASSERT_EQ(lines.size(), 6u);
  std::vector<nlohmann::ordered_json> parsed;
  for (const std::string& l : lines) parsed.push_back(nlohmann::ordered_json::parse(l));
  const std::vector<std::string> causes = {"host_optimizer", "transfer_d2h", "transfer_h2d",
                                           "network",        "allreduce",    "data",
                                           "checkpoint",     "checkpoint_upload", "weight_stream"};
  const std::vector<double> step_stalls = {0.25,       0.0625,      0.03125,      0.015625,     0.0078125,
                                           0.00390625, 0.001953125, 0.0009765625, 0.00048828125};
  const auto expect_stall = [&](const std::vector<StallSeconds>& stall, const std::vector<double>& seconds) {
    ASSERT_EQ(stall.size(), causes.size());
    for (size_t c = 0; c < causes.size(); ++c) {
      EXPECT_EQ(stall[c].cause, causes[c]);
      EXPECT_EQ(stall[c].seconds, seconds[c]) << causes[c];
    }
  };
  const std::vector<std::pair<std::string, int64_t>> host_memory = {
      {"master", 400}, {"moments", 800}, {"accumulators", 1200},
      {"pinned", 96},  {"staging", 48},  {"host_total", 1 << 30}};

  ASSERT_EQ(event_of(parsed[0]), StartLine::kEvent);
  StartLine start;
  from_json(parsed[0], start);
  EXPECT_EQ(start.job, "golden \"run\"");
  EXPECT_EQ(start.start_step, 5);
  EXPECT_EQ(start.total_steps, 7);
  EXPECT_TRUE(start.fresh);
  EXPECT_EQ(start.world_size, 2);
  EXPECT_TRUE(start.device_is_cuda);
  EXPECT_EQ(start.tokens_per_step, 64);
  EXPECT_GE(start.time, std::floor(before));
  EXPECT_LE(start.time, after);
  EXPECT_EQ(start.host_memory, host_memory);
  ASSERT_TRUE(start.price.has_value());
  EXPECT_DOUBLE_EQ(start.price->usd_per_hour, 3.2 * 2 / 8);  // 2 of the instance's 8 GPUs
  EXPECT_EQ(start.price->instance_usd_per_hour, 3.2);
  EXPECT_EQ(start.price->gpus_of_instance, 8);
  EXPECT_EQ(start.price->instance, "p4d.24xlarge");
  EXPECT_EQ(start.price->source, "catalog");

  for (const size_t i : {1u, 3u}) {
    SCOPED_TRACE(lines[i]);
    ASSERT_EQ(event_of(parsed[i]), StepLine::kEvent);
    StepLine step;
    from_json(parsed[i], step);
    EXPECT_EQ(step.step, i == 1 ? 6 : 7);
    if (i == 1)
      EXPECT_EQ(step.loss, 2.5);
    else
      EXPECT_TRUE(std::isnan(step.loss));
    EXPECT_EQ(step.lr, 0.0009765625);
    EXPECT_EQ(step.tokens, 64);
    EXPECT_EQ(step.skipped, i == 3);
    EXPECT_EQ(step.staleness_steps, 3);
    EXPECT_EQ(step.selected_ratio, 0.125);
    EXPECT_EQ(step.wall, 0.75);
    EXPECT_EQ(step.compute, 0.5);
    EXPECT_EQ(step.device_optimizer, 0.0625);
    expect_stall(step.stall, step_stalls);
    EXPECT_EQ(step.bytes_d2h, 4096);
    EXPECT_EQ(step.bytes_h2d, 2048);
    EXPECT_EQ(step.bytes_h2d_weights, 1024);
  }

  ASSERT_EQ(event_of(parsed[2]), EvalLine::kEvent);
  EvalLine eval;
  from_json(parsed[2], eval);
  EXPECT_EQ(eval.step, 6);
  EXPECT_EQ(eval.val_loss, 2.25);

  ASSERT_EQ(event_of(parsed[4]), FinishLine::kEvent);
  FinishLine finish;
  from_json(parsed[4], finish);
  EXPECT_EQ(finish.steps, 7);
  EXPECT_TRUE(finish.interrupted);
  EXPECT_EQ(finish.wall, 1.5);
  expect_stall(finish.stall, {0, 0, 0, 0, 0, 0, 0.5, 0, 0});
  EXPECT_EQ(finish.bytes_d2h, 16);
  EXPECT_EQ(finish.bytes_h2d, 8);
  EXPECT_EQ(finish.bytes_h2d_weights, 4);

  ASSERT_EQ(event_of(parsed[5]), SummaryLine::kEvent);
  SummaryLine summary;
  from_json(parsed[5], summary);
  EXPECT_EQ(summary.summary, json({{"steps", 7}, {"tokens", 128}, {"cost_usd", 0.5}, {"interrupted", true}}));

  const RunRecord r = parse_step_log(read_file(path), path.string());
  EXPECT_TRUE(r.warnings.empty()) << r.warnings[0];
  EXPECT_EQ(r.job, "golden \"run\"");
  EXPECT_EQ(r.stall_causes, causes);
  ASSERT_EQ(r.steps.size(), 2u);
  for (const StepRecord& s : r.steps) {
    SCOPED_TRACE(s.step);
    EXPECT_TRUE(s.has_times);
    EXPECT_EQ(s.lr, 0.0009765625);
    EXPECT_EQ(s.tokens, 64);
    EXPECT_EQ(s.wall, 0.75);
    EXPECT_EQ(s.compute, 0.5);
    EXPECT_EQ(s.device_optimizer, 0.0625);
    EXPECT_EQ(s.stall, step_stalls);
    EXPECT_EQ(s.bytes_d2h, 4096);
    EXPECT_EQ(s.bytes_h2d, 2048);
    EXPECT_EQ(s.bytes_h2d_weights, 1024);
    EXPECT_EQ(s.segment, 0u);
  }
  EXPECT_EQ(r.steps[0].step, 6);
  EXPECT_EQ(r.steps[0].loss, 2.5);
  EXPECT_FALSE(r.steps[0].skipped);
  EXPECT_EQ(r.steps[1].step, 7);
  EXPECT_TRUE(std::isnan(r.steps[1].loss));
  EXPECT_TRUE(r.steps[1].skipped);
  EXPECT_EQ(r.evals, (std::vector<std::pair<int64_t, double>>{{6, 2.25}}));
  ASSERT_EQ(r.segments.size(), 1u);
  const RunSegment& seg = r.segments[0];
  EXPECT_EQ(seg.start_step, 5);
  EXPECT_EQ(seg.total_steps, 7);
  EXPECT_TRUE(seg.fresh);
  EXPECT_EQ(seg.world_size, 2);
  EXPECT_TRUE(seg.device_is_cuda);
  EXPECT_EQ(seg.tokens_per_step, 64);
  EXPECT_EQ(seg.started_unix_seconds, start.time);
  EXPECT_EQ(seg.host_memory, host_memory);
  ASSERT_TRUE(seg.usd_per_hour.has_value());
  EXPECT_DOUBLE_EQ(*seg.usd_per_hour, 3.2 * 2 / 8);
  EXPECT_EQ(seg.price_instance, "p4d.24xlarge");
  EXPECT_EQ(seg.price_source, "catalog");
  EXPECT_EQ(seg.steps_run, 2);
  EXPECT_EQ(seg.last_step, 7);
  EXPECT_EQ(seg.step_wall_seconds, 1.5);
  EXPECT_EQ(seg.step_stall_seconds, 2 * 0.37451171875);  // the nine causes' sum, twice
  EXPECT_EQ(seg.step_bytes_d2h, 8192);
  EXPECT_EQ(seg.step_bytes_h2d, 4096);
  EXPECT_EQ(seg.step_bytes_h2d_weights, 2048);
  EXPECT_TRUE(seg.finished);
  EXPECT_TRUE(seg.interrupted);  // the finish line's, and the summary's
  EXPECT_EQ(seg.finish_wall_seconds, 1.5);
  EXPECT_EQ(seg.finish_stall_seconds, 0.5);
  EXPECT_EQ(seg.finish_bytes_d2h, 16);
  EXPECT_EQ(seg.finish_bytes_h2d, 8);
  EXPECT_EQ(seg.finish_bytes_h2d_weights, 4);
  ASSERT_TRUE(seg.summary.has_value());
  EXPECT_EQ(*seg.summary, summary.summary);
}

// --- processes ---

struct Child {
  int code = -1;  // exit status; 128 + signal; -1: killed at the deadline
  std::string out, err;
};

// Runs argv (PATH searched) in its own process group with stdout and stderr to files; at
// the deadline the group is killed (SIGKILL).
Child run_child(const std::vector<std::string>& args, double timeout_s) {
  static int serial = 0;
  const fs::path base = scratch_dir() / ("child-" + std::to_string(++serial));
  fs::create_directories(scratch_dir());
  const std::string out = base.string() + ".out", err = base.string() + ".err";
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    if (!freopen(out.c_str(), "w", stdout) || !freopen(err.c_str(), "w", stderr)) _exit(126);
    if (!freopen("/dev/null", "r", stdin)) _exit(126);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  Child c;
  if (pid < 0) return c;
  setpgid(pid, pid);  // (either side may win the race; both set the same group)
  int status = 0;
  bool exited = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!exited) {
    kill(-pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else {
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  c.out = read_file(out);
  c.err = read_file(err);
  return c;
}

const std::string kZenflow = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";

TEST(ReportCli, NotARunOrAnUnwritableOutIsExitTwoNamingThePath) {
  const fs::path empty = fresh_dir("cli-empty");
  Child c = run_child({kZenflow, "report", empty.string()}, 60);
  EXPECT_EQ(c.code, 2) << c.err;
  EXPECT_NE(c.err.find(empty.string() + ": not a zenflow run directory"), std::string::npos) << c.err;
  c = run_child({kZenflow, "report", (empty / "nope").string()}, 60);
  EXPECT_EQ(c.code, 2) << c.err;
  EXPECT_NE(c.err.find((empty / "nope").string() + ": no such directory"), std::string::npos) << c.err;

  const fs::path run = fresh_dir("cli-run");
  write_file(run / "steps.jsonl", start_line(0) + step_line(1, 4) + step_line(2, 3) + "{\"event\":\"st");
  c = run_child({kZenflow, "report", run.string(), "--out", (empty / "no-dir" / "r.html").string()}, 60);
  EXPECT_EQ(c.code, 2) << c.err;
  EXPECT_NE(c.err.find((empty / "no-dir" / "r.html").string()), std::string::npos) << c.err;
  c = run_child({kZenflow, "report", run.string(), "--out", empty.string()}, 60);
  EXPECT_EQ(c.code, 2) << c.err;

  // A killed run's file: the page from its complete lines, the default path in RUN_DIR, no
  // temporary file left.
  c = run_child({kZenflow, "report", run.string()}, 60);
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_EQ(c.out, (run / "report.html").string() + "\n");
  EXPECT_NE(c.err.find("line 4 is incomplete"), std::string::npos) << c.err;
  EXPECT_NE(read_file(run / "report.html").find("id=\"steps\" data-value=\"2\""), std::string::npos);
  for (const auto& e : fs::directory_iterator(run))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
}

// --- the page in a browser ---

struct Image {
  int width = 0, height = 0;
  std::vector<unsigned char> rgb;  // 3 bytes a pixel
};

uint32_t be32(const unsigned char* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

// An 8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes), or "why not" in *error.
Image decode_png(const std::string& png, std::string* error) {
  Image img;
  if (png.size() < 8 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) {
    *error = "not a PNG";
    return img;
  }
  std::string idat;
  int depth = 0, type = 0, interlace = 0;
  for (size_t at = 8; at + 12 <= png.size();) {
    const auto* p = reinterpret_cast<const unsigned char*>(png.data() + at);
    const uint32_t len = be32(p);
    const std::string kind = png.substr(at + 4, 4);
    if (at + 12 + len > png.size()) break;
    if (kind == "IHDR") {
      img.width = static_cast<int>(be32(p + 8));
      img.height = static_cast<int>(be32(p + 12));
      depth = p[16];
      type = p[17];
      interlace = p[20];
    } else if (kind == "IDAT") {
      idat.append(png, at + 8, len);
    }
    at += 12 + len;
  }
  const int channels = type == 6 ? 4 : type == 2 ? 3 : 0;
  if (depth != 8 || channels == 0 || interlace != 0 || img.width <= 0 || img.height <= 0) {
    *error =
        "unsupported PNG (depth " + std::to_string(depth) + ", colour type " + std::to_string(type) + ")";
    return img;
  }
  const size_t stride = static_cast<size_t>(img.width) * channels;
  std::vector<unsigned char> raw((stride + 1) * static_cast<size_t>(img.height));
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      raw_len != raw.size()) {
    *error = "IDAT does not inflate to the image's size";
    return img;
  }
  std::vector<unsigned char> cur(stride), prev(stride, 0);
  img.rgb.resize(static_cast<size_t>(img.width) * img.height * 3);
  for (int y = 0; y < img.height; ++y) {
    const unsigned char* row = raw.data() + static_cast<size_t>(y) * (stride + 1);
    const int filter = row[0];
    for (size_t i = 0; i < stride; ++i) {
      const int a = i >= static_cast<size_t>(channels) ? cur[i - channels] : 0;
      const int b = prev[i];
      const int c = i >= static_cast<size_t>(channels) ? prev[i - channels] : 0;
      int pred = 0;
      if (filter == 1) pred = a;
      if (filter == 2) pred = b;
      if (filter == 3) pred = (a + b) / 2;
      if (filter == 4) {
        const int pa = std::abs(b - c), pb = std::abs(a - c), pc = std::abs(a + b - 2 * c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      cur[i] = static_cast<unsigned char>(row[1 + i] + pred);
    }
    for (int x = 0; x < img.width; ++x)
      for (int k = 0; k < 3; ++k)
        img.rgb[(static_cast<size_t>(y) * img.width + x) * 3 + k] =
            cur[static_cast<size_t>(x) * channels + k];
    std::swap(cur, prev);
  }
  return img;
}

struct Region {
  int x = 0, y = 0, w = 0, h = 0;
};

struct RegionStats {
  int64_t pixels = 0;
  int64_t non_background = 0;           // not white-ish
  int64_t colours = 0;                  // distinct colours at 4 bits a channel
  std::map<std::string, int64_t> near;  // pixels within 40 of each named colour
};

RegionStats region_stats(const Image& img, const Region& r, const std::map<std::string, std::string>& named) {
  RegionStats s;
  std::vector<bool> seen(4096, false);
  std::map<std::string, std::array<int, 3>> want;
  for (const auto& [name, hex] : named) {
    const long v = std::strtol(hex.c_str() + 1, nullptr, 16);
    want[name] = {static_cast<int>((v >> 16) & 255), static_cast<int>((v >> 8) & 255),
                  static_cast<int>(v & 255)};
    s.near[name] = 0;
  }
  for (int y = std::max(0, r.y); y < std::min(img.height, r.y + r.h); ++y)
    for (int x = std::max(0, r.x); x < std::min(img.width, r.x + r.w); ++x) {
      const unsigned char* p = &img.rgb[(static_cast<size_t>(y) * img.width + x) * 3];
      ++s.pixels;
      if (p[0] < 240 || p[1] < 240 || p[2] < 240) ++s.non_background;
      const int q = (p[0] >> 4) << 8 | (p[1] >> 4) << 4 | (p[2] >> 4);
      if (!seen[q]) {
        seen[q] = true;
        ++s.colours;
      }
      for (const auto& [name, c] : want)
        if (std::abs(p[0] - c[0]) + std::abs(p[1] - c[1]) + std::abs(p[2] - c[2]) <= 40) ++s.near[name];
    }
  return s;
}

// The data-value and the text of the element with this id in the DOM Chromium dumped.
std::pair<std::string, std::string> figure(const std::string& dom, const std::string& id) {
  std::smatch m;
  if (std::regex_search(dom, m, std::regex("id=\"" + id + "\" data-value=\"([^\"]*)\">([^<]*)<")))
    return {m[1].str(), m[2].str()};
  return {"", ""};
}

std::string find_chromium() {
  for (const char* name : {"chromium", "chromium-browser"}) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    size_t at = 0;
    while (at <= dirs.size()) {
      const size_t colon = std::min(dirs.find(':', at), dirs.size());
      const fs::path candidate = fs::path(dirs.substr(at, colon - at)) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
      at = colon + 1;
    }
  }
  return "";
}

// Chromium with no network: in a network namespace of its own when this process may make
// one (root), and in any case with every proxy and host name pointed nowhere.
std::vector<std::string> offline_browser(const std::string& chromium, const fs::path& profile) {
  std::vector<std::string> cmd;
  if (::geteuid() == 0 && run_child({"unshare", "-n", "true"}, 20).code == 0) cmd = {"unshare", "-n"};
  cmd.insert(
      cmd.end(),
      {chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
       "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
       "--force-device-scale-factor=1", "--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND",
       "--user-data-dir=" + profile.string(), "--window-size=1280,2600", "--virtual-time-budget=10000"});
  return cmd;
}

json run_json(const Child& c) {
  const size_t brace = c.out.find('{');
  return brace == std::string::npos ? json() : json::parse(c.out.substr(brace), nullptr, false);
}

TEST(ReportBrowser, RealResumedRunRendersChartsAndTheRunsOwnNumbersOffline) {
  const std::string chromium = find_chromium();
  ASSERT_FALSE(chromium.empty())
      << "chromium is not installed: this test renders the report in headless Chromium; install it with "
         "`bash scripts/install-deps.sh --test-tools` (as root)";
  const fs::path dir = fresh_dir("e2e");
  const fs::path run_dir = dir / "run";
  write_file(dir / "job.yaml",
             "name: report-test\n"
             "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4,\n"
             "        intermediate_size: 64, max_position_embeddings: 32}}\n"
             "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
             "train: {steps: 6, micro_batch: 2, seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu,\n"
             "        eval_every: 4, eval_batches: 1}\n"
             "optimizer: {mode: zenflow, zenflow: {update_interval: 2, full_warm_up_rounds: 0, "
             "min_split_numel: 512}}\n"
             "checkpoint: {dir: " +
                 run_dir.string() +
                 ", every_steps: 0}\n"
                 "cost: {usd_per_hour: 3.6}\n");
  // Six steps, then resumed from step 6's (final) checkpoint to ten: two processes, one record.
  const Child first = run_child({kZenflow, "run", (dir / "job.yaml").string(), "--json", "--quiet"}, 180);
  ASSERT_EQ(first.code, 0) << first.err;
  const Child second = run_child(
      {kZenflow, "run", (dir / "job.yaml").string(), "--json", "--quiet", "--set", "train.steps=10"}, 180);
  ASSERT_EQ(second.code, 0) << second.err;
  const json a = run_json(first), b = run_json(second);
  ASSERT_TRUE(a.is_object() && b.is_object()) << first.out << second.out;
  ASSERT_EQ(b.at("start_step").get<int>(), 6) << second.err;

  const fs::path html = dir / "report.html";
  const Child rep = run_child({kZenflow, "report", run_dir.string(), "--out", html.string()}, 60);
  ASSERT_EQ(rep.code, 0) << rep.err;

  const fs::path png = dir / "report.png";
  std::vector<std::string> shot = offline_browser(chromium, dir / "profile-shot");
  shot.push_back("--screenshot=" + png.string());
  shot.push_back("file://" + html.string());
  const Child s = run_child(shot, 120);
  ASSERT_EQ(s.code, 0) << s.err;
  std::vector<std::string> dump = offline_browser(chromium, dir / "profile-dom");
  dump.push_back("--dump-dom");
  dump.push_back("file://" + html.string());
  const Child d = run_child(dump, 120);
  ASSERT_EQ(d.code, 0) << d.err;
  const std::string& dom = d.out;

  // The script ran and drew every chart: loss, step time, time breakdown, bytes, cost.
  EXPECT_EQ(dom.find("data-error="), std::string::npos) << dom.substr(0, 2000);
  EXPECT_NE(dom.find("data-charts=\"5\""), std::string::npos) << dom.substr(0, 2000);

  // The page's numbers are the runs' own (--json), exactly.
  auto value = [&](const std::string& id) { return figure(dom, id).first; };
  auto as_double = [&](const std::string& id) {
    const std::string v = value(id);
    EXPECT_FALSE(v.empty()) << "no figure " << id;
    return v.empty() ? NAN : std::strtod(v.c_str(), nullptr);
  };
  EXPECT_EQ(value("steps"), "10");
  EXPECT_EQ(figure(dom, "steps").second, "10 of 10");
  EXPECT_EQ(as_double("final-loss"), b.at("final_loss").get<double>());
  char shown[64];
  std::snprintf(shown, sizeof shown, "%.4f", b.at("final_loss").get<double>());
  EXPECT_EQ(figure(dom, "final-loss").second, shown);
  EXPECT_EQ(as_double("val-loss"), b.at("val_loss").get<double>());
  const int64_t tokens = a.at("tokens").get<int64_t>() + b.at("tokens").get<int64_t>();
  EXPECT_EQ(tokens, 10 * a.at("tokens_per_step").get<int64_t>());
  EXPECT_EQ(value("tokens"), std::to_string(tokens));
  const double cost = 0.0 + a.at("cost_usd").get<double>() + b.at("cost_usd").get<double>();
  EXPECT_GT(cost, 0);
  EXPECT_EQ(as_double("cost-usd"), cost);
  std::snprintf(shown, sizeof shown, "$%.6f", cost);
  EXPECT_EQ(figure(dom, "cost-usd").second, shown);
  EXPECT_EQ(as_double("usd-lost-to-stalls"),
            0.0 + a.at("usd_lost_to_stalls").get<double>() + b.at("usd_lost_to_stalls").get<double>());
  EXPECT_EQ(as_double("usd-per-1m-tokens"), cost * 1e6 / static_cast<double>(tokens));
  // PCIe bytes: the steps' and the ends' of both runs.
  for (const char* dir : {"d2h", "h2d"})
    EXPECT_EQ(value(std::string("bytes-") + dir),
              std::to_string(a.at("transfer_bytes").at(dir).get<int64_t>() +
                             b.at("transfer_bytes").at(dir).get<int64_t>()))
        << dir;

  // The screenshot: each chart's plot holds its series' colours, drawn.
  std::string error;
  const Image img = decode_png(read_file(png), &error);
  ASSERT_TRUE(error.empty()) << error;
  EXPECT_EQ(img.width, 1280);
  const std::map<std::string, std::map<std::string, std::string>> series = {
      {"chart-loss", {{"train loss", "#2563eb"}, {"validation loss", "#e11d48"}}},
      {"chart-step-time", {{"step time", "#0f766e"}}},
      {"chart-time", {{"compute", "#3b82f6"}}},
      {"chart-bytes", {{"d2h", "#db2777"}, {"h2d", "#0891b2"}}},
      {"chart-cost", {{"spent", "#16a34a"}}},
  };
  std::map<std::string, int64_t> non_background;
  for (const auto& [id, colours] : series) {
    std::smatch m;
    ASSERT_TRUE(
        std::regex_search(dom, m, std::regex("id=\"" + id + "\" data-rect=\"(\\d+),(\\d+),(\\d+),(\\d+)\"")))
        << id << " has no drawn plot";
    const Region r{std::stoi(m[1]), std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4])};
    ASSERT_LE(r.y + r.h, img.height) << id << " is below the screenshot";
    ASSERT_GT(r.w * r.h, 10000) << id;
    const RegionStats st = region_stats(img, r, colours);
    EXPECT_GT(st.non_background, st.pixels / 50) << id << ": " << st.non_background << " of " << st.pixels;
    EXPECT_GE(st.colours, 4) << id;
    for (const auto& [name, count] : st.near) EXPECT_GT(count, 40) << id << ": too few pixels of " << name;
    non_background[id] = st.non_background;
  }
  // The breakdown stacks filled bands up to the step time that the step-time chart draws
  // as a line: far more of its plot is painted.
  EXPECT_GT(non_background["chart-time"], 2 * non_background["chart-step-time"]);
  // A blank region of the page (below the last section) is blank to the same measure.
  const RegionStats blank = region_stats(img, Region{0, img.height - 60, img.width, 60}, {});
  EXPECT_LT(blank.non_background, blank.pixels / 50);
}

}  // namespace
}  // namespace zenflow::report
