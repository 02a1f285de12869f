// Causal softmax attention shared by the decoders (Llama family, GPT-2).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace zenflow::model {

// softmax(q k^T * scale + causal mask) v for q, k, v of shape [B, heads, T, head_dim]
// (k and v already expanded to the query heads). With sliding_window > 0, query i sees
// keys j with i - sliding_window < j <= i; with 0, every j <= i. Returns
// [B, heads, T, head_dim] in q's dtype.
//
// LibTorch 1.x: matmul, softmax in fp32 (as HF's eager attention), cast back. LibTorch
// 2.x: the fused scaled_dot_product_attention (flash / memory-efficient kernels on
// CUDA): is_causal when there is no window, an explicit boolean mask otherwise.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            int64_t sliding_window);

}  // namespace zenflow::model
