// common/storage/s3.h: objects in S3 and compatibles.
//
// Against a real S3 API server (moto_server, signatures checked): round trips of odd keys,
// If-None-Match, multipart uploads in parallel, a wrong secret, web-identity credentials.
// Against a scripted HTTP server (tests/support/http_stub.h): retries and their waits,
// errors that must not be retried, listing pages, truncated bodies, garbage answers, the
// container credentials endpoint. And the settings the environment and ~/.aws give.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/storage/s3.h"
#include "tests/support/error_of.h"
#include "tests/support/http_stub.h"
#include "tests/support/moto.h"
#include "tests/support/scratch.h"

namespace zenflow::storage {
namespace {

namespace fs = std::filesystem;
using test_support::HttpReply;
using test_support::HttpRequest;
using test_support::HttpStub;

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

void write_text(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

fs::path scratch_dir(const std::string& name) { return test_support::fresh_scratch_dir(name); }

using test_support::error_of;

// ---- URIs and settings ------------------------------------------------------------------------

TEST(S3Uri, ParsesBucketAndKeyAndRefusesBadOnesNamingThem) {
  const S3Uri u = parse_s3_uri("s3://my-bucket.data/runs/a b/step-1");
  EXPECT_EQ(u.bucket, "my-bucket.data");
  EXPECT_EQ(u.key, "runs/a b/step-1");
  EXPECT_EQ(u.text(), "s3://my-bucket.data/runs/a b/step-1");
  EXPECT_EQ(parse_s3_uri("s3://bkt").key, "");
  EXPECT_EQ(parse_s3_uri("s3://bkt/run/").child("manifest.json").key, "run/manifest.json");
  EXPECT_EQ(parse_s3_uri("s3://bkt/run").child("/x").key, "run/x");
  EXPECT_TRUE(is_s3_uri("s3://b/k"));
  EXPECT_FALSE(is_s3_uri("/data/s3://b"));
  EXPECT_EQ(error_of([] { parse_s3_uri("/tmp/x"); }), "'/tmp/x' is not an s3:// URI");
  EXPECT_EQ(error_of([] { parse_s3_uri("s3://Upper/k"); }),
            "'s3://Upper/k': the bucket name 'Upper' is not 3-63 characters of a-z, 0-9, '.' and '-'");
  EXPECT_NE(error_of([] { parse_s3_uri("s3://ab/k"); }).find("the bucket name 'ab'"), std::string::npos);
  EXPECT_NE(error_of([] { parse_s3_uri("s3://bucket-/k"); }).find("bucket name"), std::string::npos);
  EXPECT_NE(error_of([] { parse_s3_uri("s3://bkt/a\x1b[2Jb"); }).find("control character"), std::string::npos);
  EXPECT_NE(error_of([] { parse_s3_uri("s3://bkt/" + std::string(1025, 'k')); }).find("longer than 1024"),
            std::string::npos);
}

TEST(S3Checksum, IsTheBase64OfTheBigEndianCrc32c) {
  EXPECT_EQ(crc32c_base64(0xE3069283u), "4waSgw==");  // CRC32C("123456789")
  EXPECT_EQ(crc32c_base64(0), "AAAAAA==");
}

TEST(S3Settings, EnvironmentCredentialsEndpointAndRegionWinOverTheProfile) {
  const fs::path home = scratch_dir("s3-settings");
  write_text(home / ".aws/credentials", "[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n");
  write_text(home / ".aws/config", "[default]\nregion = eu-west-3\n");
  S3Settings s = s3_settings_from_environment(env_of({{"HOME", home.string()},
                                                      {"AWS_ACCESS_KEY_ID", "ENVKEY"},
                                                      {"AWS_SECRET_ACCESS_KEY", "env/secret:x"},
                                                      {"AWS_SESSION_TOKEN", "tok"},
                                                      {"AWS_REGION", "ap-south-1"},
                                                      {"AWS_ENDPOINT_URL", "http://other:1"},
                                                      {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000/"}}));
  ASSERT_TRUE(s.credentials);
  const AwsCredentials c = s.credentials->current();
  EXPECT_EQ(c.access_key_id, "ENVKEY");
  EXPECT_EQ(c.secret_access_key, "env/secret:x");
  EXPECT_EQ(c.session_token, "tok");
  EXPECT_EQ(c.source, "environment");
  EXPECT_EQ(s.region, "ap-south-1");
  EXPECT_EQ(s.endpoint, "http://127.0.0.1:9000");
  EXPECT_TRUE(s.path_style);

  // Without them: the default profile's key and its config's region, AWS's own endpoint.
  s = s3_settings_from_environment(env_of({{"HOME", home.string()}}));
  EXPECT_EQ(s.credentials->current().access_key_id, "FILEKEY");
  EXPECT_EQ(s.credentials->current().source, "profile default (" + (home / ".aws/credentials").string() + ")");
  EXPECT_EQ(s.region, "eu-west-3");
  EXPECT_EQ(s.endpoint, "https://s3.eu-west-3.amazonaws.com");
  EXPECT_FALSE(s.path_style);
  EXPECT_EQ(s.max_attempts, 6);

  // Attempts per request: AWS_MAX_ATTEMPTS, else the profile's max_attempts; nonsense is refused.
  write_text(home / ".aws/config", "[default]\nregion = eu-west-3\nmax_attempts = 9\n");
  EXPECT_EQ(s3_settings_from_environment(env_of({{"HOME", home.string()}})).max_attempts, 9);
  EXPECT_EQ(s3_settings_from_environment(env_of({{"HOME", home.string()}, {"AWS_MAX_ATTEMPTS", "2"}})).max_attempts, 2);
  const std::string e = error_of([&] { s3_settings_from_environment(env_of({{"AWS_MAX_ATTEMPTS", "lots"}})); });
  EXPECT_NE(e.find("AWS_MAX_ATTEMPTS (or the profile's max_attempts) is 'lots': an integer from 1 to 100 was expected"),
            std::string::npos)
      << e;
}

TEST(S3Settings, NamedProfilesFromTheCredentialsAndConfigFiles) {
  const fs::path home = scratch_dir("s3-profiles");
  write_text(home / "creds", "# a comment\n[dev]\naws_access_key_id=DEVKEY\naws_secret_access_key=devsecret\n"
                             "aws_session_token = devtoken\n[default]\naws_access_key_id=DEF\naws_secret_access_key=d\n");
  write_text(home / "conf", "[profile dev]\nregion = us-west-2\n[profile cfgonly]\naws_access_key_id = CFG\n"
                            "aws_secret_access_key = cfgsecret\n");
  const auto base = std::map<std::string, std::string>{{"HOME", home.string()},
                                                       {"AWS_SHARED_CREDENTIALS_FILE", (home / "creds").string()},
                                                       {"AWS_CONFIG_FILE", (home / "conf").string()}};
  auto with = [&](std::map<std::string, std::string> extra) {
    auto m = base;
    for (auto& [k, v] : extra) m[k] = v;
    return s3_settings_from_environment(env_of(m));
  };
  S3Settings dev = with({{"AWS_PROFILE", "dev"}});
  EXPECT_EQ(dev.credentials->current().access_key_id, "DEVKEY");
  EXPECT_EQ(dev.credentials->current().session_token, "devtoken");
  EXPECT_EQ(dev.region, "us-west-2");
  EXPECT_EQ(with({{"AWS_PROFILE", "cfgonly"}}).credentials->current().secret_access_key, "cfgsecret");
  EXPECT_EQ(error_of([&] { with({{"AWS_PROFILE", "nope"}}); }),
            "AWS_PROFILE=nope: no such profile in " + (home / "creds").string() + " or " + (home / "conf").string());
  EXPECT_EQ(error_of([&] { with({{"AWS_ACCESS_KEY_ID", "K"}}); }),
            "AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
  EXPECT_EQ(error_of([&] { with({{"AWS_ENDPOINT_URL", "minio:9000"}}); }),
            "AWS_ENDPOINT_URL must start with http:// or https://, got 'minio:9000'");
  EXPECT_EQ(error_of([&] { with({{"AWS_ROLE_ARN", "arn:aws:iam::1:role/r"}}); }),
            "AWS_ROLE_ARN is set but AWS_WEB_IDENTITY_TOKEN_FILE is not");
  // No credentials anywhere: anonymous.
  EXPECT_FALSE(s3_settings_from_environment(env_of({{"HOME", (home / "empty").string()}})).credentials);
}

// ---- Against a scripted server -----------------------------------------------------------------

S3Settings stub_settings(const HttpStub& stub, std::vector<double>* waits) {
  S3Settings s;
  s.endpoint = stub.url();
  s.path_style = true;
  s.credentials = static_credentials({"AKIDSTUB", "stubsecret", "", 0, "test"});
  s.sleep = [waits](double sec) { waits->push_back(sec); };
  s.jitter_seed = 7;
  s.connect_timeout_s = 2;
  s.stall_timeout_s = 2;
  return s;
}

const char* kSlowDown = "<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>";

TEST(S3Retries, SlowDownAndServerErrorsAreRetriedWithGrowingJitteredWaits) {
  std::atomic<int> calls{0};
  HttpStub stub([&](const HttpRequest&) {
    const int n = calls++;
    if (n == 0) return HttpReply{503, {}, kSlowDown};
    if (n == 1) return HttpReply{500, {}, "<Error><Code>InternalError</Code><Message>x</Message></Error>"};
    if (n == 2) return HttpReply{503, {}, kSlowDown};
    return HttpReply{200, {{"ETag", "\"abc\""}}, ""};
  });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  client.put(parse_s3_uri("s3://bkt/key with space"), "payload");
  ASSERT_EQ(waits.size(), 3u);
  // Equal jitter: attempt k waits in [d/2, d], d = 0.2 s × 2^k.
  for (size_t k = 0; k < waits.size(); ++k) {
    const double d = 0.2 * static_cast<double>(1 << k);
    EXPECT_GE(waits[k], d / 2) << k;
    EXPECT_LE(waits[k], d) << k;
  }
  const auto reqs = stub.requests();
  ASSERT_EQ(reqs.size(), 4u);
  for (const HttpRequest& r : reqs) {
    EXPECT_EQ(r.method, "PUT");
    EXPECT_EQ(r.target, "/bkt/key%20with%20space");
    EXPECT_EQ(r.body, "payload");
    EXPECT_EQ(r.headers.at("x-amz-checksum-crc32c"), crc32c_base64(crc32c("payload", 7)));
    EXPECT_EQ(r.headers.at("x-amz-content-sha256"), "UNSIGNED-PAYLOAD");
    EXPECT_EQ(r.headers.at("authorization").rfind("AWS4-HMAC-SHA256 Credential=AKIDSTUB/", 0), 0u)
        << r.headers.at("authorization");
  }
}

TEST(S3Retries, GiveUpAfterMaxAttemptsNamingTheUriTheStatusAndTheCount) {
  HttpStub stub([](const HttpRequest&) { return HttpReply{503, {}, kSlowDown}; });
  std::vector<double> waits;
  S3Settings s = stub_settings(stub, &waits);
  s.max_attempts = 4;
  s.max_delay_s = 0.5;
  S3Client client(s);
  EXPECT_EQ(error_of([&] { client.get(parse_s3_uri("s3://bkt/a")); }),
            "GET s3://bkt/a: HTTP 503 SlowDown: Please reduce your request rate. (after 4 attempts)");
  ASSERT_EQ(waits.size(), 3u);
  EXPECT_LE(waits[2], 0.5);  // capped
  EXPECT_EQ(stub.requests().size(), 4u);
}

TEST(S3Retries, ClientErrorsAreNotRetried) {
  HttpStub stub([](const HttpRequest& r) {
    if (r.method == "GET" || r.method == "HEAD")
      return HttpReply{404, {}, "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist.</Message></Error>"};
    return HttpReply{403, {}, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"};
  });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  try {
    client.get(parse_s3_uri("s3://bkt/missing"));
    ADD_FAILURE() << "no error";
  } catch (const S3Error& e) {
    EXPECT_EQ(std::string(e.what()), "GET s3://bkt/missing: HTTP 404 NoSuchKey: The specified key does not exist.");
    EXPECT_EQ(e.http_status, 404);
    EXPECT_EQ(e.code, "NoSuchKey");
  }
  EXPECT_EQ(error_of([&] { client.put(parse_s3_uri("s3://bkt/k"), "x"); }),
            "PUT s3://bkt/k: HTTP 403 AccessDenied: Access Denied");
  EXPECT_TRUE(waits.empty());
  EXPECT_FALSE(client.head(parse_s3_uri("s3://bkt/missing")).has_value()) << "HEAD of a missing key is nullopt";
}

TEST(S3Retries, AnAnonymousRequestRefusedSaysNoCredentialsWereFound) {
  HttpStub stub([](const HttpRequest&) {
    return HttpReply{403, {}, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"};
  });
  std::vector<double> waits;
  S3Settings s = stub_settings(stub, &waits);
  s.credentials = nullptr;
  EXPECT_EQ(error_of([&] { S3Client(s).get(parse_s3_uri("s3://bkt/k")); }),
            "GET s3://bkt/k: HTTP 403 AccessDenied: Access Denied (no AWS credentials were found)");
  ASSERT_EQ(stub.requests().size(), 1u);
  EXPECT_EQ(stub.requests()[0].headers.count("authorization"), 0u) << "an anonymous request was signed";
}

TEST(S3Retries, NoServerIsRetriedThenNamesTheEndpoint) {
  const int port = test_support::free_tcp_port();  // nobody listens there
  std::vector<double> waits;
  S3Settings s;
  s.endpoint = "http://127.0.0.1:" + std::to_string(port);
  s.path_style = true;
  s.max_attempts = 3;
  s.sleep = [&](double sec) { waits.push_back(sec); };
  S3Client client(s);
  const std::string e = error_of([&] { client.head(parse_s3_uri("s3://bkt/k")); });
  EXPECT_EQ(e.rfind("HEAD s3://bkt/k: ", 0), 0u) << e;
  EXPECT_NE(e.find("(http://127.0.0.1:" + std::to_string(port) + "/bkt/k) (after 3 attempts)"), std::string::npos) << e;
  EXPECT_EQ(waits.size(), 2u);
}

TEST(S3Retries, ATruncatedBodyIsFetchedAgainAndTheFileHoldsOnlyTheWholeOne) {
  std::atomic<int> calls{0};
  const std::string whole(100000, 'w');
  HttpStub stub([&](const HttpRequest&) {
    if (calls++ == 0) return HttpReply{200, {}, std::string(5000, 'x'), 100000};  // cut short
    return HttpReply{200, {{"ETag", "\"e1\""}}, whole};
  });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  const fs::path dir = scratch_dir("s3-truncated");
  const ObjectInfo info = client.get_file(parse_s3_uri("s3://bkt/obj"), (dir / "obj").string());
  EXPECT_EQ(info.size, 100000);
  EXPECT_EQ(info.etag, "e1");
  std::ifstream in(dir / "obj", std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, whole);
  EXPECT_FALSE(fs::exists(dir / "obj.part"));
  EXPECT_EQ(waits.size(), 1u);
}

TEST(S3List, FollowsContinuationTokensWithSortedCanonicalQueries) {
  HttpStub stub([](const HttpRequest& r) {
    if (r.target.find("continuation-token=") == std::string::npos)
      return HttpReply{200, {},
                       "<?xml version=\"1.0\"?><ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                       "<IsTruncated>true</IsTruncated><NextContinuationToken>t+/=1</NextContinuationToken>"
                       "<Contents><Key>run/b</Key><Size>2</Size><ETag>\"e2\"</ETag></Contents>"
                       "<Contents><Key>run/a</Key><Size>1</Size><ETag>\"e1\"</ETag></Contents></ListBucketResult>"};
    return HttpReply{200, {},
                     "<ListBucketResult><IsTruncated>false</IsTruncated>"
                     "<Contents><Key>run/c &amp; d</Key><Size>3000000000</Size><ETag>e3</ETag></Contents>"
                     "</ListBucketResult>"};
  });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  const auto objects = client.list(parse_s3_uri("s3://bkt/run/"));
  ASSERT_EQ(objects.size(), 3u);
  EXPECT_EQ(objects[0].key, "run/a");
  EXPECT_EQ(objects[1].etag, "e2");
  EXPECT_EQ(objects[2].key, "run/c & d");
  EXPECT_EQ(objects[2].size, 3000000000);
  const auto reqs = stub.requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].target, "/bkt?list-type=2&prefix=run%2F");
  EXPECT_EQ(reqs[1].target, "/bkt?continuation-token=t%2B%2F%3D1&list-type=2&prefix=run%2F");
}

TEST(S3List, GarbageAnswersAreErrorsNotObjects) {
  std::atomic<int> calls{0};
  HttpStub stub([&](const HttpRequest&) {
    switch (calls++) {
      case 0:
        return HttpReply{200, {}, "not xml at all"};
      case 1:
        return HttpReply{200, {}, "<ListBucketResult><Contents><Key>k</Key><Size>big</Size></Contents></ListBucketResult>"};
      default:
        return HttpReply{200, {}, "<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>"};
    }
  });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  const S3Uri p = parse_s3_uri("s3://bkt/p");
  EXPECT_EQ(error_of([&] { client.list(p); }), "LIST s3://bkt/p: the answer is not a ListBucketResult");
  EXPECT_EQ(error_of([&] { client.list(p); }), "LIST s3://bkt/p: the size of k is not a number");
  EXPECT_EQ(error_of([&] { client.list(p); }), "LIST s3://bkt/p: a truncated page without a continuation token");
}

TEST(S3Get, AnObjectLargerThanAskedForIsRefused) {
  HttpStub stub([](const HttpRequest&) { return HttpReply{200, {}, std::string(5000, 'z')}; });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  try {
    client.get(parse_s3_uri("s3://bkt/big"), 1000);
    ADD_FAILURE() << "no error";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.code, "TooLarge");
    EXPECT_EQ(std::string(e.what()), "GET s3://bkt/big: larger than 1000 bytes");
  }
}

TEST(S3Credentials, TheContainerEndpointGivesTemporaryCredentialsThatSignRequests) {
  HttpStub creds([](const HttpRequest& r) {
    if (r.headers.count("authorization") == 0 || r.headers.at("authorization") != "pod-identity-token")
      return HttpReply{401, {}, ""};
    return HttpReply{200, {},
                     R"({"AccessKeyId": "ASIACONTAINER", "SecretAccessKey": "cs", "Token": "ctok",
                         "Expiration": "2099-01-01T00:00:00Z"})"};
  });
  const fs::path dir = scratch_dir("s3-container");
  write_text(dir / "token", "pod-identity-token\n");
  S3Settings s = s3_settings_from_environment(env_of({{"HOME", (dir / "home").string()},
                                                      {"AWS_CONTAINER_CREDENTIALS_FULL_URI", creds.url() + "/creds"},
                                                      {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", (dir / "token").string()},
                                                      {"AWS_ENDPOINT_URL", "http://127.0.0.1:1"}}));
  ASSERT_TRUE(s.credentials);
  const AwsCredentials c = s.credentials->current();
  EXPECT_EQ(c.access_key_id, "ASIACONTAINER");
  EXPECT_EQ(c.session_token, "ctok");
  EXPECT_EQ(c.expires_unix, 4070908800);
  s.credentials->current();
  EXPECT_EQ(creds.requests().size(), 1u) << "credentials valid for years were fetched again";

  HttpStub s3([](const HttpRequest&) { return HttpReply{200, {}, ""}; });
  std::vector<double> waits;
  S3Settings use = stub_settings(s3, &waits);
  use.credentials = s.credentials;
  S3Client(use).put(parse_s3_uri("s3://bkt/k"), "x");
  const auto reqs = s3.requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_NE(reqs[0].headers.at("authorization").find("Credential=ASIACONTAINER/"), std::string::npos);
  EXPECT_EQ(reqs[0].headers.at("x-amz-security-token"), "ctok");

  write_text(dir / "token", "wrong");
  S3Settings refused = s3_settings_from_environment(env_of({{"HOME", (dir / "home").string()},
                                                            {"AWS_CONTAINER_CREDENTIALS_FULL_URI", creds.url() + "/creds"},
                                                            {"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", (dir / "token").string()}}));
  EXPECT_EQ(error_of([&] { refused.credentials->current(); }),
            "the container credentials endpoint " + creds.url() + "/creds: HTTP 401");
}

// checkpoint.upload_mib_per_s: a capped upload cannot go faster than its cap (loopback to a
// stub that takes everything at once would, by orders of magnitude). Lower bounds only.
TEST(S3Upload, ABandwidthCapHoldsOneObjectAndAParallelMultipartUnderIt) {
  HttpStub stub([](const HttpRequest& r) {
    if (r.method == "POST" && r.target.find("uploads") != std::string::npos)
      return HttpReply{200, {}, "<InitiateMultipartUploadResult><UploadId>u1</UploadId></InitiateMultipartUploadResult>"};
    return HttpReply{200, {{"ETag", "\"e\""}}, ""};
  });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  const fs::path dir = test_support::fresh_scratch_dir("s3-cap");
  auto file_of = [&](const std::string& name, size_t bytes) {
    const fs::path p = dir / name;
    std::ofstream(p, std::ios::binary) << std::string(bytes, 'z');
    return p.string();
  };
  auto seconds_to_send = [&](const std::string& path, const UploadOptions& o) {
    const auto t0 = std::chrono::steady_clock::now();
    client.put_file(path, parse_s3_uri("s3://bkt/" + fs::path(path).filename().string()), o);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  UploadOptions one;
  one.max_bytes_per_second = 1 << 20;
  EXPECT_GE(seconds_to_send(file_of("one", 3 << 20), one), 2.0) << "3 MiB at 1 MiB/s";
  UploadOptions parts;
  parts.part_bytes = 5 << 20;
  parts.parallel_parts = 2;
  parts.max_bytes_per_second = 4 << 20;
  EXPECT_GE(seconds_to_send(file_of("parts", 10 << 20), parts), 1.8) << "2 parts of 5 MiB at 2 MiB/s each";
  size_t part_puts = 0;
  for (const auto& r : stub.requests()) part_puts += r.method == "PUT" && r.target.find("partNumber") != std::string::npos;
  EXPECT_EQ(part_puts, 2u);
}

TEST(S3Keys, AreSentUriEncodedOnceAsSigV4Wants) {
  HttpStub stub([](const HttpRequest&) { return HttpReply{200, {}, ""}; });
  std::vector<double> waits;
  S3Client client(stub_settings(stub, &waits));
  client.put(parse_s3_uri("s3://bkt/a+b=c&d e/\xc3\xbc/../x;y,z~_-.*'!()$@:"), "x");
  ASSERT_EQ(stub.requests().size(), 1u);
  EXPECT_EQ(stub.requests()[0].target, "/bkt/a%2Bb%3Dc%26d%20e/%C3%BC/../x%3By%2Cz~_-.%2A%27%21%28%29%24%40%3A");
  // Virtual-hosted addressing (AWS's own endpoints): the bucket in the host name.
  S3Settings v = stub_settings(stub, &waits);
  v.path_style = false;
  v.endpoint = "https://s3.eu-west-1.amazonaws.com";
  v.max_attempts = 1;
  v.connect_timeout_s = 0.001;
  const std::string e = error_of([&] { S3Client(v).head(parse_s3_uri("s3://bkt/k 1")); });
  EXPECT_NE(e.find("(https://bkt.s3.eu-west-1.amazonaws.com/k%201)"), std::string::npos) << e;
}

TEST(S3Credentials, AWebIdentityIsExchangedAtStsForTemporaryCredentials) {
  HttpStub sts([](const HttpRequest& r) {
    if (r.method != "POST" || r.body.find("Action=AssumeRoleWithWebIdentity") == std::string::npos)
      return HttpReply{400, {}, "<ErrorResponse><Error><Code>InvalidAction</Code></Error></ErrorResponse>"};
    if (r.body.find("WebIdentityToken=expired") != std::string::npos)
      return HttpReply{400, {},
                       "<ErrorResponse><Error><Code>ExpiredTokenException</Code><Message>Token expired</Message>"
                       "</Error></ErrorResponse>"};
    return HttpReply{200, {},
                     "<AssumeRoleWithWebIdentityResponse xmlns=\"https://sts.amazonaws.com/doc/2011-06-15/\">"
                     "<AssumeRoleWithWebIdentityResult><Credentials><AccessKeyId>ASIAWEBID</AccessKeyId>"
                     "<SecretAccessKey>wsecret</SecretAccessKey><SessionToken>wtoken</SessionToken>"
                     "<Expiration>2099-01-01T00:00:00Z</Expiration></Credentials></AssumeRoleWithWebIdentityResult>"
                     "</AssumeRoleWithWebIdentityResponse>"};
  });
  const fs::path dir = scratch_dir("s3-webid");
  write_text(dir / "token", "eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n");
  auto env = std::map<std::string, std::string>{{"HOME", (dir / "home").string()},
                                                {"AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/zenflow"},
                                                {"AWS_WEB_IDENTITY_TOKEN_FILE", (dir / "token").string()},
                                                {"AWS_ROLE_SESSION_NAME", "rank-0"},
                                                {"AWS_ENDPOINT_URL_STS", sts.url()},
                                                {"AWS_ENDPOINT_URL_S3", "http://127.0.0.1:1"}};
  S3Settings s = s3_settings_from_environment(env_of(env));
  ASSERT_TRUE(s.credentials);
  const AwsCredentials c = s.credentials->current();
  EXPECT_EQ(c.access_key_id, "ASIAWEBID");
  EXPECT_EQ(c.secret_access_key, "wsecret");
  EXPECT_EQ(c.session_token, "wtoken");
  EXPECT_EQ(c.expires_unix, 4070908800);
  EXPECT_EQ(c.source, "web identity (arn:aws:iam::123456789012:role/zenflow)");
  ASSERT_EQ(sts.requests().size(), 1u);
  EXPECT_EQ(sts.requests()[0].body,
            "Action=AssumeRoleWithWebIdentity&RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fzenflow&"
            "RoleSessionName=rank-0&Version=2011-06-15&WebIdentityToken=eyJhbGciOiJSUzI1NiJ9.e30.c2ln");
  EXPECT_EQ(sts.requests()[0].headers.count("authorization"), 0u) << "AssumeRoleWithWebIdentity is unsigned";
  write_text(dir / "token", "expired");
  EXPECT_EQ(error_of([&] { s3_settings_from_environment(env_of(env)).credentials->current(); }),
            "AssumeRoleWithWebIdentity for arn:aws:iam::123456789012:role/zenflow at " + sts.url() +
                ": HTTP 400 ExpiredTokenException: Token expired");
}

// ---- Against a real S3 API server ----------------------------------------------------------------

class S3Moto : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string moto = test_support::find_s3_server();
    if (moto.empty()) GTEST_SKIP() << test_support::kNoS3Server;
    dir_ = scratch_dir("s3-moto");
    moto_ = std::make_unique<test_support::MotoServer>(moto, dir_ / "moto.log");
    moto_->create_bucket("zf-test");
  }

  S3Settings settings(const std::string& secret = "") const {
    S3Settings s;
    s.endpoint = moto_->url();
    s.path_style = true;
    s.credentials = static_credentials({moto_->key_id(), secret.empty() ? moto_->secret() : secret, "", 0, "test"});
    s.sleep = [](double) {};
    return s;
  }

  fs::path dir_;
  std::unique_ptr<test_support::MotoServer> moto_;
};

// Keys with every kind of character round-trip. moto checks signatures over a path it
// decodes and re-encodes its own way (the AWS CLI's requests for these keys fail there
// too), so this runs on a second moto that checks none; what is sent for them is pinned by
// S3Keys.AreSentUriEncodedOnceAsSigV4Wants.
TEST_F(S3Moto, OddKeysRoundTripThroughPutHeadGetListAndDelete) {
  test_support::MotoServer unchecked(test_support::find_s3_server(), dir_ / "moto-unchecked.log",
                                     /*check_signatures=*/false);
  unchecked.create_bucket("zf-test");
  S3Settings s = settings();
  s.endpoint = unchecked.url();
  s.credentials = static_credentials({unchecked.key_id(), unchecked.secret(), "", 0, "test"});
  S3Client client(s);
  std::vector<std::string> keys = {"run/plain.bin", "run/with space+plus=eq&amp", "run/ünïcödé/ключ",
                                   "run/a/../dots/./x", "run/semi;colon,comma~tilde*star'quote"};
  if (unchecked.is_s3rver()) keys.erase(keys.begin() + 3);  // s3rver resolves '..' in keys; S3 does not
  std::map<std::string, std::string> bodies;
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string body(1000 + i * 37, '\0');
    std::mt19937 rng(static_cast<unsigned>(i));
    for (char& c : body) c = static_cast<char>(rng());
    bodies[keys[i]] = body;
    client.put(parse_s3_uri("s3://zf-test/" + keys[i]), body);
  }
  for (const auto& [key, body] : bodies) {
    const S3Uri u = parse_s3_uri("s3://zf-test/" + key);
    EXPECT_EQ(client.get(u), body) << key;
    const auto info = client.head(u);
    ASSERT_TRUE(info) << key;
    EXPECT_EQ(info->size, static_cast<int64_t>(body.size())) << key;
  }
  const auto listed = client.list(parse_s3_uri("s3://zf-test/run/"));
  std::vector<std::string> names;
  for (const auto& o : listed) names.push_back(o.key);
  std::vector<std::string> expected = keys;
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
  EXPECT_TRUE(client.list(parse_s3_uri("s3://zf-test/nothing-here/")).empty());
  client.remove(parse_s3_uri("s3://zf-test/" + keys[1]));
  client.remove(parse_s3_uri("s3://zf-test/" + keys[1]));  // again: not an error
  EXPECT_FALSE(client.head(parse_s3_uri("s3://zf-test/" + keys[1])));
  EXPECT_EQ(client.list(parse_s3_uri("s3://zf-test/run/")).size(), keys.size() - 1);
}

TEST_F(S3Moto, IfNoneMatchNeverReplacesAnExistingObject) {
  if (!moto_->conditional_writes()) GTEST_SKIP() << "s3rver ignores If-None-Match (it predates S3's conditional writes)";
  S3Client client(settings());
  const S3Uri manifest = parse_s3_uri("s3://zf-test/run/step-00000010/manifest.json");
  client.put(manifest, "first", /*if_none_match=*/true);
  try {
    client.put(manifest, "second", /*if_none_match=*/true);
    ADD_FAILURE() << "an existing manifest was replaced";
  } catch (const S3ObjectExists& e) {
    EXPECT_EQ(e.http_status, 412);
    EXPECT_NE(std::string(e.what()).find("PUT " + manifest.text() + ": HTTP 412"), std::string::npos) << e.what();
  }
  EXPECT_EQ(client.get(manifest), "first");
  // The same bytes again (a retried PUT whose first try landed) are not a conflict.
  EXPECT_NO_THROW(client.put(manifest, "first", /*if_none_match=*/true));
}

TEST_F(S3Moto, AWrongSecretIsRefusedNamingTheSignatureAndIsNotRetried) {
  if (moto_->is_s3rver()) GTEST_SKIP() << "s3rver does not check these requests' signatures against the secret";
  int waits = 0;
  S3Settings s = settings("not-the-secret");
  s.sleep = [&](double) { ++waits; };
  S3Client client(s);
  try {
    client.put(parse_s3_uri("s3://zf-test/x"), "x");
    ADD_FAILURE() << "a wrong secret was accepted";
  } catch (const S3Error& e) {
    EXPECT_EQ(e.http_status, 403);
    EXPECT_EQ(e.code, "SignatureDoesNotMatch");
    EXPECT_EQ(std::string(e.what()).rfind("PUT s3://zf-test/x: HTTP 403 SignatureDoesNotMatch", 0), 0u) << e.what();
  }
  EXPECT_EQ(waits, 0);
  EXPECT_FALSE(S3Client(settings()).head(parse_s3_uri("s3://zf-test/x")));
}

TEST_F(S3Moto, LargeFilesGoAsParallelMultipartUploadsAndComeBackWhole) {
  const fs::path src = dir_ / "big.bin";
  const int64_t size = 12 * (1 << 20) + 123;
  {
    std::string data(static_cast<size_t>(size), '\0');
    std::mt19937_64 rng(3);
    for (size_t i = 0; i + 8 <= data.size(); i += 8) {
      const uint64_t v = rng();
      std::memcpy(&data[i], &v, 8);
    }
    std::ofstream(src, std::ios::binary).write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  S3Client client(settings());
  UploadOptions o;
  o.part_bytes = 5 << 20;  // 3 parts
  o.parallel_parts = 3;
  std::atomic<int64_t> last{0};
  std::atomic<int> calls{0};
  o.progress = [&](int64_t done, int64_t total) {
    EXPECT_EQ(total, size);
    last = std::max<int64_t>(last, done);
    ++calls;
  };
  const S3Uri dst = parse_s3_uri("s3://zf-test/run/step-1/model.safetensors");
  client.put_file(src.string(), dst, o);
  EXPECT_EQ(last.load(), size);
  EXPECT_EQ(calls.load(), 3);
  const auto info = client.head(dst);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->size, size);
  if (!moto_->is_s3rver()) {  // s3rver's ETag of a multipart object is a plain MD5
    EXPECT_NE(info->etag.find("-3"), std::string::npos) << "not a 3-part upload: " << info->etag;
  }
  const fs::path back = dir_ / "back.bin";
  int64_t seen = 0;
  client.get_file(dst, back.string(), [&](int64_t done, int64_t) { seen = done; });
  EXPECT_EQ(seen, size);
  EXPECT_EQ(checksum_file(back.string()).crc32c, checksum_file(src.string()).crc32c);
  EXPECT_EQ(fs::file_size(back), static_cast<uintmax_t>(size));
}

}  // namespace
}  // namespace zenflow::storage
