// The engine's transfer layer: host staging buffers, D2H/H2D copies on their own streams, compute timing.
//
// On a CUDA device, gradients go device→host on a dedicated D2H stream and parameters
// host→device on a dedicated H2D stream, into and out of pinned host buffers that the
// engine allocates once (alloc_host) and reuses. Copies are ordered against the compute
// stream with CUDA events only, so the compute stream never waits on a copy unless the
// engine asks it to (CopyHandle::make_compute_wait), and the host blocks only in
// CopyHandle::wait() or synchronize_compute(), which return the seconds they blocked (what
// the stall clock records). "The compute stream" is the calling thread's current CUDA
// stream on the device (c10::cuda::getCurrentCUDAStream), at the time of the call.
//
// On the CPU "device" (and in builds without CUDA support) the same calls degenerate:
// copies are synchronous, waits return 0, timers use the wall clock.
//
// Thread safety: the methods may be called from any thread; copies and timers issued
// from a thread order against that thread's compute stream. CopyHandle and ComputeTimer
// objects are not shared between threads without external synchronization.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include "worker/engine/stall_clock.h"

namespace zenflow::engine {

struct CudaEventHandle;  // a CUDA event; defined in device_streams.cpp

// Completion of one asynchronous copy (c10d's Work idiom). A default-constructed handle
// is complete. The copy's source and destination must not be written (and the
// destination not read) until ready() or wait() says the copy is done; the handle keeps
// both tensors alive until then, and device memory is also protected from reuse by the
// caching allocator if the caller drops its references earlier.
class CopyHandle {
 public:
  CopyHandle() = default;

  // Blocks the calling thread until the copy has completed and returns the seconds it
  // blocked (0 on CPU, where the copy was done by the call that made the handle).
  // Idempotent. Throws std::runtime_error on a CUDA error.
  double wait();

  // True when the copy has completed. Never blocks.
  bool ready() const;

  // Makes the calling thread's current compute stream wait, on the GPU, for the copy:
  // work enqueued afterwards sees the copied data. The host is not blocked. No-op on CPU.
  void make_compute_wait() const;

  int64_t bytes() const { return bytes_; }

 private:
  friend class DeviceStreams;
  std::shared_ptr<CudaEventHandle> done_;  // recorded after the copy on its stream
  at::Tensor src_;
  at::Tensor dst_;
  int64_t bytes_ = 0;
};

class DeviceStreams {
 public:
  // `device` is kCPU or kCUDA (index -1 = the current CUDA device). Throws
  // std::logic_error for CUDA in a build without CUDA support, std::invalid_argument for
  // other device types.
  explicit DeviceStreams(at::Device device);
  ~DeviceStreams();
  DeviceStreams(const DeviceStreams&) = delete;
  DeviceStreams& operator=(const DeviceStreams&) = delete;

  // True when this build supports CUDA devices here (CUDA LibTorch, ZENFLOW_CUDA=ON) and
  // one is visible.
  static bool cuda_available();

  bool is_cuda() const { return device_.is_cuda(); }
  at::Device device() const { return device_; }

  // A host buffer for transfers: pinned (page-locked) on CUDA, plain CPU memory
  // otherwise. Meant to be allocated once and reused; every allocation is counted.
  at::Tensor alloc_host(at::IntArrayRef sizes, at::ScalarType dtype);

  // Bytes allocated so far through alloc_host (the pool size reported as
  // zenflow_pinned_host_bytes). Any thread may read it.
  int64_t pinned_bytes() const { return host_bytes_.load(std::memory_order_relaxed); }

  // Copies src_device (on device()) into dst_host (CPU): on CUDA, on the D2H stream after
  // the compute work enqueued so far (which may still be producing src). Both tensors
  // contiguous, same dtype and number of elements; else std::invalid_argument.
  CopyHandle copy_d2h(const at::Tensor& src_device, const at::Tensor& dst_host);

  // A handle that completes with the compute work enqueued so far on the calling thread's
  // compute stream (complete at once on CPU), for copy_d2h_after from another thread.
  CopyHandle mark_compute();

  // copy_d2h ordered after `after` (a mark_compute handle, possibly made on another
  // thread) instead of after the calling thread's compute stream.
  CopyHandle copy_d2h_after(const CopyHandle& after, const at::Tensor& src_device, const at::Tensor& dst_host);

  // Copies src_host (CPU) into dst_device (on device()): on CUDA, on the H2D stream after
  // the compute work enqueued so far (which may still be reading dst). Call
  // make_compute_wait() on the handle before compute uses dst. Same requirements as
  // copy_d2h.
  CopyHandle copy_h2d(const at::Tensor& src_host, const at::Tensor& dst_device);

  // Blocks until the compute work enqueued so far has finished; returns seconds blocked
  // (0 on CPU).
  double synchronize_compute();

 private:
  struct Streams;  // the D2H and H2D CUDA streams
  at::Device device_;
  std::unique_ptr<Streams> streams_;
  std::atomic<int64_t> host_bytes_{0};
};

// Time taken by the compute work enqueued between start() and stop(): CUDA events on the
// compute stream, the wall clock on CPU.
//
// Around a host-side wait (start(); wait; stop()), the CUDA events measure how long the
// compute stream ran dry because of it: zero when work queued earlier kept the GPU busy
// for the whole wait. Around a stream-side wait (CopyHandle::make_compute_wait) plus the
// kernels after it, what the stream spent on both.
class ComputeTimer {
 public:
  explicit ComputeTimer(const DeviceStreams& streams);
  explicit ComputeTimer(at::Device device);  // kCPU, or kCUDA with an index
  void start();
  void stop();
  // Seconds between start() and stop(); blocks until the work before stop() finished.
  // Throws std::logic_error when start() and stop() were not both called.
  double seconds();

 private:
  at::Device device_;
  std::shared_ptr<CudaEventHandle> start_event_;
  std::shared_ptr<CudaEventHandle> stop_event_;
  std::chrono::steady_clock::time_point wall_start_;
  std::chrono::steady_clock::time_point wall_stop_;
  bool started_ = false;
  bool stopped_ = false;
};

// A region of the training step timed for a StallClock as the compute stream saw it
// (stall_clock.h): on CUDA with ComputeTimer events, added as a deferred value that the
// step's end resolves; on the CPU with the wall clock. A null clock makes it a no-op.
class ClockSpan {
 public:
  ClockSpan(StallClock* clock, at::Device device);
  // Ends the region; its time counts as `kind` (`cause` for stalls). On the CPU,
  // cpu_seconds >= 0 replaces the wall-clock time (e.g. the time a wait really blocked).
  void end(TimeKind kind, StallCause cause = StallCause::kHostOptimizer, double cpu_seconds = -1);

 private:
  StallClock* clock_;
  std::shared_ptr<ComputeTimer> events_;  // CUDA only
  Stopwatch wall_;
};

}  // namespace zenflow::engine
