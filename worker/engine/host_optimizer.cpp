// In-process host updater: a driver thread feeding a pinned HostThreadPool.
#include "worker/engine/host_optimizer.h"

#include <condition_variable>
#include <cstring>
#include <stdexcept>
#include <string>
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
  InProcessHostOptimizer(const InProcessHostOptions& o, const HostStateLayout& layout)
      : options_(o), layout_(layout), pool_(o.threads, o.cores), driver_([this] { run(); }) {
    for (int b = 0; b < kNumHostBufs; ++b)
      if (b < arrays())
        bufs_[b] = HostBuffer(layout.elements, o.first_touch ? &pool_ : nullptr, layout.huge_pages);
  }

  ~InProcessHostOptimizer() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    driver_.join();
  }

  std::shared_ptr<HostWork> submit(AccumulateJob job) override {
    if (job.source) throw std::logic_error("in-process host optimizer: an accumulate job with a GradSource");
    auto done = std::make_shared<Completion>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      accumulates_.push_back({std::move(job), done});
    }
    cv_.notify_all();
    return done;
  }

  std::shared_ptr<HostWork> submit(StepJob job) override {
    if (job.source) throw std::logic_error("in-process host optimizer: a step job with a GradSource");
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

  void read(HostBuf b, int64_t offset, int64_t n, float* dst) override {
    check_range(b, offset, n);
    std::memcpy(dst, buf(b) + offset, static_cast<size_t>(n) * sizeof(float));
  }
  void write(HostBuf b, int64_t offset, int64_t n, const float* src) override {
    check_range(b, offset, n);
    std::memcpy(buf(b) + offset, src, static_cast<size_t>(n) * sizeof(float));
  }
  void gather_columns(const std::vector<ColumnBlock>& blocks) override {
    for (const ColumnBlock& c : blocks) check_columns(c.buf, c.offset, c.rows, c.width, c.cols);
    for (const ColumnBlock& c : blocks)
      host_gather_columns(buf(c.buf) + c.offset, c.rows, c.width, c.cols, c.data);
  }
  void scatter_columns(const std::vector<ColumnBlock>& blocks) override {
    for (const ColumnBlock& c : blocks) check_columns(c.buf, c.offset, c.rows, c.width, c.cols);
    for (const ColumnBlock& c : blocks)
      host_scatter_columns(buf(c.buf) + c.offset, c.rows, c.width, c.cols, c.data);
  }
  void repack_columns(HostBuf b, int64_t offset, int64_t rows, int64_t width, const std::vector<int64_t>& src,
                      const float* appended, int64_t n_appended) override {
    if (n_appended < 0) throw std::out_of_range("host state: negative number of appended columns");
    check_columns(b, offset, rows, width, {});
    check_range(b, offset, rows * static_cast<int64_t>(src.size()));
    for (int64_t c : src)
      if (c < 0 || c >= width + n_appended)
        throw std::out_of_range("host state: re-pack column " + std::to_string(c) + " outside a matrix " +
                                std::to_string(width) + " wide with " + std::to_string(n_appended) +
                                " appended");
    host_repack_columns(buf(b) + offset, rows, width, src, appended, n_appended);
  }
  float* local_data(HostBuf b) override { return buf(b); }
  int64_t resident_state_bytes() const override {
    return static_cast<int64_t>(arrays()) * layout_.elements * static_cast<int64_t>(sizeof(float));
  }
  std::string describe() const override { return "in-process"; }

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
    for (const auto& s : job.spans) check_range(job.acc, s.offset, s.n);
    struct Ctx {
      const AccumulateJob* job;
      const FlatSpans* flat;
      float* acc;
    } ctx{&job, &flat, buf(job.acc)};
    pool_.parallel_for(flat.total, kHostChunkAlign, [c = &ctx](int64_t lo, int64_t hi) {
      for_flat_range(c->flat->starts, c->flat->sizes, lo, hi, [&](size_t i, int64_t b, int64_t e) {
        const auto& s = c->job->spans[i];
        accumulate(c->acc + s.offset + b, s.grad.offset(b), e - b, c->job->scale, c->job->overwrite);
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
      for (const auto& s : job.spans) {
        check_range(HostBuf::kMaster, s.offset, s.n);
        if (s.half_out && s.master_out) throw std::invalid_argument("host step: a span with two outputs");
        flat.add(s.n);
      }
      if (job.acc >= 0)  // before it is read
        for (const auto& s : job.spans) check_range(static_cast<HostBuf>(job.acc), s.offset, s.n);
      const float* acc = job.acc >= 0 ? buf(static_cast<HostBuf>(job.acc)) : nullptr;
      const int64_t chunk = std::max<int64_t>(options_.chunk_elements, kHostChunkAlign);
      for (int64_t c0 = 0; c0 < flat.total; c0 += chunk) {
        const int64_t c1 = std::min(flat.total, c0 + chunk);
        struct Ctx {
          const StepJob* job;
          const FlatSpans* flat;
          int64_t c0;
          float *p, *m, *v;
          const float* acc;
        } ctx{&job, &flat, c0, buf(HostBuf::kMaster), buf(HostBuf::kM), buf(HostBuf::kV), acc};
        pool_.parallel_for(c1 - c0, kHostChunkAlign, [c = &ctx](int64_t lo, int64_t hi) {
          for_flat_range(c->flat->starts, c->flat->sizes, c->c0 + lo, c->c0 + hi, [&](size_t i, int64_t b, int64_t e) {
            const auto& s = c->job->spans[i];
            const int64_t at = s.offset + b;
            AdamWSpan part;
            part.p = c->p + at;
            part.m = c->m + at;
            part.v = c->v + at;
            part.n = e - b;
            part.half_out = s.half_out ? s.half_out + b : nullptr;
            part.half_kind = s.half_kind;
            if (s.grad.data == nullptr) {  // flush: the accumulator is the gradient
              part.grad = GradRef::f32(c->acc + at);
              adamw_step(part, s.coeffs, c->job->grad_scale);
            } else if (c->acc) {
              part.grad = s.grad.offset(b);
              adamw_window_end(part, c->acc + at, s.coeffs, c->job->grad_scale);
            } else {
              part.grad = s.grad.offset(b);
              adamw_step(part, s.coeffs, c->job->grad_scale);
            }
            if (s.master_out)
              std::memcpy(s.master_out + b, part.p, static_cast<size_t>(part.n) * sizeof(float));
          });
        });
        if (job.after_chunk) job.after_chunk(c0, c1);
        run_pending_accumulates();
      }
      ran = sw.seconds();
    } catch (...) {
      error = std::current_exception();
    }
    pending.done->finish(error, ran);
  }

  float* buf(HostBuf b) const { return bufs_[static_cast<size_t>(b)].data(); }
  void check_range(HostBuf b, int64_t offset, int64_t n) const {
    if (static_cast<uint32_t>(b) >= kNumHostBufs)
      throw std::out_of_range("host state: array " + std::to_string(static_cast<uint32_t>(b)) + " does not exist");
    if (static_cast<int>(b) >= arrays())
      throw std::out_of_range(std::string("host state: ") + host_buf_name(b) +
                              " is not held: the engine opens no windows (offload mode)");
    if (offset < 0 || n < 0 || offset > layout_.elements - n)
      throw std::out_of_range(std::string("host state: ") + host_buf_name(b) + "[" + std::to_string(offset) + ", +" +
                              std::to_string(n) + ") outside its " + std::to_string(layout_.elements) + " elements");
  }
  void check_columns(HostBuf b, int64_t offset, int64_t rows, int64_t width, const std::vector<int64_t>& cols) const {
    if (rows < 0 || width < 0) throw std::out_of_range("host state: negative matrix shape");
    check_range(b, offset, rows * width);
    for (int64_t c : cols)
      if (c < 0 || c >= width)
        throw std::out_of_range("host state: column " + std::to_string(c) + " outside a matrix " +
                                std::to_string(width) + " wide");
  }

  InProcessHostOptions options_;
  // The arrays held: master, m, v, and the accumulators when the engine opens windows.
  int arrays() const { return layout_.accumulators ? kNumHostBufs : static_cast<int>(HostBuf::kAcc0); }

  HostStateLayout layout_;
  HostBuffer bufs_[kNumHostBufs];
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

std::shared_ptr<HostWork> HostOptimizer::start_read(HostBuf b, int64_t offset, int64_t n, float* dst) {
  auto done = std::make_shared<Completion>();
  read(b, offset, n, dst);
  done->finish(nullptr);
  return done;
}

const char* host_buf_name(HostBuf b) {
  switch (b) {
    case HostBuf::kMaster: return "master";
    case HostBuf::kM: return "m";
    case HostBuf::kV: return "v";
    case HostBuf::kAcc0: return "acc0";
    case HostBuf::kAcc1: return "acc1";
  }
  return "unknown";
}

void host_gather_columns(const float* matrix, int64_t rows, int64_t width, const std::vector<int64_t>& cols,
                         float* dst) {
  const int64_t n = static_cast<int64_t>(cols.size());
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = matrix + r * width;
    float* out = dst + r * n;
    for (int64_t j = 0; j < n; ++j) out[j] = row[cols[static_cast<size_t>(j)]];
  }
}

void host_scatter_columns(float* matrix, int64_t rows, int64_t width, const std::vector<int64_t>& cols,
                          const float* src) {
  const int64_t n = static_cast<int64_t>(cols.size());
  for (int64_t r = 0; r < rows; ++r) {
    float* row = matrix + r * width;
    const float* in = src + r * n;
    for (int64_t j = 0; j < n; ++j) row[cols[static_cast<size_t>(j)]] = in[j];
  }
}

void host_repack_columns(float* matrix, int64_t rows, int64_t width, const std::vector<int64_t>& src,
                         const float* appended, int64_t n_appended) {
  const int64_t n = static_cast<int64_t>(src.size());
  std::vector<float> row(static_cast<size_t>(width + n_appended));
  auto one = [&](int64_t r) {
    std::copy_n(matrix + r * width, width, row.begin());
    if (n_appended > 0) std::copy_n(appended + r * n_appended, n_appended, row.begin() + width);
    float* out = matrix + r * n;
    for (int64_t j = 0; j < n; ++j) out[j] = row[static_cast<size_t>(src[static_cast<size_t>(j)])];
  };
  // Row r is written to [r * n, (r + 1) * n) and read from [r * width, (r + 1) * width).
  if (n <= width)
    for (int64_t r = 0; r < rows; ++r) one(r);
  else
    for (int64_t r = rows - 1; r >= 0; --r) one(r);
}

std::unique_ptr<HostOptimizer> make_in_process_host_optimizer(const InProcessHostOptions& options,
                                                              const HostStateLayout& layout) {
  return std::make_unique<InProcessHostOptimizer>(options, layout);
}

}  // namespace zenflow::engine
