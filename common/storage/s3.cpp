#include "common/storage/s3.h"

#include <curl/curl.h>
#include <expat.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/crc32c.h"

namespace zenflow::storage {
namespace {

// ---- Text -----------------------------------------------------------------------------------

// Percent-encoding as SigV4 wants it: unreserved characters as they are, every other byte
// as %XX (upper-case hex); '/' kept when `keep_slash` (object keys).
std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3);
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// A canonical query string: parameters sorted by name, each name=value, encoded.
std::string query_string(std::vector<std::pair<std::string, std::string>> params) {
  std::sort(params.begin(), params.end());
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += '&';
    out += uri_encode(k, false) + "=" + uri_encode(v, false);
  }
  return out;
}

std::string base64(const unsigned char* data, size_t n) {
  std::string out(4 * ((n + 2) / 3), '\0');
  const int len = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
  out.resize(static_cast<size_t>(len));
  return out;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// "2026-12-06T17:48:16Z" (or with fractional seconds) -> Unix seconds; 0 when unreadable.
int64_t parse_iso8601(const std::string& s) {
  std::tm tm{};
  if (sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
             &tm.tm_sec) != 6)
    return 0;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&tm));
}

// ---- XML ------------------------------------------------------------------------------------

// An element: its name (namespace dropped), text and children.
struct XmlNode {
  std::string name;
  std::string text;
  std::vector<XmlNode> children;
  const XmlNode* child(const std::string& n) const {
    for (const XmlNode& c : children)
      if (c.name == n) return &c;
    return nullptr;
  }
  std::string child_text(const std::string& n) const {
    const XmlNode* c = child(n);
    return c ? c->text : "";
  }
};

// Parses `xml` with expat; nullopt when it is not well-formed.
std::optional<XmlNode> parse_xml(const std::string& xml) {
  struct State {
    XmlNode root;
    std::vector<XmlNode*> stack;
  } st;
  XML_Parser p = XML_ParserCreate(nullptr);
  XML_SetUserData(p, &st);
  XML_SetElementHandler(
      p,
      [](void* ud, const XML_Char* name, const XML_Char**) {
        auto* s = static_cast<State*>(ud);
        std::string n = name;
        if (const size_t colon = n.rfind(':'); colon != std::string::npos) n = n.substr(colon + 1);
        if (s->stack.empty()) {
          s->root.name = n;
          s->stack.push_back(&s->root);
        } else {
          s->stack.back()->children.push_back(XmlNode{n, "", {}});
          s->stack.push_back(&s->stack.back()->children.back());
        }
      },
      [](void* ud, const XML_Char*) { static_cast<State*>(ud)->stack.pop_back(); });
  XML_SetCharacterDataHandler(p, [](void* ud, const XML_Char* s, int len) {
    auto* st = static_cast<State*>(ud);
    if (!st->stack.empty()) st->stack.back()->text.append(s, static_cast<size_t>(len));
  });
  const bool ok = XML_Parse(p, xml.data(), static_cast<int>(xml.size()), 1) == XML_STATUS_OK;
  XML_ParserFree(p);
  if (!ok || st.root.name.empty()) return std::nullopt;
  return std::move(st.root);
}

// ---- HTTP -----------------------------------------------------------------------------------

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct Request {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::string> headers;  // "lower-case-name: value" (signed as written)
  const char* body = nullptr;        // PUT/POST
  size_t body_len = 0;
  int64_t max_send_speed = 0;
  // Where a 2xx body goes; false from it aborts the transfer. Null: Response::body.
  std::function<bool(const char*, size_t)> sink;
  std::function<void()> reset_sink;  // before a retry starts over
  int64_t max_body = 1 << 20;        // Response::body beyond this aborts
  std::function<void(int64_t done, int64_t total)> upload_progress;
};

struct Response {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-case
  CURLcode curl = CURLE_OK;
  std::string curl_error;
};

struct Transfer {
  const Request* req;
  Response* resp;
  size_t sent = 0;
  bool too_large = false;
};

size_t on_read(char* buf, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const size_t k = std::min(size * n, t->req->body_len - t->sent);
  std::memcpy(buf, t->req->body + t->sent, k);
  t->sent += k;
  return k;
}

size_t on_write(char* data, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const size_t k = size * n;
  const bool ok_status = t->resp->status >= 200 && t->resp->status < 300;
  if (t->req->sink && ok_status) return t->req->sink(data, k) ? k : 0;
  if (static_cast<int64_t>(t->resp->body.size() + k) > t->req->max_body) {
    t->too_large = true;
    return 0;
  }
  t->resp->body.append(data, k);
  return k;
}

size_t on_header(char* data, size_t size, size_t n, void* ud) {
  auto* t = static_cast<Transfer*>(ud);
  const std::string line(data, size * n);
  if (line.rfind("HTTP/", 0) == 0) {
    t->resp->headers.clear();  // a 100 Continue's, then the real one
    const size_t sp = line.find(' ');
    if (sp != std::string::npos) t->resp->status = std::strtol(line.c_str() + sp + 1, nullptr, 10);
  } else if (const size_t colon = line.find(':'); colon != std::string::npos) {
    t->resp->headers[lower(trim(line.substr(0, colon)))] = trim(line.substr(colon + 1));
  }
  return size * n;
}

int on_progress(void* ud, curl_off_t, curl_off_t, curl_off_t ultotal, curl_off_t ulnow) {
  auto* t = static_cast<Transfer*>(ud);
  if (t->req->upload_progress && ultotal > 0) t->req->upload_progress(ulnow, ultotal);
  return 0;
}

struct Signer {
  std::string region;
  std::string service;
  AwsCredentials credentials;  // empty access key: unsigned
};

Response perform_once(const Request& req, const Signer* signer, double connect_timeout_s, double stall_timeout_s) {
  curl_init_once();
  Response resp;
  CURL* h = curl_easy_init();
  if (!h) {
    resp.curl = CURLE_FAILED_INIT;
    resp.curl_error = "curl_easy_init failed";
    return resp;
  }
  Transfer t{&req, &resp};
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_slist* headers = nullptr;
  for (const std::string& hd : req.headers) headers = curl_slist_append(headers, hd.c_str());
  std::string sigv4;
  if (signer && !signer->credentials.access_key_id.empty()) {
    if (!signer->credentials.session_token.empty())
      headers = curl_slist_append(headers, ("x-amz-security-token: " + signer->credentials.session_token).c_str());
    sigv4 = "aws:amz:" + signer->region + ":" + signer->service;
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, signer->credentials.access_key_id.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, signer->credentials.secret_access_key.c_str());
  }
  curl_easy_setopt(h, CURLOPT_URL, req.url.c_str());
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);  // a key's "./" and "../" are part of it
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(connect_timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, static_cast<long>(stall_timeout_s)));
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (req.upload_progress) {
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &t);
  }
  if (req.max_send_speed > 0) curl_easy_setopt(h, CURLOPT_MAX_SEND_SPEED_LARGE, static_cast<curl_off_t>(req.max_send_speed));
  if (req.method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (req.method == "PUT") {
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
    curl_easy_setopt(h, CURLOPT_READDATA, &t);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(req.body_len));
  } else if (req.method == "POST") {
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, req.body ? req.body : "");
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body_len));
  } else if (req.method != "GET") {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, req.method.c_str());
  }
  resp.curl = curl_easy_perform(h);
  if (resp.curl != CURLE_OK) {
    resp.curl_error = errbuf[0] ? errbuf : curl_easy_strerror(resp.curl);
    if (t.too_large) resp.curl_error = "the response is larger than " + std::to_string(req.max_body) + " bytes";
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (status) resp.status = status;
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return resp;
}

// S3's <Error><Code>…</Code><Message>…</Message></Error>, if the body is one.
std::pair<std::string, std::string> s3_error_of(const std::string& body) {
  if (auto x = parse_xml(body); x && x->name == "Error") return {x->child_text("Code"), x->child_text("Message")};
  return {"", ""};
}

bool retryable(const Response& r, const std::string& code) {
  if (r.curl != CURLE_OK) {  // before or during the answer (a body cut short after its 200)
    switch (r.curl) {
      case CURLE_COULDNT_CONNECT:
      case CURLE_COULDNT_RESOLVE_HOST:
      case CURLE_OPERATION_TIMEDOUT:
      case CURLE_SEND_ERROR:
      case CURLE_RECV_ERROR:
      case CURLE_PARTIAL_FILE:
      case CURLE_GOT_NOTHING:
      case CURLE_SSL_CONNECT_ERROR:
      case CURLE_HTTP2:
      case CURLE_HTTP2_STREAM:
        return true;
      default:
        return false;
    }
  }
  if (r.status == 500 || r.status == 502 || r.status == 503 || r.status == 504 || r.status == 429) return true;
  return code == "SlowDown" || code == "RequestTimeout" || code == "InternalError";
}

// ---- Credentials ----------------------------------------------------------------------------

class StaticSource : public CredentialSource {
 public:
  explicit StaticSource(AwsCredentials c) : c_(std::move(c)) {}
  AwsCredentials current() override { return c_; }

 private:
  AwsCredentials c_;
};

// Temporary credentials fetched by `fetch`, again 5 minutes before they expire.
class RefreshingSource : public CredentialSource {
 public:
  explicit RefreshingSource(std::function<AwsCredentials()> fetch) : fetch_(std::move(fetch)) {}
  AwsCredentials current() override {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t now = static_cast<int64_t>(std::time(nullptr));
    if (!have_ || (c_.expires_unix > 0 && c_.expires_unix - now < 300)) {
      c_ = fetch_();
      have_ = true;
    }
    return c_;
  }

 private:
  std::function<AwsCredentials()> fetch_;
  std::mutex mu_;
  AwsCredentials c_;
  bool have_ = false;
};

using IniFile = std::map<std::string, std::map<std::string, std::string>>;  // section -> key -> value

// An AWS credentials or config file; nullopt when it does not exist.
std::optional<IniFile> read_ini(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  IniFile ini;
  std::string line, section;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      section = trim(line.substr(1, line.size() - 2));
      ini[section];
      continue;
    }
    const size_t eq = line.find('=');
    if (eq == std::string::npos || section.empty()) continue;
    ini[section][lower(trim(line.substr(0, eq)))] = trim(line.substr(eq + 1));
  }
  return ini;
}

const std::map<std::string, std::string>* profile_section(const std::optional<IniFile>& ini, const std::string& name,
                                                          bool config_file) {
  if (!ini) return nullptr;
  // ~/.aws/config names profiles "[profile NAME]" (and "[default]"); ~/.aws/credentials "[NAME]".
  const std::string section = config_file && name != "default" ? "profile " + name : name;
  auto it = ini->find(section);
  return it == ini->end() ? nullptr : &it->second;
}

std::string env_or(const EnvLookup& env, const std::string& name, const std::string& fallback = "") {
  auto v = env(name);
  return v && !v->empty() ? *v : fallback;
}

std::string read_small_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(what + ": cannot read " + path + ": " + std::strerror(errno));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (s.size() > (1 << 20)) throw std::runtime_error(what + ": " + path + " is larger than 1 MiB");
  return trim(s);
}

AwsCredentials assume_role_with_web_identity(const std::string& sts_endpoint, const std::string& role_arn,
                                             const std::string& token_file, const std::string& session_name) {
  const std::string token = read_small_file(token_file, "AWS_WEB_IDENTITY_TOKEN_FILE");
  Request req;
  req.method = "POST";
  const std::string body = query_string({{"Action", "AssumeRoleWithWebIdentity"},
                                         {"RoleArn", role_arn},
                                         {"RoleSessionName", session_name},
                                         {"Version", "2011-06-15"},
                                         {"WebIdentityToken", token}});
  req.url = sts_endpoint + "/";
  req.headers = {"content-type: application/x-www-form-urlencoded"};
  req.body = body.data();
  req.body_len = body.size();
  const Response r = perform_once(req, nullptr, 10, 60);
  const std::string where = "AssumeRoleWithWebIdentity for " + role_arn + " at " + sts_endpoint;
  if (r.curl != CURLE_OK && r.status == 0) throw std::runtime_error(where + ": " + r.curl_error);
  const auto x = parse_xml(r.body);
  if (r.status != 200 || !x) {
    std::string message;
    if (x)
      if (const XmlNode* e = x->child("Error")) message = e->child_text("Code") + ": " + e->child_text("Message");
    throw std::runtime_error(where + ": HTTP " + std::to_string(r.status) + (message.empty() ? "" : " " + message));
  }
  const XmlNode* result = x->child("AssumeRoleWithWebIdentityResult");
  const XmlNode* c = result ? result->child("Credentials") : nullptr;
  if (!c) throw std::runtime_error(where + ": the answer holds no Credentials");
  AwsCredentials out;
  out.access_key_id = c->child_text("AccessKeyId");
  out.secret_access_key = c->child_text("SecretAccessKey");
  out.session_token = c->child_text("SessionToken");
  out.expires_unix = parse_iso8601(c->child_text("Expiration"));
  out.source = "web identity (" + role_arn + ")";
  return out;
}

AwsCredentials container_credentials(const std::string& url, const EnvLookup& env) {
  Request req;
  req.url = url;
  std::string auth = env_or(env, "AWS_CONTAINER_AUTHORIZATION_TOKEN");
  if (auto f = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"); f && !f->empty())
    auth = read_small_file(*f, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  if (!auth.empty()) req.headers.push_back("authorization: " + auth);
  const Response r = perform_once(req, nullptr, 5, 30);
  const std::string where = "the container credentials endpoint " + url;
  if (r.curl != CURLE_OK && r.status == 0) throw std::runtime_error(where + ": " + r.curl_error);
  if (r.status != 200) throw std::runtime_error(where + ": HTTP " + std::to_string(r.status));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(r.body);
  } catch (const std::exception&) {
    throw std::runtime_error(where + ": the answer is not JSON");
  }
  AwsCredentials out;
  out.access_key_id = j.value("AccessKeyId", "");
  out.secret_access_key = j.value("SecretAccessKey", "");
  out.session_token = j.value("Token", "");
  out.expires_unix = parse_iso8601(j.value("Expiration", ""));
  if (out.access_key_id.empty() || out.secret_access_key.empty())
    throw std::runtime_error(where + ": the answer holds no AccessKeyId and SecretAccessKey");
  out.source = "container credentials endpoint";
  return out;
}

void check_endpoint(const std::string& url, const std::string& var) {
  if (url.rfind("http://", 0) != 0 && url.rfind("https://", 0) != 0)
    throw std::runtime_error(var + " must start with http:// or https://, got '" + url + "'");
  if (url.find('?') != std::string::npos || url.find('#') != std::string::npos)
    throw std::runtime_error(var + " must be a scheme, host and port only, got '" + url + "'");
}

}  // namespace

std::string crc32c_base64(uint32_t crc) {
  const unsigned char be[4] = {static_cast<unsigned char>(crc >> 24), static_cast<unsigned char>(crc >> 16),
                               static_cast<unsigned char>(crc >> 8), static_cast<unsigned char>(crc)};
  return base64(be, 4);
}

// ---- Settings ---------------------------------------------------------------------------------

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

std::shared_ptr<CredentialSource> static_credentials(AwsCredentials c) {
  return std::make_shared<StaticSource>(std::move(c));
}

S3Settings s3_settings_from_environment(const EnvLookup& env) {
  S3Settings s;
  const std::string home = env_or(env, "HOME", "/root");
  const std::string profile_env = env_or(env, "AWS_PROFILE");
  const std::string profile = profile_env.empty() ? env_or(env, "AWS_DEFAULT_PROFILE", "default") : profile_env;
  const std::string cred_path = env_or(env, "AWS_SHARED_CREDENTIALS_FILE", home + "/.aws/credentials");
  const std::string config_path = env_or(env, "AWS_CONFIG_FILE", home + "/.aws/config");
  const auto cred_file = read_ini(cred_path);
  const auto config_file = read_ini(config_path);
  const auto* cred_section = profile_section(cred_file, profile, false);
  const auto* config_section = profile_section(config_file, profile, true);
  if (!profile_env.empty() && !cred_section && !config_section)
    throw std::runtime_error("AWS_PROFILE=" + profile + ": no such profile in " + cred_path + " or " + config_path);
  auto from_profile = [&](const std::string& key) -> std::string {
    for (const auto* sec : {cred_section, config_section})
      if (sec)
        if (auto it = sec->find(key); it != sec->end() && !it->second.empty()) return it->second;
    return "";
  };

  s.region = env_or(env, "AWS_REGION", env_or(env, "AWS_DEFAULT_REGION", from_profile("region")));
  if (s.region.empty()) s.region = "us-east-1";
  // Attempts per request, as the AWS CLI reads them (a spot fleet's flaky endpoint, a MinIO
  // restarting under a rolling upgrade: more; a test that must fail fast: 1).
  const std::string attempts = env_or(env, "AWS_MAX_ATTEMPTS", from_profile("max_attempts"));
  if (!attempts.empty()) {
    char* end = nullptr;
    const long n = std::strtol(attempts.c_str(), &end, 10);
    if (end == attempts.c_str() || *end != '\0' || n < 1 || n > 100)
      throw std::runtime_error("AWS_MAX_ATTEMPTS (or the profile's max_attempts) is '" + attempts +
                               "': an integer from 1 to 100 was expected");
    s.max_attempts = static_cast<int>(n);
  }
  std::string endpoint = env_or(env, "AWS_ENDPOINT_URL_S3");
  std::string endpoint_var = "AWS_ENDPOINT_URL_S3";
  if (endpoint.empty()) endpoint = env_or(env, "AWS_ENDPOINT_URL"), endpoint_var = "AWS_ENDPOINT_URL";
  if (!endpoint.empty()) {
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    check_endpoint(endpoint, endpoint_var);
    s.endpoint = endpoint;
    s.path_style = true;
  } else {
    s.endpoint = "https://s3." + s.region + ".amazonaws.com";
  }

  const std::string key_id = env_or(env, "AWS_ACCESS_KEY_ID"), secret = env_or(env, "AWS_SECRET_ACCESS_KEY");
  if (!key_id.empty() || !secret.empty()) {
    if (key_id.empty()) throw std::runtime_error("AWS_SECRET_ACCESS_KEY is set but AWS_ACCESS_KEY_ID is not");
    if (secret.empty()) throw std::runtime_error("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
    s.credentials = static_credentials({key_id, secret, env_or(env, "AWS_SESSION_TOKEN"), 0, "environment"});
    return s;
  }
  const std::string role = env_or(env, "AWS_ROLE_ARN"), token_file = env_or(env, "AWS_WEB_IDENTITY_TOKEN_FILE");
  if (!role.empty() || !token_file.empty()) {
    if (role.empty()) throw std::runtime_error("AWS_WEB_IDENTITY_TOKEN_FILE is set but AWS_ROLE_ARN is not");
    if (token_file.empty()) throw std::runtime_error("AWS_ROLE_ARN is set but AWS_WEB_IDENTITY_TOKEN_FILE is not");
    std::string sts = env_or(env, "AWS_ENDPOINT_URL_STS", env_or(env, "AWS_ENDPOINT_URL"));
    while (!sts.empty() && sts.back() == '/') sts.pop_back();
    if (sts.empty()) sts = "https://sts." + s.region + ".amazonaws.com";
    check_endpoint(sts, "AWS_ENDPOINT_URL_STS");
    const std::string session = env_or(env, "AWS_ROLE_SESSION_NAME", "zenflow-" + std::to_string(::getpid()));
    s.credentials = std::make_shared<RefreshingSource>(
        [sts, role, token_file, session] { return assume_role_with_web_identity(sts, role, token_file, session); });
    return s;
  }
  if (const std::string id = from_profile("aws_access_key_id"); !id.empty()) {
    const std::string sk = from_profile("aws_secret_access_key");
    if (sk.empty())
      throw std::runtime_error("profile " + profile + " (" + cred_path + "): aws_access_key_id without aws_secret_access_key");
    s.credentials = static_credentials({id, sk, from_profile("aws_session_token"), 0,
                                        "profile " + profile + " (" + (cred_section ? cred_path : config_path) + ")"});
    return s;
  }
  std::string container = env_or(env, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
  if (container.empty())
    if (const std::string rel = env_or(env, "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"); !rel.empty())
      container = "http://169.254.170.2" + rel;
  if (!container.empty()) {
    check_endpoint(container, "AWS_CONTAINER_CREDENTIALS_FULL_URI");
    s.credentials =
        std::make_shared<RefreshingSource>([container, env] { return container_credentials(container, env); });
  }
  return s;  // no credentials: unsigned requests (public buckets)
}

// ---- The client -------------------------------------------------------------------------------

struct S3Client::Impl {
  S3Settings s;
  std::mutex rng_mu;
  std::mt19937_64 rng;

  std::string url(const S3Uri& u, const std::string& query = "") const {
    std::string base;
    if (s.path_style) {
      base = s.endpoint + "/" + u.bucket + (u.key.empty() ? "" : "/" + uri_encode(u.key, true));
    } else {
      const size_t scheme = s.endpoint.find("://") + 3;
      base = s.endpoint.substr(0, scheme) + u.bucket + "." + s.endpoint.substr(scheme) + "/" + uri_encode(u.key, true);
    }
    return query.empty() ? base : base + "?" + query;
  }

  double delay(int attempt) {
    const double d = std::min(s.max_delay_s, s.base_delay_s * static_cast<double>(1LL << std::min(attempt, 30)));
    std::lock_guard<std::mutex> lock(rng_mu);
    return d / 2 + std::uniform_real_distribution<double>(0, d / 2)(rng);
  }

  // One request with retries; throws S3Error naming `op` and `uri` for anything but 2xx
  // (and 404 when `allow_404`, returned as is).
  Response perform(Request req, const std::string& op, const S3Uri& uri, bool allow_404 = false) {
    req.headers.push_back("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    for (int attempt = 0;; ++attempt) {
      Signer signer{s.region, "s3", {}};
      if (s.credentials) signer.credentials = s.credentials->current();
      if (attempt > 0 && req.reset_sink) req.reset_sink();
      Response r = perform_once(req, &signer, s.connect_timeout_s, s.stall_timeout_s);
      if (r.status >= 200 && r.status < 300 && r.curl == CURLE_OK) return r;
      if (allow_404 && r.status == 404) return r;
      auto [code, message] = s3_error_of(r.body);
      if (r.status == 0 || r.curl != CURLE_OK) code = code.empty() ? curl_easy_strerror(r.curl) : code;
      if (attempt + 1 < s.max_attempts && retryable(r, code)) {
        s.sleep(delay(attempt));
        continue;
      }
      std::string what = op + " " + uri.text() + ": ";
      if (r.status == 0) {
        what += r.curl_error + " (" + req.url.substr(0, req.url.find('?')) + ")";
      } else if (r.status >= 200 && r.status < 300) {
        what += "HTTP " + std::to_string(r.status) + ", then " + r.curl_error;
      } else {
        what += "HTTP " + std::to_string(r.status);
        if (!code.empty()) what += " " + code;
        if (!message.empty()) what += ": " + message.substr(0, 300);
        if (r.status == 403 && !s.credentials) what += " (no AWS credentials were found)";
      }
      if (attempt > 0) what += " (after " + std::to_string(attempt + 1) + " attempts)";
      if (r.status == 412) throw S3ObjectExists(what + " (an object exists under that key)", 412, code);
      throw S3Error(what, static_cast<int>(r.status), code);
    }
  }
};

S3Client::S3Client(S3Settings settings) : impl_(new Impl) {
  impl_->s = std::move(settings);
  if (!impl_->s.sleep)
    impl_->s.sleep = [](double sec) { std::this_thread::sleep_for(std::chrono::duration<double>(sec)); };
  impl_->rng.seed(impl_->s.jitter_seed ? impl_->s.jitter_seed : std::random_device{}());
  check_endpoint(impl_->s.endpoint, "the S3 endpoint");
}

S3Client::~S3Client() = default;

const S3Settings& S3Client::settings() const { return impl_->s; }

void S3Client::put(const S3Uri& dst, const std::string& bytes, bool if_none_match, int64_t max_bytes_per_second) {
  Request req;
  if (max_bytes_per_second > 0) req.max_send_speed = max_bytes_per_second;
  req.method = "PUT";
  req.url = impl_->url(dst);
  req.body = bytes.data();
  req.body_len = bytes.size();
  req.headers.push_back("x-amz-checksum-crc32c: " + crc32c_base64(crc32c(bytes.data(), bytes.size())));
  if (if_none_match) req.headers.push_back("if-none-match: *");
  try {
    impl_->perform(req, "PUT", dst);
  } catch (const S3ObjectExists&) {
    // A retried write may have landed the first time: then the object is ours.
    if (auto info = head(dst);
        info && info->size == static_cast<int64_t>(bytes.size()) && get(dst, info->size + 1) == bytes)
      return;
    throw;
  }
}

void S3Client::put_file(const std::string& path, const S3Uri& dst, const UploadOptions& options) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw S3Error("PUT " + dst.text() + ": cannot open " + path + ": " + std::strerror(errno), 0, "");
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  ::fstat(fd, &st);
  const int64_t size = st.st_size;
  auto read_range = [&](int64_t offset, int64_t n, std::string& buf) {
    buf.resize(static_cast<size_t>(n));
    int64_t got = 0;
    while (got < n) {
      const ssize_t k = ::pread(fd, buf.data() + got, static_cast<size_t>(n - got), offset + got);
      if (k <= 0) throw S3Error("PUT " + dst.text() + ": reading " + path + ": " + (k == 0 ? "it shrank" : std::strerror(errno)), 0, "");
      got += k;
    }
  };
  int64_t part = std::max<int64_t>(options.part_bytes, 5 << 20);
  while ((size + part - 1) / part > 10000) part *= 2;
  if (size < part) {
    std::string buf;
    read_range(0, size, buf);
    put(dst, buf, options.if_none_match, options.max_bytes_per_second);
    if (options.progress) options.progress(size, size);
    return;
  }
  // Multipart: create, the parts in parallel, complete (or abort).
  Request create;
  create.method = "POST";
  create.url = impl_->url(dst, query_string({{"uploads", ""}}));
  create.headers.push_back("x-amz-checksum-algorithm: CRC32C");
  const Response cr = impl_->perform(create, "CreateMultipartUpload", dst);
  const auto cx = parse_xml(cr.body);
  const std::string upload_id = cx ? cx->child_text("UploadId") : "";
  if (upload_id.empty()) throw S3Error("CreateMultipartUpload " + dst.text() + ": the answer holds no UploadId", 200, "");
  const int64_t parts = (size + part - 1) / part;
  std::vector<std::string> etags(static_cast<size_t>(parts)), crcs(static_cast<size_t>(parts));
  std::atomic<int64_t> next{0}, done_bytes{0};
  std::mutex err_mu;
  std::exception_ptr error;
  const int threads = static_cast<int>(std::min<int64_t>(std::max(1, options.parallel_parts), parts));
  auto worker = [&] {
    std::string buf;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(err_mu);
        if (error) return;
      }
      const int64_t i = next++;
      if (i >= parts) return;
      try {
        const int64_t off = i * part, n = std::min(part, size - off);
        read_range(off, n, buf);
        const std::string crc = crc32c_base64(crc32c(buf.data(), buf.size()));
        Request req;
        req.method = "PUT";
        req.url = impl_->url(dst, query_string({{"partNumber", std::to_string(i + 1)}, {"uploadId", upload_id}}));
        req.body = buf.data();
        req.body_len = buf.size();
        req.headers.push_back("x-amz-checksum-crc32c: " + crc);
        if (options.max_bytes_per_second > 0) req.max_send_speed = std::max<int64_t>(1, options.max_bytes_per_second / threads);
        const Response r = impl_->perform(req, "UploadPart " + std::to_string(i + 1) + " of", dst);
        auto it = r.headers.find("etag");
        if (it == r.headers.end()) throw S3Error("UploadPart " + std::to_string(i + 1) + " of " + dst.text() + ": no ETag in the answer", 200, "");
        etags[static_cast<size_t>(i)] = it->second;
        crcs[static_cast<size_t>(i)] = crc;
        const int64_t d = done_bytes += n;
        if (options.progress) options.progress(d, size);
      } catch (...) {
        std::lock_guard<std::mutex> lock(err_mu);
        if (!error) error = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  auto abort_upload = [&] {
    Request ab;
    ab.method = "DELETE";
    ab.url = impl_->url(dst, query_string({{"uploadId", upload_id}}));
    try {
      impl_->perform(ab, "AbortMultipartUpload", dst, /*allow_404=*/true);
    } catch (const std::exception&) {
      // The bucket's lifecycle rule for incomplete uploads collects what is left.
    }
  };
  if (error) {
    abort_upload();
    std::rethrow_exception(error);
  }
  std::string xml = "<CompleteMultipartUpload xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
  for (int64_t i = 0; i < parts; ++i)
    xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[static_cast<size_t>(i)] +
           "</ETag><ChecksumCRC32C>" + crcs[static_cast<size_t>(i)] + "</ChecksumCRC32C></Part>";
  xml += "</CompleteMultipartUpload>";
  Request complete;
  complete.method = "POST";
  complete.url = impl_->url(dst, query_string({{"uploadId", upload_id}}));
  complete.headers.push_back("content-type: application/xml");
  if (options.if_none_match) complete.headers.push_back("if-none-match: *");
  complete.body = xml.data();
  complete.body_len = xml.size();
  try {
    const Response r = impl_->perform(complete, "CompleteMultipartUpload", dst);
    // S3 may answer 200 and still fail: the error is in the body.
    if (auto [code, message] = s3_error_of(r.body); !code.empty())
      throw S3Error("CompleteMultipartUpload " + dst.text() + ": " + code + ": " + message.substr(0, 300), 200, code);
  } catch (...) {
    abort_upload();
    throw;
  }
}

std::string S3Client::get(const S3Uri& src, int64_t max_bytes) {
  Request req;
  req.url = impl_->url(src);
  req.max_body = max_bytes;
  std::string out;
  bool too_large = false;
  req.sink = [&](const char* d, size_t n) {
    if (static_cast<int64_t>(out.size() + n) > max_bytes) {
      too_large = true;
      return false;
    }
    out.append(d, n);
    return true;
  };
  req.reset_sink = [&] { out.clear(); };
  try {
    impl_->perform(req, "GET", src);
  } catch (const S3Error& e) {
    if (too_large)
      throw S3Error("GET " + src.text() + ": larger than " + std::to_string(max_bytes) + " bytes", 200, "TooLarge");
    throw;
  }
  return out;
}

ObjectInfo S3Client::get_file(const S3Uri& src, const std::string& path,
                              const std::function<void(int64_t, int64_t)>& progress) {
  const std::string part = path + ".part";
  FILE* f = std::fopen(part.c_str(), "wb");
  if (!f) throw S3Error("GET " + src.text() + ": cannot write " + part + ": " + std::strerror(errno), 0, "");
  int64_t written = 0, total = 0;
  bool write_failed = false;
  Request req;
  req.url = impl_->url(src);
  req.sink = [&](const char* d, size_t n) {
    if (std::fwrite(d, 1, n, f) != n) {
      write_failed = true;
      return false;
    }
    written += static_cast<int64_t>(n);
    if (progress) progress(written, total);
    return true;
  };
  req.reset_sink = [&] {
    std::fflush(f);
    if (::ftruncate(::fileno(f), 0) == 0) std::rewind(f);
    written = 0;
  };
  Response r;
  try {
    r = impl_->perform(req, "GET", src);
  } catch (...) {
    std::fclose(f);
    std::remove(part.c_str());
    if (write_failed) throw S3Error("GET " + src.text() + ": writing " + part + ": " + std::strerror(errno), 0, "");
    throw;
  }
  const bool closed = std::fclose(f) == 0;
  ObjectInfo info{src.key, written, ""};
  if (auto it = r.headers.find("etag"); it != r.headers.end()) info.etag = it->second;
  info.etag.erase(std::remove(info.etag.begin(), info.etag.end(), '"'), info.etag.end());
  if (auto it = r.headers.find("content-length"); it != r.headers.end() && std::stoll(it->second) != written) {
    std::remove(part.c_str());
    throw S3Error("GET " + src.text() + ": " + std::to_string(written) + " bytes arrived of " + it->second, 200, "Truncated");
  }
  if (!closed || std::rename(part.c_str(), path.c_str()) != 0) {
    std::remove(part.c_str());
    throw S3Error("GET " + src.text() + ": cannot write " + path + ": " + std::strerror(errno), 0, "");
  }
  return info;
}

std::optional<ObjectInfo> S3Client::head(const S3Uri& src) {
  Request req;
  req.method = "HEAD";
  req.url = impl_->url(src);
  const Response r = impl_->perform(req, "HEAD", src, /*allow_404=*/true);
  if (r.status == 404) return std::nullopt;
  ObjectInfo info{src.key, 0, ""};
  if (auto it = r.headers.find("content-length"); it != r.headers.end()) info.size = std::stoll(it->second);
  if (auto it = r.headers.find("etag"); it != r.headers.end()) info.etag = it->second;
  info.etag.erase(std::remove(info.etag.begin(), info.etag.end(), '"'), info.etag.end());
  return info;
}

std::vector<ObjectInfo> S3Client::list(const S3Uri& prefix) {
  std::vector<ObjectInfo> out;
  std::string token;
  const S3Uri bucket{prefix.bucket, ""};
  for (int page = 0; page < 1000000; ++page) {
    std::vector<std::pair<std::string, std::string>> q = {{"list-type", "2"}, {"prefix", prefix.key}};
    if (!token.empty()) q.emplace_back("continuation-token", token);
    Request req;
    req.url = impl_->url(bucket, query_string(q));
    req.max_body = 64 << 20;
    const Response r = impl_->perform(req, "LIST", prefix);
    const auto x = parse_xml(r.body);
    if (!x || x->name != "ListBucketResult") throw S3Error("LIST " + prefix.text() + ": the answer is not a ListBucketResult", 200, "");
    for (const XmlNode& c : x->children) {
      if (c.name != "Contents") continue;
      ObjectInfo info{c.child_text("Key"), 0, c.child_text("ETag")};
      try {
        info.size = std::stoll(c.child_text("Size"));
      } catch (const std::exception&) {
        throw S3Error("LIST " + prefix.text() + ": the size of " + info.key + " is not a number", 200, "");
      }
      info.etag.erase(std::remove(info.etag.begin(), info.etag.end(), '"'), info.etag.end());
      out.push_back(std::move(info));
    }
    if (x->child_text("IsTruncated") != "true") break;
    token = x->child_text("NextContinuationToken");
    if (token.empty()) throw S3Error("LIST " + prefix.text() + ": a truncated page without a continuation token", 200, "");
  }
  std::sort(out.begin(), out.end(), [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

void S3Client::remove(const S3Uri& uri) {
  Request req;
  req.method = "DELETE";
  req.url = impl_->url(uri);
  impl_->perform(req, "DELETE", uri, /*allow_404=*/true);
}

}  // namespace zenflow::storage
