// The AdamW update of one element on the device: adamw_kernel.h's formula, operation by operation.
//
// Every operation is an explicitly rounded intrinsic, so nvcc cannot contract a
// multiply and an add into an FMA: results equal the host scalar kernel's bit for bit
// (both use IEEE round-to-nearest sqrt and division, and neither flushes denormals).
#pragma once

#include "worker/engine/cuda/cuda_kernels.h"

namespace zenflow::engine::cuda_kernels {

// Updates m and v in place and returns the new parameter value. `g` is already scaled.
__device__ __forceinline__ float adamw_update(float p, float g, float& m, float& v,
                                              const DeviceAdamWCoeffs& c) {
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), c.inv_sqrt_bc2), c.eps);
  return __fsub_rn(__fmul_rn(p, c.decay), __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

}  // namespace zenflow::engine::cuda_kernels
