// Test helper: data-parallel ranks as threads of the test process sharing one device,
// with an in-process engine::Collectives (no Gloo, no NCCL). It lets the partitioned
// engine run on one GPU (ranks as threads on the same device) and on CPU builds
// without Gloo.
//
// Every collective is an exchange through a shared board: each rank posts a copy of its
// tensor, waits for all, computes the result from the posts in rank order (so every
// rank gets the identical result, as NCCL and Gloo promise), and waits again before the
// board is reused. On CUDA the threads' work goes to the device's default stream, which
// orders a rank's reads after the posts (enqueued before the barrier). Every wait is
// bounded: a rank that does not arrive within the timeout fails the others.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/threads.h"
#include "worker/engine/collectives.h"

namespace zenflow::test_support {

class ThreadGroup {
 public:
  explicit ThreadGroup(int world, std::chrono::milliseconds timeout = std::chrono::seconds(60))
      : world_(world), timeout_(timeout), posts_(static_cast<size_t>(world)) {}

  int world_size() const { return world_; }

  // Rank `rank` posts `t`; returns every rank's post, in rank order.
  std::vector<at::Tensor> exchange(int rank, const at::Tensor& t) {
    posts_[static_cast<size_t>(rank)] = t.clone();
    barrier();
    std::vector<at::Tensor> all = posts_;
    barrier();  // nobody posts the next collective before everyone has read this one
    return all;
  }

 private:
  void barrier() {
    std::unique_lock<std::mutex> lk(mu_);
    const int64_t gen = generation_;
    if (++arrived_ == world_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lk, timeout_, [&] { return generation_ != gen; }))
      throw std::runtime_error("in-process collective: a rank did not arrive within " +
                               std::to_string(timeout_.count()) + " ms");
  }

  const int world_;
  const std::chrono::milliseconds timeout_;
  std::vector<at::Tensor> posts_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  int64_t generation_ = 0;
};

class ThreadCollectives : public engine::Collectives {
 public:
  ThreadCollectives(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return group_.world_size(); }

  void allreduce_sum_(at::Tensor& t, engine::CollectiveTraffic) override { t.copy_(sum(t)); }

  at::Tensor reduce_scatter_mean(const at::Tensor& flat, const std::vector<int64_t>& shard_sizes,
                                 engine::CollectiveTraffic) override {
    const int64_t off = std::accumulate(shard_sizes.begin(), shard_sizes.begin() + rank_, int64_t{0});
    return sum(flat).narrow(0, off, shard_sizes[static_cast<size_t>(rank_)]).div(world_size());
  }

  at::Tensor all_gather(const at::Tensor& shard, const std::vector<int64_t>&,
                        engine::CollectiveTraffic) override {
    return at::cat(group_.exchange(rank_, shard));
  }

  // The mean over ranks (what the trainer's GradReducer does for the parameters the
  // engine does not split).
  void allreduce_mean_(at::Tensor& t) { t.copy_(sum(t).div(world_size())); }

 private:
  at::Tensor sum(const at::Tensor& t) {
    const std::vector<at::Tensor> all = group_.exchange(rank_, t);
    at::Tensor s = all[0].clone();
    for (size_t r = 1; r < all.size(); ++r) s.add_(all[r]);
    return s;
  }

  ThreadGroup& group_;
  const int rank_;
};

// Runs fn(collectives, rank) on `world` threads; failures inside are gtest failures; an
// exception fails the test (and, through the bounded barrier, the other ranks).
inline void run_thread_ranks(int world, const std::function<void(ThreadCollectives&, int)>& fn) {
  ThreadGroup group(world);
  run_threads(world, [&](int r) {
    ThreadCollectives coll(group, r);
    fn(coll, r);
  });
}

}  // namespace zenflow::test_support
