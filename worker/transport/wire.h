// The optimizer-node wire protocol's message header (docs/design.md §10).
//
// Every message between a worker's remote host optimizer and a zenflow-optimizer node is
// one active message whose header is a 64-byte little-endian WireHeader; the payload (raw
// fp32/bf16 data, or a message-specific descriptor, see optimizer_protocol.h) follows it.
// decode() accepts only a well-formed header: right magic and version, a known type,
// a payload length that matches, counts within the limits the receiver passes, and, when
// kFlagCrc is set, a crc32c over the header (with crc = 0) and the payload that matches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace zenflow::transport {

constexpr uint32_t kWireMagic = 0x504f465au;  // "ZFOP" little-endian
// 2: STATE descriptors gained mode 2 (a node-side re-pack); ends of different versions
// refuse each other at the first message instead of failing at a re-selection.
// 3: a step span's output may be the fp32 master (OpSpan::out_kind kOutMaster).
constexpr uint16_t kWireVersion = 3;
constexpr size_t kWireHeaderBytes = 64;

enum class MsgType : uint16_t {
  kHello = 1,        // W->N: session request (payload: HelloBody)
  kWelcome = 2,      // N->W: session accepted (payload: WelcomeBody)
  kError = 3,        // both: payload = UTF-8 text; aux = ErrorCode
  kAccumulate = 4,   // W->N: an accumulate op (payload: op descriptor)
  kStep = 5,         // W->N: a step op (payload: op descriptor)
  kGrad = 6,         // W->N: gradient data for op `seq`: span `aux`, elements [offset, offset + count)
  kParams = 7,       // N->W: output of step `seq` (OpSpan::out_kind): span `aux`, [offset, offset + count)
  kDone = 8,         // N->W: op `seq` completed; scale = seconds it ran (negative: unknown)
  kStateRead = 9,    // W->N: read a state range or columns (payload: state descriptor)
  kStateWrite = 10,  // W->N: write a state range or columns (payload: descriptor, then kData)
  kData = 11,        // both: state data for op `seq`: [offset, offset + count) fp32 of its layout
  kPing = 12,        // both: liveness; offset = sender's monotonic microseconds
  kPong = 13,        // both: answer to kPing (offset echoed)
  kBye = 14,         // W->N: the session ends; the node frees its state
  kComputed = 15,    // N->W: op `seq`'s kernels are done; the rest of its reply data (a
                     // step's PARAMS leave as its chunks finish) and DONE follow
};
constexpr uint16_t kMaxMsgType = 15;

enum : uint32_t {
  kFlagCrc = 1u << 0,        // crc32c covers header and payload
  kFlagOverwrite = 1u << 1,  // kAccumulate: acc = grad * scale (first step of a window)
  kFlagLast = 1u << 2,       // the last message of a multi-message reply
};

enum class ErrorCode : uint32_t {
  kNone = 0,
  kBadMessage = 1,     // a header or payload the receiver rejected
  kUnauthorized = 2,   // wrong token (no longer sent: the transport handshake proves the token)
  kStaleEpoch = 3,     // job_epoch older than the node has seen for that job
  kNoMemory = 4,       // the session's state does not fit the node's --memory-limit
  kBadLayout = 5,      // offsets/counts outside the session's state
  kInternal = 6,
};

struct WireHeader {
  uint32_t magic = kWireMagic;
  uint16_t version = kWireVersion;
  MsgType type = MsgType::kPing;
  uint64_t job_epoch = 0;
  uint32_t session = 0;
  uint32_t flags = 0;
  uint64_t seq = 0;       // op sequence number within the session (0 for session messages)
  uint64_t offset = 0;    // element offset (type-specific)
  uint64_t count = 0;     // element count (type-specific)
  uint32_t payload_bytes = 0;
  uint32_t aux = 0;       // type-specific: span index, buffer id, error code
  float scale = 0.0f;     // type-specific: accumulate scale, seconds run
  uint32_t crc32c = 0;
};

class WireError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a receiver accepts; decode() rejects anything beyond with a WireError naming the
// field, its value and the limit.
struct WireLimits {
  uint64_t max_payload_bytes = uint64_t{1} << 32;  // exclusive
  uint64_t max_offset_plus_count = ~uint64_t{0};   // offset + count must not exceed (no overflow)
};

// Writes h into out[0..64) (little-endian). With kFlagCrc in h.flags, computes the crc
// over the header (crc field 0) and payload[0..payload_len) and stores it.
void encode(const WireHeader& h, unsigned char out[kWireHeaderBytes], const void* payload = nullptr,
            size_t payload_len = 0);

// Parses a received header of `len` bytes. `payload_len` is the payload that arrived with
// it (must equal payload_bytes); `payload` is checked against the crc when kFlagCrc is
// set (pass nullptr to check it later with check_crc). Throws WireError.
WireHeader decode(const void* data, size_t len, size_t payload_len, const WireLimits& limits = {},
                  const void* payload = nullptr);

// Verifies a kFlagCrc header's crc against its payload (no-op without the flag). Throws WireError.
void check_crc(const void* header_bytes, const void* payload, size_t payload_len);

// CRC-32C (Castagnoli), as in iSCSI/ext4: crc32c("123456789") == 0xE3069283.
uint32_t crc32c(const void* data, size_t len, uint32_t crc = 0);

const char* msg_type_name(MsgType t);  // "HELLO", "GRAD", ...; "UNKNOWN" otherwise

}  // namespace zenflow::transport
