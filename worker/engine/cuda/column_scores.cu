// Per-column importance of a 2-D gradient: scores[j] = sum_i g[i, j]^2 (or |g|), one pass.
//
// Threads run along j, so each warp reads a contiguous piece of a row. Rows are split into
// chunks across blockIdx.y so that narrow matrices still fill the GPU; each block writes a
// partial sum per column to the workspace and a second, tiny kernel adds the partials in
// chunk order. No atomics: the result does not depend on scheduling.
#include "worker/engine/cuda/cuda_kernels.h"
#include "worker/engine/cuda/element_types.cuh"

namespace zenflow::engine::cuda_kernels {
namespace {

constexpr int kColumnsPerBlock = 32;  // blockDim.x
constexpr int kRowLanes = 8;          // blockDim.y
constexpr int kThreads = kColumnsPerBlock * kRowLanes;
constexpr int64_t kTargetBlocks = 1024;
constexpr int64_t kMinRowsPerChunk = 64;

struct ChunkPlan {
  int64_t column_tiles;
  int64_t chunks;
  int64_t rows_per_chunk;
};

ChunkPlan plan_chunks(int64_t out, int64_t in) {
  ChunkPlan p;
  p.column_tiles = ceil_div(in, kColumnsPerBlock);
  int64_t chunks = ceil_div(kTargetBlocks, p.column_tiles);
  const int64_t max_chunks = ceil_div(out, kMinRowsPerChunk);
  if (chunks > max_chunks) chunks = max_chunks;
  if (chunks < 1) chunks = 1;
  p.rows_per_chunk = ceil_div(out, chunks);
  p.chunks = ceil_div(out, p.rows_per_chunk);
  return p;
}

template <typename E, bool kL1>
__device__ __forceinline__ float contribution(typename E::Storage x) {
  const float f = E::load(x);
  return kL1 ? fabsf(f) : __fmul_rn(f, f);
}

// dst[blockIdx.y * in + j] = the chunk's sum for column j.
template <typename E, bool kL1>
__global__ void __launch_bounds__(kThreads)
    column_partial_kernel(const typename E::Storage* __restrict__ grad, int64_t out, int64_t in,
                          int64_t rows_per_chunk, float* __restrict__ dst) {
  __shared__ float sums[kRowLanes][kColumnsPerBlock + 1];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColumnsPerBlock + threadIdx.x;
  const int64_t row_begin = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t row_end = min(out, row_begin + rows_per_chunk);
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  if (j < in) {
    const typename E::Storage* col = grad + j;
    int64_t i = row_begin + threadIdx.y;
    // Four independent rows in flight per thread.
    for (; i + 3 * kRowLanes < row_end; i += 4 * kRowLanes) {
      const typename E::Storage x0 = col[i * in];
      const typename E::Storage x1 = col[(i + kRowLanes) * in];
      const typename E::Storage x2 = col[(i + 2 * kRowLanes) * in];
      const typename E::Storage x3 = col[(i + 3 * kRowLanes) * in];
      acc[0] = __fadd_rn(acc[0], contribution<E, kL1>(x0));
      acc[1] = __fadd_rn(acc[1], contribution<E, kL1>(x1));
      acc[2] = __fadd_rn(acc[2], contribution<E, kL1>(x2));
      acc[3] = __fadd_rn(acc[3], contribution<E, kL1>(x3));
    }
    for (; i < row_end; i += kRowLanes) acc[0] = __fadd_rn(acc[0], contribution<E, kL1>(col[i * in]));
  }
  sums[threadIdx.y][threadIdx.x] = __fadd_rn(__fadd_rn(acc[0], acc[1]), __fadd_rn(acc[2], acc[3]));
  __syncthreads();
  if (threadIdx.y == 0 && j < in) {
    float s = sums[0][threadIdx.x];
#pragma unroll
    for (int y = 1; y < kRowLanes; ++y) s = __fadd_rn(s, sums[y][threadIdx.x]);
    dst[static_cast<int64_t>(blockIdx.y) * in + j] = s;
  }
}

// scores[j] = sum over chunks c, in order, of partial[c * in + j].
__global__ void column_finish_kernel(const float* __restrict__ partial, int64_t chunks, int64_t in,
                                     float* __restrict__ scores) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; j < in; j += stride) {
    float s = 0.f;
    for (int64_t c = 0; c < chunks; ++c) s = __fadd_rn(s, partial[c * in + j]);
    scores[j] = s;
  }
}

}  // namespace

size_t column_scores_workspace_bytes(int64_t out, int64_t in) {
  if (out <= 0 || in <= 0) return 0;
  const ChunkPlan p = plan_chunks(out, in);
  return p.chunks > 1 ? static_cast<size_t>(p.chunks * in) * sizeof(float) : 0;
}

cudaError_t column_scores(const void* grad, DType dtype, int64_t out, int64_t in, bool l1, float* scores,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream) {
  if (out < 0 || in < 0) return cudaErrorInvalidValue;
  if (in == 0) return cudaSuccess;
  if (scores == nullptr) return cudaErrorInvalidValue;
  if (out == 0) return cudaMemsetAsync(scores, 0, static_cast<size_t>(in) * sizeof(float), stream);
  if (grad == nullptr) return cudaErrorInvalidValue;
  const ChunkPlan p = plan_chunks(out, in);
  const size_t needed = column_scores_workspace_bytes(out, in);
  if (needed > 0 && (workspace == nullptr || workspace_bytes < needed)) return cudaErrorInvalidValue;
  float* partial = needed > 0 ? static_cast<float*>(workspace) : scores;
  return dispatch_dtype(dtype, [&](auto e) {
    using E = decltype(e);
    const auto* g = static_cast<const typename E::Storage*>(grad);
    const dim3 block(kColumnsPerBlock, kRowLanes);
    const dim3 grid(static_cast<unsigned>(p.column_tiles), static_cast<unsigned>(p.chunks));
    if (l1) {
      column_partial_kernel<E, true><<<grid, block, 0, stream>>>(g, out, in, p.rows_per_chunk, partial);
    } else {
      column_partial_kernel<E, false><<<grid, block, 0, stream>>>(g, out, in, p.rows_per_chunk, partial);
    }
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess || needed == 0) return err;
    const int threads = 256;
    const int64_t blocks = ceil_div(in, threads);
    column_finish_kernel<<<static_cast<unsigned>(blocks < 4096 ? blocks : 4096), threads, 0, stream>>>(
        partial, p.chunks, in, scores);
    return cudaGetLastError();
  });
}

}  // namespace zenflow::engine::cuda_kernels
