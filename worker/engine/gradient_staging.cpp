// Gradient staging through a small pinned ring for streaming host backends (see the header).
#include "worker/engine/gradient_staging.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>

#include <stdexcept>
#include <string>

namespace zenflow::engine {

void ReleaseLatch::open() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

bool ReleaseLatch::is_open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

void ReleaseLatch::wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return open_; });
}

StagingRing::StagingRing(DeviceStreams& streams, int chunks, int64_t chunk_bytes) : chunk_bytes_(chunk_bytes) {
  if (chunks < 1 || chunk_bytes < 1)
    throw std::invalid_argument("staging ring: " + std::to_string(chunks) + " chunks of " +
                                std::to_string(chunk_bytes) + " bytes");
  for (int i = 0; i < chunks; ++i) {
    buffers_.push_back(streams.alloc_host({chunk_bytes}, at::kByte));
    free_.push_back(static_cast<size_t>(i));
  }
}

std::shared_ptr<at::Tensor> StagingRing::acquire() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !free_.empty(); });
  const size_t i = free_.back();
  free_.pop_back();
  return std::shared_ptr<at::Tensor>(&buffers_[i], [this, i](at::Tensor*) {
    {
      std::lock_guard<std::mutex> back(mu_);
      free_.push_back(i);
    }
    cv_.notify_one();
  });
}

namespace {

class StagedGradient : public GradSource, public std::enable_shared_from_this<StagedGradient> {
 public:
  StagedGradient(DeviceStreams& streams, std::shared_ptr<StagingRing> ring, at::Tensor staged, CopyHandle produced,
                 std::shared_ptr<ReleaseLatch> released)
      : streams_(streams),
        ring_(std::move(ring)),
        staged_(std::move(staged)),
        produced_(std::move(produced)),
        released_(std::move(released)) {}
  ~StagedGradient() override { released_->open(); }

  std::shared_ptr<const void> chunk(int64_t offset, int64_t n) override {
    const int64_t esize = static_cast<int64_t>(staged_.element_size());
    if (offset < 0 || n < 0 || offset + n > staged_.numel())
      throw std::out_of_range("staged gradient: elements [" + std::to_string(offset) + ", +" + std::to_string(n) +
                              ") outside its " + std::to_string(staged_.numel()));
    const char* at = static_cast<const char*>(staged_.data_ptr()) + offset * esize;
    if (!ring_) return std::shared_ptr<const void>(shared_from_this(), at);  // host memory: in place
    if (n * esize > ring_->chunk_bytes())
      throw std::invalid_argument("staged gradient: a chunk of " + std::to_string(n * esize) +
                                  " bytes, the staging ring's chunks hold " + std::to_string(ring_->chunk_bytes()));
    // The handle keeps this source (the device staging) and the ring buffer until released;
    // the buffer goes back first, while the source still keeps the ring.
    struct Held {
      std::shared_ptr<StagedGradient> source;
      std::shared_ptr<at::Tensor> buffer;
    };
    auto held = std::make_shared<Held>(Held{shared_from_this(), ring_->acquire()});
    const at::Tensor dst = at::from_blob(held->buffer->data_ptr(), {n}, staged_.options().device(at::kCPU));
    streams_.copy_d2h_after(produced_, staged_.narrow(0, offset, n), dst).wait();
    return std::shared_ptr<const void>(held, held->buffer->data_ptr());
  }

 private:
  DeviceStreams& streams_;
  std::shared_ptr<StagingRing> ring_;
  at::Tensor staged_;
  CopyHandle produced_;
  std::shared_ptr<ReleaseLatch> released_;
};

}  // namespace

std::shared_ptr<GradSource> make_staged_gradient(DeviceStreams& streams, std::shared_ptr<StagingRing> ring,
                                                 at::Tensor staged, CopyHandle produced,
                                                 std::shared_ptr<ReleaseLatch> released) {
  if (!staged.is_contiguous() || staged.dim() != 1)
    throw std::invalid_argument("staged gradient: a contiguous 1-D tensor is expected");
  return std::make_shared<StagedGradient>(streams, std::move(ring), std::move(staged), std::move(produced),
                                          std::move(released));
}

}  // namespace zenflow::engine
