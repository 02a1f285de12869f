// The scheduling pass of scheduler.h: queue order, gang fit, reservation, backfill, preemption.
#include "server/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "common/allowed_roots.h"

namespace zenflow::scheduler {
namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

bool covers(const Resources& have, const Resources& need) {
  return have.slots >= need.slots && have.host_memory_bytes >= need.host_memory_bytes &&
         have.cores >= need.cores;
}
Resources operator+(const Resources& a, const Resources& b) {
  return {a.slots + b.slots, a.host_memory_bytes + b.host_memory_bytes, a.cores + b.cores};
}
Resources operator-(const Resources& a, const Resources& b) {
  return {a.slots - b.slots, a.host_memory_bytes - b.host_memory_bytes, a.cores - b.cores};
}
Resources clamp_to(const Resources& have, const Resources& cap) {  // per resource min(max(have, 0), cap)
  auto f = [](int64_t h, int64_t c) { return std::min(std::max<int64_t>(h, 0), c); };
  return {f(have.slots, cap.slots), f(have.host_memory_bytes, cap.host_memory_bytes),
          f(have.cores, cap.cores)};
}
Resources shortfall(const Resources& have, const Resources& need) {
  auto f = [](int64_t h, int64_t n) { return std::max<int64_t>(n - h, 0); };
  return {f(have.slots, need.slots), f(have.host_memory_bytes, need.host_memory_bytes),
          f(have.cores, need.cores)};
}
// Best-fit order: least left over, resource by resource.
bool tighter(const Resources& a, const Resources& b) {
  if (a.slots != b.slots) return a.slots < b.slots;
  if (a.host_memory_bytes != b.host_memory_bytes) return a.host_memory_bytes < b.host_memory_bytes;
  return a.cores < b.cores;
}

std::string format_bytes(int64_t b) {
  const double gib = static_cast<double>(b) / static_cast<double>(1LL << 30);
  const bool use_gib = b >= (1LL << 30);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", use_gib ? gib : static_cast<double>(b) / (1 << 20));
  std::string s = buf;
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s + (use_gib ? " GiB" : " MiB");
}

std::string plural(int64_t n, const std::string& one, const std::string& many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

// "2 workers each with 1 A100 GPU, 60 GiB host RAM and 8 cores"
std::string describe_demand(const JobView& j) {
  std::string slot;
  if (!j.gpu_model.empty()) {
    slot = plural(j.per_worker.slots, j.gpu_model + " GPU", j.gpu_model + " GPUs");
  } else if (j.slot_kind == SlotKind::kGpu) {
    slot = plural(j.per_worker.slots, "GPU", "GPUs");
  } else if (j.slot_kind == SlotKind::kCpu) {
    slot = plural(j.per_worker.slots, "CPU slot", "CPU slots");
  } else {
    slot = plural(j.per_worker.slots, "GPU or CPU slot", "GPU or CPU slots");
  }
  std::vector<std::string> parts = {slot};
  if (j.per_worker.host_memory_bytes > 0)
    parts.push_back(format_bytes(j.per_worker.host_memory_bytes) + " host RAM");
  if (j.per_worker.cores > 0) parts.push_back(plural(j.per_worker.cores, "core", "cores"));
  std::string s = plural(j.workers, "worker", "workers") + (j.workers == 1 ? " with " : " each with ");
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) s += i + 1 == parts.size() ? " and " : ", ";
    s += parts[i];
  }
  if (j.min_gpu_memory_bytes > 0) s += " (" + format_bytes(j.min_gpu_memory_bytes) + " per GPU)";
  if (!j.node_selector.empty()) {
    s += " matching";
    for (const auto& [k, v] : j.node_selector) s += " " + k + "=" + v;
  }
  return s;
}

std::string join_ids(const std::vector<std::string>& ids) {
  constexpr size_t kShown = 4;
  std::string s;
  for (size_t i = 0; i < ids.size() && i < kShown; ++i) s += (i ? ", " : "") + ids[i];
  if (ids.size() > kShown) s += " and " + std::to_string(ids.size() - kShown) + " more";
  return s;
}

std::string invalid_demand(const JobView& j) {
  if (j.workers < 1) return "workers must be >= 1, got " + std::to_string(j.workers);
  if (j.per_worker.slots < 1)
    return "slots per worker must be >= 1, got " + std::to_string(j.per_worker.slots);
  if (j.per_worker.host_memory_bytes < 0) return "host memory must be >= 0";
  if (j.per_worker.cores < 0) return "cores must be >= 0";
  if (j.min_gpu_memory_bytes < 0) return "GPU memory must be >= 0";
  if (j.optimizer_nodes < 0) return "optimizer nodes must be >= 0";
  if (j.node_memory_bytes < 0) return "optimizer node memory must be >= 0";
  return "";
}

// Counts of one fit scan of a job over its eligible workers.
struct FitCounts {
  int64_t fits = 0;         // free minus holds covers the demand (usable now)
  int64_t fits_unheld = 0;  // ... and no reservation on the worker (preemption planning)
  int64_t fits_ignoring_holds = 0;
  int blocking_owner = -1;  // a reserving job whose hold is what stops a fit
};

class Pass {
 public:
  // skip_stable: leave out the queued jobs rule 8 allows to skip.
  Pass(const std::vector<WorkerView>& workers, const std::vector<JobView>& jobs,
       const ScheduleOptions& options, const std::vector<NodeView>& nodes, bool skip_stable)
      : jobs_(jobs), opt_(options), skip_stable_(skip_stable && options.generation >= 0) {
    index_workers(workers);
    index_nodes(nodes);
    index_jobs();
  }

  ScheduleDecision run() {
    sig_of_.assign(jobs_.size(), -1);
    for (int q : queue_) {
      const JobView& j = jobs_[static_cast<size_t>(q)];
      if (!invalid_demand(j).empty()) continue;
      const int sig = signature_of(j);
      sig_of_[static_cast<size_t>(q)] = sig;
      Resources& m = sigs_[static_cast<size_t>(sig)].min_demand;
      m = {std::min(m.slots, j.per_worker.slots),
           std::min(m.host_memory_bytes, j.per_worker.host_memory_bytes),
           std::min(m.cores, j.per_worker.cores)};
    }
    for (int q : queue_) schedule_one(q);
    return std::move(out_);
  }

 private:
  // A constraint set shared by queued jobs: the workers it admits, in id order.
  // `eligible` is fixed for the pass; `live` drops the workers whose free capacity fell
  // below the smallest demand of the signature's queued jobs (free only shrinks within a
  // pass, so they can never fit one again).
  struct Signature {
    std::vector<int> eligible;
    std::vector<int> live;
    Resources min_demand;
    // Rule 3's paths: schedulable workers that meet every other constraint but whose
    // allowed roots refuse the job's paths, and the first of them (-1: none).
    int64_t refused_for_paths = 0;
    int first_refused = -1;
  };
  struct MemoKey {
    int sig;
    int64_t workers, slots, ram, cores, priority;
    bool operator==(const MemoKey& o) const {
      return sig == o.sig && workers == o.workers && slots == o.slots && ram == o.ram && cores == o.cores &&
             priority == o.priority;
    }
  };
  struct MemoHash {
    size_t operator()(const MemoKey& k) const {
      uint64_t h = static_cast<uint64_t>(k.sig) * 0x9E3779B97F4A7C15ull;
      for (int64_t v : {k.workers, k.slots, k.ram, k.cores, k.priority})
        h = (h ^ static_cast<uint64_t>(v)) * 0x100000001B3ull + (h >> 29);
      return static_cast<size_t>(h);
    }
  };
  struct MemoFit {
    uint64_t epoch;
    FitCounts counts;
  };

  void index_workers(const std::vector<WorkerView>& in) {
    w_.reserve(in.size());
    for (const WorkerView& w : in) w_.push_back(&w);
    std::sort(w_.begin(), w_.end(), [](const WorkerView* a, const WorkerView* b) { return a->id < b->id; });
    const size_t n = w_.size();
    cap_.resize(n);
    free_.resize(n);
    hold_.assign(n, Resources{});
    reserved_by_.assign(n, -1);
    jobs_on_.resize(n);
    delta_.assign(n, Resources{});
    is_touched_.assign(n, 0);
    for (size_t i = 0; i < n; ++i) {
      const WorkerView& w = *w_[i];
      if (i > 0 && w_[i - 1]->id == w.id)
        throw std::invalid_argument("schedule: duplicate worker id '" + w.id + "'");
      const Resources total{w.gpus > 0 ? w.gpus : w.cpu_slots, w.host_memory_bytes, w.physical_cores};
      cap_[i] = total - w.reserved;
      free_[i] = cap_[i];
      by_id_.emplace(std::string_view(w.id), static_cast<int>(i));
    }
    // Workers share a few sets of allowed roots (the chart gives all the same): the paths of
    // a job are checked once per set, not once per worker.
    root_set_of_.assign(n, -1);
    std::map<std::vector<std::string>, int> sets;
    for (size_t i = 0; i < n; ++i) {
      const std::vector<std::string>& roots = w_[i]->allowed_roots;
      if (roots.empty()) continue;  // unconfined
      auto it = sets.find(roots);
      if (it == sets.end()) {
        it = sets.emplace(roots, static_cast<int>(root_sets_.size())).first;
        root_sets_.push_back(&roots);
      }
      root_set_of_[i] = it->second;
    }
  }

  // The first of `j`'s paths that `roots` do not cover (lexically: the coordinator cannot
  // resolve a worker's symlinks), or nullptr.
  static const std::pair<std::string, std::string>* uncovered_path(const JobView& j,
                                                                   const std::vector<std::string>& roots) {
    for (const auto& kp : j.confined_paths)
      if (std::none_of(roots.begin(), roots.end(),
                       [&](const std::string& r) { return path_within(kp.second, r); }))
        return &kp;
    return nullptr;
  }

  // "; 2 schedulable workers refuse its paths: checkpoint.dir /etc/ck is outside the allowed
  // roots of w1 (/shared, /var/lib/zenflow/work)"
  std::string paths_note(const JobView& j, const Signature& s) const {
    if (s.refused_for_paths == 0) return "";
    const WorkerView& w = *w_[static_cast<size_t>(s.first_refused)];
    const auto* kp = uncovered_path(j, w.allowed_roots);
    return "; " + plural(s.refused_for_paths, "schedulable worker refuses", "schedulable workers refuse") +
           " its paths: " + (kp ? kp->first + " " + kp->second : std::string("a path")) +
           " is outside the allowed roots of " + w.id + " (" + join_ids(w.allowed_roots) + ")";
  }

  void index_nodes(const std::vector<NodeView>& in) {
    n_.reserve(in.size());
    for (const NodeView& n : in) n_.push_back(&n);
    std::sort(n_.begin(), n_.end(), [](const NodeView* a, const NodeView* b) { return a->id < b->id; });
    node_free_.assign(n_.size(), 0);
    node_held_by_.assign(n_.size(), -1);
    for (size_t i = 0; i < n_.size(); ++i) {
      if (i > 0 && n_[i - 1]->id == n_[i]->id)
        throw std::invalid_argument("schedule: duplicate optimizer node id '" + n_[i]->id + "'");
      node_free_[i] = n_[i]->schedulable ? 1 : 0;
      node_by_id_.emplace(std::string_view(n_[i]->id), static_cast<int>(i));
    }
  }

  // Rule 9: the free nodes job j may take (unheld, or held by j itself) with its share of
  // host RAM, tightest first (least RAM left, then id).
  std::vector<int> nodes_for(int q) const {
    const JobView& j = jobs_[static_cast<size_t>(q)];
    std::vector<int> c;
    for (size_t i = 0; i < n_.size(); ++i)
      if (node_free_[i] && (node_held_by_[i] < 0 || node_held_by_[i] == q) &&
          n_[i]->host_memory_bytes >= j.node_memory_bytes)
        c.push_back(static_cast<int>(i));
    std::stable_sort(c.begin(), c.end(), [this](int a, int b) {
      return n_[static_cast<size_t>(a)]->host_memory_bytes < n_[static_cast<size_t>(b)]->host_memory_bytes;
    });
    return c;
  }
  bool nodes_fit(int q) const {
    const JobView& j = jobs_[static_cast<size_t>(q)];
    return j.optimizer_nodes == 0 || static_cast<int64_t>(nodes_for(q).size()) >= j.optimizer_nodes;
  }
  int64_t nodes_could_ever(const JobView& j) const {
    int64_t n = 0;
    for (const NodeView* v : n_) n += v->schedulable && v->host_memory_bytes >= j.node_memory_bytes;
    return n;
  }
  std::string describe_nodes(const JobView& j) const {
    return plural(j.optimizer_nodes, "optimizer node", "optimizer nodes") +
           (j.node_memory_bytes > 0 ? (j.optimizer_nodes == 1 ? " with " : " each with ") +
                                          format_bytes(j.node_memory_bytes) + " host RAM"
                                    : std::string());
  }
  // "; needs 2 optimizer nodes each with 8 GiB host RAM; 1 free (1 more held for job X)"
  std::string nodes_short(int q) const {
    const JobView& j = jobs_[static_cast<size_t>(q)];
    int64_t held = 0;
    std::string holder;
    for (size_t i = 0; i < n_.size(); ++i)
      if (node_free_[i] && node_held_by_[i] >= 0 && node_held_by_[i] != q &&
          n_[i]->host_memory_bytes >= j.node_memory_bytes) {
        ++held;
        holder = jobs_[static_cast<size_t>(node_held_by_[i])].id;
      }
    return "needs " + describe_nodes(j) + "; " + std::to_string(nodes_for(q).size()) + " free" +
           (held > 0 ? " (" + std::to_string(held) + " more held for job " + holder + ")" : "");
  }
  std::vector<std::string> node_ids_of(const std::vector<int>& idx) const {
    std::vector<std::string> ids;
    for (int i : idx) ids.push_back(n_[static_cast<size_t>(i)]->id);
    return ids;
  }

  void index_jobs() {
    std::unordered_map<std::string_view, int> seen;
    seen.reserve(jobs_.size());
    placed_on_.resize(jobs_.size());
    for (size_t j = 0; j < jobs_.size(); ++j) {
      const JobView& job = jobs_[j];
      if (!seen.emplace(std::string_view(job.id), static_cast<int>(j)).second)
        throw std::invalid_argument("schedule: duplicate job id '" + job.id + "'");
      if (job.state == JobState::kQueued) {
        if (skip_stable_ && job.unplaceable_generation == opt_.generation && job.reserved_workers.empty()) {
          ++out_.skipped;
        } else {
          queue_.push_back(static_cast<int>(j));
        }
        continue;
      }
      // Allocations come from the running jobs' placements.
      for (const std::string& nid : job.node_placement)
        if (auto it = node_by_id_.find(nid); it != node_by_id_.end()) node_free_[static_cast<size_t>(it->second)] = 0;
      std::vector<int>& on = placed_on_[j];
      for (const std::string& wid : job.placement) {
        auto it = by_id_.find(wid);
        if (it == by_id_.end()) continue;  // the worker is gone from the registry
        on.push_back(it->second);
        free_[static_cast<size_t>(it->second)] = free_[static_cast<size_t>(it->second)] - job.per_worker;
        jobs_on_[static_cast<size_t>(it->second)].push_back(static_cast<int>(j));
      }
      if (job.state == JobState::kRunning) {
        if (opt_.now_ms - job.start_time_ms >= opt_.preemption_min_runtime_ms) {
          victims_.push_back(static_cast<int>(j));
        } else if (opt_.preemption) {
          const int64_t at = job.start_time_ms + opt_.preemption_min_runtime_ms;
          if (out_.next_preemptable_ms < 0 || at < out_.next_preemptable_ms) out_.next_preemptable_ms = at;
        }
      }
    }
    // What the PREEMPTING jobs will free, per worker (in worker order: deterministic).
    pending_free_.assign(w_.size(), Resources{});
    has_pending_.assign(w_.size(), 0);
    for (size_t j = 0; j < jobs_.size(); ++j)
      if (jobs_[j].state == JobState::kPreempting)
        for (int i : placed_on_[j]) add_pending(i, jobs_[j].per_worker);
    std::sort(pending_workers_.begin(), pending_workers_.end());
    std::sort(queue_.begin(), queue_.end(), [this](int a, int b) {
      const JobView &x = jobs_[static_cast<size_t>(a)], &y = jobs_[static_cast<size_t>(b)];
      if (x.priority != y.priority) return x.priority > y.priority;
      if (x.submit_seq != y.submit_seq) return x.submit_seq < y.submit_seq;
      return x.id < y.id;
    });
    // Eviction preference: lowest priority, then most recent start (least lost work).
    std::sort(victims_.begin(), victims_.end(), [this](int a, int b) {
      const JobView &x = jobs_[static_cast<size_t>(a)], &y = jobs_[static_cast<size_t>(b)];
      if (x.priority != y.priority) return x.priority < y.priority;
      if (x.start_time_ms != y.start_time_ms) return x.start_time_ms > y.start_time_ms;
      return x.id < y.id;
    });
    claimed_.assign(jobs_.size(), 0);
    reserving_.assign(jobs_.size(), 0);
  }

  bool admits(const JobView& j, const WorkerView& w) const {
    if (!w.schedulable) return false;
    const bool needs_gpu = j.slot_kind == SlotKind::kGpu || !j.gpu_model.empty();
    if (w.gpus > 0) {
      if (j.slot_kind == SlotKind::kCpu) return false;
      if (!j.gpu_model.empty() && j.gpu_model != w.gpu_model) return false;
      if (w.gpu_memory_bytes < j.min_gpu_memory_bytes) return false;
    } else if (needs_gpu) {
      return false;
    }
    for (const auto& [k, v] : j.node_selector) {
      auto it = w.labels.find(k);
      if (it == w.labels.end() || it->second != v) return false;
    }
    return true;
  }

  int signature_of(const JobView& j) {
    std::string key;
    key += static_cast<char>('0' + static_cast<int>(j.slot_kind));
    key += j.gpu_model;
    key += '\0';
    key += std::to_string(j.min_gpu_memory_bytes);
    for (const auto& [k, v] : j.node_selector) {
      key += '\0';
      key += k;
      key += '\0';
      key += v;
    }
    // Which root sets refuse the job's paths: jobs refused by the same sets share the rest.
    std::vector<char> refused(root_sets_.size(), 0);
    if (!j.confined_paths.empty() && !root_sets_.empty()) {
      key += '\1';
      for (size_t r = 0; r < root_sets_.size(); ++r) {
        refused[r] = uncovered_path(j, *root_sets_[r]) != nullptr;
        key += refused[r] ? '1' : '0';
      }
    }
    auto [it, inserted] = sig_index_.emplace(std::move(key), static_cast<int>(sigs_.size()));
    if (inserted) {
      Signature s;
      for (size_t i = 0; i < w_.size(); ++i) {
        if (!admits(j, *w_[i])) continue;
        if (const int r = root_set_of_[i]; r >= 0 && refused[static_cast<size_t>(r)]) {
          if (s.refused_for_paths++ == 0) s.first_refused = static_cast<int>(i);
          continue;
        }
        s.eligible.push_back(static_cast<int>(i));
      }
      s.live = s.eligible;
      s.min_demand = j.per_worker;
      sigs_.push_back(std::move(s));
    }
    return it->second;
  }

  // One scan over the signature's live workers. cand_ gets the workers the job fits now:
  // with best > 0 only the `best` tightest, in best-fit order (kept sorted while scanning,
  // so a placement costs O(live + insertions x best), not a sort of every fitting worker);
  // with best == 0 all of them, in worker order. could_ever is left to could_ever_fit().
  FitCounts scan(int sig, const Resources& d, int64_t best) {
    FitCounts c;
    cand_.clear();
    cand_left_.clear();
    const size_t keep = static_cast<size_t>(best);
    auto offer = [&](int i, const Resources& left) {
      if (best == 0) {
        cand_.push_back(i);
        return;
      }
      // Worker order is the tie-break, and workers arrive in it: ties stay behind.
      if (cand_.size() == keep && !tighter(left, cand_left_.back())) return;
      size_t at = cand_.size() < keep ? cand_.size() : keep - 1;
      if (cand_.size() < keep) {
        cand_.push_back(i);
        cand_left_.push_back(left);
      }
      for (; at > 0 && tighter(left, cand_left_[at - 1]); --at) {
        cand_[at] = cand_[at - 1];
        cand_left_[at] = cand_left_[at - 1];
      }
      cand_[at] = i;
      cand_left_[at] = left;
    };
    Signature& s = sigs_[static_cast<size_t>(sig)];
    size_t kept = 0;
    for (size_t n = 0; n < s.live.size(); ++n) {
      const int i = s.live[n];
      const size_t u = static_cast<size_t>(i);
      const Resources& f = free_[u];
      if (!covers(f, s.min_demand)) continue;  // dropped for the rest of the pass
      s.live[kept++] = i;
      if (!covers(f, d)) continue;
      ++c.fits_ignoring_holds;
      if (reserved_by_[u] < 0) {
        ++c.fits;
        ++c.fits_unheld;
        offer(i, f);
      } else if (const Resources lendable = f - hold_[u]; covers(lendable, d)) {
        ++c.fits;
        offer(i, lendable);
      } else if (c.blocking_owner < 0) {
        c.blocking_owner = reserved_by_[u];
      }
    }
    s.live.resize(kept);
    return c;
  }

  // How many eligible workers could hold one member on an otherwise empty worker, counted
  // up to `k` (exact below it). Capacity is fixed, so the answer is remembered.
  int64_t could_ever_fit(int sig, const Resources& d, int64_t k) {
    const MemoKey key{sig, k, d.slots, d.host_memory_bytes, d.cores, 0};
    auto it = could_ever_.find(key);
    if (it != could_ever_.end()) return it->second;
    int64_t n = 0;
    for (int i : sigs_[static_cast<size_t>(sig)].eligible)
      if (covers(cap_[static_cast<size_t>(i)], d) && ++n >= k) break;
    could_ever_.emplace(key, n);
    return n;
  }

  // The k tightest of `cands` under `avail(i)` (best fit, then worker id = index order).
  template <typename Avail>
  std::vector<int> best_fit(std::vector<int> cands, int64_t k, Avail avail) const {
    auto less = [&](int a, int b) {
      const Resources ra = avail(a), rb = avail(b);
      if (tighter(ra, rb)) return true;
      if (tighter(rb, ra)) return false;
      return a < b;
    };
    const auto kk = static_cast<std::ptrdiff_t>(k);
    if (static_cast<std::ptrdiff_t>(cands.size()) > kk) {
      std::nth_element(cands.begin(), cands.begin() + kk - 1, cands.end(), less);
      cands.resize(static_cast<size_t>(kk));
    }
    std::sort(cands.begin(), cands.end(), less);
    return cands;
  }

  std::vector<std::string> ids_of(const std::vector<int>& idx) const {
    std::vector<std::string> ids;
    ids.reserve(idx.size());
    for (int i : idx) ids.push_back(w_[static_cast<size_t>(i)]->id);
    return ids;
  }

  // Called once per queued job that is not assigned, after any reservation it makes.
  void wait(const JobView& j, std::string reason) {
    const bool reserving = reserving_[static_cast<size_t>(&j - jobs_.data())] != 0;
    out_.waiting.push_back({j.id, std::move(reason), !reserving});
  }

  void reserve(int q, const std::vector<int>& workers, const Resources& d, int64_t earliest_start) {
    for (int i : workers) {
      const size_t u = static_cast<size_t>(i);
      hold_[u] = clamp_to(free_[u], d);
      reserved_by_[u] = q;
    }
    // Rule 9: and the free nodes it would take, up to its count.
    const std::vector<int> nodes = nodes_for(q);
    for (size_t k = 0; k < nodes.size() && static_cast<int64_t>(k) < jobs_[static_cast<size_t>(q)].optimizer_nodes; ++k)
      node_held_by_[static_cast<size_t>(nodes[k])] = q;
    reserving_[static_cast<size_t>(q)] = 1;
    ++epoch_;
    out_.reservations.push_back({jobs_[static_cast<size_t>(q)].id, ids_of(workers), earliest_start});
  }

  void schedule_one(int q) {
    const JobView& j = jobs_[static_cast<size_t>(q)];
    if (std::string bad = invalid_demand(j); !bad.empty()) return wait(j, "invalid demand: " + bad);
    const Resources& d = j.per_worker;
    const int sig = sig_of_[static_cast<size_t>(q)];
    const std::string needs = "needs " + describe_demand(j);
    auto unschedulable = [&](int64_t ever) {
      wait(j, "unschedulable: " + needs + "; only " +
                  plural(ever, "schedulable worker", "schedulable workers") + " could ever fit one" +
                  paths_note(j, sigs_[static_cast<size_t>(sig)]));
    };
    if (j.optimizer_nodes > 0) {
      if (const int64_t ever = nodes_could_ever(j); ever < j.optimizer_nodes)
        return wait(j, "unschedulable: needs " + describe_nodes(j) + "; only " +
                           plural(ever, "schedulable optimizer node", "schedulable optimizer nodes") +
                           " could ever hold one");
    }
    if (head_ >= 0 && !opt_.backfill) {
      if (const int64_t ever = could_ever_fit(sig, d, j.workers); ever < j.workers)
        return unschedulable(ever);
      return wait(j, "blocked behind head job " + jobs_[static_cast<size_t>(head_)].id + " (backfill off)");
    }

    const MemoKey key{sig, j.workers, d.slots, d.host_memory_bytes, d.cores, 0};
    FitCounts c;
    auto memo = failed_fit_.find(key);
    const bool remembered = memo != failed_fit_.end() && memo->second.epoch == epoch_;
    if (remembered) {
      c = memo->second.counts;
    } else {
      c = scan(sig, d, j.workers);
      if (c.fits >= j.workers && nodes_fit(q)) {
        for (int i : cand_) free_[static_cast<size_t>(i)] = free_[static_cast<size_t>(i)] - d;
        std::vector<int> nodes = nodes_for(q);
        nodes.resize(static_cast<size_t>(j.optimizer_nodes));
        for (int i : nodes) node_free_[static_cast<size_t>(i)] = 0;
        ++epoch_;
        out_.assignments.push_back({j.id, ids_of(cand_), node_ids_of(nodes)});
        return;
      }
      if (c.fits < j.workers) failed_fit_[key] = {epoch_, c};
    }

    if (const int64_t ever = could_ever_fit(sig, d, j.workers); ever < j.workers) return unschedulable(ever);

    // Short of optimizer nodes: eviction frees none, so it does not preempt (rule 9).
    const bool nodes_short_now = !nodes_fit(q);
    std::string preempt_note = nodes_short_now ? "; " + nodes_short(q) : "";
    if (!nodes_short_now && plan_preemption(q, sig, c, &preempt_note)) return;

    if (head_ < 0) {
      head_ = q;
      reserve_for_head(q, sig, c, preempt_note);
      return;
    }
    if (c.fits_ignoring_holds >= j.workers && c.blocking_owner >= 0) {
      const int owner = c.blocking_owner;
      return wait(j, "blocked behind " + std::string(owner == head_ ? "head job " : "job ") +
                         jobs_[static_cast<size_t>(owner)].id + " (reservation): " + needs + "; " +
                         std::to_string(c.fits) + " fit outside reservations" + preempt_note);
    }
    const int64_t held = c.fits_ignoring_holds - c.fits;
    wait(j, "waiting: " + needs + "; " + std::to_string(c.fits) + " fit now" +
                (held > 0 ? ", " + std::to_string(held) + " more reserved for other jobs" : "") +
                preempt_note);
  }

  // EASY reservation: the workers that fit a member soonest (rule 5 of the header).
  void reserve_for_head(int q, int sig, const FitCounts& c, const std::string& note) {
    const JobView& j = jobs_[static_cast<size_t>(q)];
    const Resources& d = j.per_worker;
    struct Cand {
      int64_t when;
      bool kept;  // reserved for this job by the previous pass
      Resources shortfall;
      int idx;
    };
    std::vector<int> before;
    for (const std::string& id : j.reserved_workers)
      if (auto it = by_id_.find(id); it != by_id_.end()) before.push_back(it->second);
    std::sort(before.begin(), before.end());
    std::vector<Cand> cands;
    for (int i : sigs_[static_cast<size_t>(sig)].eligible) {
      const size_t u = static_cast<size_t>(i);
      if (reserved_by_[u] >= 0 || !covers(cap_[u], d)) continue;
      cands.push_back(
          {fits_at(u, d), std::binary_search(before.begin(), before.end(), i), shortfall(free_[u], d), i});
    }
    auto less = [](const Cand& a, const Cand& b) {
      if (a.when != b.when) return a.when < b.when;
      if (a.kept != b.kept) return a.kept;
      if (tighter(a.shortfall, b.shortfall)) return true;
      if (tighter(b.shortfall, a.shortfall)) return false;
      return a.idx < b.idx;
    };
    // The head is the first job to reserve anything, and could_ever_fit() >= workers, so
    // there are enough candidates.
    const auto kk = static_cast<std::ptrdiff_t>(j.workers);
    std::nth_element(cands.begin(), cands.begin() + kk - 1, cands.end(), less);
    cands.resize(static_cast<size_t>(kk));
    std::sort(cands.begin(), cands.end(), less);
    std::vector<int> chosen;
    int64_t earliest = opt_.now_ms;
    for (const Cand& x : cands) {
      chosen.push_back(x.idx);
      earliest = std::max(earliest, x.when);
    }
    const int64_t start = earliest == kNever ? -1 : earliest;
    reserve(q, chosen, d, start);
    std::string when = start < 0
                           ? "earliest start unknown"
                           : "earliest start in " + std::to_string((start - opt_.now_ms + 999) / 1000) + " s";
    wait(j, "waiting: needs " + describe_demand(j) + "; " + std::to_string(c.fits) +
                " fit now; head of the queue, reserved " + join_ids(ids_of(chosen)) + " (" + when + ")" +
                note);
  }

  // When worker u would fit `d`, if its running jobs end at their estimated ends.
  int64_t fits_at(size_t u, const Resources& d) const {
    Resources f = free_[u];
    if (covers(f, d)) return opt_.now_ms;
    std::vector<std::pair<int64_t, int>> ends;
    for (int jj : jobs_on_[u]) {
      const JobView& r = jobs_[static_cast<size_t>(jj)];
      const int64_t end = pending(jj)              ? opt_.now_ms
                          : r.estimated_end_ms > 0 ? std::max(r.estimated_end_ms, opt_.now_ms)
                                                   : kNever;
      ends.emplace_back(end, jj);
    }
    std::sort(ends.begin(), ends.end());
    for (const auto& [end, jj] : ends) {
      if (end == kNever) break;
      f = f + jobs_[static_cast<size_t>(jj)].per_worker;
      if (covers(f, d)) return end;
    }
    return kNever;
  }

  // Rule 7 of the header. Returns true when job q now waits on preemption (victims already
  // checkpointing, or new ones chosen here), having recorded its reason; otherwise false,
  // with *note saying why eviction would not help, if it was tried.
  bool plan_preemption(int q, int sig, const FitCounts& c, std::string* note) {
    const JobView& j = jobs_[static_cast<size_t>(q)];
    const Resources& d = j.per_worker;
    const bool can_preempt = opt_.preemption && !victims_.empty() &&
                             jobs_[static_cast<size_t>(victims_.front())].priority < j.priority;
    if (pending_workers_.empty() && !can_preempt) return false;
    const MemoKey key{sig, j.workers, d.slots, d.host_memory_bytes, d.cores, j.priority};
    if (auto m = failed_plan_.find(key); m != failed_plan_.end() && m->second.epoch == epoch_) {
      *note = m->second.note;
      return false;
    }

    const std::vector<int>& eligible = sigs_[static_cast<size_t>(sig)].eligible;
    auto candidate = [&](int i) {
      const size_t u = static_cast<size_t>(i);
      return reserved_by_[u] < 0 && covers(cap_[u], d) &&
             std::binary_search(eligible.begin(), eligible.end(), i);
    };
    // delta_: what the plan counts as freed per worker (victims already checkpointing,
    // then new ones); touched_ lists the workers where it may be non-zero.
    touched_.clear();
    int64_t fitting = c.fits_unheld;
    auto add = [&](int i, const Resources& r, int sign) {
      const size_t u = static_cast<size_t>(i);
      const bool before = covers(free_[u] + delta_[u], d);
      if (!is_touched_[u]) {
        is_touched_[u] = 1;
        touched_.push_back(i);
      }
      delta_[u] = sign > 0 ? delta_[u] + r : delta_[u] - r;
      fitting += static_cast<int64_t>(covers(free_[u] + delta_[u], d)) - static_cast<int64_t>(before);
    };
    auto evict = [&](int victim, int sign) {
      for (int i : placed_on_[static_cast<size_t>(victim)])
        if (candidate(i)) add(i, jobs_[static_cast<size_t>(victim)].per_worker, sign);
    };
    auto touches_candidate = [&](int victim) {
      for (int i : placed_on_[static_cast<size_t>(victim)])
        if (candidate(i)) return true;
      return false;
    };
    auto reset = [&]() {
      for (int i : touched_) {
        delta_[static_cast<size_t>(i)] = Resources{};
        is_touched_[static_cast<size_t>(i)] = 0;
      }
      touched_.clear();
    };

    for (int i : pending_workers_)
      if (candidate(i)) add(i, pending_free_[static_cast<size_t>(i)], +1);
    std::vector<int> chosen;
    if (fitting < j.workers && can_preempt) {
      for (int v : victims_) {
        if (fitting >= j.workers) break;
        if (jobs_[static_cast<size_t>(v)].priority >= j.priority) break;
        if (claimed_[static_cast<size_t>(v)] || !touches_candidate(v)) continue;
        evict(v, +1);
        chosen.push_back(v);
      }
      if (fitting >= j.workers) {
        // Spare the most valuable first (the end of the eviction order).
        for (size_t k = chosen.size(); k-- > 0;) {
          evict(chosen[k], -1);
          if (fitting >= j.workers) {
            chosen.erase(chosen.begin() + static_cast<std::ptrdiff_t>(k));
          } else {
            evict(chosen[k], +1);
          }
        }
      }
    }
    if (fitting < j.workers) {
      reset();
      *note = can_preempt ? "; preempting lower-priority jobs would not make it fit" : "";
      failed_plan_[key] = {epoch_, *note};
      return false;
    }

    // Where it will run: unheld workers that fit now plus those the plan frees.
    scan(sig, d, 0);
    std::vector<int> cands;
    for (int i : cand_)
      if (reserved_by_[static_cast<size_t>(i)] < 0) cands.push_back(i);
    for (int i : touched_) {
      const size_t u = static_cast<size_t>(i);
      if (!covers(free_[u], d) && covers(free_[u] + delta_[u], d)) cands.push_back(i);
    }
    std::vector<int> placement = best_fit(std::move(cands), j.workers, [this](int i) {
      return free_[static_cast<size_t>(i)] + delta_[static_cast<size_t>(i)];
    });
    reset();
    // Victims already checkpointing on the chosen workers: the jobs it now waits for.
    std::vector<std::string> waiting_on;
    for (int i : placement)
      for (int r : jobs_on_[static_cast<size_t>(i)])
        if (pending(r)) waiting_on.push_back(jobs_[static_cast<size_t>(r)].id);
    std::sort(waiting_on.begin(), waiting_on.end());
    waiting_on.erase(std::unique(waiting_on.begin(), waiting_on.end()), waiting_on.end());
    std::vector<std::string> names;
    for (int v : chosen) {
      names.push_back(jobs_[static_cast<size_t>(v)].id);
      out_.preemptions.push_back({jobs_[static_cast<size_t>(v)].id, j.id});
      claim(v);
    }
    if (head_ < 0) head_ = q;
    reserve(q, placement, d, -1);
    std::string reason;
    if (!chosen.empty()) reason = "preempting " + join_ids(names) + " (checkpoint, then requeue)";
    if (!waiting_on.empty())
      reason += (reason.empty() ? "" : "; ") + std::string("waiting for preempted ") +
                (waiting_on.size() == 1 ? "job " : "jobs ") + join_ids(waiting_on) + " to checkpoint";
    wait(j, reason + "; needs " + describe_demand(j) + "; reserved " + join_ids(ids_of(placement)));
    return true;
  }

  // A job that will free its resources soon: PREEMPTING, or chosen as a victim this pass.
  bool pending(int r) const {
    return jobs_[static_cast<size_t>(r)].state == JobState::kPreempting || claimed_[static_cast<size_t>(r)];
  }

  void claim(int v) {
    claimed_[static_cast<size_t>(v)] = 1;
    for (int i : placed_on_[static_cast<size_t>(v)]) add_pending(i, jobs_[static_cast<size_t>(v)].per_worker);
  }

  void add_pending(int i, const Resources& r) {
    const size_t u = static_cast<size_t>(i);
    if (!has_pending_[u]) {
      has_pending_[u] = 1;
      pending_workers_.push_back(i);
    }
    pending_free_[u] = pending_free_[u] + r;
  }

  const std::vector<JobView>& jobs_;
  const ScheduleOptions& opt_;
  const bool skip_stable_;
  ScheduleDecision out_;

  // Optimizer nodes (rule 9), by id.
  std::vector<const NodeView*> n_;
  std::unordered_map<std::string_view, int> node_by_id_;
  std::vector<char> node_free_;    // schedulable and in no running job's node placement
  std::vector<int> node_held_by_;  // the reserving job (head or preemptor) or -1

  std::vector<const WorkerView*> w_;  // by id; index order is the id tie-break
  std::unordered_map<std::string_view, int> by_id_;
  std::vector<Resources> cap_, free_, hold_, delta_;
  std::vector<int> reserved_by_;             // job index or -1
  std::vector<char> is_touched_;             // delta_ bookkeeping of a preemption plan
  std::vector<std::vector<int>> jobs_on_;    // running/preempting jobs per worker
  std::vector<std::vector<int>> placed_on_;  // per running/preempting job: its known workers

  std::vector<int> queue_;    // queued job indices in queue order
  std::vector<int> victims_;  // preemptable running jobs in eviction order
  std::vector<char> claimed_;
  std::vector<char> reserving_;  // per job: reserved workers in this pass (head or preemptor)
  // Resources of pending jobs (PREEMPTING or claimed this pass) per worker; the workers with any.
  std::vector<Resources> pending_free_;
  std::vector<char> has_pending_;
  std::vector<int> pending_workers_;
  int head_ = -1;

  std::vector<int> root_set_of_;  // per worker: its index in root_sets_, -1 unconfined
  std::vector<const std::vector<std::string>*> root_sets_;  // the distinct sets of allowed roots

  std::unordered_map<std::string, int> sig_index_;
  std::vector<Signature> sigs_;
  std::vector<int> sig_of_;  // per queued job with a valid demand
  // Capacity available to a fit only shrinks within a pass; epoch_ counts the changes
  // (assignments, reservations) so a remembered failure is reused only while exact.
  uint64_t epoch_ = 0;
  std::unordered_map<MemoKey, MemoFit, MemoHash> failed_fit_;
  struct MemoPlan {
    uint64_t epoch;
    std::string note;
  };
  std::unordered_map<MemoKey, MemoPlan, MemoHash> failed_plan_;
  std::unordered_map<MemoKey, int64_t, MemoHash> could_ever_;

  std::vector<int> cand_, touched_;
  std::vector<Resources> cand_left_;  // free capacity of cand_ (best-fit keys)
};

// Rule 8: the reservations of `d` are those the input says the previous decision made.
bool same_reservations(const std::vector<JobView>& jobs, const ScheduleDecision& d) {
  std::unordered_map<std::string_view, std::vector<std::string>> made;
  for (const Reservation& r : d.reservations) {
    std::vector<std::string>& ids = made[r.job_id];
    ids = r.worker_ids;
    std::sort(ids.begin(), ids.end());
  }
  size_t matched = 0;
  std::vector<std::string> before;
  for (const JobView& j : jobs) {
    if (j.state != JobState::kQueued || j.reserved_workers.empty()) continue;
    auto it = made.find(j.id);
    if (it == made.end()) return false;
    before = j.reserved_workers;
    std::sort(before.begin(), before.end());
    if (before != it->second) return false;
    ++matched;
  }
  return matched == made.size();
}

}  // namespace

ScheduleDecision schedule(const std::vector<WorkerView>& workers, const std::vector<JobView>& jobs,
                          const ScheduleOptions& options, const std::vector<NodeView>& nodes) {
  ScheduleDecision d = Pass(workers, jobs, options, nodes, true).run();
  if (d.skipped == 0 || same_reservations(jobs, d)) return d;
  return Pass(workers, jobs, options, nodes, false).run();
}

int64_t host_memory_bytes_per_rank(const HostMemoryInputs& in) {
  if (in.total_params < 0 || in.split_params < 0)
    throw std::invalid_argument("host_memory_bytes_per_rank: parameter counts must be >= 0");
  if (in.split_params > in.total_params)
    throw std::invalid_argument("host_memory_bytes_per_rank: split_params exceeds total_params");
  if (in.weight_bytes != 2 && in.weight_bytes != 4)
    throw std::invalid_argument("host_memory_bytes_per_rank: weight_bytes must be 2 or 4, got " +
                                std::to_string(in.weight_bytes));
  if (in.ranks < 1) throw std::invalid_argument("host_memory_bytes_per_rank: ranks must be >= 1");
  if (in.overhead_bytes < 0)
    throw std::invalid_argument("host_memory_bytes_per_rank: overhead_bytes must be >= 0");
  int64_t host_elements = 0;
  switch (in.mode) {
    case OffloadMode::kDevice:
      host_elements = 0;
      break;
    case OffloadMode::kOffload:
      host_elements = in.total_params;
      break;
    case OffloadMode::kZenFlow:
      host_elements = in.split_params;
      break;
  }
  const int64_t per_rank = (host_elements + in.ranks - 1) / in.ranks;
  constexpr int64_t kFp32 = 4;
  const int64_t state = 5 * kFp32;  // master, m, v, accumulator x2
  const int64_t w = in.weight_bytes;
  const int64_t staging = 4 * w + (w != kFp32 ? 2 * w : 0) + (in.ranks > 1 || w == kFp32 ? w : 0);
  return in.overhead_bytes + per_rank * (state + staging);
}

RestartDecision decide_restart_after_lost_worker(const std::string& worker_id, int64_t restarts_used,
                                                 int64_t max_restarts) {
  RestartDecision r;
  const int64_t used = std::max<int64_t>(restarts_used, 0);
  const int64_t limit = std::max<int64_t>(max_restarts, 0);
  if (used < limit) {
    r.requeue = true;
    r.restarts_used = used + 1;
    r.reason = "worker " + worker_id + " lost; requeued (restart " + std::to_string(r.restarts_used) +
               " of " + std::to_string(limit) + ")";
  } else {
    r.requeue = false;
    r.restarts_used = used;
    r.reason = "worker " + worker_id + " lost; restarts " + std::to_string(used) + " of " +
               std::to_string(limit) + " used";
  }
  return r;
}

}  // namespace zenflow::scheduler
