// The connection handshake: what a Transport's listening socket speaks before any byte
// reaches UCX (transport.h). Pure functions over bytes and two sans-IO state machines (the
// sockets are handshake_listener.h's), so that everything a stranger can send is parsed here
// and fuzzed (tests/fuzz/fuzz_node_handshake.cpp).
//
// Frame: "ZFNH" | version u16 | type u8 | flags u8 (0) | body length u32 | body; integers
// little-endian; a body is at most kMaxBodyBytes, checked before it is read.
//   client -> server  HELLO      client nonce (32 bytes) | key length u8 | key
//   server -> client  CHALLENGE  server nonce (32 bytes)
//   client -> server  PROOF      mac (32) | channel id u64 | address length u32 | address
//   server -> client  ACCEPT     mac (32) | channel id u64 | address length u32 | address
//                  or REFUSE     reason (text, at most kMaxReasonBytes)
// The key names the secret the client proves (at most kMaxKeyBytes of printable ASCII, ""
// for a node's own token): a node assigned to jobs by a coordinator holds one secret per job
// attempt ("JOB_ID/ATTEMPT", server/coordinator.h node grants), and a key it holds no secret
// for is refused at once, saying so. The address is the sender's UCX worker address (at most
// kMaxAddressBytes); the channel id is what the other side puts on every message of the
// channel it sends to the sender.
//   client mac = HMAC-SHA256(SHA-256(secret), "zenflow handshake v1 client" | key length u8 |
//                            key | client nonce | server nonce | PROOF body after the mac)
//   server mac = HMAC-SHA256(SHA-256(secret), "zenflow handshake v1 server" | key length u8 |
//                            key | client nonce | server nonce | client mac | ACCEPT body
//                            after the mac)
// Each side proves it knows the secret over the other's fresh nonce, and the macs cover the
// addresses and ids, so nobody without the secret gets either side to create a UCX
// endpoint, and the secret never crosses the wire. A wrong client mac is answered with
// REFUSE (so the client can name the failure); anything malformed closes the connection.
//
// Thread-safety: the state machines are not shared; the functions are reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>

namespace zenflow::transport::handshake {

constexpr char kMagic[4] = {'Z', 'F', 'N', 'H'};
constexpr uint16_t kVersion = 1;
constexpr size_t kFrameHeaderBytes = 12;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr size_t kMaxAddressBytes = 4096;  // a UCX worker address is a few hundred bytes
constexpr size_t kMaxReasonBytes = 200;
constexpr size_t kMaxKeyBytes = 128;
// In the REFUSE a listening side sends for a key it holds no secret for (followed by the key):
// a client whose grant may still be on its way asks again (remote_host_optimizer.cpp).
constexpr char kNoSecretForKey[] = "this side holds no secret for key";
constexpr size_t kMaxBodyBytes = kMacBytes + 8 + 4 + kMaxAddressBytes;

enum class FrameType : uint8_t { kHello = 1, kChallenge = 2, kProof = 3, kAccept = 4, kRefuse = 5 };

// A malformed frame; what() names the field.
class HandshakeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

// From the operating system's random source (OpenSSL's RAND_bytes); throws HandshakeError
// when it has none. A channel id is never 0.
Nonce random_nonce();
uint64_t random_channel_id();

// This side of a connection: its UCX worker address and the id it receives the channel on.
struct Endpoint {
  std::string address;
  uint64_t channel = 0;
};

std::string encode_frame(FrameType type, const std::string& body);

struct FrameHeader {
  FrameType type = FrameType::kHello;
  uint32_t body_bytes = 0;
};
// Reads kFrameHeaderBytes at `data`; throws HandshakeError naming the field (magic,
// version, type, flags, length over kMaxBodyBytes).
FrameHeader decode_frame_header(const void* data);

// HELLO's body. The key: printable ASCII, at most kMaxKeyBytes; decode throws
// HandshakeError naming the field (nonce size, key length, key bytes, trailing bytes).
std::string encode_hello(const Nonce& nonce, const std::string& key);
void decode_hello(const std::string& body, Nonce* nonce, std::string* key);

// The secret a listening side holds for a key; nullopt: none (the client is refused).
using SecretFor = std::function<std::optional<std::string>(const std::string& key)>;
// One secret for every key (a Transport's own TransportOptions::secret): "" only.
SecretFor only_secret(std::string secret);

// PROOF and ACCEPT bodies.
std::string encode_proof(const Mac& mac, const Endpoint& e);
// Throws HandshakeError naming the field (truncated, address length, trailing bytes).
void decode_proof(const std::string& body, Mac* mac, Endpoint* e);

Mac client_mac(const std::string& secret, const std::string& key, const Nonce& client_nonce,
               const Nonce& server_nonce, const Endpoint& client);
Mac server_mac(const std::string& secret, const std::string& key, const Nonce& client_nonce,
               const Nonce& server_nonce, const Mac& client_mac, const Endpoint& server);
bool same_mac(const Mac& a, const Mac& b);  // in constant time

// Collects one frame from a byte stream, never holding more than one frame's bytes.
class FrameReader {
 public:
  // Takes what the current frame still needs from [data, data + len); returns the bytes
  // taken (the rest belongs after this frame). Throws HandshakeError on a bad header.
  size_t feed(const uint8_t* data, size_t len);
  bool ready() const { return have_header_ && body_.size() == header_.body_bytes; }
  FrameType type() const { return header_.type; }
  const std::string& body() const { return body_; }
  void clear();

 private:
  uint8_t head_[kFrameHeaderBytes] = {};
  size_t head_len_ = 0;
  bool have_header_ = false;
  FrameHeader header_;
  std::string body_;
};

// What a state machine is at; kFailed says why in error(), and whether the secret did not
// match (authentication_failed) rather than the bytes being malformed.
enum class State { kRunning, kAccepted, kFailed };

// The listening side. feed() returns the bytes to send (CHALLENGE, ACCEPT or REFUSE);
// once it is not kRunning it takes no more bytes (more is an error only while running).
class ServerHandshake {
 public:
  ServerHandshake(SecretFor secret_for, Endpoint local, const Nonce& server_nonce);
  std::string feed(const void* data, size_t len);
  State state() const { return state_; }
  const std::string& error() const { return error_; }
  bool authentication_failed() const { return auth_failed_; }
  const Endpoint& peer() const { return peer_; }  // once kAccepted
  const std::string& key() const { return key_; }  // the HELLO's, once it came

 private:
  std::string on_frame();
  std::string fail(const std::string& why);

  SecretFor secret_for_;
  std::string secret_, key_;
  Endpoint local_;
  Nonce server_nonce_, client_nonce_{};
  bool have_hello_ = false;
  FrameReader reader_;
  State state_ = State::kRunning;
  std::string error_;
  bool auth_failed_ = false;
  Endpoint peer_;
};

// The connecting side. start() returns HELLO; feed() returns PROOF after the CHALLENGE.
class ClientHandshake {
 public:
  ClientHandshake(std::string secret, std::string key, Endpoint local, const Nonce& client_nonce);
  std::string start();
  std::string feed(const void* data, size_t len);
  State state() const { return state_; }
  const std::string& error() const { return error_; }
  bool authentication_failed() const { return auth_failed_; }
  const Endpoint& peer() const { return peer_; }  // once kAccepted

 private:
  std::string on_frame();
  std::string fail(const std::string& why, bool auth = false);

  std::string secret_, key_;
  Endpoint local_;
  Nonce client_nonce_, server_nonce_{};
  Mac sent_mac_{};
  bool have_challenge_ = false;
  FrameReader reader_;
  State state_ = State::kRunning;
  std::string error_;
  bool auth_failed_ = false;
  Endpoint peer_;
};

}  // namespace zenflow::transport::handshake
