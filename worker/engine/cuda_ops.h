// The CUDA kernels of worker/engine/cuda for LibTorch tensors: device updater, importance, staging.
//
// Every function enqueues work on the current CUDA stream of its tensors' device
// (c10::cuda::getCurrentCUDAStream) and returns without synchronizing; ordering with other
// streams is the caller's (see DeviceStreams). Unless said otherwise, tensors must be
// CUDA tensors on one device and contiguous; 2-D weights/gradients are [out, in]
// (column j = W[:, j]); weights, gradients and staging buffers are fp32, bf16 or fp16;
// optimizer state (master, m, v) is fp32; index tensors are int64 on the device.
//
// Errors: std::invalid_argument for a wrong device, dtype, layout or shape (nothing is
// enqueued); std::runtime_error for a CUDA error; std::logic_error from every function
// when the build has no CUDA kernels (then available() is false).
// Thread safety: as for ATen ops; each thread enqueues on its own current stream.
#pragma once

#include <ATen/core/Tensor.h>

#include "worker/engine/adamw_kernel.h"

namespace zenflow::engine::cuda_ops {

// True when this build has the CUDA kernels (LibTorch with CUDA and ZENFLOW_CUDA=ON) and
// a CUDA device is visible.
bool available();

// The CUDA caching allocator's bytes given to tensors on `device`: now, and the most at
// once since the last reset_allocator_peak (or the process's start).
struct AllocatorBytes {
  int64_t allocated = 0;
  int64_t peak = 0;
};
AllocatorBytes allocator_bytes(int device);
void reset_allocator_peak(int device);
// The device's free memory as the driver reports it (cudaMemGetInfo): what a job may still
// allocate, other processes' use taken out.
int64_t device_free_bytes(int device);

// Per-column importance of grad2d [out, in]: fp32 [in], sum_i g[i, j]^2 (sum |g| when l1),
// accumulated in fp32. Deterministic.
at::Tensor column_scores(const at::Tensor& grad2d, bool l1);

// The device updater on the selected columns `sel` [k] (distinct) of weight2d [out, in]:
// AdamW (adamw_kernel.h's formula, bit-compatible with the host kernel) with gradient
// grad2d * grad_scale. m, v and *master are [out, k]; column slot c pairs with weight
// column sel[c]. With a master, the update runs on it and the weight receives it rounded
// to its dtype; master may be null only for an fp32 weight (updated in place).
void selected_adamw(at::Tensor& weight2d, const at::Tensor& grad2d, const at::Tensor& sel, at::Tensor* master,
                    at::Tensor& m, at::Tensor& v, const AdamWCoeffs& c, float grad_scale);

// The same update over all elements of `param` (always-device parameters, any shape);
// grad, m, v and *master have param's number of elements.
void dense_adamw(at::Tensor& param, at::Tensor* master, const at::Tensor& grad, at::Tensor& m, at::Tensor& v,
                 const AdamWCoeffs& c, float grad_scale);

// staging[i, c] = grad2d[i, idx[c]]: staging is [out, n] in grad2d's dtype, on the device,
// ready for one contiguous D2H copy (device_ops::gather_columns' layout).
void gather_columns(const at::Tensor& grad2d, const at::Tensor& idx, const at::Tensor& staging);

// weight2d[i, idx[c]] = src[i, c]: src is [out, n] in weight2d's dtype, on the device;
// idx entries must be distinct.
void scatter_columns(const at::Tensor& weight2d, const at::Tensor& idx, const at::Tensor& src);

}  // namespace zenflow::engine::cuda_ops
