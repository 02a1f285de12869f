// common/storage/object_cache.h: model.from, data.* and the tokenizer from a bucket, cached
// once per worker. Against moto_server: objects and prefixes, what a second fetch costs, a
// changed object, eviction past the bound (never of an entry in use). Against a scripted S3:
// bytes that do not match their ETag, and ranks asking at once (one download). And `zenflow
// run` reading its data from a bucket: the same losses as from the file, and a resume
// through another worker's cache is the same job.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/storage/object_cache.h"
#include "common/storage/s3.h"
#include "tests/support/error_of.h"
#include "tests/support/http_stub.h"
#include "tests/support/moto.h"
#include "tests/support/scratch.h"
#include "tests/support/shell.h"

namespace zenflow::storage {
namespace {

namespace fs = std::filesystem;
using test_support::error_of;
using test_support::read_file;
using test_support::write_file;

std::string md5_hex(const std::string& s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(s.data(), s.size(), md, &n, EVP_md5(), nullptr);
  std::string out;
  for (unsigned i = 0; i < n; ++i) {
    char b[3];
    std::snprintf(b, sizeof b, "%02x", md[i]);
    out += b;
  }
  return out;
}

class ObjectCacheMoto : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string moto = test_support::find_s3_server();
    if (moto.empty()) GTEST_SKIP() << test_support::kNoS3Server;
    dir_ = test_support::fresh_scratch_dir("object-cache");
    moto_ = std::make_unique<test_support::MotoServer>(moto, dir_ / "moto.log", /*check_signatures=*/false);
    moto_->create_bucket("zf-data");
    S3Settings s;
    s.endpoint = moto_->url();
    s.path_style = true;
    s.credentials = static_credentials({moto_->key_id(), moto_->secret(), "", 0, "test"});
    s.sleep = [](double) {};
    client_ = std::make_shared<S3Client>(s);
  }
  std::unique_ptr<ObjectCache> cache(int64_t max_bytes = int64_t{1} << 30) {
    return std::make_unique<ObjectCache>((dir_ / "cache").string(), max_bytes, client_,
                                         [this](const std::string& l) { logged_.push_back(l); });
  }
  fs::path dir_;
  std::unique_ptr<test_support::MotoServer> moto_;
  std::shared_ptr<S3Client> client_;
  std::vector<std::string> logged_;
};

TEST_F(ObjectCacheMoto, AnObjectIsDownloadedOnceAndAChangedOneIsANewEntry) {
  const S3Uri uri = parse_s3_uri("s3://zf-data/corpus/a.txt");
  client_->put(uri, "first version\n");
  auto c = cache();
  ObjectCache::Entry e = c->fetch(uri);
  EXPECT_TRUE(e.downloaded);
  EXPECT_EQ(e.bytes, 14);
  EXPECT_EQ(fs::path(e.path).filename(), "a.txt");
  EXPECT_EQ(read_file(e.path), "first version\n");
  const std::string first_path = e.path;
  ObjectCache::Entry again = c->fetch(uri);
  EXPECT_FALSE(again.downloaded);
  EXPECT_EQ(again.path, first_path);
  client_->put(uri, "second version\n");
  ObjectCache::Entry changed = c->fetch(uri);
  EXPECT_TRUE(changed.downloaded);
  EXPECT_NE(changed.path, first_path);
  EXPECT_EQ(read_file(changed.path), "second version\n");
  EXPECT_EQ(read_file(first_path), "first version\n") << "an entry in use was changed under its reader";
  EXPECT_EQ(c->bytes(), 14 + 15);
}

TEST_F(ObjectCacheMoto, APrefixIsADirectoryOfEveryObjectUnderIt) {
  client_->put(parse_s3_uri("s3://zf-data/models/llama/config.json"), "{\"hidden_size\": 8}");
  client_->put(parse_s3_uri("s3://zf-data/models/llama/model.safetensors"), std::string(3000, 'w'));
  client_->put(parse_s3_uri("s3://zf-data/models/llama/tok/tokenizer.json"), "{}");
  client_->put(parse_s3_uri("s3://zf-data/models/llama/"), "");  // a console's "folder" marker
  client_->put(parse_s3_uri("s3://zf-data/models/llama-2/config.json"), "not this one");
  auto c = cache();
  for (const char* u : {"s3://zf-data/models/llama", "s3://zf-data/models/llama/"}) {
    ObjectCache::Entry e = c->fetch(parse_s3_uri(u));
    EXPECT_TRUE(fs::is_directory(e.path)) << u;
    EXPECT_EQ(read_file(fs::path(e.path) / "config.json"), "{\"hidden_size\": 8}") << u;
    EXPECT_EQ(fs::file_size(fs::path(e.path) / "model.safetensors"), 3000u) << u;
    EXPECT_EQ(read_file(fs::path(e.path) / "tok/tokenizer.json"), "{}") << u;
    size_t files = 0;
    for (const auto& f : fs::recursive_directory_iterator(e.path)) files += f.is_regular_file();
    EXPECT_EQ(files, 3u) << u;
  }
  EXPECT_EQ(error_of([&] { c->fetch(parse_s3_uri("s3://zf-data/models/nothing")); }),
            "s3://zf-data/models/nothing: no object has this key or this prefix");
}

TEST_F(ObjectCacheMoto, PastItsBoundTheLeastRecentlyUsedEntriesGoButNeverOneInUse) {
  for (const char* k : {"a", "b", "c"}) client_->put(parse_s3_uri(std::string("s3://zf-data/") + k), std::string(1000, *k));
  auto c = cache(/*max_bytes=*/2500);
  std::string path_a;
  {
    ObjectCache::Entry a = c->fetch(parse_s3_uri("s3://zf-data/a"));
    path_a = a.path;
  }
  ObjectCache::Entry b = c->fetch(parse_s3_uri("s3://zf-data/b"));  // held
  ObjectCache::Entry cc = c->fetch(parse_s3_uri("s3://zf-data/c"));  // 3000 > 2500: a goes
  EXPECT_FALSE(fs::exists(path_a)) << "the least recently used entry was kept past the bound";
  EXPECT_TRUE(fs::exists(b.path));
  EXPECT_EQ(c->bytes(), 2000);
  // Now b and c are both in use: a third entry exceeds the bound and says so.
  ObjectCache::Entry a2 = c->fetch(parse_s3_uri("s3://zf-data/a"));
  EXPECT_TRUE(fs::exists(b.path));
  EXPECT_TRUE(fs::exists(cc.path));
  EXPECT_EQ(read_file(a2.path), std::string(1000, 'a'));
  ASSERT_FALSE(logged_.empty());
  EXPECT_EQ(logged_.back(), "cache: 3000 bytes exceeds its bound of 2500 bytes (2000 bytes held by running jobs)");
}

// ---- A scripted S3 -----------------------------------------------------------------------------

TEST(ObjectCacheStub, BytesThatDoNotMatchTheirEtagAreRefusedAndNothingIsKept) {
  const std::string good = "the real corpus\n";
  test_support::HttpStub stub([&](const test_support::HttpRequest& r) {
    test_support::HttpReply reply{200, {{"ETag", "\"" + md5_hex(good) + "\""}}, "the fake corpus\n"};
    if (r.method == "HEAD") reply.body = good;  // Content-Length only
    return reply;
  });
  S3Settings s;
  s.endpoint = stub.url();
  s.path_style = true;
  s.sleep = [](double) {};
  const fs::path dir = test_support::fresh_scratch_dir("object-cache-etag");
  ObjectCache c((dir / "cache").string(), 1 << 20, std::make_shared<S3Client>(s));
  EXPECT_EQ(error_of([&] { c.fetch(parse_s3_uri("s3://bkt/corpus.txt")); }),
            "s3://bkt/corpus.txt: the bytes that arrived do not match its ETag " + md5_hex(good) +
                " (MD5): damaged in transit, or replaced while it was read");
  EXPECT_EQ(c.bytes(), 0);
  size_t left = 0;
  for (const auto& e : fs::directory_iterator(dir / "cache/entries")) left += e.is_directory();
  EXPECT_EQ(left, 0u) << "a damaged download stayed in the cache";
}

TEST(ObjectCacheStub, RanksAskingAtOnceShareOneDownload) {
  const std::string body(200000, 'r');
  std::atomic<int> gets{0};
  test_support::HttpStub stub([&](const test_support::HttpRequest& r) {
    if (r.method == "GET") ++gets;
    return test_support::HttpReply{200, {{"ETag", "\"" + md5_hex(body) + "\""}}, body};
  });
  S3Settings s;
  s.endpoint = stub.url();
  s.path_style = true;
  const fs::path dir = test_support::fresh_scratch_dir("object-cache-ranks");
  auto client = std::make_shared<S3Client>(s);
  std::vector<std::thread> ranks;
  std::mutex mu;
  std::vector<std::string> paths;
  int downloads = 0;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back([&] {
      ObjectCache c((dir / "cache").string(), 1 << 30, client);  // each rank its own, as processes have
      ObjectCache::Entry e = c.fetch(parse_s3_uri("s3://bkt/data.bin"));
      std::lock_guard<std::mutex> lock(mu);
      paths.push_back(e.path);
      downloads += e.downloaded;
    });
  for (auto& t : ranks) t.join();
  EXPECT_EQ(gets.load(), 1);
  EXPECT_EQ(downloads, 1);
  for (const std::string& p : paths) EXPECT_EQ(p, paths[0]);
  EXPECT_EQ(read_file(paths[0]), body);
}

TEST(ObjectCacheDir, IsTheGivenOneThenTheEnvironmentsThenTheUsersCache) {
  EXPECT_EQ(object_cache_dir("/data/cache"), "/data/cache");
  ::setenv("ZENFLOW_CACHE_DIR", "/scratch/objects", 1);
  EXPECT_EQ(object_cache_dir(), "/scratch/objects");
  ::unsetenv("ZENFLOW_CACHE_DIR");
  ::setenv("XDG_CACHE_HOME", "/home/u/.c", 1);
  EXPECT_EQ(object_cache_dir(), "/home/u/.c/zenflow/objects");
  ::unsetenv("XDG_CACHE_HOME");
}

// ---- zenflow run ---------------------------------------------------------------------------------

const char* kSpec = R"(name: s3-data
model:
  arch: llama
  config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, intermediate_size: 64,
           max_position_embeddings: 64}
data: {train: DATA, format: text, tokenizer: byte, val_fraction: 0}
train: {steps: 12, micro_batch: 2, grad_accum: 1, seq_len: 32, lr: 3.0e-3, warmup_steps: 2, seed: 3}
optimizer: {mode: offload}
checkpoint: {every_steps: 4, keep: 2}
)";

TEST_F(ObjectCacheMoto, ARunReadsItsDataFromTheBucketAsFromTheFileAndResumesThroughAnotherCache) {
  const std::string corpus = read_file("/usr/share/common-licenses/GPL-3");
  ASSERT_GT(corpus.size(), 10000u);
  client_->put(parse_s3_uri("s3://zf-data/corpus/GPL-3"), corpus);
  write_file(dir_ / "local.txt", corpus);
  auto spec = [&](const std::string& data, const std::string& name) {
    std::string text = kSpec;
    text.replace(text.find("DATA"), 4, data);
    write_file(dir_ / name, text);
    return (dir_ / name).string();
  };
  const std::string env = "env AWS_ENDPOINT_URL=" + moto_->url() + " AWS_ACCESS_KEY_ID=" + moto_->key_id() +
                          " AWS_SECRET_ACCESS_KEY=" + moto_->secret() + " ";
  auto run = [&](const std::string& spec_path, const std::string& flags, std::string* err) {
    std::string out;
    const fs::path e = dir_ / "run.err";
    const int rc = test_support::run(env + ZENFLOW_BINARY_DIR + "/bin/zenflow run " + spec_path +
                                         " --quiet --json " + flags + " 2>" + e.string(),
                                     &out);
    *err = read_file(e);
    return rc == 0 ? nlohmann::json::parse(out) : nlohmann::json{{"exit", rc}};
  };
  std::string err;
  const std::string bucket_spec = spec("s3://zf-data/corpus/GPL-3", "bucket.yaml");
  const nlohmann::json first = run(bucket_spec,
                                   "--set train.steps=8 --set checkpoint.dir=" + (dir_ / "ck").string() +
                                       " --cache-dir " + (dir_ / "cache-A").string(),
                                   &err);
  ASSERT_FALSE(first.contains("exit")) << err;
  EXPECT_NE(err.find("data.train s3://zf-data/corpus/GPL-3: " + std::to_string(corpus.size()) +
                     " bytes downloaded into the cache"),
            std::string::npos)
      << err;
  // Resumed on "another worker": an empty cache, the same checkpoint directory. The job's
  // identity holds the URI, not the copy's path, so nothing changed.
  const nlohmann::json resumed = run(bucket_spec,
                                     "--set checkpoint.dir=" + (dir_ / "ck").string() + " --cache-dir " +
                                         (dir_ / "cache-B").string(),
                                     &err);
  ASSERT_FALSE(resumed.contains("exit")) << err;
  EXPECT_EQ(resumed.at("start_step"), 8);
  EXPECT_NE(read_file(dir_ / "ck/step-00000012/run.yaml").find("s3://zf-data/corpus/GPL-3"), std::string::npos)
      << "run.yaml records the cache's path instead of the URI";
  // The same training from the local file: the same numbers.
  const std::string local_spec = spec((dir_ / "local.txt").string(), "local.yaml");
  ASSERT_FALSE(run(local_spec, "--set train.steps=8 --set checkpoint.dir=" + (dir_ / "ck-local").string(), &err)
                   .contains("exit"))
      << err;
  const nlohmann::json local = run(local_spec, "--set checkpoint.dir=" + (dir_ / "ck-local").string(), &err);
  ASSERT_FALSE(local.contains("exit")) << err;
  EXPECT_EQ(resumed.at("losses"), local.at("losses"));
  // A URI that names nothing: bad input naming the key.
  const nlohmann::json missing =
      run(spec("s3://zf-data/corpus/nope", "missing.yaml"), "--set checkpoint.dir=" + (dir_ / "ck-none").string(), &err);
  EXPECT_EQ(missing.value("exit", 0), 2) << err;
  EXPECT_NE(err.find("data.train: s3://zf-data/corpus/nope: no object has this key or this prefix"), std::string::npos)
      << err;
}

}  // namespace
}  // namespace zenflow::storage
