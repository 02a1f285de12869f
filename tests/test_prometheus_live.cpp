// A real Prometheus scraping a real `zenflow run`, loaded with deploy/prometheus's rules: series, recording
// rules, alerts and every deploy/grafana dashboard query evaluate.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "tests/support/http_client.h"
#include "tests/support/shell.h"
#include "tests/support/tiny_job.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* kJobId = "prom-live";

using zenflow::test_support::free_port;
using zenflow::test_support::http_get;

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

// A child process stopped by pid when it goes out of scope (bounded waits, then SIGKILL).
class Child {
 public:
  // Runs argv[0] (a path, or a name looked up in PATH) with stdout and stderr into `log`.
  Child(const std::vector<std::string>& argv, const std::string& log) {
    pid_ = fork();
    if (pid_ == 0) {
      if (!freopen(log.c_str(), "w", stderr) || !freopen(log.c_str(), "a", stdout)) _exit(126);
      std::vector<char*> args;
      for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { stop(SIGTERM, 20); }

  pid_t pid() const { return pid_; }
  bool running() {
    if (pid_ <= 0) return false;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      pid_ = -1;
      return false;
    }
    return true;
  }
  // Sends `sig`, waits up to `seconds` for the exit, then SIGKILLs. Returns the exit code
  // (128 + signal when killed by one), or -1 when it had to be killed.
  int stop(int sig, double seconds) {
    if (!running()) return code_;
    kill(pid_, sig);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < deadline) {
      if (!running()) return code_;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
    code_ = -1;
    return code_;
  }

 private:
  pid_t pid_ = -1;
  int code_ = -1;
};

// Polls `done` every 250 ms until it holds or `seconds` pass; returns whether it held.
bool wait_for(double seconds, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return done();
}

fs::path prometheus_dir() { return fs::path(ZENFLOW_SOURCE_DIR) / "deploy" / "prometheus"; }

std::vector<fs::path> rule_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(prometheus_dir() / "rules"))
    if (e.path().extension() == ".yml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// The project's prometheus.yml made to scrape every second (intervals 1 s, rule files by
// absolute path): its zenflow-run, zenflow-worker and zenflow-coordinator jobs, their settings
// kept, their targets replaced by 127.0.0.1:port (the optimizer job, with no target here, left
// out).
std::string test_config(const std::map<std::string, int>& ports) {
  YAML::Node config = YAML::LoadFile((prometheus_dir() / "prometheus.yml").string());
  config["global"]["scrape_interval"] = "1s";
  config["global"]["evaluation_interval"] = "1s";
  config["global"]["scrape_timeout"] = "1s";
  YAML::Node rules(YAML::NodeType::Sequence);
  for (const auto& f : rule_files()) rules.push_back(f.string());
  config["rule_files"] = rules;
  YAML::Node jobs(YAML::NodeType::Sequence);
  for (const auto& job : config["scrape_configs"]) {
    auto port = ports.find(job["job_name"].as<std::string>());
    if (port == ports.end()) continue;
    YAML::Node j = YAML::Clone(job);
    j.remove("file_sd_configs");
    j.remove("static_configs");
    YAML::Node target;
    target["targets"].push_back("127.0.0.1:" + std::to_string(port->second));
    j["static_configs"].push_back(target);
    jobs.push_back(j);
  }
  config["scrape_configs"] = jobs;
  YAML::Emitter out;
  out << config;
  return out.c_str();
}

fs::path dashboards_dir() { return fs::path(ZENFLOW_SOURCE_DIR) / "deploy" / "grafana" / "dashboards"; }

std::vector<fs::path> dashboard_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dashboards_dir()))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

// Every panel of a dashboard, those nested in (collapsed) rows included.
void collect_panels(const json& panels, std::vector<json>& out) {
  if (!panels.is_array()) return;
  for (const auto& p : panels) {
    out.push_back(p);
    if (p.contains("panels")) collect_panels(p["panels"], out);
  }
}

// The template variables of a dashboard, by name.
std::map<std::string, json> dashboard_variables(const json& d) {
  std::map<std::string, json> vars;
  if (d.contains("templating") && d["templating"].contains("list"))
    for (const auto& v : d["templating"]["list"]) vars[v.value("name", "")] = v;
  return vars;
}

// The query of a query variable, whether Grafana stored it as a string or as {"query": ...}.
std::string variable_query(const json& v) {
  if (!v.contains("query")) return "";
  const json& q = v["query"];
  if (q.is_string()) return q.get<std::string>();
  if (q.is_object()) return q.value("query", "");
  return "";
}

// Grafana's built-in interval and range variables as the test's instant queries use them.
const std::map<std::string, std::string> kBuiltins = {
    {"__rate_interval", "1m"}, {"__interval", "5s"}, {"__interval_ms", "5000"},
    {"__range", "5m"},         {"__range_s", "300"}, {"__range_ms", "300000"},
};

// `expr` with $name, ${name} and ${name:format} replaced from `values`; the names it could not
// replace go to `unknown`.
std::string substitute(const std::string& expr, const std::map<std::string, std::string>& values,
                       std::vector<std::string>& unknown) {
  std::string out;
  for (size_t i = 0; i < expr.size();) {
    if (expr[i] != '$') {
      out += expr[i++];
      continue;
    }
    std::string name;
    size_t end = i + 1;
    if (end < expr.size() && expr[end] == '{') {
      const size_t close = expr.find('}', end);
      if (close == std::string::npos) {
        unknown.push_back(expr.substr(i));
        out += expr.substr(i);
        break;
      }
      name = expr.substr(end + 1, close - end - 1);
      name = name.substr(0, name.find(':'));
      end = close + 1;
    } else {
      while (end < expr.size() && (std::isalnum(static_cast<unsigned char>(expr[end])) || expr[end] == '_'))
        name += expr[end++];
    }
    const auto it = values.find(name);
    if (name.empty() || it == values.end()) {
      unknown.push_back("$" + (name.empty() ? expr.substr(i + 1, 1) : name));
      out += expr.substr(i, end - i);
    } else {
      out += it->second;
    }
    i = end > i + 1 ? end : i + 1;
  }
  return out;
}

// One panel query of a dashboard, its variables substituted.
struct PanelQuery {
  std::string where;  // file / panel title / refId
  std::string expr;   // substituted
  bool dcgm = false;  // a dcgm-exporter series: it may match nothing here
};

// What the test substitutes for a dashboard variable: the test run's job id, every rank, every
// GPU. Variables not listed here are unknown and fail the test.
std::map<std::string, std::string> substitution_values(const std::string& job_id) {
  std::map<std::string, std::string> v = kBuiltins;
  v["job_id"] = job_id;
  v["rank"] = ".*";
  v["hostname"] = ".*";
  v["gpu"] = ".*";
  v["DS_PROMETHEUS"] = "prometheus";
  return v;
}

// Every target expression of every dashboard, substituted (failures for unknown variables).
std::vector<PanelQuery> dashboard_queries(const std::string& job_id) {
  std::vector<PanelQuery> queries;
  const auto values = substitution_values(job_id);
  for (const auto& file : dashboard_files()) {
    const json d = json::parse(zenflow::test_support::read_file(file), nullptr, false);
    if (d.is_discarded()) continue;  // the static test reports it
    std::vector<json> panels;
    collect_panels(d.value("panels", json::array()), panels);
    for (const auto& p : panels)
      for (const auto& t : p.value("targets", json::array())) {
        PanelQuery q;
        q.where = file.filename().string() + " / " + p.value("title", "?") + " / " + t.value("refId", "?");
        std::vector<std::string> unknown;
        const std::string raw = t.value("expr", "");
        q.expr = substitute(raw, values, unknown);
        q.dcgm = raw.find("DCGM_") != std::string::npos;
        for (const auto& u : unknown) ADD_FAILURE() << q.where << ": unknown variable " << u << " in " << raw;
        if (unknown.empty()) queries.push_back(q);
      }
  }
  return queries;
}

// The dashboards as files: valid JSON, stable unique uids and titles, the datasource variable,
// job_id and rank on every zenflow dashboard, unique panel ids, a datasource, an expression and
// a unit on every query panel, and only known variables in the queries.
TEST(Dashboards, EveryDashboardIsWellFormed) {
  const auto files = dashboard_files();
  std::set<std::string> names;
  for (const auto& f : files) names.insert(f.filename().string());
  for (const char* want : {"zenflow-job-overview.json", "zenflow-where-the-time-goes.json", "zenflow-offload.json",
                           "zenflow-cost.json", "zenflow-cluster.json", "zenflow-gpu-health.json"})
    EXPECT_TRUE(names.count(want)) << want << " missing from " << dashboards_dir();

  std::set<std::string> uids, titles;
  for (const auto& file : files) {
    SCOPED_TRACE(file.filename().string());
    const json d = json::parse(zenflow::test_support::read_file(file), nullptr, false);
    ASSERT_FALSE(d.is_discarded()) << "not valid JSON";
    ASSERT_TRUE(d.is_object());
    const std::string uid = d.value("uid", ""), title = d.value("title", "");
    EXPECT_FALSE(uid.empty());
    EXPECT_LE(uid.size(), 40u) << "Grafana uids are at most 40 characters";
    EXPECT_EQ(uid, file.stem().string()) << "the uid is the file's name, stable across imports";
    EXPECT_TRUE(uids.insert(uid).second) << "duplicate uid " << uid;
    EXPECT_FALSE(title.empty());
    EXPECT_TRUE(titles.insert(title).second) << "duplicate title " << title;
    const int schema = d.value("schemaVersion", 0);
    EXPECT_GE(schema, 36);
    EXPECT_LE(schema, 41);

    const auto vars = dashboard_variables(d);
    ASSERT_TRUE(vars.count("DS_PROMETHEUS")) << "no datasource variable";
    EXPECT_EQ(vars.at("DS_PROMETHEUS").value("type", ""), "datasource");
    EXPECT_EQ(vars.at("DS_PROMETHEUS").value("query", ""), "prometheus");

    std::vector<json> panels;
    collect_panels(d.value("panels", json::array()), panels);
    bool zenflow_series = false;
    bool uses_job_id = false;  // job dashboards filter by $job_id (and $rank); the cluster's do not
    std::set<int> ids;
    int queries = 0;
    for (const auto& p : panels) {
      const std::string ptitle = p.value("title", "");
      SCOPED_TRACE(ptitle);
      ASSERT_TRUE(p.contains("id") && p["id"].is_number_integer()) << p.dump();
      EXPECT_TRUE(ids.insert(p["id"].get<int>()).second) << "duplicate panel id " << p["id"];
      EXPECT_TRUE(p.contains("gridPos"));
      EXPECT_FALSE(ptitle.empty());
      if (p.value("type", "") == "row") continue;
      const json targets = p.value("targets", json::array());
      EXPECT_FALSE(targets.empty()) << "a panel without queries";
      const std::string unit = p.value("/fieldConfig/defaults/unit"_json_pointer, std::string());
      EXPECT_FALSE(unit.empty()) << "no unit";
      for (const auto& t : targets) {
        ++queries;
        EXPECT_EQ(t.value("/datasource/uid"_json_pointer, std::string()), "${DS_PROMETHEUS}") << t.dump();
        EXPECT_EQ(t.value("/datasource/type"_json_pointer, std::string()), "prometheus") << t.dump();
        const std::string expr = t.value("expr", "");
        EXPECT_FALSE(expr.empty()) << t.dump();
        EXPECT_FALSE(t.value("refId", "").empty()) << t.dump();
        if (expr.find("zenflow_") != std::string::npos) zenflow_series = true;
        if (expr.find("$job_id") != std::string::npos) uses_job_id = true;
        // Every variable is the dashboard's own or one of Grafana's built-ins.
        std::map<std::string, std::string> known = kBuiltins;
        for (const auto& [name, v] : vars) known[name] = "x";
        std::vector<std::string> unknown;
        substitute(expr, known, unknown);
        EXPECT_TRUE(unknown.empty()) << expr;
      }
    }
    EXPECT_GT(queries, 0);

    if (zenflow_series && uses_job_id) {
      ASSERT_TRUE(vars.count("job_id")) << "no job_id variable";
      ASSERT_TRUE(vars.count("rank")) << "no rank variable";
      EXPECT_EQ(variable_query(vars.at("job_id")), "label_values(zenflow_steps_total, job_id)");
      EXPECT_EQ(variable_query(vars.at("rank")),
                "label_values(zenflow_steps_total{job_id=~\"$job_id\"}, rank)");
    }
    for (const auto& [name, v] : vars) {
      if (v.value("type", "") != "query") continue;
      EXPECT_TRUE(v.value("multi", false)) << name;
      EXPECT_TRUE(v.value("includeAll", false)) << name;
      EXPECT_EQ(v.value("/datasource/uid"_json_pointer, std::string()), "${DS_PROMETHEUS}") << name;
      EXPECT_EQ(variable_query(v).rfind("label_values(", 0), 0u) << name;
    }
  }
}

class PrometheusLive : public ::testing::Test {
 protected:
  void SetUp() override {
    if (zenflow::test_support::run("command -v prometheus >/dev/null 2>&1") != 0)
      GTEST_SKIP() << "prometheus not installed (bash scripts/install-deps.sh --test-tools)";
    dir_ = fs::temp_directory_path() / ("zenflow-promlive-" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

  // The result of an instant query: {"status", "data"/"error"...} as Prometheus sent it.
  json query(const std::string& promql) {
    auto [status, body] = http_get(prom_port_, "/api/v1/query?query=" + url_encode(promql));
    if (status == 0) return json{{"status", "no answer"}};
    json j = json::parse(body, nullptr, false);
    return j.is_discarded() ? json{{"status", "unparsable"}, {"body", body}} : j;
  }
  // The result of a range query over the last `seconds`, one point every `step` seconds, as a
  // Grafana time series panel asks for it.
  json query_range(const std::string& promql, int seconds, int step) {
    const auto now =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
            .count();
    auto [status, body] =
        http_get(prom_port_, "/api/v1/query_range?query=" + url_encode(promql) +
                                 "&start=" + std::to_string(now - seconds) + "&end=" + std::to_string(now) +
                                 "&step=" + std::to_string(step));
    if (status == 0) return json{{"status", "no answer"}};
    json j = json::parse(body, nullptr, false);
    return j.is_discarded() ? json{{"status", "unparsable"}, {"body", body}} : j;
  }
  // The series an instant query returns (empty on error).
  json series(const std::string& promql) {
    json j = query(promql);
    if (j.value("status", "") != "success") return json::array();
    return j["data"]["result"];
  }

  fs::path dir_;
  int prom_port_ = 0;
};

// Every §7 worker series `zenflow run --metrics-port` serves (worker/rank/run_metrics.cpp).
const std::vector<std::string> kRunSeries = {
    "zenflow_steps_total",
    "zenflow_tokens_total",
    "zenflow_step_duration_seconds_bucket",
    "zenflow_step_duration_seconds_sum",
    "zenflow_step_duration_seconds_count",
    "zenflow_host_optimizer_step_duration_seconds_count",
    "zenflow_compute_seconds_total",
    "zenflow_stall_seconds_total",
    "zenflow_exposed_stall_ratio",
    "zenflow_device_optimizer_seconds_total",
    "zenflow_transfer_bytes_total",
    "zenflow_staleness_steps",
    "zenflow_selected_ratio",
    "zenflow_loss",
    "zenflow_train_steps",
    "zenflow_skipped_steps_total",
    "zenflow_pinned_host_bytes",
    "zenflow_host_memory_bytes",
};

// The coordinator's series (server/coordinator_metrics.h).
const std::vector<std::string> kCoordinatorSeries = {
    "zenflow_jobs", "zenflow_workers", "zenflow_workers_lost_total", "zenflow_slots",
    "zenflow_queue_wait_seconds_bucket", "zenflow_job_restarts_total", "zenflow_job_preemptions_total",
    "zenflow_job_cost_usd_total", "zenflow_job_lost_usd", "zenflow_job_usd_per_hour",
    "zenflow_rpc_duration_seconds_bucket", "zenflow_build_info",
};

// The first "<prefix>HOST:PORT" in `log` (a daemon's first lines), or "" when absent yet.
std::string address_in(const std::string& log, const std::string& prefix) {
  const std::string text = zenflow::test_support::read_file(log);
  const size_t at = text.find(prefix);
  if (at == std::string::npos) return "";
  const size_t start = at + prefix.size(), end = text.find_first_of(" \n/", start);
  return end == std::string::npos ? "" : text.substr(start, end - start);
}

// Scraped at once: a bare `zenflow run` (job_id prom-live) and the service, a coordinator and a
// worker agent training a priced job (job_id j-000001, its ranks' series through the agent).
TEST_F(PrometheusLive, ScrapesARunAndEveryRuleAndAlertEvaluates) {
  const int zport = free_port();
  prom_port_ = free_port();
  ASSERT_GT(zport, 0);
  ASSERT_GT(prom_port_, 0);
  ASSERT_NE(zport, prom_port_);
  const std::string bin = std::string(ZENFLOW_BINARY_DIR) + "/bin/";

  // The service: ports chosen by the daemons (0) and read from their first lines.
  const std::string clog = (dir_ / "coordinator.log").string(), wlog = (dir_ / "worker.log").string();
  // Metrics ports: 0 is "off" for both daemons (as for zenflow run), so free ones are found here.
  const int cport = free_port(), wport = free_port();
  ASSERT_TRUE(cport > 0 && wport > 0 && cport != wport && cport != zport && wport != zport &&
              cport != prom_port_ && wport != prom_port_);
  Child coordinator({bin + "zenflow-coordinator", "--listen", "127.0.0.1:0", "--db", (dir_ / "c.db").string(),
                     "--metrics-port", std::to_string(cport)},
                    clog);
  std::string grpc_address;
  ASSERT_TRUE(wait_for(30, [&] { return !(grpc_address = address_in(clog, "listening on ")).empty(); }))
      << zenflow::test_support::read_file(clog);
  Child worker({bin + "zenflow-worker", "--coordinator", grpc_address, "--work-dir", (dir_ / "work").string(),
                "--name", "w1", "--cpu-slots", "1", "--metrics-port", std::to_string(wport),
                // the job's spec, checkpoints and data (a worker confines specs to its work dir)
                "--allowed-root", dir_.string(), "--allowed-root", "/usr/share/common-licenses"},
               wlog);
  const fs::path service_spec = dir_ / "service.yaml";
  std::string sspec = zenflow::test_support::tiny_job_spec("prom-live-service", 100000);
  sspec += "cost: {usd_per_hour: 3.6}\n";
  const std::string ckpt = "checkpoint: {every_steps: 0}\n";
  sspec.replace(sspec.find(ckpt), ckpt.size(), "checkpoint: {dir: " + (dir_ / "service-ckpt").string() + "}\n");
  zenflow::test_support::write_file(service_spec, sspec);
  std::string submitted;
  ASSERT_EQ(zenflow::test_support::run(bin + "zenflow submit " + service_spec.string() + " --coordinator " +
                                           grpc_address + " --json > " + (dir_ / "submit.json").string() + " 2>&1"),
            0)
      << zenflow::test_support::read_file(dir_ / "submit.json");
  const json sub = json::parse(zenflow::test_support::read_file(dir_ / "submit.json"), nullptr, false);
  const std::string service_job = sub.is_object() ? sub.value("/job/id"_json_pointer, std::string()) : "";
  ASSERT_FALSE(service_job.empty()) << zenflow::test_support::read_file(dir_ / "submit.json");

  // A tiny run that trains until it is interrupted.
  const fs::path spec = dir_ / "run.yaml";
  zenflow::test_support::write_file(
      spec,
      zenflow::test_support::tiny_job_spec_beside_it(kJobId, 100000));
  const std::string zlog = (dir_ / "zenflow.log").string();
  Child run({std::string(ZENFLOW_BINARY_DIR) + "/bin/zenflow", "run", spec.string(), "--quiet", "--fresh",
             "--metrics-port", std::to_string(zport)},
            zlog);
  ASSERT_GT(run.pid(), 0);

  const fs::path config = dir_ / "prometheus.yml";
  zenflow::test_support::write_file(config, test_config({{"zenflow-run", zport},
                                                         {"zenflow-worker", wport},
                                                         {"zenflow-coordinator", cport}}));
  const std::string plog = (dir_ / "prometheus.log").string();
  Child prom(
      {"prometheus", "--config.file=" + config.string(), "--storage.tsdb.path=" + (dir_ / "tsdb").string(),
       "--web.listen-address=127.0.0.1:" + std::to_string(prom_port_), "--log.level=warn"},
      plog);
  ASSERT_GT(prom.pid(), 0);

  ASSERT_TRUE(wait_for(30, [&] { return http_get(prom_port_, "/-/ready").first == 200; }))
      << "prometheus not ready in 30 s\n"
      << zenflow::test_support::read_file(plog);
  // The target is up and the run has trained a few steps since the first scrape (rates need
  // two samples).
  const std::string up = "count(up{job=~\"zenflow-run|zenflow-worker|zenflow-coordinator\"} == 1) == 3";
  const std::string grown = "increase(zenflow_steps_total{job_id=\"" + std::string(kJobId) + "\"}[1m]) > 0";
  const std::string service_grown = "increase(zenflow_steps_total{job_id=\"" + service_job + "\"}[1m]) > 0";
  ASSERT_TRUE(wait_for(90, [&] {
    return !series(up).empty() && !series(grown).empty() && !series(service_grown).empty();
  }))
      << "no scraped progress in 60 s\n"
      << query("up").dump() << "\nzenflow:\n"
      << zenflow::test_support::read_file(zlog) << "\nprometheus:\n"
      << zenflow::test_support::read_file(plog) << "\ncoordinator:\n"
      << zenflow::test_support::read_file(clog) << "\nworker:\n"
      << zenflow::test_support::read_file(wlog);
  ASSERT_TRUE(run.running()) << zenflow::test_support::read_file(zlog);
  ASSERT_TRUE(worker.running()) << zenflow::test_support::read_file(wlog);

  // The worker agent shows its rank's series under the coordinator's job id, and the coordinator
  // its own.
  for (const auto& name : kRunSeries) {
    const json s = series(name + "{job=\"zenflow-worker\",job_id=\"" + service_job + "\",rank=\"0\"}");
    EXPECT_FALSE(s.empty()) << name << " from the worker";
  }
  for (const auto& name : kCoordinatorSeries)
    EXPECT_FALSE(series(name + "{job=\"zenflow-coordinator\"}").empty()) << name << " from the coordinator";
  EXPECT_FALSE(series("zenflow_job_cost_usd_total{job_id=\"" + service_job + "\"} > 0").empty());
  EXPECT_FALSE(series("zenflow_jobs{state=\"RUNNING\"} == 1").empty()) << query("zenflow_jobs").dump();

  // Every series the run exports arrived, each with job_id and rank.
  for (const auto& name : kRunSeries) {
    const json s = series(name + "{job=\"zenflow-run\"}");
    EXPECT_FALSE(s.empty()) << name;
    for (const auto& one : s) {
      EXPECT_EQ(one["metric"].value("job_id", ""), kJobId) << one.dump();
      EXPECT_EQ(one["metric"].value("rank", ""), "0") << one.dump();
      EXPECT_FALSE(one["metric"].contains("exported_job")) << one.dump();
    }
  }
  auto label_values = [&](const std::string& name, const std::string& label) {
    std::set<std::string> v;
    for (const auto& one : series(name)) v.insert(one["metric"].value(label, ""));
    return v;
  };
  EXPECT_EQ(label_values("zenflow_stall_seconds_total", "cause"),
            (std::set<std::string>{"host_optimizer", "transfer_d2h", "transfer_h2d", "network", "allreduce",
                                   "data", "checkpoint", "checkpoint_upload", "weight_stream"}));
  EXPECT_EQ(label_values("zenflow_transfer_bytes_total", "direction"),
            (std::set<std::string>{"d2h", "h2d", "h2d_weights"}));
  EXPECT_EQ(label_values("zenflow_host_memory_bytes", "kind"),
            (std::set<std::string>{"master", "moments", "accumulators", "pinned", "staging", "host_total"}));
  EXPECT_FALSE(series("zenflow_build_info{job=\"zenflow-run\"}").empty());

  // Every recording rule's expression returns a series, and Prometheus itself records it.
  // Every alert's expression evaluates without error (it need not return anything).
  int records = 0, alerts = 0;
  for (const auto& file : rule_files()) {
    const YAML::Node doc = YAML::LoadFile(file.string());
    for (const auto& group : doc["groups"])
      for (const auto& rule : group["rules"]) {
        const std::string expr = rule["expr"].as<std::string>();
        if (rule["record"]) {
          ++records;
          const std::string name = rule["record"].as<std::string>();
          EXPECT_TRUE(wait_for(15, [&] { return !series(expr).empty(); }))
              << name << ": its expression returns nothing\n"
              << expr << "\n"
              << query(expr).dump();
          EXPECT_TRUE(wait_for(15, [&] { return !series(name).empty(); })) << name << " is not recorded";
        } else {
          ++alerts;
          const json j = query(expr);
          EXPECT_EQ(j.value("status", ""), "success") << rule["alert"].as<std::string>() << ": " << j.dump();
        }
      }
  }
  EXPECT_GE(records, 12);
  EXPECT_GE(alerts, 5);

  // Prometheus's own view: every rule loaded and evaluated at least once, none in error.
  json groups;
  ASSERT_TRUE(wait_for(15, [&] {
    auto [status, body] = http_get(prom_port_, "/api/v1/rules");
    if (status != 200) return false;
    groups = json::parse(body, nullptr, false)["data"]["groups"];
    for (const auto& g : groups)
      for (const auto& r : g["rules"])
        if (r.value("health", "") != "ok") return false;
    return true;
  })) << groups.dump(1);
  size_t loaded = 0;
  for (const auto& g : groups) loaded += g["rules"].size();
  EXPECT_EQ(loaded, static_cast<size_t>(records + alerts));

  // Every dashboard variable's label_values() query finds the run's job_id and rank; every
  // zenflow panel query returns a series (a dashboard whose query matches nothing is a failing
  // test); dcgm-exporter queries, with no GPU here, evaluate without error.
  // Both jobs: the bare run's and the service's.
  const std::string both = std::string(kJobId) + "|" + service_job;
  const auto values = substitution_values(both);
  for (const auto& file : dashboard_files()) {
    const json d = json::parse(zenflow::test_support::read_file(file), nullptr, false);
    if (d.is_discarded()) continue;
    for (const auto& [name, v] : dashboard_variables(d)) {
      if (v.value("type", "") != "query") continue;
      const std::string q = variable_query(v);
      // label_values(selector, label)
      const size_t open = q.find('('), comma = q.rfind(','), close = q.rfind(')');
      ASSERT_TRUE(open != std::string::npos && comma != std::string::npos && close != std::string::npos &&
                  open < comma && comma < close)
          << file << ": " << q;
      std::vector<std::string> unknown;
      const std::string selector = substitute(q.substr(open + 1, comma - open - 1), values, unknown);
      std::string label = q.substr(comma + 1, close - comma - 1);
      label.erase(0, label.find_first_not_of(' '));
      EXPECT_TRUE(unknown.empty()) << file << ": " << q;
      const json j = query(selector);
      EXPECT_EQ(j.value("status", ""), "success") << file << " $" << name << ": " << j.dump();
      if (selector.find("DCGM_") != std::string::npos) continue;
      std::set<std::string> found;
      for (const auto& one : series(selector)) found.insert(one["metric"].value(label, ""));
      if (name == "job_id") {
        EXPECT_TRUE(found.count(kJobId)) << file << " $job_id (" << q << ") lacks " << kJobId;
        EXPECT_TRUE(found.count(service_job)) << file << " $job_id (" << q << ") lacks " << service_job;
      } else {
        EXPECT_TRUE(found.count(name == "rank" ? "0" : "")) << file << " $" << name << " (" << q << ")";
      }
    }
  }
  int dashboard_queries_run = 0;
  for (const auto& q : dashboard_queries(both)) {
    ++dashboard_queries_run;
    if (q.dcgm) {
      const json j = query(q.expr);
      EXPECT_EQ(j.value("status", ""), "success") << q.where << "\n" << q.expr << "\n" << j.dump();
    } else {
      EXPECT_TRUE(wait_for(15, [&] { return !series(q.expr).empty(); })) << q.where << ": matches nothing\n"
                                                                         << q.expr << "\n"
                                                                         << query(q.expr).dump();
      // The same as a panel's range query: series with points.
      json r;
      EXPECT_TRUE(wait_for(15,
                           [&] {
                             r = query_range(q.expr, 30, 5);
                             return r.value("status", "") == "success" && r["data"]["result"].is_array() &&
                                    !r["data"]["result"].empty();
                           }))
          << q.where << ": its range query returns nothing\n"
          << q.expr << "\n"
          << r.dump();
    }
  }
  EXPECT_GE(dashboard_queries_run, 35);

  // The coordinator serves the job's `zenflow report` page beside /metrics (it sees the
  // checkpoint directory: one machine); an unknown job is a 404 naming it.
  {
    auto [status, body] = http_get(cport, "/jobs/" + service_job + "/report");
    EXPECT_EQ(status, 200) << body.substr(0, 500);
    EXPECT_NE(body.find("<html"), std::string::npos);
    EXPECT_NE(body.find("prom-live-service"), std::string::npos) << "the job's name";
    EXPECT_NE(body.find("uPlot"), std::string::npos) << "the charting library, inlined";
    auto [missing, why] = http_get(cport, "/jobs/j-999999/report");
    EXPECT_EQ(missing, 404);
    EXPECT_NE(why.find("j-999999"), std::string::npos) << why;
  }

  // The runs are healthy: no alert fires or is pending this early.
  EXPECT_TRUE(series("ALERTS{alertname!=\"ZenflowExposedStallHigh\"}").empty()) << query("ALERTS").dump();

  EXPECT_EQ(zenflow::test_support::run(bin + "zenflow cancel " + service_job + " --coordinator " + grpc_address +
                                       " > /dev/null 2>&1"),
            0);
  EXPECT_EQ(worker.stop(SIGTERM, 30), 0) << zenflow::test_support::read_file(wlog);
  EXPECT_EQ(coordinator.stop(SIGTERM, 20), 0) << zenflow::test_support::read_file(clog);

  EXPECT_EQ(run.stop(SIGINT, 30), 130) << zenflow::test_support::read_file(zlog);
  EXPECT_EQ(prom.stop(SIGTERM, 20), 0) << zenflow::test_support::read_file(plog);
}

}  // namespace
