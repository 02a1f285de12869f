// checkpoint.dir: s3:// (common/storage/checkpoint_mirror.h): checkpoints staged locally and
// kept in a bucket, a real S3 API server's (moto_server).
//
// The mirror alone: what a push leaves in the bucket (every file, the manifest last and
// never over another, the steps beyond `keep` gone), what a pull brings back (the newest
// step that verifies; a damaged or unfinished newer one skipped; what is staged already
// reused). And `zenflow run` itself: a run that resumes on "another worker" (an empty
// staging directory) from the bucket trains exactly as a resume from a local directory; a
// SIGTERM's checkpoint is durable before the process exits; --fresh never overwrites.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/crc32c.h"
#include "common/storage/checkpoint_mirror.h"
#include "common/storage/s3.h"
#include "tests/support/http_stub.h"
#include "tests/support/moto.h"
#include "tests/support/scratch.h"
#include "tests/support/shell.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;
using storage::parse_s3_uri;
using storage::S3Client;
using storage::S3Uri;

fs::path scratch_dir(const std::string& name) { return test_support::fresh_scratch_dir(name); }

std::string random_bytes(size_t n, unsigned seed) {
  std::string s(n, '\0');
  std::mt19937 rng(seed);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A committed step directory as checkpoint.h writes one: files, and the manifest listing
// each with its size and CRC32C.
fs::path make_step(const fs::path& dir, int64_t step, unsigned seed) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  const fs::path p = dir / name;
  fs::create_directories(p);
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [file, size] : std::vector<std::pair<std::string, size_t>>{
           {"model.safetensors", 7000 + seed}, {"engine.safetensors", 13000}, {"trainer.json", 40}}) {
    const std::string bytes = random_bytes(size, seed * 31 + static_cast<unsigned>(file.size()));
    test_support::write_file(p / file, bytes);
    files[file] = {{"bytes", bytes.size()}, {"crc32c", crc32c_hex(crc32c(bytes.data(), bytes.size()))}};
  }
  test_support::write_file(p / "manifest.json",
                           nlohmann::json({{"format", "zenflow-checkpoint"}, {"step", step}, {"files", files}}).dump());
  return p;
}

std::vector<std::string> keys_of(S3Client& c, const S3Uri& prefix) {
  std::vector<std::string> out;
  for (const auto& o : c.list(prefix)) out.push_back(o.key.substr(prefix.key.size()));
  return out;
}

class S3Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string moto = test_support::find_s3_server();
    if (moto.empty()) GTEST_SKIP() << test_support::kNoS3Server;
    dir_ = scratch_dir("s3-ck");
    // Signatures unchecked: moto's own check fails on a '/' in a LIST's prefix (the AWS
    // CLI's requests fail there too); tests/test_s3.cpp checks the signing on the rest.
    moto_ = std::make_unique<test_support::MotoServer>(moto, dir_ / "moto.log", /*check_signatures=*/false);
    moto_->create_bucket("zf-ck");
    storage::S3Settings s;
    s.endpoint = moto_->url();
    s.path_style = true;
    s.credentials = storage::static_credentials({moto_->key_id(), moto_->secret(), "", 0, "test"});
    s.sleep = [](double) {};
    client_ = std::make_shared<S3Client>(s);
  }

  std::unique_ptr<CheckpointMirror> mirror(const fs::path& local, int64_t keep = 2) {
    MirrorOptions o;
    o.keep = keep;
    o.upload.part_bytes = 5 << 20;
    o.log = [this](const std::string& line) { logged_.push_back(line); };
    return std::make_unique<CheckpointMirror>(client_, parse_s3_uri("s3://zf-ck/runs/a"), local.string(), o);
  }

  fs::path dir_;
  std::unique_ptr<test_support::MotoServer> moto_;
  std::shared_ptr<S3Client> client_;
  std::vector<std::string> logged_;
};

TEST_F(S3Checkpoints, PushesEveryFileThenTheManifestAndKeepsTheNewestSteps) {
  const fs::path local = dir_ / "stage";
  auto m = mirror(local, /*keep=*/2);
  test_support::write_file(local / "steps.jsonl", "{\"event\":\"start\"}\n");
  for (int64_t step : {5, 10, 15}) {
    const fs::path p = make_step(local, step, static_cast<unsigned>(step));
    EXPECT_GE(m->push(p.string(), step), 0.0);
  }
  const CheckpointMirror::Durable d = m->flush();
  EXPECT_EQ(d.step, 15);
  EXPECT_GE(d.seconds_to_durable, 0.0);
  const std::vector<std::string> keys = keys_of(*client_, parse_s3_uri("s3://zf-ck/runs/a/"));
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "step-00000010/engine.safetensors", "step-00000010/manifest.json",
                      "step-00000010/model.safetensors", "step-00000010/trainer.json",
                      "step-00000015/engine.safetensors", "step-00000015/manifest.json",
                      "step-00000015/model.safetensors", "step-00000015/trainer.json", "steps.jsonl"}));
  EXPECT_EQ(client_->get(parse_s3_uri("s3://zf-ck/runs/a/step-00000015/model.safetensors")),
            test_support::read_file(local / "step-00000015/model.safetensors"));
  EXPECT_EQ(client_->get(parse_s3_uri("s3://zf-ck/runs/a/steps.jsonl")), "{\"event\":\"start\"}\n");
  EXPECT_EQ(m->newest_remote_step(), 15);
  EXPECT_FALSE(fs::exists(local / ".upload-step-00000015")) << "the upload's hard links were left behind";
}

TEST_F(S3Checkpoints, AStepDeletedLocallyWhileItUploadsStillArrivesWhole) {
  const fs::path local = dir_ / "stage";
  auto m = mirror(local);
  const fs::path p = make_step(local, 7, 7);
  const std::string model = test_support::read_file(p / "model.safetensors");
  m->push(p.string(), 7);
  fs::remove_all(p);  // checkpoint.keep's local rotation, racing the upload
  EXPECT_EQ(m->flush().step, 7);
  EXPECT_EQ(client_->get(parse_s3_uri("s3://zf-ck/runs/a/step-00000007/model.safetensors")), model);
}

TEST_F(S3Checkpoints, AManifestAlreadyInTheBucketIsNeverReplaced) {
  if (!moto_->conditional_writes()) GTEST_SKIP() << "s3rver ignores If-None-Match (it predates S3's conditional writes)";
  client_->put(parse_s3_uri("s3://zf-ck/runs/a/step-00000005/manifest.json"), "{\"another\": \"run\"}");
  const fs::path local = dir_ / "stage";
  auto m = mirror(local);
  m->push(make_step(local, 5, 5).string(), 5);
  try {
    m->flush();
    ADD_FAILURE() << "another run's manifest was replaced";
  } catch (const storage::S3ObjectExists& e) {
    EXPECT_NE(std::string(e.what()).find("s3://zf-ck/runs/a/step-00000005/manifest.json"), std::string::npos) << e.what();
  }
  EXPECT_EQ(client_->get(parse_s3_uri("s3://zf-ck/runs/a/step-00000005/manifest.json")), "{\"another\": \"run\"}");
}

TEST_F(S3Checkpoints, PullBringsTheNewestStepThatVerifiesAndSkipsDamagedAndUnfinishedOnes) {
  const fs::path up = dir_ / "writer";
  {
    auto m = mirror(up, /*keep=*/5);
    for (int64_t step : {10, 20, 30}) m->push(make_step(up, step, static_cast<unsigned>(step)).string(), step);
    m->flush();
  }
  // Step 30: one object replaced by others of the same size (the CRC32C differs); step 40:
  // an upload that never reached its manifest.
  const std::string engine30 = test_support::read_file(up / "step-00000030/engine.safetensors");
  client_->put(parse_s3_uri("s3://zf-ck/runs/a/step-00000030/engine.safetensors"), random_bytes(engine30.size(), 99));
  client_->put(parse_s3_uri("s3://zf-ck/runs/a/step-00000040/model.safetensors"), "half an upload");

  const fs::path reader = dir_ / "reader";
  auto m = mirror(reader);
  const CheckpointMirror::Pulled p = m->pull();
  EXPECT_EQ(p.step, 20);
  EXPECT_EQ(p.damaged, 1);
  EXPECT_EQ(p.bytes_reused, 0);
  EXPECT_EQ(p.bytes_downloaded, 7020 + 13000 + 40);
  ASSERT_EQ(logged_.size(), 1u);
  EXPECT_EQ(logged_[0], "s3://zf-ck/runs/a/step-00000030 is damaged: engine.safetensors does not have the manifest's "
                        "checksum " +
                            nlohmann::json::parse(test_support::read_file(up / "step-00000030/manifest.json"))
                                .at("files").at("engine.safetensors").at("crc32c").get<std::string>() +
                            "; trying the previous checkpoint");
  for (const char* f : {"model.safetensors", "engine.safetensors", "trainer.json", "manifest.json"})
    EXPECT_EQ(test_support::read_file(reader / "step-00000020" / f), test_support::read_file(up / "step-00000020" / f))
        << f;
  EXPECT_FALSE(fs::exists(reader / "step-00000030"));
  EXPECT_FALSE(fs::exists(reader / ".pull-step-00000030"));

  // Again into the same staging directory: nothing is downloaded.
  const CheckpointMirror::Pulled again = mirror(reader)->pull();
  EXPECT_EQ(again.step, 20);
  EXPECT_EQ(again.bytes_downloaded, 0);
  EXPECT_EQ(again.bytes_reused, 7020 + 13000 + 40);
  // A missing object is damage too.
  client_->remove(parse_s3_uri("s3://zf-ck/runs/a/step-00000020/trainer.json"));
  logged_.clear();
  EXPECT_EQ(mirror(dir_ / "third")->pull().step, 10);
  ASSERT_FALSE(logged_.empty());
  EXPECT_EQ(logged_.back(), "s3://zf-ck/runs/a/step-00000020 is damaged: trainer.json is missing; trying the previous "
                            "checkpoint");
}

// Ranks on two workers, each with its own staging directory: rank 1's worker sends its
// shard; rank 0's upload of the step waits for it (the checksum rank 0 was told) and only
// then commits the manifest; a shard that never arrives leaves the step uncommitted.
TEST_F(S3Checkpoints, AStepCommitsOnlyOnceTheShardAnotherWorkerSendsHasArrived) {
  const fs::path w0 = dir_ / "worker0", w1 = dir_ / "worker1";
  auto add_remote_shard = [&](int64_t step, const std::string& bytes) {
    char name[32];
    std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
    const fs::path p = make_step(w0, step, static_cast<unsigned>(step));
    nlohmann::json m = nlohmann::json::parse(test_support::read_file(p / "manifest.json"));
    m["world_size"] = 2;
    m["files"]["engine-rank-00001.safetensors"] = {{"bytes", bytes.size()},
                                                   {"crc32c", crc32c_hex(crc32c(bytes.data(), bytes.size()))}};
    test_support::write_file(p / "manifest.json", m.dump());
    const fs::path shard = w1 / (std::string(name) + ".tmp") / "engine-rank-00001.safetensors";
    fs::create_directories(shard.parent_path());
    test_support::write_file(shard, bytes);
    test_support::write_file(shard.string() + ".crc32c", "{}\n");
    return std::make_pair(p, shard);
  };
  const std::string shard6 = random_bytes(9000, 61);
  auto [step6, shard_file6] = add_remote_shard(6, shard6);
  auto m0 = mirror(w0), m1 = mirror(w1);
  m0->push(step6.string(), 6);  // waits in the background for rank 1's shard
  m1->push_shard(shard_file6.string(), 6, crc32c(shard6.data(), shard6.size()));
  EXPECT_EQ(m1->flush().step, -1) << "a shard is not a checkpoint";
  EXPECT_EQ(m0->flush().step, 6);
  EXPECT_EQ(client_->get(parse_s3_uri("s3://zf-ck/runs/a/step-00000006/engine-rank-00001.safetensors")), shard6);
  EXPECT_FALSE(fs::exists(shard_file6.parent_path())) << "worker 1 keeps no copy of what it sent";

  // Step 9: the bucket holds an older attempt's shard 1 (another checksum) and no new one
  // comes: the manifest never goes up.
  const std::string shard9 = random_bytes(9000, 91);
  auto [step9, shard_file9] = add_remote_shard(9, shard9);
  client_->put(parse_s3_uri("s3://zf-ck/runs/a/step-00000009/engine-rank-00001.safetensors"), random_bytes(9000, 5));
  client_->put(parse_s3_uri("s3://zf-ck/runs/a/step-00000009/engine-rank-00001.safetensors.crc32c"), "00000000\n");
  MirrorOptions impatient;
  impatient.shard_wait_s = 0.3;
  CheckpointMirror m0b(client_, parse_s3_uri("s3://zf-ck/runs/a"), w0.string(), impatient);
  m0b.push(step9.string(), 9);
  try {
    m0b.flush();
    ADD_FAILURE() << "step 9 committed without rank 1's shard";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("s3://zf-ck/runs/a/step-00000009/engine-rank-00001.safetensors did not "
                                         "arrive from its rank's worker within 0.3 s"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("found checksum 00000000, 9000 bytes"), std::string::npos) << e.what();
  }
  EXPECT_EQ(m0->newest_remote_step(), 6);

  // Rank 1's worker resumes: it brings the shared files and its own shard, not rank 0's.
  MirrorOptions own;
  own.shard_wanted = [](int64_t world, int r) { return world != 2 || r == 1; };
  CheckpointMirror r1(client_, parse_s3_uri("s3://zf-ck/runs/a"), (dir_ / "resume1").string(), own);
  const CheckpointMirror::Pulled p1 = r1.pull_for_run(/*clean_uncommitted=*/false);
  EXPECT_EQ(p1.step, 6);
  EXPECT_EQ(test_support::read_file(dir_ / "resume1/step-00000006/engine-rank-00001.safetensors"), shard6);
  EXPECT_FALSE(fs::exists(dir_ / "resume1/step-00000006/engine.safetensors"));
  EXPECT_EQ(p1.bytes_downloaded, 7006 + 40 + 9000);
  // Rank 0's worker resumes: step 9's leftovers go from the bucket, and its own step 9,
  // which never reached the bucket, from the staging directory.
  logged_.clear();
  const CheckpointMirror::Pulled p0 = mirror(w0)->pull_for_run(/*clean_uncommitted=*/true);
  EXPECT_EQ(p0.step, 6);
  EXPECT_FALSE(fs::exists(step9));
  EXPECT_TRUE(keys_of(*client_, parse_s3_uri("s3://zf-ck/runs/a/step-00000009/")).empty());
  EXPECT_NE(std::find(logged_.begin(), logged_.end(),
                      "s3://zf-ck/runs/a/step-00000009 never committed (no manifest.json): its objects were deleted"),
            logged_.end());
}

// What a push sends, in order, to a scripted S3: the files, then the manifest with
// If-None-Match, then steps.jsonl, then the rotation's LIST.
TEST(S3CheckpointOrder, TheManifestGoesLastAndOnlyWhereNoneIs) {
  std::vector<std::string> order;
  std::mutex mu;
  test_support::HttpStub stub([&](const test_support::HttpRequest& r) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(r.method + " " + r.target.substr(0, r.target.find('?')) +
                    (r.headers.count("if-none-match") ? " if-none-match:" + r.headers.at("if-none-match") : ""));
    if (r.method == "GET")
      return test_support::HttpReply{200, {}, "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"};
    return test_support::HttpReply{200, {{"ETag", "\"e\""}}, ""};
  });
  storage::S3Settings s;
  s.endpoint = stub.url();
  s.path_style = true;
  s.sleep = [](double) {};
  const fs::path local = scratch_dir("s3-order");
  test_support::write_file(local / "steps.jsonl", "{}\n");
  MirrorOptions o;
  CheckpointMirror m(std::make_shared<S3Client>(s), parse_s3_uri("s3://bkt/run"), local.string(), o);
  m.push(make_step(local, 3, 3).string(), 3);
  m.flush();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(order.size(), 6u);
  std::vector<std::string> files(order.begin(), order.begin() + 3);
  std::sort(files.begin(), files.end());
  EXPECT_EQ(files, (std::vector<std::string>{"PUT /bkt/run/step-00000003/engine.safetensors",
                                             "PUT /bkt/run/step-00000003/model.safetensors",
                                             "PUT /bkt/run/step-00000003/trainer.json"}));
  EXPECT_EQ(order[3], "PUT /bkt/run/step-00000003/manifest.json if-none-match:*");
  EXPECT_EQ(order[4], "PUT /bkt/run/steps.jsonl");
  EXPECT_EQ(order[5], "GET /bkt");
}

TEST(S3CheckpointStaging, IsUnderTheGivenDirectoryThenTheEnvironmentsThenTheCache) {
  EXPECT_EQ(staging_dir_for(parse_s3_uri("s3://bkt/runs/a/"), "/data/stage"), "/data/stage/bkt/runs/a");
  ::setenv("ZENFLOW_STAGING_DIR", "/scratch/zf", 1);
  EXPECT_EQ(staging_dir_for(parse_s3_uri("s3://bkt/runs/a")), "/scratch/zf/bkt/runs/a");
  ::unsetenv("ZENFLOW_STAGING_DIR");
  ::setenv("XDG_CACHE_HOME", "/home/u/.cache-x", 1);
  EXPECT_EQ(staging_dir_for(parse_s3_uri("s3://bkt/runs/a")), "/home/u/.cache-x/zenflow/checkpoints/bkt/runs/a");
  ::unsetenv("XDG_CACHE_HOME");
}

// ---- zenflow run -------------------------------------------------------------------------------

const char* kSpec = R"(name: s3-run
model:
  arch: llama
  config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64,
           max_position_embeddings: 64}
data: {train: /usr/share/common-licenses, format: text, tokenizer: byte, val_fraction: 0}
train: {steps: 12, micro_batch: 2, grad_accum: 1, seq_len: 32, lr: 3.0e-3, warmup_steps: 2, seed: 3}
optimizer:
  mode: zenflow
  zenflow: {topk_ratio: 0.25, update_interval: 2, overlap_step: true}
checkpoint: {every_steps: 4, keep: 2}
)";

class S3Run : public S3Checkpoints {
 protected:
  void SetUp() override {
    S3Checkpoints::SetUp();
    if (IsSkipped()) return;
    spec_ = dir_ / "job.yaml";
    test_support::write_file(spec_, kSpec);
  }
  // `zenflow run` with the bucket's endpoint and key in its environment; its exit status,
  // stdout in *out, stderr in *err.
  int run(const std::string& flags, std::string* out, std::string* err) { return run_at(moto_->url(), flags, out, err); }
  // The same against another endpoint (a scripted server), AWS_MAX_ATTEMPTS=2.
  int run_at(const std::string& endpoint, const std::string& flags, std::string* out, std::string* err) {
    const fs::path e = dir_ / ("stderr-" + std::to_string(runs_++));
    const std::string cmd = "env AWS_MAX_ATTEMPTS=2 AWS_ENDPOINT_URL=" + endpoint + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                            " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " " + ZENFLOW_BINARY_DIR +
                            "/bin/zenflow run " + spec_.string() + " --quiet --json " + flags + " 2>" + e.string();
    const int rc = test_support::run(cmd, out);
    *err = test_support::read_file(e);
    return rc;
  }
  // Two ranks, each alone on its "worker" as the agent places a job of resources.workers: 2
  // (ZENFLOW_WORKER_FIRST_RANK/RANKS; the local placement is a GPU slot of the machine, not
  // 0), each staging in its own directory: no path is shared.
  // Exit status of the pair (0 when both succeeded); rank 0's stdout in *out, the ranks'
  // stderr in err[0], err[1].
  int run_two_workers(const std::string& flags, const fs::path& stage0, const fs::path& stage1, std::string* out,
                      std::string err[2]) {
    const int n = runs_++;
    const int port = test_support::free_tcp_port();
    std::string cmd;
    for (int r = 0; r < 2; ++r)
      cmd += "env AWS_ENDPOINT_URL=" + moto_->url() + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
             " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " ZENFLOW_RANK=" + std::to_string(r) +
             " ZENFLOW_WORLD_SIZE=2 ZENFLOW_LOCAL_RANK=" + std::to_string(2 * r + 1) +
             " ZENFLOW_LOCAL_WORLD_SIZE=4 ZENFLOW_WORKER_FIRST_RANK=" + std::to_string(r) +
             " ZENFLOW_WORKER_RANKS=1 ZENFLOW_MASTER_ADDR=127.0.0.1"
             " ZENFLOW_MASTER_PORT=" + std::to_string(port) + " ZENFLOW_DIST_TIMEOUT_S=120 " + ZENFLOW_BINARY_DIR +
             "/bin/zenflow run " + spec_.string() + " --quiet --json " + flags + " --staging-dir " +
             (r == 0 ? stage0 : stage1).string() + " 2>" + (dir_ / ("err-" + std::to_string(n) + "-" + std::to_string(r))).string() +
             (r == 0 ? " >" + (dir_ / ("out-" + std::to_string(n))).string() + " & a=$!; " : " >/dev/null & b=$!; ");
    cmd += "wait $a; ra=$?; wait $b; rb=$?; exit $((ra | rb))";
    std::string ignored;
    const int rc = test_support::run("/bin/sh -c '" + cmd + "'", &ignored);
    *out = test_support::read_file(dir_ / ("out-" + std::to_string(n)));
    for (int r = 0; r < 2; ++r) err[r] = test_support::read_file(dir_ / ("err-" + std::to_string(n) + "-" + std::to_string(r)));
    return rc;
  }
  fs::path spec_;
  int runs_ = 0;
};

// Run to step 8 on worker A, then to 12 on worker B from the bucket alone; the same two
// runs through one local directory give the same numbers to the bit.
TEST_F(S3Run, AResumeOnAnotherWorkerFromTheBucketTrainsExactlyAsALocalResume) {
  const std::string uri = "s3://zf-ck/runs/job";
  std::string out, err;
  ASSERT_EQ(run("--set train.steps=8 --set checkpoint.dir=" + uri + " --staging-dir " + (dir_ / "A").string(), &out, &err), 0) << err;
  EXPECT_NE(err.find("checkpoint step 8 durable in " + uri + "/step-00000008"), std::string::npos) << err;
  ASSERT_EQ(run("--set train.steps=12 --set checkpoint.dir=" + uri + " --staging-dir " + (dir_ / "B").string(), &out, &err), 0) << err;
  EXPECT_NE(err.find("step 8 from " + uri + ": "), std::string::npos) << err;
  const nlohmann::json bucket = nlohmann::json::parse(out);
  EXPECT_EQ(bucket.at("start_step"), 8);

  const std::string local = (dir_ / "local").string();
  ASSERT_EQ(run("--set train.steps=8 --set checkpoint.dir=" + local, &out, &err), 0) << err;
  ASSERT_EQ(run("--set train.steps=12 --set checkpoint.dir=" + local, &out, &err), 0) << err;
  const nlohmann::json dir = nlohmann::json::parse(out);
  EXPECT_EQ(bucket.at("losses"), dir.at("losses"));
  EXPECT_EQ(bucket.at("final_loss").get<double>(), dir.at("final_loss").get<double>());

  EXPECT_EQ(keys_of(*client_, parse_s3_uri(uri + "/")).size(), 2 * 5 + 1u) << "keep: 2 steps of 5 files, steps.jsonl";
  // The run's record names the bucket, not a worker's staging copy.
  EXPECT_NE(client_->get(parse_s3_uri(uri + "/step-00000012/run.yaml")).find("dir: \"" + uri + "\"\n"), std::string::npos)
      << client_->get(parse_s3_uri(uri + "/step-00000012/run.yaml"));
  // The record continues in the bucket: both runs' steps.
  const std::string record = client_->get(parse_s3_uri(uri + "/steps.jsonl"));
  EXPECT_NE(record.find("\"step\":1,"), std::string::npos);
  EXPECT_NE(record.find("\"step\":12,"), std::string::npos);

  // zenflow export from the bucket: the same model as from the local directory, to the byte.
  auto export_to = [&](const std::string& from, const fs::path& out_dir, std::string* e) {
    std::string o;
    const std::string cmd = "env AWS_ENDPOINT_URL=" + moto_->url() + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                            " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " " + ZENFLOW_BINARY_DIR +
                            "/bin/zenflow export " + from + " --out " + out_dir.string() + " 2>" +
                            (dir_ / "export.stderr").string();
    const int rc = test_support::run(cmd, &o);
    *e = test_support::read_file(dir_ / "export.stderr");
    return rc;
  };
  ASSERT_EQ(export_to(uri + "/step-00000012", dir_ / "from-bucket", &err), 0) << err;
  ASSERT_EQ(export_to(local, dir_ / "from-dir", &err), 0) << err;
  EXPECT_EQ(test_support::read_file(dir_ / "from-bucket/model.safetensors"),
            test_support::read_file(dir_ / "from-dir/model.safetensors"));
  EXPECT_EQ(export_to(uri + "/step-00000003", dir_ / "none", &err), 2) << err;
  EXPECT_NE(err.find(uri + "/step-00000003 is not a checkpoint in the bucket (no manifest.json)"), std::string::npos)
      << err;

  // zenflow report from the bucket: both runs' steps, as the bucket's steps.jsonl holds them.
  {
    std::string o;
    const std::string env = "env AWS_ENDPOINT_URL=" + moto_->url() + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                            " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " " + ZENFLOW_BINARY_DIR + "/bin/zenflow report ";
    const fs::path page = dir_ / "report.html";
    ASSERT_EQ(test_support::run(env + uri + " --out " + page.string() + " 2>" + (dir_ / "report.err").string(), &o), 0)
        << test_support::read_file(dir_ / "report.err");
    EXPECT_NE(test_support::read_file(dir_ / "report.err").find("12 steps of " + uri + "/steps.jsonl"), std::string::npos)
        << test_support::read_file(dir_ / "report.err");
    EXPECT_GT(fs::file_size(page), 1000u);
    EXPECT_EQ(test_support::run(env + uri + " 2>" + (dir_ / "report.err").string(), &o), 2);
    EXPECT_NE(test_support::read_file(dir_ / "report.err").find("--out is required for a run in a bucket"),
              std::string::npos);
    EXPECT_EQ(test_support::run(env + "s3://zf-ck/runs/nothing --out " + page.string() + " 2>" +
                                    (dir_ / "report.err").string(), &o),
              2);
    EXPECT_NE(test_support::read_file(dir_ / "report.err")
                  .find("s3://zf-ck/runs/nothing/steps.jsonl: not in the bucket"),
              std::string::npos)
        << test_support::read_file(dir_ / "report.err");
  }

  // --fresh never overwrites what the bucket holds.
  ASSERT_EQ(run("--fresh --set checkpoint.dir=" + uri + " --staging-dir " + (dir_ / "C").string(), &out, &err), 2)
      << err;
  EXPECT_NE(err.find("--fresh: " + uri + " already holds checkpoints (the newest is step 12)"), std::string::npos) << err;
}

// A job on two workers with no shared path: each rank's shard reaches the bucket from its own
// worker, a resume on swapped workers brings each worker only its own shards, and the
// numbers are those of the same ranks sharing one local directory, to the bit. One rank
// afterwards re-shards the state of both from the bucket.
TEST_F(S3Run, TwoWorkersSharingNoDirectoryCheckpointAndResumeEachWithItsOwnShards) {
  const std::string uri = "s3://zf-ck/runs/pair";
  const std::string set = " --set checkpoint.dir=" + uri;
  std::string out, err[2];
  ASSERT_EQ(run_two_workers("--set train.steps=8" + set, dir_ / "A", dir_ / "B", &out, err), 0) << err[0] << err[1];
  EXPECT_NE(err[0].find("checkpoint step 8 durable in " + uri + "/step-00000008"), std::string::npos) << err[0];
  const std::vector<std::string> step8 = keys_of(*client_, parse_s3_uri(uri + "/step-00000008/"));
  EXPECT_EQ(step8, (std::vector<std::string>{"engine-rank-00001.safetensors", "engine-rank-00001.safetensors.crc32c",
                                             "engine.safetensors", "manifest.json", "model.safetensors",
                                             "run.yaml", "trainer.json"}));
  const nlohmann::json manifest = nlohmann::json::parse(client_->get(parse_s3_uri(uri + "/step-00000008/manifest.json")));
  EXPECT_EQ(manifest.at("world_size"), 2);
  const std::string shard1 = client_->get(parse_s3_uri(uri + "/step-00000008/engine-rank-00001.safetensors"));
  EXPECT_EQ(manifest.at("files").at("engine-rank-00001.safetensors").at("bytes").get<size_t>(), shard1.size());
  EXPECT_EQ(manifest.at("files").at("engine-rank-00001.safetensors").at("crc32c"),
            crc32c_hex(crc32c(shard1.data(), shard1.size())));
  // Worker B keeps no step: it held only rank 1's shards, now in the bucket.
  for (const auto& e : fs::directory_iterator(dir_ / "B/zf-ck/runs/pair"))
    EXPECT_NE(e.path().filename().string().rfind("step-", 0), 0u) << e.path();
  EXPECT_FALSE(fs::exists(dir_ / "A/zf-ck/runs/pair/step-00000008/engine-rank-00001.safetensors"));

  // Resume with the workers swapped and a new one: rank 0 on C (empty), rank 1 on A.
  ASSERT_EQ(run_two_workers("--set train.steps=12" + set, dir_ / "C", dir_ / "A", &out, err), 0) << err[0] << err[1];
  const nlohmann::json bucket = nlohmann::json::parse(out);
  EXPECT_EQ(bucket.at("start_step"), 8);
  EXPECT_TRUE(fs::exists(dir_ / "C/zf-ck/runs/pair/step-00000008/engine.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "C/zf-ck/runs/pair/step-00000008/engine-rank-00001.safetensors"))
      << "rank 0's worker downloaded rank 1's shard";
  EXPECT_TRUE(fs::exists(dir_ / "A/zf-ck/runs/pair/step-00000008/engine-rank-00001.safetensors"));

  // The same two runs, both ranks sharing one local directory.
  const std::string local = (dir_ / "local").string();
  std::string e1;
  ASSERT_EQ(run("--nproc 2 --set train.steps=8 --set checkpoint.dir=" + local, &out, &e1), 0) << e1;
  ASSERT_EQ(run("--nproc 2 --set train.steps=12 --set checkpoint.dir=" + local, &out, &e1), 0) << e1;
  const nlohmann::json shared = nlohmann::json::parse(out);
  EXPECT_EQ(bucket.at("losses"), shared.at("losses"));
  EXPECT_EQ(bucket.at("final_loss").get<double>(), shared.at("final_loss").get<double>());

  // One rank: it needs both shards (re-sharding), and its pull brings them.
  ASSERT_EQ(run("--set train.steps=14 --set train.grad_accum=2" + set + " --staging-dir " + (dir_ / "D").string(), &out, &e1), 0) << e1;
  EXPECT_NE(e1.find("re-sharded the optimizer state of 2 ranks over 1"), std::string::npos) << e1;
  EXPECT_TRUE(fs::exists(dir_ / "D/zf-ck/runs/pair/step-00000012/engine-rank-00001.safetensors"));
}

// A bucket that says no fails the job before its first step, exit 2, naming checkpoint.dir,
// the URI and S3's code: a missing bucket (moto), a wrong key (every request refused), and a
// key that may list but not write (the write check; a scripted server).
TEST_F(S3Run, ABucketThatSaysNoFailsBeforeTrainingNamingCheckpointDirAndTheCode) {
  std::string out, err;
  EXPECT_EQ(run("--set checkpoint.dir=s3://no-such-bucket/x --staging-dir " + (dir_ / "N").string(), &out, &err), 2)
      << err;
  EXPECT_NE(err.find("zenflow: invalid job spec: checkpoint.dir: s3://no-such-bucket/x: NoSuchBucket (LIST "),
            std::string::npos)
      << err;

  auto refusal = [](const std::string& code) {
    return test_support::HttpReply{403, {}, "<Error><Code>" + code + "</Code><Message>no</Message></Error>"};
  };
  test_support::HttpStub wrong_key([&](const test_support::HttpRequest&) { return refusal("InvalidAccessKeyId"); });
  EXPECT_EQ(run_at(wrong_key.url(), "--set checkpoint.dir=s3://bkt/p --staging-dir " + (dir_ / "K").string(), &out, &err), 2)
      << err;
  EXPECT_NE(err.find("zenflow: invalid job spec: checkpoint.dir: s3://bkt/p: InvalidAccessKeyId (LIST s3://bkt/p/: HTTP 403 "
                     "InvalidAccessKeyId: no)"),
            std::string::npos)
      << err;

  std::mutex mu;
  std::vector<std::string> writes;
  test_support::HttpStub read_only([&](const test_support::HttpRequest& r) {
    if (r.method == "GET")
      return test_support::HttpReply{200, {}, "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>"};
    std::lock_guard<std::mutex> lock(mu);
    writes.push_back(r.method + " " + r.target);
    return refusal("AccessDenied");
  });
  EXPECT_EQ(run_at(read_only.url(), "--set checkpoint.dir=s3://ro-bkt/p --staging-dir " + (dir_ / "R").string(), &out, &err), 2)
      << err;
  EXPECT_NE(err.find("zenflow: invalid job spec: checkpoint.dir: s3://ro-bkt/p: AccessDenied (PUT s3://ro-bkt/p/.zenflow-write-check-"),
            std::string::npos)
      << err;
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(writes.size(), 1u) << "only the write check: nothing was trained or uploaded";
  EXPECT_EQ(writes[0].rfind("PUT /ro-bkt/p/.zenflow-write-check-", 0), 0u) << writes[0];
  EXPECT_FALSE(fs::exists(dir_ / "R/ro-bkt/p/steps.jsonl")) << "training started";
}

// SIGTERM (a spot interruption notice) in the middle of a long run: its checkpoint is in the
// bucket before the process exits, and it says so.
TEST_F(S3Run, ASigtermsCheckpointIsDurableBeforeTheProcessExits) {
  const std::string uri = "s3://zf-ck/runs/term";
  const fs::path err_path = dir_ / "term.stderr";
  const std::string cmd = "exec env AWS_ENDPOINT_URL=" + moto_->url() + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                          " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " " + ZENFLOW_BINARY_DIR + "/bin/zenflow run " +
                          spec_.string() + " --quiet --set train.steps=100000 --set checkpoint.every_steps=3 " +
                          "--set checkpoint.dir=" + uri + " --staging-dir " + (dir_ / "T").string() + " 2>" +
                          err_path.string() + " >/dev/null";
  test_support::Process p({"/bin/sh", "-c", cmd}, dir_ / "term.log");
  auto mirror_view = std::make_unique<CheckpointMirror>(client_, parse_s3_uri(uri), (dir_ / "view").string(),
                                                         MirrorOptions{});
  ASSERT_TRUE(test_support::wait_until([&] { return mirror_view->newest_remote_step() >= 3; }, std::chrono::seconds(120)))
      << test_support::read_file(err_path);
  p.signal(SIGTERM);
  const int status = p.wait_exit(std::chrono::seconds(120));
  const std::string err = test_support::read_file(err_path);
  EXPECT_EQ(status, 130) << err;  // interrupted, with its checkpoint
  const int64_t newest = mirror_view->newest_remote_step();
  int64_t newest_local = -1;
  for (const auto& e : fs::directory_iterator(dir_ / "T/zf-ck/runs/term")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name.find('.') == std::string::npos)
      newest_local = std::max<int64_t>(newest_local, std::stoll(name.substr(5)));
  }
  EXPECT_EQ(newest, newest_local) << "the run's last checkpoint is not the bucket's newest";
  char step_dir[32];
  std::snprintf(step_dir, sizeof step_dir, "step-%08lld", static_cast<long long>(newest));
  EXPECT_NE(err.find("checkpoint step " + std::to_string(newest) + " durable in " + uri + "/" + step_dir),
            std::string::npos)
      << err;
}

// The S3 server gone in the middle of an upload (its process killed: every connection cut,
// new ones refused) and back a few seconds later: training goes on meanwhile, the upload's
// requests are retried, the step commits, and the bucket's newest step verifies. moto keeps
// its buckets in memory, so the process killed is a TCP proxy in front of it
// (tests/support/tcp_proxy.py): to the client, the same thing.
TEST_F(S3Run, TheServerKilledDuringAnUploadAndRestartedTheStepStillCommits) {
  const std::string uri = "s3://zf-ck/runs/outage";
  const fs::path spec = dir_ / "big.yaml";
  std::string text = kSpec;
  text.replace(text.find("hidden_size: 32"), 15, "hidden_size: 96");
  text.replace(text.find("intermediate_size: 64"), 21, "intermediate_size: 384");
  test_support::write_file(spec, text);
  const int port = test_support::free_tcp_port();
  const std::string moto_port = moto_->url().substr(moto_->url().rfind(':') + 1);
  const std::vector<std::string> proxy_argv = {"/usr/bin/env", "python3", std::string(ZENFLOW_SOURCE_DIR) + "/tests/support/tcp_proxy.py",
                                               std::to_string(port), moto_port};
  auto start_proxy = [&](int n) {
    auto p = std::make_unique<test_support::Process>(proxy_argv, dir_ / ("proxy-" + std::to_string(n) + ".log"));
    EXPECT_TRUE(test_support::wait_until([&] { return p->output().find("listening") != std::string::npos; },
                                         std::chrono::seconds(30)))
        << p->output();
    return p;
  };
  auto proxy = start_proxy(1);
  const fs::path err_path = dir_ / "outage.stderr", stage = dir_ / "O/zf-ck/runs/outage";
  // 1 MiB/s: each checkpoint (~3 MiB) takes seconds to upload, long enough to be cut; the
  // next one comes later than that (~5 ms a step), so training need not wait for it.
  const std::string cmd = "exec env AWS_ENDPOINT_URL=http://127.0.0.1:" + std::to_string(port) +
                          " AWS_MAX_ATTEMPTS=12 AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                          " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " " + ZENFLOW_BINARY_DIR + "/bin/zenflow run " +
                          spec.string() + " --quiet --set train.steps=1000000 --set checkpoint.every_steps=1000 " +
                          "--set checkpoint.upload_mib_per_s=1 --set checkpoint.dir=" + uri + " --staging-dir " +
                          (dir_ / "O").string() + " 2>" + err_path.string() + " >/dev/null";
  test_support::Process run({"/bin/sh", "-c", cmd}, dir_ / "outage.log");
  // An upload in flight: objects of a step whose manifest is not there yet.
  int64_t cut = -1;
  ASSERT_TRUE(test_support::wait_until(
      [&] {
        std::map<int64_t, std::set<std::string>> steps;
        for (const std::string& k : keys_of(*client_, parse_s3_uri(uri + "/")))
          if (k.rfind("step-", 0) == 0) steps[std::stoll(k.substr(5, 8))].insert(k.substr(14));
        for (const auto& [step, files] : steps)
          if (!files.count("manifest.json") && !files.empty()) cut = step;
        return cut >= 0;
      },
      std::chrono::seconds(120)))
      << test_support::read_file(err_path);
  auto steps_logged = [&] {
    const std::string log = test_support::read_file(stage / "steps.jsonl");
    return std::count(log.begin(), log.end(), '\n');
  };
  const auto before = steps_logged();
  proxy.reset();  // SIGKILL: the server is gone
  // Down until training has taken steps without it (bounded).
  EXPECT_TRUE(test_support::wait_until([&] { return steps_logged() > before + 5; }, std::chrono::seconds(60)))
      << "training stopped while the S3 server was down";
  EXPECT_FALSE(client_->head(parse_s3_uri(uri + "/step-" + std::string(8 - std::to_string(cut).size(), '0') +
                                          std::to_string(cut) + "/manifest.json")))
      << "step " << cut << " committed while the server was down";
  proxy = start_proxy(2);
  CheckpointMirror view(client_, parse_s3_uri(uri), (dir_ / "view").string(), MirrorOptions{});
  ASSERT_TRUE(test_support::wait_until([&] { return view.newest_remote_step() >= cut; }, std::chrono::seconds(120)))
      << test_support::read_file(err_path);
  run.signal(SIGTERM);
  EXPECT_EQ(run.wait_exit(std::chrono::seconds(120)), 130) << test_support::read_file(err_path);
  const CheckpointMirror::Pulled p = view.pull();
  EXPECT_GE(p.step, cut);
  EXPECT_EQ(p.damaged, 0);
  EXPECT_NE(proxy->output().find("connection"), std::string::npos) << "the upload never came back through the server";
}

}  // namespace
}  // namespace zenflow
