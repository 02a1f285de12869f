// Host kernels (AdamW step, window-end AdamW, accumulate) against a double-precision
// reference on every ISA build, bf16/fp16 rounding, and ISA selection.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/accumulate_kernel.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/half.h"
#include "worker/engine/host_isa.h"

namespace zenflow::engine {
namespace {

constexpr double kMaxRelError = 2e-7;
const std::vector<int64_t> kSizes = {0, 1, 7, 15, 16, 17, 31, 33, 1000003};

std::vector<HostIsa> supported_isas() {
  std::vector<HostIsa> out;
  for (HostIsa isa : {HostIsa::kScalar, HostIsa::kAvx2, HostIsa::kAvx512})
    if (host_isa_supported(isa)) out.push_back(isa);
  return out;
}

// Restores the ISA that was active when the test started.
class IsaScope {
 public:
  IsaScope() : saved_(active_host_isa()) {}
  ~IsaScope() { set_host_isa(saved_); }

 private:
  HostIsa saved_;
};

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

enum class HalfOutKind { kNone, kBF16, kFP16 };

uint16_t to_half(float f, HalfOutKind kind) {
  return kind == HalfOutKind::kBF16 ? float_to_bf16(f) : float_to_fp16(f);
}

// Arrays with slack in front, so spans can start at any element offset.
struct Arrays {
  static constexpr int64_t kSlack = 16;
  std::vector<float> p, m, v, acc, g32;
  std::vector<uint16_t> g16, half;
  explicit Arrays(int64_t n)
      : p(n + kSlack),
        m(n + kSlack),
        v(n + kSlack),
        acc(n + kSlack),
        g32(n + kSlack),
        g16(n + kSlack),
        half(n + kSlack) {}
};

// Decoded value of a stored gradient element.
float grad_value(const Arrays& a, GradRef::Type type, int64_t i) {
  switch (type) {
    case GradRef::Type::kF32:
      return a.g32[i];
    case GradRef::Type::kBF16:
      return bf16_to_float(a.g16[i]);
    case GradRef::Type::kFP16:
      return fp16_to_float(a.g16[i]);
  }
  return 0.f;
}

// Realistic optimizer state without cancellation, so that plain relative error is the
// right yardstick: m has the gradient's sign (it is an average of gradients), v is of
// the gradient's squared magnitude, acc (a window's earlier gradients) has the last
// gradient's sign, and p has the opposite sign to the update's direction so that
// p * decay and -step_size * m / (...) add up instead of cancelling.
void fill_realistic(Arrays& a, GradRef::Type type, float grad_scale, bool fresh_state, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  const size_t n = a.p.size();
  for (size_t i = 0; i < n; ++i) {
    const float sign = unit(rng) < 0.5f ? -1.f : 1.f;
    const float mag = std::pow(10.f, -3.f * unit(rng));  // 1e-3 .. 1: normal in fp16 too
    const float g = sign * mag;
    a.g32[i] = g;
    a.g16[i] = type == GradRef::Type::kFP16 ? float_to_fp16(g) : float_to_bf16(g);
    a.acc[i] = sign * mag * (1.f + 3.f * unit(rng));
    const float ge = (a.acc[i] + g) * grad_scale;
    a.m[i] = fresh_state ? 0.f : ge * (0.5f + 1.5f * unit(rng));
    a.v[i] = fresh_state ? 0.f : ge * ge * (0.5f + 1.5f * unit(rng));
    a.p[i] = -sign * (0.05f + unit(rng));
    a.half[i] = 0xdead;
  }
}

struct Case {
  int64_t n;
  int64_t offset;  // first element of the span inside the arrays (unaligned starts)
  GradRef::Type grad;
  HalfOutKind half;
  bool window_end;
};

std::string describe(const Case& c, HostIsa isa) {
  const char* g = c.grad == GradRef::Type::kF32 ? "f32" : c.grad == GradRef::Type::kBF16 ? "bf16" : "fp16";
  const char* h = c.half == HalfOutKind::kNone ? "none" : c.half == HalfOutKind::kBF16 ? "bf16" : "fp16";
  return std::string(host_isa_name(isa)) + " n=" + std::to_string(c.n) +
         " offset=" + std::to_string(c.offset) + " grad=" + g + " half_out=" + h +
         (c.window_end ? " window_end" : " step");
}

double rel_error(float out, double ref) {
  if (ref == 0.0) return out == 0.f ? 0.0 : std::numeric_limits<double>::infinity();
  return std::abs(static_cast<double>(out) - ref) / std::abs(ref);
}

// Runs one case on the active ISA and checks p, m, v against the formula evaluated in
// double from the same fp32 inputs and coefficients; half_out must be exactly the
// rounding of the kernel's own fp32 p. Returns the worst relative error seen.
double run_adamw_case(const Case& c, HostIsa isa, int64_t step, float grad_scale) {
  Arrays a(c.n);
  fill_realistic(a, c.grad, grad_scale, step == 1, static_cast<uint32_t>(c.n * 7 + c.offset));
  AdamWParams params;
  params.lr = 1e-3;
  params.weight_decay = 0.01;
  const AdamWCoeffs co = AdamWCoeffs::make(params, step);
  const Arrays in = a;

  const int64_t o = c.offset;
  AdamWSpan span;
  span.p = a.p.data() + o;
  span.m = a.m.data() + o;
  span.v = a.v.data() + o;
  span.grad = c.grad == GradRef::Type::kF32    ? GradRef::f32(a.g32.data() + o)
              : c.grad == GradRef::Type::kBF16 ? GradRef::bf16(a.g16.data() + o)
                                               : GradRef::fp16(a.g16.data() + o);
  span.half_out = c.half == HalfOutKind::kNone ? nullptr : a.half.data() + o;
  span.half_kind = c.half == HalfOutKind::kFP16 ? HalfKind::kFP16 : HalfKind::kBF16;
  span.n = c.n;
  if (c.window_end) {
    adamw_window_end(span, a.acc.data() + o, co, grad_scale);
  } else {
    adamw_step(span, co, grad_scale);
  }

  const double b1 = co.beta1, b2 = co.beta2, omb1 = co.one_minus_beta1, omb2 = co.one_minus_beta2,
               decay = co.decay, step_size = co.step_size, inv_bc2 = co.inv_sqrt_bc2, eps = co.eps;
  double worst = 0.0;
  int64_t bad = 0;
  for (int64_t k = 0; k < static_cast<int64_t>(a.p.size()); ++k) {
    const bool inside = k >= o && k < o + c.n;
    if (!inside) {  // nothing outside the span is touched
      if (bits(a.p[k]) != bits(in.p[k]) || bits(a.m[k]) != bits(in.m[k]) || bits(a.v[k]) != bits(in.v[k]) ||
          a.half[k] != in.half[k])
        ++bad;
      continue;
    }
    double g = grad_value(in, c.grad, k);
    if (c.window_end) g = static_cast<double>(in.acc[k]) + g;
    g *= grad_scale;
    const double m = b1 * in.m[k] + omb1 * g;
    const double v = b2 * in.v[k] + omb2 * g * g;
    const double p = in.p[k] * decay - step_size * m / (std::sqrt(v) * inv_bc2 + eps);
    worst = std::max({worst, rel_error(a.m[k], m), rel_error(a.v[k], v), rel_error(a.p[k], p)});
    if (c.half != HalfOutKind::kNone && a.half[k] != to_half(a.p[k], c.half)) ++bad;
  }
  EXPECT_EQ(bad, 0) << describe(c, isa) << ": elements outside the span changed or half_out "
                    << "differs from rounding the kernel's p";
  EXPECT_LE(worst, kMaxRelError) << describe(c, isa);
  return worst;
}

TEST(HostKernels, AdamWMatchesDoubleReferenceOnEveryIsaSizeAndOffset) {
  IsaScope scope;
  using GT = GradRef::Type;
  // Every combination for the small sizes (all tails, aligned and unaligned starts);
  // for 1000003 elements a spread of combinations covering each dtype and output.
  const std::vector<Case> big = {{1000003, 3, GT::kF32, HalfOutKind::kNone, false},
                                 {1000003, 0, GT::kF32, HalfOutKind::kBF16, true},
                                 {1000003, 1, GT::kBF16, HalfOutKind::kFP16, false},
                                 {1000003, 3, GT::kFP16, HalfOutKind::kBF16, true}};
  double worst = 0.0;
  for (HostIsa isa : supported_isas()) {
    set_host_isa(isa);
    std::vector<Case> cases = big;
    for (int64_t n : kSizes) {
      if (n > 100000) continue;
      for (int64_t offset : {0, 1, 3})
        for (GT grad : {GT::kF32, GT::kBF16, GT::kFP16})
          for (HalfOutKind half : {HalfOutKind::kNone, HalfOutKind::kBF16, HalfOutKind::kFP16})
            for (bool window_end : {false, true}) cases.push_back({n, offset, grad, half, window_end});
    }
    for (const Case& c : cases) {
      // The window mean (1/3) is not a power of two: g itself is rounded.
      worst = std::max(worst, run_adamw_case(c, isa, 7, c.window_end ? 1.f / 3.f : 0.5f));
    }
  }
  RecordProperty("max_rel_error", std::to_string(worst));
  std::printf("AdamW max relative error over all ISAs and cases: %.3g\n", worst);
}

TEST(HostKernels, FirstAdamWStepFromZeroStateMatchesDoubleReference) {
  IsaScope scope;
  for (HostIsa isa : supported_isas()) {
    set_host_isa(isa);
    for (int64_t n : {int64_t{17}, int64_t{1000003}}) {
      const Case c{n, 1, GradRef::Type::kF32, HalfOutKind::kBF16, false};
      run_adamw_case(c, isa, 1, 1.0f);
    }
  }
}

TEST(HostKernels, AccumulateMatchesDoubleReferenceOnEveryIsaSizeAndOffset) {
  IsaScope scope;
  double worst = 0.0;
  for (HostIsa isa : supported_isas()) {
    set_host_isa(isa);
    for (int64_t n : kSizes) {
      for (int64_t offset : {0, 3}) {
        if (n > 100000 && offset == 0) continue;  // the big size once, unaligned
        for (GradRef::Type type : {GradRef::Type::kF32, GradRef::Type::kBF16, GradRef::Type::kFP16}) {
          for (bool overwrite : {false, true}) {
            Arrays a(n);
            fill_realistic(a, type, 1.f, false, static_cast<uint32_t>(n + offset));
            const Arrays in = a;
            const float scale = 0.25f * 1.1f;  // not a power of two: the product rounds
            const GradRef g = type == GradRef::Type::kF32    ? GradRef::f32(a.g32.data() + offset)
                              : type == GradRef::Type::kBF16 ? GradRef::bf16(a.g16.data() + offset)
                                                             : GradRef::fp16(a.g16.data() + offset);
            accumulate(a.acc.data() + offset, g, n, scale, overwrite);
            int64_t outside = 0;
            double err = 0.0;
            for (int64_t k = 0; k < static_cast<int64_t>(a.acc.size()); ++k) {
              if (k < offset || k >= offset + n) {
                outside += bits(a.acc[k]) != bits(in.acc[k]);
                continue;
              }
              const double ref = (overwrite ? 0.0 : static_cast<double>(in.acc[k])) +
                                 static_cast<double>(grad_value(in, type, k)) * scale;
              err = std::max(err, rel_error(a.acc[k], ref));
            }
            EXPECT_EQ(outside, 0) << host_isa_name(isa) << " n=" << n;
            EXPECT_LE(err, kMaxRelError)
                << host_isa_name(isa) << " n=" << n << " offset=" << offset << " overwrite=" << overwrite;
            worst = std::max(worst, err);
          }
        }
      }
    }
  }
  std::printf("accumulate max relative error over all ISAs and cases: %.3g\n", worst);
}

// Random signs, zero state, cancellation, negative zeros: whatever the inputs, all ISA
// builds must produce the same bits (same operations, same order, no FMA).
TEST(HostKernels, AllIsaBuildsAreBitwiseIdentical) {
  IsaScope scope;
  const std::vector<HostIsa> isas = supported_isas();
  for (int64_t n : {int64_t{37}, int64_t{1000003}}) {
    for (int64_t offset : {0, 5}) {
      std::mt19937 rng(static_cast<uint32_t>(n + offset));
      std::normal_distribution<float> normal(0.f, 1.f);
      Arrays base(n);
      for (size_t i = 0; i < base.p.size(); ++i) {
        base.p[i] = normal(rng);
        base.m[i] = i % 11 == 0 ? 0.f : 0.1f * normal(rng);
        base.v[i] = i % 13 == 0 ? 0.f : std::abs(0.01f * normal(rng));
        base.acc[i] = i % 17 == 0 ? -0.f : normal(rng);
        base.g32[i] = i % 19 == 0 ? -0.f : normal(rng) * 1e-2f;
        base.g16[i] = float_to_bf16(base.g32[i] * 3.f);
      }
      std::vector<Arrays> results;
      for (HostIsa isa : isas) {
        set_host_isa(isa);
        Arrays a = base;
        AdamWParams params;
        params.weight_decay = 0.1;
        const AdamWCoeffs co = AdamWCoeffs::make(params, 3);
        AdamWSpan span{a.p.data() + offset,
                       a.m.data() + offset,
                       a.v.data() + offset,
                       GradRef::f32(a.g32.data() + offset),
                       a.half.data() + offset,
                       HalfKind::kBF16,
                       n};
        adamw_step(span, co, 0.7f);
        span.grad = GradRef::bf16(a.g16.data() + offset);
        span.half_kind = HalfKind::kFP16;
        adamw_window_end(span, a.acc.data() + offset, co, 0.3f);
        accumulate(a.acc.data() + offset, GradRef::f32(a.g32.data() + offset), n, 1.7f, false);
        results.push_back(std::move(a));
      }
      for (size_t r = 1; r < results.size(); ++r) {
        const Arrays& x = results[0];
        const Arrays& y = results[r];
        int64_t diff = 0;
        for (size_t i = 0; i < x.p.size(); ++i)
          diff += bits(x.p[i]) != bits(y.p[i]) || bits(x.m[i]) != bits(y.m[i]) ||
                  bits(x.v[i]) != bits(y.v[i]) || bits(x.acc[i]) != bits(y.acc[i]) || x.half[i] != y.half[i];
        EXPECT_EQ(diff, 0) << host_isa_name(isas[r]) << " vs " << host_isa_name(isas[0]) << " n=" << n
                           << " offset=" << offset;
      }
    }
  }
}

struct RoundingCase {
  uint32_t in;
  uint16_t out;
};

// Crafted fp32 bit patterns and their round-to-nearest-even bf16.
const std::vector<RoundingCase> kBf16Cases = {
    {0x3f800000, 0x3f80},  // 1.0 exact
    {0x3f808000, 0x3f80},  // tie, lower neighbour even: stays
    {0x3f818000, 0x3f82},  // tie, lower neighbour odd: rounds up to even
    {0x3f808001, 0x3f81},  // just above the tie
    {0x3f807fff, 0x3f80},  // just below the tie
    {0xbf818000, 0xbf82},  // negative tie to even
    {0x80000000, 0x8000},  // -0
    {0x00000001, 0x0000},  // smallest subnormal rounds to +0
    {0x00018000, 0x0002},  // subnormal tie to even
    {0x7f7f7fff, 0x7f7f},  // largest bf16 stays
    {0x7f7f8000, 0x7f80},  // tie above the largest bf16: odd, rounds up to Inf
    {0x7f7fffff, 0x7f80},  // FLT_MAX rounds to Inf
    {0x7f800000, 0x7f80},  // +Inf
    {0xff800000, 0xff80},  // -Inf
    {0x7fc00000, 0x7fc0},  // quiet NaN
    {0x7f800001, 0x7fc0},  // signalling NaN with a low payload: must not become Inf
    {0xff800001, 0xffc0},  // negative one
    {0x7fffffff, 0x7fff},  // NaN with all payload bits: must not carry into the sign
    {0xffffffff, 0xffff},
};

// Crafted fp32 bit patterns and their round-to-nearest-even fp16 (F16C semantics).
const std::vector<RoundingCase> kFp16Cases = {
    {0x3f800000, 0x3c00},                        // 1.0
    {0x3f801000, 0x3c00},                        // 1 + 2^-11: tie, stays even
    {0x3f803000, 0x3c02},                        // 1 + 3*2^-11: tie, rounds up to even
    {0x3f801001, 0x3c01},                        // just above the tie
    {0xbf803000, 0xbc02}, {0x80000000, 0x8000},  // -0
    {0x477fe000, 0x7bff},                        // 65504, the largest fp16
    {0x477fefff, 0x7bff},                        // just below the tie to Inf
    {0x477ff000, 0x7c00},                        // 65520: tie, 65504 is odd, rounds to Inf
    {0x7f7fffff, 0x7c00},                        // FLT_MAX -> Inf
    {0x33800000, 0x0001},                        // 2^-24, smallest fp16 subnormal
    {0x33000000, 0x0000},                        // 2^-25: tie, rounds to even 0
    {0x33c00000, 0x0002},                        // 3*2^-25: tie, rounds up to even 2
    {0x387fc000, 0x03ff},                        // largest subnormal
    {0x387ff000, 0x0400},                        // rounds up into the smallest normal
    {0x7f800000, 0x7c00},                        // Inf
    {0xff800000, 0xfc00}, {0x7fc00000, 0x7e00},  // quiet NaN
    {0x7f800001, 0x7e00},                        // signalling NaN stays NaN (quiet)
    {0xffa12345, 0xff09},                        // payload's top bits kept
};

// Runs the crafted values through adamw_step with step_size 0 and decay 1, so that the
// updated p equals the input and half_out is its rounding, on every ISA and at every
// lane position (the 19-20 values are shifted through a 37-element span).
void check_rounding_through_kernel(const std::vector<RoundingCase>& cases, HalfKind kind) {
  IsaScope scope;
  AdamWCoeffs co;
  co.step_size = 0.f;
  co.decay = 1.f;
  for (HostIsa isa : supported_isas()) {
    set_host_isa(isa);
    for (int64_t shift = 0; shift < 16; ++shift) {
      const int64_t n = 37;
      std::vector<float> p(n), m(n, 0.f), v(n, 1.f), g(n, 0.5f);
      std::vector<uint16_t> half(n, 0);
      for (int64_t i = 0; i < n; ++i)
        p[i] = from_bits(cases[static_cast<size_t>(i + shift) % cases.size()].in);
      AdamWSpan span{p.data(), m.data(), v.data(), GradRef::f32(g.data()), half.data(), kind, n};
      adamw_step(span, co, 1.f);
      for (int64_t i = 0; i < n; ++i) {
        const RoundingCase& rc = cases[static_cast<size_t>(i + shift) % cases.size()];
        EXPECT_EQ(half[i], rc.out) << host_isa_name(isa) << " input 0x" << std::hex << rc.in << " lane "
                                   << std::dec << i;
      }
    }
  }
}

TEST(HalfConversion, Bf16IsRoundToNearestEvenAndKeepsNaN) {
  for (const RoundingCase& rc : kBf16Cases)
    EXPECT_EQ(float_to_bf16(from_bits(rc.in)), rc.out) << "input 0x" << std::hex << rc.in;
  check_rounding_through_kernel(kBf16Cases, HalfKind::kBF16);
}

TEST(HalfConversion, Fp16IsRoundToNearestEvenAndKeepsNaN) {
  for (const RoundingCase& rc : kFp16Cases)
    EXPECT_EQ(float_to_fp16(from_bits(rc.in)), rc.out) << "input 0x" << std::hex << rc.in;
  check_rounding_through_kernel(kFp16Cases, HalfKind::kFP16);
}

TEST(HalfConversion, Fp16DecodesExactly) {
  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(bits(fp16_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(bits(fp16_to_float(0xfc00)), 0xff800000u);
  EXPECT_EQ(bits(fp16_to_float(0x7c01)), 0x7fc02000u);  // NaN comes back quiet
  // Every finite fp16 survives a round trip.
  int64_t round_trip_failures = 0;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;
    round_trip_failures += float_to_fp16(fp16_to_float(static_cast<uint16_t>(h))) != h;
  }
  EXPECT_EQ(round_trip_failures, 0);
}

// All 65536 bf16 and fp16 gradient encodings decode identically on every ISA: acc =
// 0 + g * 1 equals the scalar decoding (-0 becomes +0 by the contract's addition).
TEST(HostKernels, HalfGradientInputsDecodeExactlyOnEveryIsa) {
  IsaScope scope;
  std::vector<uint16_t> all(0x10000 + 3);
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (HostIsa isa : supported_isas()) {
    set_host_isa(isa);
    for (GradRef::Type type : {GradRef::Type::kBF16, GradRef::Type::kFP16}) {
      std::vector<float> acc(all.size(), 123.f);
      const GradRef g = type == GradRef::Type::kBF16 ? GradRef::bf16(all.data()) : GradRef::fp16(all.data());
      accumulate(acc.data(), g, static_cast<int64_t>(all.size()), 1.0f, true);
      int64_t mismatches = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        const float want = type == GradRef::Type::kBF16 ? bf16_to_float(all[i]) : fp16_to_float(all[i]);
        if (std::isnan(want)) {
          mismatches += !std::isnan(acc[i]);
        } else {
          mismatches += bits(acc[i]) != bits(0.0f + want);
        }
      }
      EXPECT_EQ(mismatches, 0) << host_isa_name(isa) << (type == GradRef::Type::kBF16 ? " bf16" : " fp16");
    }
  }
}

TEST(HostKernels, AdamWCoefficientsFollowTheStepCount) {
  AdamWParams p;
  p.lr = 1e-3;
  p.beta1 = 0.9;
  p.beta2 = 0.999;
  p.weight_decay = 0.1;
  const AdamWCoeffs c1 = AdamWCoeffs::make(p, 1);
  EXPECT_FLOAT_EQ(c1.step_size, 1e-2f);  // lr / (1 - 0.9)
  EXPECT_FLOAT_EQ(c1.inv_sqrt_bc2, static_cast<float>(1.0 / std::sqrt(0.001)));
  EXPECT_FLOAT_EQ(c1.decay, 1.0f - 1e-4f);
  const AdamWCoeffs c10 = AdamWCoeffs::make(p, 10);
  EXPECT_FLOAT_EQ(c10.step_size, static_cast<float>(1e-3 / (1.0 - std::pow(0.9, 10))));
  EXPECT_FLOAT_EQ(c10.inv_sqrt_bc2, static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(0.999, 10))));
}

TEST(HostIsa, NamesParseAndUnsupportedIsasAreRefused) {
  for (HostIsa isa : {HostIsa::kScalar, HostIsa::kAvx2, HostIsa::kAvx512})
    EXPECT_EQ(parse_host_isa(host_isa_name(isa)), isa);
  try {
    parse_host_isa("sse9");
    ADD_FAILURE() << "parse_host_isa accepted sse9";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(host_isa_supported(HostIsa::kScalar));
  EXPECT_TRUE(host_isa_supported(best_host_isa()));
  if (host_isa_supported(HostIsa::kAvx512)) {
    EXPECT_TRUE(host_isa_supported(HostIsa::kAvx2));
  }
  for (HostIsa isa : {HostIsa::kAvx2, HostIsa::kAvx512}) {
    if (!host_isa_supported(isa)) {
      EXPECT_THROW(set_host_isa(isa), std::invalid_argument);
    }
  }
}

// Child half of EnvironmentVariableSelectsTheIsa: runs only when that test re-executes
// this binary with ZENFLOW_TEST_ISA_CHILD set, and prints what the process resolved.
TEST(HostIsaChild, PrintsResolvedIsa) {
  if (std::getenv("ZENFLOW_TEST_ISA_CHILD") == nullptr)
    GTEST_SKIP() << "helper for HostIsa.EnvironmentVariableSelectsTheIsa";
  try {
    std::printf("RESOLVED_ISA=%s\n", host_isa_name(active_host_isa()));
  } catch (const std::exception& e) {
    std::printf("ISA_ERROR=%s\n", e.what());
  }
}

std::string run_child(const std::string& isa_env) {
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return "cannot read /proc/self/exe";
  self[len] = '\0';
  const std::string cmd = "ZENFLOW_TEST_ISA_CHILD=1 ZENFLOW_HOST_ISA=" + isa_env + " '" + std::string(self) +
                          "' --gtest_filter=HostIsaChild.PrintsResolvedIsa 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return "popen failed";
  std::string out;
  std::array<char, 512> buf;
  while (std::fgets(buf.data(), buf.size(), pipe) != nullptr) out += buf.data();
  pclose(pipe);
  return out;
}

TEST(HostIsa, EnvironmentVariableSelectsTheIsa) {
  for (HostIsa isa : {HostIsa::kScalar, HostIsa::kAvx2, HostIsa::kAvx512}) {
    const std::string out = run_child(host_isa_name(isa));
    if (host_isa_supported(isa)) {
      EXPECT_NE(out.find(std::string("RESOLVED_ISA=") + host_isa_name(isa)), std::string::npos) << out;
    } else {
      EXPECT_NE(out.find("ISA_ERROR=ZENFLOW_HOST_ISA="), std::string::npos) << out;
    }
  }
  const std::string bogus = run_child("bogus");
  EXPECT_NE(bogus.find("ISA_ERROR=ZENFLOW_HOST_ISA: unknown host ISA 'bogus'"), std::string::npos) << bogus;
}

}  // namespace
}  // namespace zenflow::engine
