// The token rules every zenflow server applies (common/rpc): token files, constant-time
// comparison, roles, and the per-call rule the auth processor runs before any handler.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>

#include "common/rpc/auth.h"
#include "common/rpc/rpc.h"

namespace zenflow::rpc {
namespace {

namespace fs = std::filesystem;

const std::string kAdmin = "admin-token-0123456789abcdef";
const std::string kWorker = "worker-token-0123456789abcdef";

fs::path write_temp(const std::string& name, const std::string& content) {
  const fs::path p =
      fs::temp_directory_path() / ("zenflow-test-rpc-auth-" + std::to_string(::getpid()) + "-" + name);
  std::ofstream(p, std::ios::binary) << content;
  return p;
}

std::string error_of(const std::string& path) {
  try {
    read_token_file(path);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// A self-signed certificate and its key, PEM, valid from now + `from_s` to now + `to_s`.
std::pair<std::string, std::string> certificate(long from_s, long to_s) {
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(EVP_RSA_gen(2048), &EVP_PKEY_free);
  std::unique_ptr<X509, decltype(&X509_free)> x(X509_new(), &X509_free);
  X509_set_version(x.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x.get()), 1);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), from_s);
  X509_gmtime_adj(X509_getm_notAfter(x.get()), to_s);
  X509_set_pubkey(x.get(), key.get());
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("coordinator"), -1, -1,
                             0);
  X509_set_issuer_name(x.get(), name);
  X509_sign(x.get(), key.get(), EVP_sha256());
  auto pem = [](auto write) {
    std::unique_ptr<BIO, decltype(&BIO_free)> b(BIO_new(BIO_s_mem()), &BIO_free);
    write(b.get());
    char* data = nullptr;
    const long n = BIO_get_mem_data(b.get(), &data);
    return std::string(data, static_cast<size_t>(n));
  };
  return {pem([&](BIO* b) { PEM_write_bio_X509(b, x.get()); }),
          pem([&](BIO* b) { PEM_write_bio_PrivateKey(b, key.get(), nullptr, nullptr, 0, nullptr, nullptr); })};
}

std::string start_error(long from_s, long to_s) {
  const auto [cert, key] = certificate(from_s, to_s);
  const fs::path c = write_temp("cert.pem", cert), k = write_temp("key.pem", key);
  TokenAuthority auth;
  try {
    server_security(c.string(), k.string(), "127.0.0.1", auth);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

// An expired (or not yet valid) certificate is refused when the server starts, naming the
// file and the date. Before, it was served without a word and every client then failed.
TEST(RpcAuth, AnExpiredOrNotYetValidCertificateIsRefusedAtStartWithItsDate) {
  EXPECT_EQ(start_error(-86400, 86400), "");
  const std::string expired = start_error(-2 * 86400, -86400);
  EXPECT_NE(expired.find("cert.pem expired on "), std::string::npos) << expired;
  EXPECT_NE(expired.find(" GMT"), std::string::npos) << expired;
  const std::string early = start_error(86400, 2 * 86400);
  EXPECT_NE(early.find("cert.pem is not valid before "), std::string::npos) << early;
}

TEST(RpcAuth, TokenFilesAreTrimmedAndChecked) {
  const fs::path ok = write_temp("ok", "  " + kAdmin + "\n");
  EXPECT_EQ(read_token_file(ok.string()), kAdmin);
  const fs::path empty = write_temp("empty", "\n\n");
  EXPECT_NE(error_of(empty.string()).find("empty"), std::string::npos) << error_of(empty.string());
  const fs::path shorty = write_temp("short", "abcde\n");
  const std::string e = error_of(shorty.string());
  EXPECT_NE(e.find("5 characters"), std::string::npos) << e;
  EXPECT_EQ(e.find("abcde"), std::string::npos) << "the token must not appear in the message: " << e;
  const fs::path inner = write_temp("space", "abcdefgh ijklmnopqrst\n");
  EXPECT_FALSE(error_of(inner.string()).empty());
  EXPECT_NE(error_of("/nonexistent/zenflow.token").find("/nonexistent/zenflow.token"), std::string::npos);
  for (const fs::path& p : {ok, empty, shorty, inner}) fs::remove(p);
}

TEST(RpcAuth, ConstantTimeEqualIsEquality) {
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_TRUE(constant_time_equal(kAdmin, kAdmin));
  EXPECT_FALSE(constant_time_equal(kAdmin, kWorker));
  EXPECT_FALSE(constant_time_equal(kAdmin, kAdmin.substr(0, kAdmin.size() - 1)));
  std::string last = kAdmin;
  last.back() = 'X';
  EXPECT_FALSE(constant_time_equal(kAdmin, last));
}

TEST(RpcAuth, RolesNeedTheExactBearerValue) {
  const TokenAuthority auth(kAdmin, kWorker);
  EXPECT_EQ(auth.role_of("Bearer " + kAdmin), Role::kAdmin);
  EXPECT_EQ(auth.role_of("Bearer " + kWorker), Role::kWorker);
  EXPECT_EQ(auth.role_of(kAdmin), Role::kNone);              // no scheme
  EXPECT_EQ(auth.role_of("bearer " + kAdmin), Role::kNone);  // scheme is case-exact
  EXPECT_EQ(auth.role_of("Bearer " + kAdmin + " "), Role::kNone);
  EXPECT_EQ(auth.role_of(""), Role::kNone);
  EXPECT_FALSE(TokenAuthority().has_tokens());
  EXPECT_EQ(TokenAuthority().role_of("Bearer " + kAdmin), Role::kNone);
}

TEST(RpcAuth, EveryCallButHealthNeedsAToken) {
  const TokenAuthority auth(kAdmin, kWorker);
  const std::string admin = "Bearer " + kAdmin, worker = "Bearer " + kWorker,
                    wrong = "Bearer nope-0123456789abcdef";
  const std::string_view a = admin, w = worker, x = wrong;
  struct Case {
    const char* method;
    const std::string_view* token;
    grpc::StatusCode want;
  };
  const Case cases[] = {
      {"/grpc.health.v1.Health/Check", nullptr, grpc::StatusCode::OK},
      {"/grpc.health.v1.Health/Watch", &x, grpc::StatusCode::OK},
      {"/zenflow.v1.JobService/SubmitJob", nullptr, grpc::StatusCode::UNAUTHENTICATED},
      {"/zenflow.v1.JobService/SubmitJob", &x, grpc::StatusCode::UNAUTHENTICATED},
      {"/zenflow.v1.JobService/SubmitJob", &w, grpc::StatusCode::PERMISSION_DENIED},
      {"/zenflow.v1.JobService/StreamLogs", &a, grpc::StatusCode::OK},
      {"/zenflow.v1.WorkerService/Heartbeat", nullptr, grpc::StatusCode::UNAUTHENTICATED},
      {"/zenflow.v1.WorkerService/Heartbeat", &w, grpc::StatusCode::OK},
      {"/zenflow.v1.WorkerService/Heartbeat", &a, grpc::StatusCode::OK},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", nullptr,
       grpc::StatusCode::UNAUTHENTICATED},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &w, grpc::StatusCode::OK},
      {"/grpc.health.v1.HealthX/Check", nullptr, grpc::StatusCode::UNAUTHENTICATED},  // prefix, not substring
      {"", nullptr, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.method);
    EXPECT_EQ(check_call(auth, c.method, c.token).error_code(), c.want);
  }
}

}  // namespace
}  // namespace zenflow::rpc
