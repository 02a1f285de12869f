// Causal softmax attention, eager on LibTorch 1.x and fused on 2.x (see attention.h).
#include "worker/model/attention.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>
#include <limits>

namespace zenflow::model {
namespace {

// True where query i must not see key j: j > i, or j <= i - window.
at::Tensor blocked_positions(int64_t T, int64_t sliding_window, const at::Device& device) {
  const auto opts = at::TensorOptions().dtype(at::kBool).device(device);
  at::Tensor blocked = at::ones({T, T}, opts).triu(1);
  if (sliding_window > 0) blocked = blocked.logical_or(at::ones({T, T}, opts).tril(-sliding_window));
  return blocked;
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale,
                            int64_t sliding_window) {
  const int64_t T = q.size(2);
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  if (sliding_window <= 0 || sliding_window >= T)
    return at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                            /*is_causal=*/true, scale);
  const at::Tensor allowed = blocked_positions(T, sliding_window, q.device()).logical_not();
  return at::scaled_dot_product_attention(q, k, v, allowed, /*dropout_p=*/0.0, /*is_causal=*/false, scale);
#else
  at::Tensor scores = (at::matmul(q, k.transpose(-2, -1)) * scale).to(at::kFloat);
  scores = scores.masked_fill(blocked_positions(T, sliding_window, q.device()),
                              -std::numeric_limits<float>::infinity());
  const at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
  return at::matmul(probs, v);
#endif
}

}  // namespace zenflow::model
