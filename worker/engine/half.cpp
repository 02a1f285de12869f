// fp16 <-> fp32 conversions, bit-exact with the x86 F16C instructions (VCVTPS2PH with
// round-to-nearest-even, VCVTPH2PS) that the SIMD kernels use.
#include "worker/engine/half.h"

#include <cmath>

namespace zenflow::engine {

uint16_t float_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  // NaN: quiet NaN keeping the payload's top 10 bits (what VCVTPS2PH produces).
  if (x > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  // 65520 (= 0x477ff000) and above round to Inf; 65504 is fp16's largest finite value.
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x < 0x38800000u) {  // below 2^-14: subnormal or zero in fp16
    float a;
    std::memcpy(&a, &x, 4);
    // Exact scaling by 2^24, then round-to-nearest-even to an integer mantissa (1024
    // carries into the smallest normal, which is the right encoding).
    const float scaled = a * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  const uint32_t lsb = (x >> 13) & 1u;
  x += 0xfffu + lsb;
  return static_cast<uint16_t>(sign | ((x - 0x38000000u) >> 13));
}

float fp16_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t out;
  if (exp == 0) {
    const float f = static_cast<float>(mant) / 16777216.0f;  // exact: mant * 2^-24
    std::memcpy(&out, &f, 4);
    out |= sign;
  } else if (exp == 31) {
    // Inf stays Inf; NaN becomes a quiet NaN with its payload (as VCVTPH2PS does).
    out = sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else {
    out = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &out, 4);
  return f;
}

}  // namespace zenflow::engine
