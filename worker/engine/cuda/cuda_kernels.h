// Raw-pointer CUDA kernels of the GPU path: column scores, fused AdamW, column gather/scatter.
//
// These functions know nothing of LibTorch; worker/engine/cuda_ops.h wraps them for
// tensors. Contracts shared by every function below:
// - Pointers are device pointers to densely packed, row-major arrays. A 2-D weight or
//   gradient is [out, in]; a "column" j is W[:, j] (docs/semantics.md §1).
// - Work is enqueued on `stream` and the call returns at once; results are visible to
//   later work on that stream (or after synchronizing it).
// - Returns cudaSuccess, cudaErrorInvalidValue when an argument is invalid (then nothing
//   was enqueued), or the error of the launch itself. Empty problems enqueue nothing.
// - Index arrays are int64. An index outside [0, in) is skipped: no memory is touched
//   for it (destination elements that it would produce are left as they were, or 0 in
//   gather's staging buffer).
// - Thread safety: the functions are pure over their arguments and may be called from
//   several host threads at once; concurrent kernels must not write overlapping memory.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace zenflow::engine::cuda_kernels {

// Element type of weights, gradients and staging buffers. Optimizer state is always fp32.
enum class DType { kF32, kBF16, kF16 };

// AdamW coefficients as the kernels see them: the fields of engine::AdamWCoeffs
// (worker/engine/adamw_kernel.h), copied one to one, so device and host updates use the
// same floats.
struct DeviceAdamWCoeffs {
  float beta1;
  float beta2;
  float one_minus_beta1;
  float one_minus_beta2;
  float decay;
  float step_size;
  float inv_sqrt_bc2;
  float eps;
};

// ---- importance ------------------------------------------------------------------------

// Bytes of scratch memory column_scores() needs for a [out, in] gradient (0 for small
// problems). Depends only on the shape.
size_t column_scores_workspace_bytes(int64_t out, int64_t in);

// scores[j] = sum_i grad[i, j]^2 (or sum_i |grad[i, j]| when l1), fp32 accumulation, one
// pass over the gradient. The summation order is fixed, so results are deterministic.
// `workspace` must hold column_scores_workspace_bytes(out, in) bytes (may be null when
// that is 0) and must not be used by other work until this call's kernels have run.
cudaError_t column_scores(const void* grad, DType dtype, int64_t out, int64_t in, bool l1, float* scores,
                          void* workspace, size_t workspace_bytes, cudaStream_t stream);

// ---- AdamW -----------------------------------------------------------------------------
// Both kernels apply, per element, the exact host formula of adamw_kernel.h, with
// round-to-nearest operations and no fused multiply-add, so fp32 results equal the host
// scalar kernel's:
//   g = grad * grad_scale
//   m = beta1 * m + one_minus_beta1 * g
//   v = beta2 * v + one_minus_beta2 * g * g
//   p = p * decay - step_size * m / (sqrt(v) * inv_sqrt_bc2 + eps)
// p is the fp32 master when one is given (then the weight receives p rounded to nearest
// even in its dtype), else the weight itself, which must then be fp32.

// Fused gather + AdamW + scatter on the selected columns sel[0..k) of weight[out, in]:
// for row i and selected slot c, element (i, sel[c]) of weight/grad pairs with element
// (i, c) of master/m/v, which are [out, k] fp32. `grad` has the weight's dtype. The
// indices must be distinct. `master` may be null only when dtype is kF32.
cudaError_t selected_adamw(void* weight, const void* grad, DType dtype, const int64_t* sel, float* master,
                           float* m, float* v, int64_t out, int64_t in, int64_t k,
                           const DeviceAdamWCoeffs& coeffs, float grad_scale, cudaStream_t stream);

// The same update on a contiguous span of n elements (always-device parameters).
// `param` and `grad` have type `dtype`; `master` may be null only when dtype is kF32.
cudaError_t dense_adamw(void* param, float* master, const void* grad, DType dtype, float* m, float* v,
                        int64_t n, const DeviceAdamWCoeffs& coeffs, float grad_scale, cudaStream_t stream);

// ---- column transfer staging -------------------------------------------------------------

// staging[i, c] = grad[i, idx[c]] for i < out, c < n: the columns idx packed into one
// contiguous [out, n] buffer (one D2H copy), the layout of the host updater's packed
// state (row i holds row i's columns). Same dtype in and out.
cudaError_t gather_columns(const void* grad, DType dtype, int64_t out, int64_t in, const int64_t* idx,
                           int64_t n, void* staging, cudaStream_t stream);

// weight[i, idx[c]] = src[i, c]: the inverse of gather_columns, applying the host
// updater's [out, n] output to the device weight. Indices must be distinct (a repeated
// index makes the result unspecified among its sources).
cudaError_t scatter_columns(void* weight, DType dtype, int64_t out, int64_t in, const int64_t* idx, int64_t n,
                            const void* src, cudaStream_t stream);

}  // namespace zenflow::engine::cuda_kernels
