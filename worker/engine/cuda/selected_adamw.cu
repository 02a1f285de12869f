// Fused gather + AdamW + scatter on a weight matrix's selected columns (the device updater).
//
// One thread per (row i, selected slot c). master/m/v are [out, k], so their accesses are
// coalesced along c; the weight and gradient are read at (i, sel[c]), contiguous in runs
// where the selected columns are. Nothing is staged: the update happens where the data is.
#include "worker/engine/cuda/adamw_update.cuh"
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// Index is uint32_t when out * k fits, which keeps the per-element division cheap.
template <typename E, typename Index>
__global__ void __launch_bounds__(kThreads)
    selected_adamw_kernel(typename E::Storage* __restrict__ weight,
                          const typename E::Storage* __restrict__ grad, const int64_t* __restrict__ sel,
                          float* __restrict__ master, float* __restrict__ m, float* __restrict__ v, Index out,
                          int64_t in, Index k, DeviceAdamWCoeffs c, float grad_scale) {
  const Index total = out * k;
  const Index stride = static_cast<Index>(gridDim.x) * kThreads;
  for (Index e = static_cast<Index>(blockIdx.x) * kThreads + threadIdx.x; e < total; e += stride) {
    const Index i = e / k;
    const Index slot = e - i * k;
    const int64_t j = sel[slot];
    if (j < 0 || j >= in) continue;
    const int64_t w = static_cast<int64_t>(i) * in + j;
    const float g = __fmul_rn(E::load(grad[w]), grad_scale);
    const float p0 = master != nullptr ? master[e] : E::load(weight[w]);
    float mm = m[e];
    float vv = v[e];
    const float p = adamw_update(p0, g, mm, vv, c);
    m[e] = mm;
    v[e] = vv;
    if (master != nullptr) master[e] = p;
    weight[w] = E::store(p);
  }
}

}  // namespace

cudaError_t selected_adamw(void* weight, const void* grad, DType dtype, const int64_t* sel, float* master,
                           float* m, float* v, int64_t out, int64_t in, int64_t k,
                           const DeviceAdamWCoeffs& coeffs, float grad_scale, cudaStream_t stream) {
  if (out < 0 || in < 0 || k < 0 || k > in) return cudaErrorInvalidValue;
  if (out == 0 || k == 0) return cudaSuccess;
  if (weight == nullptr || grad == nullptr || sel == nullptr || m == nullptr || v == nullptr) {
    return cudaErrorInvalidValue;
  }
  if (master == nullptr && dtype != DType::kF32) return cudaErrorInvalidValue;
  const int64_t total = out * k;
  const int64_t blocks = ceil_div(total, kThreads) < kMaxBlocks ? ceil_div(total, kThreads) : kMaxBlocks;
  return dispatch_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    auto* w = static_cast<typename E::Storage*>(weight);
    const auto* g = static_cast<const typename E::Storage*>(grad);
    // The grid-stride loop's last increment must not overflow the index type either.
    if (total + blocks * kThreads < (int64_t{1} << 31)) {
      selected_adamw_kernel<E, uint32_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          w, g, sel, master, m, v, static_cast<uint32_t>(out), in, static_cast<uint32_t>(k), coeffs,
          grad_scale);
    } else {
      selected_adamw_kernel<E, int64_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          w, g, sel, master, m, v, out, in, k, coeffs, grad_scale);
    }
    return cudaGetLastError();
  });
}

}  // namespace zenflow::engine::cuda_kernels
