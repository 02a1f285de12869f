// AdamW on a contiguous span: the device update of always-device (1-D and small) parameters.
#include "worker/engine/cuda/adamw_update.cuh"
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

template <typename E>
__global__ void __launch_bounds__(kThreads)
    dense_adamw_kernel(typename E::Storage* __restrict__ param, float* __restrict__ master,
                       const typename E::Storage* __restrict__ grad, float* __restrict__ m,
                       float* __restrict__ v, int64_t n, DeviceAdamWCoeffs c, float grad_scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n; e += stride) {
    const float g = __fmul_rn(E::load(grad[e]), grad_scale);
    const float p0 = master != nullptr ? master[e] : E::load(param[e]);
    float mm = m[e];
    float vv = v[e];
    const float p = adamw_update(p0, g, mm, vv, c);
    m[e] = mm;
    v[e] = vv;
    if (master != nullptr) master[e] = p;
    param[e] = E::store(p);
  }
}

}  // namespace

cudaError_t dense_adamw(void* param, float* master, const void* grad, DType dtype, float* m, float* v,
                        int64_t n, const DeviceAdamWCoeffs& coeffs, float grad_scale, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  if (param == nullptr || grad == nullptr || m == nullptr || v == nullptr) return cudaErrorInvalidValue;
  if (master == nullptr && dtype != DType::kF32) return cudaErrorInvalidValue;
  const int64_t blocks = ceil_div(n, kThreads) < kMaxBlocks ? ceil_div(n, kThreads) : kMaxBlocks;
  return dispatch_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    dense_adamw_kernel<E><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<typename E::Storage*>(param), master, static_cast<const typename E::Storage*>(grad), m, v,
        n, coeffs, grad_scale);
    return cudaGetLastError();
  });
}

}  // namespace zenflow::engine::cuda_kernels
