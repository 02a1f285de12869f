// Autocast on CUDA for a scope: the trainer's forward pass and loss, and an activation-
// checkpointed layer's recompute in the backward (which runs on autograd's device thread,
// where the forward's thread-local autocast state is not set).
#pragma once

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

namespace zenflow::model {

// LibTorch 2.4 made the autocast state per device type (set_autocast_enabled(kCUDA, ...));
// earlier versions have the GPU-specific functions.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define ZENFLOW_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define ZENFLOW_AUTOCAST_BY_DEVICE_TYPE 0
#endif

// The CUDA autocast state of the calling thread.
struct AutocastState {
  bool enabled = false;
  at::ScalarType dtype = at::kBFloat16;
};

inline AutocastState current_cuda_autocast() {
#if ZENFLOW_AUTOCAST_BY_DEVICE_TYPE
  return {at::autocast::is_autocast_enabled(at::kCUDA), at::autocast::get_autocast_dtype(at::kCUDA)};
#else
  return {at::autocast::is_enabled(), at::autocast::get_autocast_gpu_dtype()};
#endif
}

// Turns CUDA autocast on with `dtype` for its lifetime when `on`; restores the previous
// state and, leaving the outermost scope, clears the cast cache.
class CudaAutocast {
 public:
  CudaAutocast(bool on, at::ScalarType dtype) : on_(on) {
    if (!on_) return;
    prev_ = current_cuda_autocast();
    set({true, dtype});
    at::autocast::increment_nesting();
  }
  ~CudaAutocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set(prev_);
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  static void set(const AutocastState& s) {
#if ZENFLOW_AUTOCAST_BY_DEVICE_TYPE
    at::autocast::set_autocast_dtype(at::kCUDA, s.dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, s.enabled);
#else
    at::autocast::set_autocast_gpu_dtype(s.dtype);
    at::autocast::set_enabled(s.enabled);
#endif
  }

  bool on_;
  AutocastState prev_;
};

}  // namespace zenflow::model
