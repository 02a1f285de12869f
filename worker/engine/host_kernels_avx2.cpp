// AVX2 (+F16C) build of the host kernels: AdamW step, window-end AdamW, accumulate.
//
// Compiled with per-file -mavx2 -mf16c -ffp-contract=off and reached only after CPUID
// confirms support (host_isa.cpp). AVX2 has no 16-bit masked loads, so a tail of fewer
// than 8 elements is copied into a zero-padded block on the stack, run through the same
// vector code as the body, and copied back: every element goes through the same
// instructions wherever a span starts or is cut. Lane-wise the operations are those of
// host_kernels::adamw_element(), in the same order.
#include "worker/engine/host_kernels.h"

#if defined(__x86_64__)
// GCC 12's intrinsic headers trip -Wmaybe-uninitialized on their own _mm*_undefined_*()
// placeholders at -O3 (GCC bug 105593); the warning is about the header, not this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

namespace zenflow::engine::host_kernels {
namespace {

using GT = GradRef::Type;
enum class HalfOut { kNone, kBF16, kFP16 };
constexpr int64_t kLanes = 8;

struct Coeffs {
  __m256 beta1, beta2, one_minus_beta1, one_minus_beta2, decay, step_size, inv_sqrt_bc2, eps, grad_scale;
  Coeffs(const AdamWCoeffs& c, float gs)
      : beta1(_mm256_set1_ps(c.beta1)),
        beta2(_mm256_set1_ps(c.beta2)),
        one_minus_beta1(_mm256_set1_ps(c.one_minus_beta1)),
        one_minus_beta2(_mm256_set1_ps(c.one_minus_beta2)),
        decay(_mm256_set1_ps(c.decay)),
        step_size(_mm256_set1_ps(c.step_size)),
        inv_sqrt_bc2(_mm256_set1_ps(c.inv_sqrt_bc2)),
        eps(_mm256_set1_ps(c.eps)),
        grad_scale(_mm256_set1_ps(gs)) {}
};

inline size_t grad_bytes(GT type) { return type == GT::kF32 ? 4 : 2; }

template <GT kType>
inline __m256 load_grad(const void* data, int64_t i) {
  if constexpr (kType == GT::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(data) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(data) + i));
    if constexpr (kType == GT::kBF16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  }
}

// Same bits as float_to_bf16(): round-to-nearest-even, NaN -> (bits >> 16) | quiet bit.
inline __m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i upper = _mm256_srli_epi32(u, 16);
  const __m256i lsb = _mm256_and_si256(upper, _mm256_set1_epi32(1));
  const __m256i bias = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, bias), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i quiet = _mm256_or_si256(upper, _mm256_set1_epi32(0x40));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
  // Every lane is <= 0xffff, so unsigned saturation packs without changing values.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

template <HalfOut kHalf>
inline __m128i to_half(__m256 x) {
  if constexpr (kHalf == HalfOut::kBF16)
    return to_bf16(x);
  else
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// One vector (8 elements) of the AdamW update at element i.
template <GT kType, bool kWindowEnd, HalfOut kHalf, bool kStream = false>
inline void adamw_vector(const AdamWSpan& s, const float* acc, int64_t i, const Coeffs& c) {
  __m256 g = load_grad<kType>(s.grad.data, i);
  if constexpr (kWindowEnd) g = _mm256_add_ps(_mm256_loadu_ps(acc + i), g);
  g = _mm256_mul_ps(g, c.grad_scale);
  __m256 m = _mm256_loadu_ps(s.m + i);
  __m256 v = _mm256_loadu_ps(s.v + i);
  __m256 p = _mm256_loadu_ps(s.p + i);
  m = _mm256_add_ps(_mm256_mul_ps(c.beta1, m), _mm256_mul_ps(c.one_minus_beta1, g));
  v = _mm256_add_ps(_mm256_mul_ps(c.beta2, v), _mm256_mul_ps(_mm256_mul_ps(c.one_minus_beta2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(v), c.inv_sqrt_bc2), c.eps);
  p = _mm256_sub_ps(_mm256_mul_ps(p, c.decay), _mm256_div_ps(_mm256_mul_ps(c.step_size, m), denom));
  _mm256_storeu_ps(s.m + i, m);
  _mm256_storeu_ps(s.v + i, v);
  _mm256_storeu_ps(s.p + i, p);
  if constexpr (kHalf != HalfOut::kNone) {
    __m128i* out = reinterpret_cast<__m128i*>(s.half_out + i);
    if constexpr (kStream)
      _mm_stream_si128(out, to_half<kHalf>(p));
    else
      _mm_storeu_si128(out, to_half<kHalf>(p));
  }
}

// Elements [i, i + r), r < 8, through the same vector code: a zero-padded copy on the
// stack (zeros are harmless: sqrt(0) + eps > 0), then the r results copied back.
// (Header inline helpers such as GradRef::offset are avoided in this file: an
// out-of-line copy compiled with -mavx2 could be picked by the linker for callers on
// CPUs without AVX2.)
template <GT kType, bool kWindowEnd, HalfOut kHalf>
void adamw_partial(const AdamWSpan& s, const float* acc, int64_t i, int64_t r, const Coeffs& c) {
  alignas(32) float p[kLanes] = {}, m[kLanes] = {}, v[kLanes] = {}, a[kLanes] = {};
  alignas(32) float g32[kLanes] = {};
  alignas(32) uint16_t g16[kLanes] = {}, half[kLanes] = {};
  const size_t f = static_cast<size_t>(r) * sizeof(float);
  std::memcpy(p, s.p + i, f);
  std::memcpy(m, s.m + i, f);
  std::memcpy(v, s.v + i, f);
  if (kWindowEnd) std::memcpy(a, acc + i, f);
  void* g = kType == GT::kF32 ? static_cast<void*>(g32) : static_cast<void*>(g16);
  std::memcpy(g, static_cast<const char*>(s.grad.data) + i * static_cast<int64_t>(grad_bytes(kType)),
              static_cast<size_t>(r) * grad_bytes(kType));
  AdamWSpan block = s;
  block.p = p;
  block.m = m;
  block.v = v;
  block.grad.data = g;
  block.half_out = half;
  adamw_vector<kType, kWindowEnd, kHalf>(block, a, 0, c);
  std::memcpy(s.p + i, p, f);
  std::memcpy(s.m + i, m, f);
  std::memcpy(s.v + i, v, f);
  if (kHalf != HalfOut::kNone) std::memcpy(s.half_out + i, half, static_cast<size_t>(r) * sizeof(uint16_t));
}

template <GT kType, bool kWindowEnd, HalfOut kHalf>
void adamw_run(const AdamWSpan& s, const float* acc, const AdamWCoeffs& coeffs, float gs) {
  const Coeffs c(coeffs, gs);
  const int64_t n = s.n;
  int64_t i = 0;
  if (kHalf != HalfOut::kNone && n >= kStreamMinElements) {
    // Peel to 16-byte alignment of half_out, then stream the write-only half copy past
    // the caches (see kStreamMinElements).
    const int64_t head = static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(s.half_out) & 15)) & 15) / 2;
    if (head > 0) adamw_partial<kType, kWindowEnd, kHalf>(s, acc, 0, head, c);
    i = head;
    for (; i + kLanes <= n; i += kLanes) adamw_vector<kType, kWindowEnd, kHalf, true>(s, acc, i, c);
    _mm_sfence();
  }
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    adamw_vector<kType, kWindowEnd, kHalf>(s, acc, i, c);
    adamw_vector<kType, kWindowEnd, kHalf>(s, acc, i + kLanes, c);
  }
  for (; i + kLanes <= n; i += kLanes) adamw_vector<kType, kWindowEnd, kHalf>(s, acc, i, c);
  if (i < n) adamw_partial<kType, kWindowEnd, kHalf>(s, acc, i, n - i, c);
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

template <GT kType, bool kOverwrite, bool kStream = false>
inline void accumulate_vector(float* acc, const void* g, int64_t i, __m256 scale) {
  const __m256 x = _mm256_mul_ps(load_grad<kType>(g, i), scale);
  // With overwrite the sum is still formed (0 + x) so that -0 becomes +0 as in scalar.
  const __m256 a = kOverwrite ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + i);
  if constexpr (kStream)
    _mm256_stream_ps(acc + i, _mm256_add_ps(a, x));
  else
    _mm256_storeu_ps(acc + i, _mm256_add_ps(a, x));
}

// Elements [i, i + r), r < 8, through a zero-padded stack copy (see adamw_partial).
template <GT kType, bool kOverwrite>
void accumulate_partial(float* acc, const void* g, int64_t i, int64_t r, __m256 scale) {
  alignas(32) float a[kLanes] = {};
  alignas(32) float g32[kLanes] = {};
  alignas(32) uint16_t g16[kLanes] = {};
  const size_t f = static_cast<size_t>(r) * sizeof(float);
  if (!kOverwrite) std::memcpy(a, acc + i, f);
  void* gt = kType == GT::kF32 ? static_cast<void*>(g32) : static_cast<void*>(g16);
  std::memcpy(gt, static_cast<const char*>(g) + i * static_cast<int64_t>(grad_bytes(kType)),
              static_cast<size_t>(r) * grad_bytes(kType));
  accumulate_vector<kType, kOverwrite>(a, gt, 0, scale);
  std::memcpy(acc + i, a, f);
}

template <GT kType, bool kOverwrite>
void accumulate_run(float* acc, const void* g, int64_t n, float scale_f) {
  const __m256 scale = _mm256_set1_ps(scale_f);
  int64_t i = 0;
  if (kOverwrite && n >= kStreamMinElements) {
    // acc is write-only when overwriting: peel to 32-byte alignment, then stream it.
    const int64_t head = static_cast<int64_t>((32 - (reinterpret_cast<uintptr_t>(acc) & 31)) & 31) / 4;
    if (head > 0) accumulate_partial<kType, kOverwrite>(acc, g, 0, head, scale);
    i = head;
    for (; i + kLanes <= n; i += kLanes) accumulate_vector<kType, kOverwrite, true>(acc, g, i, scale);
    _mm_sfence();
  }
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    accumulate_vector<kType, kOverwrite>(acc, g, i, scale);
    accumulate_vector<kType, kOverwrite>(acc, g, i + kLanes, scale);
  }
  for (; i + kLanes <= n; i += kLanes) accumulate_vector<kType, kOverwrite>(acc, g, i, scale);
  if (i < n) accumulate_partial<kType, kOverwrite>(acc, g, i, n - i, scale);
}

template <GT kType>
void accumulate_by_mode(float* acc, const void* g, int64_t n, float scale, bool overwrite) {
  if (overwrite)
    accumulate_run<kType, true>(acc, g, n, scale);
  else
    accumulate_run<kType, false>(acc, g, n, scale);
}

}  // namespace

void adamw_step_avx2(const AdamWSpan& s, const AdamWCoeffs& c, float grad_scale) {
  adamw_by_grad<false>(s, nullptr, c, grad_scale);
}

void adamw_window_end_avx2(const AdamWSpan& s, const float* acc, const AdamWCoeffs& c, float grad_scale) {
  adamw_by_grad<true>(s, acc, c, grad_scale);
}

void accumulate_avx2(float* acc, GradRef g, int64_t n, float scale, bool overwrite) {
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
