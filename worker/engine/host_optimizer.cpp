// In-process host updater: a driver thread feeding a pinned HostThreadPool.
#include "worker/engine/host_optimizer.h"

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
#include <algorithm>
#include <variant>

#include "worker/engine/accumulate_kernel.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/stall_clock.h"

namespace zenflow::engine {
namespace {

class Completion : public HostWork {
 public:
  double wait() override {
    Stopwatch sw;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
    return sw.seconds();
  }
  bool done() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  double run_seconds() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_ ? run_seconds_ : -1;
  }
  void finish(std::exception_ptr error, double run_seconds = -1) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = error;
      run_seconds_ = run_seconds;
    }
    cv_.notify_all();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  double run_seconds_ = -1;
  std::exception_ptr error_;
};

// Calls fn(span_index, begin, end) for the parts of the spans that fall in the flat
// element range [lo, hi). `sizes` are the spans' lengths.
template <typename Fn>
void for_flat_range(const std::vector<int64_t>& starts, const std::vector<int64_t>& sizes,
                    int64_t lo, int64_t hi, Fn&& fn) {
  // starts is ascending; find the first span that ends after lo.
  size_t s = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), lo) - starts.begin());
  if (s > 0) --s;
  for (; s < sizes.size() && starts[s] < hi; ++s) {
    const int64_t b = std::max(lo, starts[s]) - starts[s];
    const int64_t e = std::min(hi, starts[s] + sizes[s]) - starts[s];
    if (e > b) fn(s, b, e);
  }
}

// Spans laid end to end: flat element index -> (span, offset).
struct FlatSpans {
  std::vector<int64_t> starts, sizes;
  int64_t total = 0;
  void add(int64_t n) {
    starts.push_back(total);
    sizes.push_back(n);
    total += n;
  }
};

class InProcessHostOptimizer : public HostOptimizer {
 public:
  explicit InProcessHostOptimizer(const InProcessHostOptions& o)
      : options_(o), pool_(o.threads, o.cores), driver_([this] { run(); }) {}

  ~InProcessHostOptimizer() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    driver_.join();
  }

  std::shared_ptr<HostWork> submit(AccumulateJob job) override {
    auto done = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      accumulates_.push_back({std::move(job), done});
    }
    cv_.notify_all();
    return done;
  }

  std::shared_ptr<HostWork> submit(StepJob job) override {
    auto done = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      steps_.push_back({std::move(job), done});
    }
    cv_.notify_all();
    return done;
  }

  double drain() override {
    Stopwatch sw;
    std::unique_lock<std::mutex> lock(mu_);
    idle_cv_.wait(lock, [&] { return accumulates_.empty() && steps_.empty() && !busy_; });
    return sw.seconds();
  }

  int threads() const override { return pool_.size(); }

 private:
  struct PendingAccumulate {
    AccumulateJob job;
    std::shared_ptr<Completion> done;
  };
  struct PendingStep {
    StepJob job;
    std::shared_ptr<Completion> done;
  };

  void run() {
    for (;;) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !accumulates_.empty() || !steps_.empty(); });
      if (!accumulates_.empty()) {
        busy_ = true;
        lock.unlock();
        run_pending_accumulates();
        lock.lock();
      } else if (!steps_.empty()) {
        PendingStep step = std::move(steps_.front());
        steps_.pop_front();
        busy_ = true;
        lock.unlock();
        run_step(step);
        lock.lock();
      } else if (stop_) {
        return;
      }
      busy_ = false;
      if (accumulates_.empty() && steps_.empty()) idle_cv_.notify_all();
    }
  }

  // Runs every queued accumulate job (called between step chunks too).
  void run_pending_accumulates() {
    for (;;) {
      PendingAccumulate acc;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (accumulates_.empty()) return;
        acc = std::move(accumulates_.front());
        accumulates_.pop_front();
      }
      std::exception_ptr error;
      try {
        if (acc.job.before) acc.job.before();
        run_accumulate(acc.job);
      } catch (...) {
        error = std::current_exception();
      }
      acc.done->finish(error);
    }
  }

  void run_accumulate(const AccumulateJob& job) {
    FlatSpans flat;
    for (const auto& s : job.spans) flat.add(s.n);
    // One pointer captured: std::function keeps it inline (no allocation per call).
    struct Ctx {
      const AccumulateJob* job;
      const FlatSpans* flat;
    } ctx{&job, &flat};
    pool_.parallel_for(flat.total, kHostChunkAlign, [c = &ctx](int64_t lo, int64_t hi) {
      for_flat_range(c->flat->starts, c->flat->sizes, lo, hi, [&](size_t i, int64_t b, int64_t e) {
        const auto& s = c->job->spans[i];
        accumulate(s.acc + b, s.grad.offset(b), e - b, c->job->scale, c->job->overwrite);
      });
    });
  }

  void run_step(PendingStep& pending) {
    std::exception_ptr error;
    double ran = -1;
    try {
      StepJob& job = pending.job;
      if (job.before) job.before();
      Stopwatch sw;  // after `before` (the D2H wait): the host step itself
      FlatSpans flat;
      for (const auto& s : job.spans) flat.add(s.adamw.n);
      const int64_t chunk = std::max<int64_t>(options_.chunk_elements, kHostChunkAlign);
      for (int64_t c0 = 0; c0 < flat.total; c0 += chunk) {
        const int64_t c1 = std::min(flat.total, c0 + chunk);
        struct Ctx {
          const StepJob* job;
          const FlatSpans* flat;
          int64_t c0;
        } ctx{&job, &flat, c0};
        pool_.parallel_for(c1 - c0, kHostChunkAlign, [c = &ctx](int64_t lo, int64_t hi) {
          for_flat_range(c->flat->starts, c->flat->sizes, c->c0 + lo, c->c0 + hi, [&](size_t i, int64_t b, int64_t e) {
            const auto& s = c->job->spans[i];
            AdamWSpan part = s.adamw;
            part.p += b;
            part.m += b;
            part.v += b;
            part.grad = s.adamw.grad.offset(b);
            if (part.half_out) part.half_out += b;
            part.n = e - b;
            if (s.acc)
              adamw_window_end(part, s.acc + b, s.coeffs, c->job->grad_scale);
            else
              adamw_step(part, s.coeffs, c->job->grad_scale);
          });
        });
        run_pending_accumulates();
      }
      ran = sw.seconds();
    } catch (...) {
      error = std::current_exception();
    }
    pending.done->finish(error, ran);
  }

  InProcessHostOptions options_;
  HostThreadPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<PendingAccumulate> accumulates_;
  std::deque<PendingStep> steps_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread driver_;  // last: starts after the queues exist
};

}  // namespace

std::unique_ptr<HostOptimizer> make_in_process_host_optimizer(const InProcessHostOptions& options) {
  return std::make_unique<InProcessHostOptimizer>(options);
}

}  // namespace zenflow::engine
