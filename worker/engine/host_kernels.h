// Internal: the per-ISA builds of the host kernels and the dispatch table between them.
//
// adamw_kernel.cpp and accumulate_kernel.cpp hold the public entry points and the
// portable scalar build; host_kernels_avx2.cpp and host_kernels_avx512.cpp hold the
// SIMD builds (compiled with per-file ISA flags, reached only after CPUID says the CPU
// can run them). All builds are compiled with -ffp-contract=off and perform, per
// element, exactly the operations of adamw_element() below in that order, so they
// agree bit for bit with each other and across any split of a span into chunks.
#pragma once

#include <cstdint>

#include "worker/engine/accumulate_kernel.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/half.h"
#include "worker/engine/host_isa.h"

namespace zenflow::engine::host_kernels {

using AdamWStepFn = void (*)(const AdamWSpan&, const AdamWCoeffs&, float grad_scale);
using AdamWWindowEndFn = void (*)(const AdamWSpan&, const float* acc, const AdamWCoeffs&, float grad_scale);
using AccumulateFn = void (*)(float* acc, GradRef g, int64_t n, float scale, bool overwrite);

struct Table {
  AdamWStepFn adamw_step;
  AdamWWindowEndFn adamw_window_end;
  AccumulateFn accumulate;
};

// The table of the active ISA (see host_isa.h). Lock-free after the first call.
const Table& active_table();

// Scalar builds (adamw_kernel.cpp, accumulate_kernel.cpp).
void adamw_step_scalar(const AdamWSpan& s, const AdamWCoeffs& c, float grad_scale);
void adamw_window_end_scalar(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float grad_scale);
void accumulate_scalar(float* acc, GradRef g, int64_t n, float scale, bool overwrite);

#if defined(__x86_64__)
void adamw_step_avx2(const AdamWSpan& s, const AdamWCoeffs& c, float grad_scale);
void adamw_window_end_avx2(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float grad_scale);
void accumulate_avx2(float* acc, GradRef g, int64_t n, float scale, bool overwrite);

void adamw_step_avx512(const AdamWSpan& s, const AdamWCoeffs& c, float grad_scale);
void adamw_window_end_avx512(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float grad_scale);
void accumulate_avx512(float* acc, GradRef g, int64_t n, float scale, bool overwrite);
#endif

// Write-only output streams (the bf16/fp16 copy of p, the accumulator when a window
// starts with overwrite=true) are written with non-temporal stores when one call covers
// at least this many elements, and with ordinary stores below it. Measured on the
// 2-vCPU Sapphire Rapids dev VM, 2 threads: streaming made accumulate(overwrite) 10-45%
// faster from 512K elements per call up (no read-for-ownership of acc) and the bf16 copy
// up to 8% faster, but made a cache-resident accumulate (128K elements per call) 1.8x
// slower. Streaming the in-place p, m, v stores was 25-40% slower and is not done.
constexpr int64_t kStreamMinElements = int64_t{1} << 18;

// The AdamW update of one element, in the contract's order (adamw_kernel.h). g is the
// already scaled gradient. The SIMD builds perform the same operations lane-wise.
inline void adamw_element(float& p, float& m, float& v, float g, const AdamWCoeffs& c) {
  const float m_new = c.beta1 * m + c.one_minus_beta1 * g;
  const float v_new = c.beta2 * v + c.one_minus_beta2 * g * g;
  const float denom = __builtin_sqrtf(v_new) * c.inv_sqrt_bc2 + c.eps;
  p = p * c.decay - c.step_size * m_new / denom;
  m = m_new;
  v = v_new;
}

}  // namespace zenflow::engine::host_kernels
