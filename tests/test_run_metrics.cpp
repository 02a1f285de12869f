// RunMetrics (the §7 worker metrics) and `zenflow run --metrics-port` scraped while it trains.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/allocation_counter.h"
#include "tests/support/http_client.h"
#include "common/metrics/exposition.h"
#include "common/metrics/registry.h"
#include "worker/rank/run_metrics.h"

using zenflow::test_support::g_allocations;
using zenflow::test_support::g_count_allocations;

namespace fs = std::filesystem;

namespace zenflow {
namespace {

using engine::StallCause;

// The step of index i (0, 1, 2) of the synthetic run: every field distinct, exact in binary.
TrainingStep synthetic_step(int i) {
  TrainingStep s;
  s.step = i + 1;
  s.times.wall_seconds = 0.5 * (i + 1);      // 0.5, 1, 1.5
  s.times.compute_seconds = 0.25 * (i + 1);  // 0.25, 0.5, 0.75
  s.times.device_optimizer_seconds = 0.125;
  s.times.stall_seconds[static_cast<int>(StallCause::kHostOptimizer)] = 0.0625 * (i + 1);
  s.times.stall_seconds[static_cast<int>(StallCause::kData)] = 0.03125;
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kD2H)] = 1000 * (i + 1);
  s.times.transfer_bytes[static_cast<int>(engine::Direction::kH2D)] = 4096;
  s.tokens = 64;
  s.loss = 4.0 - i;
  s.lr = 1e-3;
  s.skipped = i == 1;
  s.staleness_steps = i;
  s.selected_ratio = 0.25;
  s.host_step_seconds = i == 1 ? -1 : 0.75 * (i + 1);  // windows applied in steps 1 and 3
  return s;
}

RunFacts synthetic_facts() {
  RunFacts f;
  f.rank = 0;
  f.total_steps = 3;
  f.host_master_bytes = 400;
  f.host_moments_bytes = 800;
  f.host_accumulator_bytes = 800;
  f.host_staging_bytes = 96;
  f.host_total_memory_bytes = 1 << 30;
  return f;
}

bool has_line(const std::string& text, const std::string& line) {
  return ("\n" + text).find("\n" + line + "\n") != std::string::npos;
}

TEST(RunMetrics, ThreeStepsGiveExactCounterTotalsByCauseAndDirection) {
  metrics::MetricsRegistry registry;
  RunMetrics m(registry, "j");
  m.on_start(synthetic_facts());
  for (int i = 0; i < 3; ++i) m.on_step(synthetic_step(i));
  TrainingEnd end;
  end.steps = 3;
  end.finish.stall_seconds[static_cast<int>(StallCause::kCheckpoint)] = 2;  // final checkpoint
  end.finish.transfer_bytes[static_cast<int>(engine::Direction::kH2D)] = 100;
  m.on_finish(end);
  const std::string text = metrics::render_text(registry);
  const std::string l = "{job_id=\"j\",rank=\"0\"";
  for (const std::string& line : {
           "zenflow_steps_total" + l + "} 3",
           "zenflow_tokens_total" + l + "} 192",
           "zenflow_compute_seconds_total" + l + "} 1.5",
           "zenflow_device_optimizer_seconds_total" + l + "} 0.375",
           "zenflow_stall_seconds_total" + l + ",cause=\"host_optimizer\"} 0.375",
           "zenflow_stall_seconds_total" + l + ",cause=\"data\"} 0.09375",
           "zenflow_stall_seconds_total" + l + ",cause=\"checkpoint\"} 2",
           "zenflow_stall_seconds_total" + l + ",cause=\"transfer_d2h\"} 0",
           "zenflow_stall_seconds_total" + l + ",cause=\"transfer_h2d\"} 0",
           "zenflow_stall_seconds_total" + l + ",cause=\"network\"} 0",
           "zenflow_stall_seconds_total" + l + ",cause=\"allreduce\"} 0",
           "zenflow_transfer_bytes_total" + l + ",direction=\"d2h\"} 6000",
           "zenflow_transfer_bytes_total" + l + ",direction=\"h2d\"} 12388",
           "zenflow_skipped_steps_total" + l + "} 1",
           // Gauges: the last step's. Its stall is 0.1875 + 0.03125 of 1.5 s wall.
           "zenflow_exposed_stall_ratio" + l + "} 0.14583333333333334",
           "zenflow_loss" + l + "} 2",
           "zenflow_staleness_steps" + l + "} 2",
           "zenflow_selected_ratio" + l + "} 0.25",
           "zenflow_train_steps" + l + "} 3",
           "zenflow_pinned_host_bytes" + l + "} 0",
           "zenflow_host_memory_bytes" + l + ",kind=\"master\"} 400",
           "zenflow_host_memory_bytes" + l + ",kind=\"moments\"} 800",
           "zenflow_host_memory_bytes" + l + ",kind=\"accumulators\"} 800",
           "zenflow_host_memory_bytes" + l + ",kind=\"pinned\"} 0",
           "zenflow_host_memory_bytes" + l + ",kind=\"staging\"} 96",
           "zenflow_host_memory_bytes" + l + ",kind=\"host_total\"} 1073741824",
           // Histogram: 0.5 and 1 fall in their own bounds (le is inclusive), 1.5 in le=2.
           "zenflow_step_duration_seconds_bucket" + l + ",le=\"0.2\"} 0",
           "zenflow_step_duration_seconds_bucket" + l + ",le=\"0.5\"} 1",
           "zenflow_step_duration_seconds_bucket" + l + ",le=\"1\"} 2",
           "zenflow_step_duration_seconds_bucket" + l + ",le=\"2\"} 3",
           "zenflow_step_duration_seconds_bucket" + l + ",le=\"+Inf\"} 3",
           "zenflow_step_duration_seconds_sum" + l + "} 3",
           "zenflow_step_duration_seconds_count" + l + "} 3",
           // Two host windows applied (0.75 s and 2.25 s); the step without one adds nothing.
           "zenflow_host_optimizer_step_duration_seconds_bucket" + l + ",le=\"0.5\"} 0",
           "zenflow_host_optimizer_step_duration_seconds_bucket" + l + ",le=\"1\"} 1",
           "zenflow_host_optimizer_step_duration_seconds_bucket" + l + ",le=\"5\"} 2",
           "zenflow_host_optimizer_step_duration_seconds_sum" + l + "} 3",
           "zenflow_host_optimizer_step_duration_seconds_count" + l + "} 2",
       })
    EXPECT_TRUE(has_line(text, line)) << "missing: " << line << "\n" << text;
  EXPECT_EQ(text.find("job=\""), std::string::npos);  // job_id, never job
}

TEST(RunMetrics, StepBucketsSpanOneMillisecondToHundredSeconds) {
  const auto& b = RunMetrics::step_duration_buckets();
  ASSERT_FALSE(b.empty());
  EXPECT_DOUBLE_EQ(b.front(), 0.001);
  EXPECT_DOUBLE_EQ(b.back(), 100);
}

TEST(RunMetrics, OnStepNeitherAllocatesNorLocksAfterStart) {
  metrics::MetricsRegistry registry;
  RunMetrics m(registry, "j");
  m.on_start(synthetic_facts());
  const TrainingStep step = synthetic_step(0);
  g_allocations = 0;
  g_count_allocations = true;
  for (int i = 0; i < 1000; ++i) m.on_step(step);
  g_count_allocations = false;
  EXPECT_EQ(g_allocations.load(), 0);
  EXPECT_TRUE(has_line(metrics::render_text(registry), "zenflow_steps_total{job_id=\"j\",rank=\"0\"} 1000"));
}

TEST(RunMetrics, CostCounterIsTheJobsShareOfThePriceTimesStepWallTime) {
  // $3600/h = $1/s. Steps of 0.5, 1 and 1.5 s wall, the end 0.25 s.
  TrainingEnd end;
  end.finish.wall_seconds = 0.25;
  auto cost_text = [&](bool priced, bool cuda, int64_t world, int64_t rank) {
    metrics::MetricsRegistry registry;
    RunMetrics m(registry, "j");
    if (priced) m.set_price(3600, 8);
    RunFacts f = synthetic_facts();
    f.device_is_cuda = cuda;
    f.world_size = world;
    f.rank = rank;
    m.on_start(f);
    for (int i = 0; i < 3; ++i) m.on_step(synthetic_step(i));
    m.on_finish(end);
    return metrics::render_text(registry);
  };
  const std::string l = "zenflow_cost_usd_total{job_id=\"j\",rank=\"0\"} ";
  EXPECT_TRUE(has_line(cost_text(true, false, 1, 0), l + "3.25")) << cost_text(true, false, 1, 0);  // CPU: whole
  EXPECT_TRUE(has_line(cost_text(true, true, 2, 0), l + "0.8125")) << cost_text(true, true, 2, 0);  // 2 of 8
  EXPECT_EQ(cost_text(false, true, 2, 0).find("zenflow_cost_usd_total"), std::string::npos);  // not priced
  EXPECT_EQ(cost_text(true, true, 2, 1).find("zenflow_cost_usd_total"), std::string::npos);   // rank 0 only
  metrics::MetricsRegistry registry;
  RunMetrics m(registry, "j");
  EXPECT_THROW(m.set_price(-1, 8), std::invalid_argument);
}

TEST(RunMetrics, SecondRankOnOneRegistryGetsItsOwnSeries) {
  metrics::MetricsRegistry registry;
  RunMetrics r0(registry, "j"), r1(registry, "j");
  RunFacts f = synthetic_facts();
  r0.on_start(f);
  f.rank = 1;
  r1.on_start(f);
  r0.on_step(synthetic_step(0));
  r1.on_step(synthetic_step(2));
  r1.on_step(synthetic_step(2));
  const std::string text = metrics::render_text(registry);
  EXPECT_TRUE(has_line(text, "zenflow_steps_total{job_id=\"j\",rank=\"0\"} 1")) << text;
  EXPECT_TRUE(has_line(text, "zenflow_steps_total{job_id=\"j\",rank=\"1\"} 2")) << text;
  EXPECT_TRUE(has_line(text, "zenflow_compute_seconds_total{job_id=\"j\",rank=\"1\"} 1.5")) << text;
}

// --- `zenflow run --metrics-port` end to end ---

using zenflow::test_support::free_port;
using zenflow::test_support::http_get;

// The value of the sample line starting with `series` ("name{labels}"), or -1.
double sample(const std::string& text, const std::string& series) {
  const size_t at = ("\n" + text).find("\n" + series + " ");
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + series.size() + 1);
}

fs::path scratch_dir() {
  return fs::temp_directory_path() / ("zenflow-runmetrics-" + std::to_string(::getpid()));
}

// Removes the specs, logs and checkpoint directories of the run tests when the binary ends.
class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(scratch_dir(), ec);
  }
};
[[maybe_unused]] const auto* const g_cleanup = ::testing::AddGlobalTestEnvironment(new ScratchCleanup);

std::string write_spec(const std::string& name, int steps) {
  const fs::path dir = scratch_dir();
  fs::create_directories(dir);
  std::ofstream(dir / name)
      << "name: metrics-test\n"
         "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, "
         "num_attention_heads: 4, intermediate_size: 64, max_position_embeddings: 32}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: "
      << steps
      << ", micro_batch: 2, seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu}\n"
         "optimizer: {mode: zenflow, zenflow: {update_interval: 2, full_warm_up_rounds: 0, "
         "min_split_numel: 512}}\n"
         "checkpoint: {every_steps: 0, dir: runs/metrics-test}\n";  // beside the spec, in the scratch dir
  return (dir / name).string();
}

// Starts `zenflow ARGS...` with stderr into `err_file`; returns its pid.
pid_t spawn_zenflow(const std::vector<std::string>& args, const std::string& err_file) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (!freopen(err_file.c_str(), "w", stderr)) _exit(126);
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    const std::string bin = std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow";
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(bin.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

// Waits up to `seconds` for pid to exit; kills it (and reports -1) if it does not.
int wait_exit(pid_t pid, double seconds) {
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(RunMetricsCli, ServesEveryMetricWhileTrainingAndExits130OnSigint) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const std::string spec = write_spec("long.yaml", 100000);
  const std::string err = spec + ".stderr";
  const pid_t pid =
      spawn_zenflow({"run", spec, "--quiet", "--fresh", "--metrics-port", std::to_string(port)}, err);
  ASSERT_GT(pid, 0);
  const std::string l = "{job_id=\"metrics-test\",rank=\"0\"}";
  // Bounded polling (<= 30 s) until the run has done a few steps.
  std::string first;
  double steps1 = -1;
  for (int i = 0; i < 300 && steps1 < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto [status, body] = http_get(port, "/metrics");
    if (status == 200) {
      first = body;
      steps1 = sample(body, "zenflow_steps_total" + l);
    }
  }
  EXPECT_GE(steps1, 3) << first << "\nstderr:\n" << read_file(err);
  EXPECT_EQ(http_get(port, "/healthz"), std::make_pair(200, std::string("ok\n")));
  // The counter grows between two scrapes.
  double steps2 = steps1;
  std::string second;
  for (int i = 0; i < 300 && steps2 <= steps1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto [status, body] = http_get(port, "/metrics");
    if (status == 200) {
      second = body;
      steps2 = sample(body, "zenflow_steps_total" + l);
    }
  }
  EXPECT_GT(steps2, steps1);
  const std::string lc = "{job_id=\"metrics-test\",rank=\"0\",";
  for (const std::string& series : {"zenflow_steps_total" + l,
                                    "zenflow_tokens_total" + l,
                                    "zenflow_step_duration_seconds_count" + l,
                                    "zenflow_step_duration_seconds_sum" + l,
                                    "zenflow_host_optimizer_step_duration_seconds_count" + l,
                                    "zenflow_compute_seconds_total" + l,
                                    "zenflow_exposed_stall_ratio" + l,
                                    "zenflow_device_optimizer_seconds_total" + l,
                                    "zenflow_staleness_steps" + l,
                                    "zenflow_selected_ratio" + l,
                                    "zenflow_loss" + l,
                                    "zenflow_skipped_steps_total" + l,
                                    "zenflow_pinned_host_bytes" + l,
                                    lc + "cause=\"host_optimizer\"}",
                                    lc + "cause=\"transfer_d2h\"}",
                                    lc + "cause=\"transfer_h2d\"}",
                                    lc + "cause=\"network\"}",
                                    lc + "cause=\"allreduce\"}",
                                    lc + "cause=\"data\"}",
                                    lc + "cause=\"checkpoint\"}",
                                    lc + "direction=\"d2h\"}",
                                    lc + "direction=\"h2d\"}",
                                    lc + "kind=\"master\"}",
                                    lc + "kind=\"moments\"}",
                                    lc + "kind=\"accumulators\"}",
                                    lc + "kind=\"pinned\"}",
                                    lc + "kind=\"staging\"}",
                                    lc + "kind=\"host_total\"}"}) {
    const std::string full =
        series.find("cause=") != std::string::npos       ? "zenflow_stall_seconds_total" + series
        : series.find("direction=") != std::string::npos ? "zenflow_transfer_bytes_total" + series
        : series.find("kind=") != std::string::npos      ? "zenflow_host_memory_bytes" + series
                                                         : series;
    EXPECT_GE(sample(second, full), 0) << "missing: " << full;
  }
  // Numbers that must hold on this run. A scrape reads families in name order while steps
  // go on, so a later family may hold one step more: the histogram count is read before
  // steps_total, the tokens (at most 2 x 16 a step) after it.
  const double steps = sample(second, "zenflow_steps_total" + l);
  const double count = sample(second, "zenflow_step_duration_seconds_count" + l);
  EXPECT_LE(count, steps);
  EXPECT_GE(count, steps - 1);
  EXPECT_GT(sample(second, "zenflow_tokens_total" + l), 0);
  EXPECT_LE(sample(second, "zenflow_tokens_total" + l), 32 * (steps + 1));
  EXPECT_GT(sample(second, "zenflow_transfer_bytes_total" + lc + "direction=\"d2h\"}"), 0);
  EXPECT_GT(sample(second, "zenflow_host_memory_bytes" + lc + "kind=\"master\"}"), 0);
  EXPECT_EQ(sample(second, "zenflow_host_memory_bytes" + lc + "kind=\"moments\"}"),
            2 * sample(second, "zenflow_host_memory_bytes" + lc + "kind=\"master\"}"));
  EXPECT_GT(sample(second, "zenflow_selected_ratio" + l), 0);
  EXPECT_NE(second.find("zenflow_build_info{version=\""), std::string::npos);
  kill(pid, SIGINT);
  EXPECT_EQ(wait_exit(pid, 30), 130) << read_file(err);
  const std::string log = read_file(err);
  EXPECT_NE(log.find("metrics on http://127.0.0.1:" + std::to_string(port) + "/metrics"), std::string::npos)
      << log;
  // The port is closed with the process.
  EXPECT_EQ(http_get(port, "/metrics").first, 0);
}

TEST(RunMetricsCli, PortInUseIsExitOneNamingHostAndPort) {
  // Hold a listening socket on a port, then ask zenflow for it.
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const std::string spec = write_spec("short.yaml", 3);
  const std::string err = spec + ".busy.stderr";
  const pid_t pid =
      spawn_zenflow({"run", spec, "--quiet", "--fresh", "--metrics-port", std::to_string(port)}, err);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(wait_exit(pid, 60), 1);
  close(fd);
  const std::string log = read_file(err);
  EXPECT_NE(log.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << log;
  EXPECT_EQ(log.find("metrics on http"), std::string::npos) << log;
}

TEST(RunMetricsCli, MetricsPortOffByDefaultAndOutOfRangeIsRejected) {
  const std::string spec = write_spec("short2.yaml", 3);
  const std::string err = spec + ".range.stderr";
  const pid_t pid = spawn_zenflow({"run", spec, "--quiet", "--fresh", "--metrics-port", "70000"}, err);
  ASSERT_GT(pid, 0);
  const int code = wait_exit(pid, 60);
  EXPECT_NE(code, 0);
  EXPECT_NE(code, -1);
  const std::string err2 = spec + ".off.stderr";
  const pid_t pid2 = spawn_zenflow({"run", spec, "--quiet", "--fresh"}, err2);
  ASSERT_GT(pid2, 0);
  EXPECT_EQ(wait_exit(pid2, 120), 0) << read_file(err2);
  EXPECT_EQ(read_file(err2).find("metrics on http"), std::string::npos);
}

}  // namespace
}  // namespace zenflow
