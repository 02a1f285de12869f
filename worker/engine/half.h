// bf16 / fp16 <-> fp32 conversions and the tagged gradient reference used by the kernels.
#pragma once

#include <cstdint>
#include <cstring>

namespace zenflow::engine {

enum class HalfKind { kBF16, kFP16 };

// A read-only gradient span in the dtype it arrived in from the device.
struct GradRef {
  enum class Type { kF32, kBF16, kFP16 };
  const void* data = nullptr;
  Type type = Type::kF32;

  static GradRef f32(const float* p) { return {p, Type::kF32}; }
  static GradRef bf16(const uint16_t* p) { return {p, Type::kBF16}; }
  static GradRef fp16(const uint16_t* p) { return {p, Type::kFP16}; }
  GradRef offset(int64_t elements) const {
    const size_t bytes = type == Type::kF32 ? 4 : 2;
    return {static_cast<const char*>(data) + elements * static_cast<int64_t>(bytes), type};
  }
};

// Round-to-nearest-even fp32 -> bf16; NaN stays NaN (quiet bit set, sign and top
// payload bits kept), Inf stays Inf, finite values above the largest bf16 round to Inf.
inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  // Both candidates are computed and one selected, so loops over this vectorize.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

inline float bf16_to_float(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even fp32 -> fp16 (overflow to Inf at 65520); NaN stays NaN with
// the quiet bit set and the top payload bits kept. Bit-exact with x86 VCVTPS2PH.
uint16_t float_to_fp16(float f);
// Exact fp16 -> fp32; a NaN comes back quiet (bit-exact with x86 VCVTPH2PS).
float fp16_to_float(uint16_t h);

}  // namespace zenflow::engine
