// GradReducer: data-parallel gradient averaging in buckets, overlapped with backward.
//
// Parameters are grouped, in reverse order (backward produces the last layers' gradients
// first), into buckets of at most bucket_bytes (a larger parameter gets a bucket of its
// own; a dtype or device change starts a new bucket). A hook on every parameter copies
// its gradient — plus the gradient already accumulated in .grad(), when there is one —
// into its slot of the bucket's flat buffer; when a bucket's last gradient has arrived,
// and every earlier bucket has been launched, an asynchronous allreduce of the bucket is
// launched at once, while backward goes on computing the earlier layers. finish() then
// waits for the buckets (the time it blocks is the step's `allreduce` stall), divides
// by the world size and writes the averaged gradients into .grad().
//
// Memory: the buckets hold one more copy of the gradients (flat buffers allocated once).
//
// Order: buckets are always launched in index order, so every rank issues the same
// sequence of collectives even when autograd finishes parameters in a different order.
// A parameter that received no gradient in this backward (unused) holds its bucket back
// until finish(), which contributes its current .grad() (zeros when undefined).
//
// Gradient accumulation: call set_sync(false) before the micro-batches that only
// accumulate (hooks then do nothing and autograd accumulates into .grad() as usual) and
// set_sync(true) before the last one; finish() with sync off does nothing.
//
// Usage (training thread):
//   GradReducer red(comm, params);                 // registers the hooks
//   loss.backward();                               // buckets launch as they fill
//   ReduceReport r = red.finish();                 // r.wait_seconds -> StallCause::kAllreduce
//
// Threads: hooks may run on autograd's device threads (CUDA); the reducer's state is
// under a mutex. finish(), set_sync() and allreduce_now() are called by the training
// thread, never during a backward. Errors: std::invalid_argument for bad parameters
// (duplicates, no requires_grad, sparse); std::logic_error when a parameter receives two
// gradients in one synced step (thrown from the hook, so out of backward());
// std::runtime_error from the Communicator when a peer is lost or a collective times out.
// The reducer must be destroyed before the Communicator; destruction removes the hooks
// and does not wait for buckets still in flight.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/distributed/communicator.h"

namespace zenflow::distributed {

struct GradReducerOptions {
  int64_t bucket_bytes = int64_t{25} * 1024 * 1024;
  bool average = true;         // divide the sum by the world size
  bool register_hooks = true;  // false: only allreduce_now()/finish() reduce
};

struct ReduceReport {
  double wait_seconds = 0.0;         // blocked in finish(): stall cause `allreduce`
  int buckets = 0;                   // collectives issued
  int launched_during_backward = 0;  // of those, launched from hooks (overlapped)
  int64_t bytes = 0;                 // gradient bytes allreduced
};

class GradReducer {
 public:
  GradReducer(Communicator& comm, std::vector<at::Tensor> params, GradReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  void set_sync(bool sync);
  bool sync() const;

  // Completes the synced step: launches what backward did not, waits, averages, and
  // writes every parameter's .grad(). With sync off: returns an empty report.
  ReduceReport finish();

  // Averages the parameters' current .grad() now, without hooks (whatever sync says).
  ReduceReport allreduce_now();
  // The bytes of its flat buckets (allocated once, in the gradients' dtype and device).
  int64_t buffer_bytes() const;

  // Buckets launched by hooks since the last finish()/allreduce_now() (any thread).
  int launched_during_backward() const;
  int num_buckets() const;
  // Parameter indices (into the constructor's list) of each bucket, in launch order.
  std::vector<std::vector<int>> bucket_layout() const;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// One-shot: averages the .grad() of `params` over all ranks in buckets of bucket_bytes.
ReduceReport allreduce_gradients(Communicator& comm, const std::vector<at::Tensor>& params,
                                 int64_t bucket_bytes = int64_t{25} * 1024 * 1024);

}  // namespace zenflow::distributed
