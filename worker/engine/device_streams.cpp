// DeviceStreams: dedicated copy streams, events and pinned buffers on CUDA; synchronous copies on CPU.
#include "worker/engine/device_streams.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <stdexcept>
#include <string>

#ifdef ZENFLOW_WITH_CUDA_OPS
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace zenflow::engine {

namespace {

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void check_copy(const at::Tensor& src, const at::Tensor& dst, const at::Device& src_device,
                const at::Device& dst_device, const char* fn) {
  auto fail = [fn](const std::string& what) {
    throw std::invalid_argument(std::string("DeviceStreams::") + fn + ": " + what);
  };
  if (!src.defined() || !dst.defined()) fail("undefined tensor");
  if (src.device() != src_device)
    fail("source is on " + src.device().str() + ", expected " + src_device.str());
  if (dst.device() != dst_device)
    fail("destination is on " + dst.device().str() + ", expected " + dst_device.str());
  if (src.scalar_type() != dst.scalar_type()) {
    fail(std::string("dtypes differ: ") + c10::toString(src.scalar_type()) + " -> " +
         c10::toString(dst.scalar_type()));
  }
  if (src.numel() != dst.numel()) {
    fail("element counts differ: " + std::to_string(src.numel()) + " -> " + std::to_string(dst.numel()));
  }
  if (!src.is_contiguous() || !dst.is_contiguous()) fail("tensors must be contiguous");
}

// dst.copy_(src) over the flat element range (shapes may differ; counts are equal).
void flat_copy(const at::Tensor& src, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst.view({-1});
  d.copy_(src.view({-1}), non_blocking);
}

}  // namespace

#ifdef ZENFLOW_WITH_CUDA_OPS

namespace {
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string("DeviceStreams: ") + what + ": " + cudaGetErrorString(err));
  }
}
cudaStream_t compute_stream(c10::DeviceIndex device) {
  return c10::cuda::getCurrentCUDAStream(device).stream();
}
}  // namespace

struct CudaEventHandle {
  CudaEventHandle(c10::DeviceIndex device_index, bool timing) : device(device_index) {
    c10::cuda::CUDAGuard guard(device);
    check_cuda(cudaEventCreateWithFlags(&event, timing ? cudaEventDefault : cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
  }
  ~CudaEventHandle() {  // may run on a host-optimizer thread: on the event's device; never throws
    if (event == nullptr) return;
    int prev = -1;
    const bool other = cudaGetDevice(&prev) == cudaSuccess && prev != device;
    if (other) cudaSetDevice(device);
    cudaEventDestroy(event);  // pending work completes regardless
    if (other) cudaSetDevice(prev);
  }
  CudaEventHandle(const CudaEventHandle&) = delete;
  CudaEventHandle& operator=(const CudaEventHandle&) = delete;

  void record(cudaStream_t stream) {
    c10::cuda::CUDAGuard guard(device);
    check_cuda(cudaEventRecord(event, stream), "cudaEventRecord");
  }
  void block(cudaStream_t stream) const {  // `stream` waits for the last record, on the GPU
    c10::cuda::CUDAGuard guard(device);
    check_cuda(cudaStreamWaitEvent(stream, event, 0), "cudaStreamWaitEvent");
  }

  cudaEvent_t event = nullptr;
  c10::DeviceIndex device;
};

struct DeviceStreams::Streams {
  c10::cuda::CUDAStream d2h;
  c10::cuda::CUDAStream h2d;
};

double CopyHandle::wait() {
  double waited = 0;
  if (done_) {
    // Host-optimizer threads wait too: their CUDA calls go to the event's device (a thread
    // left on GPU 0 would open a context there on every rank).
    c10::cuda::CUDAGuard guard(done_->device);
    const auto t0 = std::chrono::steady_clock::now();
    check_cuda(cudaEventSynchronize(done_->event), "cudaEventSynchronize");
    waited = seconds_between(t0, std::chrono::steady_clock::now());
    done_.reset();
  }
  src_ = at::Tensor();
  dst_ = at::Tensor();
  return waited;
}

bool CopyHandle::ready() const {
  if (!done_) return true;
  c10::cuda::CUDAGuard guard(done_->device);
  const cudaError_t err = cudaEventQuery(done_->event);
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();  // not an error: clear it
    return false;
  }
  check_cuda(err, "cudaEventQuery");
  return true;
}

void CopyHandle::make_compute_wait() const {
  if (done_) done_->block(compute_stream(done_->device));
}

DeviceStreams::DeviceStreams(at::Device device) : device_(device) {
  if (device.is_cpu()) {
    device_ = at::Device(at::kCPU);
    return;
  }
  if (!device.is_cuda()) {
    throw std::invalid_argument("DeviceStreams: unsupported device " + device.str() + " (cpu or cuda)");
  }
  const c10::DeviceIndex count = c10::cuda::device_count();
  if (count == 0) throw std::invalid_argument("DeviceStreams: no CUDA device is visible");
  const c10::DeviceIndex index = device.has_index() ? device.index() : c10::cuda::current_device();
  if (index < 0 || index >= count) {
    throw std::invalid_argument("DeviceStreams: " + device.str() + " is not one of the " +
                                std::to_string(count) + " visible CUDA devices");
  }
  device_ = at::Device(at::kCUDA, index);
  streams_ = std::make_unique<Streams>(
      Streams{c10::cuda::getStreamFromPool(false, index), c10::cuda::getStreamFromPool(false, index)});
}

DeviceStreams::~DeviceStreams() = default;

bool DeviceStreams::cuda_available() { return c10::cuda::device_count() > 0; }

at::Tensor DeviceStreams::alloc_host(at::IntArrayRef sizes, at::ScalarType dtype) {
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(at::kCPU);
  int64_t n = 1;
  for (int64_t d : sizes) n *= d;
  if (n == 0) return at::empty(sizes, options);
  // Straight from the driver, not through LibTorch's caching host allocator, which rounds
  // every block up to a power of two (up to 2x the memory for model-sized buffers): the
  // bytes pinned are the bytes asked for, and are what pinned_bytes() reports.
  const size_t nbytes = static_cast<size_t>(n) * at::elementSize(dtype);
  void* p = nullptr;
  {
    c10::cuda::CUDAGuard guard(device_.index());
    check_cuda(cudaHostAlloc(&p, nbytes, cudaHostAllocDefault), "cudaHostAlloc");
  }
  at::Tensor t = at::from_blob(p, sizes, [](void* q) { cudaFreeHost(q); }, options);
  host_bytes_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
  return t;
}

CopyHandle DeviceStreams::copy_d2h(const at::Tensor& src_device, const at::Tensor& dst_host) {
  return copy_d2h_after(is_cuda() ? mark_compute() : CopyHandle(), src_device, dst_host);
}

CopyHandle DeviceStreams::mark_compute() {
  CopyHandle h;
  if (!is_cuda()) return h;
  const c10::DeviceIndex index = device_.index();
  h.done_ = std::make_shared<CudaEventHandle>(index, false);
  h.done_->record(compute_stream(index));
  return h;
}

CopyHandle DeviceStreams::copy_d2h_after(const CopyHandle& after, const at::Tensor& src_device,
                                         const at::Tensor& dst_host) {
  check_copy(src_device, dst_host, device_, at::Device(at::kCPU), "copy_d2h");
  CopyHandle h;
  h.bytes_ = static_cast<int64_t>(src_device.nbytes());
  if (!is_cuda()) {
    flat_copy(src_device, dst_host, false);
    return h;
  }
  const c10::DeviceIndex index = device_.index();
  c10::cuda::CUDAGuard guard(index);
  if (after.done_) after.done_->block(streams_->d2h.stream());
  {
    c10::cuda::CUDAStreamGuard on_d2h(streams_->d2h.unwrap());
    flat_copy(src_device, dst_host, true);
  }
  src_device.record_stream(streams_->d2h.unwrap());  // the allocator may not reuse it before the copy
  h.done_ = std::make_shared<CudaEventHandle>(index, false);
  h.done_->record(streams_->d2h.stream());
  h.src_ = src_device;
  h.dst_ = dst_host;
  return h;
}

CopyHandle DeviceStreams::copy_h2d(const at::Tensor& src_host, const at::Tensor& dst_device) {
  check_copy(src_host, dst_device, at::Device(at::kCPU), device_, "copy_h2d");
  CopyHandle h;
  h.bytes_ = static_cast<int64_t>(src_host.nbytes());
  if (!is_cuda()) {
    flat_copy(src_host, dst_device, false);
    return h;
  }
  const c10::DeviceIndex index = device_.index();
  c10::cuda::CUDAGuard guard(index);
  CudaEventHandle enqueued(index, false);  // compute work that may still read dst
  enqueued.record(compute_stream(index));
  enqueued.block(streams_->h2d.stream());
  {
    c10::cuda::CUDAStreamGuard on_h2d(streams_->h2d.unwrap());
    flat_copy(src_host, dst_device, true);
  }
  dst_device.record_stream(streams_->h2d.unwrap());
  h.done_ = std::make_shared<CudaEventHandle>(index, false);
  h.done_->record(streams_->h2d.stream());
  h.src_ = src_host;
  h.dst_ = dst_device;
  return h;
}

double DeviceStreams::synchronize_compute() {
  if (!is_cuda()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
  return seconds_between(t0, std::chrono::steady_clock::now());
}

ComputeTimer::ComputeTimer(const DeviceStreams& streams) : ComputeTimer(streams.device()) {}

ComputeTimer::ComputeTimer(at::Device device) : device_(device) {
  if (device_.is_cuda()) {
    if (!device_.has_index()) device_ = at::Device(at::kCUDA, c10::cuda::current_device());
    start_event_ = std::make_shared<CudaEventHandle>(device_.index(), true);
    stop_event_ = std::make_shared<CudaEventHandle>(device_.index(), true);
  }
}

void ComputeTimer::start() {
  if (start_event_) start_event_->record(compute_stream(device_.index()));
  wall_start_ = std::chrono::steady_clock::now();
  started_ = true;
  stopped_ = false;
}

void ComputeTimer::stop() {
  if (stop_event_) stop_event_->record(compute_stream(device_.index()));
  wall_stop_ = std::chrono::steady_clock::now();
  stopped_ = true;
}

double ComputeTimer::seconds() {
  if (!started_ || !stopped_) throw std::logic_error("ComputeTimer::seconds: call start() and stop() first");
  if (!start_event_) return seconds_between(wall_start_, wall_stop_);
  check_cuda(cudaEventSynchronize(stop_event_->event), "cudaEventSynchronize");
  float ms = 0.f;
  check_cuda(cudaEventElapsedTime(&ms, start_event_->event, stop_event_->event), "cudaEventElapsedTime");
  return static_cast<double>(ms) / 1000.0;
}

#else  // !ZENFLOW_WITH_CUDA_OPS: the CPU device only

struct CudaEventHandle {};
struct DeviceStreams::Streams {};

double CopyHandle::wait() {
  src_ = at::Tensor();
  dst_ = at::Tensor();
  return 0;
}
bool CopyHandle::ready() const { return true; }
void CopyHandle::make_compute_wait() const {}

DeviceStreams::DeviceStreams(at::Device device) : device_(at::kCPU) {
  if (device.is_cuda()) {
    throw std::logic_error(
        "DeviceStreams: this build has no CUDA support (build with -DZENFLOW_CUDA=ON against a "
        "LibTorch with CUDA)");
  }
  if (!device.is_cpu()) {
    throw std::invalid_argument("DeviceStreams: unsupported device " + device.str() + " (cpu or cuda)");
  }
}

DeviceStreams::~DeviceStreams() = default;

bool DeviceStreams::cuda_available() { return false; }

at::Tensor DeviceStreams::alloc_host(at::IntArrayRef sizes, at::ScalarType dtype) {
  at::Tensor t = at::empty(sizes, at::TensorOptions().dtype(dtype).device(at::kCPU));
  host_bytes_.fetch_add(static_cast<int64_t>(t.nbytes()), std::memory_order_relaxed);
  return t;
}

CopyHandle DeviceStreams::copy_d2h(const at::Tensor& src_device, const at::Tensor& dst_host) {
  check_copy(src_device, dst_host, device_, at::Device(at::kCPU), "copy_d2h");
  flat_copy(src_device, dst_host, false);
  CopyHandle h;
  h.bytes_ = static_cast<int64_t>(src_device.nbytes());
  return h;
}

CopyHandle DeviceStreams::mark_compute() { return CopyHandle(); }

CopyHandle DeviceStreams::copy_d2h_after(const CopyHandle&, const at::Tensor& src_device, const at::Tensor& dst_host) {
  return copy_d2h(src_device, dst_host);
}

CopyHandle DeviceStreams::copy_h2d(const at::Tensor& src_host, const at::Tensor& dst_device) {
  check_copy(src_host, dst_device, at::Device(at::kCPU), device_, "copy_h2d");
  flat_copy(src_host, dst_device, false);
  CopyHandle h;
  h.bytes_ = static_cast<int64_t>(src_host.nbytes());
  return h;
}

double DeviceStreams::synchronize_compute() { return 0; }

ComputeTimer::ComputeTimer(const DeviceStreams& streams) : device_(streams.device()) {}

ComputeTimer::ComputeTimer(at::Device device) : device_(device) {
  if (device_.is_cuda()) throw std::logic_error("ComputeTimer: this build has no CUDA support");
}

void ComputeTimer::start() {
  wall_start_ = std::chrono::steady_clock::now();
  started_ = true;
  stopped_ = false;
}

void ComputeTimer::stop() {
  wall_stop_ = std::chrono::steady_clock::now();
  stopped_ = true;
}

double ComputeTimer::seconds() {
  if (!started_ || !stopped_) throw std::logic_error("ComputeTimer::seconds: call start() and stop() first");
  return seconds_between(wall_start_, wall_stop_);
}

#endif  // ZENFLOW_WITH_CUDA_OPS

ClockSpan::ClockSpan(StallClock* clock, at::Device device) : clock_(clock) {
  if (clock_ != nullptr && device.is_cuda()) {
    events_ = std::make_shared<ComputeTimer>(device);
    events_->start();
  }
}

void ClockSpan::end(TimeKind kind, StallCause cause, double cpu_seconds) {
  if (clock_ == nullptr) return;
  if (events_) {
    events_->stop();
    clock_->add_deferred(kind, cause, [events = events_] { return events->seconds(); });
    return;
  }
  const double s = cpu_seconds >= 0 ? cpu_seconds : wall_.seconds();
  switch (kind) {
    case TimeKind::kCompute: clock_->add_compute(s); break;
    case TimeKind::kDeviceOptimizer: clock_->add_device_optimizer(s); break;
    case TimeKind::kStall: clock_->add_stall(cause, s); break;
    case TimeKind::kComputeStall: clock_->compute_was_stall(cause, s); break;
  }
}

}  // namespace zenflow::engine
