// Objects in S3 and S3-compatible stores (MinIO, Ceph RGW, GCS's interoperability API).
//
// Requests go through Debian's libcurl, whose CURLOPT_AWS_SIGV4 signs them (SigV4). The
// payload is not part of the signature ("UNSIGNED-PAYLOAD"); instead every body carries
// its CRC32C as x-amz-checksum-crc32c, which S3 verifies before it stores anything.
// libcurl 7.88 signs the query string as written and the path as given, so this file
// writes both in their canonical form: keys percent-encoded once (unreserved characters
// and '/' kept), query parameters sorted, each as key=value. Response XML is read with
// expat.
//
// Where the store is and who asks (S3Settings from the environment), as the AWS CLI reads
// them: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL (a custom endpoint: path-style
// addressing, http or https); AWS_REGION, then AWS_DEFAULT_REGION, then the profile's
// region, else us-east-1; credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY /
// AWS_SESSION_TOKEN, else a web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE:
// Kubernetes IRSA, through STS AssumeRoleWithWebIdentity), else ~/.aws/credentials and
// ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE, AWS_PROFILE), else the
// container credentials endpoint (AWS_CONTAINER_CREDENTIALS_FULL_URI or _RELATIVE_URI,
// with AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE): EKS Pod Identity, ECS). Temporary
// credentials are fetched again five minutes before they expire.
//
// Failures: a request that fails for a reason that may pass (no connection, a timeout,
// HTTP 500/502/503/504, 429, SlowDown, RequestTimeout) is retried up to
// S3Settings::max_attempts times, waiting base_delay_s × 2^attempt (at most max_delay_s)
// with equal jitter; anything else, and the last failure, throws S3Error naming the
// operation, the s3:// URI, the HTTP status and S3's error code and message. Bodies of
// responses are never echoed beyond S3's own error message.
//
// Thread safety: an S3Client may be used from several threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/storage/s3_uri.h"

namespace zenflow::storage {

class S3Error : public std::runtime_error {
 public:
  S3Error(const std::string& what, int http_status, std::string code)
      : std::runtime_error(what), http_status(http_status), code(std::move(code)) {}
  int http_status;   // 0: no HTTP answer (connection, timeout)
  std::string code;  // S3's <Code> ("NoSuchKey", "SignatureDoesNotMatch"), or curl's error text
};

// If-None-Match refused the write: an object exists under the key.
class S3ObjectExists : public S3Error {
 public:
  using S3Error::S3Error;
};

struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials
  int64_t expires_unix = 0;   // 0: never
  std::string source;         // "environment", "profile default (~/.aws/credentials)", ...
};

// Where credentials come from; current() refreshes them when they are about to expire.
// Thread safety: any thread.
class CredentialSource {
 public:
  virtual ~CredentialSource() = default;
  virtual AwsCredentials current() = 0;
};

// Reads the environment (a name -> value lookup; nullopt: unset) and the files it names.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

struct S3Settings {
  std::string endpoint;     // "https://s3.us-east-1.amazonaws.com" or a custom one
  bool path_style = false;  // http(s)://endpoint/bucket/key (custom endpoints) vs bucket.endpoint
  std::string region = "us-east-1";
  std::shared_ptr<CredentialSource> credentials;  // null: anonymous (unsigned requests)

  int max_attempts = 6;
  double base_delay_s = 0.2;
  double max_delay_s = 20;
  double connect_timeout_s = 10;
  // A transfer slower than 1 KiB/s for this long is abandoned (and retried).
  double stall_timeout_s = 60;
  // How a retry waits (tests inject one that records instead of sleeping).
  std::function<void(double seconds)> sleep;
  uint64_t jitter_seed = 0;  // 0: a random seed
};

// Throws std::runtime_error naming the variable or the file that is wrong (a profile that
// does not exist, a web identity without its token file, a malformed endpoint URL).
S3Settings s3_settings_from_environment(const EnvLookup& env = process_environment());

// The credential sources on their own (for tests and `zenflow doctor`-like messages).
std::shared_ptr<CredentialSource> static_credentials(AwsCredentials c);

struct ObjectInfo {
  std::string key;
  int64_t size = 0;
  std::string etag;  // without quotes
};

struct UploadOptions {
  // Objects at least this large go as a multipart upload of parts this large (S3: 5 MiB to
  // 5 GiB a part, at most 10,000 parts; raised to fit).
  int64_t part_bytes = 64 << 20;
  int parallel_parts = 4;            // parts in flight at once; memory: this many parts
  int64_t max_bytes_per_second = 0;  // over all parts together; 0: unlimited
  bool if_none_match = false;        // never overwrite: S3ObjectExists when the key exists
  // Bytes sent so far and the total, from any of the upload's threads.
  std::function<void(int64_t done, int64_t total)> progress;
};

class S3Client {
 public:
  explicit S3Client(S3Settings settings);
  ~S3Client();
  S3Client(const S3Client&) = delete;
  S3Client& operator=(const S3Client&) = delete;

  const S3Settings& settings() const;

  // One PUT of `bytes`. With if_none_match, an existing object is never replaced;
  // max_bytes_per_second > 0 caps its sending speed.
  void put(const S3Uri& dst, const std::string& bytes, bool if_none_match = false, int64_t max_bytes_per_second = 0);
  // A local file; multipart (parts in parallel, each with its CRC32C) when large.
  void put_file(const std::string& path, const S3Uri& dst, const UploadOptions& options = {});

  // A whole object into memory; throws S3Error (code "TooLarge") past max_bytes.
  std::string get(const S3Uri& src, int64_t max_bytes = 64 << 20);
  // A whole object into `path` (written to path + ".part", then renamed); returns its info.
  ObjectInfo get_file(const S3Uri& src, const std::string& path,
                      const std::function<void(int64_t done, int64_t total)>& progress = nullptr);

  // nullopt when there is no such object.
  std::optional<ObjectInfo> head(const S3Uri& src);
  // Every object whose key starts with prefix.key (all pages), in key order.
  std::vector<ObjectInfo> list(const S3Uri& prefix);
  // Deleting a key that does not exist is not an error (S3's semantics).
  void remove(const S3Uri& uri);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// x-amz-checksum-crc32c's spelling: base64 of the big-endian CRC32C.
std::string crc32c_base64(uint32_t crc);

}  // namespace zenflow::storage
