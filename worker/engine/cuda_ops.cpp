// LibTorch-tensor wrappers of the CUDA kernels; without CUDA kernels in the build, they throw.
#include "worker/engine/cuda_ops.h"

#include <stdexcept>
#include <string>

#ifdef ZENFLOW_WITH_CUDA_OPS
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "worker/engine/cuda/cuda_kernels.h"
#endif

namespace zenflow::engine::cuda_ops {

#ifdef ZENFLOW_WITH_CUDA_OPS

namespace {

namespace k = zenflow::engine::cuda_kernels;

[[noreturn]] void fail(const char* fn, const std::string& what) {
  throw std::invalid_argument(std::string("cuda_ops::") + fn + ": " + what);
}

void check(cudaError_t err, const char* fn) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("cuda_ops::") + fn + ": CUDA error: " + cudaGetErrorString(err));
  }
}

k::DType dtype_of(const at::Tensor& t, const char* fn, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat:
      return k::DType::kF32;
    case at::kBFloat16:
      return k::DType::kBF16;
    case at::kHalf:
      return k::DType::kF16;
    default:
      fail(fn, std::string(name) + " must be float32, bfloat16 or float16, got " +
                   std::string(c10::toString(t.scalar_type())));
  }
}

// A defined, contiguous CUDA tensor on `device`.
void require_device_tensor(const at::Tensor& t, const c10::Device& device, const char* fn, const char* name) {
  if (!t.defined()) fail(fn, std::string(name) + " is undefined");
  if (!t.is_cuda()) fail(fn, std::string(name) + " must be a CUDA tensor, got " + t.device().str());
  if (t.device() != device)
    fail(fn, std::string(name) + " is on " + t.device().str() + ", expected " + device.str());
  if (!t.is_contiguous()) fail(fn, std::string(name) + " must be contiguous");
}

void require_dtype(const at::Tensor& t, at::ScalarType want, const char* fn, const char* name) {
  if (t.scalar_type() != want) {
    fail(fn,
         std::string(name) + " must be " + c10::toString(want) + ", got " + c10::toString(t.scalar_type()));
  }
}

void require_shape(const at::Tensor& t, at::IntArrayRef want, const char* fn, const char* name) {
  if (t.sizes() != want) {
    std::string w = "[", g = "[";
    for (size_t i = 0; i < want.size(); ++i) w += (i ? ", " : "") + std::to_string(want[i]);
    for (size_t i = 0; i < t.sizes().size(); ++i) g += (i ? ", " : "") + std::to_string(t.sizes()[i]);
    fail(fn, std::string(name) + " must have shape " + w + "], got " + g + "]");
  }
}

void require_2d(const at::Tensor& t, const char* fn, const char* name) {
  if (t.dim() != 2) fail(fn, std::string(name) + " must be 2-D, got " + std::to_string(t.dim()) + "-D");
}

void require_index(const at::Tensor& idx, const c10::Device& device, const char* fn, const char* name) {
  require_device_tensor(idx, device, fn, name);
  require_dtype(idx, at::kLong, fn, name);
  if (idx.dim() != 1) fail(fn, std::string(name) + " must be 1-D");
}

k::DeviceAdamWCoeffs to_device(const AdamWCoeffs& c) {
  return {c.beta1, c.beta2,     c.one_minus_beta1, c.one_minus_beta2,
          c.decay, c.step_size, c.inv_sqrt_bc2,    c.eps};
}

cudaStream_t current_stream(const c10::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

}  // namespace

bool available() { return c10::cuda::device_count() > 0; }

// Index 0 of the allocator's per-pool statistics is the aggregate over pools (StatType::
// AGGREGATE, whose namespace moved between LibTorch versions).
AllocatorBytes allocator_bytes(int device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return {static_cast<int64_t>(stats.allocated_bytes[0].current), static_cast<int64_t>(stats.allocated_bytes[0].peak)};
}

void reset_allocator_peak(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

int64_t device_free_bytes(int device) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "device_free_bytes");
  return static_cast<int64_t>(free);
}

at::Tensor column_scores(const at::Tensor& grad2d, bool l1) {
  constexpr const char* fn = "column_scores";
  if (!grad2d.defined()) fail(fn, "grad2d is undefined");
  const c10::Device device = grad2d.device();
  require_device_tensor(grad2d, device, fn, "grad2d");
  require_2d(grad2d, fn, "grad2d");
  const k::DType dtype = dtype_of(grad2d, fn, "grad2d");
  const int64_t out = grad2d.size(0), in = grad2d.size(1);
  c10::cuda::CUDAGuard guard(device);
  const auto opts = grad2d.options().dtype(at::kFloat);
  at::Tensor scores = at::empty({in}, opts);
  const size_t ws_bytes = k::column_scores_workspace_bytes(out, in);
  at::Tensor workspace;
  if (ws_bytes > 0) workspace = at::empty({static_cast<int64_t>(ws_bytes / sizeof(float))}, opts);
  check(k::column_scores(grad2d.data_ptr(), dtype, out, in, l1, scores.data_ptr<float>(),
                         ws_bytes > 0 ? workspace.data_ptr() : nullptr, ws_bytes, current_stream(device)),
        fn);
  return scores;
}

void selected_adamw(at::Tensor& weight2d, const at::Tensor& grad2d, const at::Tensor& sel, at::Tensor* master,
                    at::Tensor& m, at::Tensor& v, const AdamWCoeffs& c, float grad_scale) {
  constexpr const char* fn = "selected_adamw";
  if (!weight2d.defined()) fail(fn, "weight2d is undefined");
  const c10::Device device = weight2d.device();
  require_device_tensor(weight2d, device, fn, "weight2d");
  require_2d(weight2d, fn, "weight2d");
  const k::DType dtype = dtype_of(weight2d, fn, "weight2d");
  const int64_t out = weight2d.size(0), in = weight2d.size(1);
  require_device_tensor(grad2d, device, fn, "grad2d");
  require_dtype(grad2d, weight2d.scalar_type(), fn, "grad2d");
  require_shape(grad2d, weight2d.sizes(), fn, "grad2d");
  require_index(sel, device, fn, "sel");
  const int64_t kk = sel.size(0);
  if (kk > in)
    fail(fn, "more selected columns (" + std::to_string(kk) + ") than columns (" + std::to_string(in) + ")");
  const std::vector<int64_t> state_shape = {out, kk};
  for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{&m, "m"}, {&v, "v"}}) {
    require_device_tensor(*t, device, fn, name);
    require_dtype(*t, at::kFloat, fn, name);
    require_shape(*t, state_shape, fn, name);
  }
  if (master != nullptr) {
    require_device_tensor(*master, device, fn, "master");
    require_dtype(*master, at::kFloat, fn, "master");
    require_shape(*master, state_shape, fn, "master");
  } else if (dtype != k::DType::kF32) {
    fail(fn, "a " + std::string(c10::toString(weight2d.scalar_type())) + " weight needs an fp32 master");
  }
  c10::cuda::CUDAGuard guard(device);
  check(k::selected_adamw(weight2d.data_ptr(), grad2d.data_ptr(), dtype, sel.data_ptr<int64_t>(),
                          master != nullptr ? master->data_ptr<float>() : nullptr, m.data_ptr<float>(),
                          v.data_ptr<float>(), out, in, kk, to_device(c), grad_scale, current_stream(device)),
        fn);
}

void dense_adamw(at::Tensor& param, at::Tensor* master, const at::Tensor& grad, at::Tensor& m, at::Tensor& v,
                 const AdamWCoeffs& c, float grad_scale) {
  constexpr const char* fn = "dense_adamw";
  if (!param.defined()) fail(fn, "param is undefined");
  const c10::Device device = param.device();
  require_device_tensor(param, device, fn, "param");
  const k::DType dtype = dtype_of(param, fn, "param");
  const int64_t n = param.numel();
  require_device_tensor(grad, device, fn, "grad");
  require_dtype(grad, param.scalar_type(), fn, "grad");
  if (grad.numel() != n)
    fail(fn, "grad has " + std::to_string(grad.numel()) + " elements, param " + std::to_string(n));
  for (auto [t, name] : {std::pair<const at::Tensor*, const char*>{&m, "m"}, {&v, "v"}, {master, "master"}}) {
    if (t == nullptr) continue;
    require_device_tensor(*t, device, fn, name);
    require_dtype(*t, at::kFloat, fn, name);
    if (t->numel() != n)
      fail(fn, std::string(name) + " has " + std::to_string(t->numel()) + " elements, param " +
                   std::to_string(n));
  }
  if (master == nullptr && dtype != k::DType::kF32) {
    fail(fn, "a " + std::string(c10::toString(param.scalar_type())) + " parameter needs an fp32 master");
  }
  c10::cuda::CUDAGuard guard(device);
  check(k::dense_adamw(param.data_ptr(), master != nullptr ? master->data_ptr<float>() : nullptr,
                       grad.data_ptr(), dtype, m.data_ptr<float>(), v.data_ptr<float>(), n, to_device(c),
                       grad_scale, current_stream(device)),
        fn);
}

void gather_columns(const at::Tensor& grad2d, const at::Tensor& idx, const at::Tensor& staging) {
  constexpr const char* fn = "gather_columns";
  if (!grad2d.defined()) fail(fn, "grad2d is undefined");
  const c10::Device device = grad2d.device();
  require_device_tensor(grad2d, device, fn, "grad2d");
  require_2d(grad2d, fn, "grad2d");
  const k::DType dtype = dtype_of(grad2d, fn, "grad2d");
  require_index(idx, device, fn, "idx");
  const int64_t out = grad2d.size(0), in = grad2d.size(1), n = idx.size(0);
  require_device_tensor(staging, device, fn, "staging");
  require_dtype(staging, grad2d.scalar_type(), fn, "staging");
  require_shape(staging, {out, n}, fn, "staging");
  c10::cuda::CUDAGuard guard(device);
  check(k::gather_columns(grad2d.data_ptr(), dtype, out, in, idx.data_ptr<int64_t>(), n, staging.data_ptr(),
                          current_stream(device)),
        fn);
}

void scatter_columns(const at::Tensor& weight2d, const at::Tensor& idx, const at::Tensor& src) {
  constexpr const char* fn = "scatter_columns";
  if (!weight2d.defined()) fail(fn, "weight2d is undefined");
  const c10::Device device = weight2d.device();
  require_device_tensor(weight2d, device, fn, "weight2d");
  require_2d(weight2d, fn, "weight2d");
  const k::DType dtype = dtype_of(weight2d, fn, "weight2d");
  require_index(idx, device, fn, "idx");
  const int64_t out = weight2d.size(0), in = weight2d.size(1), n = idx.size(0);
  require_device_tensor(src, device, fn, "src");
  require_dtype(src, weight2d.scalar_type(), fn, "src");
  require_shape(src, {out, n}, fn, "src");
  c10::cuda::CUDAGuard guard(device);
  check(k::scatter_columns(weight2d.data_ptr(), dtype, out, in, idx.data_ptr<int64_t>(), n, src.data_ptr(),
                           current_stream(device)),
        fn);
}

#else  // !ZENFLOW_WITH_CUDA_OPS

namespace {
[[noreturn]] void unavailable(const char* fn) {
  throw std::logic_error(std::string("cuda_ops::") + fn +
                         ": this build has no CUDA kernels (build with -DZENFLOW_CUDA=ON against a "
                         "LibTorch with CUDA)");
}
}  // namespace

bool available() { return false; }

AllocatorBytes allocator_bytes(int) { unavailable("allocator_bytes"); }

void reset_allocator_peak(int) { unavailable("reset_allocator_peak"); }

int64_t device_free_bytes(int) { unavailable("device_free_bytes"); }

at::Tensor column_scores(const at::Tensor&, bool) { unavailable("column_scores"); }

void selected_adamw(at::Tensor&, const at::Tensor&, const at::Tensor&, at::Tensor*, at::Tensor&, at::Tensor&,
                    const AdamWCoeffs&, float) {
  unavailable("selected_adamw");
}

void dense_adamw(at::Tensor&, at::Tensor*, const at::Tensor&, at::Tensor&, at::Tensor&, const AdamWCoeffs&,
                 float) {
  unavailable("dense_adamw");
}

void gather_columns(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  unavailable("gather_columns");
}

void scatter_columns(const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  unavailable("scatter_columns");
}

#endif  // ZENFLOW_WITH_CUDA_OPS

}  // namespace zenflow::engine::cuda_ops
