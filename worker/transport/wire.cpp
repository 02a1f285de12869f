// The optimizer-node wire header: explicit little-endian packing and crc32c (wire.h).
#include "worker/transport/wire.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#include <nmmintrin.h>
#endif

namespace zenflow::transport {
namespace {

// Byte offsets of the header fields; the layout is the protocol, not a struct's.
constexpr size_t kOffMagic = 0, kOffVersion = 4, kOffType = 6, kOffJobEpoch = 8, kOffSession = 16,
                 kOffFlags = 20, kOffSeq = 24, kOffOffset = 32, kOffCount = 40, kOffPayloadBytes = 48,
                 kOffAux = 52, kOffScale = 56, kOffCrc = 60;

void put16(unsigned char* p, uint16_t v) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
void put32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
uint16_t get16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get32(const unsigned char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Slicing-by-8 tables for the reflected Castagnoli polynomial 0x82F63B78.
using CrcTables = std::array<std::array<uint32_t, 256>, 8>;
const CrcTables& crc_tables() {
  static const CrcTables tables = [] {
    CrcTables t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    return t;
  }();
  return tables;
}

// Works on the inverted register (crc ^ ~0), as both implementations below do.
uint32_t crc32c_table(const unsigned char* p, size_t len, uint32_t c) {
  const CrcTables& t = crc_tables();
  while (len >= 8) {
    const uint32_t lo = c ^ get32(p);
    const uint32_t hi = get32(p + 4);
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    len -= 8;
  }
  while (len--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t len, uint32_t c) {
  uint64_t c64 = c;
  while (len >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);  // x86 is little-endian: the same bytes the table path reads
    c64 = _mm_crc32_u64(c64, word);
    p += 8;
    len -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (len--) c = _mm_crc32_u8(c, *p++);
  return c;
}

bool have_sse42() {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_2);
  }();
  return yes;
}
#endif

uint32_t header_crc(const unsigned char* header, const void* payload, size_t payload_len) {
  unsigned char copy[kWireHeaderBytes];
  std::memcpy(copy, header, kWireHeaderBytes);
  put32(copy + kOffCrc, 0);
  const uint32_t c = crc32c(copy, kWireHeaderBytes);
  return payload_len ? crc32c(payload, payload_len, c) : c;
}

}  // namespace

uint32_t crc32c(const void* data, size_t len, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc32c_sse42(p, len, c);
#endif
  return ~crc32c_table(p, len, c);
}

void encode(const WireHeader& h, unsigned char out[kWireHeaderBytes], const void* payload,
            size_t payload_len) {
  put32(out + kOffMagic, h.magic);
  put16(out + kOffVersion, h.version);
  put16(out + kOffType, static_cast<uint16_t>(h.type));
  put64(out + kOffJobEpoch, h.job_epoch);
  put32(out + kOffSession, h.session);
  put32(out + kOffFlags, h.flags);
  put64(out + kOffSeq, h.seq);
  put64(out + kOffOffset, h.offset);
  put64(out + kOffCount, h.count);
  put32(out + kOffPayloadBytes, h.payload_bytes);
  put32(out + kOffAux, h.aux);
  uint32_t scale_bits;
  std::memcpy(&scale_bits, &h.scale, 4);
  put32(out + kOffScale, scale_bits);
  put32(out + kOffCrc, h.crc32c);
  if (h.flags & kFlagCrc) put32(out + kOffCrc, header_crc(out, payload, payload_len));
}

WireHeader decode(const void* data, size_t len, size_t payload_len, const WireLimits& limits,
                  const void* payload) {
  if (len != kWireHeaderBytes)
    throw WireError("wire: header is " + std::to_string(len) + " bytes, expected " +
                    std::to_string(kWireHeaderBytes));
  const auto* p = static_cast<const unsigned char*>(data);
  WireHeader h;
  h.magic = get32(p + kOffMagic);
  if (h.magic != kWireMagic)
    throw WireError("wire: bad magic " + hex32(h.magic) + " (expected " + hex32(kWireMagic) + ")");
  h.version = get16(p + kOffVersion);
  if (h.version != kWireVersion)
    throw WireError("wire: version " + std::to_string(h.version) + " (this build speaks " +
                    std::to_string(kWireVersion) + ")");
  const uint16_t type = get16(p + kOffType);
  if (type == 0 || type > kMaxMsgType) throw WireError("wire: unknown message type " + std::to_string(type));
  h.type = static_cast<MsgType>(type);
  h.job_epoch = get64(p + kOffJobEpoch);
  h.session = get32(p + kOffSession);
  h.flags = get32(p + kOffFlags);
  h.seq = get64(p + kOffSeq);
  h.offset = get64(p + kOffOffset);
  h.count = get64(p + kOffCount);
  h.payload_bytes = get32(p + kOffPayloadBytes);
  h.aux = get32(p + kOffAux);
  const uint32_t scale_bits = get32(p + kOffScale);
  std::memcpy(&h.scale, &scale_bits, 4);
  h.crc32c = get32(p + kOffCrc);

  if (h.payload_bytes != payload_len)
    throw WireError("wire: payload_bytes " + std::to_string(h.payload_bytes) + " but " +
                    std::to_string(payload_len) + " arrived");
  if (h.payload_bytes >= limits.max_payload_bytes)
    throw WireError("wire: payload_bytes " + std::to_string(h.payload_bytes) + " not below the limit " +
                    std::to_string(limits.max_payload_bytes));
  if (h.offset > ~uint64_t{0} - h.count)
    throw WireError("wire: offset " + std::to_string(h.offset) + " + count " + std::to_string(h.count) +
                    " overflows 64 bits");
  if (h.offset + h.count > limits.max_offset_plus_count)
    throw WireError("wire: offset " + std::to_string(h.offset) + " + count " + std::to_string(h.count) +
                    " exceeds " + std::to_string(limits.max_offset_plus_count));
  if ((h.flags & kFlagCrc) && payload != nullptr) check_crc(p, payload, payload_len);
  return h;
}

void check_crc(const void* header_bytes, const void* payload, size_t payload_len) {
  const auto* p = static_cast<const unsigned char*>(header_bytes);
  if (!(get32(p + kOffFlags) & kFlagCrc)) return;
  if (payload == nullptr && payload_len > 0)
    throw WireError("wire: crc check of a " + std::to_string(payload_len) +
                    "-byte payload without the payload");
  const uint32_t stored = get32(p + kOffCrc);
  const uint32_t computed = header_crc(p, payload, payload_len);
  if (stored != computed)
    throw WireError("wire: crc mismatch (header " + hex32(stored) + ", computed " + hex32(computed) + ")");
}

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::kHello:
      return "HELLO";
    case MsgType::kWelcome:
      return "WELCOME";
    case MsgType::kError:
      return "ERROR";
    case MsgType::kAccumulate:
      return "ACCUMULATE";
    case MsgType::kStep:
      return "STEP";
    case MsgType::kGrad:
      return "GRAD";
    case MsgType::kParams:
      return "PARAMS";
    case MsgType::kDone:
      return "DONE";
    case MsgType::kStateRead:
      return "STATE_READ";
    case MsgType::kStateWrite:
      return "STATE_WRITE";
    case MsgType::kData:
      return "DATA";
    case MsgType::kPing:
      return "PING";
    case MsgType::kPong:
      return "PONG";
    case MsgType::kBye:
      return "BYE";
    case MsgType::kComputed:
      return "COMPUTED";
  }
  return "UNKNOWN";
}

}  // namespace zenflow::transport
