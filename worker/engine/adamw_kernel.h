// AdamW step over contiguous fp32 spans: the one AdamW implementation in zenflow.
//
// Every updater (the host updater, the CPU "device" updater, offload mode) calls
// adamw_step() or adamw_window_end(); the CUDA kernels use the same coefficients and
// the same formula. Thread safety: the functions are pure over their arguments; callers
// may run them concurrently on disjoint spans (that is how HostThreadPool splits work).
//
// Speed: explicit AVX-512 / AVX2 / scalar builds chosen at run time (host_isa.h). Each
// element is computed with the same fp32 operations in the order written below, every
// operation rounded (no FMA contraction, IEEE sqrt and division), so every ISA, thread
// count and chunking gives bitwise-identical results. A CUDA kernel matches bit for bit
// when it uses __fmul_rn/__fadd_rn/__fsqrt_rn/__fdiv_rn in the same order.
#pragma once

#include <cstdint>

#include "common/engine_defaults.h"
#include "worker/engine/half.h"

namespace zenflow::engine {

class HostThreadPool;

// Hyper-parameters of one AdamW call (torch.optim.AdamW's names and defaults).
struct AdamWParams {
  double lr = 1e-3;
  double beta1 = engine_defaults::kBeta1;
  double beta2 = engine_defaults::kBeta2;
  double eps = engine_defaults::kEps;
  double weight_decay = 0.0;
};

// Per-call float coefficients, computed once in double precision from the params and
// the updater's own 1-based step count t. All updaters use these exact floats, so host
// and device updates of the same column give the same numbers.
struct AdamWCoeffs {
  float beta1 = static_cast<float>(engine_defaults::kBeta1);
  float beta2 = static_cast<float>(engine_defaults::kBeta2);
  float one_minus_beta1 = static_cast<float>(1.0 - engine_defaults::kBeta1);
  float one_minus_beta2 = static_cast<float>(1.0 - engine_defaults::kBeta2);
  float decay = 1.0f;         // 1 - lr * weight_decay (decoupled weight decay)
  float step_size = 1e-3f;    // lr / (1 - beta1^t)
  float inv_sqrt_bc2 = 1.0f;  // 1 / sqrt(1 - beta2^t)
  float eps = static_cast<float>(engine_defaults::kEps);

  static AdamWCoeffs make(const AdamWParams& params, int64_t step);
};

// The update, element by element (gs = grad_scale):
//   g  = grad[i] * gs
//   m  = beta1 * m + one_minus_beta1 * g
//   v  = beta2 * v + one_minus_beta2 * g * g
//   p  = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// and, when half_out is set, half_out[i] = round_to_nearest_even(p) in `half_kind`.
//
// `grad` may alias nothing else. p, m, v are updated in place.
struct AdamWSpan {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  GradRef grad;                  // fp32, bf16 or fp16 gradient
  uint16_t* half_out = nullptr;  // optional low-precision copy of updated p
  HalfKind half_kind = HalfKind::kBF16;
  int64_t n = 0;

  // Elements [begin, end) of this span (0 <= begin <= end <= n; not checked).
  AdamWSpan slice(int64_t begin, int64_t end) const {
    AdamWSpan s = *this;
    s.p = p + begin;
    s.m = m + begin;
    s.v = v + begin;
    s.grad = grad.offset(begin);
    s.half_out = half_out ? half_out + begin : nullptr;
    s.n = end - begin;
    return s;
  }
};

void adamw_step(const AdamWSpan& span, const AdamWCoeffs& c, float grad_scale = 1.0f);

// Window-end fusion: the gradient is (acc[i] + last[i]) * grad_scale, where `acc` holds
// the window's sum of earlier gradients and `last` is the window's final gradient.
// One pass over memory instead of an accumulate pass followed by an AdamW pass.
// `acc` is read, not written.
void adamw_window_end(const AdamWSpan& span, const float* acc, const AdamWCoeffs& c, float grad_scale);

// The same, split over `pool` in static chunks whose boundaries fall on cache lines
// (for 64-byte aligned spans); results are bitwise identical to the single-threaded
// calls. Blocks until done; exceptions from the kernels are rethrown here. Call from
// one thread at a time per pool (see HostThreadPool).
void adamw_step(HostThreadPool& pool, const AdamWSpan& span, const AdamWCoeffs& c, float grad_scale = 1.0f);
void adamw_window_end(HostThreadPool& pool, const AdamWSpan& span, const float* acc, const AdamWCoeffs& c,
                      float grad_scale);

// Chunk granularity (elements) the pooled kernels pass to HostThreadPool::parallel_for:
// a whole cache line of fp32 and of bf16/fp16 arrays.
constexpr int64_t kHostChunkAlign = 32;

}  // namespace zenflow::engine
