// The connection handshake's frames and state machines (handshake.h).
#include "worker/transport/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

namespace zenflow::transport::handshake {
namespace {

constexpr char kClientLabel[] = "zenflow handshake v1 client";
constexpr char kServerLabel[] = "zenflow handshake v1 server";

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// The PROOF/ACCEPT body after its mac: what each mac covers.
std::string endpoint_bytes(const Endpoint& e) {
  std::string out;
  put_u64(out, e.channel);
  put_u32(out, static_cast<uint32_t>(e.address.size()));
  out += e.address;
  return out;
}

// The HMAC key is SHA-256 of the secret, not the secret itself: HMAC pads a short key with
// zero bytes, so "k" and "k\0" would be the same key (the fuzzer found it).
Mac hmac(const std::string& secret, const std::string& message) {
  Mac key{}, out{};
  unsigned int len = 0;
  // A std::string's data() is never null, so an empty secret hashes like any other.
  if (EVP_Digest(secret.data(), secret.size(), key.data(), &len, EVP_sha256(), nullptr) != 1 ||
      len != kMacBytes)
    throw HandshakeError("handshake: SHA-256 failed");
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(),
           &len) == nullptr ||
      len != kMacBytes)
    throw HandshakeError("handshake: HMAC-SHA256 failed");
  return out;
}

template <size_t N>
void append(std::string& out, const std::array<uint8_t, N>& a) {
  out.append(reinterpret_cast<const char*>(a.data()), a.size());
}

std::string frame_name(FrameType t) {
  switch (t) {
    case FrameType::kHello:
      return "HELLO";
    case FrameType::kChallenge:
      return "CHALLENGE";
    case FrameType::kProof:
      return "PROOF";
    case FrameType::kAccept:
      return "ACCEPT";
    case FrameType::kRefuse:
      return "REFUSE";
  }
  return "?";
}

// What a mac covers of the key: its length, then its bytes.
std::string key_bytes(const std::string& key) { return std::string(1, static_cast<char>(key.size())) + key; }

Nonce nonce_of(const std::string& body, const char* what) {
  if (body.size() != kNonceBytes)
    throw HandshakeError(std::string("handshake: ") + what + " of " + std::to_string(body.size()) +
                         " bytes (a nonce is " + std::to_string(kNonceBytes) + ")");
  Nonce n{};
  std::memcpy(n.data(), body.data(), kNonceBytes);
  return n;
}

// Both sides' feed(): bytes into `reader` while running(), each whole frame handed to
// on_frame(); a malformed one ends it through fail(). Returns what the side sends back.
template <typename Running, typename OnFrame, typename Fail>
std::string feed_frames(FrameReader& reader, const void* data, size_t len, Running running, OnFrame on_frame,
                        Fail fail) {
  std::string out;
  const auto* p = static_cast<const uint8_t*>(data);
  try {
    while (running() && len > 0) {
      const size_t used = reader.feed(p, len);
      p += used;
      len -= used;
      if (reader.ready()) out += on_frame();
    }
  } catch (const HandshakeError& e) {
    out += fail(e.what());
  }
  return out;
}

}  // namespace

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw HandshakeError("handshake: no random bytes");
  return n;
}

uint64_t random_channel_id() {
  for (;;) {
    uint8_t b[8];
    if (RAND_bytes(b, sizeof b) != 1) throw HandshakeError("handshake: no random bytes");
    if (const uint64_t id = get_le(b, 8); id != 0) return id;
  }
}

std::string encode_frame(FrameType type, const std::string& body) {
  std::string out(kMagic, sizeof kMagic);
  out.push_back(static_cast<char>(kVersion & 0xff));
  out.push_back(static_cast<char>(kVersion >> 8));
  out.push_back(static_cast<char>(type));
  out.push_back(0);  // flags
  put_u32(out, static_cast<uint32_t>(body.size()));
  return out + body;
}

FrameHeader decode_frame_header(const void* data) {
  const auto* p = static_cast<const uint8_t*>(data);
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
    throw HandshakeError("handshake: bad magic (not a zenflow peer)");
  const auto version = static_cast<uint16_t>(get_le(p + 4, 2));
  if (version != kVersion)
    throw HandshakeError("handshake: version " + std::to_string(version) + " (this side speaks " +
                         std::to_string(kVersion) + ")");
  const uint8_t type = p[6];
  if (type < static_cast<uint8_t>(FrameType::kHello) || type > static_cast<uint8_t>(FrameType::kRefuse))
    throw HandshakeError("handshake: unknown frame type " + std::to_string(type));
  if (p[7] != 0) throw HandshakeError("handshake: flags " + std::to_string(p[7]) + " (none are defined)");
  const auto len = static_cast<uint32_t>(get_le(p + 8, 4));
  if (len > kMaxBodyBytes)
    throw HandshakeError("handshake: body length " + std::to_string(len) + " over " +
                         std::to_string(kMaxBodyBytes));
  return {static_cast<FrameType>(type), len};
}

std::string encode_hello(const Nonce& nonce, const std::string& key) {
  if (key.size() > kMaxKeyBytes) throw HandshakeError("handshake: key of " + std::to_string(key.size()) + " bytes");
  std::string out(nonce.begin(), nonce.end());
  return out + key_bytes(key);
}

void decode_hello(const std::string& body, Nonce* nonce, std::string* key) {
  if (body.size() < kNonceBytes + 1)
    throw HandshakeError("handshake: HELLO of " + std::to_string(body.size()) + " bytes is truncated");
  std::memcpy(nonce->data(), body.data(), kNonceBytes);
  const size_t len = static_cast<uint8_t>(body[kNonceBytes]);
  if (len > kMaxKeyBytes)
    throw HandshakeError("handshake: key length " + std::to_string(len) + " (at most " + std::to_string(kMaxKeyBytes) +
                         ")");
  if (body.size() != kNonceBytes + 1 + len)
    throw HandshakeError("handshake: key length " + std::to_string(len) + " but " +
                         std::to_string(body.size() - kNonceBytes - 1) + " bytes follow");
  key->assign(body, kNonceBytes + 1, len);
  for (char c : *key)
    if (c < 0x21 || c > 0x7e) throw HandshakeError("handshake: the key holds a byte that is not printable ASCII");
}

SecretFor only_secret(std::string secret) {
  return [secret = std::move(secret)](const std::string& key) -> std::optional<std::string> {
    if (!key.empty()) return std::nullopt;
    return secret;
  };
}

std::string encode_proof(const Mac& mac, const Endpoint& e) {
  std::string out;
  append(out, mac);
  return out + endpoint_bytes(e);
}

void decode_proof(const std::string& body, Mac* mac, Endpoint* e) {
  constexpr size_t fixed = kMacBytes + 8 + 4;
  if (body.size() < fixed)
    throw HandshakeError("handshake: proof of " + std::to_string(body.size()) + " bytes is truncated");
  const auto* p = reinterpret_cast<const uint8_t*>(body.data());
  std::memcpy(mac->data(), p, kMacBytes);
  e->channel = get_le(p + kMacBytes, 8);
  const uint64_t len = get_le(p + kMacBytes + 8, 4);
  if (e->channel == 0) throw HandshakeError("handshake: channel id 0");
  if (len == 0 || len > kMaxAddressBytes)
    throw HandshakeError("handshake: address length " + std::to_string(len) + " (1 to " +
                         std::to_string(kMaxAddressBytes) + ")");
  if (body.size() != fixed + len)
    throw HandshakeError("handshake: address length " + std::to_string(len) + " but " +
                         std::to_string(body.size() - fixed) + " bytes follow");
  e->address.assign(body, fixed, len);
}

Mac client_mac(const std::string& secret, const std::string& key, const Nonce& client_nonce,
               const Nonce& server_nonce, const Endpoint& client) {
  std::string m = std::string(kClientLabel) + key_bytes(key);
  append(m, client_nonce);
  append(m, server_nonce);
  return hmac(secret, m + endpoint_bytes(client));
}

Mac server_mac(const std::string& secret, const std::string& key, const Nonce& client_nonce,
               const Nonce& server_nonce, const Mac& client_mac, const Endpoint& server) {
  std::string m = std::string(kServerLabel) + key_bytes(key);
  append(m, client_nonce);
  append(m, server_nonce);
  append(m, client_mac);
  return hmac(secret, m + endpoint_bytes(server));
}

bool same_mac(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), kMacBytes) == 0; }

// ---- FrameReader -------------------------------------------------------------------------

size_t FrameReader::feed(const uint8_t* data, size_t len) {
  size_t used = 0;
  if (!have_header_) {
    const size_t take = std::min(len, kFrameHeaderBytes - head_len_);
    std::memcpy(head_ + head_len_, data, take);
    head_len_ += take;
    used += take;
    if (head_len_ < kFrameHeaderBytes) return used;
    header_ = decode_frame_header(head_);
    have_header_ = true;
  }
  const size_t take = std::min(len - used, header_.body_bytes - body_.size());
  body_.append(reinterpret_cast<const char*>(data) + used, take);
  return used + take;
}

void FrameReader::clear() {
  head_len_ = 0;
  have_header_ = false;
  body_.clear();
}

// ---- ServerHandshake ---------------------------------------------------------------------

ServerHandshake::ServerHandshake(SecretFor secret_for, Endpoint local, const Nonce& server_nonce)
    : secret_for_(std::move(secret_for)), local_(std::move(local)), server_nonce_(server_nonce) {}

std::string ServerHandshake::feed(const void* data, size_t len) {
  return feed_frames(reader_, data, len, [this] { return state_ == State::kRunning; }, [this] { return on_frame(); },
                     [this](const std::string& why) { return fail(why); });
}

std::string ServerHandshake::on_frame() {
  const FrameType type = reader_.type();
  const std::string body = reader_.body();
  reader_.clear();
  if (!have_hello_) {
    if (type != FrameType::kHello) throw HandshakeError("handshake: " + frame_name(type) + " before HELLO");
    decode_hello(body, &client_nonce_, &key_);
    have_hello_ = true;
    std::optional<std::string> secret = secret_for_ ? secret_for_(key_) : std::nullopt;
    if (!secret) {
      // Named at once (the key is printable ASCII): a rank that reached a node its job was
      // not assigned to, or a node whose coordinator has not granted the attempt yet.
      auth_failed_ = true;
      const std::string why = std::string("authentication failed: ") + kNoSecretForKey + " '" + key_ + "'";
      return fail(why) + encode_frame(FrameType::kRefuse, why);
    }
    secret_ = std::move(*secret);
    return encode_frame(FrameType::kChallenge, std::string(server_nonce_.begin(), server_nonce_.end()));
  }
  if (type != FrameType::kProof)
    throw HandshakeError("handshake: " + frame_name(type) + " where PROOF was due");
  Mac mac{};
  Endpoint client;
  decode_proof(body, &mac, &client);
  const Mac want = client_mac(secret_, key_, client_nonce_, server_nonce_, client);
  if (!same_mac(mac, want)) {
    auth_failed_ = true;
    const std::string why = "authentication failed: the client's proof does not match this side's secret";
    return fail(why) + encode_frame(FrameType::kRefuse, why);
  }
  peer_ = std::move(client);
  state_ = State::kAccepted;
  return encode_frame(FrameType::kAccept,
                      encode_proof(server_mac(secret_, key_, client_nonce_, server_nonce_, mac, local_), local_));
}

std::string ServerHandshake::fail(const std::string& why) {
  state_ = State::kFailed;
  error_ = why;
  return "";
}

// ---- ClientHandshake ---------------------------------------------------------------------

ClientHandshake::ClientHandshake(std::string secret, std::string key, Endpoint local, const Nonce& client_nonce)
    : secret_(std::move(secret)), key_(std::move(key)), local_(std::move(local)), client_nonce_(client_nonce) {}

std::string ClientHandshake::start() { return encode_frame(FrameType::kHello, encode_hello(client_nonce_, key_)); }

std::string ClientHandshake::feed(const void* data, size_t len) {
  return feed_frames(reader_, data, len, [this] { return state_ == State::kRunning; }, [this] { return on_frame(); },
                     [this](const std::string& why) { return fail(why); });
}

std::string ClientHandshake::on_frame() {
  const FrameType type = reader_.type();
  const std::string body = reader_.body();
  reader_.clear();
  if (type == FrameType::kRefuse) {
    std::string reason = body.substr(0, kMaxReasonBytes);
    for (char& c : reason)
      if (c < 0x20 || c > 0x7e) c = '?';  // the peer's text is printed, never interpreted
    const bool auth = reason.find("authentication") != std::string::npos;
    return fail("refused: " + reason, auth);
  }
  if (!have_challenge_) {
    if (type != FrameType::kChallenge)
      throw HandshakeError("handshake: " + frame_name(type) + " before CHALLENGE");
    server_nonce_ = nonce_of(body, "CHALLENGE");
    have_challenge_ = true;
    sent_mac_ = client_mac(secret_, key_, client_nonce_, server_nonce_, local_);
    return encode_frame(FrameType::kProof, encode_proof(sent_mac_, local_));
  }
  if (type != FrameType::kAccept)
    throw HandshakeError("handshake: " + frame_name(type) + " where ACCEPT was due");
  Mac mac{};
  Endpoint server;
  decode_proof(body, &mac, &server);
  if (!same_mac(mac, server_mac(secret_, key_, client_nonce_, server_nonce_, sent_mac_, server)))
    return fail("authentication failed: the peer's proof does not match this side's secret", true);
  peer_ = std::move(server);
  state_ = State::kAccepted;
  return "";
}

std::string ClientHandshake::fail(const std::string& why, bool auth) {
  state_ = State::kFailed;
  error_ = why;
  auth_failed_ = auth;
  return "";
}

}  // namespace zenflow::transport::handshake
