// The host updater: runs accumulate and AdamW window steps on host-resident fp32 state.
//
// The engine owns the host buffers (master weights, m, v, accumulators, staging) and
// describes each piece of work as a job over spans of them. A HostOptimizer runs jobs
// off the training thread and returns a HostWork handle per job (c10d's Work idiom):
// wait() is where the training thread spends time waiting, and where the engine
// measures the `host_optimizer` stall.
//
// Ordering: step jobs run in submission order; accumulate jobs run in submission order
// among themselves and may overtake a running step job (between its chunks), because
// the engine guarantees they touch disjoint memory (the next window's accumulator).
// Backends: InProcessHostOptimizer (this file, a pinned thread pool on reserved cores);
// the remote backend (zenflow-optimizer nodes over UCX) implements the same interface.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "worker/engine/adamw_kernel.h"
#include "worker/engine/half.h"

namespace zenflow::engine {

class HostThreadPool;

// Completion handle of one submitted job. Thread safety: wait()/done() from any thread.
class HostWork {
 public:
  virtual ~HostWork() = default;
  // Blocks until the job has run; returns the seconds spent blocked. Rethrows an
  // exception the job raised.
  virtual double wait() = 0;
  virtual bool done() const = 0;
  // Seconds the job itself ran once done (a step job: from its first kernel to its last,
  // accumulate jobs run between its chunks included); negative when unknown.
  virtual double run_seconds() const { return -1; }
};

// acc[i] (+)= grad[i] * scale over each span (see accumulate_kernel.h).
struct AccumulateJob {
  struct Span {
    float* acc;
    GradRef grad;
    int64_t n;
  };
  std::vector<Span> spans;
  float scale = 1.0f;
  bool overwrite = false;
  // Runs on the host updater's thread before the kernels, e.g. to wait for the D2H
  // copy that fills the gradient staging buffer. May be empty.
  std::function<void()> before;
};

// One AdamW step per span: plain (acc == nullptr) or window-end fused (acc != nullptr:
// gradient = (acc + grad) * grad_scale). Each span carries its own coefficients
// (weight decay differs between parameters).
struct StepJob {
  struct Span {
    AdamWSpan adamw;
    const float* acc = nullptr;
    AdamWCoeffs coeffs;
  };
  std::vector<Span> spans;
  float grad_scale = 1.0f;
  std::function<void()> before;
};

class HostOptimizer {
 public:
  virtual ~HostOptimizer() = default;
  // Submit from the training thread only. The caller keeps every buffer a job refers to
  // alive and untouched until the job's wait() returned.
  virtual std::shared_ptr<HostWork> submit(AccumulateJob job) = 0;
  virtual std::shared_ptr<HostWork> submit(StepJob job) = 0;
  // Blocks until every submitted job has run; returns seconds blocked.
  virtual double drain() = 0;
  virtual int threads() const = 0;
};

struct InProcessHostOptions {
  int threads = 1;
  std::vector<int> cores;  // pin the pool here; empty = unpinned
  // Step jobs are cut into chunks of about this many elements; accumulate jobs that
  // arrive meanwhile run between chunks.
  int64_t chunk_elements = 1 << 20;
};

// A driver thread that takes jobs from two queues (accumulate first) and runs their
// kernels across a HostThreadPool.
std::unique_ptr<HostOptimizer> make_in_process_host_optimizer(const InProcessHostOptions& options);

}  // namespace zenflow::engine
