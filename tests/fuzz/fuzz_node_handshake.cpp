// libFuzzer target: the connection handshake (worker/transport/handshake.h) on arbitrary
// bytes, as a node's listening socket or a connecting worker receives them from anyone on
// the network. Run by scripts/fuzz.sh (clang, -fsanitize=fuzzer,address,undefined).
//
// Properties, each a crash (abort) when broken:
//  * no exception escapes a state machine, no out-of-bounds read, no undefined behaviour;
//  * what a side sends is well-formed frames only;
//  * a side accepts only a peer that proved the secret: the node never accepts bytes that
//    carry no valid client mac (the secret is the fuzzer's to guess, the node's nonce fixed);
//    and a client and a node run against each other accept iff their secrets are equal,
//    each then holding the other's endpoint exactly.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "worker/transport/handshake.h"

namespace {

using namespace zenflow::transport::handshake;

const char kSecret[] = "fuzz-node-secret";

[[noreturn]] void broken(const char* what) {
  std::fprintf(stderr, "fuzz_node_handshake: %s\n", what);
  std::abort();
}

void check(bool ok, const char* what) {
  if (!ok) broken(what);
}

Nonce fixed_nonce(uint8_t seed) {
  Nonce n{};
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(seed + 31 * i);
  return n;
}

const Endpoint kNode{std::string(300, 'n'), 0x1111222233334444u};
const Endpoint kWorker{std::string(200, 'w'), 0x5555666677778888u};

// Every frame in `out` decodes, and they fill it exactly.
void check_frames(const std::string& out) {
  size_t at = 0;
  while (at < out.size()) {
    check(out.size() - at >= kFrameHeaderBytes, "a side sent a truncated frame header");
    FrameHeader h;
    try {
      h = decode_frame_header(out.data() + at);
    } catch (const HandshakeError&) {
      broken("a side sent a frame it would refuse");
    }
    at += kFrameHeaderBytes + h.body_bytes;
  }
  check(at == out.size(), "a side sent a truncated frame body");
}

// The node against the bytes, fed in chunks of `chunk`.
// The node's secrets: its own token (key "") and one job attempt's grant.
const char kGrantKey[] = "j-000001/1";
const char kGrantSecret[] = "fuzz-grant-secret";
std::optional<std::string> node_secret_for(const std::string& key) {
  if (key.empty()) return std::string(kSecret);
  if (key == kGrantKey) return std::string(kGrantSecret);
  return std::nullopt;
}

void fuzz_server(const uint8_t* data, size_t size, size_t chunk) {
  ServerHandshake s(node_secret_for, kNode, fixed_nonce(1));
  for (size_t at = 0; at < size && s.state() == State::kRunning; at += chunk) {
    const std::string out = s.feed(data + at, std::min(chunk, size - at));
    check_frames(out);
  }
  if (s.state() == State::kAccepted) {
    // Only a HELLO naming a key the node holds and a PROOF whose mac is that key's secret's
    // over the HELLO's nonce and the node's get here: recompute it from the first two frames.
    check(size >= 2 * kFrameHeaderBytes + kNonceBytes + 1, "accepted without a HELLO and a PROOF");
    const FrameHeader hello = decode_frame_header(data);
    Nonce client_nonce{};
    std::string key;
    decode_hello(std::string(reinterpret_cast<const char*>(data) + kFrameHeaderBytes, hello.body_bytes),
                 &client_nonce, &key);
    check(key == s.key(), "accepted under another key");
    const std::optional<std::string> secret = node_secret_for(key);
    check(secret.has_value(), "accepted a key the node holds no secret for");
    const uint8_t* proof = data + kFrameHeaderBytes + hello.body_bytes;
    const FrameHeader h = decode_frame_header(proof);
    Mac mac{};
    Endpoint client;
    decode_proof(std::string(reinterpret_cast<const char*>(proof) + kFrameHeaderBytes, h.body_bytes), &mac,
                 &client);
    check(same_mac(mac, client_mac(*secret, key, client_nonce, fixed_nonce(1), client)), "accepted a wrong mac");
    check(client.address == s.peer().address && client.channel == s.peer().channel,
          "accepted another endpoint");
  }
  if (s.state() == State::kFailed) check(!s.error().empty(), "a failure without a reason");
}

// A client against the bytes.
void fuzz_client(const uint8_t* data, size_t size, size_t chunk) {
  ClientHandshake c(kGrantSecret, kGrantKey, kWorker, fixed_nonce(2));
  check_frames(c.start());
  for (size_t at = 0; at < size && c.state() == State::kRunning; at += chunk)
    check_frames(c.feed(data + at, std::min(chunk, size - at)));
  if (c.state() == State::kAccepted)
    check(c.peer().channel != 0 && c.peer().address.size() <= kMaxAddressBytes,
          "an accepted node outside the limits");
  if (c.state() == State::kFailed) check(!c.error().empty(), "a failure without a reason");
}

// A client and a node whose secrets are the two halves of the input, through a wire that
// delivers in chunks of `chunk`.
void fuzz_pair(const uint8_t* data, size_t size, size_t chunk) {
  const std::string a(reinterpret_cast<const char*>(data), size / 2);
  const std::string b(reinterpret_cast<const char*>(data) + size / 2, size - size / 2);
  ClientHandshake c(a, "", kWorker, fixed_nonce(3));
  ServerHandshake s(only_secret(b), kNode, fixed_nonce(4));
  std::string to_server = c.start(), to_client;
  for (int round = 0; round < 8 && (!to_server.empty() || !to_client.empty()); ++round) {
    for (size_t at = 0; at < to_server.size(); at += chunk)
      to_client += s.feed(to_server.data() + at, std::min(chunk, to_server.size() - at));
    to_server.clear();
    for (size_t at = 0; at < to_client.size(); at += chunk)
      to_server += c.feed(to_client.data() + at, std::min(chunk, to_client.size() - at));
    to_client.clear();
  }
  if (a == b) {
    check(s.state() == State::kAccepted && c.state() == State::kAccepted, "equal secrets did not connect");
    check(s.peer().address == kWorker.address && s.peer().channel == kWorker.channel,
          "the node got another endpoint");
    check(c.peer().address == kNode.address && c.peer().channel == kNode.channel,
          "the client got another endpoint");
  } else {
    check(s.state() == State::kFailed && s.authentication_failed(), "the node accepted a different secret");
    check(c.state() == State::kFailed && c.authentication_failed(),
          "the client accepted a refusal as success");
    check(c.error().find("authentication") != std::string::npos,
          "the client's error does not say authentication");
  }
}

void write_seed(const char* dir, const char* name, uint8_t mode, const std::string& bytes) {
  const std::string path = std::string(dir) + "/" + name;
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    const std::string all = std::string(1, static_cast<char>(mode)) + std::string(1, 7) + bytes;
    std::fwrite(all.data(), 1, all.size(), f);
    std::fclose(f);
  }
}

}  // namespace

// With ZENFLOW_FUZZ_SEEDS=DIR: a client's whole side (HELLO, PROOF with a valid mac for the
// node's fixed nonce), a node's (CHALLENGE, ACCEPT), a REFUSE, and a pair of secrets.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("ZENFLOW_FUZZ_SEEDS");
  if (dir == nullptr) return 0;
  const Nonce worker_nonce = fixed_nonce(9), node_nonce = fixed_nonce(1);
  const Mac cm = client_mac(kSecret, "", worker_nonce, node_nonce, kWorker);
  const std::string client_side = encode_frame(FrameType::kHello, encode_hello(worker_nonce, "")) +
                                  encode_frame(FrameType::kProof, encode_proof(cm, kWorker));
  write_seed(dir, "client-side", 0, client_side);
  const Mac gm = client_mac(kGrantSecret, kGrantKey, worker_nonce, node_nonce, kWorker);
  write_seed(dir, "client-side-grant", 0,
             encode_frame(FrameType::kHello, encode_hello(worker_nonce, kGrantKey)) +
                 encode_frame(FrameType::kProof, encode_proof(gm, kWorker)));
  write_seed(dir, "client-side-unknown-key", 0,
             encode_frame(FrameType::kHello, encode_hello(worker_nonce, "j-000002/1")) +
                 encode_frame(FrameType::kProof, encode_proof(gm, kWorker)));
  const Nonce client_nonce = fixed_nonce(2);
  const Mac wm = client_mac(kGrantSecret, kGrantKey, client_nonce, node_nonce, kWorker);
  const std::string node_side =
      encode_frame(FrameType::kChallenge, std::string(node_nonce.begin(), node_nonce.end())) +
      encode_frame(FrameType::kAccept,
                   encode_proof(server_mac(kGrantSecret, kGrantKey, client_nonce, node_nonce, wm, kNode), kNode));
  write_seed(dir, "node-side", 1, node_side);
  write_seed(dir, "refuse", 1, encode_frame(FrameType::kRefuse, "authentication failed"));
  write_seed(dir, "pair-equal", 2, "secretsecret");
  write_seed(dir, "pair-different", 2, "secretsecreT");
  return 0;
}

// Byte 0 chooses the side (0: the node, 1: a client, 2: a client and a node), byte 1 the
// chunk size the bytes arrive in; the rest is what arrives (or the two secrets).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t chunk = size_t{data[1]} + 1;
  try {
    switch (data[0] % 3) {
      case 0:
        fuzz_server(data + 2, size - 2, chunk);
        break;
      case 1:
        fuzz_client(data + 2, size - 2, chunk);
        break;
      default:
        fuzz_pair(data + 2, size - 2, chunk);
        break;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_node_handshake: %s\n", e.what());
    broken("an exception escaped a state machine");
  }
  return 0;
}
