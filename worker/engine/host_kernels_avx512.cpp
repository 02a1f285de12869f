// AVX-512 (F+BW+VL) build of the host kernels: AdamW step, window-end AdamW, accumulate.
//
// Compiled with per-file -mavx512f -mavx512bw -mavx512vl -mf16c -ffp-contract=off and
// reached only after CPUID confirms support (host_isa.cpp). Tails use masked loads and
// stores, so every element goes through the same instructions as the vector body and
// results do not depend on where a span starts or how it is chunked. Lane-wise the
// operations are those of host_kernels::adamw_element(), in the same order.
#include "worker/engine/host_kernels.h"

#if defined(__x86_64__)
// GCC 12's intrinsic headers trip -Wmaybe-uninitialized on their own _mm*_undefined_*()
// placeholders at -O3 (GCC bug 105593); the warning is about the header, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>

namespace zenflow::engine::host_kernels {
namespace {

using GT = GradRef::Type;
enum class HalfOut { kNone, kBF16, kFP16 };
constexpr int64_t kLanes = 16;

struct Coeffs {
  __m512 beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps, grad_scale;
  Coeffs(const AdamWCoeffs& c, float gs)
      : beta1(_mm512_set1_ps(c.beta1)),
        beta2(_mm512_set1_ps(c.beta2)),
        one_minus_beta1(_mm512_set1_ps(c.one_minus_beta1)),
        one_minus_beta2(_mm512_set1_ps(c.one_minus_beta2)),
        decay(_mm512_set1_ps(c.decay)),
        step_size(_mm512_set1_ps(c.step_size)),
        inv_sqrt_bc2(_mm512_set1_ps(c.inv_sqrt_bc2)),
        eps(_mm512_set1_ps(c.eps)),
        grad_scale(_mm512_set1_ps(gs)) {}
};

template <bool kMasked>
inline __m512 load_f32(const float* p, __mmask16 k) {
  if constexpr (kMasked)
    return _mm512_maskz_loadu_ps(k, p);
  else
    return _mm512_loadu_ps(p);
}

template <bool kMasked>
inline void store_f32(float* p, __m512 x, __mmask16 k) {
  if constexpr (kMasked)
    _mm512_mask_storeu_ps(p, k, x);
  else
    _mm512_storeu_ps(p, x);
}

template <bool kMasked>
inline __m256i load_u16(const uint16_t* p, __mmask16 k) {
  if constexpr (kMasked)
    return _mm256_maskz_loadu_epi16(k, p);
  else
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

template <bool kMasked, bool kStream = false>
inline void store_u16(uint16_t* p, __m256i x, __mmask16 k) {
  if constexpr (kMasked)
    _mm256_mask_storeu_epi16(p, k, x);
  else if constexpr (kStream)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), x);
  else
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), x);
}

template <GT kType, bool kMasked>
inline __m512 load_grad(const void* data, int64_t i, __mmask16 k) {
  if constexpr (kType == GT::kF32) {
    return load_f32<kMasked>(static_cast<const float*>(data) + i, k);
  } else {
    const __m256i h = load_u16<kMasked>(static_cast<const uint16_t*>(data) + i, k);
    if constexpr (kType == GT::kBF16) {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    } else {
      return _mm512_cvtph_ps(h);
    }
  }
}

// Same bits as float_to_bf16(): round-to-nearest-even, NaN -> (bits >> 16) | quiet bit.
inline __m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i upper = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(upper, _mm512_set1_epi32(1));
  const __m512i bias = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, bias), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i quiet = _mm512_or_si512(upper, _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, nan, quiet));
}

template <HalfOut kHalf>
inline __m256i to_half(__m512 x) {
  if constexpr (kHalf == HalfOut::kBF16)
    return to_bf16(x);
  else
    return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// One vector of the AdamW update at element i (the first popcount(k) lanes if masked).
template <GT kType, bool kWindowEnd, HalfOut kHalf, bool kMasked, bool kStream = false>
inline void adamw_vector(const AdamWSpan& s, const float* acc, int64_t i, const Coeffs& c, __mmask16 k) {
  __m512 g = load_grad<kType, kMasked>(s.grad.data, i, k);
  if constexpr (kWindowEnd) g = _mm512_add_ps(load_f32<kMasked>(acc + i, k), g);
  g = _mm512_mul_ps(g, c.grad_scale);
  __m512 m = load_f32<kMasked>(s.m + i, k);
  __m512 v = load_f32<kMasked>(s.v + i, k);
  __m512 p = load_f32<kMasked>(s.p + i, k);
  m = _mm512_add_ps(_mm512_mul_ps(c.beta1, m), _mm512_mul_ps(c.one_minus_beta1, g));
  v = _mm512_add_ps(_mm512_mul_ps(c.beta2, v), _mm512_mul_ps(_mm512_mul_ps(c.one_minus_beta2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(v), c.inv_sqrt_bc2), c.eps);
  p = _mm512_sub_ps(_mm512_mul_ps(p, c.decay), _mm512_div_ps(_mm512_mul_ps(c.step_size, m), denom));
  store_f32<kMasked>(s.m + i, m, k);
  store_f32<kMasked>(s.v + i, v, k);
  store_f32<kMasked>(s.p + i, p, k);
  if constexpr (kHalf != HalfOut::kNone) store_u16<kMasked, kStream>(s.half_out + i, to_half<kHalf>(p), k);
}

template <GT kType, bool kWindowEnd, HalfOut kHalf>
void adamw_run(const AdamWSpan& s, const float* acc, const AdamWCoeffs& coeffs, float gs) {
  const Coeffs c(coeffs, gs);
  const int64_t n = s.n;
  int64_t i = 0;
  if (kHalf != HalfOut::kNone && n >= kStreamMinElements) {
    // Peel to 32-byte alignment of half_out, then stream the write-only half copy past
    // the caches (see kStreamMinElements).
    const int64_t head = std::min<int64_t>(
        n, static_cast<int64_t>((32 - (reinterpret_cast<uintptr_t>(s.half_out) & 31)) & 31) / 2);
    if (head > 0) {
      adamw_vector<kType, kWindowEnd, kHalf, true>(s, acc, 0, c, static_cast<__mmask16>((1u << head) - 1u));
      i = head;
    }
    for (; i + kLanes <= n; i += kLanes) adamw_vector<kType, kWindowEnd, kHalf, false, true>(s, acc, i, c, 0);
    _mm_sfence();
  }
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    adamw_vector<kType, kWindowEnd, kHalf, false>(s, acc, i, c, 0);
    adamw_vector<kType, kWindowEnd, kHalf, false>(s, acc, i + kLanes, c, 0);
  }
  for (; i + kLanes <= n; i += kLanes) adamw_vector<kType, kWindowEnd, kHalf, false>(s, acc, i, c, 0);
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    adamw_vector<kType, kWindowEnd, kHalf, true>(s, acc, i, c, k);
  }
}

template <GT kType, bool kWindowEnd>
void adamw_by_half(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float gs) {
  if (s.half_out == nullptr) return adamw_run<kType, kWindowEnd, HalfOut::kNone>(s, acc, c, gs);
  if (s.half_kind == HalfKind::kBF16) return adamw_run<kType, kWindowEnd, HalfOut::kBF16>(s, acc, c, gs);
  return adamw_run<kType, kWindowEnd, HalfOut::kFP16>(s, acc, c, gs);
}

template <bool kWindowEnd>
void adamw_by_grad(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float gs) {
  switch (s.grad.type) {
    case GT::kF32:
      return adamw_by_half<GT::kF32, kWindowEnd>(s, acc, c, gs);
    case GT::kBF16:
      return adamw_by_half<GT::kBF16, kWindowEnd>(s, acc, c, gs);
    case GT::kFP16:
      return adamw_by_half<GT::kFP16, kWindowEnd>(s, acc, c, gs);
  }
}

template <GT kType, bool kOverwrite, bool kMasked, bool kStream = false>
inline void accumulate_vector(float* acc, const void* g, int64_t i, __m512 scale, __mmask16 k) {
  const __m512 x = _mm512_mul_ps(load_grad<kType, kMasked>(g, i, k), scale);
  // With overwrite the sum is still formed (0 + x) so that -0 becomes +0 as in scalar.
  const __m512 a = kOverwrite ? _mm512_setzero_ps() : load_f32<kMasked>(acc + i, k);
  if constexpr (kStream)
    _mm512_stream_ps(acc + i, _mm512_add_ps(a, x));
  else
    store_f32<kMasked>(acc + i, _mm512_add_ps(a, x), k);
}

template <GT kType, bool kOverwrite>
void accumulate_run(float* acc, const void* g, int64_t n, float scale_f) {
  const __m512 scale = _mm512_set1_ps(scale_f);
  int64_t i = 0;
  if (kOverwrite && n >= kStreamMinElements) {
    // acc is write-only when overwriting: peel to 64-byte alignment, then stream it.
    const int64_t head =
        std::min<int64_t>(n, static_cast<int64_t>((64 - (reinterpret_cast<uintptr_t>(acc) & 63)) & 63) / 4);
    if (head > 0) {
      accumulate_vector<kType, kOverwrite, true>(acc, g, 0, scale, static_cast<__mmask16>((1u << head) - 1u));
      i = head;
    }
    for (; i + kLanes <= n; i += kLanes)
      accumulate_vector<kType, kOverwrite, false, true>(acc, g, i, scale, 0);
    _mm_sfence();
  }
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    accumulate_vector<kType, kOverwrite, false>(acc, g, i, scale, 0);
    accumulate_vector<kType, kOverwrite, false>(acc, g, i + kLanes, scale, 0);
  }
  for (; i + kLanes <= n; i += kLanes) accumulate_vector<kType, kOverwrite, false>(acc, g, i, scale, 0);
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    accumulate_vector<kType, kOverwrite, true>(acc, g, i, scale, k);
  }
}

template <GT kType>
void accumulate_by_mode(float* acc, const void* g, int64_t n, float scale, bool overwrite) {
  if (overwrite)
    accumulate_run<kType, true>(acc, g, n, scale);
  else
    accumulate_run<kType, false>(acc, g, n, scale);
}

}  // namespace

void adamw_step_avx512(const AdamWSpan& s, const AdamWCoeffs& c, float grad_scale) {
  adamw_by_grad<false>(s, nullptr, c, grad_scale);
}

void adamw_window_end_avx512(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float grad_scale) {
  adamw_by_grad<true>(s, acc, c, grad_scale);
}

void accumulate_avx512(float* acc, GradRef g, int64_t n, float scale, bool overwrite) {
  switch (g.type) {
    case GT::kF32:
      return accumulate_by_mode<GT::kF32>(acc, g.data, n, scale, overwrite);
    case GT::kBF16:
      return accumulate_by_mode<GT::kBF16>(acc, g.data, n, scale, overwrite);
    case GT::kFP16:
      return accumulate_by_mode<GT::kFP16>(acc, g.data, n, scale, overwrite);
  }
}

}  // namespace zenflow::engine::host_kernels
#endif  // __x86_64__
