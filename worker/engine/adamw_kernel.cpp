// AdamW step kernel: coefficients, the portable scalar build, and ISA dispatch.
#include "worker/engine/adamw_kernel.h"

#include <cmath>

#include "worker/engine/host_kernels.h"
#include "worker/engine/host_thread_pool.h"

namespace zenflow::engine {

AdamWCoeffs AdamWCoeffs::make(const AdamWParams& p, int64_t step) {
  AdamWCoeffs c;
  const double t = static_cast<double>(step);
  c.beta1 = static_cast<float>(p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  c.step_size = static_cast<float>(p.lr / (1.0 - std::pow(p.beta1, t)));
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(p.beta2, t)));
  c.eps = static_cast<float>(p.eps);
  return c;
}

namespace host_kernels {
namespace {

template <GradRef::Type kType>
inline float load_grad(const void* data, int64_t i) {
  if constexpr (kType == GradRef::Type::kF32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (kType == GradRef::Type::kBF16) {
    return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
  } else {
    return fp16_to_float(static_cast<const uint16_t*>(data)[i]);
  }
}

enum class HalfOut { kNone, kBF16, kFP16 };

// kWindowEnd: g = (acc[i] + grad[i]) * gs, else g = grad[i] * gs. Branch-free per
// element so that the compiler can vectorize it with baseline SSE2 (same IEEE results).
template <GradRef::Type kType, bool kWindowEnd, HalfOut kHalf>
void adamw_scalar(const AdamWSpan& s, const float* __restrict acc, const AdamWCoeffs& c, float gs) {
  float* __restrict p = s.p;
  float* __restrict m = s.m;
  float* __restrict v = s.v;
  const void* grad = s.grad.data;
  uint16_t* __restrict half = s.half_out;
  const int64_t n = s.n;
  for (int64_t i = 0; i < n; ++i) {
    float g = load_grad<kType>(grad, i);
    if constexpr (kWindowEnd) g = acc[i] + g;
    adamw_element(p[i], m[i], v[i], g * gs, c);
    if constexpr (kHalf == HalfOut::kBF16) half[i] = float_to_bf16(p[i]);
    if constexpr (kHalf == HalfOut::kFP16) half[i] = float_to_fp16(p[i]);
  }
}

template <GradRef::Type kType, bool kWindowEnd>
void adamw_scalar_by_half(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float gs) {
  if (s.half_out == nullptr) return adamw_scalar<kType, kWindowEnd, HalfOut::kNone>(s, acc, c, gs);
  if (s.half_kind == HalfKind::kBF16) return adamw_scalar<kType, kWindowEnd, HalfOut::kBF16>(s, acc, c, gs);
  return adamw_scalar<kType, kWindowEnd, HalfOut::kFP16>(s, acc, c, gs);
}

template <bool kWindowEnd>
void adamw_scalar_dispatch(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float gs) {
  switch (s.grad.type) {
    case GradRef::Type::kF32:
      return adamw_scalar_by_half<GradRef::Type::kF32, kWindowEnd>(s, acc, c, gs);
    case GradRef::Type::kBF16:
      return adamw_scalar_by_half<GradRef::Type::kBF16, kWindowEnd>(s, acc, c, gs);
    case GradRef::Type::kFP16:
      return adamw_scalar_by_half<GradRef::Type::kFP16, kWindowEnd>(s, acc, c, gs);
  }
}

}  // namespace

void adamw_step_scalar(const AdamWSpan& s, const AdamWCoeffs& c, float grad_scale) {
  adamw_scalar_dispatch<false>(s, nullptr, c, grad_scale);
}

void adamw_window_end_scalar(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float grad_scale) {
  adamw_scalar_dispatch<true>(s, acc, c, grad_scale);
}

}  // namespace host_kernels

void adamw_step(const AdamWSpan& span, const AdamWCoeffs& c, float grad_scale) {
  if (span.n <= 0) return;
  host_kernels::active_table().adamw_step(span, c, grad_scale);
}

void adamw_window_end(const AdamWSpan& span, const float* acc, const AdamWCoeffs& c, float grad_scale) {
  if (span.n <= 0) return;
  host_kernels::active_table().adamw_window_end(span, acc, c, grad_scale);
}

namespace {
// Everything a pooled call's chunks need, captured by one pointer so that the
// std::function wrapping the lambda stays in its small-object buffer (no allocation).
struct PooledAdamW {
  const AdamWSpan& span;
  const float* acc;
  const AdamWCoeffs& c;
  float grad_scale;
  host_kernels::AdamWStepFn step;
  host_kernels::AdamWWindowEndFn window_end;
};
}  // namespace

void adamw_step(HostThreadPool& pool, const AdamWSpan& span, const AdamWCoeffs& c, float grad_scale) {
  if (span.n <= 0) return;
  const PooledAdamW job{span, nullptr, c, grad_scale, host_kernels::active_table().adamw_step, nullptr};
  pool.parallel_for(span.n, kHostChunkAlign, [&job](int64_t begin, int64_t end) {
    job.step(job.span.slice(begin, end), job.c, job.grad_scale);
  });
}

void adamw_window_end(HostThreadPool& pool, const AdamWSpan& span, const float* acc, const AdamWCoeffs& c,
                      float grad_scale) {
  if (span.n <= 0) return;
  const PooledAdamW job{span, acc, c, grad_scale, nullptr, host_kernels::active_table().adamw_window_end};
  pool.parallel_for(span.n, kHostChunkAlign, [&job](int64_t begin, int64_t end) {
    job.window_end(job.span.slice(begin, end), job.acc + begin, job.c, job.grad_scale);
  });
}

}  // namespace zenflow::engine
