// DeviceStreams: copies deliver the right bytes in the right order, buffers are counted, timers time.
//
// Runs on CUDA when this build supports it and a GPU is visible, else on CPU (where
// copies are synchronous). ZENFLOW_TEST_DEVICE=cuda makes a missing GPU a failure;
// ZENFLOW_TEST_DEVICE=cpu forces the CPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <future>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "worker/engine/device_streams.h"
#include "worker/engine/gradient_staging.h"
#include "worker/engine/stall_clock.h"

namespace zenflow::engine {
namespace {

class DeviceStreamsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* env = std::getenv("ZENFLOW_TEST_DEVICE");
    const std::string want = env != nullptr ? env : "";
    if (want == "cuda") {
      ASSERT_TRUE(DeviceStreams::cuda_available())
          << "ZENFLOW_TEST_DEVICE=cuda, but this build has no CUDA support or no GPU is visible";
    }
    device_ =
        (want != "cpu" && DeviceStreams::cuda_available()) ? at::Device(at::kCUDA, 0) : at::Device(at::kCPU);
  }
  at::TensorOptions on_device(at::ScalarType t = at::kFloat) const {
    return at::TensorOptions().dtype(t).device(device_);
  }

  // Enough queued compute that a copy which failed to wait for it would read stale data.
  // (On CPU nothing is queued: keep it small.)
  at::Tensor slow_product(int64_t n, int rounds) const {
    if (!device_.is_cuda()) n = std::min<int64_t>(n, 128);
    at::Tensor x = at::rand({n, n}, on_device()) / static_cast<double>(n);
    at::Tensor y = x;
    for (int r = 0; r < rounds; ++r) y = at::matmul(y, x) + x;
    return y;
  }

  at::Device device_{at::kCPU};
};

TEST_F(DeviceStreamsTest, HostBuffersAreCountedAndPinnedOnCuda) {
  DeviceStreams streams(device_);
  EXPECT_EQ(streams.is_cuda(), device_.is_cuda());
  EXPECT_EQ(streams.pinned_bytes(), 0);
  at::Tensor a = streams.alloc_host({3, 5}, at::kFloat);
  at::Tensor b = streams.alloc_host({7}, at::kBFloat16);
  EXPECT_EQ(streams.pinned_bytes(), 3 * 5 * 4 + 7 * 2);
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_EQ(b.scalar_type(), at::kBFloat16);
  EXPECT_EQ(a.is_pinned(), device_.is_cuda());
  EXPECT_EQ(b.is_pinned(), device_.is_cuda());
}

TEST_F(DeviceStreamsTest, DeviceToHostCopyWaitsForTheComputeThatProducesItsSource) {
  DeviceStreams streams(device_);
  for (at::ScalarType t : {at::kFloat, at::kBFloat16}) {
    at::Tensor y = slow_product(1024, 8).to(t);  // still being computed when the copy is issued
    at::Tensor host = streams.alloc_host({y.numel()}, t);
    CopyHandle h = streams.copy_d2h(y, host);
    EXPECT_EQ(h.bytes(), static_cast<int64_t>(y.nbytes()));
    EXPECT_GE(h.wait(), 0.0);
    EXPECT_TRUE(h.ready());
    EXPECT_TRUE(at::equal(host.view(y.sizes()), y.cpu())) << c10::toString(t);
    EXPECT_EQ(h.wait(), 0.0);  // idempotent
  }
}

TEST_F(DeviceStreamsTest, HostToDeviceCopyRunsAfterQueuedReadersAndBeforeLaterCompute) {
  DeviceStreams streams(device_);
  const int64_t n = 1 << 20;
  at::Tensor old_values = at::arange(n, on_device());
  at::Tensor dst = old_values.clone();
  // A reader of dst queued behind slow compute: the H2D copy must not overtake it.
  at::Tensor slow = slow_product(1024, 8);
  at::Tensor read_before = dst + slow.sum() * 0;
  at::Tensor src = streams.alloc_host({n}, at::kFloat);
  src.copy_(at::arange(n, at::kFloat) * -1);
  CopyHandle h = streams.copy_h2d(src, dst);
  h.make_compute_wait();
  at::Tensor read_after = dst * 1;  // enqueued after make_compute_wait: sees the new values
  EXPECT_TRUE(at::equal(read_before.cpu(), old_values.cpu()));
  EXPECT_TRUE(at::equal(read_after.cpu(), src));
  EXPECT_GE(h.wait(), 0.0);
}

TEST_F(DeviceStreamsTest, DoubleBufferedCopiesDeliverEveryWindow) {
  // The engine's pattern: two reused host buffers, a copy per window, wait one window later.
  DeviceStreams streams(device_);
  const int64_t n = 4096;
  std::vector<at::Tensor> buffers = {streams.alloc_host({n}, at::kFloat),
                                     streams.alloc_host({n}, at::kFloat)};
  std::vector<CopyHandle> in_flight(2);
  std::vector<at::Tensor> expected(2);
  for (int window = 0; window < 6; ++window) {
    const int slot = window % 2;
    if (window >= 2) {
      in_flight[slot].wait();
      ASSERT_TRUE(at::equal(buffers[slot], expected[slot])) << "window " << window - 2;
    }
    at::Tensor grad =
        at::full({n}, static_cast<double>(window), on_device()) + slow_product(256, 2).sum() * 0;
    expected[slot] = at::full({n}, static_cast<double>(window), at::kFloat);
    in_flight[slot] = streams.copy_d2h(grad, buffers[slot]);
  }
  for (int slot = 0; slot < 2; ++slot) {
    in_flight[slot].wait();
    EXPECT_TRUE(at::equal(buffers[slot], expected[slot]));
  }
}

TEST_F(DeviceStreamsTest, ComputeTimerAndSynchronizeMeasureTime) {
  DeviceStreams streams(device_);
  ComputeTimer timer(streams);
  EXPECT_THROW(timer.seconds(), std::logic_error);
  timer.start();
  at::Tensor y = slow_product(512, 4);
  timer.stop();
  const double s = timer.seconds();
  EXPECT_GT(s, 0.0);
  EXPECT_LT(s, 60.0);
  EXPECT_GE(streams.synchronize_compute(), 0.0);
  EXPECT_TRUE(at::isfinite(y).all().item<bool>());
}

// A host-side wait between start() and stop(): on CUDA the events see only what the
// compute stream noticed — nothing while queued work kept it busy, the whole wait when it
// was idle. On CPU the timer is the wall clock (the whole wait, always).
TEST_F(DeviceStreamsTest, ComputeTimerAroundAHostWaitSeesOnlyTheGpuIdleTime) {
  DeviceStreams streams(device_);
  const auto sleep = [] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); };
  streams.synchronize_compute();
  ComputeTimer idle(device_);
  idle.start();
  sleep();
  idle.stop();
  EXPECT_GE(idle.seconds(), 0.025);  // the stream had nothing to do for the whole wait
  if (!device_.is_cuda()) return;
  at::Tensor y = slow_product(8192, 40);  // well over 30 ms of queued GPU work
  ComputeTimer covered(device_);
  covered.start();
  sleep();
  covered.stop();
  std::printf("[figure] host wait of 30 ms behind queued GPU work: %.3f ms of GPU idle\n", 1e3 * covered.seconds());
  EXPECT_LT(covered.seconds(), 0.005);
  EXPECT_TRUE(at::isfinite(y).all().item<bool>());
}

TEST_F(DeviceStreamsTest, MismatchedCopiesAreRejected) {
  DeviceStreams streams(device_);
  at::Tensor dev = at::zeros({8}, on_device());
  EXPECT_THROW(streams.copy_d2h(dev, streams.alloc_host({8}, at::kBFloat16)), std::invalid_argument);
  EXPECT_THROW(streams.copy_d2h(dev, streams.alloc_host({9}, at::kFloat)), std::invalid_argument);
  EXPECT_THROW(streams.copy_h2d(streams.alloc_host({16}, at::kFloat).slice(0, 0, 16, 2), dev),
               std::invalid_argument);
  if (device_.is_cuda()) {
    EXPECT_THROW(streams.copy_d2h(at::zeros({8}), streams.alloc_host({8}, at::kFloat)),
                 std::invalid_argument);
    EXPECT_THROW(streams.copy_h2d(streams.alloc_host({8}, at::kFloat), at::zeros({8})),
                 std::invalid_argument);
  }
  EXPECT_THROW(DeviceStreams(at::Device(at::kMeta)), std::invalid_argument);
}

TEST_F(DeviceStreamsTest, DefaultHandleIsComplete) {
  CopyHandle h;
  EXPECT_TRUE(h.ready());
  EXPECT_EQ(h.wait(), 0.0);
  h.make_compute_wait();
  EXPECT_EQ(h.bytes(), 0);
}

TEST(StallClock, DeferredDurationsResolveOnceAtTheEndOfTheStep) {
  StallClock clock;
  clock.begin_step();
  int calls = 0;
  clock.add_stall(StallCause::kHostOptimizer, 0.5);
  clock.add_deferred(TimeKind::kStall, StallCause::kHostOptimizer, [&] { return ++calls, 0.25; });
  clock.add_deferred(TimeKind::kCompute, StallCause::kData, [&] { return ++calls, 2.0; });
  clock.add_deferred(TimeKind::kDeviceOptimizer, StallCause::kData, [&] { return ++calls, 0.125; });
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(clock.current().compute_seconds, 0.0);
  const StepTimes t = clock.end_step();
  EXPECT_EQ(calls, 3);
  EXPECT_DOUBLE_EQ(t.stall_seconds[static_cast<int>(StallCause::kHostOptimizer)], 0.75);
  EXPECT_DOUBLE_EQ(t.compute_seconds, 2.0);
  EXPECT_DOUBLE_EQ(t.device_optimizer_seconds, 0.125);
  clock.begin_step();
  clock.end_step();
  EXPECT_EQ(calls, 3);
  EXPECT_DOUBLE_EQ(clock.totals().compute_seconds, 2.0);
}

// On the CPU a ClockSpan adds its wall-clock time, or the seconds it is given; no clock, nothing.
TEST(StallClock, ClockSpanOnTheCpu) {
  StallClock clock;
  clock.begin_step();
  ClockSpan given(&clock, at::Device(at::kCPU));
  given.end(TimeKind::kStall, StallCause::kAllreduce, 0.375);
  ClockSpan timed(&clock, at::Device(at::kCPU));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  timed.end(TimeKind::kDeviceOptimizer);
  ClockSpan(nullptr, at::Device(at::kCPU)).end(TimeKind::kCompute);
  const StepTimes t = clock.end_step();
  EXPECT_DOUBLE_EQ(t.stall_seconds[static_cast<int>(StallCause::kAllreduce)], 0.375);
  EXPECT_GE(t.device_optimizer_seconds, 0.015);
  EXPECT_EQ(t.compute_seconds, 0.0);
}

// A streaming backend's view of a staged gradient (gradient_staging.h), read through the
// ring from another thread as a sender would: every chunk holds the bytes the compute
// produced (issued before it finished, on CUDA), a full ring holds the reader back until a
// chunk is released, and the release latch opens only once the source and every chunk
// handle are gone.
TEST_F(DeviceStreamsTest, StagedGradientComesThroughTheRingInOrderWithBackPressure) {
  DeviceStreams streams(device_);
  const at::Tensor staged = slow_product(512, 6).to(at::kBFloat16).reshape({-1}).contiguous();
  const at::Tensor expect = staged.cpu();
  const int64_t n = staged.numel(), chunk = 1000;  // the last chunk is short
  auto ring = std::make_shared<StagingRing>(streams, 2, chunk * 2);
  EXPECT_EQ(ring->bytes(), 2 * chunk * 2);
  auto latch = std::make_shared<ReleaseLatch>();
  std::shared_ptr<GradSource> source = make_staged_gradient(streams, ring, staged, streams.mark_compute(), latch);
  std::thread sender([&, source]() mutable {
    std::vector<std::shared_ptr<const void>> held;
    for (int64_t off = 0; off < n; off += chunk) {
      const int64_t len = std::min(chunk, n - off);
      if (held.size() == 2) held.erase(held.begin());  // its send completed
      held.push_back(source->chunk(off, len));
      EXPECT_EQ(std::memcmp(held.back().get(), static_cast<const char*>(expect.data_ptr()) + off * 2,
                            static_cast<size_t>(len) * 2),
                0)
          << "chunk at " << off;
    }
    // The ring is full now: a third chunk waits for a release.
    std::atomic<bool> got{false};
    auto third = std::async(std::launch::async, [&] {
      auto c = source->chunk(0, chunk);
      got = true;
      return c;
    });
    EXPECT_EQ(third.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout) << "the ring was full";
    EXPECT_FALSE(got.load());
    held.erase(held.begin());
    auto c = third.get();
    EXPECT_EQ(std::memcmp(c.get(), expect.data_ptr(), static_cast<size_t>(chunk) * 2), 0);
    EXPECT_THROW(source->chunk(0, chunk + 1), std::invalid_argument) << "larger than a ring chunk";
    EXPECT_THROW(source->chunk(n - 10, 11), std::out_of_range);
    source.reset();
    EXPECT_FALSE(latch->is_open()) << "chunks are still held";
    held.clear();
    EXPECT_FALSE(latch->is_open()) << "one chunk is still held";
    c.reset();
  });
  source.reset();
  sender.join();
  EXPECT_TRUE(latch->is_open());
  latch->wait();
}

// Without a ring (the CPU device: the staging is host memory) chunks point into it.
TEST(GradientStaging, CpuStagingIsReadInPlaceUntilReleased) {
  DeviceStreams streams(at::Device(at::kCPU));
  const at::Tensor staged = at::arange(100, at::kFloat);
  auto latch = std::make_shared<ReleaseLatch>();
  auto source = make_staged_gradient(streams, nullptr, staged, streams.mark_compute(), latch);
  auto c = source->chunk(40, 10);
  EXPECT_EQ(c.get(), staged.data_ptr<float>() + 40);
  EXPECT_EQ(static_cast<const float*>(c.get())[3], 43.0f);
  source.reset();
  EXPECT_FALSE(latch->is_open());
  c.reset();
  EXPECT_TRUE(latch->is_open());
  EXPECT_THROW(make_staged_gradient(streams, nullptr, staged.view({10, 10}), CopyHandle(), latch),
               std::invalid_argument);
  EXPECT_THROW(StagingRing(streams, 0, 64), std::invalid_argument);
}

#ifndef ZENFLOW_WITH_CUDA_OPS
TEST(DeviceStreamsWithoutCuda, CudaDeviceIsALogicError) {
  EXPECT_FALSE(DeviceStreams::cuda_available());
  EXPECT_THROW(DeviceStreams(at::Device(at::kCUDA)), std::logic_error);
}
#endif

}  // namespace
}  // namespace zenflow::engine
