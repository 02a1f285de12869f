// A real S3 API server for tests on 127.0.0.1 at a free port, killed (its process group)
// when destroyed: moto_server (Python's moto) where it is installed, with request signing
// checked (INITIAL_NO_AUTH_ACTION_COUNT: the first three requests, this file's IAM set-up,
// go unchecked; every later one must carry a valid SigV4 signature of the access key made
// here); else s3rver (npm; scripts/install-deps.sh --test-tools installs it), which checks
// signatures of its one key S3RVER. ZENFLOW_S3_TEST_SERVER=moto|s3rver picks one.
#pragma once

#include <arpa/inet.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>

#include "tests/support/process.h"

namespace zenflow::test_support {

// An executable's path on PATH, or "".
inline std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const std::string p = dir + "/" + name;
    if (::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// The S3 server to test against (moto_server, else s3rver; ZENFLOW_S3_TEST_SERVER picks),
// or "" when neither is installed.
inline std::string find_s3_server() {
  const char* pick = std::getenv("ZENFLOW_S3_TEST_SERVER");
  if (pick && *pick) return find_on_path(std::string(pick) == "moto" ? "moto_server" : pick);
  const std::string moto = find_on_path("moto_server");
  return moto.empty() ? find_on_path("s3rver") : moto;
}

// Why a test skips when find_s3_server() found none.
inline constexpr const char* kNoS3Server =
    "no S3 server to test against: neither moto_server (pip install 'moto[server]') nor s3rver "
    "(scripts/install-deps.sh --test-tools) is on PATH";

inline int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct CurlReply {
  long status = 0;
  std::string body;
};

// One request with curl, signed with SigV4 for `service` (any key works for moto's first
// unchecked requests: the scope names the service it routes to).
inline CurlReply curl_request(const std::string& method, const std::string& url, const std::string& body,
                              const std::string& service, const std::string& key, const std::string& secret) {
  CurlReply r;
  CURL* h = curl_easy_init();
  curl_slist* headers = curl_slist_append(nullptr, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
  const std::string sigv4 = "aws:amz:us-east-1:" + service;
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
  curl_easy_setopt(h, CURLOPT_USERNAME, key.c_str());
  curl_easy_setopt(h, CURLOPT_PASSWORD, secret.c_str());
  if (!body.empty()) {
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  }
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, +[](char* d, size_t s, size_t n, void* ud) {
    static_cast<std::string*>(ud)->append(d, s * n);
    return s * n;
  });
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r.body);
  curl_easy_setopt(h, CURLOPT_TIMEOUT, 30L);
  if (curl_easy_perform(h) == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return r;
}

inline std::string xml_text(const std::string& xml, const std::string& tag) {
  const size_t b = xml.find("<" + tag + ">");
  const size_t e = xml.find("</" + tag + ">");
  if (b == std::string::npos || e == std::string::npos) return "";
  return xml.substr(b + tag.size() + 2, e - b - tag.size() - 2);
}

class MotoServer {
 public:
  // Starts moto_server and, with `check_signatures`, makes an IAM user with an access key
  // allowed everything (without: any key is accepted, unchecked). Throws std::runtime_error
  // with moto's output when it does not come up.
  MotoServer(const std::string& moto_server, const fs::path& log, bool check_signatures = true) {
    port_ = free_tcp_port();
    if (fs::path(moto_server).filename() == "s3rver") {
      // s3rver: objects in a directory beside the log; its one key; signatures checked
      // unless asked not to (then any well-formed signature passes).
      s3rver_ = true;
      key_id_ = secret_ = "S3RVER";
      const fs::path data = log.string() + ".data";
      fs::create_directories(data);
      std::vector<std::string> argv = {moto_server, "-d", data.string(), "-a", "127.0.0.1", "-p", std::to_string(port_),
                                       "--silent", "--no-vhost-buckets"};
      if (!check_signatures) argv.push_back("--allow-mismatched-signatures");
      process_ = std::make_unique<Process>(argv, log);
      if (!wait_until([&] { return curl_request("GET", url() + "/", "", "s3", key_id_, secret_).status == 200; },
                      std::chrono::seconds(60)))
        throw std::runtime_error("s3rver did not answer within 60 s: " + process_->output());
      return;
    }
    std::vector<std::string> argv = {"/usr/bin/env"};
    if (check_signatures) argv.push_back("INITIAL_NO_AUTH_ACTION_COUNT=3");
    for (const std::string& a : {moto_server, std::string("-H"), std::string("127.0.0.1"), std::string("-p"),
                                 std::to_string(port_)})
      argv.push_back(a);
    process_ = std::make_unique<Process>(argv, log);
    const bool up = wait_until(
        [&] { return curl_request("GET", url() + "/moto-api/data.json", "", "s3", "x", "x").status == 200; },
        std::chrono::seconds(60));
    if (!up) throw std::runtime_error("moto_server did not answer within 60 s: " + process_->output());
    if (!check_signatures) {
      key_id_ = "AKIAUNCHECKED0000000", secret_ = "unchecked";
      return;
    }
    iam("Action=CreateUser&UserName=zenflow&Version=2010-05-08");
    iam("Action=PutUserPolicy&UserName=zenflow&PolicyName=all&Version=2010-05-08&PolicyDocument="
        "%7B%22Version%22%3A%222012-10-17%22%2C%22Statement%22%3A%5B%7B%22Effect%22%3A%22Allow%22%2C%22Action%22%"
        "3A%22*%22%2C%22Resource%22%3A%22*%22%7D%5D%7D");
    const std::string key = iam("Action=CreateAccessKey&UserName=zenflow&Version=2010-05-08");
    key_id_ = xml_text(key, "AccessKeyId");
    secret_ = xml_text(key, "SecretAccessKey");
    if (key_id_.empty() || secret_.empty()) throw std::runtime_error("moto made no access key: " + key);
  }

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // s3rver (2021) predates S3's conditional writes: it ignores If-None-Match.
  bool conditional_writes() const { return !s3rver_; }
  bool is_s3rver() const { return s3rver_; }
  const std::string& key_id() const { return key_id_; }
  const std::string& secret() const { return secret_; }
  Process& process() { return *process_; }

  // Creates a bucket (signed with the key made above).
  void create_bucket(const std::string& bucket) {
    const CurlReply r = curl_request("PUT", url() + "/" + bucket, "", "s3", key_id_, secret_);
    if (r.status != 200) throw std::runtime_error("create bucket " + bucket + ": HTTP " + std::to_string(r.status) + " " + r.body);
  }

 private:
  std::string iam(const std::string& form) {
    const CurlReply r = curl_request("POST", url() + "/", form, "iam", "AKIAUNCHECKED0000000", "unchecked");
    if (r.status != 200) throw std::runtime_error("moto IAM " + form.substr(0, 40) + ": HTTP " + std::to_string(r.status) + " " + r.body);
    return r.body;
  }

  int port_ = 0;
  bool s3rver_ = false;
  std::unique_ptr<Process> process_;
  std::string key_id_, secret_;
};

}  // namespace zenflow::test_support
