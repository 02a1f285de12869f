// Gathers selected columns of a [out, in] matrix into a contiguous [out, n] staging buffer.
//
// The staging buffer that the D2H copy reads in one piece, in the engine's packed layout
// (row i of the buffer holds row i's gathered columns, as the host updater's state).
// Threads run along the gathered columns of one row: writes are coalesced, and so are
// reads wherever the indices are runs of consecutive columns (the unselected 90%).
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr int64_t kMaxGridY = 65535;

// blockIdx.x (grid-stride): a run of kThreads gathered columns c; blockIdx.y (grid-stride): rows i.
template <typename Bits>
__global__ void __launch_bounds__(kThreads)
    gather_columns_kernel(const Bits* __restrict__ grad, int64_t out, int64_t in,
                          const int64_t* __restrict__ idx, int64_t n, Bits* __restrict__ staging) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; c < n;
       c += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t j = idx[c];
    const bool valid = j >= 0 && j < in;
    for (int64_t i = blockIdx.y; i < out; i += gridDim.y)
      staging[i * n + c] = valid ? grad[i * in + j] : Bits(0);
  }
}

template <typename Bits>
cudaError_t launch(const void* grad, int64_t out, int64_t in, const int64_t* idx, int64_t n, void* staging,
                   cudaStream_t stream) {
  const int64_t blocks_x = ceil_div(n, kThreads);
  const dim3 grid(static_cast<unsigned>(blocks_x < kMaxGridX ? blocks_x : kMaxGridX),
                  static_cast<unsigned>(out < kMaxGridY ? out : kMaxGridY));
  gather_columns_kernel<Bits><<<grid, kThreads, 0, stream>>>(static_cast<const Bits*>(grad), out, in, idx, n,
                                                             static_cast<Bits*>(staging));
  return cudaGetLastError();
}

}  // namespace

cudaError_t gather_columns(const void* grad, DType dtype, int64_t out, int64_t in, const int64_t* idx,
                           int64_t n, void* staging, cudaStream_t stream) {
  if (out < 0 || in < 0 || n < 0) return cudaErrorInvalidValue;
  if (out == 0 || n == 0) return cudaSuccess;
  if (grad == nullptr || idx == nullptr || staging == nullptr) return cudaErrorInvalidValue;
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
