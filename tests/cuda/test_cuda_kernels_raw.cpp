// Tests of the raw CUDA kernels (worker/engine/cuda) against plain host loops; no LibTorch.
//
// Built whenever ZENFLOW_CUDA=ON. Tests that need a GPU skip when none is present (CI);
// argument validation runs everywhere. AdamW results must equal the host formula bit for
// bit (the kernels avoid FMA contraction; this file is compiled with -ffp-contract=off).
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "worker/engine/cuda/cuda_kernels.h"

namespace zenflow::engine::cuda_kernels {
namespace {

#define ASSERT_CUDA_OK(expr)                                                   \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

bool gpu_present() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

// ---- host references ----------------------------------------------------------------------

uint16_t bf16_round(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t fp16_round(float f) { return __half_as_ushort(__float2half_rn(f)); }
float fp16_value(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Elements are stored as raw bits: float for kF32, uint16_t for the half types.
struct Elements {
  DType dtype;
  std::vector<float> f32;
  std::vector<uint16_t> bits;

  Elements(DType t, size_t n) : dtype(t) {
    if (t == DType::kF32)
      f32.assign(n, 0.f);
    else
      bits.assign(n, 0);
  }
  size_t size() const { return dtype == DType::kF32 ? f32.size() : bits.size(); }
  size_t element_bytes() const { return dtype == DType::kF32 ? 4 : 2; }
  void* data() { return dtype == DType::kF32 ? static_cast<void*>(f32.data()) : bits.data(); }
  float get(size_t i) const {
    switch (dtype) {
      case DType::kF32:
        return f32[i];
      case DType::kBF16:
        return bf16_value(bits[i]);
      case DType::kF16:
        return fp16_value(bits[i]);
    }
    return 0.f;
  }
  void set(size_t i, float f) {  // rounds to the element type
    switch (dtype) {
      case DType::kF32:
        f32[i] = f;
        break;
      case DType::kBF16:
        bits[i] = bf16_round(f);
        break;
      case DType::kF16:
        bits[i] = fp16_round(f);
        break;
    }
  }
  uint32_t raw(size_t i) const {
    if (dtype != DType::kF32) return bits[i];
    uint32_t u;
    std::memcpy(&u, &f32[i], 4);
    return u;
  }
};

DeviceAdamWCoeffs make_coeffs(double lr, double wd, int64_t t) {
  const double b1 = 0.9, b2 = 0.999;
  DeviceAdamWCoeffs c;
  c.beta1 = static_cast<float>(b1);
  c.beta2 = static_cast<float>(b2);
  c.one_minus_beta1 = static_cast<float>(1.0 - b1);
  c.one_minus_beta2 = static_cast<float>(1.0 - b2);
  c.decay = static_cast<float>(1.0 - lr * wd);
  c.step_size = static_cast<float>(lr / (1.0 - std::pow(b1, static_cast<double>(t))));
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(b2, static_cast<double>(t))));
  c.eps = 1e-8f;
  return c;
}

// The formula of worker/engine/adamw_kernel.h, written out.
float adamw_reference(float p, float g, float& m, float& v, const DeviceAdamWCoeffs& c) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * g * g;
  return p * c.decay - c.step_size * m / (std::sqrt(v) * c.inv_sqrt_bc2 + c.eps);
}

// ---- device memory ------------------------------------------------------------------------

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0 && cudaMalloc(&ptr_, bytes_) != cudaSuccess) ptr_ = nullptr;
  }
  template <typename T>
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size() * sizeof(T)) {
    upload(host.data());
  }
  explicit DeviceBuffer(Elements& host) : DeviceBuffer(host.size() * host.element_bytes()) {
    upload(host.data());
  }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void upload(const void* src) { cudaMemcpy(ptr_, src, bytes_, cudaMemcpyHostToDevice); }
  void download(void* dst) const { cudaMemcpy(dst, ptr_, bytes_, cudaMemcpyDeviceToHost); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_;
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_present()) GTEST_SKIP() << "no CUDA device: kernel runs skipped (build check only)";
    ASSERT_CUDA_OK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
  std::mt19937 rng_{12345};

  Elements random_elements(DType t, size_t n, float scale = 1.f) {
    std::normal_distribution<float> dist(0.f, scale);
    Elements e(t, n);
    for (size_t i = 0; i < n; ++i) e.set(i, dist(rng_));
    return e;
  }
  std::vector<int64_t> random_columns(int64_t in, int64_t k) {
    std::vector<int64_t> all(static_cast<size_t>(in));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(static_cast<size_t>(k));
    return all;  // distinct, unsorted
  }
};

const DType kAllTypes[] = {DType::kF32, DType::kBF16, DType::kF16};
std::string name_of(DType t) { return t == DType::kF32 ? "f32" : t == DType::kBF16 ? "bf16" : "f16"; }

// ---- tests without a GPU --------------------------------------------------------------------

TEST(CudaKernelArguments, InvalidArgumentsAreRejectedBeforeAnyLaunch) {
  float dummy = 0.f;
  const int64_t idx = 0;
  const DeviceAdamWCoeffs c = make_coeffs(1e-3, 0.0, 1);
  // A low-precision weight needs an fp32 master.
  EXPECT_EQ(
      selected_adamw(&dummy, &dummy, DType::kBF16, &idx, nullptr, &dummy, &dummy, 1, 1, 1, c, 1.f, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(dense_adamw(&dummy, nullptr, &dummy, DType::kF16, &dummy, &dummy, 1, c, 1.f, nullptr),
            cudaErrorInvalidValue);
  // More selected columns than columns; negative sizes; missing pointers.
  EXPECT_EQ(
      selected_adamw(&dummy, &dummy, DType::kF32, &idx, nullptr, &dummy, &dummy, 1, 1, 2, c, 1.f, nullptr),
      cudaErrorInvalidValue);
  EXPECT_EQ(gather_columns(&dummy, DType::kF32, -1, 1, &idx, 1, &dummy, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(scatter_columns(&dummy, DType::kF32, 1, 1, nullptr, 1, &dummy, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(column_scores(&dummy, DType::kF32, 1, 1, false, nullptr, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // A chunked problem without its workspace.
  ASSERT_GT(column_scores_workspace_bytes(100000, 64), 0u);
  EXPECT_EQ(column_scores(&dummy, DType::kF32, 100000, 64, false, &dummy, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  // Empty problems enqueue nothing and succeed.
  EXPECT_EQ(dense_adamw(nullptr, nullptr, nullptr, DType::kF32, nullptr, nullptr, 0, c, 1.f, nullptr),
            cudaSuccess);
  EXPECT_EQ(gather_columns(nullptr, DType::kBF16, 5, 5, nullptr, 0, nullptr, nullptr), cudaSuccess);
}

TEST(CudaKernelArguments, WorkspaceIsNeededOnlyWhenRowsAreSplit) {
  EXPECT_EQ(column_scores_workspace_bytes(3, 5), 0u);  // one chunk: scores written directly
  EXPECT_EQ(column_scores_workspace_bytes(0, 5), 0u);
  const size_t bytes = column_scores_workspace_bytes(8192, 2048);
  EXPECT_GT(bytes, 0u);
  EXPECT_EQ(bytes % (2048 * sizeof(float)), 0u);  // whole rows of partial sums
}

// ---- tests on the GPU -----------------------------------------------------------------------

TEST_F(CudaKernels, ColumnScoresMatchHostSums) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},     {3, 5},     {64, 33},
                                                {1000, 37}, {5000, 40}, {257, 1100}};
  for (DType t : kAllTypes) {
    for (auto [out, in] : shapes) {
      for (bool l1 : {false, true}) {
        SCOPED_TRACE(name_of(t) + " " + std::to_string(out) + "x" + std::to_string(in) +
                     (l1 ? " l1" : " l2"));
        Elements g = random_elements(t, static_cast<size_t>(out * in));
        DeviceBuffer dg(g);
        DeviceBuffer scores(static_cast<size_t>(in) * sizeof(float));
        const size_t ws_bytes = column_scores_workspace_bytes(out, in);
        DeviceBuffer ws(ws_bytes);
        ASSERT_CUDA_OK(
            column_scores(dg.get(), t, out, in, l1, scores.as<float>(), ws.get(), ws_bytes, stream_));
        ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
        std::vector<float> got(static_cast<size_t>(in));
        scores.download(got.data());
        for (int64_t j = 0; j < in; ++j) {
          double want = 0;
          for (int64_t i = 0; i < out; ++i) {
            const double x = g.get(static_cast<size_t>(i * in + j));
            want += l1 ? std::fabs(x) : x * x;
          }
          ASSERT_NEAR(got[static_cast<size_t>(j)], want, 1e-5 * want + 1e-30) << "column " << j;
        }
      }
    }
  }
}

TEST_F(CudaKernels, SelectedAdamWEqualsHostFormulaBitForBit) {
  struct Case {
    int64_t out, in, k;
  };
  const Case cases[] = {{7, 13, 1}, {64, 100, 100}, {33, 257, 50}, {300, 64, 7}};
  for (DType t : kAllTypes) {
    for (bool with_master : {true, false}) {
      if (!with_master && t != DType::kF32) continue;
      for (const Case& cs : cases) {
        SCOPED_TRACE(name_of(t) + (with_master ? " master " : " in-place ") + std::to_string(cs.out) + "x" +
                     std::to_string(cs.in) + " k=" + std::to_string(cs.k));
        const size_t nw = static_cast<size_t>(cs.out * cs.in), ns = static_cast<size_t>(cs.out * cs.k);
        Elements w = random_elements(t, nw);
        const std::vector<int64_t> sel = random_columns(cs.in, cs.k);
        std::vector<float> master(ns), m(ns, 0.f), v(ns, 0.f);
        for (int64_t i = 0; i < cs.out; ++i)
          for (int64_t c = 0; c < cs.k; ++c)
            master[static_cast<size_t>(i * cs.k + c)] =
                w.get(static_cast<size_t>(i * cs.in + sel[static_cast<size_t>(c)]));
        DeviceBuffer dw(w), dsel(sel), dmaster(master), dm(m), dv(v);
        Elements want_w = w;
        for (int64_t step = 1; step <= 3; ++step) {
          Elements g = random_elements(t, nw, 0.01f);
          DeviceBuffer dg(g);
          const DeviceAdamWCoeffs c = make_coeffs(1e-2, 0.1, step);
          const float gs = 0.5f;
          ASSERT_CUDA_OK(selected_adamw(dw.get(), dg.get(), t, dsel.as<int64_t>(),
                                        with_master ? dmaster.as<float>() : nullptr, dm.as<float>(),
                                        dv.as<float>(), cs.out, cs.in, cs.k, c, gs, stream_));
          for (int64_t i = 0; i < cs.out; ++i) {
            for (int64_t s = 0; s < cs.k; ++s) {
              const size_t e = static_cast<size_t>(i * cs.k + s);
              const size_t wi = static_cast<size_t>(i * cs.in + sel[static_cast<size_t>(s)]);
              const float p0 = with_master ? master[e] : want_w.get(wi);
              const float p = adamw_reference(p0, g.get(wi) * gs, m[e], v[e], c);
              master[e] = p;
              want_w.set(wi, p);
            }
          }
          ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
        }
        Elements got_w = w;
        dw.download(got_w.data());
        std::vector<float> got_m(ns), got_v(ns), got_master(ns);
        dm.download(got_m.data());
        dv.download(got_v.data());
        dmaster.download(got_master.data());
        for (size_t e = 0; e < ns; ++e) {
          ASSERT_EQ(got_m[e], m[e]) << "m " << e;
          ASSERT_EQ(got_v[e], v[e]) << "v " << e;
          if (with_master) {
            ASSERT_EQ(got_master[e], master[e]) << "master " << e;
          }
        }
        // Selected columns hold the rounded update; every other column is untouched.
        for (size_t i = 0; i < nw; ++i) ASSERT_EQ(got_w.raw(i), want_w.raw(i)) << "weight " << i;
      }
    }
  }
}

TEST_F(CudaKernels, DenseAdamWEqualsHostFormulaBitForBit) {
  for (DType t : kAllTypes) {
    for (bool with_master : {true, false}) {
      if (!with_master && t != DType::kF32) continue;
      for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{100003}}) {
        SCOPED_TRACE(name_of(t) + (with_master ? " master n=" : " in-place n=") + std::to_string(n));
        const size_t un = static_cast<size_t>(n);
        Elements p = random_elements(t, un);
        std::vector<float> master(un), m(un, 0.f), v(un, 0.f);
        for (size_t i = 0; i < un; ++i) master[i] = p.get(i);
        DeviceBuffer dp(p), dmaster(master), dm(m), dv(v);
        Elements want = p;
        for (int64_t step = 1; step <= 2; ++step) {
          Elements g = random_elements(t, un, 0.1f);
          DeviceBuffer dg(g);
          const DeviceAdamWCoeffs c = make_coeffs(3e-3, 0.01, step);
          ASSERT_CUDA_OK(dense_adamw(dp.get(), with_master ? dmaster.as<float>() : nullptr, dg.get(), t,
                                     dm.as<float>(), dv.as<float>(), n, c, 1.f, stream_));
          for (size_t i = 0; i < un; ++i) {
            const float p0 = with_master ? master[i] : want.get(i);
            master[i] = adamw_reference(p0, g.get(i), m[i], v[i], c);
            want.set(i, master[i]);
          }
          ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
        }
        Elements got = p;
        dp.download(got.data());
        std::vector<float> got_m(un), got_v(un), got_master(un);
        dm.download(got_m.data());
        dv.download(got_v.data());
        dmaster.download(got_master.data());
        for (size_t i = 0; i < un; ++i) {
          ASSERT_EQ(got.raw(i), want.raw(i)) << "param " << i;
          ASSERT_EQ(got_m[i], m[i]) << "m " << i;
          ASSERT_EQ(got_v[i], v[i]) << "v " << i;
          if (with_master) {
            ASSERT_EQ(got_master[i], master[i]) << "master " << i;
          }
        }
      }
    }
  }
}

TEST_F(CudaKernels, GatherPacksColumnsAndScatterPutsThemBack) {
  struct Case {
    int64_t out, in, n;
  };
  // 70000 rows: more than one grid row per matrix row (grid-stride over rows).
  const Case cases[] = {{1, 1, 1},     {31, 45, 17},     {100, 64, 64},
                        {1000, 70, 3}, {65, 2000, 1500}, {70000, 8, 5}};
  for (DType t : kAllTypes) {
    for (const Case& cs : cases) {
      SCOPED_TRACE(name_of(t) + " " + std::to_string(cs.out) + "x" + std::to_string(cs.in) +
                   " n=" + std::to_string(cs.n));
      const size_t nw = static_cast<size_t>(cs.out * cs.in), nst = static_cast<size_t>(cs.n * cs.out);
      Elements g = random_elements(t, nw);
      std::vector<int64_t> idx = random_columns(cs.in, cs.n);
      DeviceBuffer dg(g), didx(idx);
      Elements staging(t, nst);
      DeviceBuffer dst(staging);
      ASSERT_CUDA_OK(
          gather_columns(dg.get(), t, cs.out, cs.in, didx.as<int64_t>(), cs.n, dst.get(), stream_));
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
      dst.download(staging.data());
      for (int64_t c = 0; c < cs.n; ++c)
        for (int64_t i = 0; i < cs.out; ++i)
          ASSERT_EQ(staging.raw(static_cast<size_t>(i * cs.n + c)),
                    g.raw(static_cast<size_t>(i * cs.in + idx[static_cast<size_t>(c)])))
              << "c=" << c << " i=" << i;

      // Scatter new values into the same columns of a weight; the others stay as they were.
      Elements w = random_elements(t, nw);
      Elements src = random_elements(t, nst);
      DeviceBuffer dw(w), dsrc(src);
      ASSERT_CUDA_OK(
          scatter_columns(dw.get(), t, cs.out, cs.in, didx.as<int64_t>(), cs.n, dsrc.get(), stream_));
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
      Elements want = w;
      for (int64_t c = 0; c < cs.n; ++c)
        for (int64_t i = 0; i < cs.out; ++i)
          want.set(static_cast<size_t>(i * cs.in + idx[static_cast<size_t>(c)]),
                   src.get(static_cast<size_t>(i * cs.n + c)));
      Elements got = w;
      dw.download(got.data());
      for (size_t i = 0; i < nw; ++i) ASSERT_EQ(got.raw(i), want.raw(i)) << "weight " << i;
    }
  }
}

TEST_F(CudaKernels, OutOfRangeIndicesTouchNothing) {
  const int64_t out = 40, in = 10;
  std::vector<float> w(static_cast<size_t>(out * in), 1.f);
  std::vector<int64_t> idx = {3, -1, 10, 7};
  std::vector<float> src(static_cast<size_t>(out * 4), 2.f);
  DeviceBuffer dw(w), didx(idx), dsrc(src);
  ASSERT_CUDA_OK(scatter_columns(dw.get(), DType::kF32, out, in, didx.as<int64_t>(), 4, dsrc.get(), stream_));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<float> got(w.size());
  dw.download(got.data());
  for (int64_t i = 0; i < out; ++i)
    for (int64_t j = 0; j < in; ++j)
      ASSERT_EQ(got[static_cast<size_t>(i * in + j)], (j == 3 || j == 7) ? 2.f : 1.f) << i << "," << j;

  // Gather writes zeros for an invalid index.
  std::vector<float> staging(static_cast<size_t>(out * 4), 5.f);
  DeviceBuffer dst(staging);
  ASSERT_CUDA_OK(gather_columns(dw.get(), DType::kF32, out, in, didx.as<int64_t>(), 4, dst.get(), stream_));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  dst.download(staging.data());
  for (int64_t i = 0; i < out; ++i) {
    EXPECT_EQ(staging[static_cast<size_t>(i * 4 + 0)], 2.f);
    EXPECT_EQ(staging[static_cast<size_t>(i * 4 + 1)], 0.f);
    EXPECT_EQ(staging[static_cast<size_t>(i * 4 + 2)], 0.f);
    EXPECT_EQ(staging[static_cast<size_t>(i * 4 + 3)], 2.f);
  }
}

}  // namespace
}  // namespace zenflow::engine::cuda_kernels
