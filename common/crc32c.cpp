// CRC32C: SSE4.2 instructions or slicing-by-8 tables (see crc32c.h).
#include "common/crc32c.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "common/input_file.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace zenflow {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reversed Castagnoli polynomial

struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

#if defined(__x86_64__)
// The CRC32 instruction has a latency of 3 cycles and a throughput of 1 per cycle, so one
// dependency chain runs at a third of the instruction's speed. Three lanes of kLane bytes
// each run as independent chains; their registers are then joined by "shifting" a lane's
// register over the kLane bytes that follow it, a linear map over GF(2) precomputed as
// four byte tables (what processing kLane zero bytes does to each byte of the register).
constexpr size_t kLane = 4096;

struct LaneShift {
  std::array<std::array<uint32_t, 256>, 4> t{};
  LaneShift() {
    const auto& tab = tables().t[0];
    auto zeros = [&](uint32_t reg) {  // the raw register after kLane zero bytes
      for (size_t i = 0; i < kLane; ++i) reg = (reg >> 8) ^ tab[reg & 0xFF];
      return reg;
    };
    uint32_t basis[32];
    for (int b = 0; b < 32; ++b) basis[b] = zeros(1u << b);
    for (int k = 0; k < 4; ++k)
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int b = 0; b < 8; ++b)
          if (v & (1u << b)) r ^= basis[8 * k + b];
        t[k][v] = r;
      }
  }
  uint32_t operator()(uint32_t reg) const {
    return t[0][reg & 0xFF] ^ t[1][(reg >> 8) & 0xFF] ^ t[2][(reg >> 16) & 0xFF] ^ t[3][reg >> 24];
  }
};

const LaneShift& lane_shift() {
  static const LaneShift s;
  return s;
}

__attribute__((target("sse4.2"))) uint64_t crc32c_sse42_run(uint64_t c, const unsigned char* p, size_t n) {
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
  }
  for (; n > 0; --n) c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
  return c;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const unsigned char* p, size_t n) {
  uint64_t c = static_cast<uint32_t>(~crc);  // the raw register
  if (n >= 3 * kLane) {
    const LaneShift& shift = lane_shift();
    for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      for (size_t i = 0; i < kLane; i += 8) {
        uint64_t w0, w1, w2;
        std::memcpy(&w0, p + i, 8);
        std::memcpy(&w1, p + kLane + i, 8);
        std::memcpy(&w2, p + 2 * kLane + i, 8);
        c0 = _mm_crc32_u64(c0, w0);
        c1 = _mm_crc32_u64(c1, w1);
        c2 = _mm_crc32_u64(c2, w2);
      }
      c = shift(shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^ static_cast<uint32_t>(c2);
    }
  }
  return ~static_cast<uint32_t>(crc32c_sse42_run(c, p, n));
}
#endif

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  const auto& t = tables().t;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  while (n >= 8) {
    uint32_t lo, hi;
    std::memcpy(&lo, p, 4);
    std::memcpy(&hi, p + 4, 4);
    lo ^= c;
    c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
        t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return ~c;
}

bool crc32c_hardware() {
#if defined(__x86_64__)
  static const bool has = __builtin_cpu_supports("sse4.2");
  return has;
#else
  return false;
#endif
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (crc32c_hardware()) return crc32c_sse42(crc, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_extend_portable(crc, data, n);
}

FileChecksum checksum_file(const std::string& path) {
  const int fd = open_regular_file(path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  constexpr size_t kBlock = 4 << 20;
  std::unique_ptr<unsigned char[]> buf(new unsigned char[kBlock]);
  FileChecksum out;
  for (;;) {
    const ssize_t n = ::read(fd, buf.get(), kBlock);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw InputError(path, std::string("read failed: ") + std::strerror(err));
    }
    if (n == 0) break;
    out.crc32c = crc32c_extend(out.crc32c, buf.get(), static_cast<size_t>(n));
    out.bytes += n;
  }
  ::close(fd);
  return out;
}

std::string crc32c_hex(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc);
  return buf;
}

}  // namespace zenflow
