// Element types of the CUDA kernels (fp32, bf16, fp16 as raw bits) and DType dispatch.
//
// Conversions match the host's (worker/engine/half.h) bit for bit, NaN handling
// included, so a weight rounded on the device equals one rounded on the host.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "worker/engine/cuda/cuda_kernels.h"

namespace zenflow::engine::cuda_kernels {

struct F32 {
  using Storage = float;
  static __device__ __forceinline__ float load(float x) { return x; }
  static __device__ __forceinline__ float store(float f) { return f; }
};

struct BF16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float load(uint16_t h) {
    return __uint_as_float(static_cast<uint32_t>(h) << 16);
  }
  // Round to nearest even; NaN stays NaN with the quiet bit set (as float_to_bf16()).
  static __device__ __forceinline__ uint16_t store(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
};

struct F16 {
  using Storage = uint16_t;
  static __device__ __forceinline__ float load(uint16_t h) { return __half2float(__ushort_as_half(h)); }
  // Round to nearest even; NaN becomes sign | 0x7e00 (as float_to_fp16()).
  static __device__ __forceinline__ uint16_t store(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u);
    return __half_as_ushort(__float2half_rn(f));
  }
};

// Calls fn(F32{}), fn(BF16{}) or fn(F16{}) for `dtype`; cudaErrorInvalidValue otherwise.
template <typename Fn>
cudaError_t dispatch_dtype(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kF32:
      return fn(F32{});
    case DType::kBF16:
      return fn(BF16{});
    case DType::kF16:
      return fn(F16{});
  }
  return cudaErrorInvalidValue;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace zenflow::engine::cuda_kernels
