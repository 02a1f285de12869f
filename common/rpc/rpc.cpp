#include "common/rpc/rpc.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstring>

#include <absl/synchronization/mutex.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string_view>

#include "common/input_file.h"

namespace zenflow::rpc {

std::string read_pem_file(const std::string& path, const std::string& what) {
  try {
    return read_regular_file(path, 1 << 20, what);
  } catch (const InputError& e) {
    throw std::invalid_argument(e.what());
  }
}

void check_certificate_dates(const std::string& pem, const std::string& path) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr, &X509_free);
  if (!cert) throw std::invalid_argument("TLS certificate " + path + ": no PEM certificate in it");
  const auto date = [](const ASN1_TIME* t) {
    std::unique_ptr<BIO, decltype(&BIO_free)> out(BIO_new(BIO_s_mem()), &BIO_free);
    ASN1_TIME_print(out.get(), t);
    char* text = nullptr;
    const long n = BIO_get_mem_data(out.get(), &text);
    return std::string(text, n > 0 ? static_cast<size_t>(n) : 0);
  };
  const ASN1_TIME* not_after = X509_get0_notAfter(cert.get());
  const ASN1_TIME* not_before = X509_get0_notBefore(cert.get());
  if (X509_cmp_current_time(not_after) < 0)
    throw std::invalid_argument("TLS certificate " + path + " expired on " + date(not_after) +
                                "; every client would refuse it");
  if (X509_cmp_current_time(not_before) > 0)
    throw std::invalid_argument("TLS certificate " + path + " is not valid before " + date(not_before) +
                                "; every client would refuse it until then");
}

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::kTls:
      return "TLS";
    case Transport::kLocal:
      return "plaintext, loopback only";
    case Transport::kPlaintext:
      return "plaintext";
  }
  return "?";
}

namespace {

constexpr std::string_view kHealthPrefix = "/grpc.health.v1.Health/";
constexpr std::string_view kAdminPrefix = "/zenflow.v1.JobService/";

std::string_view view(const grpc::string_ref& r) { return {r.data(), r.size()}; }

// Runs in the transport before any handler (IsBlocking false: inline, no thread hop). It
// sees the call's metadata, :path included.
class TokenAuthProcessor final : public grpc::AuthMetadataProcessor {
 public:
  explicit TokenAuthProcessor(const TokenAuthority& auth) : auth_(auth) {}
  bool IsBlocking() const override { return false; }
  grpc::Status Process(const InputMetadata& md, grpc::AuthContext*, OutputMetadata*,
                       OutputMetadata*) override {
    const auto path = md.find(":path");
    const auto token = md.find("authorization");
    std::string_view authorization;
    if (token != md.end()) authorization = view(token->second);
    return check_call(auth_, path == md.end() ? std::string_view() : view(path->second),
                      token == md.end() ? nullptr : &authorization);
  }

 private:
  const TokenAuthority& auth_;
};

}  // namespace

grpc::Status check_call(const TokenAuthority& auth, std::string_view method,
                        const std::string_view* authorization) {
  if (method.substr(0, kHealthPrefix.size()) == kHealthPrefix) return grpc::Status::OK;
  const Role got = authorization ? auth.role_of(*authorization) : Role::kNone;
  if (got == Role::kNone)
    return {grpc::StatusCode::UNAUTHENTICATED,
            authorization ? "invalid bearer token" : "no bearer token (authorization metadata)"};
  if (method.substr(0, kAdminPrefix.size()) == kAdminPrefix && got != Role::kAdmin)
    return {grpc::StatusCode::PERMISSION_DENIED,
            "a worker token cannot call the admin API; use the admin token"};
  return grpc::Status::OK;
}

ServerSecurity server_security(const std::string& cert_file, const std::string& key_file,
                               const std::string& host, const TokenAuthority& auth) {
  ServerSecurity out;
  if (!cert_file.empty() || !key_file.empty()) {
    if (cert_file.empty() || key_file.empty())
      throw std::invalid_argument("--tls-cert and --tls-key go together; only one was given");
    grpc::SslServerCredentialsOptions opts;
    const std::string cert = read_pem_file(cert_file, "TLS certificate");
    check_certificate_dates(cert, cert_file);  // refused at start, not by every client later
    opts.pem_key_cert_pairs.push_back({read_pem_file(key_file, "TLS key"), cert});
    out.credentials = grpc::SslServerCredentials(opts);
    out.transport = Transport::kTls;
  } else if (is_loopback_host(host)) {
    out.credentials = grpc::experimental::LocalServerCredentials(LOCAL_TCP);
    out.transport = Transport::kLocal;
  } else {
    out.credentials = grpc::InsecureServerCredentials();
    return out;
  }
  if (auth.has_tokens()) {
    out.credentials->SetAuthMetadataProcessor(std::make_shared<TokenAuthProcessor>(auth));
    out.every_call_checked = true;
  }
  return out;
}

namespace {
// Debian's Abseil is built with its mutex deadlock detector on: every lock gRPC takes
// (several per call) updates a global lock graph. It cost 4% of the coordinator at 10,000
// heartbeats/s and finds nothing gRPC's own tests do not. Off, once per process.
void without_lock_graph() {
  static std::once_flag once;
  std::call_once(once, [] { absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore); });
}
}  // namespace

void configure_server(grpc::ServerBuilder& builder) {
  without_lock_graph();
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  // Workers ping idle connections every 20 s (make_channel): allow that, or the server
  // answers GOAWAY too_many_pings and the connections flap.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Connections that never speak (or never finish TLS) are closed after 10 s instead of 120,
  // and a connection idle for 5 minutes goes away (a client reconnects at its next call):
  // otherwise a burst of idle connections holds the process's file descriptors.
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 300'000);
}

int64_t raise_open_files_limit(std::string* note) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0) {
    *note = std::string("open files: cannot read the limit: ") + std::strerror(errno);
    return -1;
  }
  const rlim_t before = lim.rlim_cur;
  if (lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
      *note = "open files: " + std::to_string(before) + " (cannot raise it to the hard limit " +
              std::to_string(lim.rlim_max) + ": " + std::strerror(errno) + ")";
      return static_cast<int64_t>(before);
    }
  }
  *note = "open files: " + std::to_string(lim.rlim_cur) +
          (before < lim.rlim_cur ? " (raised from " + std::to_string(before) + ", the hard limit)" : "");
  return static_cast<int64_t>(lim.rlim_cur);
}

namespace {
class DropReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const auto& p) { return p->name() == "proto_server_reflection"; }),
                   plugins->end());
  }
};
}  // namespace

void without_reflection(grpc::ServerBuilder& builder) {
  builder.SetOption(std::make_unique<DropReflection>());
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ChannelOptions& options) {
  without_lock_graph();
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  // Reconnect quickly after a coordinator restart (the default backoff grows to 120 s). The
  // "min reconnect backoff" is gRPC's minimum *connect timeout*: at 100 ms a connection whose
  // handshake took longer (a busy coordinator accepting 8 connections carrying 2,000 streams,
  // or draining 300 closed ones) was given up and every call waiting on it failed UNAVAILABLE
  // ("tcp handshaker shutdown"). 2 s lets a slow handshake finish and still retries a
  // blackholed address soon after a partition heals.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 2000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (options.own_connection) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  if (options.keepalive) {
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (options.ca_file.empty()) {
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = read_pem_file(options.ca_file, "TLS CA");
    creds = grpc::SslCredentials(ssl);
    if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  }
  return grpc::CreateCustomChannel(target, creds, args);
}

void prepare_call(grpc::ClientContext& ctx, const std::string& token, std::chrono::milliseconds deadline,
                  const std::string& session) {
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  if (!session.empty()) ctx.AddMetadata(kSessionMetadata, session);
}

grpc::Status check_role(const grpc::ServerContextBase& ctx, const TokenAuthority& auth, Role needed) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  std::string_view authorization;
  if (it != md.end()) authorization = view(it->second);
  // The same rule as the processor, for the method class that needs `needed`.
  return check_call(auth, needed == Role::kAdmin ? kAdminPrefix : std::string_view("/"),
                    it == md.end() ? nullptr : &authorization);
}

std::string describe(const grpc::Status& s) {
  static const char* names[] = {
      "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
      "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
      "DATA_LOSS", "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  const std::string name = code >= 0 && code <= 16 ? names[code] : "CODE " + std::to_string(code);
  return s.error_message().empty() ? name : name + ": " + s.error_message();
}

}  // namespace zenflow::rpc
