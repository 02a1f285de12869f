// steps.jsonl's lines (common/report/step_log_lines.h) without a run: every event's fields
// survive format_line and from_json with their values, reading takes what older, damaged or
// hand-edited lines hold without throwing, and a line that cannot be written whole is not
// written. (StepLog writing them and parse_step_log reading them: tests/test_report.cpp.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "common/report/step_log_lines.h"

namespace zenflow::report {
namespace {

using Json = nlohmann::ordered_json;

// The line as text and parsed back, after checking that it is one whole line of its event.
template <typename Line>
Json written(const Line& line) {
  char buf[1024];
  const int n = format_line(line, buf, static_cast<int>(sizeof buf));
  EXPECT_GT(n, 0);
  const std::string text(buf, n > 0 ? static_cast<size_t>(n) : 0);
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
  const Json j = Json::parse(text);
  EXPECT_EQ(event_of(j), Line::kEvent) << text;
  return j;
}
Json written(const StartLine& line) { return Json::parse(format_line(line)); }
Json written(const SummaryLine& line) { return Json::parse(format_line(line)); }

template <typename Line>
Line read(const Json& j) {
  Line line;
  from_json(j, line);
  return line;
}

void expect_same_stall(const std::vector<StallSeconds>& got, const std::vector<StallSeconds>& wrote) {
  ASSERT_EQ(got.size(), wrote.size());
  for (size_t i = 0; i < wrote.size(); ++i) {
    EXPECT_EQ(got[i].cause, wrote[i].cause);
    EXPECT_EQ(got[i].seconds, wrote[i].seconds) << wrote[i].cause;
  }
}

TEST(StepLogLines, StartLineRoundTripsEveryField) {
  StartLine s;
  s.job = "tiny \"llama\" ü";
  s.start_step = 40;
  s.total_steps = 100;
  s.fresh = true;
  s.world_size = 4;
  s.device_is_cuda = true;
  s.tokens_per_step = 8192;
  s.time = 1733480000.25;
  s.host_memory = {{host_memory_kind::kMaster, 1}, {host_memory_kind::kStaging, 2}, {"other", 3}};
  s.price = StartPrice{1.5, 6.0, 4, "g5.12xlarge", "catalog row"};
  const StartLine r = read<StartLine>(written(s));
  EXPECT_EQ(r.job, s.job);
  EXPECT_EQ(r.start_step, 40);
  EXPECT_EQ(r.total_steps, 100);
  EXPECT_TRUE(r.fresh);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_TRUE(r.device_is_cuda);
  EXPECT_EQ(r.tokens_per_step, 8192);
  EXPECT_EQ(r.time, 1733480000.25);
  EXPECT_EQ(r.host_memory, s.host_memory);  // in the written order, not sorted
  ASSERT_TRUE(r.price.has_value());
  EXPECT_EQ(r.price->usd_per_hour, 1.5);
  EXPECT_EQ(r.price->instance_usd_per_hour, 6.0);
  EXPECT_EQ(r.price->gpus_of_instance, 4);
  EXPECT_EQ(r.price->instance, "g5.12xlarge");
  EXPECT_EQ(r.price->source, "catalog row");

  // Not priced, and a spec rate (no instance): null and null.
  s.price.reset();
  EXPECT_TRUE(written(s).at("price").is_null());
  EXPECT_FALSE(read<StartLine>(written(s)).price.has_value());
  s.price = StartPrice{2.0, 2.0, 0, "", "cost.usd_per_hour"};
  EXPECT_TRUE(written(s).at("price").at("instance").is_null());
  EXPECT_EQ(read<StartLine>(written(s)).price->instance, "");
}

TEST(StepLogLines, StepLineRoundTripsEveryFieldToTheLastBit) {
  StepLine s;
  s.step = 12;
  s.loss = 0.1;  // not exact in binary: 17 digits must read back as the same double
  s.lr = 3e-4;
  s.tokens = 4096;
  s.skipped = true;
  s.staleness_steps = 2;
  s.selected_ratio = 1.0 / 3;
  s.wall = 0.7;
  s.compute = 0.3;
  s.device_optimizer = 1e-9;
  s.stall = {{"host_optimizer", 0.01}, {"data", 2.0 / 3}, {"checkpoint", 0}};
  s.bytes_d2h = 123456789012;
  s.bytes_h2d = 7;
  const StepLine r = read<StepLine>(written(s));
  EXPECT_EQ(r.step, 12);
  EXPECT_EQ(r.loss, 0.1);
  EXPECT_EQ(r.lr, 3e-4);
  EXPECT_EQ(r.tokens, 4096);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(r.staleness_steps, 2);
  EXPECT_EQ(r.selected_ratio, 1.0 / 3);
  EXPECT_EQ(r.wall, 0.7);
  EXPECT_EQ(r.compute, 0.3);
  EXPECT_EQ(r.device_optimizer, 1e-9);
  expect_same_stall(r.stall, s.stall);
  EXPECT_EQ(r.bytes_d2h, 123456789012);
  EXPECT_EQ(r.bytes_h2d, 7);

  // A non-finite number is written as null and read as not recorded.
  s.loss = INFINITY;
  s.stall[1].seconds = NAN;
  const Json j = written(s);
  EXPECT_TRUE(j.at("loss").is_null());
  EXPECT_TRUE(j.at("stall").at("data").is_null());
  EXPECT_TRUE(std::isnan(read<StepLine>(j).loss));
  EXPECT_TRUE(std::isnan(read<StepLine>(j).stall[1].seconds));
}

TEST(StepLogLines, EvalFinishAndSummaryLinesRoundTripEveryField) {
  EvalLine e;
  e.step = 30;
  e.val_loss = 1.0 / 7;
  const EvalLine er = read<EvalLine>(written(e));
  EXPECT_EQ(er.step, 30);
  EXPECT_EQ(er.val_loss, 1.0 / 7);

  FinishLine f;
  f.steps = 31;
  f.interrupted = true;
  f.wall = 12.5;
  f.stall = {{"host_optimizer", 0.5}, {"checkpoint", 3.25}};
  f.bytes_d2h = 1 << 20;
  f.bytes_h2d = 1 << 21;
  const FinishLine fr = read<FinishLine>(written(f));
  EXPECT_EQ(fr.steps, 31);
  EXPECT_TRUE(fr.interrupted);
  EXPECT_EQ(fr.wall, 12.5);
  expect_same_stall(fr.stall, f.stall);
  EXPECT_EQ(fr.bytes_d2h, 1 << 20);
  EXPECT_EQ(fr.bytes_h2d, 1 << 21);

  SummaryLine s;
  s.summary = {{"steps", 31}, {"cost_usd", 0.125}, {"interrupted", true}, {"job", "j"}};
  const Json j = written(s);
  EXPECT_EQ(event_of(j), SummaryLine::kEvent);
  EXPECT_EQ(read<SummaryLine>(j).summary, s.summary);
}

// Files come from killed runs, older versions and hand edits: what a line lacks or holds
// in another type reads as not recorded (numbers) or the default, never as an exception.
TEST(StepLogLines, ReadingTakesWhatALineHoldsAndTrustsNothing) {
  const StepLine step = read<StepLine>(Json::parse(
      R"({"event":"step","step":"3","loss":null,"lr":"0.1","tokens":99.9,"skipped":1,"wall":true,)"
      R"("stall":{"host_optimizer":"x","data":2},"bytes":[1,2],"a key from a newer version":{}})"));
  EXPECT_EQ(step.step, 0);
  EXPECT_TRUE(std::isnan(step.loss));
  EXPECT_TRUE(std::isnan(step.lr));
  EXPECT_EQ(step.tokens, 99);  // a floating-point integer is truncated
  EXPECT_FALSE(step.skipped);
  EXPECT_TRUE(std::isnan(step.wall));
  EXPECT_TRUE(std::isnan(step.compute));  // absent
  ASSERT_EQ(step.stall.size(), 2u);       // a cause is kept even when its seconds are not a number
  EXPECT_EQ(step.stall[0].cause, "host_optimizer");
  EXPECT_TRUE(std::isnan(step.stall[0].seconds));
  EXPECT_EQ(step.stall[1].seconds, 2);
  EXPECT_EQ(step.bytes_d2h, 0);

  const StartLine start = read<StartLine>(Json::parse(
      R"({"event":"start","job":7,"host_memory":{"master":5,"moments":1.5,"pinned":"x","staging":6},"price":"free"})"));
  EXPECT_EQ(start.job, "");
  EXPECT_EQ(start.world_size, 1);  // absent: one process
  EXPECT_TRUE(std::isnan(start.time));
  EXPECT_EQ(start.host_memory, (std::vector<std::pair<std::string, int64_t>>{{"master", 5}, {"staging", 6}}));
  EXPECT_FALSE(start.price.has_value());
  const StartLine priced = read<StartLine>(Json::parse(R"({"price":{"source":"s"}})"));
  ASSERT_TRUE(priced.price.has_value());
  EXPECT_TRUE(std::isnan(priced.price->usd_per_hour));
  EXPECT_EQ(priced.price->source, "s");

  const FinishLine finish =
      read<FinishLine>(Json::parse(R"({"event":"finish","stall":[],"bytes":{"h2d":4}})"));
  EXPECT_TRUE(finish.stall.empty());
  EXPECT_EQ(finish.bytes_h2d, 4);
  EXPECT_TRUE(read<SummaryLine>(Json::parse(R"({"event":"summary","summary":[1]})")).summary.is_null());
  EXPECT_EQ(read<EvalLine>(Json::parse("[]")).step, 0);  // not an object: all defaults
  EXPECT_EQ(event_of(Json::parse(R"({"event":5})")), "");
}

TEST(StepLogLines, ALineThatDoesNotFitOrCannotBeWrittenAsIsIsNotWritten) {
  StepLine s;
  s.step = 1;
  s.stall = {{"host_optimizer", 0.5}};
  char buf[1024];
  const int n = format_line(s, buf, static_cast<int>(sizeof buf));
  ASSERT_GT(n, 0);
  for (int cap = 0; cap <= n; ++cap) EXPECT_EQ(format_line(s, buf, cap), -1) << cap;  // n + 1: its NUL
  EXPECT_EQ(format_line(s, buf, n + 1), n);
  // A cause is written as is (no escaping per step), so one that needs escaping is refused.
  s.stall[0].cause = "host\"optimizer";
  EXPECT_EQ(format_line(s, buf, static_cast<int>(sizeof buf)), -1);
  s.stall[0].cause = "";
  EXPECT_EQ(format_line(s, buf, static_cast<int>(sizeof buf)), -1);
}

}  // namespace
}  // namespace zenflow::report
