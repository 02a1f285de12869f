// gRPC plumbing every zenflow process shares: server and channel credentials (TLS when a
// certificate is given), bearer metadata on calls, the role check on the server side, and
// the limits on messages and metadata.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/rpc/auth.h"

namespace zenflow::rpc {

// Limits on every server and channel: a job spec is at most 1 MiB (kMaxSpecBytes), a log
// chunk at most 64 KiB; 4 MiB leaves room for a page of job statuses.
inline constexpr int kMaxMessageBytes = 4 << 20;
inline constexpr int kMaxMetadataBytes = 16 << 10;
inline constexpr size_t kMaxLogChunkBytes = 64 << 10;
// The largest job profile an agent uploads (UploadProfile; a profile is a few KiB).
inline constexpr size_t kMaxProfileBytes = 1 << 20;

// How a server's port is secured, and whether every call on it is authenticated before any
// handler runs (AuthMetadataProcessor; gRPC attaches one to secure credentials only):
//   kTls        --tls-cert/--tls-key: TLS; the processor checks every call.
//   kLocal      plaintext on a loopback address: gRPC's local credentials (they accept
//               loopback peers only, with plaintext on the wire, so any client connects);
//               the processor checks every call.
//   kPlaintext  plaintext elsewhere: nothing checks calls but the handlers, so a server must
//               not add services of its own (reflection) there.
enum class Transport { kTls, kLocal, kPlaintext };
const char* transport_name(Transport t);

struct ServerSecurity {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  Transport transport = Transport::kPlaintext;
  bool every_call_checked = false;  // an AuthMetadataProcessor is attached (tokens given)
};
// TLS from PEM files when cert_file is non-empty (key_file then required). With tokens
// (auth.has_tokens()), every call but grpc.health.v1 needs a bearer token before it reaches
// a handler, and JobService needs the admin token. `auth` must outlive the server.
// Throws std::invalid_argument naming the file that cannot be read.
ServerSecurity server_security(const std::string& cert_file, const std::string& key_file,
                               const std::string& host, const TokenAuthority& auth);

// The rule the processor applies to a call of `method` ("/package.Service/Method"), given
// its `authorization` value (nullptr: absent). Exposed for unit tests.
grpc::Status check_call(const TokenAuthority& auth, std::string_view method,
                        const std::string_view* authorization);

// Applies the message/metadata limits and keepalive settings to a server.
void configure_server(grpc::ServerBuilder& builder);

// Throws std::invalid_argument naming `path` and the date when the first certificate of the
// PEM text `pem` has expired or is not valid yet (or when there is none).
void check_certificate_dates(const std::string& pem, const std::string& path);

// Raises the soft limit on open files to the hard limit (a server holds a descriptor per
// connection; gRPC 1.51 stops accepting for good after one EMFILE). Returns the limit now in
// force (-1 when unreadable); *note says what was done, for the process's first lines.
int64_t raise_open_files_limit(std::string* note);

// Serves no reflection on this server. Linking libgrpc++_reflection registers its plugin
// with every ServerBuilder at static initialization; a port that checks no tokens (the
// health-only port, plaintext off loopback) must not offer it.
void without_reflection(grpc::ServerBuilder& builder);

struct ChannelOptions {
  std::string ca_file;          // TLS: trust this CA (PEM); empty = plaintext
  std::string tls_server_name;  // override the name checked in the server's certificate
  bool keepalive = false;       // workers: 20 s keepalive pings on idle connections
  bool own_connection = false;  // a connection of its own, not shared with other channels to the target
};
// Throws std::invalid_argument naming an unreadable CA file.
std::shared_ptr<grpc::Channel> make_channel(const std::string& target, const ChannelOptions& options = {});

// Sets the deadline, the bearer token and a worker's session (each omitted when empty) on a
// client call.
void prepare_call(grpc::ClientContext& ctx, const std::string& token, std::chrono::milliseconds deadline,
                  const std::string& session = {});

// The server side: OK when the call's token grants `needed` (kAdmin also grants kWorker),
// UNAUTHENTICATED without a valid token, PERMISSION_DENIED for a worker token on an admin RPC.
grpc::Status check_role(const grpc::ServerContextBase& ctx, const TokenAuthority& auth, Role needed);

// Reads a PEM file for TLS (at most 1 MiB). Throws std::invalid_argument naming it.
std::string read_pem_file(const std::string& path, const std::string& what);

// "UNAVAILABLE: connection refused" style one-liner for a failed call.
std::string describe(const grpc::Status& s);

}  // namespace zenflow::rpc
