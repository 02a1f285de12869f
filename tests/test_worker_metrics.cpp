// The worker agent's /metrics: merging and relabelling expositions (common/metrics/
// exposition_merge.h), the agent's scrape of its ranks (worker/agent/worker_metrics.h), and
// a coordinator + `zenflow-worker --metrics-port` training a 2-rank job, scraped mid-run.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/exposition.h"
#include "common/metrics/exposition_merge.h"
#include "common/metrics/http_server.h"
#include "common/metrics/registry.h"
#include "common/version.h"
#include "tests/support/http_client.h"
#include "tests/support/service_cluster.h"
#include "tests/support/tiny_job.h"
#include "worker/agent/worker_metrics.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using metrics::ExpositionError;
using metrics::merge_expositions;
using metrics::MergeStats;
using metrics::parse_exposition;
using metrics::ParsedExposition;

// The what() of the ExpositionError parsing `text` throws ("" if it parses).
std::string parse_error(const std::string& text) {
  try {
    parse_exposition(text);
  } catch (const ExpositionError& e) {
    return e.what();
  }
  return "";
}

ParsedExposition rank_exposition(const std::string& text, const std::string& job, int rank) {
  ParsedExposition e = parse_exposition(text);
  metrics::add_missing_labels(e, {{"job_id", job}, {"rank", std::to_string(rank)}});
  return e;
}

// --- merging ---

TEST(ExpositionMerge, TwoRanksFamiliesMergeUnderOneHelpAndTypeWithLabelsAddedOnlyWhereMissing) {
  const std::string agent =
      "# HELP zenflow_build_info zenflow build information; the value is always 1\n"
      "# TYPE zenflow_build_info gauge\n"
      "zenflow_build_info{version=\"1.2.3\"} 1\n"
      "# HELP zenflow_worker_ranks Rank processes this worker runs\n"
      "# TYPE zenflow_worker_ranks gauge\n"
      "zenflow_worker_ranks 2\n";
  // Rank 0 labels its own series (as RunMetrics does); its histogram's le stays last.
  const std::string rank0 =
      "# HELP zenflow_build_info zenflow build information; the value is always 1\n"
      "# TYPE zenflow_build_info gauge\n"
      "zenflow_build_info{version=\"1.2.3\"} 1\n"
      "# HELP zenflow_stall_seconds_total Time the device waited, by cause\n"
      "# TYPE zenflow_stall_seconds_total counter\n"
      "zenflow_stall_seconds_total{job_id=\"j-000001\",rank=\"0\",cause=\"data\"} 0.25\n"
      "# HELP zenflow_step_duration_seconds Wall time of a training step\n"
      "# TYPE zenflow_step_duration_seconds histogram\n"
      "zenflow_step_duration_seconds_bucket{job_id=\"j-000001\",rank=\"0\",le=\"0.5\"} 1\n"
      "zenflow_step_duration_seconds_bucket{job_id=\"j-000001\",rank=\"0\",le=\"+Inf\"} 3\n"
      "zenflow_step_duration_seconds_sum{job_id=\"j-000001\",rank=\"0\"} 3.5\n"
      "zenflow_step_duration_seconds_count{job_id=\"j-000001\",rank=\"0\"} 3\n";
  // Rank 1 labels nothing; an escaped label value and a HELP escape must survive the trip.
  const std::string rank1 =
      "# HELP zenflow_step_duration_seconds Wall time of a training step\n"
      "# TYPE zenflow_step_duration_seconds histogram\n"
      "zenflow_step_duration_seconds_bucket{le=\"0.5\"} 0\n"
      "zenflow_step_duration_seconds_bucket{le=\"+Inf\"} 2\n"
      "zenflow_step_duration_seconds_sum 4\n"
      "zenflow_step_duration_seconds_count 2\n"
      "# a comment line\n"
      "\n"
      "# HELP zenflow_odd Odd \\\\ help\\nsecond line\n"
      "# TYPE zenflow_odd gauge\n"
      "zenflow_odd{path=\"say \\\"hi\\\"\\\\now\\nnext\"} NaN 1700000000000\n"
      "# TYPE zenflow_stall_seconds_total counter\n"
      "zenflow_stall_seconds_total{cause=\"data\"} 1e-07\n";
  MergeStats stats;
  const std::string merged = merge_expositions(
      {parse_exposition(agent), rank_exposition(rank0, "j-000001", 0), rank_exposition(rank1, "j-000001", 1)},
      &stats);
  EXPECT_EQ(
      merged,
      "# HELP zenflow_build_info zenflow build information; the value is always 1\n"
      "# TYPE zenflow_build_info gauge\n"
      "zenflow_build_info{version=\"1.2.3\"} 1\n"
      "zenflow_build_info{job_id=\"j-000001\",rank=\"0\",version=\"1.2.3\"} 1\n"
      "# HELP zenflow_odd Odd \\\\ help\\nsecond line\n"
      "# TYPE zenflow_odd gauge\n"
      "zenflow_odd{job_id=\"j-000001\",rank=\"1\",path=\"say \\\"hi\\\"\\\\now\\nnext\"} NaN 1700000000000\n"
      "# HELP zenflow_stall_seconds_total Time the device waited, by cause\n"
      "# TYPE zenflow_stall_seconds_total counter\n"
      "zenflow_stall_seconds_total{job_id=\"j-000001\",rank=\"0\",cause=\"data\"} 0.25\n"
      "zenflow_stall_seconds_total{job_id=\"j-000001\",rank=\"1\",cause=\"data\"} 1e-07\n"
      "# HELP zenflow_step_duration_seconds Wall time of a training step\n"
      "# TYPE zenflow_step_duration_seconds histogram\n"
      "zenflow_step_duration_seconds_bucket{job_id=\"j-000001\",rank=\"0\",le=\"0.5\"} 1\n"
      "zenflow_step_duration_seconds_bucket{job_id=\"j-000001\",rank=\"0\",le=\"+Inf\"} 3\n"
      "zenflow_step_duration_seconds_sum{job_id=\"j-000001\",rank=\"0\"} 3.5\n"
      "zenflow_step_duration_seconds_count{job_id=\"j-000001\",rank=\"0\"} 3\n"
      "zenflow_step_duration_seconds_bucket{job_id=\"j-000001\",rank=\"1\",le=\"0.5\"} 0\n"
      "zenflow_step_duration_seconds_bucket{job_id=\"j-000001\",rank=\"1\",le=\"+Inf\"} 2\n"
      "zenflow_step_duration_seconds_sum{job_id=\"j-000001\",rank=\"1\"} 4\n"
      "zenflow_step_duration_seconds_count{job_id=\"j-000001\",rank=\"1\"} 2\n"
      "# HELP zenflow_worker_ranks Rank processes this worker runs\n"
      "# TYPE zenflow_worker_ranks gauge\n"
      "zenflow_worker_ranks 2\n");
  EXPECT_EQ(stats.families_dropped, 0);
  EXPECT_EQ(stats.samples_dropped, 0);
}

TEST(ExpositionMerge, OneRegistryRoundTripsByteForByte) {
  metrics::MetricsRegistry registry;
  metrics::register_build_info(registry, kVersion);
  registry.counter("zenflow_requests_total", "Requests, \\ and\nnewline", {"method", "path"})
      .with({"GET", "a\"b\\c\nd"})
      .inc(1.5);
  auto& h = registry.histogram("zenflow_step_duration_seconds", "Wall time", {"job_id", "rank"}, {0.1, 1, 10})
                .with({"j", "0"});
  h.observe(0.05);
  h.observe(5);
  registry.gauge("zenflow_loss", "Loss").with({}).set(-1e-300);
  const std::string text = metrics::render_text(registry);
  EXPECT_EQ(merge_expositions({parse_exposition(text)}), text);
}

TEST(ExpositionMerge, TypeConflictsAndDuplicateSeriesAreDroppedAndCounted) {
  const ParsedExposition a = parse_exposition(
      "# TYPE x gauge\nx{rank=\"0\",a=\"b\"} 1\n# TYPE h histogram\n"
      "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n");
  // x as a counter: the whole family goes; h_count as a gauge would collide with h's samples;
  // x{a="b",rank="0"} is x{rank="0",a="b"} again: a duplicate.
  const ParsedExposition b =
      parse_exposition("# TYPE x counter\nx{rank=\"1\"} 5\n# TYPE h_count gauge\nh_count 3\n");
  const ParsedExposition c = parse_exposition("# TYPE x gauge\nx{a=\"b\",rank=\"0\"} 2\nx{rank=\"2\"} 3\n");
  MergeStats stats;
  const std::string merged = merge_expositions({a, b, c}, &stats);
  EXPECT_EQ(merged,
            "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n"
            "# TYPE x gauge\nx{rank=\"0\",a=\"b\"} 1\nx{rank=\"2\"} 3\n");
  EXPECT_EQ(stats.families_dropped, 2);
  EXPECT_EQ(stats.samples_dropped, 1);
}

TEST(ExpositionMerge, MalformedExpositionsAreRejectedNamingTheLine) {
  EXPECT_EQ(parse_error("a 1\nb 2\na 3\n"),
            "line 3: samples of \"a\" appear in two places (split by another family)");
  EXPECT_EQ(parse_error("# TYPE a gauge\na 1\nb 2\n# HELP a A\n"),
            "line 4: family \"a\" appears in two places (split by another family)");
  EXPECT_EQ(parse_error("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nb 1\nh_sum 1\n"),
            "line 4: samples of \"h_sum\" appear in two places (split by another family)");
  EXPECT_EQ(parse_error("# TYPE h histogram\nh_bucket 1\n"),
            "line 2: bucket of histogram \"h\" without an le label");
  EXPECT_EQ(parse_error("# TYPE h histogram\nh 1\n"),
            "line 2: sample \"h\" of histogram \"h\" needs a _bucket, _sum or _count suffix");
  EXPECT_EQ(parse_error("x{a=\"1\\t\"} 1\n"),
            "line 1: bad escape in a label value (only \\\\, \\\" and \\n)");
  EXPECT_EQ(parse_error("x{a=\"1} 1\n"), "line 1: unterminated label value");
  EXPECT_EQ(parse_error("x{a=\"1\",a=\"2\"} 1\n"), "line 1: label \"a\" appears twice");
  EXPECT_EQ(parse_error("x{a=\"1\" 1\n"), "line 1: expected , or } after a label");
  EXPECT_EQ(parse_error("x{1a=\"1\"} 1\n"), "line 1: expected a label name");
  EXPECT_EQ(parse_error("x one\n"), "line 1: value \"one\" is not a float");
  EXPECT_EQ(parse_error("x 1 2.5\n"), "line 1: timestamp \"2.5\" is not an integer");
  EXPECT_EQ(parse_error("x 1 2 3\n"), "line 1: unexpected text after the timestamp");
  EXPECT_EQ(parse_error("x\n"), "line 1: expected a blank before the value");
  EXPECT_EQ(parse_error("<html>\n"), "line 1: expected a metric name");
  EXPECT_EQ(parse_error("# TYPE x widget\n"), "line 1: unknown TYPE for \"x\"");
  EXPECT_EQ(parse_error("# TYPE x gauge\n# TYPE x gauge\n"), "line 2: TYPE for \"x\" given twice");
  EXPECT_EQ(parse_error("# HELP x a\n# HELP x b\n"), "line 2: HELP for \"x\" given twice");
  EXPECT_EQ(parse_error("x 1\n# TYPE x gauge\n"), "line 2: TYPE for \"x\" after its samples");
  EXPECT_EQ(parse_error("x{a=\"\xff\"} 1\n"), "line 1: value of label \"a\" is not valid UTF-8");
  EXPECT_EQ(parse_exposition("x 1").families.size(), 1u);  // the last newline may be missing
  EXPECT_EQ(parse_error(std::string(100, '\n') + "x 1\n").size(), 0u);
  EXPECT_NE(parse_error("x 1\n" + std::string(65u << 20, ' ')).find("exceeds the limit"), std::string::npos);
  // Floats as Prometheus writes and reads them.
  for (const char* v : {"1", "-2", "+3", "0.5", ".5", "1e-07", "1E+20", "+Inf", "-Inf", "NaN", "inf"})
    EXPECT_EQ(parse_error(std::string("x ") + v + "\n"), "") << v;
  for (const char* v : {"0x10", "1e", "--1", "+-1", "nan(1)", "1,5"})
    EXPECT_NE(parse_error(std::string("x ") + v + "\n"), "") << v;
}

// --- the agent's scrape of its ranks, with ranks as in-process servers ---

// A listening socket that never accepts or answers: a rank too busy to reply.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 8);
    socklen_t len = sizeof addr;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

fs::path scratch(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("zenflow-wmetrics-" + std::to_string(getpid()) + "-" + name);
  fs::create_directories(dir);
  return dir;
}

void write_port(const fs::path& file, int port) { std::ofstream(file) << port << "\n"; }

double sample(const std::string& text, const std::string& series) {
  const size_t at = ("\n" + text).find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + series.size() + 1);
}

TEST(RankFetch, UnreachableSlowAndFailingRanksAreToldApartWithinOneDeadline) {
  metrics::MetricsRegistry registry;
  registry.gauge("zenflow_loss", "Loss").with({}).set(2);
  metrics::MetricsServer good(registry);
  metrics::MetricsServer failing([]() -> std::string { throw std::runtime_error("boom"); });
  SilentListener slow;
  const int closed = test_support::free_port();
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<agent::RankFetch> r =
      agent::fetch_rank_metrics({good.port(), closed, slow.port(), failing.port()}, 300ms);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].outcome, agent::RankFetch::Outcome::kOk);
  EXPECT_EQ(r[0].body, metrics::render_text(registry));
  EXPECT_EQ(r[1].outcome, agent::RankFetch::Outcome::kUnreachable);
  EXPECT_EQ(r[2].outcome, agent::RankFetch::Outcome::kTimeout);
  EXPECT_EQ(r[3].outcome, agent::RankFetch::Outcome::kBadResponse);  // a 500
  EXPECT_LT(seconds, 2.0);  // one deadline for all, not one each (a bound, not a speed figure)
  const std::vector<agent::RankFetch> small = agent::fetch_rank_metrics({good.port()}, 1s, /*max_bytes=*/4);
  EXPECT_EQ(small[0].outcome, agent::RankFetch::Outcome::kBadResponse);
}

TEST(WorkerMetrics, ScrapeMergesLiveRanksCountsBadOnesAndForgetsRemovedOnes) {
  const fs::path dir = scratch("scrape");
  metrics::MetricsRegistry r0, r1;
  for (auto* r : {&r0, &r1}) {
    metrics::register_build_info(*r, kVersion);
    r->counter("zenflow_steps_total", "Training steps done (skipped ones included)", {"job_id", "rank"})
        .with({"j-000007", r == &r0 ? "0" : "1"})
        .inc(r == &r0 ? 5 : 6);
  }
  metrics::MetricsServer s0(r0), s1(r1);
  metrics::MetricsServer garbage([] { return std::string("<html>not metrics</html>\n"); });
  agent::WorkerMetrics w(/*slots=*/4);
  write_port(dir / "r0", s0.port());
  write_port(dir / "r1", s1.port());
  write_port(dir / "bad", garbage.port());
  w.add_rank("j-000007", 1, 0, (dir / "r0").string());
  w.add_rank("j-000007", 1, 1, (dir / "r1").string());
  w.add_rank("j-000008", 1, 0, (dir / "bad").string());
  w.add_rank("j-000009", 1, 0, (dir / "not-yet").string());  // still starting: no port file
  w.heartbeat_rtt.observe(0.001);
  const std::string text = w.scrape();
  EXPECT_EQ(sample(text, "zenflow_steps_total{job_id=\"j-000007\",rank=\"0\"}"), 5) << text;
  EXPECT_EQ(sample(text, "zenflow_steps_total{job_id=\"j-000007\",rank=\"1\"}"), 6) << text;
  EXPECT_EQ(sample(text, "zenflow_build_info{version=\"" + std::string(kVersion) + "\"}"), 1) << text;
  EXPECT_EQ(sample(text, "zenflow_build_info{job_id=\"j-000007\",rank=\"1\",version=\"" +
                             std::string(kVersion) + "\"}"),
            1);
  EXPECT_EQ(sample(text, "zenflow_worker_slots"), 4);
  EXPECT_EQ(sample(text, "zenflow_worker_ranks"), 4);
  EXPECT_EQ(sample(text, "zenflow_worker_heartbeat_rtt_seconds_count"), 1);
  EXPECT_EQ(sample(text, "zenflow_worker_scrape_errors_total{reason=\"malformed\"}"), 1) << text;
  EXPECT_EQ(sample(text, "zenflow_worker_scrape_errors_total{reason=\"unreachable\"}"), 0);
  EXPECT_EQ(text.find("j-000008"), std::string::npos);
  EXPECT_EQ(text.find("j-000009"), std::string::npos);
  // One HELP and one TYPE per family, whatever the sources.
  size_t types = 0, from = 0;
  while ((from = text.find("# TYPE zenflow_steps_total ", from)) != std::string::npos) ++types, ++from;
  EXPECT_EQ(types, 1u);

  w.remove_rank("j-000007", 1, 1);
  fs::remove(dir / "r0");  // the port is read once: a rank keeps its port
  const std::string after = w.scrape();
  EXPECT_EQ(sample(after, "zenflow_steps_total{job_id=\"j-000007\",rank=\"0\"}"), 5);
  EXPECT_EQ(sample(after, "zenflow_steps_total{job_id=\"j-000007\",rank=\"1\"}"), -1) << after;
  EXPECT_EQ(sample(after, "zenflow_worker_ranks"), 3);
  EXPECT_EQ(sample(after, "zenflow_worker_scrape_errors_total{reason=\"malformed\"}"), 2);
  fs::remove_all(dir);
}

TEST(RankMetricsFlags, PortFileBelongsToOneRankProcessAndARankThatCannotServeStillTrains) {
  const fs::path dir = scratch("flags");
  test_support::write_file(dir / "job.yaml", test_support::tiny_job_spec("flags", 3));
  std::string out;
  // The local launcher would hand both ranks one file: refused before any rank starts.
  const int code =
      test_support::run(std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow run " + (dir / "job.yaml").string() +
                            " --nproc 2 --metrics-port-file " + (dir / "port").string() + " 2>&1",
                        &out);
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("--metrics-port-file belongs to one rank process"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir / "port"));
  // A rank that cannot serve (an address not on this host) trains without metrics.
  const int trained = test_support::run(
      std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow run " + (dir / "job.yaml").string() +
          " --quiet --set checkpoint.dir=" + (dir / "ckpt").string() +
          " --metrics-host 192.0.2.1 --metrics-port-file " + (dir / "port").string() + " 2>&1",
      &out);
  EXPECT_EQ(trained, 0) << out;
  EXPECT_NE(out.find("warning: no metrics for this rank: metrics server: cannot listen on 192.0.2.1:0"),
            std::string::npos)
      << out;
  EXPECT_FALSE(fs::exists(dir / "port"));
  fs::remove_all(dir);
}

// --- a coordinator and `zenflow-worker --metrics-port` training a 2-rank job ---

using test_support::Cluster;
using test_support::http_get;
using test_support::wait_until;

// Every sample line's family is the one whose TYPE came last, and no family is typed twice:
// "" when the exposition is valid in that respect, else the first offending line.
std::string split_or_repeated_family(const std::string& text) {
  std::set<std::string> typed;
  std::string current, type;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) {
      std::istringstream l(line.substr(7));
      l >> current >> type;
      if (!typed.insert(current).second) return line;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    const std::string name = line.substr(0, line.find_first_of("{ "));
    const bool ok = name == current ||
                    (type == "histogram" &&
                     (name == current + "_bucket" || name == current + "_sum" || name == current + "_count"));
    if (!ok) return line;
  }
  return "";
}

TEST(WorkerMetricsLive, OneScrapeOfTheWorkerShowsBothRanksWhileTrainingAndNoneAfter) {
  Cluster c("worker-metrics");
  c.start_coordinator();
  const int port = test_support::free_port();
  ASSERT_GT(port, 0);
  c.start_worker("w1", 2, {"--metrics-port", std::to_string(port)});
  // The agent's own series, before any job.
  std::string body;
  ASSERT_TRUE(wait_until(
      [&] {
        auto [status, b] = http_get(port, "/metrics", 5);
        body = b;
        return status == 200 && sample(b, "zenflow_worker_registrations_total") == 1;
      },
      30s))
      << body << c.worker("w1").output();
  EXPECT_EQ(sample(body, "zenflow_worker_slots"), 2);
  EXPECT_EQ(sample(body, "zenflow_worker_ranks"), 0);
  EXPECT_EQ(sample(body, "zenflow_build_info{version=\"" + std::string(kVersion) + "\"}"), 1) << body;
  EXPECT_EQ(http_get(port, "/healthz"), std::make_pair(200, std::string("ok\n")));

  std::string spec = test_support::tiny_job_spec("wmetrics", 100000);
  const std::string ckpt = "checkpoint: {every_steps: 0}\n";
  spec.replace(spec.find(ckpt), ckpt.size(),
               "checkpoint: {dir: " + (c.dir() / "ckpt").string() + ", every_steps: 0}\n");
  spec += "resources: {workers: 1, gpus_per_worker: 2, max_restarts: 0}\n";
  test_support::write_file(c.dir() / "job.yaml", spec);
  const std::string id = c.submit(c.dir() / "job.yaml");
  ASSERT_FALSE(id.empty()) << test_support::read_file(c.dir() / "cli.log");
  const std::string r0 = "zenflow_steps_total{job_id=\"" + id + "\",rank=\"0\"}";
  const std::string r1 = "zenflow_steps_total{job_id=\"" + id + "\",rank=\"1\"}";
  // Both ranks past step 2, and a heartbeat answered: a tiny job's ranks can take their
  // first steps before the agent's first heartbeat (up to an interval after it registers) returns.
  ASSERT_TRUE(wait_until(
      [&] {
        body = http_get(port, "/metrics", 5).second;
        return sample(body, r0) >= 2 && sample(body, r1) >= 2 &&
               sample(body, "zenflow_worker_heartbeat_rtt_seconds_count") > 0;
      },
      120s))
      << body << c.worker("w1").output();
  const double first0 = sample(body, r0), first1 = sample(body, r1);
  EXPECT_EQ(split_or_repeated_family(body), "") << body;
  EXPECT_EQ(sample(body, "zenflow_worker_ranks"), 2);
  EXPECT_GT(sample(body, "zenflow_worker_lease_renewals_total"), 0);
  EXPECT_EQ(sample(body, "zenflow_worker_scrape_errors_total{reason=\"malformed\"}"), 0);
  for (const char* rank : {"0", "1"}) {
    const std::string l = "{job_id=\"" + id + "\",rank=\"" + rank + "\"";
    EXPECT_GT(sample(body, "zenflow_step_duration_seconds_count" + l + "}"), 0) << body;
    EXPECT_GE(sample(body, "zenflow_exposed_stall_ratio" + l + "}"), 0) << body;
    EXPECT_GT(sample(body, "zenflow_host_memory_bytes" + l + ",kind=\"master\"}"), 0) << body;
    EXPECT_GT(sample(body, "zenflow_host_memory_bytes" + l + ",kind=\"host_total\"}"), 0) << body;
  }
  // Prometheus's own linter accepts the merged exposition, where it is installed.
  if (std::system("command -v promtool >/dev/null 2>&1") == 0) {
    const fs::path file = c.dir() / "scrape.txt";
    test_support::write_file(file, body);
    std::string lint;
    EXPECT_EQ(test_support::run("promtool check metrics < " + file.string() + " 2>&1", &lint), 0) << lint;
  }

  // Scrape figures (for the record; not asserted): time and size of a worker scrape.
  std::vector<double> ms;
  size_t bytes = 0;
  for (int i = 0; i < 10; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto [status, b] = http_get(port, "/metrics", 5);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (status == 200) {
      bytes = b.size();
      body = b;
    }
  }
  std::sort(ms.begin(), ms.end());
  std::printf("[ figures  ] worker scrape with 2 ranks: median %.2f ms, max %.2f ms, %zu bytes, %zu lines\n",
              ms[ms.size() / 2], ms.back(), bytes,
              static_cast<size_t>(std::count(body.begin(), body.end(), '\n')));
  // Both ranks' counters grow between scrapes.
  EXPECT_TRUE(wait_until(
      [&] {
        body = http_get(port, "/metrics", 5).second;
        return sample(body, r0) > first0 && sample(body, r1) > first1;
      },
      60s))
      << body;

  ASSERT_EQ(c.cli("cancel " + id), 0);
  ASSERT_TRUE(c.wait_state(id, "CANCELLED", 60s)) << c.status(id).dump();
  ASSERT_TRUE(wait_until(
      [&] {
        auto [status, b] = http_get(port, "/metrics", 5);
        body = b;
        return status == 200 && sample(b, "zenflow_worker_ranks") == 0;
      },
      30s))
      << body;
  EXPECT_EQ(body.find("job_id=\"" + id + "\""), std::string::npos) << body;
  EXPECT_EQ(sample(body, "zenflow_worker_slots"), 2);
}

}  // namespace
}  // namespace zenflow
