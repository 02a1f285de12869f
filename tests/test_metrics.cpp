// Metrics registry, text exposition 0.0.4 and the /metrics + /healthz server (common/metrics).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <map>
#include <new>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/allocation_counter.h"
#include "common/metrics/exposition.h"
#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/version.h"

using zenflow::test_support::g_allocations;
using zenflow::test_support::g_count_allocations;

namespace zenflow::metrics {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The what() of the std::invalid_argument `f` throws ("" if it throws nothing).
std::string invalid_argument_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

TEST(MetricsExposition, GoldenTextWithEscapingNonFiniteValuesAndHistogram) {
  MetricsRegistry registry;
  auto& requests = registry.counter("zenflow_requests_total", "Requests served", {"method", "path"});
  requests.with({"POST", "say \"hi\"\\now\nnext"}).inc(1.5);
  requests.with({"GET", "/a"}).inc(3);
  registry.gauge("zenflow_selected_ratio", "Fraction of columns selected").with({}).set(0.5);
  auto& odd = registry.gauge("zenflow_odd_values", "Non-finite values", {"case"});
  odd.with({"neg_inf"}).set(-kInf);
  odd.with({"nan"}).set(kNaN);
  odd.with({"pos_inf"}).set(kInf);
  Histogram& steps =
      registry.histogram("zenflow_step_duration_seconds", "Step wall time", {"rank"}, {0.1, 1, 10})
          .with({"0"});
  for (double v : {0.05, 0.1, 5.0, 100.0}) steps.observe(v);
  // A family without series is left out, HELP and TYPE included.
  registry.counter("zenflow_unused_total", "Never touched", {"job_id"});

  EXPECT_EQ(render_text(registry), R"golden(# HELP zenflow_odd_values Non-finite values
# TYPE zenflow_odd_values gauge
zenflow_odd_values{case="nan"} NaN
zenflow_odd_values{case="neg_inf"} -Inf
zenflow_odd_values{case="pos_inf"} +Inf
# HELP zenflow_requests_total Requests served
# TYPE zenflow_requests_total counter
zenflow_requests_total{method="GET",path="/a"} 3
zenflow_requests_total{method="POST",path="say \"hi\"\\now\nnext"} 1.5
# HELP zenflow_selected_ratio Fraction of columns selected
# TYPE zenflow_selected_ratio gauge
zenflow_selected_ratio 0.5
# HELP zenflow_step_duration_seconds Step wall time
# TYPE zenflow_step_duration_seconds histogram
zenflow_step_duration_seconds_bucket{rank="0",le="0.1"} 2
zenflow_step_duration_seconds_bucket{rank="0",le="1"} 2
zenflow_step_duration_seconds_bucket{rank="0",le="10"} 3
zenflow_step_duration_seconds_bucket{rank="0",le="+Inf"} 4
zenflow_step_duration_seconds_sum{rank="0"} 105.15
zenflow_step_duration_seconds_count{rank="0"} 4
)golden");
}

TEST(MetricsExposition, HistogramWithoutLabelsAndNanObservationGoToInf) {
  MetricsRegistry registry;
  Histogram& h = registry.histogram("zenflow_queue_wait_seconds", "Queue wait", {}, {0.5, 2}).with({});
  h.observe(-3);  // below every bound: the first bucket
  h.observe(2);   // exactly on a bound: that bucket
  h.observe(kNaN);
  EXPECT_EQ(render_text(registry), R"(# HELP zenflow_queue_wait_seconds Queue wait
# TYPE zenflow_queue_wait_seconds histogram
zenflow_queue_wait_seconds_bucket{le="0.5"} 1
zenflow_queue_wait_seconds_bucket{le="2"} 2
zenflow_queue_wait_seconds_bucket{le="+Inf"} 3
zenflow_queue_wait_seconds_sum NaN
zenflow_queue_wait_seconds_count 3
)");
  const HistogramValue v = h.value();
  EXPECT_EQ(v.bucket_counts, (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(v.count(), 3u);
}

TEST(MetricsExposition, HelpEscapesBackslashAndNewlineButNotQuotes) {
  MetricsRegistry registry;
  registry.gauge("zenflow_x", "First line\nsecond \\ line, \"quoted\"").with({}).set(2);
  EXPECT_EQ(render_text(registry),
            "# HELP zenflow_x First line\\nsecond \\\\ line, \"quoted\"\n"
            "# TYPE zenflow_x gauge\n"
            "zenflow_x 2\n");
  EXPECT_EQ(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");
  EXPECT_EQ(escape_label_value("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
}

TEST(MetricsExposition, Utf8LabelValuesPassThroughUnescaped) {
  MetricsRegistry registry;
  registry.gauge("zenflow_g", "g", {"name"}).with({"na\xC3\xAFve \xE2\x82\xAC"}).set(1);
  EXPECT_EQ(render_text(registry),
            "# HELP zenflow_g g\n# TYPE zenflow_g gauge\nzenflow_g{name=\"na\xC3\xAFve \xE2\x82\xAC\"} 1\n");
}

TEST(MetricsExposition, ValuesAreIntegersWhenExactOtherwiseShortestRoundTrip) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(-0.0), "0");
  EXPECT_EQ(format_value(3), "3");
  EXPECT_EQ(format_value(-12), "-12");
  EXPECT_EQ(format_value(1e15), "1000000000000000");
  EXPECT_EQ(format_value(9007199254740992.0), "9007199254740992");
  EXPECT_EQ(format_value(1e20), "1e+20");
  EXPECT_EQ(format_value(0.5), "0.5");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(0.05 + 0.1), "0.15000000000000002");
  EXPECT_EQ(format_value(1.0 / 3), "0.3333333333333333");
  EXPECT_EQ(format_value(123456.789), "123456.789");
  EXPECT_EQ(format_value(1e-7), "1e-07");
  EXPECT_EQ(format_value(-2.5), "-2.5");
  EXPECT_EQ(format_value(kInf), "+Inf");
  EXPECT_EQ(format_value(-kInf), "-Inf");
  EXPECT_EQ(format_value(kNaN), "NaN");
  for (double v : {0.1, 1.0 / 3, 6.02214076e23, 5e-324, 1.7976931348623157e308}) {
    EXPECT_EQ(std::strtod(format_value(v).c_str(), nullptr), v) << format_value(v);
  }
}

TEST(MetricsExposition, EmptyRegistryRendersNothing) {
  MetricsRegistry registry;
  EXPECT_EQ(render_text(registry), "");
}

TEST(MetricsRegistry, InvalidNamesAreRejectedNamingTheMetricAndTheRule) {
  MetricsRegistry r;
  const std::vector<std::pair<std::function<void()>, std::string>> cases = {
      {[&] { r.gauge("", "h"); }, R"(metric "": invalid name, must match [a-zA-Z_:][a-zA-Z0-9_:]*)"},
      {[&] { r.gauge("1zenflow", "h"); },
       R"(metric "1zenflow": invalid name, must match [a-zA-Z_:][a-zA-Z0-9_:]*)"},
      {[&] { r.gauge("zenflow-loss", "h"); },
       R"(metric "zenflow-loss": invalid name, must match [a-zA-Z_:][a-zA-Z0-9_:]*)"},
      {[&] { r.gauge("zenflow loss", "h"); },
       R"(metric "zenflow loss": invalid name, must match [a-zA-Z_:][a-zA-Z0-9_:]*)"},
      {[&] { r.gauge("zenflow_l\xC3\xB6ss", "h"); },
       "metric \"zenflow_l\xC3\xB6ss\": invalid name, must match [a-zA-Z_:][a-zA-Z0-9_:]*"},
      {[&] { r.counter("zenflow_steps", "h"); },
       R"(metric "zenflow_steps": a counter's name must end in _total)"},
      {[&] { r.gauge("zenflow_steps_total", "h"); },
       R"(metric "zenflow_steps_total": only counters' names end in _total, this is a gauge)"},
      {[&] { r.histogram("zenflow_seconds_total", "h", {}, {1}); },
       R"(metric "zenflow_seconds_total": only counters' names end in _total, this is a histogram)"},
      {[&] { r.gauge("zenflow_g", ""); }, R"(metric "zenflow_g": help text is empty)"},
      {[&] { r.gauge("zenflow_g", "bad \xFF byte"); }, R"(metric "zenflow_g": help text is not valid UTF-8)"},
      {[&] { r.gauge("zenflow_g", "overlong \xC0\xAF"); },
       R"(metric "zenflow_g": help text is not valid UTF-8)"},
      {[&] { r.gauge("zenflow_g", "surrogate \xED\xA0\x80"); },
       R"(metric "zenflow_g": help text is not valid UTF-8)"},
      {[&] { r.gauge("zenflow_g", "truncated \xE2\x82"); },
       R"(metric "zenflow_g": help text is not valid UTF-8)"},
      {[&] { r.gauge("zenflow_g", "h", {"1rank"}); },
       R"(metric "zenflow_g": invalid label name "1rank", must match [a-zA-Z_][a-zA-Z0-9_]*)"},
      {[&] { r.gauge("zenflow_g", "h", {"job-id"}); },
       R"(metric "zenflow_g": invalid label name "job-id", must match [a-zA-Z_][a-zA-Z0-9_]*)"},
      {[&] { r.gauge("zenflow_g", "h", {"a:b"}); },
       R"(metric "zenflow_g": invalid label name "a:b", must match [a-zA-Z_][a-zA-Z0-9_]*)"},
      {[&] { r.gauge("zenflow_g", "h", {""}); },
       R"(metric "zenflow_g": invalid label name "", must match [a-zA-Z_][a-zA-Z0-9_]*)"},
      {[&] { r.gauge("zenflow_g", "h", {"__name__"}); },
       R"(metric "zenflow_g": label name "__name__" is reserved (starts with __))"},
      {[&] {
         r.gauge("zenflow_g", "h", {"rank", "job_id", "rank"});
       },
       R"(metric "zenflow_g": label name "rank" appears twice)"},
      {[&] { r.histogram("zenflow_h", "h", {"le"}, {1}); },
       R"(metric "zenflow_h": label name "le" is reserved for histogram buckets)"},
      {[&] { r.histogram("zenflow_h", "h", {}, {}); },
       R"(metric "zenflow_h": a histogram needs at least one bucket bound (+Inf is implicit))"},
      {[&] {
         r.histogram("zenflow_h", "h", {}, {1, 1});
       },
       R"(metric "zenflow_h": bucket bounds must be strictly increasing, got 1 after 1)"},
      {[&] {
         r.histogram("zenflow_h", "h", {}, {0.5, 0.25});
       },
       R"(metric "zenflow_h": bucket bounds must be strictly increasing, got 0.25 after 0.5)"},
      {[&] {
         r.histogram("zenflow_h", "h", {}, {1, kInf});
       },
       R"(metric "zenflow_h": bucket bounds must be finite (+Inf is implicit), got +Inf)"},
      {[&] { r.histogram("zenflow_h", "h", {}, {kNaN}); },
       R"(metric "zenflow_h": bucket bounds must be finite (+Inf is implicit), got NaN)"},
  };
  for (const auto& [f, expected] : cases) EXPECT_EQ(invalid_argument_message(f), expected);
  // Nothing was registered by the failed calls.
  EXPECT_TRUE(r.collect().empty());

  // What the rules allow: colons in metric names, "le" outside histograms, underscores first.
  EXPECT_NO_THROW(r.gauge("zenflow:recorded:ratio", "h"));
  EXPECT_NO_THROW(r.gauge("_zenflow_g", "h", {"le", "_x"}));
  EXPECT_NO_THROW(r.counter("zenflow_c_total", "h", {"job_id", "rank"}));
}

TEST(MetricsRegistry, SameRegistrationReturnsTheSameFamilyAnyDifferenceIsAnError) {
  MetricsRegistry r;
  auto& a = r.counter("zenflow_steps_total", "Steps done", {"job_id", "rank"});
  auto& b = r.counter("zenflow_steps_total", "Steps done", {"job_id", "rank"});
  EXPECT_EQ(&a, &b);
  a.with({"j1", "0"}).inc(2);
  EXPECT_EQ(b.with({"j1", "0"}).value(), 2);
  auto& h = r.histogram("zenflow_lat_seconds", "Latency", {"rank"}, {0.1, 1});
  EXPECT_EQ(&h, &r.histogram("zenflow_lat_seconds", "Latency", {"rank"}, {0.1, 1}));

  EXPECT_EQ(invalid_argument_message([&] {
              r.counter("zenflow_steps_total", "Steps", {"job_id", "rank"});
            }),
            R"(metric "zenflow_steps_total": already registered with help "Steps done", not "Steps")");
  EXPECT_EQ(invalid_argument_message([&] { r.counter("zenflow_steps_total", "Steps done", {"job_id"}); }),
            R"(metric "zenflow_steps_total": already registered with labels {job_id,rank}, not {job_id})");
  EXPECT_EQ(
      invalid_argument_message([&] {
        r.counter("zenflow_steps_total", "Steps done", {"rank", "job_id"});
      }),
      R"(metric "zenflow_steps_total": already registered with labels {job_id,rank}, not {rank,job_id})");
  r.gauge("zenflow_loss", "Loss");
  EXPECT_EQ(invalid_argument_message([&] { r.histogram("zenflow_loss", "Loss", {}, {1}); }),
            R"(metric "zenflow_loss": already registered as a gauge, not a histogram)");
  EXPECT_EQ(invalid_argument_message([&] {
              r.histogram("zenflow_lat_seconds", "Latency", {"rank"}, {0.1, 2});
            }),
            R"(metric "zenflow_lat_seconds": already registered with buckets {0.1,1}, not {0.1,2})");
  // Sample names are unique across families, both ways round.
  EXPECT_EQ(
      invalid_argument_message([&] { r.gauge("zenflow_lat_seconds_count", "c"); }),
      R"(metric "zenflow_lat_seconds_count": name zenflow_lat_seconds_count is already used by histogram "zenflow_lat_seconds")");
  r.gauge("zenflow_q_sum", "q");
  EXPECT_EQ(invalid_argument_message([&] { r.histogram("zenflow_q", "q", {}, {1}); }),
            R"(metric "zenflow_q": name zenflow_q_sum is already used by gauge "zenflow_q_sum")");
}

TEST(MetricsRegistry, LabelValuesMustMatchTheLabelNames) {
  MetricsRegistry r;
  auto& steps = r.counter("zenflow_steps_total", "Steps done", {"job_id", "rank"});
  EXPECT_EQ(invalid_argument_message([&] { steps.with({"j1"}); }),
            R"(metric "zenflow_steps_total": expected 2 label values {job_id,rank}, got 1)");
  EXPECT_EQ(invalid_argument_message([&] {
              steps.with({"j1", "0", "x"});
            }),
            R"(metric "zenflow_steps_total": expected 2 label values {job_id,rank}, got 3)");
  EXPECT_EQ(invalid_argument_message([&] {
              steps.with({"j1", "\xFF"});
            }),
            R"(metric "zenflow_steps_total": value of label "rank" is not valid UTF-8)");
  EXPECT_NO_THROW(steps.with({"", ""}));  // empty values are allowed
}

TEST(MetricsRegistry, HandlesAreStableAcrossLaterRegistrations) {
  MetricsRegistry r;
  auto& family = r.gauge("zenflow_g", "g", {"k"});
  Gauge& first = family.with({"first"});
  first.set(7);
  for (int i = 0; i < 1000; ++i) family.with({std::to_string(i)}).set(i);
  for (int i = 0; i < 100; ++i) r.gauge("zenflow_g" + std::to_string(i), "g");
  EXPECT_EQ(&family.with({"first"}), &first);
  EXPECT_EQ(first.value(), 7);
  EXPECT_EQ(r.collect().size(), 101u);
}

TEST(MetricsRegistry, CounterIgnoresNegativeAndNanGaugeGoesBothWays) {
  MetricsRegistry r;
  Counter& c = r.counter("zenflow_c_total", "c").with({});
  c.inc();
  c.inc(2.5);
  c.inc(-1);
  c.inc(kNaN);
  EXPECT_EQ(c.value(), 3.5);
  Gauge& g = r.gauge("zenflow_g", "g").with({});
  g.set(10);
  g.inc(2);
  g.dec(5);
  g.dec();
  EXPECT_EQ(g.value(), 6);
  Histogram& h = r.histogram("zenflow_h", "h", {}, {1}).with({});
  // The update paths promise never to throw (the training thread calls them).
  static_assert(noexcept(c.inc()));
  static_assert(noexcept(g.set(1)));
  static_assert(noexcept(g.inc()));
  static_assert(noexcept(g.dec()));
  static_assert(noexcept(h.observe(1)));
}

TEST(MetricsRegistry, ConcurrentUpdatesFromEightThreadsSumExactly) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100000;
  MetricsRegistry r;
  auto& counters = r.counter("zenflow_ops_total", "ops", {"kind"});
  auto& gauges = r.gauge("zenflow_level", "level");
  auto& histograms = r.histogram("zenflow_sizes", "sizes", {}, {0.5, 1.5, 2.5});
  std::atomic<bool> done{false};
  std::vector<double> scraped;  // the counter as successive scrapes saw it
  std::thread scraper([&] {
    while (!done.load()) {
      for (const FamilySnapshot& f : r.collect()) {
        if (f.name == "zenflow_ops_total" && !f.series.empty()) scraped.push_back(f.series[0].value);
        if (f.name == "zenflow_sizes" && !f.series.empty()) {
          const HistogramValue& h = f.series[0].histogram;
          ASSERT_EQ(h.bucket_counts.size(), 4u);
        }
      }
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      // with() from every thread: all of them must get the same series.
      Counter& c = counters.with({"shared"});
      Gauge& g = gauges.with({});
      Histogram& h = histograms.with({});
      for (int i = 0; i < kPerThread; ++i) {
        c.inc();
        g.inc(2);
        g.dec();
        h.observe(i % 4);  // 0, 1, 2, 3: one per bucket, +Inf included
      }
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  scraper.join();

  EXPECT_EQ(counters.with({"shared"}).value(), double(kThreads) * kPerThread);
  EXPECT_EQ(gauges.with({}).value(), double(kThreads) * kPerThread);
  const HistogramValue h = histograms.with({}).value();
  const uint64_t quarter = uint64_t(kThreads) * kPerThread / 4;
  EXPECT_EQ(h.bucket_counts, (std::vector<uint64_t>{quarter, quarter, quarter, quarter}));
  EXPECT_EQ(h.count(), uint64_t(kThreads) * kPerThread);
  EXPECT_EQ(h.sum, double(quarter) * (0 + 1 + 2 + 3));
  for (size_t i = 1; i < scraped.size(); ++i) EXPECT_LE(scraped[i - 1], scraped[i]);
  EXPECT_EQ(r.collect().at(0).series.size(), 1u);  // zenflow_level: one series, not eight
}

TEST(MetricsRegistry, UpdatesOnAnExistingHandleDoNotAllocate) {
  MetricsRegistry r;
  Counter& c = r.counter("zenflow_steps_total", "Steps", {"job_id", "rank"}).with({"j1", "0"});
  Gauge& g = r.gauge("zenflow_loss", "Loss", {"job_id", "rank"}).with({"j1", "0"});
  Histogram& h = r.histogram("zenflow_step_duration_seconds", "Step", {"job_id", "rank"},
                             exponential_buckets(0.001, 2, 16))
                     .with({"j1", "0"});
  // The hook counts: a deliberate allocation is seen.
  g_allocations = 0;
  g_count_allocations = true;
  std::string* probe = new std::string(100, 'x');
  g_count_allocations = false;
  delete probe;
  ASSERT_GE(g_allocations.load(), 1);

  g_allocations = 0;
  g_count_allocations = true;
  for (int i = 0; i < 10000; ++i) {
    c.inc();
    g.set(i * 0.5);
    g.inc(1);
    h.observe(i * 1e-4);
  }
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_EQ(c.value(), 10000);
  EXPECT_EQ(h.value().count(), 10000u);
}

TEST(MetricsRegistry, ExponentialBuckets) {
  EXPECT_EQ(exponential_buckets(0.25, 2, 4), (std::vector<double>{0.25, 0.5, 1, 2}));
  EXPECT_EQ(invalid_argument_message([] { exponential_buckets(0, 2, 3); }),
            "exponential_buckets: need start > 0, factor > 1 and count >= 1, got start 0, factor 2, count 3");
  EXPECT_THROW(exponential_buckets(1, 1, 3), std::invalid_argument);
  EXPECT_THROW(exponential_buckets(1, 2, 0), std::invalid_argument);
}

TEST(MetricsRegistry, BuildInfoCarriesTheProjectVersion) {
  EXPECT_TRUE(std::regex_match(std::string(zenflow::kVersion), std::regex(R"(\d+\.\d+\.\d+)")))
      << zenflow::kVersion;
  MetricsRegistry r;
  Gauge& info = register_build_info(r, zenflow::kVersion);
  EXPECT_EQ(&register_build_info(r, zenflow::kVersion), &info);
  EXPECT_EQ(render_text(r),
            std::string("# HELP zenflow_build_info zenflow build information; the value is always 1\n"
                        "# TYPE zenflow_build_info gauge\n"
                        "zenflow_build_info{version=\"") +
                zenflow::kVersion + "\"} 1\n");
}

TEST(MetricsCollectors, SamplesMergeIntoDeclaredFamiliesInLabelOrder) {
  MetricsRegistry r;
  auto& staleness = r.gauge("zenflow_staleness_steps", "Staleness", {"job_id", "rank"});
  staleness.with({"j1", "0"}).set(1);
  r.histogram("zenflow_host_optimizer_step_duration_seconds", "Host step", {"rank"}, {0.5, 1, 2});
  r.add_collector([](SampleSink& sink) {
    sink.add("zenflow_staleness_steps", {"j1", "10"}, 3);
    sink.add("zenflow_staleness_steps", {"j1", "1"}, 2);
    sink.add_histogram("zenflow_host_optimizer_step_duration_seconds", {"1"}, {{1, 0, 2, 1}, 7.5});
  });
  const std::string expected = R"(# HELP zenflow_host_optimizer_step_duration_seconds Host step
# TYPE zenflow_host_optimizer_step_duration_seconds histogram
zenflow_host_optimizer_step_duration_seconds_bucket{rank="1",le="0.5"} 1
zenflow_host_optimizer_step_duration_seconds_bucket{rank="1",le="1"} 1
zenflow_host_optimizer_step_duration_seconds_bucket{rank="1",le="2"} 3
zenflow_host_optimizer_step_duration_seconds_bucket{rank="1",le="+Inf"} 4
zenflow_host_optimizer_step_duration_seconds_sum{rank="1"} 7.5
zenflow_host_optimizer_step_duration_seconds_count{rank="1"} 4
# HELP zenflow_staleness_steps Staleness
# TYPE zenflow_staleness_steps gauge
zenflow_staleness_steps{job_id="j1",rank="0"} 1
zenflow_staleness_steps{job_id="j1",rank="1"} 2
zenflow_staleness_steps{job_id="j1",rank="10"} 3
)";
  EXPECT_EQ(render_text(r), expected);
  EXPECT_EQ(render_text(r), expected);  // collectors run again on every scrape, same result
}

TEST(MetricsCollectors, BadSamplesFailTheScrapeNamingTheMetric) {
  MetricsRegistry r;
  r.gauge("zenflow_g", "g", {"rank"}).with({"0"}).set(1);
  r.counter("zenflow_c_total", "c");
  r.histogram("zenflow_h", "h", {}, {1});
  const std::vector<std::pair<std::function<void(SampleSink&)>, std::string>> cases = {
      {[](SampleSink& s) { s.add("zenflow_nope", {}, 1); },
       R"(metric "zenflow_nope": a collector's sample for a family that is not registered)"},
      {[](SampleSink& s) { s.add("zenflow_g", {"0"}, 2); },
       R"(metric "zenflow_g": a collector added series {0}, which already exists)"},
      {[](SampleSink& s) {
         s.add("zenflow_g", {"1"}, 2);
         s.add("zenflow_g", {"1"}, 3);
       },
       R"(metric "zenflow_g": a collector added series {1}, which already exists)"},
      {[](SampleSink& s) { s.add("zenflow_g", {}, 2); },
       R"(metric "zenflow_g": expected 1 label values {rank}, got 0)"},
      {[](SampleSink& s) { s.add("zenflow_c_total", {}, -1); },
       R"(metric "zenflow_c_total": a collector's counter value must be >= 0, got -1)"},
      {[](SampleSink& s) { s.add("zenflow_h", {}, 1); },
       R"(metric "zenflow_h": a collector added a counter/gauge sample to a histogram)"},
      {[](SampleSink& s) {
         s.add_histogram("zenflow_g", {"2"}, {{1}, 1});
       },
       R"(metric "zenflow_g": a collector added a histogram sample to a gauge)"},
      {[](SampleSink& s) {
         s.add_histogram("zenflow_h", {}, {{1, 2, 3}, 1});
       },
       R"(metric "zenflow_h": a collector's histogram has 3 bucket counts, expected 2 (the bounds and +Inf))"},
  };
  for (const auto& [collector, expected] : cases) {
    const auto id = r.add_collector(collector);
    EXPECT_EQ(invalid_argument_message([&] { r.collect(); }), expected);
    r.remove_collector(id);
  }
  // With the bad collectors gone, scrapes work again.
  EXPECT_EQ(render_text(r), "# HELP zenflow_g g\n# TYPE zenflow_g gauge\nzenflow_g{rank=\"0\"} 1\n");
}

TEST(MetricsCollectors, RemoveWaitsForARunningCollectorAndStopsIt) {
  MetricsRegistry r;
  r.gauge("zenflow_g", "g", {"rank"});
  std::atomic<bool> entered{false}, release{false}, finished{false}, removed{false};
  std::atomic<int> calls{0};
  const auto id = r.add_collector([&](SampleSink& s) {
    calls++;
    entered = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s.add("zenflow_g", {"1"}, 5);
    finished = true;
  });
  std::string during;
  std::thread scrape([&] { during = render_text(r); });
  while (!entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  bool finished_when_removed = false;
  std::thread remover([&] {
    r.remove_collector(id);
    finished_when_removed = finished.load();
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(removed.load());  // still waiting for the running collector
  release = true;
  scrape.join();
  remover.join();
  EXPECT_TRUE(finished_when_removed);
  EXPECT_EQ(during, "# HELP zenflow_g g\n# TYPE zenflow_g gauge\nzenflow_g{rank=\"1\"} 5\n");
  EXPECT_EQ(render_text(r), "");
  EXPECT_EQ(calls.load(), 1);
}

// A minimal HTTP/1.1 client over a plain socket, so the test sees exactly what a scraper gets.
struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval timeout{10, 0};  // a hung server fails the test instead of hanging it
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    return -1;
  }
  return fd;
}

HttpResponse http_request(int port, const std::string& method, const std::string& path) {
  HttpResponse response;
  const int fd = connect_to(port);
  if (fd < 0) {
    ADD_FAILURE() << "connect to 127.0.0.1:" << port << " failed: errno " << errno;
    return response;
  }
  const std::string request =
      method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, n);
  close(fd);
  const size_t header_end = raw.find("\r\n\r\n");
  if (header_end == std::string::npos) {
    ADD_FAILURE() << "no complete response: " << raw;
    return response;
  }
  response.body = raw.substr(header_end + 4);
  size_t line_start = raw.find("\r\n") + 2;
  response.status = std::atoi(raw.substr(raw.find(' ') + 1, 3).c_str());
  while (line_start < header_end) {
    const size_t line_end = raw.find("\r\n", line_start);
    const std::string line = raw.substr(line_start, line_end - line_start);
    const size_t colon = line.find(':');
    std::string name = line.substr(0, colon);
    for (char& ch : name) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    response.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
    line_start = line_end + 2;
  }
  return response;
}

TEST(MetricsServer, ServesMetricsAndHealthOnAFreePortAndStopsOnDestruction) {
  MetricsRegistry registry;
  register_build_info(registry, zenflow::kVersion);
  registry.counter("zenflow_steps_total", "Steps done", {"job_id", "rank"}).with({"j1", "0"}).inc(42);
  int port = 0;
  {
    MetricsServer server(registry);
    port = server.port();
    ASSERT_GT(port, 0);
    EXPECT_EQ(server.host(), "127.0.0.1");

    const HttpResponse metrics = http_request(port, "GET", "/metrics");
    EXPECT_EQ(metrics.status, 200);
    EXPECT_EQ(metrics.header("content-type"), "text/plain; version=0.0.4; charset=utf-8");
    EXPECT_EQ(metrics.body, render_text(registry));
    EXPECT_EQ(metrics.header("content-length"), std::to_string(metrics.body.size()));
    EXPECT_NE(metrics.body.find("zenflow_steps_total{job_id=\"j1\",rank=\"0\"} 42\n"), std::string::npos);

    const HttpResponse head = http_request(port, "HEAD", "/metrics");
    EXPECT_EQ(head.status, 200);
    EXPECT_EQ(head.body, "");
    EXPECT_EQ(head.header("content-length"), std::to_string(metrics.body.size()));

    HttpResponse health = http_request(port, "GET", "/healthz");
    EXPECT_EQ(health.status, 200);
    EXPECT_EQ(health.body, "ok\n");
    server.set_health_check([] { return MetricsServer::Health{false, "host optimizer lost"}; });
    health = http_request(port, "GET", "/healthz");
    EXPECT_EQ(health.status, 503);
    EXPECT_EQ(health.body, "unhealthy: host optimizer lost\n");
    server.set_health_check([]() -> MetricsServer::Health { throw std::runtime_error("boom"); });
    health = http_request(port, "GET", "/healthz");
    EXPECT_EQ(health.status, 503);
    EXPECT_EQ(health.body, "unhealthy: health check failed: boom\n");
    server.set_health_check([] { return MetricsServer::Health{}; });
    EXPECT_EQ(http_request(port, "GET", "/healthz").status, 200);

    EXPECT_EQ(http_request(port, "GET", "/").status, 404);
    EXPECT_EQ(http_request(port, "GET", "/nope").status, 404);
    EXPECT_EQ(http_request(port, "GET", "/metrics/extra").status, 404);
    EXPECT_EQ(http_request(port, "GET", "/metricsx").status, 404);
    const HttpResponse post = http_request(port, "POST", "/metrics");
    EXPECT_EQ(post.status, 405);
    EXPECT_EQ(post.header("allow"), "GET, HEAD");
  }
  const int fd = connect_to(port);
  const int connect_errno = errno;
  if (fd >= 0) close(fd);
  EXPECT_LT(fd, 0) << "port " << port << " still accepts connections after the server was destroyed";
  EXPECT_EQ(connect_errno, ECONNREFUSED);
}

TEST(MetricsServer, CollectorErrorIsA500WithTheReason) {
  MetricsRegistry registry;
  registry.add_collector([](SampleSink& s) { s.add("zenflow_missing", {}, 1); });
  MetricsServer server(registry);
  const HttpResponse r = http_request(server.port(), "GET", "/metrics");
  EXPECT_EQ(r.status, 500);
  EXPECT_EQ(
      r.body,
      "metrics: metric \"zenflow_missing\": a collector's sample for a family that is not registered\n");
}

TEST(MetricsServer, PagesAnswerWhatTheirHandlerReturnsForTheRestOfThePath) {
  MetricsRegistry registry;
  MetricsServer server(registry);
  std::vector<std::string> seen;
  server.add_page("/jobs/", [&seen](const std::string& rest) {
    seen.push_back(rest);
    if (rest == "boom") throw std::runtime_error("no such page today");
    return MetricsServer::Page{rest == "j1/report" ? 200 : 404, "text/html; charset=utf-8", "<p>" + rest + "</p>"};
  });
  const HttpResponse ok = http_request(server.port(), "GET", "/jobs/j1/report");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "<p>j1/report</p>");
  EXPECT_EQ(ok.header("content-type"), "text/html; charset=utf-8");
  EXPECT_EQ(http_request(server.port(), "GET", "/jobs/other").status, 404);
  const HttpResponse failed = http_request(server.port(), "GET", "/jobs/boom");
  EXPECT_EQ(failed.status, 500);
  EXPECT_EQ(failed.body, "error: no such page today\n");
  EXPECT_EQ(http_request(server.port(), "POST", "/jobs/j1/report").status, 405);
  EXPECT_EQ(http_request(server.port(), "GET", "/metrics").status, 200);  // unaffected
  EXPECT_EQ(seen, (std::vector<std::string>{"j1/report", "other", "boom"}));
}

TEST(MetricsServer, PortInUseAndBadArgumentsThrowNamingTheAddress) {
  MetricsRegistry registry;
  MetricsServer first(registry);
  const std::string address = "127.0.0.1:" + std::to_string(first.port());
  try {
    MetricsServer second(registry, "127.0.0.1", first.port());
    ADD_FAILURE() << "a second server bound " << address;
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("metrics server: cannot listen on " + address + ": ", 0), 0u) << message;
    EXPECT_NE(message.find("Address already in use"), std::string::npos) << message;
  }
  EXPECT_EQ(invalid_argument_message([&] { MetricsServer s(registry, "127.0.0.1", 70000); }),
            "metrics server: port must be in [0, 65535], got 70000");
  EXPECT_EQ(invalid_argument_message([&] { MetricsServer s(registry, "127.0.0.1,0.0.0.0", 0); }),
            "metrics server: invalid listen host \"127.0.0.1,0.0.0.0\"");
  EXPECT_THROW(MetricsServer(registry, "256.1.1.1", 0), std::runtime_error);
  EXPECT_EQ(http_request(first.port(), "GET", "/healthz").status, 200);  // the first is unaffected
}

// Not an assertion (speed is never asserted): what an update costs the training thread.
TEST(MetricsFigures, UpdateCost) {
  MetricsRegistry r;
  Counter& c = r.counter("zenflow_steps_total", "Steps", {"job_id", "rank"}).with({"j1", "0"});
  Histogram& h =
      r.histogram("zenflow_step_duration_seconds", "Step", {}, exponential_buckets(0.001, 2, 16)).with({});
  constexpr int kN = 10000000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) c.inc();
  auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < kN; ++i) h.observe((i & 1023) * 1e-4);
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(c.value(), kN);
  std::printf("[figure] counter inc: %.2f ns\n",
              std::chrono::duration<double, std::nano>(t1 - t0).count() / kN);
  std::printf("[figure] histogram observe (16 buckets): %.2f ns\n",
              std::chrono::duration<double, std::nano>(t2 - t1).count() / kN);
}

}  // namespace
}  // namespace zenflow::metrics
