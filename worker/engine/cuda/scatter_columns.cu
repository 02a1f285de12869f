// Scatters a contiguous, transposed [n, out] buffer into selected columns of a [out, in] matrix.
//
// The inverse of gather_columns_t: applies the host updater's output (already in the
// weight's dtype) to the device weight after one H2D copy. Same 32x32 shared-memory tile:
// threads read along a source row and write along the scattered columns of a weight row.
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;
constexpr int kThreads = kTile * kRowsPerPass;
constexpr int64_t kMaxGridY = 65535;

// blockIdx.x: a tile of weight rows i; blockIdx.y (grid-stride): a tile of source rows c.
template <typename Bits>
__global__ void __launch_bounds__(kThreads)
    scatter_columns_t_kernel(Bits* __restrict__ weight, int64_t out, int64_t in,
                             const int64_t* __restrict__ idx, int64_t n, const Bits* __restrict__ src) {
  __shared__ Bits tile[kTile][kTile + 1];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile; c0 < n;
       c0 += static_cast<int64_t>(gridDim.y) * kTile) {
    const int64_t i = i0 + threadIdx.x;
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t c = c0 + r;
      if (c < n && i < out) tile[r][threadIdx.x] = src[c * out + i];
    }
    __syncthreads();
    const int64_t c = c0 + threadIdx.x;
    const int64_t j = c < n ? idx[c] : -1;
    if (j >= 0 && j < in) {
      for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
        const int64_t row = i0 + r;
        if (row < out) weight[row * in + j] = tile[threadIdx.x][r];
      }
    }
    __syncthreads();
  }
}

template <typename Bits>
cudaError_t launch(void* weight, int64_t out, int64_t in, const int64_t* idx, int64_t n, const void* src,
                   cudaStream_t stream) {
  const int64_t tiles_y = ceil_div(n, kTile);
  const dim3 grid(static_cast<unsigned>(ceil_div(out, kTile)),
                  static_cast<unsigned>(tiles_y < kMaxGridY ? tiles_y : kMaxGridY));
  scatter_columns_t_kernel<Bits><<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(
      static_cast<Bits*>(weight), out, in, idx, n, static_cast<const Bits*>(src));
  return cudaGetLastError();
}

}  // namespace

cudaError_t scatter_columns_t(void* weight, DType dtype, int64_t out, int64_t in, const int64_t* idx,
                              int64_t n, const void* src, cudaStream_t stream) {
  if (out < 0 || in < 0 || n < 0) return cudaErrorInvalidValue;
  if (out == 0 || n == 0) return cudaSuccess;
  if (weight == nullptr || idx == nullptr || src == nullptr) return cudaErrorInvalidValue;
  if (ceil_div(out, kTile) > 0x7fffffff) return cudaErrorInvalidValue;
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
