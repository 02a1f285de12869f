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
#include <random>
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
    const std::string moto = test_support::find_moto_server();
    if (moto.empty()) GTEST_SKIP() << "moto_server is not installed (pip install 'moto[server]'): no S3 server to test against";
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
  int run(const std::string& flags, std::string* out, std::string* err) {
    const fs::path e = dir_ / ("stderr-" + std::to_string(runs_++));
    const std::string cmd = "env AWS_ENDPOINT_URL=" + moto_->url() + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                            " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " " + ZENFLOW_BINARY_DIR +
                            "/bin/zenflow run " + spec_.string() + " --quiet --json " + flags + " 2>" + e.string();
    const int rc = test_support::run(cmd, out);
    *err = test_support::read_file(e);
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

}  // namespace
}  // namespace zenflow
