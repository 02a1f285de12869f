// Scatters a contiguous [out, n] buffer into selected columns of a [out, in] matrix.
//
// The inverse of gather_columns: applies the host updater's output (already in the
// weight's dtype, after one H2D copy) to the device weight. Threads run along the
// source columns of one row: reads are coalesced, and so are writes wherever the
// indices are runs of consecutive columns.
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr int64_t kMaxGridY = 65535;

// blockIdx.x (grid-stride): a run of kThreads source columns c; blockIdx.y (grid-stride): rows i.
template <typename Bits>
__global__ void __launch_bounds__(kThreads)
    scatter_columns_kernel(Bits* __restrict__ weight, int64_t out, int64_t in,
                           const int64_t* __restrict__ idx, int64_t n, const Bits* __restrict__ src) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < n;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t j = idx[c];
    if (j < 0 || j >= in) continue;
    for (int64_t i = blockIdx.y; i < out; i += gridDim.y) weight[i * in + j] = src[i * n + c];
  }
}

template <typename Bits>
cudaError_t launch(void* weight, int64_t out, int64_t in, const int64_t* idx, int64_t n, const void* src,
                   cudaStream_t stream) {
  const int64_t blocks_x = ceil_div(n, kThreads);
  const dim3 grid(static_cast<unsigned>(blocks_x < kMaxGridX ? blocks_x : kMaxGridX),
                  static_cast<unsigned>(out < kMaxGridY ? out : kMaxGridY));
  scatter_columns_kernel<Bits><<<grid, kThreads, 0, stream>>>(static_cast<Bits*>(weight), out, in, idx, n,
                                                              static_cast<const Bits*>(src));
  return cudaGetLastError();
}

}  // namespace

cudaError_t scatter_columns(void* weight, DType dtype, int64_t out, int64_t in, const int64_t* idx, int64_t n,
                            const void* src, cudaStream_t stream) {
  if (out < 0 || in < 0 || n < 0) return cudaErrorInvalidValue;
  if (out == 0 || n == 0) return cudaSuccess;
  if (weight == nullptr || idx == nullptr || src == nullptr) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kF32:
      return launch<uint32_t>(weight, out, in, idx, n, src, stream);
    case DType::kBF16:
    case DType::kF16:
      return launch<uint16_t>(weight, out, in, idx, n, src, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zenflow::engine::cuda_kernels
