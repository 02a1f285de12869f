#include "worker/distributed/grad_reducer.h"

#include <atomic>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace zenflow::distributed {

struct GradReducer::State {
  struct Bucket {
    std::vector<int> params;       // indices into `params`
    std::vector<int64_t> offsets;  // element offset of each param in `flat`
    at::Tensor flat;
    int pending = 0;  // params whose gradient has not arrived this step
    bool launched = false;
    CommWork work;
  };

  Communicator* comm = nullptr;
  GradReducerOptions opts;
  std::vector<at::Tensor> params;
  std::vector<int> bucket_of;  // param -> bucket
  std::vector<int> slot_of;    // param -> index within its bucket
  std::vector<Bucket> buckets;
  std::vector<unsigned> hook_handles;

  std::mutex mu;  // guards everything below (hooks: any thread)
  bool sync = true;
  std::vector<char> ready;  // param received its gradient this step
  int next_launch = 0;
  std::atomic<int> launched_by_hooks{0};

  at::Tensor slot(const Bucket& b, int k) const {
    const at::Tensor& p = params[b.params[k]];
    return b.flat.narrow(0, b.offsets[k], p.numel()).view(p.sizes());
  }

  void reset_step() {
    std::fill(ready.begin(), ready.end(), 0);
    for (auto& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.launched = false;
      b.work = CommWork();
    }
    next_launch = 0;
    launched_by_hooks = 0;
  }

  // Launches, in index order, every bucket whose gradients are all in. Holds `mu`.
  void launch_ready(bool from_hook) {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0) {
      Bucket& b = buckets[next_launch];
      b.work = comm->allreduce_sum_async(b.flat, Traffic::kGradients);
      b.launched = true;
      if (from_hook) launched_by_hooks.fetch_add(1);
      ++next_launch;
    }
  }

  void on_grad(int i, const at::Tensor& grad) {
    std::lock_guard<std::mutex> lk(mu);
    if (!sync) return;
    if (ready[i]) {
      throw std::logic_error("GradReducer: parameter " + std::to_string(i) +
                             " received a second gradient before finish(); call set_sync(false) "
                             "for the micro-batches that only accumulate");
    }
    Bucket& b = buckets[bucket_of[i]];
    at::Tensor s = slot(b, slot_of[i]);
    const at::Tensor& old = params[i].grad();
    if (old.defined()) {
      at::add_out(s, old, grad);  // what AccumulateGrad is about to store in .grad()
    } else {
      s.copy_(grad);
    }
    ready[i] = 1;
    b.pending -= 1;
    launch_ready(/*from_hook=*/true);
  }

  ReduceReport complete_step() {
    ReduceReport rep;
    {
      std::lock_guard<std::mutex> lk(mu);
      rep.launched_during_backward = launched_by_hooks.load();
      // Parameters backward did not reach contribute their current .grad() (or zeros).
      for (auto& b : buckets) {
        if (b.pending == 0) continue;
        for (size_t k = 0; k < b.params.size(); ++k) {
          const int i = b.params[k];
          if (ready[i]) continue;
          at::Tensor s = slot(b, static_cast<int>(k));
          const at::Tensor& g = params[i].grad();
          if (g.defined()) {
            s.copy_(g);
          } else {
            s.zero_();
          }
          ready[i] = 1;
        }
        b.pending = 0;
      }
      launch_ready(/*from_hook=*/false);
    }
    const int world = comm->world_size();
    try {
      for (auto& b : buckets) {
        rep.wait_seconds += b.work.wait();
        rep.buckets += 1;
        rep.bytes += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
        if (opts.average && world > 1) b.flat.div_(world);
        for (size_t k = 0; k < b.params.size(); ++k) {
          at::Tensor& p = params[b.params[k]];
          at::Tensor s = slot(b, static_cast<int>(k));
          if (p.grad().defined()) {
            p.mutable_grad().copy_(s);
          } else {
            p.mutable_grad() = s.clone();
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      reset_step();
      throw;
    }
    std::lock_guard<std::mutex> lk(mu);
    reset_step();
    return rep;
  }
};

GradReducer::GradReducer(Communicator& comm, std::vector<at::Tensor> params, GradReducerOptions options)
    : state_(std::make_shared<State>()) {
  if (options.bucket_bytes <= 0) throw std::invalid_argument("GradReducer: bucket_bytes must be positive");
  auto& st = *state_;
  st.comm = &comm;
  st.opts = options;
  std::unordered_set<const void*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    const std::string what = "GradReducer: parameter " + std::to_string(i);
    if (!p.defined()) throw std::invalid_argument(what + " is undefined");
    if (!p.requires_grad()) throw std::invalid_argument(what + " does not require grad");
    if (!p.is_leaf()) throw std::invalid_argument(what + " is not a leaf tensor");
    if (p.is_sparse()) throw std::invalid_argument(what + " is sparse");
    if (p.device().type() != comm.device_type()) {
      throw std::invalid_argument(what + " is on " + p.device().str() + ", the communicator on " +
                                  c10::DeviceTypeName(comm.device_type()));
    }
    if (!seen.insert(p.unsafeGetTensorImpl()).second) {
      throw std::invalid_argument(what + " appears twice in the list (tied weights: pass it once)");
    }
  }
  st.params = std::move(params);
  const int n = static_cast<int>(st.params.size());
  st.bucket_of.assign(n, -1);
  st.slot_of.assign(n, -1);
  st.ready.assign(n, 0);

  // Reverse order: the last parameters get their gradients first.
  std::vector<std::vector<int>> groups;
  int64_t bytes = 0;
  for (int i = n - 1; i >= 0; --i) {
    const at::Tensor& p = st.params[i];
    const int64_t pb = p.numel() * static_cast<int64_t>(p.element_size());
    bool fresh = groups.empty() || bytes + pb > options.bucket_bytes;
    if (!fresh) {
      const at::Tensor& q = st.params[groups.back().front()];
      fresh = q.scalar_type() != p.scalar_type() || q.device() != p.device();
    }
    if (fresh) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(i);
    bytes += pb;
  }
  for (const auto& g : groups) {
    State::Bucket b;
    int64_t off = 0;
    for (int i : g) {
      st.bucket_of[i] = static_cast<int>(st.buckets.size());
      st.slot_of[i] = static_cast<int>(b.params.size());
      b.params.push_back(i);
      b.offsets.push_back(off);
      off += st.params[i].numel();
    }
    b.flat = at::zeros({off}, st.params[g.front()].options().requires_grad(false));
    b.pending = static_cast<int>(g.size());
    st.buckets.push_back(std::move(b));
  }

  if (options.register_hooks) {
    std::weak_ptr<State> weak = state_;
    for (int i = 0; i < n; ++i) {
      st.hook_handles.push_back(st.params[i].register_hook([weak, i](const at::Tensor& grad) {
        if (auto s = weak.lock()) s->on_grad(i, grad);
      }));
    }
  }
}

GradReducer::~GradReducer() {
  if (!state_) return;
  for (size_t i = 0; i < state_->hook_handles.size(); ++i) {
    try {
      state_->params[i].remove_hook(state_->hook_handles[i]);
    } catch (...) {
      // The hook only holds a weak pointer: a hook left behind does nothing.
    }
  }
}

void GradReducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lk(state_->mu);
  state_->sync = sync;
}

bool GradReducer::sync() const {
  std::lock_guard<std::mutex> lk(state_->mu);
  return state_->sync;
}

ReduceReport GradReducer::finish() {
  {
    std::lock_guard<std::mutex> lk(state_->mu);
    if (!state_->sync) return {};
  }
  return state_->complete_step();
}

ReduceReport GradReducer::allreduce_now() { return state_->complete_step(); }

int64_t GradReducer::buffer_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : state_->buckets) bytes += static_cast<int64_t>(b.flat.nbytes());
  return bytes;
}

int GradReducer::launched_during_backward() const { return state_->launched_by_hooks.load(); }

int GradReducer::num_buckets() const { return static_cast<int>(state_->buckets.size()); }

std::vector<std::vector<int>> GradReducer::bucket_layout() const {
  std::vector<std::vector<int>> out;
  for (const auto& b : state_->buckets) out.push_back(b.params);
  return out;
}

ReduceReport allreduce_gradients(Communicator& comm, const std::vector<at::Tensor>& params,
                                 int64_t bucket_bytes) {
  GradReducerOptions o;
  o.bucket_bytes = bucket_bytes;
  o.register_hooks = false;
  GradReducer r(comm, params, o);
  return r.allreduce_now();
}

}  // namespace zenflow::distributed
