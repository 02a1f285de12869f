// Gradient staging for a streaming host backend (HostOptimizer::gradient_chunk_bytes > 0).
//
// A step's packed gradient stays where the engine gathered it, in device memory: a
// StagedGradient hands it to the backend as a GradSource, copying each chunk the backend
// asks for into one buffer of a StagingRing — a few pinned host buffers, the only host
// memory gradients take — on the D2H stream, after the compute work that produced the
// gradient. (On the CPU "device" the staging is host memory already: chunks point into
// it, with no ring and no copy.) A chunk returns to the ring when the
// backend drops its handle (its send completed). When the backend has dropped the
// source and every chunk, the source's ReleaseLatch opens: the engine may rewrite the
// device staging then, and waits for it before it does (back-pressure on the training
// thread when the network falls behind).
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "worker/engine/device_streams.h"
#include "worker/engine/host_optimizer.h"

namespace zenflow::engine {

// Opens once; wait() blocks until it has. Thread safety: any thread.
class ReleaseLatch {
 public:
  void open();
  bool is_open() const;
  void wait() const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = false;
};

// `chunks` host buffers of `chunk_bytes` each (DeviceStreams::alloc_host: pinned on CUDA).
// Thread safety: any thread.
class StagingRing {
 public:
  StagingRing(DeviceStreams& streams, int chunks, int64_t chunk_bytes);
  // A free buffer as a byte tensor of chunk_bytes(); blocks while none is free. The
  // buffer returns to the ring when the last copy of the returned pointer goes.
  std::shared_ptr<at::Tensor> acquire();
  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t bytes() const { return chunk_bytes_ * static_cast<int64_t>(buffers_.size()); }

 private:
  std::vector<at::Tensor> buffers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<size_t> free_;
  int64_t chunk_bytes_ = 0;
};

// Elements of `staged` (a contiguous 1-D tensor on the streams' device, left untouched
// by the engine until `released` opens) as a GradSource, copied through `ring` after
// `produced` (a DeviceStreams::mark_compute handle taken when the gradient was
// enqueued); with `ring` null (a CPU device: the staging is host memory already) its
// chunks point into `staged` itself.
std::shared_ptr<GradSource> make_staged_gradient(DeviceStreams& streams, std::shared_ptr<StagingRing> ring,
                                                 at::Tensor staged, CopyHandle produced,
                                                 std::shared_ptr<ReleaseLatch> released);

}  // namespace zenflow::engine
