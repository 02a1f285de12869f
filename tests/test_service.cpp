// The service end to end: zenflow-coordinator, zenflow-worker agents and the zenflow CLI
// as real processes on 127.0.0.1 (tests/support/service_cluster.h), training tiny jobs on
// the CPU. Each test bounds every wait and stops every process it started.
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/rpc/heartbeat_stream.h"
#include "common/rpc/rpc.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/support/http_client.h"
#if ZENFLOW_TEST_S3
#include "tests/support/moto.h"
#endif
#include "tests/support/service_cluster.h"
#include "tests/support/shell.h"
#include "tests/support/tiny_job.h"
#include "zenflow/v1/jobs.grpc.pb.h"
#include "zenflow/v1/workers.grpc.pb.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test_support::Cluster;
using test_support::pids_with_cmdline;
using test_support::read_file;
using test_support::wait_until;
using test_support::write_file;

// A tiny job with its checkpoints in the cluster's directory.
fs::path write_job(const Cluster& c, const std::string& name, int64_t steps, int64_t every, int workers = 1,
                   int priority = 0) {
  std::string spec = test_support::tiny_job_spec(name, steps);
  const std::string ckpt = "checkpoint: {every_steps: 0}\n";
  spec.replace(spec.find(ckpt), ckpt.size(),
               "checkpoint: {dir: " + (c.dir() / ("ckpt-" + name)).string() + ", every_steps: " +
                   std::to_string(every) + ", keep: 2}\n");
  spec += "resources: {workers: " + std::to_string(workers) + ", gpus_per_worker: 1, priority: " +
          std::to_string(priority) + ", max_restarts: 2}\n";
  const fs::path p = c.dir() / (name + ".yaml");
  write_file(p, spec);
  return p;
}

// protobuf's JSON mapping writes int64 fields as strings.
int64_t i64(const nlohmann::json& j, const char* key, int64_t fallback) {
  if (!j.is_object() || !j.contains(key)) return fallback;
  const nlohmann::json& v = j[key];
  return v.is_string() ? std::stoll(v.get<std::string>()) : v.is_number() ? v.get<int64_t>() : fallback;
}

std::string logs_of(const Cluster& c, const std::string& id) {
  std::string out;
  c.cli("logs " + id, &out);
  return out;
}

std::string worker_state(const Cluster& c, const std::string& name) {
  const nlohmann::json j = c.workers();
  if (!j.is_object() || !j.contains("workers")) return "";
  for (const auto& w : j["workers"])
    if (w.value("name", "") == name) return w.value("state", "");
  return "";
}

int64_t step_of(const Cluster& c, const std::string& id) { return i64(c.status(id), "step", 0); }

std::string placement0(const nlohmann::json& st) {
  return st.contains("placement") && !st["placement"].empty() ? st["placement"][0].get<std::string>() : "";
}

// Final train loss of an uninterrupted local run of the same spec (checkpoints elsewhere).
double reference_loss(const Cluster& c, const fs::path& spec) {
  std::string out;
  const std::string cmd = Cluster::bin("zenflow") + " run " + spec.string() + " --quiet --json --set checkpoint.dir=" +
                          (c.dir() / ("ref-" + spec.stem().string())).string() + " 2>/dev/null";
  EXPECT_EQ(test_support::run(cmd, &out), 0);
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  return j.is_object() ? j.value("final_loss", -1.0) : -1.0;
}

TEST(Service, ThreeJobsOnTwoWorkersAndADataParallelGang) {
  Cluster c("three-jobs");
  c.start_coordinator();
  c.start_worker("w1");
  // The 2-worker job first, with one worker: it must wait (never a partial start).
  const std::string gang = c.submit(write_job(c, "gang", 6, 3, /*workers=*/2));
  ASSERT_FALSE(gang.empty()) << read_file(c.dir() / "cli.log");
  std::this_thread::sleep_for(2s);
  nlohmann::json st = c.status(gang);
  EXPECT_EQ(st.value("state", ""), "QUEUED");
  EXPECT_NE(st.value("waiting_reason", "").find("2 workers"), std::string::npos) << st.dump();
  c.start_worker("w2");
  ASSERT_TRUE(c.wait_state(gang, "SUCCEEDED", 120s)) << c.status(gang).dump() << logs_of(c, gang);
  st = c.status(gang);
  ASSERT_EQ(st["placement"].size(), 2u);
  EXPECT_NE(st["placement"][0], st["placement"][1]);
  const std::string log = logs_of(c, gang);
  EXPECT_NE(log.find("weights bit-identical"), std::string::npos) << log;  // rank 0's summary
  // Both members' ranks ran and were reported, each by its own worker.
  EXPECT_NE(log.find("ranks on w1 exited with status 0"), std::string::npos) << log;
  EXPECT_NE(log.find("ranks on w2 exited with status 0"), std::string::npos) << log;
  EXPECT_EQ(log.find("warning: resources."), std::string::npos) << log;  // placed: nothing to warn about

  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(c.submit(write_job(c, "tiny" + std::to_string(i), 4, 2)));
  for (const std::string& id : ids) {
    ASSERT_FALSE(id.empty());
    EXPECT_TRUE(c.wait_state(id, "SUCCEEDED", 120s)) << c.status(id).dump() << logs_of(c, id);
    const nlohmann::json s = c.status(id);
    EXPECT_EQ(i64(s, "step", 0), 4);
    EXPECT_EQ(i64(s, "attempt", 0), 1);
    EXPECT_EQ(i64(s, "restarts", -1), 0);
  }
  std::string table;
  EXPECT_EQ(c.cli("jobs", &table), 0);
  EXPECT_NE(table.find("SUCCEEDED"), std::string::npos);
  EXPECT_EQ(c.cli("status j-999999"), 3);  // not found
}

// A worker whose agent may be cut off rather than dead: the coordinator starts its jobs
// elsewhere only after the agent's self-fence (grace + drain + the ranks' 2 s lease); these
// keep it to 9 s.
const std::vector<std::string> kShortFence = {"--disconnected-grace", "5", "--disconnect-drain", "2"};

TEST(Service, KilledWorkerAgentJobResumesFromItsCheckpointElsewhere) {
  Cluster c("kill-worker");
  c.start_coordinator();
  c.start_worker("w1", 1, kShortFence);
  c.start_worker("w2", 1, kShortFence);
  const fs::path spec = write_job(c, "resume", 3000, 100);
  write_file(spec, read_file(spec) + "cost: {usd_per_hour: 3.6}\n");
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 150; }, 120s)) << c.status(id).dump();
  const std::string victim = placement0(c.status(id));
  const std::string other = victim == "w1" ? "w2" : "w1";
  const std::string victim_dir = (c.dir() / ("work-" + victim) / "jobs").string();
  ASSERT_FALSE(pids_with_cmdline(victim_dir).empty());
  c.worker(victim).signal(SIGKILL);
  // Its ranks die with it (PDEATHSIG / the lease pipe), within seconds.
  EXPECT_TRUE(wait_until([&] { return pids_with_cmdline(victim_dir).empty(); }, 5s));
  // LOST within the lease (4 s) plus a tick; in fact one heartbeat interval after its
  // heartbeat stream broke with the agent's connection.
  EXPECT_TRUE(wait_until([&] { return worker_state(c, victim) == "LOST"; }, 6s));
  EXPECT_NE(
      read_file(c.dir() / "coordinator-1.log").find("worker " + victim + " LOST: its heartbeat stream broke"),
      std::string::npos)
      << read_file(c.dir() / "coordinator-1.log");
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 180s)) << c.status(id).dump() << logs_of(c, id);
  const nlohmann::json st = c.status(id);
  EXPECT_EQ(i64(st, "restarts", 0), 1);
  EXPECT_EQ(i64(st, "attempt", 0), 2);
  EXPECT_EQ(placement0(st), other);
  EXPECT_GE(i64(st, "resumed_from_step", 0), 100);  // not from 0
  EXPECT_DOUBLE_EQ(st.value("last_loss", 0.0), reference_loss(c, spec));
  // Cost across the two attempts: held time only (between the first placement and the end,
  // at least the second attempt's), the restart's waste shown apart, per 1M tokens exact.
  EXPECT_DOUBLE_EQ(st.value("usd_per_hour", 0.0), 3.6);
  const double usd = st.value("cost_usd", 0.0);
  const double hour_ms = 3.6e6;
  const int64_t end = i64(st, "end_time_ms", 0), start2 = i64(st, "start_time_ms", 0);
  EXPECT_GE(usd, 3.6 * double(end - start2) / hour_ms - 1e-9) << st.dump();
  EXPECT_LE(usd, 3.6 * double(end - i64(st, "submit_time_ms", 0)) / hour_ms + 1e-9) << st.dump();
  const double lost = st.value("usd_lost_to_restarts", 0.0);
  EXPECT_GT(lost, 0) << "the steps after the checkpoint were repeated: " << st.dump();
  EXPECT_LT(lost, usd - 3.6 * double(end - start2) / hour_ms + 3.6 * 60 / 3600) << st.dump();
  const int64_t tokens = i64(st, "tokens", 0);
  EXPECT_GT(tokens, 0);
  EXPECT_EQ(tokens % 3000, 0) << "step x tokens per step";
  EXPECT_NEAR(st.value("usd_per_1m_tokens", 0.0), usd * 1e6 / double(tokens), 1e-9);
  EXPECT_NEAR(st.value("usd_lost_to_stalls", 0.0), usd * st.value("stall_share", 0.0), 1e-12);
}

#if ZENFLOW_TEST_S3
// checkpoint.dir: s3:// — no directory is shared: each worker stages the job's checkpoints
// in its own work dir and uploads them to the bucket (moto_server). The worker running it
// is killed; the job resumes on the other, from the bucket, and ends with the loss of an
// uninterrupted local run.
TEST(Service, AJobWithItsCheckpointsInABucketResumesOnAnotherWorkerSharingNoDirectory) {
  const std::string moto = test_support::find_s3_server();
  if (moto.empty()) GTEST_SKIP() << test_support::kNoS3Server;
  const int metrics_port = test_support::free_port();
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--metrics-port", std::to_string(metrics_port), "--checkpoint-root", "s3://zf-svc/root/"};
  Cluster c("s3-resume", o);
  test_support::MotoServer bucket(moto, c.dir() / "moto.log", /*check_signatures=*/false);
  bucket.create_bucket("zf-svc");
  // The agents pass their environment (AWS_*) to their ranks.
  struct Env {
    std::vector<std::string> names;
    void set(const std::string& k, const std::string& v) {
      ::setenv(k.c_str(), v.c_str(), 1);
      names.push_back(k);
    }
    ~Env() {
      for (const std::string& k : names) ::unsetenv(k.c_str());
    }
  } env;
  env.set("AWS_ENDPOINT_URL", bucket.url());
  env.set("AWS_ACCESS_KEY_ID", bucket.key_id());
  env.set("AWS_SECRET_ACCESS_KEY", bucket.secret());
  c.start_coordinator();
  c.start_worker("w1", 1, kShortFence);
  c.start_worker("w2", 1, kShortFence);
  const fs::path spec = write_job(c, "s3job", 3000, 100);
  std::string text = read_file(spec);
  const std::string local_dir = "dir: " + (c.dir() / "ckpt-s3job").string();
  text.replace(text.find(local_dir), local_dir.size(), "dir: s3://zf-svc/jobs/s3job");
  write_file(spec, text);
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 150; }, 120s)) << c.status(id).dump() << logs_of(c, id);
  const std::string victim = placement0(c.status(id));
  const std::string other = victim == "w1" ? "w2" : "w1";
  // Its checkpoints are staged in the victim's own work dir only.
  const fs::path staged = c.dir() / ("work-" + victim) / "staging/zf-svc/jobs/s3job";
  int committed = 0;
  for (const auto& e : fs::directory_iterator(staged)) committed += fs::exists(e.path() / "manifest.json");
  EXPECT_GE(committed, 1);
  EXPECT_FALSE(fs::exists(c.dir() / ("work-" + other) / "staging/zf-svc/jobs/s3job"));
  c.worker(victim).signal(SIGKILL);
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 180s)) << c.status(id).dump() << logs_of(c, id);
  const nlohmann::json st = c.status(id);
  EXPECT_EQ(placement0(st), other);
  EXPECT_GE(i64(st, "resumed_from_step", 0), 100) << "it started over instead of resuming from the bucket";
  EXPECT_NE(logs_of(c, id).find("from s3://zf-svc/jobs/s3job: "), std::string::npos) << logs_of(c, id);
  EXPECT_DOUBLE_EQ(st.value("last_loss", 0.0), reference_loss(c, spec));
  EXPECT_TRUE(fs::exists(c.dir() / ("work-" + other) / "staging/zf-svc/jobs/s3job/step-00003000/manifest.json"));

  // The coordinator's page of the job: read from the bucket (no directory here holds the
  // record), with both attempts' steps.
  {
    auto [status, body] = test_support::http_get(metrics_port, "/jobs/" + id + "/report");
    EXPECT_EQ(status, 200) << body.substr(0, 500);
    EXPECT_NE(body.find("<html"), std::string::npos);
    EXPECT_NE(body.find("s3job"), std::string::npos) << "the job's name";
  }
  // A spec that names no checkpoint.dir: under the coordinator's --checkpoint-root (the
  // chart's storage.s3.bucket), not in a directory of the submitter's.
  {
    std::string text2 = test_support::tiny_job_spec("unnamed-dir", 30);
    text2.replace(text2.find("checkpoint: {every_steps: 0}"), 28, "checkpoint: {every_steps: 10}");
    const fs::path spec2 = c.dir() / "unnamed-dir.yaml";
    write_file(spec2, text2 + "resources: {workers: 1, gpus_per_worker: 1}\n");
    const std::string id2 = c.submit(spec2);
    ASSERT_FALSE(id2.empty());
    EXPECT_EQ(c.status(id2).value("checkpoint_dir", ""), "s3://zf-svc/root/unnamed-dir");
    ASSERT_TRUE(c.wait_state(id2, "SUCCEEDED", 120s)) << c.status(id2).dump() << logs_of(c, id2);
    const test_support::CurlReply listed = test_support::curl_request(
        "GET", bucket.url() + "/zf-svc?list-type=2&prefix=root/unnamed-dir/", "", "s3", bucket.key_id(), bucket.secret());
    EXPECT_NE(listed.body.find("root/unnamed-dir/step-00000030/manifest.json"), std::string::npos) << listed.body;
    EXPECT_FALSE(fs::exists(c.dir() / "runs/unnamed-dir"));
  }
  // A coordinator that cannot reach the bucket says why, and whose credentials it used.
  env.set("AWS_ENDPOINT_URL", "http://127.0.0.1:" + std::to_string(test_support::free_port()));
  c.start_coordinator();
  {
    auto [status, body] = test_support::http_get(metrics_port, "/jobs/" + id + "/report", 30);
    EXPECT_EQ(status, 503) << body;
    EXPECT_NE(body.find("cannot read its records in s3://zf-svc/jobs/s3job"), std::string::npos) << body;
    EXPECT_NE(body.find("with the AWS credentials of its own environment"), std::string::npos) << body;
  }
}
#endif

TEST(Service, PausedWorkerIsFencedAndItsStaleAttemptEnds) {
  Cluster c("sigstop");
  c.start_coordinator();
  c.start_worker("w1", 1, kShortFence);
  c.start_worker("w2", 1, kShortFence);
  ASSERT_TRUE(wait_until([&] { return worker_state(c, "w1") == "READY" && worker_state(c, "w2") == "READY"; }, 20s));
  const fs::path spec = write_job(c, "fence", 3000, 100);
  const std::string id = c.submit(spec);  // on w1: equal workers, lowest name first
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 150; }, 120s)) << c.status(id).dump();
  ASSERT_EQ(placement0(c.status(id)), "w1");
  const std::string w1_dir = (c.dir() / "work-w1").string();
  const std::string w1_ranks = w1_dir + "/jobs/";  // the ranks' command lines (the agent's has only w1_dir)
  c.worker("w1").signal(SIGSTOP);
  // The paused agent renews nothing: its rank ends itself without a checkpoint...
  EXPECT_TRUE(wait_until([&] { return pids_with_cmdline(w1_ranks).empty(); }, 8s));
  // ...and the coordinator declares w1 LOST and resumes the job on w2.
  EXPECT_TRUE(wait_until([&] { return worker_state(c, "w1") == "LOST"; }, 8s));
  ASSERT_TRUE(wait_until([&] { return placement0(c.status(id)) == "w2"; }, 20s)) << c.status(id).dump();
  c.worker("w1").signal(SIGCONT);
  // Back from the pause: refused (stale incarnation), it registers again as a new one.
  EXPECT_TRUE(wait_until([&] { return worker_state(c, "w1") == "READY"; }, 20s));
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 180s)) << c.status(id).dump();
  const std::string w1_log = c.worker("w1").output();
  EXPECT_NE(w1_log.find("the coordinator refused incarnation"), std::string::npos) << w1_log;
  const std::string attempt1 = read_file(fs::path(w1_dir) / "jobs" / id / "attempt-1" / "output.log");
  EXPECT_NE(attempt1.find("lease expired"), std::string::npos) << attempt1;
  EXPECT_EQ(i64(c.status(id), "attempt", 0), 2);
  EXPECT_DOUBLE_EQ(c.status(id).value("last_loss", 0.0), reference_loss(c, spec));
}

// How many `method` calls the coordinator's /metrics counts (zenflow_rpc_duration_seconds);
// -1 when it cannot be scraped.
int64_t rpc_count(int metrics_port, const std::string& method) {
  const auto [status, body] = test_support::http_get(metrics_port, "/metrics");
  if (status != 200) return -1;
  const std::string key = "zenflow_rpc_duration_seconds_count{method=\"" + method + "\"} ";
  const size_t at = body.find(key);
  return at == std::string::npos ? -1 : std::stoll(body.substr(at + key.size()));
}

TEST(Service, CoordinatorSigkillDoesNotRestartRunningJobs) {
  Cluster c("restart");
  c.start_coordinator();
  c.start_worker("w1");
  const fs::path spec = write_job(c, "survive", 3000, 500);
  const std::string id = c.submit(spec, "--request-id req-survive-1");
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 100; }, 120s)) << c.status(id).dump();
  c.coordinator().kill(SIGKILL);
  std::this_thread::sleep_for(1500ms);  // the worker keeps training meanwhile
  c.start_coordinator();
  // Serving at once, same job, same attempt: not restarted.
  nlohmann::json st = c.status(id);
  EXPECT_EQ(st.value("state", ""), "RUNNING") << st.dump() << c.coordinator().output();
  EXPECT_EQ(i64(st, "attempt", 0), 1);
  // The submit retried with the same request_id is the original job.
  std::string out;
  ASSERT_EQ(c.cli("submit " + spec.string() + " --json --request-id req-survive-1", &out), 0);
  const nlohmann::json again = nlohmann::json::parse(out, nullptr, false);
  EXPECT_EQ(again["job"].value("id", ""), id);
  EXPECT_FALSE(again.value("created", true));
  EXPECT_TRUE(wait_until([&] { return worker_state(c, "w1") == "READY"; }, 5s));
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 180s)) << c.status(id).dump();
  st = c.status(id);
  EXPECT_EQ(i64(st, "attempt", 0), 1) << logs_of(c, id) << c.coordinator().output() << c.worker("w1").output();
  EXPECT_EQ(i64(st, "restarts", -1), 0) << st.dump();
  const std::string log = logs_of(c, id);
  EXPECT_NE(log.find("[rank 0]"), std::string::npos);
  EXPECT_NE(log.find("job succeeded"), std::string::npos) << log;
  std::string jobs;
  ASSERT_EQ(c.cli("jobs --json", &jobs), 0);
  EXPECT_EQ(nlohmann::json::parse(jobs)["jobs"].size(), 1u);  // no duplicate
  EXPECT_DOUBLE_EQ(st.value("last_loss", 0.0), reference_loss(c, spec));
}

// While its job runs, a worker keeps its lease by HeartbeatStream beats alone, with no
// unary Heartbeat (the attempt's start, once taken, is not reported again); a restarted
// coordinator (another boot) gets the running attempt reported once more, then none again.
TEST(Service, ARunningWorkerBeatsOnItsStreamAloneAndReportsItsAttemptAgainAfterARestart) {
  const int metrics_port = test_support::free_port();
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--metrics-port", std::to_string(metrics_port)};
  Cluster c("stream-only", o);
  c.start_coordinator();
  c.start_worker("w1");
  const std::string id = c.submit(write_job(c, "long", 100000, 0));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 5; }, 120s)) << c.status(id).dump();
  // Calls over 2 s of the running job (beats every 500 ms).
  auto calls_over_2s = [&] {
    const int64_t unary0 = rpc_count(metrics_port, "Heartbeat"),
                  beats0 = rpc_count(metrics_port, "HeartbeatStream");
    std::this_thread::sleep_for(2s);
    return std::make_pair(rpc_count(metrics_port, "Heartbeat") - unary0,
                          rpc_count(metrics_port, "HeartbeatStream") - beats0);
  };
  // The start report is repeated until a reply reaches the agent within its deadline (one
  // heartbeat interval): on a loaded machine the coordinator's store commit can outlast it,
  // and the report goes again. Once taken it stops: a 2 s window with no unary call comes
  // (an agent that reported every interval would never give one), and the windows after it
  // stay quiet while the stream beats.
  auto quiet_window = [&] {
    std::pair<int64_t, int64_t> calls{-1, -1};
    for (int i = 0; i < 10 && calls.first != 0; ++i) calls = calls_over_2s();
    return calls;
  };
  auto [unary, beats] = quiet_window();
  EXPECT_EQ(unary, 0);
  EXPECT_GE(beats, 2);
  std::tie(unary, beats) = calls_over_2s();
  EXPECT_EQ(unary, 0);
  EXPECT_GE(beats, 2);
  c.coordinator().kill(SIGKILL);
  std::this_thread::sleep_for(1500ms);
  c.start_coordinator();
  EXPECT_TRUE(wait_until([&] { return rpc_count(metrics_port, "Heartbeat") >= 1; }, 10s));
  EXPECT_EQ(c.state(id), "RUNNING");  // the report was the running attempt's, not an exit's
  std::tie(unary, beats) = quiet_window();
  EXPECT_EQ(unary, 0);
  EXPECT_GE(beats, 2);
  std::tie(unary, beats) = calls_over_2s();
  EXPECT_EQ(unary, 0);
  EXPECT_GE(beats, 2);
  EXPECT_EQ(c.state(id), "RUNNING");
  EXPECT_EQ(i64(c.status(id), "attempt", 0), 1);
  ASSERT_EQ(c.cli("cancel " + id), 0);
  EXPECT_TRUE(c.wait_state(id, "CANCELLED", 30s)) << c.status(id).dump();
}

// `zenflow advise JOB_ID`: the agent runs rank 0 with --profile-if-possible and uploads the
// profile it wrote; the coordinator keeps it (across a restart) and gives the same advice as
// the file does. A job too short to profile has none, and advise says why; only the current
// attempt's rank-0 worker may upload, and only a profile that parses.
TEST(Service, CoordinatorKeepsEachJobsProfileForAdvise) {
  Cluster c("profile");
  c.start_coordinator();
  c.start_worker("w1");
  const std::string shorter = c.submit(write_job(c, "short", 4, 0));  // < 6 steps: too short to profile
  const std::string longer = c.submit(write_job(c, "long", 12, 6));
  ASSERT_FALSE(shorter.empty());
  ASSERT_FALSE(longer.empty());
  ASSERT_TRUE(c.wait_state(shorter, "SUCCEEDED", 120s)) << c.status(shorter).dump() << logs_of(c, shorter);
  ASSERT_TRUE(c.wait_state(longer, "SUCCEEDED", 120s)) << c.status(longer).dump() << logs_of(c, longer);
  EXPECT_NE(logs_of(c, shorter).find("no profile: --profile: train.steps 4 leaves too few steady steps"),
            std::string::npos)
      << logs_of(c, shorter);

  const fs::path file = c.dir() / "ckpt-long" / "profile.yaml";
  const std::string written = read_file(file);
  ASSERT_NE(written.find("zenflow_profile:"), std::string::npos) << file;
  auto kept = [&](const std::string& id, v1::JobProfile* out) {
    v1::GetJobProfileRequest req;
    req.set_id(id);
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.admin_token(), 5s);
    return v1::JobService::NewStub(rpc::make_channel(c.address(), {}))->GetJobProfile(&ctx, req, out);
  };
  v1::JobProfile p;
  ASSERT_TRUE(kept(longer, &p).ok()) << c.coordinator().output();
  EXPECT_EQ(p.job_id(), longer);
  EXPECT_EQ(p.attempt(), 1);
  EXPECT_EQ(p.profile_yaml(), written);  // byte for byte
  EXPECT_GT(p.received_ms(), 0);
  EXPECT_EQ(kept(shorter, &p).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(kept("j-999999", &p).error_code(), grpc::StatusCode::NOT_FOUND);

  // The same advice from the job id as from the file.
  std::string by_id, by_file;
  ASSERT_EQ(c.cli("advise " + longer + " --instance local --json", &by_id), 0) << read_file(c.dir() / "cli.log");
  ASSERT_EQ(test_support::run(Cluster::bin("zenflow") + " advise " + file.string() + " --instance local --json",
                              &by_file),
            0);
  const nlohmann::json a = nlohmann::json::parse(by_id, nullptr, false), b = nlohmann::json::parse(by_file, nullptr, false);
  ASSERT_TRUE(a.is_object() && a.contains("predictions")) << by_id;
  ASSERT_EQ(a["predictions"].size(), 3u) << by_id;  // device, offload, zenflow on this host
  EXPECT_EQ(a["predictions"], b["predictions"]);
  EXPECT_EQ(a["recommendation"], b["recommendation"]);
  EXPECT_EQ(c.cli("advise " + shorter + " --json"), 2);
  EXPECT_NE(read_file(c.dir() / "cli.log").find("job " + shorter + " has no profile yet"), std::string::npos)
      << read_file(c.dir() / "cli.log");
  EXPECT_EQ(c.cli("advise j-999999 --json"), 3);

  // Uploads: from a worker that was not the attempt's rank 0, for another attempt, or one
  // that does not parse, are refused, and the kept profile is unchanged.
  auto channel = rpc::make_channel(c.address(), {});
  auto workers = v1::WorkerService::NewStub(channel);
  v1::RegisterWorkerRequest reg;
  reg.set_name("impostor");
  reg.set_role(v1::OPTIMIZER);  // never placed on
  v1::RegisterWorkerResponse regd;
  {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s);
    ASSERT_TRUE(workers->RegisterWorker(&ctx, reg, &regd).ok());
  }
  auto upload = [&](const std::string& name, int64_t incarnation, int64_t attempt, const std::string& yaml) {
    v1::UploadProfileRequest req;
    req.set_name(name);
    req.set_incarnation(incarnation);
    req.mutable_attempt()->set_job_id(longer);
    req.mutable_attempt()->set_attempt(attempt);
    req.set_profile_yaml(yaml);
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s, regd.session());
    v1::UploadProfileResponse ignored;
    return workers->UploadProfile(&ctx, req, &ignored).error_code();
  };
  EXPECT_EQ(upload("impostor", regd.incarnation(), 1, written), grpc::StatusCode::FAILED_PRECONDITION);
  // The caller is checked before the YAML is parsed (no parse of 1 MiB for a stranger); the
  // size before either.
  EXPECT_EQ(upload("impostor", regd.incarnation(), 1, "zenflow_profile: 1\n"), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(upload("impostor", regd.incarnation(), 1, std::string(rpc::kMaxProfileBytes + 1, ' ')),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(upload("w1", 12345, 1, written), grpc::StatusCode::FAILED_PRECONDITION);  // not w1's incarnation

  // Kept across a coordinator SIGKILL.
  c.coordinator().kill(SIGKILL);
  c.start_coordinator();
  ASSERT_TRUE(wait_until([&] { return kept(longer, &p).ok(); }, 10s)) << c.coordinator().output();
  EXPECT_EQ(p.profile_yaml(), written);
  EXPECT_EQ(p.attempt(), 1);
}

// A worker started with --no-profile runs rank 0 without --profile-if-possible: the job
// trains, writes no profile and the coordinator keeps none.
TEST(Service, WorkerWithNoProfileKeepsNone) {
  Cluster c("no-profile");
  c.start_coordinator();
  c.start_worker("w1", 1, {"--no-profile"});
  const std::string id = c.submit(write_job(c, "long", 12, 6));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 120s)) << c.status(id).dump() << logs_of(c, id);
  EXPECT_FALSE(fs::exists(c.dir() / "ckpt-long" / "profile.yaml"));
  EXPECT_EQ(logs_of(c, id).find("no profile:"), std::string::npos) << logs_of(c, id);
  EXPECT_EQ(c.cli("advise " + id + " --json"), 2);
  EXPECT_NE(read_file(c.dir() / "cli.log").find("job " + id + " has no profile yet"), std::string::npos)
      << read_file(c.dir() / "cli.log");
}

TEST(Service, CancelCheckpointsAndFreesTheWorker) {
  Cluster c("cancel");
  c.start_coordinator();
  c.start_worker("w1");
  const std::string id = c.submit(write_job(c, "long", 100000, 0));
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 5; }, 120s)) << c.status(id).dump();
  ASSERT_EQ(c.cli("cancel " + id), 0);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(c.wait_state(id, "CANCELLED", 10s)) << c.status(id).dump();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  bool checkpointed = false;
  for (const auto& e : fs::directory_iterator(c.dir() / "ckpt-long"))
    checkpointed |= e.path().filename().string().rfind("step-", 0) == 0;
  EXPECT_TRUE(checkpointed);  // the Ctrl-C path wrote one
  EXPECT_TRUE(wait_until([&] { return pids_with_cmdline((c.dir() / "work-w1" / "jobs").string()).empty(); }, 10s));
  EXPECT_EQ(c.cli("cancel " + id), 2);  // already ended: FAILED_PRECONDITION
}

// A job whose checkpoint.dir holds a finished run (a resubmit, or an attempt requeued after
// its predecessor finished unrecorded) trains nothing and ends SUCCEEDED at the run's step,
// its log saying why; the checkpoints are as they were.
TEST(Service, AJobWhoseRunIsAlreadyCompleteSucceedsWithoutTraining) {
  Cluster c("complete");
  c.start_coordinator();
  c.start_worker("w1");
  const fs::path spec = write_job(c, "done", 4, 0);
  const std::string first = c.submit(spec);
  ASSERT_TRUE(c.wait_state(first, "SUCCEEDED", 120s)) << c.status(first).dump();
  const std::string again = c.submit(spec);
  ASSERT_NE(again, first);
  ASSERT_TRUE(c.wait_state(again, "SUCCEEDED", 60s)) << c.status(again).dump() << logs_of(c, again);
  EXPECT_EQ(step_of(c, again), 4) << c.status(again).dump();
  EXPECT_NE(logs_of(c, again).find("already complete at step 4; nothing to do (submit it with another "
                                   "checkpoint.dir to start over)"),
            std::string::npos)
      << logs_of(c, again);
  std::vector<std::string> steps;
  for (const auto& e : fs::directory_iterator(c.dir() / "ckpt-done"))
    if (e.path().filename().string().rfind("step-", 0) == 0) steps.push_back(e.path().filename().string());
  EXPECT_EQ(steps, std::vector<std::string>{"step-00000004"});
}

TEST(Service, HigherPriorityJobPreemptsAndTheVictimResumes) {
  Cluster c("preempt");
  c.start_coordinator();
  c.start_worker("w1");
  const std::string low = c.submit(write_job(c, "low", 3000, 0, 1, /*priority=*/0));
  ASSERT_TRUE(wait_until([&] { return step_of(c, low) >= 100; }, 120s)) << c.status(low).dump();
  const std::string high = c.submit(write_job(c, "high", 4, 0, 1, /*priority=*/10));
  ASSERT_TRUE(c.wait_state(low, "PREEMPTED", 15s)) << c.status(low).dump();
  ASSERT_TRUE(c.wait_state(high, "SUCCEEDED", 60s)) << c.status(high).dump();
  ASSERT_TRUE(c.wait_state(low, "SUCCEEDED", 180s)) << c.status(low).dump();
  const nlohmann::json st = c.status(low);
  EXPECT_EQ(i64(st, "preemptions", 0), 1);
  EXPECT_EQ(i64(st, "restarts", -1), 0);  // preemption is not a failure
  EXPECT_GE(i64(st, "resumed_from_step", 0), 100);
}

// WorkerService.HeartbeatStream, against a coordinator with a 500 ms interval and a 4 s
// lease: beats on a stream keep a lease past its length; a beat with attempts is refused
// naming the field; a stale incarnation is fenced; a stream that breaks (here cancelled by
// its client, as a dead process's closed connection does) loses its worker one interval
// later, saying so; a stream closed from the worker's side first does not; and a stream the
// worker already replaced cuts nothing when it breaks.
TEST(Service, HeartbeatStreamKeepsLeasesAndABrokenOneLosesItsWorkerAfterOneInterval) {
  Cluster c("hb-stream");
  c.start_coordinator();
  auto stub = v1::WorkerService::NewStub(rpc::make_channel(c.address()));
  std::map<std::string, std::string> sessions;  // each worker's, from RegisterWorker
  auto register_as = [&](const std::string& name) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_role(v1::OPTIMIZER);  // no rendezvous ports needed
    req.mutable_resources()->set_host_memory_bytes(int64_t{1} << 30);
    req.mutable_resources()->set_physical_cores(1);
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s);
    EXPECT_TRUE(stub->RegisterWorker(&ctx, req, &resp).ok()) << name;
    sessions[name] = resp.session();
    return resp.incarnation();
  };
  auto beat_of = [](const std::string& name, int64_t incarnation) {
    v1::HeartbeatRequest b;
    b.set_name(name);
    b.set_incarnation(incarnation);
    return b;
  };
  const int64_t a = register_as("a"), b = register_as("b"), k = register_as("k");
  // A raw stream, to break it: its client cancels it.
  struct Raw {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReaderWriter<v1::HeartbeatRequest, v1::HeartbeatResponse>> rw;
    bool beat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
      return rw->Write(req) && rw->Read(resp);
    }
    void break_it() {
      ctx.TryCancel();
      (void)rw->Finish();
    }
  };
  auto open_raw = [&](Raw& r, const std::string& name) {
    rpc::prepare_call(r.ctx, c.worker_token(), 120s, sessions[name]);
    r.rw = stub->HeartbeatStream(&r.ctx);
  };
  Raw ra, rk;
  open_raw(ra, "a");
  open_raw(rk, "k");
  rpc::HeartbeatStream sb(*stub, c.worker_token());
  sb.set_session(sessions["b"]);
  v1::HeartbeatResponse resp;
  for (int round = 0; round < 12; ++round) {  // 6 s: past the 4 s lease
    ASSERT_TRUE(ra.beat(beat_of("a", a), &resp));
    ASSERT_TRUE(rk.beat(beat_of("k", k), &resp));
    ASSERT_TRUE(sb.beat(beat_of("b", b), &resp, 2s).ok());
    EXPECT_EQ(resp.heartbeat_interval_ms(), 500);
    EXPECT_EQ(resp.lease_ms(), 4000);
    std::this_thread::sleep_for(500ms);
  }
  EXPECT_TRUE(sb.open());
  for (const char* w : {"a", "b", "k"}) EXPECT_EQ(worker_state(c, w), "READY") << w;

  {  // attempts go by Heartbeat; a stale incarnation is fenced
    rpc::HeartbeatStream other(*stub, c.worker_token());
    other.set_session(sessions["a"]);
    v1::HeartbeatRequest with_attempts = beat_of("a", a);
    with_attempts.add_attempts()->set_job_id("j-000001");
    const grpc::Status s = other.beat(with_attempts, &resp, 2s);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("attempts"), std::string::npos) << s.error_message();
    EXPECT_FALSE(other.open());
    EXPECT_EQ(other.beat(beat_of("a", a + 100), &resp, 2s).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }

  // k's beats move to a new stream, whereupon its old one breaks; b closes its only stream
  // from its side; a's only stream breaks. Then all three are silent.
  rpc::HeartbeatStream sk(*stub, c.worker_token());
  sk.set_session(sessions["k"]);
  ASSERT_TRUE(sk.beat(beat_of("k", k), &resp, 2s).ok());
  ASSERT_TRUE(sb.beat(beat_of("b", b), &resp, 2s).ok());
  ASSERT_TRUE(ra.beat(beat_of("a", a), &resp));
  const auto broke = std::chrono::steady_clock::now();
  rk.break_it();
  sb.close();
  ra.break_it();
  // a: LOST one interval (500 ms) after the break, long before its lease (4 s) would end.
  EXPECT_TRUE(wait_until([&] { return worker_state(c, "a") == "LOST"; }, 3s));
  EXPECT_LT(std::chrono::steady_clock::now() - broke, 3s);
  // b and k, silent as long, keep their leases (a cut would have lost them by now)...
  std::this_thread::sleep_until(broke + 2s);
  EXPECT_EQ(worker_state(c, "k"), "READY");
  EXPECT_EQ(worker_state(c, "b"), "READY");
  // ...until those run out.
  EXPECT_TRUE(
      wait_until([&] { return worker_state(c, "b") == "LOST" && worker_state(c, "k") == "LOST"; }, 6s));
  const std::string log = read_file(c.dir() / "coordinator-1.log");
  EXPECT_NE(log.find("worker a LOST: its heartbeat stream broke"), std::string::npos) << log;
  EXPECT_NE(log.find("worker b LOST: no heartbeat for"), std::string::npos) << log;
  EXPECT_NE(log.find("worker k LOST: no heartbeat for"), std::string::npos) << log;
}

// --- the agent: never lose, corrupt or double-run a job ---

// The live processes of cluster `c` whose environment names job `id` (ZENFLOW_JOB_ID, which
// the agent gives each rank; job ids repeat across clusters, so the command line must name
// the cluster's directory too). A zombie's environment reads empty: it counts as gone.
std::vector<pid_t> pids_of_job(const Cluster& c, const std::string& id) {
  const std::string needle = std::string("ZENFLOW_JOB_ID=") + id + '\0';
  std::vector<pid_t> out;
  for (pid_t pid : pids_with_cmdline(c.dir().string())) {
    const std::string env = '\0' + read_file(fs::path("/proc") / std::to_string(pid) / "environ");
    if (env.find('\0' + needle) != std::string::npos) out.push_back(pid);
  }
  return out;
}

// Whether `sig` was sent to `pid` and not delivered yet (a stopped process keeps it pending).
bool signal_pending(pid_t pid, int sig) {
  std::istringstream status(read_file(fs::path("/proc") / std::to_string(pid) / "status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigPnd:", 0) != 0 && line.rfind("ShdPnd:", 0) != 0) continue;
    const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
    if (mask & (uint64_t{1} << (sig - 1))) return true;
  }
  return false;
}

int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// The attempt ends while the coordinator is down; the assignment set the agent fetched
// before still lists it when the restarted coordinator acknowledges its exit (the agent's
// long poll may answer only later). The agent must not run the attempt a second time.
TEST(Service, AFinishedAttemptIsNeverStartedAgainAfterACoordinatorRestart) {
  Cluster c("no-rerun");
  c.start_coordinator();
  c.start_worker("w1");
  const std::string id = c.submit(write_job(c, "once", 1000, 500));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 1; }, 120s)) << c.status(id).dump();
  c.coordinator().kill(SIGKILL);
  ASSERT_TRUE(wait_until([&] { return pids_of_job(c, id).empty(); }, 60s)) << "the job did not end on its own";
  const fs::path steps = c.dir() / "ckpt-once" / "steps.jsonl";
  c.start_coordinator();
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 30s)) << c.status(id).dump() << c.worker("w1").output();
  const std::string records = read_file(steps);
  ASSERT_FALSE(records.empty()) << steps;
  std::this_thread::sleep_for(8s);
  const std::string log = c.worker("w1").output();
  EXPECT_EQ(count_of(log, "job " + id + " attempt 1: started ranks"), 1) << log;
  EXPECT_EQ(count_of(log, "job " + id + " attempt"), count_of(log, "job " + id + " attempt 1:")) << log;
  EXPECT_TRUE(pids_of_job(c, id).empty());
  EXPECT_EQ(read_file(steps), records) << "steps.jsonl gained records after the job's end";
  const nlohmann::json st = c.status(id);
  EXPECT_EQ(st.value("state", ""), "SUCCEEDED");
  EXPECT_EQ(i64(st, "attempt", 0), 1);
  EXPECT_EQ(i64(st, "restarts", -1), 0);
}

// A work dir that cannot be written (here a full tmpfs) is the worker's fault: the attempt
// starts nothing and ends with status 74, which the coordinator requeues, saying why. Once
// there is room again the job runs and succeeds.
TEST(Service, AFullWorkDirFailsTheAttemptAsTheWorkersFaultAndTheJobIsRequeued) {
  Cluster c("full-work-dir");
  const fs::path work = c.dir() / "work-w1";
  fs::create_directories(work);
  std::string out;
  if (test_support::run("mount -t tmpfs -o size=64k zenflow-test " + work.string() + " 2>&1", &out) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs CAP_SYS_ADMIN): " << out;
  struct Unmount {
    fs::path dir;
    ~Unmount() { test_support::run("umount -l " + dir.string() + " 2>/dev/null"); }
  } unmount{work};  // before the cluster goes: its processes may still hold files there
  test_support::run("head -c 1048576 /dev/zero > " + (work / "filler").string() + " 2>/dev/null");
  ASSERT_GT(fs::file_size(work / "filler"), 0u);
  c.start_coordinator();
  c.start_worker("w1");
  const fs::path spec = write_job(c, "full", 4, 0);
  std::string text = read_file(spec);
  text.replace(text.find("max_restarts: 2"), 15, "max_restarts: 1000");
  write_file(spec, text);
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty());
  nlohmann::json st;
  ASSERT_TRUE(wait_until(
      [&] {
        st = c.status(id);
        return st.value("last_error", "").find("cannot write its work dir") != std::string::npos;
      },
      30s))
      << st.dump() << c.worker("w1").output();
  fs::remove(work / "filler");
  const std::string error = st.value("last_error", "");
  EXPECT_NE(error.find("ranks on w1 exited with status 74: the agent cannot write its work dir " +
                       (work / "jobs" / id).string() + "/attempt-"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find(": No space left on device; requeued (restart "), std::string::npos) << error;
  EXPECT_GE(i64(st, "restarts", 0), 1);
  EXPECT_EQ(i64(st, "exit_code", 0), 74);
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 120s)) << c.status(id).dump() << c.worker("w1").output();
  st = c.status(id);
  EXPECT_GE(i64(st, "attempt", 0), 2);
  EXPECT_EQ(i64(st, "step", 0), 4);
}

// Cut off from the coordinator (SIGSTOP: its connection stays open, it answers nothing), the
// agent fences itself, counting from the sending of its last accepted heartbeat: SIGTERM to
// the ranks at --disconnected-grace, SIGKILL at grace + --disconnect-drain, all before the
// fence_ms it registered with. The rank is frozen too, so that only the agent's signals end
// it (neither its SIGTERM handler nor its own lease can).
TEST(Service, AWorkerCutOffFromTheCoordinatorStopsItsRanksByItsFence) {
  Cluster c("self-fence");
  c.start_coordinator();
  c.start_worker("w1", 1, {"--disconnected-grace", "4", "--disconnect-drain", "3"});
  const std::string id = c.submit(write_job(c, "cut-off", 100000, 0));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 3; }, 120s)) << c.status(id).dump();
  // Registered before the coordinator's lease (4 s) and interval (500 ms) were known: the
  // defaults (4 s, 1 s) give a rank lease of 2 s, and the ranks get no longer one.
  std::smatch m;
  const std::string registered = c.worker("w1").output();
  ASSERT_TRUE(std::regex_search(registered, m, std::regex("fence ([0-9]+) ms"))) << registered;
  const int64_t fence_ms = std::stoll(m[1].str());
  EXPECT_EQ(fence_ms, 4000 + 3000 + 2000);
  const std::vector<pid_t> ranks = pids_of_job(c, id);
  ASSERT_EQ(ranks.size(), 1u);
  ::kill(ranks[0], SIGSTOP);
  c.coordinator().signal(SIGSTOP);
  // The last accepted beat was sent before this, at most one interval (500 ms) and a reply
  // earlier.
  const auto t0 = std::chrono::steady_clock::now();
  auto since_t0 = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  };
  int64_t term_ms = -1, gone_ms = -1;
  while (since_t0() < 15000 && gone_ms < 0) {
    if (term_ms < 0 && signal_pending(ranks[0], SIGTERM)) term_ms = since_t0();
    if (pids_of_job(c, id).empty()) gone_ms = since_t0();
    std::this_thread::sleep_for(20ms);
  }
  c.coordinator().signal(SIGCONT);
  const std::string log = c.worker("w1").output();
  EXPECT_GE(term_ms, 4000 - 700) << log;
  EXPECT_LE(term_ms, 4000 + 500) << log;
  EXPECT_GE(gone_ms, 7000 - 700) << log;
  EXPECT_LT(gone_ms, fence_ms) << log;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("no heartbeat accepted for ([0-9]+) ms \\(since the last accepted "
                                                   "one was sent; --disconnected-grace 4000 ms\\): asking every "
                                                   "job's ranks to checkpoint and stop")))
      << log;
  EXPECT_GE(std::stoll(m[1].str()), 4000);
  EXPECT_LT(std::stoll(m[1].str()), 4500);
  ASSERT_TRUE(std::regex_search(log, m, std::regex("no heartbeat accepted for ([0-9]+) ms \\(--disconnected-grace \\+ "
                                                   "--disconnect-drain 7000 ms\\): killing every rank")))
      << log;
  EXPECT_GE(std::stoll(m[1].str()), 7000);
  EXPECT_LT(std::stoll(m[1].str()), 7500);
}

// resources.hang_timeout: a rank that stops making progress (frozen by SIGSTOP once it has
// reported steps) is killed after the timeout, and the job is requeued saying at which step
// it hung; the next attempt resumes and succeeds.
TEST(Service, AHungRankIsKilledAndTheJobRequeuedWithItsStep) {
  Cluster c("hang");
  c.start_coordinator();
  c.start_worker("w1");
  const fs::path spec = write_job(c, "hang", 4000, 50);
  std::string text = read_file(spec);
  text.replace(text.find("max_restarts: 2"), 15, "max_restarts: 2, hang_timeout: 30");
  write_file(spec, text);
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_until([&] { return step_of(c, id) >= 5; }, 120s)) << c.status(id).dump();
  const std::vector<pid_t> ranks = pids_of_job(c, id);
  ASSERT_EQ(ranks.size(), 1u);
  ::kill(ranks[0], SIGSTOP);
  const auto stopped = std::chrono::steady_clock::now();
  nlohmann::json st;
  ASSERT_TRUE(wait_until(
      [&] {
        st = c.status(id);
        return st.value("last_error", "").find("hung at step") != std::string::npos;
      },
      45s))
      << st.dump() << c.worker("w1").output();
  const auto waited = std::chrono::steady_clock::now() - stopped;
  EXPECT_GE(waited, 29s);  // its last progress came at most one report (250 ms) before the stop
  const std::string error = st.value("last_error", "");
  std::smatch m;
  const std::regex hung(
      "ranks on w1 killed by signal 9: hung at step ([0-9]+): no progress for ([0-9]+) s "
      "\\(resources.hang_timeout 30 s\\); requeued \\(restart 1 of 2\\)");
  ASSERT_TRUE(std::regex_search(error, m, hung)) << error;
  EXPECT_GE(std::stoll(m[1].str()), 5);
  EXPECT_GE(std::stoll(m[2].str()), 30);
  EXPECT_LE(std::stoll(m[2].str()), 32);
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 120s)) << c.status(id).dump() << c.worker("w1").output();
  st = c.status(id);
  EXPECT_EQ(i64(st, "attempt", 0), 2);
  EXPECT_EQ(i64(st, "restarts", -1), 1);
  EXPECT_EQ(i64(st, "step", 0), 4000);
}

// --keep-attempt-dirs 2: once the coordinator holds an attempt's exit and output, its
// directory goes, except the two that ended last; a job's directory goes with its last one.
TEST(Service, OldAttemptDirectoriesAreRemovedKeepingTheNewestN) {
  Cluster c("keep-dirs");
  c.start_coordinator();
  c.start_worker("w1", 1, {"--keep-attempt-dirs", "2"});
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {  // one after the other: they end in this order
    ids.push_back(c.submit(write_job(c, "keep" + std::to_string(i), 3, 0)));
    ASSERT_FALSE(ids.back().empty());
    ASSERT_TRUE(c.wait_state(ids.back(), "SUCCEEDED", 120s)) << c.status(ids.back()).dump();
  }
  const fs::path jobs = c.dir() / "work-w1" / "jobs";
  auto listing = [&] {
    std::vector<std::string> out;
    for (const auto& job : fs::directory_iterator(jobs))
      for (const auto& attempt : fs::directory_iterator(job.path()))
        out.push_back(job.path().filename().string() + "/" + attempt.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  };
  const std::vector<std::string> want = {ids[2] + "/attempt-1", ids[3] + "/attempt-1"};
  EXPECT_TRUE(wait_until([&] { return listing() == want; }, 10s)) << ::testing::PrintToString(listing());
  EXPECT_FALSE(fs::exists(jobs / ids[0]));
  EXPECT_FALSE(fs::exists(jobs / ids[1]));
  EXPECT_NE(read_file(jobs / ids[3] / "attempt-1" / "output.log").find("[rank 0]"), std::string::npos);
  EXPECT_NE(read_file(jobs / ids[3] / "attempt-1" / "job.yaml").find("name: keep3"), std::string::npos);
}

// --max-attempt-log-bytes: output.log stops at its cap with one line saying so; the
// coordinator still gets the whole output.
TEST(Service, AnAttemptsOutputLogStopsAtItsCapAndTheCoordinatorStillGetsAllOfIt) {
  Cluster c("log-cap");
  c.start_coordinator();
  c.start_worker("w1", 1, {"--max-attempt-log-bytes", "200"});
  const std::string id = c.submit(write_job(c, "chatty", 4, 0));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 120s)) << c.status(id).dump();
  const std::string marker =
      "[zenflow-worker] output.log reached its cap of 200 bytes; later output is only uploaded\n";
  const std::string local = read_file(c.dir() / "work-w1" / "jobs" / id / "attempt-1" / "output.log");
  ASSERT_GE(local.size(), marker.size());
  EXPECT_LE(local.size(), 200 + marker.size());
  EXPECT_EQ(local.substr(local.size() - marker.size()), marker);
  EXPECT_EQ(count_of(local, "[zenflow-worker]"), 1);
  const std::string kept = local.substr(0, local.size() - marker.size());
  const std::string uploaded = logs_of(c, id);
  EXPECT_NE(uploaded.find(kept), std::string::npos) << uploaded;
  EXPECT_GT(count_of(uploaded, "[rank 0]"), count_of(kept, "[rank 0]")) << uploaded;
  EXPECT_EQ(uploaded.find("[zenflow-worker] output.log reached its cap"), std::string::npos);
}

// A rank whose last line is not UTF-8 (here a stand-in trainer printing raw bytes): its exit
// is reported with the bytes replaced by U+FFFD, so the coordinator can parse the report and
// the job ends, instead of the report being refused and retried forever.
TEST(Service, ARanksInvalidUtf8OutputStillEndsItsJob) {
  Cluster c("utf8");
  c.start_coordinator();
  const fs::path trainer = c.dir() / "bad-bytes-trainer.sh";
  write_file(trainer, "#!/bin/sh\nprintf 'loss went \\377\\376 wrong\\n'\nexit 1\n");
  fs::permissions(trainer, fs::perms::owner_all);
  std::vector<std::string> argv = {Cluster::bin("zenflow-worker"),
                                   "--coordinator",
                                   c.address(),
                                   "--work-dir",
                                   (c.dir() / "work-w1").string(),
                                   "--name",
                                   "w1",
                                   "--cpu-only",
                                   "--cpu-slots",
                                   "1",
                                   "--host-memory-gb",
                                   "8",
                                   "--physical-cores",
                                   "2",
                                   "--trainer",
                                   trainer.string(),
                                   "--token-file",
                                   (c.dir() / "worker.token").string()};
  const std::vector<std::string> roots = c.worker_root_flags();
  argv.insert(argv.end(), roots.begin(), roots.end());
  test_support::Process worker(argv, c.dir() / "worker-w1.log");
  const std::string id = c.submit(write_job(c, "bytes", 4, 0));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(c.wait_state(id, "FAILED", 30s)) << c.status(id).dump() << worker.output();
  const std::string error = c.status(id).value("last_error", "");
  EXPECT_NE(error.find("rank 0 exited with status 1: loss went \xEF\xBF\xBD\xEF\xBF\xBD wrong"), std::string::npos)
      << error;
}

// --- security ---

// Who calls: no token, a wrong one, the worker join token (alone, with another worker's
// session, or with the right worker's session), the admin token.
enum class Who { kNone, kWrong, kWorker, kOtherSession, kSession, kAdmin };
const char* who_name(Who who) {
  switch (who) {
    case Who::kNone: return "no token";
    case Who::kWrong: return "a wrong token";
    case Who::kWorker: return "the join token";
    case Who::kOtherSession: return "the join token and another worker's session";
    case Who::kSession: return "the join token and the worker's session";
    case Who::kAdmin: return "the admin token";
  }
  return "?";
}

// The worker every worker-scoped call names, registered with the join token, and the
// session of another worker (an intruder that registered too).
struct Victim {
  std::string name;
  int64_t incarnation = 0;
  std::string session, other_session;
};
Victim register_victim(const Cluster& c, const rpc::ChannelOptions& co) {
  auto stub = v1::WorkerService::NewStub(rpc::make_channel(c.address(), co));
  Victim v;
  v.name = "victim";
  for (const char* name : {"victim", "intruder"}) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_role(v1::OPTIMIZER);  // never placed on, no ports needed
    req.mutable_resources()->set_host_memory_bytes(int64_t{1} << 30);
    req.mutable_resources()->set_physical_cores(1);
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s);
    const grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << name << ": " << rpc::describe(s);
    EXPECT_EQ(resp.session().size(), 64u) << name;
    if (std::string(name) == "victim") {
      v.incarnation = resp.incarnation();
      v.session = resp.session();
    } else {
      v.other_session = resp.session();
    }
  }
  EXPECT_NE(v.session, v.other_session);
  return v;
}

std::string token_for(const Cluster& c, Who who) {
  switch (who) {
    case Who::kNone: return "";
    case Who::kWrong: return "definitely-not-the-token-0000";
    case Who::kWorker:
    case Who::kOtherSession:
    case Who::kSession: return c.worker_token();
    case Who::kAdmin: return c.admin_token();
  }
  return "";
}

// Calls every RPC of both services with `who`'s token; returns method -> status code.
// Calls every RPC of both services as `who`; the worker-scoped ones name `victim`. Returns
// method -> status code.
std::map<std::string, grpc::StatusCode> call_everything(const Cluster& c, Who who, const Victim& victim,
                                                        const rpc::ChannelOptions& co = {}) {
  auto channel = rpc::make_channel(c.address(), co);
  auto jobs = v1::JobService::NewStub(channel);
  auto workers = v1::WorkerService::NewStub(channel);
  const std::string token = token_for(c, who);
  const std::string session = who == Who::kSession        ? victim.session
                              : who == Who::kOtherSession ? victim.other_session
                                                          : "";
  std::map<std::string, grpc::StatusCode> out;
  auto unary = [&](const std::string& name, auto stub, auto method, auto req, auto resp) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, token, 5s, session);
    out[name] = ((*stub).*method)(&ctx, req, &resp).error_code();
  };
  v1::SubmitJobRequest submit;
  submit.set_spec_yaml("name: x\n");  // invalid: an authorized caller gets INVALID_ARGUMENT
  unary("SubmitJob", jobs.get(), &v1::JobService::Stub::SubmitJob, submit, v1::SubmitJobResponse{});
  v1::GetJobRequest get;
  get.set_id("j-nope");
  unary("GetJob", jobs.get(), &v1::JobService::Stub::GetJob, get, v1::JobStatus{});
  unary("ListJobs", jobs.get(), &v1::JobService::Stub::ListJobs, v1::ListJobsRequest{}, v1::ListJobsResponse{});
  v1::CancelJobRequest cancel;
  cancel.set_id("j-nope");
  unary("CancelJob", jobs.get(), &v1::JobService::Stub::CancelJob, cancel, v1::CancelJobResponse{});
  unary("ListWorkers", jobs.get(), &v1::JobService::Stub::ListWorkers, v1::ListWorkersRequest{},
        v1::ListWorkersResponse{});
  // A server stream: read it to the end, keep the final status.
  auto stream = [&](const std::string& name, auto method, auto req, auto message) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, token, 5s);
    auto reader = ((*jobs).*method)(&ctx, req);
    while (reader->Read(&message)) {
    }
    out[name] = reader->Finish().error_code();
  };
  v1::WatchJobRequest watch;
  watch.set_id("j-nope");
  stream("WatchJob", &v1::JobService::Stub::WatchJob, watch, v1::JobEvent{});
  v1::StreamLogsRequest logs;
  logs.set_id("j-nope");
  stream("StreamLogs", &v1::JobService::Stub::StreamLogs, logs, v1::LogChunk{});
  v1::RegisterWorkerRequest reg;  // invalid (no name): INVALID_ARGUMENT when authorized
  unary("RegisterWorker", workers.get(), &v1::WorkerService::Stub::RegisterWorker, reg, v1::RegisterWorkerResponse{});
  v1::HeartbeatRequest hb;
  hb.set_name(victim.name);
  hb.set_incarnation(victim.incarnation);
  unary("Heartbeat", workers.get(), &v1::WorkerService::Stub::Heartbeat, hb, v1::HeartbeatResponse{});
  {  // a bidi stream: one beat, then the stream's final status
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, token, 5s, session);
    auto beats = workers->HeartbeatStream(&ctx);
    beats->Write(hb);
    beats->WritesDone();
    v1::HeartbeatResponse ignored;
    while (beats->Read(&ignored)) {
    }
    out["HeartbeatStream"] = beats->Finish().error_code();
  }
  v1::FetchAssignmentsRequest fetch;
  fetch.set_name(victim.name);
  fetch.set_incarnation(victim.incarnation);
  unary("FetchAssignments", workers.get(), &v1::WorkerService::Stub::FetchAssignments, fetch,
        v1::FetchAssignmentsResponse{});
  v1::ReportProgressRequest progress;
  progress.set_name(victim.name);
  progress.set_incarnation(victim.incarnation);
  unary("ReportProgress", workers.get(), &v1::WorkerService::Stub::ReportProgress, progress,
        v1::ReportProgressResponse{});
  v1::ReportEventRequest event;
  event.set_name(victim.name);
  event.set_incarnation(victim.incarnation);
  unary("ReportEvent", workers.get(), &v1::WorkerService::Stub::ReportEvent, event, v1::ReportEventResponse{});
  v1::UploadLogsRequest upload;
  upload.set_name(victim.name);
  upload.set_incarnation(victim.incarnation);
  unary("UploadLogs", workers.get(), &v1::WorkerService::Stub::UploadLogs, upload, v1::UploadLogsResponse{});
  v1::GetJobProfileRequest profile;
  profile.set_id("j-nope");
  unary("GetJobProfile", jobs.get(), &v1::JobService::Stub::GetJobProfile, profile, v1::JobProfile{});
  v1::UploadProfileRequest upload_profile;
  upload_profile.set_name(victim.name);
  upload_profile.set_incarnation(victim.incarnation);
  unary("UploadProfile", workers.get(), &v1::WorkerService::Stub::UploadProfile, upload_profile,
        v1::UploadProfileResponse{});
  // Every method of both services is in the matrix: a new RPC cannot skip it.
  for (const char* name : {v1::JobService::service_full_name(), v1::WorkerService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    EXPECT_NE(service, nullptr) << name;
    if (service == nullptr) continue;
    for (int i = 0; i < service->method_count(); ++i)
      EXPECT_TRUE(out.count(service->method(i)->name())) << service->method(i)->full_name() << " is not called";
  }
  return out;
}

bool is_job_rpc(const std::string& m) {
  return m == "SubmitJob" || m == "GetJob" || m == "ListJobs" || m == "CancelJob" || m == "ListWorkers" ||
         m == "WatchJob" || m == "StreamLogs" || m == "GetJobProfile";
}

// Asks server reflection (v1alpha, the one libgrpc++ 1.51 serves) at `address` for its
// services; returns the status, and the names when `services` is given.
grpc::StatusCode reflect(const std::string& address, const std::string& token, const rpc::ChannelOptions& co,
                         std::vector<std::string>* services = nullptr) {
  namespace r = grpc::reflection::v1alpha;
  auto stub = r::ServerReflection::NewStub(rpc::make_channel(address, co));
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, token, 5s);
  auto stream = stub->ServerReflectionInfo(&ctx);
  r::ServerReflectionRequest req;
  req.set_list_services("*");
  stream->Write(req);
  stream->WritesDone();
  r::ServerReflectionResponse resp;
  while (stream->Read(&resp))
    if (services)
      for (const r::ServiceResponse& sr : resp.list_services_response().service()) services->push_back(sr.name());
  return stream->Finish().error_code();
}

grpc::StatusCode health(const Cluster& c, const rpc::ChannelOptions& co = {}) {
  auto stub = grpc::health::v1::Health::NewStub(rpc::make_channel(c.address(), co));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest{}, &resp);
  if (s.ok() && resp.status() != grpc::health::v1::HealthCheckResponse::SERVING) return grpc::StatusCode::UNAVAILABLE;
  return s.error_code();
}

// The threat model's table (docs/security.md), row by row: every method of both services
// called as each of Who. JobService needs the admin token; RegisterWorker the join token (or
// the admin's); every other WorkerService method the session of the worker it names, whatever
// the token (the admin token is no worker's: it reads jobs through JobService).
void expect_auth_matrix(const Cluster& c, const rpc::ChannelOptions& co = {}) {
  const Victim victim = register_victim(c, co);
  for (Who who : {Who::kNone, Who::kWrong, Who::kWorker, Who::kOtherSession, Who::kSession, Who::kAdmin}) {
    const bool join_token = who == Who::kWorker || who == Who::kOtherSession || who == Who::kSession;
    for (const auto& [method, code] : call_everything(c, who, victim, co)) {
      SCOPED_TRACE(method + " with " + who_name(who));
      const bool job = is_job_rpc(method);
      const bool as_worker = !job && method != "RegisterWorker";
      if (who == Who::kNone || who == Who::kWrong) {
        EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED);
      } else if (join_token && job) {
        EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED);
      } else if (as_worker && who != Who::kSession) {
        EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED);  // no session, or not this worker's
      } else {
        // Authorized: the application's own answer to a bad or unknown request.
        EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED);
        EXPECT_NE(code, grpc::StatusCode::PERMISSION_DENIED);
        EXPECT_NE(code, grpc::StatusCode::UNAVAILABLE);
        EXPECT_NE(code, grpc::StatusCode::UNIMPLEMENTED);
      }
    }
    // Reflection, too, needs a token (either role); it lists the zenflow services.
    SCOPED_TRACE(std::string("reflection with ") + who_name(who));
    std::vector<std::string> services;
    const grpc::StatusCode code = reflect(c.address(), token_for(c, who), co, &services);
    if (who == Who::kNone || who == Who::kWrong) {
      EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED);
      EXPECT_TRUE(services.empty());
    } else {
      EXPECT_EQ(code, grpc::StatusCode::OK);
      EXPECT_NE(std::find(services.begin(), services.end(), "zenflow.v1.JobService"), services.end());
      EXPECT_NE(std::find(services.begin(), services.end(), "zenflow.v1.WorkerService"), services.end());
    }
  }
  EXPECT_EQ(health(c, co), grpc::StatusCode::OK);  // exempt: no token
}

// The join token is no master key: a worker (this test, speaking WorkerService) runs a job;
// an intruder holding the join token registers a worker of its own and then tries, as the
// victim (its name and incarnation, without a session or with its own) and as itself, to read
// the victim's job spec, forge its progress and its completion, append to its log. Every try
// is refused, and the job is as the real worker left it. (Before sessions, each succeeded:
// the incarnation, a small sequential integer, was all that named a worker.)
TEST(ServiceSecurity, TheJoinTokenCannotActAsAnotherWorkerOrForgeItsJob) {
  Cluster c("forge");
  c.start_coordinator();
  auto stub = v1::WorkerService::NewStub(rpc::make_channel(c.address()));
  auto register_as = [&](const std::string& name, v1::WorkerRole role) {
    v1::RegisterWorkerRequest req;
    req.set_name(name);
    req.set_role(role);
    req.mutable_resources()->set_cpu_slots(role == v1::TRAINER ? 1 : 0);
    req.mutable_resources()->set_host_memory_bytes(int64_t{8} << 30);
    req.mutable_resources()->set_physical_cores(2);
    if (role == v1::TRAINER) req.add_rendezvous_ports(29500);
    v1::RegisterWorkerResponse resp;
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s);
    const grpc::Status s = stub->RegisterWorker(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << name << ": " << rpc::describe(s);
    return resp;
  };
  const v1::RegisterWorkerResponse victim = register_as("w1", v1::TRAINER);
  const fs::path spec = c.dir() / "job.yaml";
  test_support::write_file(spec, test_support::tiny_job_spec("forge", 100));
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty());

  // Calls as worker `name` (incarnation `inc`) presenting `session`.
  auto fetch = [&](const std::string& name, int64_t inc, const std::string& session,
                   v1::FetchAssignmentsResponse* out) {
    v1::FetchAssignmentsRequest req;
    req.set_name(name);
    req.set_incarnation(inc);
    req.set_wait_ms(2000);
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s, session);
    return stub->FetchAssignments(&ctx, req, out);
  };
  v1::FetchAssignmentsResponse assigned;
  ASSERT_TRUE(test_support::wait_until(
      [&] { return fetch("w1", victim.incarnation(), victim.session(), &assigned).ok() && assigned.assignments_size() > 0; },
      20s));
  const int64_t attempt = assigned.assignments(0).attempt();
  const int64_t total = i64(c.status(id), "total_steps", 0);
  ASSERT_GT(total, 20);
  auto progress = [&](const std::string& name, int64_t inc, const std::string& session, int64_t step, double loss) {
    v1::ReportProgressRequest req;
    req.set_name(name);
    req.set_incarnation(inc);
    req.mutable_attempt()->set_job_id(id);
    req.mutable_attempt()->set_attempt(attempt);
    req.set_step(step);
    req.set_total_steps(total);
    req.set_loss(loss);
    req.set_tokens_per_second(1000);
    req.set_stall_share(0.1);
    req.set_step_seconds(0.5);
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s, session);
    v1::ReportProgressResponse ignored;
    return stub->ReportProgress(&ctx, req, &ignored).error_code();
  };
  auto finished = [&](const std::string& name, int64_t inc, const std::string& session) {
    v1::ReportEventRequest req;
    req.set_name(name);
    req.set_incarnation(inc);
    req.mutable_attempt()->set_job_id(id);
    req.mutable_attempt()->set_attempt(attempt);
    req.mutable_attempt()->set_exited(true);
    req.mutable_attempt()->set_exit_code(0);
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s, session);
    v1::ReportEventResponse ignored;
    return stub->ReportEvent(&ctx, req, &ignored).error_code();
  };
  auto finished_by_heartbeat = [&](const std::string& name, int64_t inc, const std::string& session) {
    v1::HeartbeatRequest req;
    req.set_name(name);
    req.set_incarnation(inc);
    v1::AttemptReport* r = req.add_attempts();
    r->set_job_id(id);
    r->set_attempt(attempt);
    r->set_exited(true);
    r->set_exit_code(0);
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s, session);
    v1::HeartbeatResponse ignored;
    return stub->Heartbeat(&ctx, req, &ignored).error_code();
  };
  auto streamed_progress = [&](const std::string& name, int64_t inc, const std::string& session) {
    v1::HeartbeatRequest beat;
    beat.set_name(name);
    beat.set_incarnation(inc);
    v1::ReportProgressRequest* p = beat.add_progress();
    p->set_name(name);
    p->set_incarnation(inc);
    p->mutable_attempt()->set_job_id(id);
    p->mutable_attempt()->set_attempt(attempt);
    p->set_step(total - 1);
    p->set_total_steps(total);
    p->set_loss(0.001);
    rpc::HeartbeatStream beats(*stub, c.worker_token());
    beats.set_session(session);
    v1::HeartbeatResponse ignored;
    return beats.beat(beat, &ignored, 5s).error_code();
  };
  auto log_bytes = [&](const std::string& name, int64_t inc, const std::string& session) {
    v1::UploadLogsRequest req;
    req.set_name(name);
    req.set_incarnation(inc);
    req.mutable_attempt()->set_job_id(id);
    req.mutable_attempt()->set_attempt(attempt);
    req.set_offset(0);
    req.set_data("FORGED LOG LINE\n");
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.worker_token(), 5s, session);
    v1::UploadLogsResponse ignored;
    return stub->UploadLogs(&ctx, req, &ignored).error_code();
  };

  // The real worker reports step 10.
  ASSERT_EQ(progress("w1", victim.incarnation(), victim.session(), 10, 3.25), grpc::StatusCode::OK);
  const v1::RegisterWorkerResponse intruder = register_as("intruder", v1::OPTIMIZER);
  ASSERT_NE(intruder.session(), victim.session());

  // As the victim, with no session or with the intruder's own.
  for (const std::string& session : {std::string(), intruder.session(), std::string(64, '0')}) {
    SCOPED_TRACE("as w1 presenting a session of " + std::to_string(session.size()) + " characters");
    v1::FetchAssignmentsResponse stolen;
    EXPECT_EQ(fetch("w1", victim.incarnation(), session, &stolen).error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(stolen.assignments_size(), 0) << "the victim's job spec leaked";
    EXPECT_EQ(progress("w1", victim.incarnation(), session, total - 1, std::nan("")), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(progress("w1", victim.incarnation(), session, total - 1, 0.001), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(finished("w1", victim.incarnation(), session), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(finished_by_heartbeat("w1", victim.incarnation(), session), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(streamed_progress("w1", victim.incarnation(), session), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(log_bytes("w1", victim.incarnation(), session), grpc::StatusCode::UNAUTHENTICATED);
  }
  // Guessing the incarnation gets no further: another incarnation of w1 is not leased.
  for (int64_t guess = victim.incarnation() - 2; guess <= victim.incarnation() + 2; ++guess) {
    if (guess == victim.incarnation()) continue;
    EXPECT_EQ(progress("w1", guess, intruder.session(), total - 1, 0.001), grpc::StatusCode::FAILED_PRECONDITION);
  }
  // As itself, with its own session: the attempt is not on it.
  EXPECT_EQ(progress("intruder", intruder.incarnation(), intruder.session(), total - 1, 0.001),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(finished("intruder", intruder.incarnation(), intruder.session()), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(log_bytes("intruder", intruder.incarnation(), intruder.session()), grpc::StatusCode::FAILED_PRECONDITION);
  v1::FetchAssignmentsResponse own;
  ASSERT_TRUE(fetch("intruder", intruder.incarnation(), intruder.session(), &own).ok());
  EXPECT_EQ(own.assignments_size(), 0);

  // The job is as the real worker left it: running, at step 10, loss 3.25, no forged log.
  const nlohmann::json st = c.status(id);
  EXPECT_EQ(st.value("state", ""), "RUNNING") << st.dump();
  EXPECT_EQ(i64(st, "step", -1), 10) << st.dump();
  EXPECT_DOUBLE_EQ(st.value("last_loss", 0.0), 3.25) << st.dump();
  std::string logs;
  c.cli("logs " + id, &logs);
  EXPECT_EQ(logs.find("FORGED"), std::string::npos) << logs;
  // And the real worker goes on.
  EXPECT_EQ(progress("w1", victim.incarnation(), victim.session(), 11, 3.0), grpc::StatusCode::OK);
  EXPECT_EQ(i64(c.status(id), "step", -1), 11);
}

TEST(ServiceSecurity, EveryRpcNeedsTheRightToken) {
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--health-port", "0"};
  Cluster c("auth", o);
  c.start_coordinator();
  expect_auth_matrix(c);
  // The plaintext health-only port (for Kubernetes probes) serves health and nothing else.
  const std::string out = c.coordinator().output();
  const std::smatch m = [&] {
    std::smatch mm;
    std::regex_search(out, mm, std::regex("health on ([0-9.]+:[0-9]+) \\(plaintext\\)"));
    return mm;
  }();
  ASSERT_EQ(m.size(), 2u) << out;
  const std::string health_address = m[1].str();
  EXPECT_EQ(reflect(health_address, c.admin_token(), {}), grpc::StatusCode::UNIMPLEMENTED);
  {
    auto stub = v1::JobService::NewStub(rpc::make_channel(health_address));
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.admin_token(), 5s);
    v1::ListJobsResponse resp;
    EXPECT_EQ(stub->ListJobs(&ctx, v1::ListJobsRequest{}, &resp).error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }
  // The CLI maps them to exit codes.
  EXPECT_EQ(c.cli("jobs", nullptr, c.dir() / "worker.token"), 4);
  write_file(c.dir() / "wrong.token", "wrong-token-0123456789abcdef\n");
  EXPECT_EQ(c.cli("jobs", nullptr, c.dir() / "wrong.token"), 4);
  EXPECT_EQ(c.cli("jobs"), 0);
  // The token is in no log.
  EXPECT_EQ(c.coordinator().output().find(c.admin_token()), std::string::npos);

  // Health by service name, and Watch: SERVING, then NOT_SERVING when SIGTERM drains it.
  using grpc::health::v1::HealthCheckResponse;
  auto health_stub = grpc::health::v1::Health::NewStub(rpc::make_channel(health_address));
  auto check = [&](const std::string& service, HealthCheckResponse::ServingStatus* status) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + 5s);
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    HealthCheckResponse resp;
    const grpc::Status s = health_stub->Check(&ctx, req, &resp);
    *status = resp.status();
    return s.error_code();
  };
  HealthCheckResponse::ServingStatus st{};
  EXPECT_EQ(check("zenflow.v1.JobService", &st), grpc::StatusCode::OK);
  EXPECT_EQ(st, HealthCheckResponse::SERVING);
  EXPECT_EQ(check("zenflow.v1.WorkerService", &st), grpc::StatusCode::OK);
  EXPECT_EQ(st, HealthCheckResponse::SERVING);
  EXPECT_EQ(check("no.such.Service", &st), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext watch_ctx;
  watch_ctx.set_deadline(std::chrono::system_clock::now() + 20s);
  auto watch = health_stub->Watch(&watch_ctx, grpc::health::v1::HealthCheckRequest{});
  HealthCheckResponse first;
  ASSERT_TRUE(watch->Read(&first));
  EXPECT_EQ(first.status(), HealthCheckResponse::SERVING);
  c.coordinator().kill(SIGTERM);
  HealthCheckResponse next;
  ASSERT_TRUE(watch->Read(&next)) << "the drain's NOT_SERVING never came";
  EXPECT_EQ(next.status(), HealthCheckResponse::NOT_SERVING);
}

TEST(ServiceSecurity, RefusesToServeOffLoopbackWithoutTokens) {
  Cluster c("no-tokens");
  test_support::Process p({Cluster::bin("zenflow-coordinator"), "--listen", "0.0.0.0:0", "--db",
                           (c.dir() / "x.db").string()},
                          c.dir() / "refuse.log");
  EXPECT_EQ(p.wait_exit(20s), 2);
  EXPECT_NE(p.output().find("refusing to serve without"), std::string::npos) << p.output();
  // With tokens, still no plaintext off loopback unless asked: the tokens would travel in the clear.
  write_file(c.dir() / "a.token", "admin-token-0123456789abcdef\n");
  write_file(c.dir() / "w.token", "worker-token-0123456789abcdef\n");
  test_support::Process q({Cluster::bin("zenflow-coordinator"), "--listen", "0.0.0.0:0", "--db",
                           (c.dir() / "y.db").string(), "--admin-token-file", (c.dir() / "a.token").string(),
                           "--worker-token-file", (c.dir() / "w.token").string()},
                          c.dir() / "refuse-plaintext.log");
  EXPECT_EQ(q.wait_exit(20s), 2);
  EXPECT_NE(q.output().find("refusing to send bearer tokens in plaintext"), std::string::npos) << q.output();
}

TEST(ServiceSecurity, SpecErrorsNameTheKeyServerSide) {
  Cluster c("bad-spec");
  c.start_coordinator();
  auto stub = v1::JobService::NewStub(rpc::make_channel(c.address()));
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, c.admin_token(), 5s);
  v1::SubmitJobRequest req;
  req.set_spec_yaml(read_file(write_job(c, "bad", 4, 0)) + "optimizer: {zenflow: {topk_ratio: 1.5}}\n");
  v1::SubmitJobResponse resp;
  const grpc::Status s = stub->SubmitJob(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("optimizer"), std::string::npos) << s.error_message();
  // Locally the CLI refuses a missing data path before sending (exit 2, naming the key).
  const fs::path missing = c.dir() / "missing.yaml";
  std::string spec = read_file(write_job(c, "missing", 4, 0));
  spec.replace(spec.find("/usr/share/common-licenses"), 26, "/nonexistent/data");
  write_file(missing, spec);
  EXPECT_EQ(c.cli("submit " + missing.string()), 2);
  EXPECT_NE(read_file(c.dir() / "cli.log").find("data.train"), std::string::npos);
}

// A worker confines the specs it runs to its allowed roots, by default its work dir alone,
// and advertises them: a job whose checkpoint.dir is under /etc waits at the coordinator,
// which says why; one that leaves the work dir through a symlink in it (the coordinator
// compares paths as written) is refused by the rank, exit 2 naming the key, and nothing is
// written where the link points. Before, a spec's checkpoint.dir: /etc made a worker write
// /etc/steps.jsonl, /etc/.zenflow.lock and /etc/step-00000090/.
TEST(ServiceSecurity, AWorkerConfinesSpecsToItsWorkDirByDefault) {
  Cluster c("roots");
  c.start_coordinator();
  const fs::path work = c.dir() / "work-w1", outside = c.dir() / "outside";
  fs::create_directories(work / "data");
  fs::create_directories(outside);
  write_file(work / "data" / "train.txt", std::string(4096, 'a'));
  fs::create_symlink(outside, work / "escape");
  auto job = [&](const std::string& name, const std::string& ckpt) {
    std::string spec = test_support::tiny_job_spec(name);
    spec.replace(spec.find("/usr/share/common-licenses"), 26, (work / "data").string());
    spec.replace(spec.find("checkpoint: {every_steps: 0}"), 28,
                 "checkpoint: {dir: " + ckpt + ", every_steps: 0}");
    const fs::path p = c.dir() / (name + ".yaml");
    write_file(p, spec);
    return c.submit(p);
  };
  c.set_worker_roots({});
  c.start_worker("w1");
  const std::string etc = job("etc", "/etc/zenflow-test-roots");
  ASSERT_FALSE(etc.empty()) << read_file(c.dir() / "cli.log");
  const std::string refused =
      "1 schedulable worker refuses its paths: checkpoint.dir /etc/zenflow-test-roots is "
      "outside the allowed roots of w1 (" +
      fs::canonical(work).string() + ")";
  EXPECT_TRUE(wait_until(
      [&] { return c.status(etc).value("waiting_reason", "").find(refused) != std::string::npos; }, 20s))
      << c.status(etc).dump();
  const std::string escape = job("escape", (work / "escape" / "ck").string());
  ASSERT_FALSE(escape.empty()) << read_file(c.dir() / "cli.log");
  ASSERT_TRUE(c.wait_state(escape, "FAILED", 60s)) << c.status(escape).dump() << logs_of(c, escape);
  EXPECT_EQ(i64(c.status(escape), "exit_code", -1), 2);
  const std::string log = logs_of(c, escape);
  EXPECT_NE(log.find("checkpoint.dir: " + (work / "escape" / "ck").string() + " (" +
                     (fs::canonical(outside) / "ck").string() +
                     ") is outside the directories this worker allows (" + fs::canonical(work).string() +
                     "; zenflow-worker --allowed-root)"),
            std::string::npos)
      << log;
  EXPECT_TRUE(fs::is_empty(outside));
  EXPECT_FALSE(fs::exists("/etc/zenflow-test-roots"));
  EXPECT_EQ(c.state(etc), "QUEUED");
}

TEST(ServiceSecurity, RateLimitAnswersResourceExhausted) {
  test_support::ClusterOptions o;
  o.coordinator_flags = {"--admin-rate-limit", "2", "--admin-burst", "5"};
  Cluster c("rate", o);
  c.start_coordinator();
  auto stub = v1::JobService::NewStub(rpc::make_channel(c.address()));
  int exhausted = 0, ok = 0;
  for (int i = 0; i < 30; ++i) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.admin_token(), 5s);
    v1::ListJobsResponse resp;
    const grpc::Status s = stub->ListJobs(&ctx, v1::ListJobsRequest{}, &resp);
    (s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED ? exhausted : ok) += 1;
  }
  EXPECT_GE(ok, 5);
  EXPECT_LE(ok, 8);  // the burst plus what refills during the loop
  EXPECT_GE(exhausted, 22);
  // The bucket is the flooding caller's: another caller from the same address (a connection
  // of its own, as another `zenflow` command has) is answered meanwhile. Before, the bucket
  // was the address's, and every user behind one NAT was refused with the flooder.
  rpc::ChannelOptions own;
  own.own_connection = true;
  auto other = v1::JobService::NewStub(rpc::make_channel(c.address(), own));
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext ctx;
    rpc::prepare_call(ctx, c.admin_token(), 5s);
    v1::ListJobsResponse resp;
    EXPECT_TRUE(other->ListJobs(&ctx, v1::ListJobsRequest{}, &resp).ok()) << "call " << i;
  }
  grpc::ClientContext ctx;
  rpc::prepare_call(ctx, c.admin_token(), 5s);
  v1::ListJobsResponse resp;
  EXPECT_EQ(stub->ListJobs(&ctx, v1::ListJobsRequest{}, &resp).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(ServiceSecurity, TlsEndToEndWithATestCa) {
  Cluster probe("tls-ca");
  const fs::path d = probe.dir();
  const std::string sh =
      "cd " + d.string() +
      " && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=zenflow-test-ca -keyout ca.key -out ca.pem "
      ">/dev/null 2>&1"
      " && openssl req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr >/dev/null 2>&1"
      " && printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\n' > ext.cnf"
      " && openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf "
      "-out server.pem >/dev/null 2>&1";
  ASSERT_EQ(test_support::run(sh), 0) << "openssl failed";
  test_support::ClusterOptions o;
  o.tls_cert = (d / "server.pem").string();
  o.tls_key = (d / "server.key").string();
  o.tls_ca = (d / "ca.pem").string();
  Cluster c("tls", o);
  c.start_coordinator();
  rpc::ChannelOptions co;
  co.ca_file = o.tls_ca;
  expect_auth_matrix(c, co);
  // Plaintext to a TLS port does not get through.
  EXPECT_EQ(health(c), grpc::StatusCode::UNAVAILABLE);
  // A worker over TLS registers and runs a job submitted over TLS.
  c.start_worker("w1");
  const std::string id = c.submit(write_job(c, "tls-job", 3, 0));
  ASSERT_FALSE(id.empty()) << read_file(c.dir() / "cli.log");
  EXPECT_TRUE(c.wait_state(id, "SUCCEEDED", 120s)) << c.status(id).dump();
}

}  // namespace
}  // namespace zenflow

namespace zenflow {
namespace {

// `zenflow bench control-plane` at a tiny size: every phase runs, and the open-loop
// generator sends exactly what its schedule says (50 workers x 2 Hz x 1 s measured, 1,000
// gets/s, 100 submits/s, 5,000 gets in the CPU phase), each answered, none lost.
TEST(Service, ControlPlaneBenchSendsItsWholeScheduleAndKeepsTheInvariants) {
  const fs::path dir = fs::temp_directory_path() / ("zenflow-bench-cp-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_file((dir / "mine.txt").string(),
             "the user's\n");  // --dir is the user's: the bench works beside this
  std::string out;
  const int rc = test_support::run(Cluster::bin("zenflow") +
                                       " bench control-plane --workers 50 --seconds 1 --trials 1 --stored-jobs 20"
                                       " --stored-queued 2 --dir " + dir.string() + " 2>" + dir.string() + ".err",
                                   &out);
  const std::string err = read_file(dir.string() + ".err");
  fs::remove(dir.string() + ".err");
  ASSERT_EQ(rc, 0) << err;
  const nlohmann::json j = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(j.is_object()) << out << err;
  EXPECT_EQ(j["heartbeats"].value("n", 0), 100) << j["heartbeats"].dump();
  EXPECT_EQ(j["heartbeats"].value("failed", -1), 0);
  EXPECT_EQ(j["heartbeats"].value("false_lost", -1), 0);
  EXPECT_EQ(j["heartbeats"].value("lost_after_generator_gap", -1), 0);
  EXPECT_GT(j["heartbeats"].value("registration_seconds", 0.0), 0.0);
  EXPECT_EQ(j["heartbeats"]["generator_send_lag"].value("n", 0), 100);
  EXPECT_GE(j["heartbeats"]["generator_send_lag"].value("p50_ms", -1.0), 0.0);
  EXPECT_LE(j["heartbeats"]["generator_send_lag"].value("p50_ms", 1e9), j["heartbeats"].value("p50_ms", 0.0));
  EXPECT_EQ(j["heartbeats"]["from_actual_send"].value("n", 0), 100);
  EXPECT_GT(j["heartbeats"]["from_actual_send"].value("p50_ms", 0.0), 0.0);
  EXPECT_LE(j["heartbeats"]["from_actual_send"].value("max_ms", 1e9), j["heartbeats"].value("max_ms", 0.0));
  EXPECT_EQ(j["get"].value("n", 0), 1000);
  EXPECT_EQ(j["get"].value("failed", -1), 0);
  EXPECT_EQ(j["submit"].value("n", 0), 100);
  EXPECT_EQ(j["submit"].value("failed", -1), 0);
  for (const char* kind : {"get", "submit"}) {  // each call's send lag, and its latency less that
    const nlohmann::json& k = j[kind];
    EXPECT_EQ(k["generator_send_lag"].value("n", 0), k.value("n", -1)) << kind;
    EXPECT_GE(k["generator_send_lag"].value("p50_ms", -1.0), 0.0) << kind;
    EXPECT_EQ(k["from_actual_send"].value("n", 0), k.value("n", -1)) << kind;
    EXPECT_GT(k["from_actual_send"].value("p50_ms", 0.0), 0.0) << kind;
    EXPECT_LE(k["from_actual_send"].value("max_ms", 1e9), k.value("max_ms", 0.0)) << kind;
  }
  EXPECT_EQ(j["cpu_per_request"].value("gets", 0), 5000);
  EXPECT_EQ(j["cpu_per_request"].value("submits", 0), 500);
  EXPECT_EQ(j["detection"].value("trials", 0), 1);
  EXPECT_EQ(j["detection"].value("detected", 0), 1);
  // The simulated workers beat on streams; one whose stream broke was LOST before any lease
  // (4 s) could have run out: one interval (500 ms) after the break.
  EXPECT_NE(j["heartbeats"].value("rpc", "").find("HeartbeatStream"), std::string::npos);
  EXPECT_EQ(j["detection_stream_broken"].value("trials", 0), 1);
  EXPECT_EQ(j["detection_stream_broken"].value("detected", 0), 1);
  EXPECT_LT(j["detection_stream_broken"].value("max_ms", 1e9), 4000.0);
  EXPECT_EQ(j["restart"].value("workers", 0), 48);  // the live ones: 50 less the stopped and the broken one
  EXPECT_EQ(j["restart"].value("acked_submits", 0), 100);
  EXPECT_EQ(j["restart"].value("acked_submits_missing", -1), 0);
  EXPECT_EQ(j["restart"].value("duplicates", -1), 0);
  EXPECT_EQ(j["restart"].value("workers_lost_by_restart", -1), 0);
  // How idle cores wait is recorded, as this machine reports it.
  std::string driver;
  std::ifstream("/sys/devices/system/cpu/cpuidle/current_driver") >> driver;
  EXPECT_EQ(j["machine"]["cpu_idle"].value("driver", ""), driver.empty() ? "none" : driver);
  // It removed its own directory inside --dir, and nothing else (a bench once removed --dir).
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"mine.txt"});
  EXPECT_EQ(read_file((dir / "mine.txt").string()), "the user's\n");
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// zenflow-optimizer --coordinator: listed by ListWorkers with role OPTIMIZER, its UCX
// address, cores and memory limit; LOST once it stops heartbeating.
TEST(Service, OptimizerNodeRegistersWithItsAddressAndIsLostWhenKilled) {
  Cluster c("optimizer-node");
  c.start_coordinator();
  const fs::path token = c.dir() / "node-worker.token";
  write_file(token, c.worker_token() + "\n");
  test_support::Process node({Cluster::bin("zenflow-optimizer"), "--listen", "127.0.0.1:0", "--port-file",
                              (c.dir() / "node.port").string(), "--coordinator", c.address(), "--worker-token-file",
                              token.string(), "--name", "opt-1", "--threads", "1", "--memory-limit", "1G"},
                             c.dir() / "node.log");
  nlohmann::json mine;
  ASSERT_TRUE(wait_until(
      [&] {
        for (const auto& w : c.workers().value("workers", nlohmann::json::array()))
          if (w.value("name", "") == "opt-1" && w.value("state", "") == "READY") mine = w;
        return !mine.is_null();
      },
      20s))
      << node.output() << c.workers().dump();
  EXPECT_EQ(mine.value("role", ""), "OPTIMIZER");
  ASSERT_TRUE(fs::exists(c.dir() / "node.port"));
  EXPECT_EQ(mine.value("address", ""), "127.0.0.1:" + std::to_string(std::stoi(read_file(c.dir() / "node.port"))));
  EXPECT_EQ(mine["resources"].value("host_memory_bytes", ""), std::to_string(int64_t{1} << 30));
  EXPECT_EQ(mine["resources"].value("physical_cores", ""), "1");
  node.kill(SIGKILL);
  EXPECT_TRUE(wait_until(
      [&] {
        for (const auto& w : c.workers().value("workers", nlohmann::json::array()))
          if (w.value("name", "") == "opt-1") return w.value("state", "") == "LOST";
        return false;
      },
      15s))
      << c.workers().dump();
}

// optimizer.host.nodes under a coordinator (scheduler rule 8): the job gets an idle
// optimizer node with its worker; SIGKILL that node mid-job and the rank names it and exits
// 76, the coordinator declares it LOST at once and requeues the job onto the spare node, and
// the job resumes there from its checkpoint. Its final loss equals an uninterrupted
// in-process run's (remote is bitwise in-process). A job asking for more nodes than are
// registered is unschedulable and holds nothing.
TEST(Service, OptimizerNodesAreAssignedWithTheJobAndALostOneIsReplacedByASpare) {
  ::setenv("UCX_TLS", "tcp", 1);
  ::setenv("UCX_NET_DEVICES", "lo", 1);
  Cluster c("node-spare");
  c.start_coordinator();
  c.start_worker("w1");
  const fs::path token = c.dir() / "node-worker.token";
  write_file(token, c.worker_token() + "\n");
  std::map<std::string, std::unique_ptr<test_support::Process>> nodes;
  for (const char* name : {"opt-1", "opt-2"})
    nodes[name] = std::make_unique<test_support::Process>(
        std::vector<std::string>{Cluster::bin("zenflow-optimizer"), "--listen", "127.0.0.1:0", "--coordinator",
                                 c.address(), "--worker-token-file", token.string(), "--name", name, "--threads", "1",
                                 "--memory-limit", "1G"},
        c.dir() / (std::string(name) + ".log"));
  ASSERT_TRUE(wait_until([&] { return worker_state(c, "opt-1") == "READY" && worker_state(c, "opt-2") == "READY"; },
                         20s))
      << c.workers().dump();

  auto with_nodes = [&](const std::string& name, int64_t steps, int64_t n) {
    const fs::path p = write_job(c, name, steps, 20);
    std::string spec = read_file(p);
    const std::string at = "optimizer: {mode: zenflow, ";
    spec.replace(spec.find(at), at.size(), at + "host: {nodes: " + std::to_string(n) + "}, ");
    write_file(p, spec);
    return p;
  };
  const std::string greedy = c.submit(with_nodes("greedy", 10, 3));
  ASSERT_FALSE(greedy.empty()) << read_file(c.dir() / "cli.log");
  const fs::path spec = with_nodes("remote", 300, 1);
  const std::string id = c.submit(spec);
  ASSERT_FALSE(id.empty()) << read_file(c.dir() / "cli.log");
  // Its node is killed as soon as a checkpoint at step 40 or later is committed, seen in
  // the checkpoint directory (polled every 5 ms), not through status: a report comes every
  // 500 ms and a CLI call takes a fraction of a second, while the 300 steps may take under
  // a second on a quiet day (the job once finished before its node was killed).
  nlohmann::json st;
  ASSERT_TRUE(wait_until(
      [&] {
        st = c.status(id);
        return st["optimizer_nodes"].size() == 1u;
      },
      120s))
      << st.dump() << logs_of(c, id);
  const std::string first = st["optimizer_nodes"][0];
  const std::string spare = first == "opt-1" ? "opt-2" : "opt-1";
  const fs::path ckpt = st.value("checkpoint_dir", "");
  auto committed_step = [&] {
    int64_t newest = -1;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpt, ec)) {
      const std::string n = e.path().filename().string();  // step-00000040; .tmp while written
      if (n.size() == 13 && n.rfind("step-", 0) == 0 &&
          n.find_first_not_of("0123456789", 5) == std::string::npos)
        newest = std::max<int64_t>(newest, std::stoll(n.substr(5)));
    }
    return newest;
  };
  const auto until = std::chrono::steady_clock::now() + 120s;
  while (committed_step() < 40 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  nodes.at(first)->kill(SIGKILL);
  ASSERT_GE(committed_step(), 40) << c.status(id).dump() << logs_of(c, id);
  ASSERT_LT(committed_step(), 300) << "the job finished before its node was killed";
  EXPECT_NE(
      c.status(greedy).value("waiting_reason", "").find("unschedulable: needs 3 optimizer nodes each with"),
      std::string::npos)
      << c.status(greedy).dump();

  ASSERT_TRUE(c.wait_state(id, "SUCCEEDED", 180s)) << c.status(id).dump() << logs_of(c, id)
                                                    << c.worker("w1").output();
  st = c.status(id);
  EXPECT_EQ(i64(st, "attempt", 0), 2) << st.dump();
  EXPECT_EQ(i64(st, "restarts", -1), 1);
  EXPECT_GE(i64(st, "resumed_from_step", 0), 40) << st.dump();  // from its checkpoint, not step 0
  ASSERT_EQ(st["optimizer_nodes"].size(), 1u);
  EXPECT_EQ(st["optimizer_nodes"][0], spare);
  EXPECT_EQ(worker_state(c, first), "LOST");
  const std::string log = logs_of(c, id);
  EXPECT_NE(log.find("optimizer node " + first + " (127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("lost; the job moves to a spare"), std::string::npos) << log;
  EXPECT_NE(log.find("with optimizer nodes " + spare), std::string::npos) << log;
  EXPECT_DOUBLE_EQ(st.value("last_loss", 0.0), reference_loss(c, spec));
  EXPECT_EQ(c.state(greedy), "QUEUED");
  std::string out;
  EXPECT_EQ(c.cli("cancel " + greedy), 0);
}

}  // namespace
}  // namespace zenflow
