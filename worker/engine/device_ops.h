// Device-side tensor operations of the engine, one function per concept, dispatched to
// the CUDA kernels (cuda_ops.h) for CUDA tensors and to ATen ops + the host AdamW
// kernel for CPU tensors. Every AdamW here computes the adamw_kernel.h formula.
#pragma once

#include <ATen/ATen.h>

#include "worker/engine/adamw_kernel.h"

namespace zenflow::engine::device_ops {

// Per-column importance of grad2d [out, in]: sum_i g^2 (l1: sum_i |g|), fp32 [in].
at::Tensor column_scores(const at::Tensor& grad2d, bool l1);
// scores += column_scores(grad2d, l1), without a temporary on the CPU; there (fp32, contiguous)
// each column is summed row by row from the first: a column's bits do not depend on the
// other columns beside it (the engine's gradient norm relies on it).
void accumulate_column_scores(const at::Tensor& grad2d, bool l1, const at::Tensor& scores);

// AdamW on the columns `sel` of weight2d [out, in] with gradient columns of grad2d.
// master [out, k] fp32 holds the columns' master copy when the weight is not fp32
// (pass an undefined tensor for fp32 weights: the weight is its own master).
// m, v: [out, k] fp32. Updates master/m/v and the weight's columns in place.
void selected_adamw(const at::Tensor& weight2d, const at::Tensor& grad2d, const at::Tensor& sel,
                    const at::Tensor& master, const at::Tensor& m, const at::Tensor& v,
                    const AdamWCoeffs& c, float grad_scale);

// AdamW over a whole parameter (always-device parameters). master as above.
void dense_adamw(const at::Tensor& param, const at::Tensor& grad, const at::Tensor& master,
                 const at::Tensor& m, const at::Tensor& v, const AdamWCoeffs& c, float grad_scale);

// Indices on a CUDA device must be ascending and unique (those on the CPU may be in
// any order): an index naming every column is then taken to be the identity.
// staging[i, c] = grad2d[i, idx[c]]: the columns idx packed into a contiguous
// [out, n] buffer (one large copy for the D2H transfer). staging may be on another
// device (the host) when grad2d is on the CPU.
void gather_columns(const at::Tensor& grad2d, const at::Tensor& idx, const at::Tensor& staging);

// weight2d[i, idx[c]] = src[i, c] (cast to the weight's dtype).
void scatter_columns(const at::Tensor& weight2d, const at::Tensor& idx, const at::Tensor& src);

}  // namespace zenflow::engine::device_ops
