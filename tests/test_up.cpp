// `zenflow up` as a real process: the stack it starts (coordinator, 2 CPU workers, an optimizer
// node when zenflow-optimizer is built, Prometheus when installed) runs submitted jobs to
// SUCCEEDED, Prometheus scrapes every process, and SIGTERM leaves no process of the stack behind.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>

#include "tests/support/http_client.h"
#include "tests/support/service_cluster.h"
#include "tests/support/shell.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using zenflow::test_support::Cluster;
using zenflow::test_support::Process;
using zenflow::test_support::read_file;

bool have_optimizer_node() { return ::access(Cluster::bin("zenflow-optimizer").c_str(), X_OK) == 0; }
bool have_prometheus() { return zenflow::test_support::run("command -v prometheus >/dev/null 2>&1") == 0; }

class UpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    dir_ = fs::temp_directory_path() /
           ("zenflow-test-up-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(dir_);
    stack_ = dir_ / "stack";
  }
  void TearDown() override {
    up_.reset();
    std::error_code ec;
    if (std::getenv("ZENFLOW_KEEP_TEST_DIRS") == nullptr) fs::remove_all(dir_, ec);
  }

  // Starts `zenflow up ARGS --dir STACK --allowed-root DIR` (the jobs checkpoint in DIR) and
  // waits for STACK/up.json; false (with the reason recorded as a failure) when it exits or
  // takes too long.
  bool start_stack(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {Cluster::bin("zenflow"), "up",         "--dir", stack_.string(),
                                     "--allowed-root",        dir_.string()};
    argv.insert(argv.end(), args.begin(), args.end());
    up_ = std::make_unique<Process>(argv, dir_ / "up.log");
    const bool ready = zenflow::test_support::wait_until(
        [&] { return fs::exists(stack_ / "up.json") || !up_->running(); }, std::chrono::seconds(120));
    if (!ready || !fs::exists(stack_ / "up.json")) {
      ADD_FAILURE() << "zenflow up not ready:\n" << up_->output();
      return false;
    }
    info_ = json::parse(read_file(stack_ / "up.json"));
    return true;
  }

  // `zenflow VERB ... --coordinator A --token-file F`; its exit status, stdout into *out.
  int cli(const std::string& args, std::string* out = nullptr) const {
    const std::string cmd = Cluster::bin("zenflow") + " " + args + " --coordinator " +
                            info_["coordinator"]["address"].get<std::string>() + " --token-file " +
                            info_["admin_token_file"].get<std::string>() + " 2>>" +
                            (dir_ / "cli.log").string();
    return zenflow::test_support::run(cmd, out);
  }

  std::vector<pid_t> stack_pids() const {
    std::vector<pid_t> pids = {info_["coordinator"]["pid"].get<pid_t>()};
    for (const auto& w : info_["workers"]) pids.push_back(w["pid"].get<pid_t>());
    for (const auto& n : info_["optimizer_nodes"]) pids.push_back(n["pid"].get<pid_t>());
    if (info_["prometheus"].is_object()) pids.push_back(info_["prometheus"]["pid"].get<pid_t>());
    return pids;
  }

  // SIGTERM to `zenflow up`: it exits 0 within its grace, and no process it started (nor a
  // rank of theirs: every command line of the stack names its directory) is left.
  void stop_and_expect_nothing_left() {
    const std::vector<pid_t> pids = stack_pids();
    for (pid_t p : pids) EXPECT_EQ(::kill(p, 0), 0) << "pid " << p << " is not running before SIGTERM";
    up_->signal(SIGTERM);
    EXPECT_EQ(up_->wait_exit(std::chrono::seconds(40)), 0) << up_->output();
    for (pid_t p : pids) EXPECT_NE(::kill(p, 0), 0) << "pid " << p << " outlived zenflow up";
    EXPECT_TRUE(zenflow::test_support::pids_with_cmdline(stack_.string()).empty())
        << "processes of the stack outlived zenflow up";
    EXPECT_NE(up_->output().find("stopped"), std::string::npos) << up_->output();
  }

  fs::path dir_, stack_;
  std::unique_ptr<Process> up_;
  json info_;
};

TEST_F(UpTest, StackRunsJobsToSucceededAndSigtermStopsEveryChild) {
  const bool nodes = have_optimizer_node();
  ASSERT_TRUE(start_stack({"--workers", "2", "--optimizer-nodes", nodes ? "1" : "0"}));
  EXPECT_GT(info_["ready_seconds"].get<double>(), 0.0);
  ASSERT_EQ(info_["workers"].size(), 2u);
  EXPECT_EQ(info_["optimizer_nodes"].size(), nodes ? 1u : 0u);
  const std::string out = up_->output();
  EXPECT_NE(out.find("zenflow up: ready in"), std::string::npos) << out;
  // The workers may use the stack's directory, the current one, the checkout with its
  // example's data (the submit line printed), and what --allowed-root added.
  EXPECT_EQ(info_["allowed_roots"], json({stack_.string(), fs::current_path().string(),
                                          fs::path(ZENFLOW_SOURCE_DIR).lexically_normal().string(),
                                          "/usr/share/common-licenses", dir_.string()}));
  EXPECT_NE(out.find("--coordinator " + info_["coordinator"]["address"].get<std::string>()),
            std::string::npos)
      << out;

  std::string listed;
  ASSERT_EQ(cli("workers --json", &listed), 0) << read_file(dir_ / "cli.log");
  const json workers = json::parse(listed);
  ASSERT_EQ(workers["workers"].size(), nodes ? 3u : 2u) << listed;
  int optimizers = 0;
  for (const auto& w : workers["workers"]) {
    EXPECT_EQ(w["state"], "READY") << listed;
    optimizers += w["role"] == "OPTIMIZER" ? 1 : 0;
  }
  EXPECT_EQ(optimizers, nodes ? 1 : 0) << listed;

  const std::string tiny = std::string(ZENFLOW_SOURCE_DIR) + "/examples/tiny.yaml";
  // The printed submit line trains the example into the stack's directory, never into the
  // runs/ of the checkout or of the directory it is typed in (a finished run may lie there).
  const std::string printed_head = "Submit a job:\n  ";
  ASSERT_NE(out.find(printed_head), std::string::npos) << out;
  const size_t from = out.find(printed_head) + printed_head.size();
  const std::string printed = out.substr(from, out.find('\n', from) - from);
  const std::string into_stack = "--set checkpoint.dir=" + (stack_ / "runs" / "tiny-demo").string();
  EXPECT_EQ(printed, Cluster::bin("zenflow") + " submit " + tiny + " " + into_stack + " --wait --coordinator " +
                         info_["coordinator"]["address"].get<std::string>() + " --token-file " +
                         info_["admin_token_file"].get<std::string>());
  // As printed (5 steps instead of 200, to keep the test short).
  EXPECT_EQ(zenflow::test_support::run(printed + " --set train.steps=5 --set train.warmup_steps=1 2>>" +
                                       (dir_ / "cli.log").string()),
            0)
      << read_file(dir_ / "cli.log") << "\n"
      << out;
  EXPECT_TRUE(fs::is_directory(stack_ / "runs" / "tiny-demo" / "step-00000005"));
  if (nodes) {
    const std::string on_nodes =
        " --set train.steps=5 --set train.warmup_steps=1 --set checkpoint.dir=" +
        (dir_ / "runs" / "nodes").string() + " --set 'optimizer.host.addresses=[" +
        info_["optimizer_nodes"][0]["address"].get<std::string>() +
        "]' --set optimizer.host.token_file=" + info_["optimizer_token_file"].get<std::string>();
    EXPECT_EQ(cli("submit " + tiny + " --wait --set name=up-nodes" + on_nodes), 0)
        << read_file(dir_ / "cli.log");
  } else {
    std::cout << "[ INFO     ] no " << Cluster::bin("zenflow-optimizer")
              << ": the optimizer-node job is not run\n";
  }
  std::string jobs;
  ASSERT_EQ(cli("jobs --json", &jobs), 0);
  const json listed_jobs = json::parse(jobs);
  ASSERT_EQ(listed_jobs["jobs"].size(), nodes ? 2u : 1u) << jobs;
  for (const auto& j : listed_jobs["jobs"]) EXPECT_EQ(j["state"], "SUCCEEDED") << jobs;

  stop_and_expect_nothing_left();
}

TEST_F(UpTest, PrometheusScrapesEveryProcessAndStopsWithTheStack) {
  if (!have_prometheus())
    GTEST_SKIP() << "prometheus not installed (bash scripts/install-deps.sh --test-tools)";
  const bool nodes = have_optimizer_node();
  ASSERT_TRUE(start_stack({"--workers", "2", "--optimizer-nodes", nodes ? "1" : "0", "--prometheus"}));
  ASSERT_TRUE(info_["prometheus"].is_object()) << info_.dump();
  const std::string url = info_["prometheus"]["url"];
  const int port = std::stoi(url.substr(url.rfind(':') + 1));
  EXPECT_EQ(zenflow::test_support::http_get(port, "/-/ready").first, 200);

  // Every process with a metrics port is a target, and each is up: 1 coordinator + 2 workers
  // (+ 1 optimizer node). Scrapes run every 5 s.
  json targets;
  auto all_up = [&] {
    const auto [status, body] = zenflow::test_support::http_get(port, "/api/v1/targets?state=active");
    if (status != 200) return false;
    targets = json::parse(body, nullptr, false);
    if (!targets.is_object() || !targets["data"]["activeTargets"].is_array()) return false;
    const json& active = targets["data"]["activeTargets"];
    if (active.size() != (nodes ? 4u : 3u)) return false;
    for (const auto& t : active)
      if (t["health"] != "up") return false;
    return true;
  };
  EXPECT_TRUE(zenflow::test_support::wait_until(all_up, std::chrono::seconds(45)))
      << targets.dump(1) << "\n"
      << read_file(info_["prometheus"]["log"].get<std::string>());
  std::map<std::string, int> per_job;
  std::set<std::string> scraped;
  for (const auto& t : targets["data"]["activeTargets"]) {
    ++per_job[t["labels"]["job"].get<std::string>()];
    scraped.insert(t["labels"]["instance"].get<std::string>());
  }
  EXPECT_EQ(per_job["zenflow-coordinator"], 1) << targets.dump(1);
  EXPECT_EQ(per_job["zenflow-worker"], 2) << targets.dump(1);
  EXPECT_EQ(per_job["zenflow-optimizer"], nodes ? 1 : 0) << targets.dump(1);
  EXPECT_TRUE(scraped.count("127.0.0.1:" + std::to_string(info_["coordinator"]["metrics_port"].get<int>())));
  for (const auto& w : info_["workers"])
    EXPECT_TRUE(scraped.count("127.0.0.1:" + std::to_string(w["metrics_port"].get<int>())))
        << targets.dump(1);
  // zenflow's rules are loaded (the recording and alerting groups of deploy/prometheus/rules).
  const auto [rstatus, rules] = zenflow::test_support::http_get(port, "/api/v1/rules");
  EXPECT_EQ(rstatus, 200);
  EXPECT_FALSE(json::parse(rules)["data"]["groups"].empty()) << rules;

  stop_and_expect_nothing_left();
}

TEST_F(UpTest, AChildThatCannotStartStopsTheStackWithItsLog) {
  // The coordinator cannot open a database that is a directory: `zenflow up` names it, shows its
  // log, stops the workers it had started and exits 1.
  fs::create_directories(stack_ / "coordinator.db");
  Process up({Cluster::bin("zenflow"), "up", "--workers", "1", "--dir", stack_.string()}, dir_ / "up.log");
  EXPECT_EQ(up.wait_exit(std::chrono::seconds(60)), 1) << up.output();
  EXPECT_NE(up.output().find("coordinator exited with status"), std::string::npos) << up.output();
  EXPECT_FALSE(fs::exists(stack_ / "up.json"));
  EXPECT_TRUE(zenflow::test_support::pids_with_cmdline(stack_.string()).empty());
}

}  // namespace
