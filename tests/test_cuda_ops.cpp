// The CUDA kernels through their tensor wrappers (cuda_ops.h) against LibTorch references.
//
// Kernel runs need a CUDA build and a GPU and skip otherwise (ZENFLOW_TEST_DEVICE=cuda
// turns the skip into a failure); the CPU-build behaviour is tested everywhere.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "worker/engine/adamw_kernel.h"
#include "worker/engine/cuda_ops.h"
#include "worker/engine/device_ops.h"

namespace zenflow::engine {
namespace {

const at::ScalarType kWeightTypes[] = {at::kFloat, at::kBFloat16, at::kHalf};

// |got - want| <= rtol * |want| elementwise (a tiny absolute floor for exact zeros).
void expect_close(const at::Tensor& got, const at::Tensor& want, double rtol, const std::string& what) {
  const at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  ASSERT_EQ(g.sizes(), w.sizes()) << what;
  const at::Tensor err = (g - w).abs() - (w.abs() * rtol + 1e-30);
  EXPECT_LE(err.max().item<double>(), 0.0)
      << what << ": max relative error " << ((g - w).abs() / w.abs().clamp_min(1e-30)).max().item<double>();
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("ZENFLOW_TEST_DEVICE");
    if (env != nullptr && std::string(env) == "cuda") {
      ASSERT_TRUE(cuda_ops::available())
          << "ZENFLOW_TEST_DEVICE=cuda, but the CUDA kernels are not available";
    }
    if (!cuda_ops::available()) GTEST_SKIP() << "CUDA kernels not available in this build or no GPU";
    at::manual_seed(7);
  }
  static at::TensorOptions cuda(at::ScalarType t) { return at::TensorOptions().dtype(t).device(at::kCUDA); }
  static at::Tensor random_columns(int64_t in, int64_t k) {
    return at::randperm(in, at::TensorOptions().dtype(at::kLong)).slice(0, 0, k).to(at::kCUDA);
  }
};

TEST_F(CudaOps, ColumnScoresMatchTheSumOfSquaresAndOfAbsoluteValues) {
  const std::pair<int64_t, int64_t> shapes[] = {{1, 1},     {3, 5},      {64, 33},    {1000, 37},
                                                {5000, 40}, {257, 1100}, {4096, 2048}};
  for (at::ScalarType t : kWeightTypes) {
    for (auto [out, in] : shapes) {
      const at::Tensor g = at::randn({out, in}, cuda(at::kFloat)).to(t);
      const std::string what =
          std::string(c10::toString(t)) + " " + std::to_string(out) + "x" + std::to_string(in);
      expect_close(cuda_ops::column_scores(g, false), g.to(at::kDouble).pow(2).sum(0), 1e-5, what + " l2");
      expect_close(cuda_ops::column_scores(g, true), g.to(at::kDouble).abs().sum(0), 1e-5, what + " l1");
    }
  }
}

// The AdamW formula of adamw_kernel.h as separate ATen ops, each rounded to fp32.
void reference_adamw(at::Tensor& p, at::Tensor& m, at::Tensor& v, const at::Tensor& grad32,
                     const AdamWCoeffs& c, float gs) {
  const at::Tensor g = grad32 * gs;
  m = m * c.beta1 + g * c.one_minus_beta1;
  v = v * c.beta2 + (g * c.one_minus_beta2) * g;
  const at::Tensor denom = v.sqrt() * c.inv_sqrt_bc2 + c.eps;
  p = p * c.decay - (m * c.step_size) / denom;
}

TEST_F(CudaOps, SelectedAdamWMatchesTheReferenceAndRoundsWeightsExactly) {
  struct Case {
    int64_t out, in, k;
  };
  const Case cases[] = {{7, 13, 1}, {64, 100, 100}, {33, 257, 50}, {300, 64, 7}, {1024, 2048, 205}};
  AdamWParams params;
  params.lr = 1e-2;
  params.weight_decay = 0.1;
  for (at::ScalarType t : kWeightTypes) {
    for (bool with_master : {true, false}) {
      if (!with_master && t != at::kFloat) continue;
      for (const Case& cs : cases) {
        const std::string what = std::string(c10::toString(t)) + (with_master ? " master " : " in-place ") +
                                 std::to_string(cs.out) + "x" + std::to_string(cs.in) +
                                 " k=" + std::to_string(cs.k);
        at::Tensor weight = at::randn({cs.out, cs.in}, cuda(at::kFloat)).to(t);
        const at::Tensor weight_before = weight.clone();
        const at::Tensor sel = random_columns(cs.in, cs.k);
        at::Tensor master = weight.index_select(1, sel).to(at::kFloat).contiguous();
        at::Tensor m = at::zeros({cs.out, cs.k}, cuda(at::kFloat));
        at::Tensor v = at::zeros({cs.out, cs.k}, cuda(at::kFloat));
        at::Tensor ref_p = master.clone(), ref_m = m.clone(), ref_v = v.clone();
        for (int64_t step = 1; step <= 3; ++step) {
          const at::Tensor grad = (at::randn({cs.out, cs.in}, cuda(at::kFloat)) * 0.01).to(t);
          const AdamWCoeffs c = AdamWCoeffs::make(params, step);
          cuda_ops::selected_adamw(weight, grad, sel, with_master ? &master : nullptr, m, v, c, 0.5f);
          reference_adamw(ref_p, ref_m, ref_v, grad.index_select(1, sel).to(at::kFloat), c, 0.5f);
        }
        expect_close(m, ref_m, 1e-6, what + " m");
        expect_close(v, ref_v, 1e-6, what + " v");
        const at::Tensor updated = weight.index_select(1, sel);
        if (with_master) {
          expect_close(master, ref_p, 1e-6, what + " master");
          // The weight is the master rounded to nearest even in the weight's dtype, exactly.
          EXPECT_TRUE(at::equal(updated, master.to(t))) << what;
        } else {
          expect_close(updated, ref_p, 1e-6, what + " weight");
        }
        // Unselected columns are untouched.
        const at::Tensor unselected = at::ones({cs.in}, cuda(at::kBool)).index_fill_(0, sel, false);
        EXPECT_TRUE(at::equal(weight.index({at::indexing::Slice(), unselected}),
                              weight_before.index({at::indexing::Slice(), unselected})))
            << what;
      }
    }
  }
}

TEST_F(CudaOps, SelectedAdamWEqualsTheHostKernel) {
  // The device and host updaters must give the same numbers for a column (semantics §3).
  const int64_t out = 129, in = 77, k = 20;
  AdamWParams params;
  params.lr = 3e-3;
  params.weight_decay = 0.01;
  at::Tensor weight = at::randn({out, in}, cuda(at::kFloat)).to(at::kBFloat16);
  const at::Tensor sel = random_columns(in, k);
  at::Tensor master = weight.index_select(1, sel).to(at::kFloat).contiguous();
  at::Tensor m = at::zeros({out, k}, cuda(at::kFloat)), v = at::zeros({out, k}, cuda(at::kFloat));
  at::Tensor host_p = master.cpu(), host_m = m.cpu(), host_v = v.cpu();
  at::Tensor host_half = at::empty({out, k}, at::kBFloat16);
  for (int64_t step = 1; step <= 4; ++step) {
    const at::Tensor grad = (at::randn({out, in}, cuda(at::kFloat)) * 0.1).to(at::kBFloat16);
    const AdamWCoeffs c = AdamWCoeffs::make(params, step);
    cuda_ops::selected_adamw(weight, grad, sel, &master, m, v, c, 0.25f);
    const at::Tensor host_grad = grad.index_select(1, sel).cpu().contiguous();
    AdamWSpan span;
    span.p = host_p.data_ptr<float>();
    span.m = host_m.data_ptr<float>();
    span.v = host_v.data_ptr<float>();
    span.grad = GradRef::bf16(reinterpret_cast<const uint16_t*>(host_grad.data_ptr()));
    span.half_out = reinterpret_cast<uint16_t*>(host_half.data_ptr());
    span.half_kind = HalfKind::kBF16;
    span.n = out * k;
    adamw_step(span, c, 0.25f);
  }
  expect_close(master, host_p, 1e-6, "master");
  expect_close(m, host_m, 1e-6, "m");
  expect_close(v, host_v, 1e-6, "v");
  // Where the fp32 masters agree bit for bit, so must the rounded bf16 weights.
  if (at::equal(master.cpu(), host_p)) {
    EXPECT_TRUE(at::equal(weight.index_select(1, sel).cpu(), host_half));
  }
}

TEST_F(CudaOps, DenseAdamWMatchesTheReference) {
  const std::vector<std::vector<int64_t>> shapes = {{1}, {4095}, {3, 7}, {2, 3, 1000}};
  AdamWParams params;
  params.lr = 1e-3;
  for (at::ScalarType t : kWeightTypes) {
    for (const auto& shape : shapes) {
      const std::string what =
          std::string(c10::toString(t)) + " numel " + std::to_string(at::empty(shape).numel());
      at::Tensor param = at::randn(shape, cuda(at::kFloat)).to(t);
      at::Tensor master = param.to(at::kFloat);
      at::Tensor m = at::zeros(shape, cuda(at::kFloat)), v = at::zeros(shape, cuda(at::kFloat));
      at::Tensor ref_p = master.clone(), ref_m = m.clone(), ref_v = v.clone();
      const bool in_place = t == at::kFloat;
      for (int64_t step = 1; step <= 3; ++step) {
        const at::Tensor grad = at::randn(shape, cuda(at::kFloat)).to(t);
        const AdamWCoeffs c = AdamWCoeffs::make(params, step);
        cuda_ops::dense_adamw(param, in_place ? nullptr : &master, grad, m, v, c, 1.f);
        reference_adamw(ref_p, ref_m, ref_v, grad.to(at::kFloat), c, 1.f);
      }
      expect_close(m, ref_m, 1e-6, what + " m");
      expect_close(v, ref_v, 1e-6, what + " v");
      if (in_place) {
        expect_close(param, ref_p, 1e-6, what + " param");
      } else {
        expect_close(master, ref_p, 1e-6, what + " master");
        EXPECT_TRUE(at::equal(param, master.to(t))) << what;
      }
    }
  }
}

TEST_F(CudaOps, GatherAndScatterMoveColumnsExactly) {
  struct Case {
    int64_t out, in, n;
  };
  const Case cases[] = {{1, 1, 1},     {31, 45, 17},     {100, 64, 64},
                        {1000, 70, 3}, {65, 2000, 1500}, {2048, 5632, 5069}};
  for (at::ScalarType t : kWeightTypes) {
    for (const Case& cs : cases) {
      const std::string what = std::string(c10::toString(t)) + " " + std::to_string(cs.out) + "x" +
                               std::to_string(cs.in) + " n=" + std::to_string(cs.n);
      const at::Tensor grad = at::randn({cs.out, cs.in}, cuda(at::kFloat)).to(t);
      at::Tensor idx = random_columns(cs.in, cs.n);
      at::Tensor staging = at::empty({cs.out, cs.n}, cuda(t));
      cuda_ops::gather_columns(grad, idx, staging);
      EXPECT_TRUE(at::equal(staging, grad.index_select(1, idx))) << what;

      at::Tensor weight = at::randn({cs.out, cs.in}, cuda(at::kFloat)).to(t);
      const at::Tensor src = at::randn({cs.out, cs.n}, cuda(at::kFloat)).to(t);
      at::Tensor expected = weight.clone();
      expected.index_copy_(1, idx, src);
      cuda_ops::scatter_columns(weight, idx, src);
      EXPECT_TRUE(at::equal(weight, expected)) << what;
    }
  }
}

// The engine's entry points (device_ops) take the kernels for contiguous tensors of one
// dtype and ATen otherwise: both give index_select / index_copy_'s result, with the
// ascending index runs the engine passes (the unselected columns) and a scattered list.
TEST_F(CudaOps, DeviceOpsMoveColumnsExactlyThroughKernelsAndFallbacks) {
  const int64_t out = 300, in = 1000;
  const at::Tensor runs =
      at::cat({at::arange(0, 400, cuda(at::kLong)), at::arange(450, 980, cuda(at::kLong))});
  const at::Tensor scattered = std::get<0>(at::sort(random_columns(in, 77)));
  for (at::ScalarType t : kWeightTypes) {
    for (const at::Tensor& idx : {runs, scattered}) {
      const std::string what = std::string(c10::toString(t)) + " n=" + std::to_string(idx.numel());
      const at::Tensor grad = at::randn({out, in}, cuda(at::kFloat)).to(t);
      at::Tensor staging = at::empty({out, idx.numel()}, cuda(t));
      device_ops::gather_columns(grad, idx, staging);
      EXPECT_TRUE(at::equal(staging, grad.index_select(1, idx))) << what;
      // A strided view of a larger buffer goes through ATen.
      at::Tensor wide = at::zeros({out, idx.numel() + 3}, cuda(t));
      at::Tensor view = wide.narrow(1, 1, idx.numel());
      device_ops::gather_columns(grad, idx, view);
      EXPECT_TRUE(at::equal(view, grad.index_select(1, idx))) << what << " (strided)";

      // fp32 host output into a low-precision weight: cast, then scattered.
      at::Tensor weight = at::randn({out, in}, cuda(at::kFloat)).to(t);
      const at::Tensor src = at::randn({out, idx.numel()}, cuda(at::kFloat));
      at::Tensor expected = weight.clone();
      expected.index_copy_(1, idx, src.to(t));
      device_ops::scatter_columns(weight, idx, src);
      EXPECT_TRUE(at::equal(weight, expected)) << what;
    }
  }
}

TEST_F(CudaOps, BadArgumentsAreRejectedWithTheirName) {
  const AdamWCoeffs c = AdamWCoeffs::make(AdamWParams{}, 1);
  at::Tensor w16 = at::zeros({4, 6}, cuda(at::kBFloat16));
  at::Tensor w32 = at::zeros({4, 6}, cuda(at::kFloat));
  const at::Tensor sel = at::arange(2, cuda(at::kLong));
  at::Tensor m = at::zeros({4, 2}, cuda(at::kFloat)), v = at::zeros({4, 2}, cuda(at::kFloat));
  auto message_of = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "no std::invalid_argument";
  };
  // A bf16 weight without a master.
  EXPECT_NE(
      message_of([&] { cuda_ops::selected_adamw(w16, w16, sel, nullptr, m, v, c, 1.f); }).find("master"),
      std::string::npos);
  // Gradient of another dtype; state of the wrong shape; CPU and non-contiguous tensors.
  EXPECT_NE(
      message_of([&] { cuda_ops::selected_adamw(w32, w16, sel, nullptr, m, v, c, 1.f); }).find("grad2d"),
      std::string::npos);
  at::Tensor m_bad = at::zeros({4, 3}, cuda(at::kFloat));
  EXPECT_NE(message_of([&] {
              cuda_ops::selected_adamw(w32, w32, sel, nullptr, m_bad, v, c, 1.f);
            }).find("m must have shape"),
            std::string::npos);
  EXPECT_NE(message_of([&] {
              cuda_ops::column_scores(at::zeros({4, 6}), false);
            }).find("CUDA tensor"),
            std::string::npos);
  EXPECT_NE(message_of([&] { cuda_ops::column_scores(w32.t(), false); }).find("contiguous"),
            std::string::npos);
  at::Tensor staging = at::empty({2, 5}, cuda(at::kFloat));
  EXPECT_NE(message_of([&] { cuda_ops::gather_columns(w32, sel, staging); }).find("staging"),
            std::string::npos);
  EXPECT_NE(message_of([&] { cuda_ops::scatter_columns(w32, sel.to(at::kInt), staging); }).find("idx"),
            std::string::npos);
}

#ifndef ZENFLOW_WITH_CUDA_OPS
TEST(CudaOpsWithoutCuda, EveryFunctionSaysTheBuildHasNoKernels) {
  EXPECT_FALSE(cuda_ops::available());
  at::Tensor w = at::zeros({2, 3});
  const at::Tensor idx = at::zeros({1}, at::kLong);
  const AdamWCoeffs c;
  EXPECT_THROW(cuda_ops::column_scores(w, false), std::logic_error);
  EXPECT_THROW(cuda_ops::selected_adamw(w, w, idx, nullptr, w, w, c, 1.f), std::logic_error);
  EXPECT_THROW(cuda_ops::dense_adamw(w, nullptr, w, w, w, c, 1.f), std::logic_error);
  EXPECT_THROW(cuda_ops::gather_columns(w, idx, w), std::logic_error);
  EXPECT_THROW(cuda_ops::scatter_columns(w, idx, w), std::logic_error);
}
#endif

}  // namespace
}  // namespace zenflow::engine
