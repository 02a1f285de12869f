// The training loop (see trainer.h).
#include "worker/trainer.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "worker/checkpoint.h"
#include "worker/distributed/communicator.h"
#include "worker/distributed/engine_collectives.h"
#include "worker/distributed/grad_reducer.h"
#include "worker/distributed/rendezvous.h"
#include "worker/model_factory.h"
#include "worker/preflight.h"
#include "worker/engine/device_streams.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/zenflow_optimizer.h"
#include "worker/model/causal_lm.h"
#include "worker/model/dataset.h"
#include "worker/model/schedule.h"
#include "worker/model/tokenizer.h"

namespace zenflow {
namespace {

using engine::StallCause;
using engine::Stopwatch;

// On CUDA, the local rank's GPU: one rank per visible GPU.
at::Device pick_device(const std::string& wanted, const distributed::LocalPlacement& local) {
  const bool cuda = at::hasCUDA();
  if (wanted == "cuda" && !cuda)
    throw std::invalid_argument("train.device: cuda requested but no CUDA device is available");
  if ((wanted == "cuda" || wanted == "auto") && cuda) {
    const int n = std::max<int>(1, static_cast<int>(at::getNumGPUs()));
    if (local.world_size > n)  // NCCL cannot put two ranks on one GPU
      throw std::invalid_argument(std::to_string(local.world_size) + " ranks on this machine but " +
                                  std::to_string(n) + " CUDA device(s) visible: use --nproc " + std::to_string(n) +
                                  " or train.device: cpu");
    return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local.rank));
  }
  return at::Device(at::kCPU);
}

// A batch tensor on the device. To a GPU from pinned memory without blocking: the copy is
// ordered on the compute stream, and the pinned block is not reused before it completes
// (the caching host allocator records the copy), so the host runs ahead to the forward.
at::Tensor to_device(const at::Tensor& t, const at::Device& device) {
  if (!device.is_cuda()) return t.to(device);
  return t.pin_memory().to(device, /*non_blocking=*/true);
}

at::ScalarType pick_dtype(const std::string& wanted, const at::Device& d) {
  if (wanted == "float32") return at::kFloat;
  if (wanted == "bfloat16") return at::kBFloat16;
  if (wanted == "float16") return at::kHalf;
  return d.is_cuda() ? at::kBFloat16 : at::kFloat;
}

engine::EngineOptions engine_options(const JobSpec& spec) {
  engine::EngineOptions o;
  const auto& z = spec.optimizer.zenflow;
  o.mode = engine::parse_optimizer_mode(spec.optimizer.mode);
  o.beta1 = spec.optimizer.beta1;
  o.beta2 = spec.optimizer.beta2;
  o.eps = spec.optimizer.eps;
  o.grad_clip = spec.train.grad_clip;
  o.topk_ratio = z.topk_ratio;
  o.select_strategy = z.select_strategy == "step"    ? engine::SelectStrategy::kStep
                      : z.select_strategy == "epoch" ? engine::SelectStrategy::kEpoch
                                                     : engine::SelectStrategy::kAuto;
  o.select_interval = z.select_interval_auto ? 0 : z.select_interval;
  o.update_interval = z.update_interval_auto ? 0 : z.update_interval;
  o.full_warm_up_rounds = z.full_warm_up_rounds;
  o.overlap_step = z.overlap_step;
  o.importance = z.importance == "l1" ? engine::Importance::kL1 : engine::Importance::kL2;
  o.reselect_threshold = z.reselect_threshold;
  o.auto_ratio = z.auto_ratio;
  o.max_update_interval = z.max_update_interval;
  o.min_split_numel = z.min_split_numel;
  o.huge_pages = spec.optimizer.host.huge_pages;
  return o;
}

// Splits this process's cores between the host optimizer (the last ones) and compute.
struct CorePlan {
  std::vector<int> host;
  std::vector<int> compute;
};

// Ranks started on one machine take disjoint contiguous slices of its cores, so their
// compute and host threads never meet.
CorePlan plan_cores(const JobSpec& spec, bool needs_host, const distributed::LocalPlacement& local) {
  std::vector<int> cores = engine::available_cores();
  if (cores.empty()) cores.push_back(0);
  if (local.world_size > 1) {
    const size_t n = cores.size(), w = static_cast<size_t>(local.world_size), r = static_cast<size_t>(local.rank);
    if (n >= w)
      cores = std::vector<int>(cores.begin() + static_cast<long>(r * n / w), cores.begin() + static_cast<long>((r + 1) * n / w));
    else
      cores = {cores[r % n]};
  }
  CorePlan plan;
  const auto& h = spec.optimizer.host;
  if (needs_host) {
    if (!h.reserved_cores_auto) {
      plan.host = h.reserved_cores;
    } else {
      const int64_t n = h.threads_auto ? std::max<int64_t>(1, static_cast<int64_t>(cores.size()) / 2) : h.threads;
      const size_t take = static_cast<size_t>(std::min<int64_t>(n, std::max<int64_t>(1, static_cast<int64_t>(cores.size()) - 1)));
      plan.host.assign(cores.end() - static_cast<long>(std::min(take, cores.size())), cores.end());
    }
  }
  for (int c : cores)
    if (std::find(plan.host.begin(), plan.host.end(), c) == plan.host.end()) plan.compute.push_back(c);
  if (plan.compute.empty()) plan.compute = cores;  // one core: share it
  return plan;
}

void pin_current_thread(const std::vector<int>& cores) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cores) CPU_SET(c, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

double evaluate(model::CausalLM& lm, const std::shared_ptr<model::TokenDataset>& val, int64_t micro_batch,
                int64_t batches, const at::Device& device) {
  if (!val || val->size() == 0) return -1;
  c10::NoGradGuard no_grad;
  lm.train(false);
  model::DataLoader loader(val, std::min<int64_t>(micro_batch, val->size()), 0, 1, /*shuffle=*/false);
  double sum = 0;
  int64_t n = 0;
  const int64_t per_epoch = val->size() / std::min<int64_t>(micro_batch, val->size());
  for (int64_t b = 0; b < std::min(batches, std::max<int64_t>(1, per_epoch)); ++b) {
    model::Batch batch = loader.next();
    at::Tensor logits = lm.forward(batch.input_ids.to(device));
    sum += model::causal_lm_loss(logits, batch.targets.to(device)).item<double>();
    ++n;
  }
  lm.train(true);
  return n ? sum / static_cast<double>(n) : -1;
}

// LibTorch 2.4 made the autocast state per device type (set_autocast_enabled(kCUDA, ...));
// earlier versions have the GPU-specific functions.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
#define ZENFLOW_AUTOCAST_BY_DEVICE_TYPE 1
#else
#define ZENFLOW_AUTOCAST_BY_DEVICE_TYPE 0
#endif

// Autocast on CUDA for the forward pass and loss (backward follows the recorded casts).
class CudaAutocast {
 public:
  CudaAutocast(bool on, at::ScalarType dtype) : on_(on) {
    if (!on_) return;
#if ZENFLOW_AUTOCAST_BY_DEVICE_TYPE
    prev_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    prev_dtype_ = at::autocast::get_autocast_dtype(at::kCUDA);
    at::autocast::set_autocast_dtype(at::kCUDA, dtype);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
#else
    prev_enabled_ = at::autocast::is_enabled();
    prev_dtype_ = at::autocast::get_autocast_gpu_dtype();
    at::autocast::set_autocast_gpu_dtype(dtype);
    at::autocast::set_enabled(true);
#endif
    at::autocast::increment_nesting();
  }
  ~CudaAutocast() {
    if (!on_) return;
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
#if ZENFLOW_AUTOCAST_BY_DEVICE_TYPE
    at::autocast::set_autocast_enabled(at::kCUDA, prev_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, prev_dtype_);
#else
    at::autocast::set_enabled(prev_enabled_);
    at::autocast::set_autocast_gpu_dtype(prev_dtype_);
#endif
  }
  CudaAutocast(const CudaAutocast&) = delete;
  CudaAutocast& operator=(const CudaAutocast&) = delete;

 private:
  bool on_;
  bool prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kBFloat16;
};

// Reading what the spec names: a file that cannot be used (truncated safetensors, a
// config.json that is not JSON, an empty data directory) is bad input naming the key,
// exit 2, not a runtime failure. Out-of-memory and LibTorch errors pass through.
template <typename F>
auto reading(const std::string& key, F&& read) -> decltype(read()) {
  try {
    return read();
  } catch (const std::invalid_argument&) {
    throw;  // already names its key
  } catch (const c10::Error&) {
    throw;
  } catch (const std::runtime_error& e) {
    throw std::invalid_argument(key + ": " + e.what());
  }
}

// 64-bit FNV-1a over the parameters' bytes, 8 bytes at a time (tail bytewise).
int64_t weights_fingerprint(const std::vector<model::NamedTensor>& params) {
  uint64_t h = 1469598103934665603ull;
  const uint64_t prime = 1099511628211ull;
  for (const auto& nt : params) {
    const at::Tensor t = nt.tensor.detach().to(at::kCPU).contiguous();
    const auto* p = static_cast<const unsigned char*>(t.data_ptr());
    const size_t n = t.nbytes();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * prime;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * prime;
  }
  return static_cast<int64_t>(h);
}

}  // namespace

void keep_freed_host_memory() {
  // Page faults cost ~10 us per 4 KiB page on these hosts, every time a freed block is
  // returned to the kernel and touched again (reference/host-performance-notes.md).
  // Serve large blocks from the heap and never trim it, so per-step temporaries of
  // LibTorch reuse warm pages.
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(values.size() - 1, lo + 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

RunSummary run_training(const JobSpec& spec, const RunOptions& options, const std::atomic<bool>* stop) {
  bool log_here = true;  // rank 0 speaks for the job
  auto log = [&](const std::string& s) {
    if (options.on_log && log_here) options.on_log(s);
  };
  Stopwatch wall;
  keep_freed_host_memory();
  RunSummary sum;
  const distributed::LocalPlacement local = distributed::local_placement_from_env();
  const at::Device device = pick_device(spec.train.device, local);
  const at::ScalarType dtype = pick_dtype(spec.train.dtype, device);
  // This thread's CUDA calls (streams, events, the default of new tensors) go to the
  // rank's GPU, not to GPU 0. A no-op on the CPU.
  const c10::DeviceGuard on_device(device);
  sum.device = device.str();
  const bool use_autocast = device.is_cuda() && spec.train.autocast != "none";
  const at::ScalarType autocast_dtype = spec.train.autocast == "float16" ? at::kHalf : at::kBFloat16;
  sum.mode = spec.optimizer.mode;

  const bool needs_host = spec.optimizer.mode != "device";
  CorePlan cores = plan_cores(spec, needs_host, local);
  const int64_t compute_threads =
      spec.train.compute_threads > 0 ? spec.train.compute_threads : static_cast<int64_t>(cores.compute.size());
  pin_current_thread(cores.compute);
  at::set_num_threads(static_cast<int>(compute_threads));
  sum.compute_threads = compute_threads;
  sum.host_threads = needs_host ? static_cast<int64_t>(cores.host.size()) : 0;

  // Data parallelism: ranks started with ZENFLOW_RANK/WORLD_SIZE/MASTER_* train one model
  // together: always-device gradients averaged by the GradReducer, split matrices
  // exchanged by the engine (partitioned host optimizer, zenflow_optimizer.h).
  std::unique_ptr<distributed::Communicator> comm;
  if (distributed::distributed_env_present()) {
    distributed::CommunicatorOptions co;
    co.device_type = device.type();  // Gloo on CPU, NCCL on CUDA
    comm = std::make_unique<distributed::Communicator>(distributed::rank_info_from_env(), co);
  }
  const int64_t world = comm ? comm->world_size() : 1;
  const int64_t rank = comm ? comm->rank() : 0;
  sum.world_size = world;
  log_here = rank == 0;
  // Rank 0 holds checkpoint.dir's lock for the whole run (one run per directory), taken
  // before anything is loaded so a busy directory fails at once; it is the only rank that
  // moves damaged or superseded checkpoints aside.
  const bool owns_dir = options.write_checkpoints && !spec.checkpoint.dir.empty() && rank == 0;
  std::unique_ptr<CheckpointDirLock> dir_lock;
  if (owns_dir) dir_lock = std::make_unique<CheckpointDirLock>(spec.checkpoint.dir);

  // Data.
  auto tokenizer = reading("data.tokenizer", [&] { return model::load_tokenizer(spec.data.tokenizer); });
  const std::string model_key = spec.model.from.empty() ? "model.config" : "model.from";

  // Preflight, before anything large is allocated: settings that cannot work are errors,
  // settings that cannot take effect are warnings, and a job whose estimated memory does
  // not fit this machine (shared by the ranks on it) is refused naming the key to change.
  preflight_errors(spec, device.is_cuda());
  {
    std::vector<int> mine = cores.compute;
    for (int c : cores.host)
      if (std::find(mine.begin(), mine.end(), c) == mine.end()) mine.push_back(c);
    for (const std::string& w : preflight_warnings(spec, device.is_cuda(), static_cast<int64_t>(mine.size())))
      log("warning: " + w);
    const model::LoadedModel described =
        reading(model_key, [&] { return describe_model_from_spec(spec.model, tokenizer->vocab_size()); });
    const MemoryEstimate need = estimate_job_memory(spec, described,
                                                    world, device.is_cuda(), static_cast<int>(c10::elementSize(dtype)));
    const int64_t host = available_host_memory_bytes();
    // The device's free memory is not known to this build (CPU LibTorch): 0 = not checked.
    check_job_fits(spec, need, host > 0 ? host / std::max<int64_t>(1, local.world_size) : 0, 0);
  }

  // Model: a Hugging Face directory (model.from) or a random init from model.config.
  model::LoadedModel info;
  // Weights go straight to the device (a memory-mapped checkpoint is never held in
  // host RAM on a GPU host), unless initial weights replace them first.
  auto lm = reading(model_key, [&] {
    return options.initial_weights.empty()
               ? make_model_from_spec(spec.model, tokenizer->vocab_size(), spec.train.seed, &info, device, dtype)
               : make_model_from_spec(spec.model, tokenizer->vocab_size(), spec.train.seed, &info);
  });
  if (!options.initial_weights.empty()) {
    std::map<std::string, at::Tensor> init(options.initial_weights.begin(), options.initial_weights.end());
    c10::NoGradGuard no_grad;
    for (auto& nt : lm->parameters()) {
      auto it = init.find(nt.name);
      if (it == init.end() || it->second.sizes() != nt.tensor.sizes())
        throw std::invalid_argument("initial weights: '" + nt.name + "' missing or of another shape");
      nt.tensor.detach().copy_(it->second);
    }
  }
  lm->to(device, dtype);
  lm->train(true);

  std::shared_ptr<model::TokenDataset> train_ds, val_ds;
  std::tie(train_ds, val_ds) = reading(spec.data.val.empty() ? "data.train" : "data.train/data.val", [&] {
    return make_dataset_from_spec(spec.data, *tokenizer, spec.train.seq_len, lm->vocab_size());
  });
  if (train_ds->size() < spec.train.micro_batch)
    throw std::invalid_argument("train.micro_batch: " + std::to_string(spec.train.micro_batch) +
                                " exceeds the " + std::to_string(train_ds->size()) + " training examples of " +
                                spec.data.train);
  if (train_ds->size() < spec.train.micro_batch * world)
    throw std::invalid_argument("train.micro_batch: " + std::to_string(spec.train.micro_batch) + " x " +
                                std::to_string(world) + " ranks exceeds the " + std::to_string(train_ds->size()) +
                                " training examples");
  // Every rank draws the same global batch of micro_batch x world examples and keeps its rows,
  // so W ranks x micro-batch b see exactly what 1 rank x micro-batch W*b sees.
  model::DataLoader loader(train_ds, spec.train.micro_batch * world, spec.train.seed, 2, true);

  std::vector<engine::ParamSpec> params;
  for (auto& nt : lm->parameters()) {
    engine::ParamSpec p;
    p.name = nt.name;
    p.param = nt.tensor;
    // No decay on norms and biases (1-D parameters).
    p.weight_decay = nt.tensor.dim() >= 2;
    p.weight_decay_value = spec.train.weight_decay;
    params.push_back(p);
    sum.params += nt.tensor.numel();
  }
  engine::EngineOptions eo = engine_options(spec);
  eo.host_threads = static_cast<int>(std::max<size_t>(1, cores.host.size()));
  eo.host_cores = cores.host;
  engine::StallClock clock;
  std::unique_ptr<distributed::EngineCollectives> collectives;
  if (comm) collectives = std::make_unique<distributed::EngineCollectives>(*comm);
  engine::ZenFlowOptimizer opt(params, eo, &clock, collectives.get());
  // The reducer averages the parameters the engine does not exchange itself.
  std::unique_ptr<distributed::GradReducer> reducer;
  if (comm) {
    std::vector<at::Tensor> ps;
    for (auto& p : params)
      if (!opt.is_split(p.name)) ps.push_back(p.param);
    if (!ps.empty()) reducer = std::make_unique<distributed::GradReducer>(*comm, ps);
  }
  sum.split_params = opt.split_elements();
  sum.host_state_bytes = opt.host_state_bytes();
  sum.transfer_buffer_bytes = opt.pinned_host_bytes();

  model::ScheduleConfig sched;
  sched.kind = spec.train.schedule;
  sched.lr = spec.train.lr;
  sched.warmup_steps = spec.train.warmup_steps;
  sched.total_steps = spec.train.steps;
  sched.min_lr_ratio = spec.train.min_lr_ratio;

  // Resume.
  const nlohmann::json identity = job_identity(spec, world);
  int64_t step = 0;
  std::vector<double> history;
  if (options.resume && !spec.checkpoint.dir.empty()) {
    CheckpointScan scan = scan_checkpoints(spec.checkpoint.dir, log, /*quarantine=*/owns_dir);
    if (!scan.checkpoint && !scan.damaged.empty()) {
      std::string list;
      for (const auto& d : scan.damaged) list += "\n  " + d;
      throw ResumeRefused("checkpoint.dir " + spec.checkpoint.dir + " holds no usable checkpoint; damaged (kept for inspection):" +
                          list + "\nrerun with --fresh to start from step 0 anyway");
    }
    if (auto& ck = scan.checkpoint) {
      const std::vector<std::string> changed = identity_changes(ck->identity, identity, options.allow_spec_change);
      if (!changed.empty()) {
        std::string list, keys;
        for (const auto& c : changed) {
          list += "\n  " + c;
          keys += (keys.empty() ? "" : ",") + c.substr(0, c.find_first_of(" :"));
        }
        throw ResumeRefused("checkpoint " + ck->path + " was written by a job with other settings; changed:" + list +
                            "\nresuming would mix their states. Rerun with --allow-spec-change " + keys +
                            " to resume anyway, --fresh to start from step 0, or give the job another checkpoint.dir");
      }
      std::map<std::string, at::Tensor> saved(ck->model.begin(), ck->model.end());
      c10::NoGradGuard no_grad;
      for (auto& nt : lm->parameters()) {
        auto it = saved.find(nt.name);
        if (it == saved.end()) throw ResumeRefused(ck->path + ": model tensor '" + nt.name + "' missing");
        if (it->second.sizes() != nt.tensor.sizes())
          throw ResumeRefused(ck->path + ": model tensor '" + nt.name + "' has a different shape");
        nt.tensor.detach().copy_(it->second);
      }
      try {
        if (ck->world_size == world) {
          opt.load_state(load_engine_shard(*ck, static_cast<int>(rank)));
        } else {
          // Re-shard: this rank's columns come from whichever old ranks held them.
          std::vector<NamedTensors> shards;
          for (int r = 0; r < static_cast<int>(ck->world_size); ++r) shards.push_back(load_engine_shard(*ck, r));
          opt.load_state_shards(shards);
          log("re-sharded the optimizer state of " + std::to_string(ck->world_size) + " ranks over " +
              std::to_string(world));
        }
      } catch (const std::exception& e) {
        if (options.allow_spec_change.empty()) throw;
        // The state of the old settings does not fit the new ones (another mode, ratio, …).
        throw ResumeRefused("checkpoint " + ck->path + ": its optimizer state cannot be carried across the allowed change (" +
                            e.what() + "); use --fresh to start from step 0 with the new settings");
      }
      model::LoaderPosition pos;
      pos.epoch = ck->loader_epoch;
      pos.index = ck->loader_index;
      loader.restore(pos);
      step = ck->step;
      history = ck->losses;
      log("resumed from " + ck->path + " at step " + std::to_string(step));
    }
  } else if (owns_dir) {
    const std::string moved = supersede_checkpoints(spec.checkpoint.dir);
    if (!moved.empty()) log("starting fresh: the checkpoints already in " + spec.checkpoint.dir + " were moved to " + moved);
  }
  sum.start_step = step;
  sum.tokens_per_step = spec.train.micro_batch * spec.train.grad_accum * spec.train.seq_len * world;

  // Every rank writes its shard of the engine state; rank 0 the rest, then commits.
  const std::string run_yaml = to_yaml(spec);
  int64_t last_saved = step;  // a resumed checkpoint already holds this step
  auto save = [&](int64_t at_step) {
    if (!options.write_checkpoints || spec.checkpoint.dir.empty() || at_step == last_saved) return;
    Stopwatch sw;
    NamedTensors engine_state = opt.state_dict();
    // A checkpoint that a resume would refuse is not written: weights or optimizer state that
    // overflowed (lr far too high) end the run here, naming the tensor.
    auto require_finite = [&](const std::string& what, const std::string& name, const at::Tensor& t) {
      if (count_non_finite(t) > 0)
        throw std::runtime_error("step " + std::to_string(at_step) + ": " + what + " '" + name +
                                 "' holds non-finite values (NaN/Inf), so no checkpoint was written; the training "
                                 "diverged: lower train.lr or set train.grad_clip");
    };
    for (const auto& [name, t] : engine_state) require_finite("optimizer state", name, t);
    for (auto& nt : lm->parameters()) require_finite("weight", nt.name, nt.tensor.detach());
    if (rank == 0) begin_checkpoint(spec.checkpoint.dir, at_step);
    if (world > 1) {
      comm->barrier();
      if (rank != 0) write_engine_shard(spec.checkpoint.dir, at_step, static_cast<int>(rank), engine_state);
      comm->barrier();
    }
    if (rank == 0) {
      CheckpointContents contents;
      for (auto& nt : lm->parameters()) contents.model.emplace_back(nt.name, nt.tensor.detach());
      contents.engine = std::move(engine_state);
      contents.trainer["job"] = spec.name;
      contents.trainer["loader_epoch"] = loader.position().epoch;
      contents.trainer["loader_index"] = loader.position().index;
      contents.trainer["losses"] = history;
      contents.trainer["mode"] = spec.optimizer.mode;
      contents.run_yaml = run_yaml;
      contents.identity = identity;
      sum.last_checkpoint = commit_checkpoint(spec.checkpoint.dir, at_step, contents, spec.checkpoint.keep,
                                              static_cast<int>(world));
    }
    last_saved = at_step;
    clock.add_stall(StallCause::kCheckpoint, sw.seconds());
  };

  if (options.on_training_start) options.on_training_start();
  if (options.observer) {
    RunFacts facts;
    facts.rank = rank;
    facts.world_size = world;
    facts.device_is_cuda = device.is_cuda();
    facts.start_step = step;
    facts.total_steps = spec.train.steps;
    const engine::HostMemoryBytes mem = opt.host_memory_bytes();
    facts.host_master_bytes = mem.master;
    facts.host_moments_bytes = mem.moments;
    facts.host_accumulator_bytes = mem.accumulators;
    // Transfer buffers are page-locked on CUDA only (the rule of the run summary's pinned_host_bytes).
    (device.is_cuda() ? facts.pinned_host_bytes : facts.host_staging_bytes) = mem.transfer_buffers;
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    facts.host_total_memory_bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
    options.observer->on_start(facts);
  }
  const int64_t skipped_before = opt.skipped_steps();
  int64_t trailing_skipped = 0;  // steps skipped in a row at the end of the run so far
  const int64_t first = step;
  bool stop_agreed = false;  // with several ranks, all stop at the same step
  double tokens_window = 0, seconds_window = 0;
  while (step < spec.train.steps) {
    if ((comm && stop_agreed) || (!comm && stop && stop->load())) {
      sum.interrupted = true;
      break;
    }
    clock.begin_step();
    const double lr = model::lr_at(sched, step);
    opt.zero_grad();
    at::Tensor loss_acc;  // fp64 on the device: read once per step, not per micro-batch
    int64_t epoch = 0;
    int64_t tokens = 0;
    for (int64_t micro = 0; micro < spec.train.grad_accum; ++micro) {
      Stopwatch data_sw;
      model::Batch batch = loader.next();
      epoch = loader.epoch();
      if (world > 1) {
        const int64_t b = spec.train.micro_batch;
        batch.input_ids = batch.input_ids.narrow(0, rank * b, b);
        batch.targets = batch.targets.narrow(0, rank * b, b);
        batch.tokens = batch.targets.ne(-100).sum().item<int64_t>();
      }
      if (reducer) reducer->set_sync(micro == spec.train.grad_accum - 1);
      at::Tensor ids = to_device(batch.input_ids, device);
      at::Tensor targets = to_device(batch.targets, device);
      clock.add_stall(StallCause::kData, data_sw.seconds());
      // Compute time: on CUDA what the compute stream spent on forward and backward.
      engine::ClockSpan compute(&clock, device);
      at::Tensor loss;
      {
        CudaAutocast autocast(use_autocast, autocast_dtype);
        loss = model::causal_lm_loss(lm->forward(ids), targets);
      }
      (loss / static_cast<double>(spec.train.grad_accum)).backward();
      compute.end(engine::TimeKind::kCompute);
      const at::Tensor l = loss.detach().to(at::kDouble);
      loss_acc = loss_acc.defined() ? loss_acc + l : l;
      tokens += batch.tokens;
    }
    if (reducer) {
      // On NCCL the wait is the compute stream's, not the host's (ClockSpan's events).
      engine::ClockSpan wait(&clock, device);
      const distributed::ReduceReport r = reducer->finish();
      wait.end(engine::TimeKind::kStall, StallCause::kAllreduce, r.wait_seconds);
    }
    double loss_sum = 0;
    const int64_t local_tokens = tokens;  // this rank's; `tokens` becomes the global batch's
    if (comm) {
      // The reported loss and tokens are the global batch's, identical on every rank.
      at::Tensor l = at::empty({3}, at::kDouble);
      l[1] = stop && stop->load() ? 1.0 : 0.0;
      l[2] = static_cast<double>(tokens);
      l = l.to(device);
      l[0].copy_(loss_acc);
      comm->allreduce_sum_(l);
      l = l.to(at::kCPU);
      loss_sum = l[0].item<double>() / static_cast<double>(world);
      stop_agreed = l[1].item<double>() > 0;
      tokens = static_cast<int64_t>(l[2].item<double>());
    }
    engine::StepContext ctx;
    ctx.lr = lr;
    ctx.epoch = epoch;
    const engine::StepReport report = opt.step(ctx);
    trailing_skipped = report.skipped ? trailing_skipped + 1 : 0;
    if (!comm) loss_sum = loss_acc.item<double>();  // the step's own reads have synchronised
    const double loss = loss_sum / static_cast<double>(spec.train.grad_accum);
    history.push_back(loss);
    // A periodic checkpoint belongs to its step: its time is that step's `checkpoint` stall.
    if (spec.checkpoint.every_steps > 0 && (step + 1) % spec.checkpoint.every_steps == 0 &&
        step + 1 < spec.train.steps) {
      // Steps that were all skipped since the last checkpoint trained nothing: a checkpoint
      // of them would look like progress to the next resume.
      if (trailing_skipped >= step + 1 - last_saved)
        log("warning: not writing the checkpoint of step " + std::to_string(step + 1) + ": every step since step " +
            std::to_string(last_saved) + " was skipped (non-finite loss or gradients)");
      else
        save(step + 1);
    }
    const engine::StepTimes& times = clock.end_step();
    ++step;
    sum.losses.push_back(loss);
    sum.step_seconds.push_back(times.wall_seconds);
    tokens_window = 0.8 * tokens_window + static_cast<double>(tokens);
    seconds_window = 0.8 * seconds_window + times.wall_seconds;
    if (options.observer) {
      TrainingStep t;
      t.step = step;
      t.times = times;
      t.tokens = local_tokens;
      t.loss = loss;
      t.lr = lr;
      t.skipped = report.skipped;
      t.staleness_steps = report.staleness_steps;
      t.selected_ratio = opt.selected_ratio();
      options.observer->on_step(t);
    }

    if (options.on_step && rank == 0) {
      StepProgress p;
      p.step = step;
      p.total = spec.train.steps;
      p.loss = loss;
      p.lr = lr;
      p.step_seconds = times.wall_seconds;
      p.tokens_per_second = seconds_window > 0 ? tokens_window / seconds_window : 0;
      const auto tot = clock.totals();
      p.stall_fraction = tot.wall_seconds > 0 ? tot.stall_total() / tot.wall_seconds : 0;
      p.eta_seconds = tot.wall_seconds / static_cast<double>(step - first) * static_cast<double>(spec.train.steps - step);
      options.on_step(p);
    }
    if (spec.train.eval_every > 0 && step % spec.train.eval_every == 0 && step < spec.train.steps && options.evaluate)
    {
      const double v = evaluate(*lm, val_ds, spec.train.micro_batch, spec.train.eval_batches, device);
      log("step " + std::to_string(step) + " val_loss " + std::to_string(v) + " perplexity " + std::to_string(std::exp(v)));
    }
    if (options.stop_after_steps > 0 && step - first >= options.stop_after_steps) {
      sum.interrupted = true;
      break;
    }
  }
  // The end of the run — the last window's host step and its copy to the device, the final
  // checkpoint — counts in the totals, not as a training step of its own.
  clock.begin_step();
  // A run that ends skipping every step has diverged (or never trained): it is a failure,
  // and its state is not saved over the last good checkpoint's successor.
  const int64_t ran = step - first, skipped = opt.skipped_steps() - skipped_before;
  if (ran > 0 && skipped == ran)
    throw std::runtime_error("every one of the " + std::to_string(ran) +
                             " steps of this run was skipped: the loss or the gradients were not finite (NaN/Inf); "
                             "no final checkpoint was written. Lower train.lr, set train.grad_clip, or check the data");
  if (!sum.interrupted && trailing_skipped > 0 && !std::isfinite(history.back()))
    throw std::runtime_error("the run diverged: its last " + std::to_string(trailing_skipped) + " step(s) were skipped (" +
                             std::to_string(skipped) + " of " + std::to_string(ran) +
                             " in all) because the loss or the gradients were not finite (NaN/Inf); no final "
                             "checkpoint was written" +
                             (last_saved > first ? " (the last one is step " + std::to_string(last_saved) + ")" : "") +
                             ". Lower train.lr or set train.grad_clip, and resume");
  if (sum.interrupted) {
    save(step);
    if (!sum.last_checkpoint.empty()) log("stopped at step " + std::to_string(step) + "; checkpoint " + sum.last_checkpoint);
  } else {
    opt.finish();
    if (step > first) save(step);
  }
  sum.finish_times = clock.end_step();
  sum.steps = step;
  if (options.observer) {
    TrainingEnd end;
    end.steps = step;
    end.interrupted = sum.interrupted;
    end.finish = sum.finish_times;
    options.observer->on_finish(end);
  }
  if (options.final_weights) {
    options.final_weights->clear();
    for (auto& nt : lm->parameters())
      options.final_weights->emplace_back(nt.name, nt.tensor.detach().to(at::kCPU).to(at::kFloat).clone());
  }
  sum.skipped_steps = opt.skipped_steps();
  sum.final_loss = history.empty() ? 0 : history.back();
  if (options.evaluate && !sum.interrupted)
    sum.val_loss = evaluate(*lm, val_ds, spec.train.micro_batch, spec.train.eval_batches, device);
  sum.step_seconds_median = percentile(sum.step_seconds, 0.5);
  sum.step_seconds_p90 = percentile(sum.step_seconds, 0.9);
  sum.totals = clock.totals();
  sum.reselections = opt.reselections();
  sum.max_staleness_windows = opt.max_staleness_windows();
  if (comm) {
    // Every update is replicated or all-gathered, so the ranks' weights must be equal
    // bit for bit; a difference is a bug worth shouting about.
    at::Tensor mine = at::full({1}, weights_fingerprint(lm->parameters()), at::kLong).to(device);
    const at::Tensor all = comm->all_gather(mine, std::vector<int64_t>(static_cast<size_t>(world), 1)).to(at::kCPU);
    std::string differ;
    for (int64_t r = 1; r < world; ++r)
      if (all[r].item<int64_t>() != all[0].item<int64_t>()) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    sum.ranks_identical = differ.empty();
    if (!differ.empty()) log("warning: the weights of rank(s) " + differ + " differ from rank 0's");
    const distributed::CommStats cs = comm->stats();
    sum.comm_gradient_bytes = cs.traffic_bytes(distributed::Traffic::kGradients);
    sum.comm_selection_bytes = cs.traffic_bytes(distributed::Traffic::kSelection);
    sum.comm_parameter_bytes = cs.traffic_bytes(distributed::Traffic::kParameters);
  }
  sum.wall_seconds = wall.seconds();
  return sum;
}

}  // namespace zenflow
