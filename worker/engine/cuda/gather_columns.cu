// Gathers selected columns of a [out, in] matrix into a contiguous, transposed [n, out] buffer.
//
// The staging buffer that the D2H copy reads in one piece. A 32x32 tile goes through
// shared memory so that both sides are coalesced: threads read along the gathered
// columns of a row (contiguous where the indices are) and write along a staging row.
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;  // blockDim.y; each thread moves kTile / kRowsPerPass elements
constexpr int kThreads = kTile * kRowsPerPass;
constexpr int64_t kMaxGridY = 65535;

// blockIdx.x: a tile of rows i; blockIdx.y (grid-stride): a tile of gathered columns c.
template <typename Bits>
__global__ void __launch_bounds__(kThreads)
    gather_columns_t_kernel(const Bits* __restrict__ grad, int64_t out, int64_t in,
                            const int64_t* __restrict__ idx, int64_t n, Bits* __restrict__ staging) {
  __shared__ Bits tile[kTile][kTile + 1];
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * kTile; c0 < n;
       c0 += static_cast<int64_t>(gridDim.y) * kTile) {
    const int64_t c = c0 + threadIdx.x;
    const int64_t j = c < n ? idx[c] : -1;
    const bool valid = j >= 0 && j < in;
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t i = i0 + r;
      tile[r][threadIdx.x] = (valid && i < out) ? grad[i * in + j] : Bits(0);
    }
    __syncthreads();
    const int64_t i = i0 + threadIdx.x;
    for (int r = threadIdx.y; r < kTile; r += kRowsPerPass) {
      const int64_t cc = c0 + r;
      if (cc < n && i < out) staging[cc * out + i] = tile[threadIdx.x][r];
    }
    __syncthreads();
  }
}

template <typename Bits>
cudaError_t launch(const void* grad, int64_t out, int64_t in, const int64_t* idx, int64_t n, void* staging,
                   cudaStream_t stream) {
  const int64_t tiles_y = ceil_div(n, kTile);
  const dim3 grid(static_cast<unsigned>(ceil_div(out, kTile)),
                  static_cast<unsigned>(tiles_y < kMaxGridY ? tiles_y : kMaxGridY));
  gather_columns_t_kernel<Bits><<<grid, dim3(kTile, kRowsPerPass), 0, stream>>>(
      static_cast<const Bits*>(grad), out, in, idx, n, static_cast<Bits*>(staging));
  return cudaGetLastError();
}

}  // namespace

cudaError_t gather_columns_t(const void* grad, DType dtype, int64_t out, int64_t in, const int64_t* idx,
                             int64_t n, void* staging, cudaStream_t stream) {
  if (out < 0 || in < 0 || n < 0) return cudaErrorInvalidValue;
  if (out == 0 || n == 0) return cudaSuccess;
  if (grad == nullptr || idx == nullptr || staging == nullptr) return cudaErrorInvalidValue;
  if (ceil_div(out, kTile) > 0x7fffffff) return cudaErrorInvalidValue;
  switch (dtype) {
    case DType::kF32:
      return launch<uint32_t>(grad, out, in, idx, n, staging, stream);
    case DType::kBF16:
    case DType::kF16:
      return launch<uint16_t>(grad, out, in, idx, n, staging, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace zenflow::engine::cuda_kernels
