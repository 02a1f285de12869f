#include "common/rpc/rpc.h"

#include <stdexcept>

#include "common/input_file.h"

namespace zenflow::rpc {

std::string read_pem_file(const std::string& path, const std::string& what) {
  try {
    return read_regular_file(path, 1 << 20, what);
  } catch (const InputError& e) {
    throw std::invalid_argument(e.what());
  }
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty())
    throw std::invalid_argument("--tls-cert and --tls-key go together; only one was given");
  grpc::SslServerCredentialsOptions opts;
  opts.pem_key_cert_pairs.push_back({read_pem_file(key_file, "TLS key"), read_pem_file(cert_file, "TLS certificate")});
  return grpc::SslServerCredentials(opts);
}

void configure_server(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  // Workers ping idle connections every 20 s (make_channel): allow that, or the server
  // answers GOAWAY too_many_pings and the connections flap.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetInt(GRPC_ARG_MAX_METADATA_SIZE, kMaxMetadataBytes);
  // Reconnect quickly after a coordinator restart (the default backoff grows to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
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

void prepare_call(grpc::ClientContext& ctx, const std::string& token, std::chrono::milliseconds deadline) {
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
}

grpc::Status check_role(const grpc::ServerContext& ctx, const TokenAuthority& auth, Role needed) {
  const auto& md = ctx.client_metadata();
  const auto it = md.find("authorization");
  Role got = Role::kNone;
  if (it != md.end()) got = auth.role_of(std::string_view(it->second.data(), it->second.size()));
  if (got == Role::kNone)
    return {grpc::StatusCode::UNAUTHENTICATED,
            it == md.end() ? "no bearer token (authorization metadata)" : "invalid bearer token"};
  if (needed == Role::kAdmin && got != Role::kAdmin)
    return {grpc::StatusCode::PERMISSION_DENIED, "a worker token cannot call the admin API; use the admin token"};
  return grpc::Status::OK;
}

std::string describe(const grpc::Status& s) {
  static const char* names[] = {"OK",          "CANCELLED",         "UNKNOWN",        "INVALID_ARGUMENT",
                                "DEADLINE_EXCEEDED", "NOT_FOUND",   "ALREADY_EXISTS", "PERMISSION_DENIED",
                                "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                "UNIMPLEMENTED", "INTERNAL",      "UNAVAILABLE",    "DATA_LOSS",
                                "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  const std::string name = code >= 0 && code <= 16 ? names[code] : "CODE " + std::to_string(code);
  return s.error_message().empty() ? name : name + ": " + s.error_message();
}

}  // namespace zenflow::rpc
