// The training loop (see trainer.h).
#include "worker/rank/trainer.h"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <ATen/Parallel.h>
#include <torch/version.h>
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "common/attempt_contract.h"
#include "common/input_file.h"
#include "worker/rank/checkpoint.h"
#include "worker/distributed/communicator.h"
#include "worker/distributed/engine_collectives.h"
#include "worker/distributed/grad_reducer.h"
#include "worker/distributed/rendezvous.h"
#include "worker/distributed/sharded_parameters.h"
#include "worker/rank/model_factory.h"
#include "worker/rank/preflight.h"
#include "worker/engine/cuda_ops.h"
#include "worker/engine/device_streams.h"
#include "worker/engine/host_thread_pool.h"
#include "worker/engine/streamed_parameters.h"
#include "worker/engine/zenflow_optimizer.h"
#include "worker/model/autocast_scope.h"
#include "worker/model/causal_lm.h"
#include "worker/model/cpu_memory_meter.h"
#include "worker/model/dataset.h"
#include "worker/model/schedule.h"
#include "worker/model/tokenizer.h"
#ifdef ZENFLOW_HAVE_TRANSPORT
#include "worker/transport/remote_host_optimizer.h"
#endif

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
  o.device_staging_bytes = spec.optimizer.host.device_staging_mib << 20;
  return o;
}

// The host optimizer backend of optimizer.host.addresses (empty: in-process). Each rank
// opens its own sessions; the epoch (this process's start, in microseconds) fences the
// sessions of an earlier attempt of the same rank out of the nodes. The backend's threads
// (sends, receives and their copies) run on `host_cores`, which the in-process host
// optimizer would have used, not on the training thread's.
engine::HostOptimizerFactory host_backend(const JobSpec& spec, const std::vector<int>& host_cores) {
  const HostSpec& h = spec.optimizer.host;
  if (h.addresses.empty()) return {};
#ifndef ZENFLOW_HAVE_TRANSPORT
  throw std::invalid_argument(
      "optimizer.host.addresses: this build has no UCX transport (built with ZENFLOW_UCX=OFF)");
#else
  transport::RemoteHostOptions o;
  o.addresses = h.addresses;
  if (!h.token_file.empty()) {
    std::string token = read_regular_file(h.token_file, 4096, "optimizer.host.token_file");
    while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
    o.token = token;
  }
  // Placed by a coordinator with its nodes: the attempt's own secret, which only those nodes
  // hold, instead of a token every job shares (the agent sets both; attempt_contract.h).
  const char* key = std::getenv(attempt::kNodeKeyEnv);
  const char* secret = std::getenv(attempt::kNodeSecretEnv);
  if (key != nullptr && secret != nullptr && *secret != '\0') {
    o.key = key;
    o.token = secret;
  }
  o.job = spec.name + "@" + spec.checkpoint.dir;
  o.cores = host_cores;
  o.epoch = static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count());
  return [o](const engine::HostStateLayout& layout) { return transport::make_remote_host_optimizer(o, layout); };
#endif
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

// The device memory peaks of a run (DeviceMemoryBytes::activations_peak, total_peak), from
// the CUDA caching allocator's statistics or, on the CPU, the metered CPU allocator. One
// peak at a time exists, so each micro-batch's starts after the run's is folded in.
class DevicePeaks {
 public:
  explicit DevicePeaks(at::Device device)
      : cuda_(device.is_cuda() && engine::cuda_ops::available()),
        index_(device.has_index() ? device.index() : 0),
        measured_(cuda_ || (device.is_cpu() && model::CpuMemoryMeter::installed())) {}

  void begin_micro_batch() {
    if (!measured_) return;
    run_peak_ = std::max(run_peak_, peak());
    if (cuda_) {
      engine::cuda_ops::reset_allocator_peak(index_);
      start_ = engine::cuda_ops::allocator_bytes(index_).allocated;
    } else {
      start_ = model::CpuMemoryMeter::reset_peak();
    }
  }
  // `count`: the micro-batch's peak is an activation figure (its gradients existed before).
  void end_micro_batch(bool count) {
    if (!measured_) return;
    const int64_t p = peak();
    run_peak_ = std::max(run_peak_, p);
    if (count) activations_ = std::max(activations_, p - start_);
  }
  int64_t activations() const { return activations_; }
  int64_t total() const { return measured_ ? std::max(run_peak_, peak()) : -1; }

 private:
  int64_t peak() const {
    return cuda_ ? engine::cuda_ops::allocator_bytes(index_).peak : model::CpuMemoryMeter::peak_bytes();
  }

  bool cuda_;
  int index_;
  bool measured_;
  int64_t start_ = 0;
  int64_t run_peak_ = -1;
  int64_t activations_ = -1;
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
  // returned to the kernel and touched again (docs/benchmarks.md).
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

namespace {

// One call of run_training: the phases of a run, in the order run() calls them, over the
// state they share. Members are declared in the order they come to life, so they are
// destroyed in reverse (the reducer and the engine before the communicator they use, the
// checkpoint directory's lock after everything that writes there).
class TrainingRun {
 public:
  TrainingRun(const JobSpec& spec, const RunOptions& options, const std::atomic<bool>* stop)
      : spec_(spec), options_(options), stop_(stop) {}

  RunSummary run() {
    keep_freed_host_memory();
    setup_devices();
    join_ranks();
    if (finished_already()) return std::move(sum_);
    preflight();
    build_model();
    build_data();
    build_optimizer();
    try {
      resume();
      begin_training();
      train_steps();
      finish();
    } catch (const engine::HostBackendLost&) {
      throw;
    } catch (...) {
      blame_a_lost_node();
      throw;
    }
    summarize();
    if (options_.reporter) options_.reporter->on_finish(sum_.steps, sum_.interrupted);
    return std::move(sum_);
  }

 private:
  // What one training step produced (train_step).
  struct StepOutcome {
    double loss = 0;           // the global batch's mean loss
    int64_t tokens = 0;        // the global batch's
    int64_t local_tokens = 0;  // this rank's
    engine::StepReport report;
    int64_t epoch = 0;
  };

  // Rank 0 speaks for the job.
  void log(const std::string& s) {
    if (options_.reporter && log_here_) options_.reporter->on_log(s);
  }

  // Device, dtypes, and this process's cores: compute threads pinned, the rest for the host
  // optimizer.
  void setup_devices() {
    local_ = distributed::local_placement_from_env();
    device_ = pick_device(spec_.train.device, local_);
    dtype_ = pick_dtype(spec_.train.dtype, device_);
    // This thread's CUDA calls (streams, events, the default of new tensors) go to the
    // rank's GPU, not to GPU 0. A no-op on the CPU.
    on_device_.emplace(device_);
    sum_.device = device_.str();
    use_autocast_ = device_.is_cuda() && spec_.train.autocast != "none";
    autocast_dtype_ = spec_.train.autocast == "float16" ? at::kHalf : at::kBFloat16;
    sum_.mode = spec_.optimizer.mode;

    const bool needs_host = spec_.optimizer.mode != "device";
    cores_ = plan_cores(spec_, needs_host, local_);
    const int64_t compute_threads = spec_.train.compute_threads > 0
                                        ? spec_.train.compute_threads
                                        : static_cast<int64_t>(cores_.compute.size());
    // Until the run ends: the caller's next run plans from all the cores it had.
    on_compute_cores_.emplace(cores_.compute);
    at::set_num_threads(static_cast<int>(compute_threads));
    sum_.compute_threads = compute_threads;
    sum_.host_threads = needs_host ? static_cast<int64_t>(cores_.host.size()) : 0;
  }

  // Data parallelism: ranks started with ZENFLOW_RANK/WORLD_SIZE/MASTER_* train one model
  // together: always-device gradients averaged by the GradReducer, split matrices
  // exchanged by the engine (partitioned host optimizer, zenflow_optimizer.h).
  void join_ranks() {
    if (distributed::distributed_env_present()) {
      distributed::CommunicatorOptions co;
      co.device_type = device_.type();  // Gloo on CPU, NCCL on CUDA
      co.generation = options_.rendezvous_generation;
      comm_ = std::make_unique<distributed::Communicator>(distributed::rank_info_from_env(), co);
    }
    world_ = comm_ ? comm_->world_size() : 1;
    rank_ = comm_ ? comm_->rank() : 0;
    sum_.world_size = world_;
    log_here_ = rank_ == 0;
    // Rank 0 holds checkpoint.dir's lock for the whole run (one run per directory), taken
    // before anything is loaded so a busy directory fails at once (or after lock_wait); it is
    // the only rank that moves damaged or superseded checkpoints aside.
    owns_dir_ = options_.write_checkpoints && !spec_.checkpoint.dir.empty() && rank_ == 0;
    if (owns_dir_) {
      const double wait_s = std::chrono::duration<double>(options_.lock_wait).count();
      dir_lock_ = lock_checkpoint_dir(spec_.checkpoint.dir, options_.lock_wait, [&](const std::string& busy) {
        char waiting[64];
        std::snprintf(waiting, sizeof waiting, "%g", wait_s);
        log(busy.substr(0, busy.rfind("; ")) + "; waiting up to " + waiting + " s for it to be released");
      });
    }
  }

  // A run whose newest usable checkpoint is at or past train.steps has nothing to train: it
  // says so (on_start, on_resumed, on_finish, as a resume at the last step would) and ends
  // before a model is built, leaving checkpoint.dir as it is (a damaged newer checkpoint is
  // quarantined, as a resume would). Rank 0 decides, as it holds the directory; the other
  // ranks get its step and loss, so every rank ends the same way.
  bool finished_already() {
    if (!options_.resume || spec_.checkpoint.dir.empty()) return false;
    double found_step = 0, found_loss = 0;
    std::string found_path;
    if (rank_ == 0) {
      const auto listed = list_checkpoints(spec_.checkpoint.dir);
      if (!listed.empty() && listed.back().first >= spec_.train.steps) {
        CheckpointScan scan = scan_checkpoints(
            spec_.checkpoint.dir, [&](const std::string& s) { log(s); }, /*quarantine=*/owns_dir_, shard_filter());
        if (scan.checkpoint && scan.checkpoint->step >= spec_.train.steps) {
          found_step = static_cast<double>(scan.checkpoint->step);
          found_loss = scan.checkpoint->losses.empty() ? std::nan("") : scan.checkpoint->losses.back();
          found_path = scan.checkpoint->path;
        }
      }
    }
    if (comm_) {
      at::Tensor t = at::zeros({2}, at::kDouble);
      t[0] = found_step;
      t[1] = rank_ == 0 && std::isfinite(found_loss) ? found_loss : 0.0;
      t = t.to(device_);
      comm_->allreduce_sum_(t);
      t = t.to(at::kCPU);
      found_step = t[0].item<double>();
      if (rank_ != 0) found_loss = t[1].item<double>();
    }
    if (found_step <= 0) return false;
    const auto step = static_cast<int64_t>(found_step);
    log(already_complete_message(step, spec_.train.steps, options_.start_over_hint));
    sum_.already_complete = true;
    sum_.start_step = step;
    sum_.steps = step;
    sum_.final_loss = found_loss;
    sum_.last_checkpoint = found_path;
    sum_.tokens_per_step = spec_.train.micro_batch * spec_.train.grad_accum * spec_.train.seq_len * world_;
    if (options_.reporter) {
      options_.reporter->on_start(step, spec_.train.steps);
      options_.reporter->on_resumed(step, spec_.train.steps, found_loss);
      options_.reporter->on_finish(step, false);
    }
    sum_.wall_seconds = wall_.seconds();
    return true;
  }

  // After a failure: when a collective failed and this rank's optimizer node is gone as
  // well, the peer rank that left the group most likely lost the same node first and is
  // resuming without it (rank_main.cpp's on_node_loss); this rank must resume with it, so the
  // lost node is the error (HostBackendLost). Returns when it is not.
  void blame_a_lost_node() {
    if (!comm_ || !comm_->failed() || !opt_ || spec_.optimizer.host.addresses.empty()) return;
    try {
      opt_->check_host_backend();
    } catch (const engine::HostBackendLost&) {
      throw;
    } catch (const std::exception&) {
      // Not a lost node: the collective's failure is the error.
    }
  }

  // Preflight, before anything large is allocated: settings that cannot work are errors,
  // settings that cannot take effect are warnings, and a job whose estimated memory does
  // not fit this machine (shared by the ranks on it) is refused naming the key to change.
  void preflight() {
    tokenizer_ = reading("data.tokenizer", [&] { return model::load_tokenizer(spec_.data.tokenizer); });
    model_key_ = spec_.model.from.empty() ? "model.config" : "model.from";
    preflight_errors(spec_, device_.is_cuda());
    std::vector<int> mine = cores_.compute;
    for (int c : cores_.host)
      if (std::find(mine.begin(), mine.end(), c) == mine.end()) mine.push_back(c);
    for (const std::string& w :
         preflight_warnings(spec_, device_.is_cuda(), static_cast<int64_t>(mine.size())))
      log("warning: " + w);
    const model::LoadedModel described =
        reading(model_key_, [&] { return describe_model_from_spec(spec_.model, tokenizer_->vocab_size()); });
    const MemoryEstimate need = estimate_job_memory(spec_, described, world_, device_.is_cuda(),
                                                    static_cast<int>(c10::elementSize(dtype_)));
    const int64_t host = available_host_memory_bytes();
    // On CUDA, the device's free memory now (0, not checked, where this build cannot read it:
    // a LibTorch with CUDA but no zenflow CUDA kernels).
    const int64_t device_free = device_.is_cuda() && engine::cuda_ops::available()
                                    ? engine::cuda_ops::device_free_bytes(device_.has_index() ? device_.index() : 0)
                                    : 0;
    check_job_fits(spec_, need, host > 0 ? host / std::max<int64_t>(1, local_.world_size) : 0, device_free);
  }

  // Model: a Hugging Face directory (model.from) or a random init from model.config.
  void build_model() {
    // On the CPU the host is the device: count what its tensors hold (device_memory_bytes).
    if (device_.is_cpu()) model::CpuMemoryMeter::install();
    peaks_.emplace(device_);
    // Weights go straight to the device (a memory-mapped checkpoint is never held in
    // host RAM on a GPU host), unless initial weights replace them first; with
    // train.offload_parameters to host memory, where they stay.
    const bool streamed = spec_.train.offload_parameters;
    if (streamed && spec_.optimizer.mode != "zenflow" && world_ > 1 && device_.is_cuda())
      throw std::invalid_argument("train.offload_parameters: with " + std::to_string(world_) +
                                  " data-parallel ranks on GPUs, not yet (the gradients are on the host, "
                                  "where NCCL does not reduce them); run one rank per job");
    const bool by_column = streamed && spec_.optimizer.mode == "zenflow";
    const at::Device weights_on = streamed ? at::Device(at::kCPU) : device_;
    lm_ = reading(model_key_, [&] {
      return options_.initial_weights.empty()
                 ? make_model_from_spec(spec_.model, tokenizer_->vocab_size(), spec_.train.seed, &info_,
                                        weights_on, dtype_)
                 : make_model_from_spec(spec_.model, tokenizer_->vocab_size(), spec_.train.seed, &info_);
    });
    if (!options_.initial_weights.empty()) {
      std::map<std::string, at::Tensor> init(options_.initial_weights.begin(),
                                             options_.initial_weights.end());
      c10::NoGradGuard no_grad;
      for (auto& nt : lm_->parameters()) {
        auto it = init.find(nt.name);
        if (it == init.end() || it->second.sizes() != nt.tensor.sizes())
          throw std::invalid_argument("initial weights: '" + nt.name + "' missing or of another shape");
        nt.tensor.detach().copy_(it->second);
      }
    }
    lm_->to(weights_on, dtype_);
    lm_->train(true);
    lm_->set_activation_checkpointing(spec_.train.activation_checkpointing);
    sum_.activation_checkpointing = spec_.train.activation_checkpointing;
    for (auto& nt : lm_->parameters()) sum_.params += nt.tensor.numel();
    sum_.shard = spec_.train.shard;
    if (spec_.train.shard != "none" && comm_ && world_ > 1) {
      distributed::ShardOptions so;
      so.mode = distributed::parse_shard_mode(spec_.train.shard);
      so.column_scores = spec_.optimizer.mode == "zenflow";  // the selection is the whole matrix's
      so.l1 = spec_.optimizer.zenflow.importance == "l1";
      shards_ = std::make_unique<distributed::ShardedParameters>(*comm_, *lm_, so);
    }
    if (streamed) {
      streamed_ = std::make_unique<engine::StreamedParameters>(
          *lm_, device_, &clock_, by_column ? spec_.optimizer.zenflow.min_split_numel : -1);
      sum_.offload_parameters = true;
      sum_.streamed_weight_bytes = streamed_->host_bytes();
    }
  }

  void build_data() {
    std::tie(train_ds_, val_ds_) =
        reading(spec_.data.val.empty() ? "data.train" : "data.train/data.val", [&] {
          return make_dataset_from_spec(spec_.data, *tokenizer_, spec_.train.seq_len, lm_->vocab_size());
        });
    if (train_ds_->size() < spec_.train.micro_batch)
      throw std::invalid_argument("train.micro_batch: " + std::to_string(spec_.train.micro_batch) +
                                  " exceeds the " + std::to_string(train_ds_->size()) +
                                  " training examples of " + spec_.data.train);
    if (train_ds_->size() < spec_.train.micro_batch * world_)
      throw std::invalid_argument("train.micro_batch: " + std::to_string(spec_.train.micro_batch) + " x " +
                                  std::to_string(world_) + " ranks exceeds the " +
                                  std::to_string(train_ds_->size()) + " training examples");
    // Every rank draws the same global batch of micro_batch x world examples and keeps its rows,
    // so W ranks x micro-batch b see exactly what 1 rank x micro-batch W*b sees.
    loader_.emplace(train_ds_, spec_.train.micro_batch * world_, spec_.train.seed, 2, true);
  }

  // The engine over the model's parameters, the reducer for the rest, the schedule.
  void build_optimizer() {
    const std::vector<model::NamedTensor> model_params = lm_->parameters();
    for (size_t i = 0; i < model_params.size(); ++i) {
      const model::NamedTensor& nt = model_params[i];
      engine::ParamSpec p;
      p.name = nt.name;
      p.param = nt.tensor;
      if (shards_) {
        p.full_numel = shards_->full_numel(i);
        p.column_scores = shards_->column_scores(i);
      }
      // No decay on norms and biases (1-D parameters).
      p.weight_decay = nt.tensor.dim() >= 2;
      p.weight_decay_value = spec_.train.weight_decay;
      params_.push_back(p);
    }
    engine::EngineOptions eo = engine_options(spec_);
    eo.host_threads = static_cast<int>(std::max<size_t>(1, cores_.host.size()));
    eo.host_cores = cores_.host;
    eo.host_backend = host_backend(spec_, cores_.host);
    eo.parameters_sharded = shards_ != nullptr;
    eo.parameters_on_host = streamed_ != nullptr && !streamed_->by_column();
    eo.columns_streamed = streamed_ != nullptr && streamed_->by_column();
    if (comm_) collectives_ = std::make_unique<distributed::EngineCollectives>(*comm_);
    opt_.emplace(params_, eo, &clock_, collectives_.get());
    if (streamed_ && streamed_->by_column()) streamed_->attach(&*opt_);
    // The reducer averages the parameters the engine does not exchange itself (sharded: the
    // units' backward reduce-scatters every gradient).
    if (comm_ && !shards_) {
      std::vector<at::Tensor> ps;
      for (auto& p : params_)
        if (!opt_->is_split(p.name)) ps.push_back(p.param);
      if (!ps.empty()) reducer_ = std::make_unique<distributed::GradReducer>(*comm_, ps);
    }
    sum_.split_params = opt_->split_elements();
    sum_.host_state_bytes = opt_->host_state_bytes();
    sum_.transfer_buffer_bytes = opt_->pinned_host_bytes();

    sched_.kind = spec_.train.schedule;
    sched_.lr = spec_.train.lr;
    sched_.warmup_steps = spec_.train.warmup_steps;
    sched_.total_steps = spec_.train.steps;
    sched_.min_lr_ratio = spec_.train.min_lr_ratio;
  }

  // From the newest usable checkpoint in checkpoint.dir (weights, engine state re-sharded
  // when the ranks changed, loader position, loss history), or fresh: the earlier run's
  // checkpoints moved aside.
  void resume() {
    identity_ = job_identity(spec_, world_);
    for (const auto& [key, uri] : options_.input_uris) identity_[key] = uri;
    if (options_.resume && !spec_.checkpoint.dir.empty()) {
      CheckpointScan scan = scan_checkpoints(
          spec_.checkpoint.dir, [&](const std::string& s) { log(s); }, /*quarantine=*/owns_dir_, shard_filter());
      if (staged_per_worker()) agree_on_resumed_step(scan.checkpoint ? scan.checkpoint->step : -1);
      if (!scan.checkpoint && !scan.damaged.empty()) {
        std::string list;
        for (const auto& d : scan.damaged) list += "\n  " + d;
        throw ResumeRefused("checkpoint.dir " + spec_.checkpoint.dir +
                            " holds no usable checkpoint; damaged (kept for inspection):" + list +
                            "\nrerun with --fresh to start from step 0 anyway");
      }
      if (auto& ck = scan.checkpoint) load_checkpoint_state(*ck);
    } else if (owns_dir_) {
      const std::string moved = supersede_checkpoints(spec_.checkpoint.dir);
      if (!moved.empty())
        log("starting fresh: the checkpoints already in " + spec_.checkpoint.dir + " were moved to " + moved);
    }
    sum_.start_step = step_;
    sum_.tokens_per_step = spec_.train.micro_batch * spec_.train.grad_accum * spec_.train.seq_len * world_;
    last_saved_ = step_;  // a resumed checkpoint already holds this step
  }

  // Every rank's `value`, in rank order, on the CPU (one collective).
  at::Tensor gather_from_every_rank(int64_t value) {
    const at::Tensor mine = at::full({1}, value, at::kLong).to(device_);
    return comm_->all_gather(mine, std::vector<int64_t>(static_cast<size_t>(world_), 1)).to(at::kCPU);
  }

  // Whether the ranks' copies of checkpoint.dir differ (RunOptions::ranks_beside_rank0).
  bool staged_per_worker() const {
    return world_ > 1 && !shards_ && options_.ranks_beside_rank0 > 0 && options_.ranks_beside_rank0 < world_;
  }

  // Staged per worker, a rank holds only its worker's shards: when the ranks did not change
  // it reads its own; otherwise (re-sharding) it needs them all, and its worker fetched them.
  ShardFilter shard_filter() const {
    if (!staged_per_worker()) return {};
    const int64_t world = world_, rank = rank_;
    return [world, rank](int64_t checkpoint_world, int r) { return checkpoint_world != world || r == rank; };
  }

  // Each worker chose its checkpoint from the bucket on its own (checkpoint_mirror.h): a
  // shard damaged in the bucket makes one worker fall back while another does not. Mixing
  // steps would train on inconsistent states, so the ranks compare before loading.
  void agree_on_resumed_step(int64_t step) {
    const at::Tensor all = gather_from_every_rank(step);
    std::string steps;
    bool differ = false;
    for (int64_t r = 0; r < world_; ++r) {
      const int64_t s = all[r].item<int64_t>();
      differ = differ || s != all[0].item<int64_t>();
      steps += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + ": " + (s < 0 ? "none" : std::to_string(s));
    }
    if (differ)
      throw ResumeRefused("the ranks found different newest usable checkpoints in their workers' copies of the bucket (" +
                          steps + "): a step that one worker found damaged (its log names the file) must be removed "
                          "from the bucket, or the job given another checkpoint.dir");
  }

  void load_checkpoint_state(const Checkpoint& ck) {
    const std::vector<std::string> changed =
        identity_changes(ck.identity, identity_, options_.allow_spec_change);
    if (!changed.empty()) {
      std::string list, keys;
      for (const auto& c : changed) {
        list += "\n  " + c;
        keys += (keys.empty() ? "" : ",") + c.substr(0, c.find_first_of(" :"));
      }
      throw ResumeRefused(
          "checkpoint " + ck.path + " was written by a job with other settings; changed:" + list +
          "\nresuming would mix their states. Rerun with --allow-spec-change " + keys +
          " to resume anyway, --fresh to start from step 0, or give the job another checkpoint.dir");
    }
    std::map<std::string, at::Tensor> saved(ck.model.begin(), ck.model.end());
    c10::NoGradGuard no_grad;
    const std::vector<model::NamedTensor> params = lm_->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const model::NamedTensor& nt = params[i];
      auto it = saved.find(nt.name);
      if (it == saved.end()) throw ResumeRefused(ck.path + ": model tensor '" + nt.name + "' missing");
      const at::Tensor mine = shards_ && it->second.dim() > 0 ? shards_->slice_rows(i, it->second) : it->second;
      if (mine.sizes() != nt.tensor.sizes())
        throw ResumeRefused(ck.path + ": model tensor '" + nt.name + "' has a different shape");
      nt.tensor.detach().copy_(mine);
    }
    try {
      if (shards_) {
        // The one-rank state (merged when an unsharded run of several ranks wrote it), cut.
        std::vector<NamedTensors> shards;
        for (int r = 0; r < static_cast<int>(ck.world_size); ++r) shards.push_back(load_engine_shard(ck, r));
        opt_->load_state(shards_->slice_engine_state(distributed::merge_engine_shards(shards)));
        shards_->all_gather_weights();  // loading may apply a host step that was in flight
      } else if (ck.world_size == world_) {
        opt_->load_state(load_engine_shard(ck, static_cast<int>(rank_)));
      } else {
        // Re-shard: this rank's columns come from whichever old ranks held them.
        std::vector<NamedTensors> shards;
        for (int r = 0; r < static_cast<int>(ck.world_size); ++r) shards.push_back(load_engine_shard(ck, r));
        opt_->load_state_shards(shards);
        log("re-sharded the optimizer state of " + std::to_string(ck.world_size) + " ranks over " +
            std::to_string(world_));
      }
    } catch (const std::exception& e) {
      if (options_.allow_spec_change.empty()) throw;
      // The state of the old settings does not fit the new ones (another mode, ratio, …).
      throw ResumeRefused("checkpoint " + ck.path +
                          ": its optimizer state cannot be carried across the allowed change (" + e.what() +
                          "); use --fresh to start from step 0 with the new settings");
    }
    model::LoaderPosition pos;
    pos.epoch = ck.loader_epoch;
    pos.index = ck.loader_index;
    loader_->restore(pos);
    step_ = ck.step;
    history_ = ck.losses;
    log("resumed from " + ck.path + " at step " + std::to_string(step_));
  }

  // Every rank writes its shard of the engine state; rank 0 the rest, then commits through
  // the run's fence.
  void save(int64_t at_step) {
    if (!options_.write_checkpoints || spec_.checkpoint.dir.empty() || at_step == last_saved_) return;
    Stopwatch sw;
    double upload_wait = 0;
    NamedTensors engine_state = opt_->state_dict();
    // Sharded: every rank's shards gathered into what one rank would write (collectives).
    if (shards_) engine_state = shards_->gather_engine_state(engine_state);
    NamedTensors model_state;
    for (auto& nt : full_parameters()) model_state.emplace_back(nt.name, nt.tensor.detach());
    // A checkpoint that a resume would refuse is not written: weights or optimizer state that
    // overflowed (lr far too high) end the run here, naming the tensor.
    auto require_finite = [&](const std::string& what, const std::string& name, const at::Tensor& t) {
      if (count_non_finite(t) > 0)
        throw std::runtime_error("step " + std::to_string(at_step) + ": " + what + " '" + name +
                                 "' holds non-finite values (NaN/Inf), so no checkpoint was written; the training "
                                 "diverged: lower train.lr or set train.grad_clip");
    };
    for (const auto& [name, t] : engine_state) require_finite("optimizer state", name, t);
    for (const auto& [name, t] : model_state) require_finite("weight", name, t);
    if (rank_ == 0) begin_checkpoint(spec_.checkpoint.dir, at_step);
    std::map<int, ShardChecksum> elsewhere;  // rank 0: the shards written in other workers' copies
    if (world_ > 1 && !shards_) {
      comm_->barrier();
      ShardChecksum mine;
      if (rank_ != 0) mine = write_engine_shard(spec_.checkpoint.dir, at_step, static_cast<int>(rank_), engine_state);
      if (staged_per_worker()) {
        at::Tensor entry = at::tensor({mine.bytes, static_cast<int64_t>(mine.crc32c)}, at::kLong).to(device_);
        const at::Tensor all =
            comm_->all_gather(entry, std::vector<int64_t>(static_cast<size_t>(world_), 2)).to(at::kCPU);
        for (int64_t r = options_.ranks_beside_rank0; r < world_; ++r)
          elsewhere[static_cast<int>(r)] = {all[2 * r].item<int64_t>(), static_cast<uint32_t>(all[2 * r + 1].item<int64_t>())};
        if (rank_ >= options_.ranks_beside_rank0 && options_.on_shard_written)
          upload_wait = options_.on_shard_written(
              at_step, engine_shard_path(spec_.checkpoint.dir, at_step, static_cast<int>(rank_)), mine.crc32c);
      }
      comm_->barrier();
    }
    if (rank_ == 0) {
      CheckpointContents contents;
      contents.model = std::move(model_state);
      contents.engine = std::move(engine_state);
      contents.trainer["job"] = spec_.name;
      contents.trainer["loader_epoch"] = loader_->position().epoch;
      contents.trainer["loader_index"] = loader_->position().index;
      contents.trainer["losses"] = history_;
      contents.trainer["mode"] = spec_.optimizer.mode;
      contents.run_yaml = run_yaml_;
      contents.identity = identity_;
      sum_.last_checkpoint = commit_checkpoint(spec_.checkpoint.dir, at_step, contents, spec_.checkpoint.keep,
                                               shards_ ? 1 : static_cast<int>(world_), options_.commit_fence,
                                               elsewhere);
      if (options_.reporter) options_.reporter->on_checkpoint(at_step, sum_.last_checkpoint);
      if (options_.on_checkpoint_committed)
        upload_wait = options_.on_checkpoint_committed(at_step, sum_.last_checkpoint);
    }
    last_saved_ = at_step;
    clock_.add_stall(StallCause::kCheckpoint, std::max(0.0, sw.seconds() - upload_wait));
    clock_.add_stall(StallCause::kCheckpointUpload, upload_wait);
  }

  // Setup is done: from here `stop` ends the run with a checkpoint. Tells the caller, the
  // observer and the reporter.
  void begin_training() {
    // run.yaml keeps the URIs of inputs read from a bucket, not this worker's copies.
    JobSpec written = spec_;
    for (const auto& [key, uri] : options_.input_uris) {
      if (key == "model.from") written.model.from = uri;
      if (key == "data.train") written.data.train = uri;
      if (key == "data.val") written.data.val = uri;
      if (key == "data.tokenizer") written.data.tokenizer = uri;
    }
    if (!options_.checkpoint_uri.empty()) written.checkpoint.dir = options_.checkpoint_uri;
    run_yaml_ = to_yaml(written);
    if (options_.on_training_start) options_.on_training_start();
    if (options_.observer) {
      RunFacts facts;
      facts.rank = rank_;
      facts.world_size = world_;
      facts.device_is_cuda = device_.is_cuda();
      facts.start_step = step_;
      facts.total_steps = spec_.train.steps;
      facts.tokens_per_step = sum_.tokens_per_step;
      const engine::HostMemoryBytes mem = opt_->host_memory_bytes();
      facts.host_master_bytes = mem.master;
      facts.host_moments_bytes = mem.moments;
      facts.host_accumulator_bytes = mem.accumulators;
      // Transfer buffers are page-locked on CUDA only (the rule of the run summary's pinned_host_bytes).
      (device_.is_cuda() ? facts.pinned_host_bytes : facts.host_staging_bytes) = mem.transfer_buffers;
      const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
      facts.host_total_memory_bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
      facts.device_memory = device_memory();
      facts.device_memory.activations_peak = facts.device_memory.total_peak = -1;
      options_.observer->on_start(facts);
    }
    if (options_.reporter) {
      options_.reporter->on_start(step_, spec_.train.steps);
      if (step_ > 0 && !history_.empty()) options_.reporter->on_resumed(step_, spec_.train.steps, history_.back());
    }
    skipped_before_ = opt_->skipped_steps();
    first_ = step_;
  }

  // Until train.steps, a stop (agreed by every rank) or stop_after_steps.
  void train_steps() {
    while (step_ < spec_.train.steps) {
      if ((comm_ && stop_agreed_) || (!comm_ && stop_ && stop_->load())) {
        sum_.interrupted = true;
        break;
      }
      clock_.begin_step();
      const double lr = model::lr_at(sched_, step_);
      const StepOutcome out = train_step(lr);
      trailing_skipped_ = out.report.skipped ? trailing_skipped_ + 1 : 0;
      history_.push_back(out.loss);
      // A periodic checkpoint belongs to its step: its time is that step's `checkpoint` stall.
      if (spec_.checkpoint.every_steps > 0 && (step_ + 1) % spec_.checkpoint.every_steps == 0 &&
          step_ + 1 < spec_.train.steps) {
        // Steps that were all skipped since the last checkpoint trained nothing: a checkpoint
        // of them would look like progress to the next resume.
        if (trailing_skipped_ >= step_ + 1 - last_saved_)
          log("warning: not writing the checkpoint of step " + std::to_string(step_ + 1) +
              ": every step since step " + std::to_string(last_saved_) +
              " was skipped (non-finite loss or gradients)");
        else
          save(step_ + 1);
      }
      const engine::StepTimes& times = clock_.end_step();
      ++step_;
      sum_.losses.push_back(out.loss);
      sum_.step_seconds.push_back(times.wall_seconds);
      report_step(out, lr, times);
      if (spec_.train.eval_every > 0 && step_ % spec_.train.eval_every == 0 && step_ < spec_.train.steps &&
          options_.evaluate) {
        const double v = evaluate(*lm_, val_ds_, spec_.train.micro_batch, spec_.train.eval_batches, device_);
        if (options_.observer) options_.observer->on_eval(step_, v);
        log("step " + std::to_string(step_) + " val_loss " + std::to_string(v) + " perplexity " +
            std::to_string(std::exp(v)));
      }
      if (options_.stop_after_steps > 0 && step_ - first_ >= options_.stop_after_steps) {
        sum_.interrupted = true;
        break;
      }
    }
  }

  // This rank's device memory by kind now (DeviceMemoryBytes). Gradient buffers not yet
  // allocated (before the first backward) count as they will be: the weights' shapes and dtype.
  DeviceMemoryBytes device_memory() {
    DeviceMemoryBytes m;
    if (streamed_) {  // the weights and their gradients are host memory; the device has the ring
      m.parameters = streamed_->ring_bytes();
      m.gradients = streamed_->gradients_in_flight_bytes();
      if (streamed_->by_column()) {  // + the selected columns and the parameters kept on the device
        const engine::EngineDeviceBytes e = opt_->device_bytes();
        m.parameters += e.selected_weights + streamed_->device_leaf_bytes();
        m.gradients += e.selected_gradients + streamed_->device_leaf_bytes();
      }
    } else {
      for (auto& nt : lm_->parameters()) {  // sharded: this rank's shards
        const auto bytes = static_cast<int64_t>(nt.tensor.nbytes());
        m.parameters += bytes;
        m.gradients += nt.tensor.grad().defined() ? static_cast<int64_t>(nt.tensor.grad().nbytes()) : bytes;
      }
    }
    const engine::EngineDeviceBytes e = opt_->device_bytes();
    m.optimizer_state = e.optimizer_state;
    m.communication_buffers = e.buffers + (reducer_ ? reducer_->buffer_bytes() : 0);
    if (shards_) {
      m.parameters += shards_->kept_full_bytes();  // gradients: every rank's full weights
      m.communication_buffers += shards_->gathered_peak_bytes();
    }
    m.activations_peak = peaks_->activations();
    m.total_peak = peaks_->total();
    return m;
  }

  // The model's full weights: sharded, gathered from the ranks (a collective per tensor).
  std::vector<model::NamedTensor> full_parameters() {
    if (streamed_ && opt_) opt_->sync_parameters();  // zenflow mode: the engine holds the weights
    if (!shards_) return lm_->parameters();
    std::vector<model::NamedTensor> out;
    for (size_t i = 0; i < shards_->size(); ++i) out.push_back({shards_->name(i), shards_->full_tensor(i)});
    return out;
  }

  // Whether every parameter has its gradient buffer (from the second micro-batch on): the
  // activation measurement leaves out the first backward, which allocates them.
  bool gradients_exist() {
    const std::vector<model::NamedTensor> params = lm_->parameters();
    for (size_t i = 0; i < params.size(); ++i)
      if ((!streamed_ || streamed_->grad_in_tensor(i)) && !params[i].tensor.grad().defined()) return false;
    return true;
  }

  // Forward and backward over the micro-batches, the gradients' reduction, the step's loss
  // (and the stop flag) agreed between the ranks, the optimizer step.
  StepOutcome train_step(double lr) {
    StepOutcome out;
    opt_->zero_grad();
    if (shards_) shards_->begin_step();
    if (streamed_) streamed_->begin_step();
    const double comm_before = shards_ ? shards_->comm_seconds() : 0.0;
    at::Tensor loss_acc;  // fp64 on the device: read once per step, not per micro-batch
    int64_t tokens = 0;
    for (int64_t micro = 0; micro < spec_.train.grad_accum; ++micro) {
      Stopwatch data_sw;
      model::Batch batch = loader_->next();
      out.epoch = loader_->epoch();
      if (world_ > 1) {
        const int64_t b = spec_.train.micro_batch;
        batch.input_ids = batch.input_ids.narrow(0, rank_ * b, b);
        batch.targets = batch.targets.narrow(0, rank_ * b, b);
        batch.tokens = batch.targets.ne(-100).sum().item<int64_t>();
      }
      if (reducer_) reducer_->set_sync(micro == spec_.train.grad_accum - 1);
      at::Tensor ids = to_device(batch.input_ids, device_);
      at::Tensor targets = to_device(batch.targets, device_);
      clock_.add_stall(StallCause::kData, data_sw.seconds());
      // Compute time: on CUDA what the compute stream spent on forward and backward.
      engine::ClockSpan compute(&clock_, device_);
      peaks_->begin_micro_batch();
      // Gradient buffers stay once allocated (zero_grad zeroes them in place): look until then.
      gradients_allocated_ = gradients_allocated_ || gradients_exist();
      const bool gradients_allocated = gradients_allocated_;
      at::Tensor loss;
      {
        model::CudaAutocast autocast(use_autocast_, autocast_dtype_);
        loss = model::causal_lm_loss(lm_->forward(ids), targets);
      }
      (loss / static_cast<double>(spec_.train.grad_accum)).backward();
      if (streamed_) streamed_->finish_backward();
      peaks_->end_micro_batch(gradients_allocated);
      compute.end(engine::TimeKind::kCompute);
      const at::Tensor l = loss.detach().to(at::kDouble);
      loss_acc = loss_acc.defined() ? loss_acc + l : l;
      tokens += batch.tokens;
    }
    if (reducer_) {
      // On NCCL the wait is the compute stream's, not the host's (ClockSpan's events).
      engine::ClockSpan wait(&clock_, device_);
      const distributed::ReduceReport r = reducer_->finish();
      wait.end(engine::TimeKind::kStall, StallCause::kAllreduce, r.wait_seconds);
    }
    double loss_sum = 0;
    out.local_tokens = tokens;  // this rank's; `tokens` becomes the global batch's
    if (comm_) {
      // The reported loss and tokens are the global batch's, identical on every rank.
      at::Tensor l = at::empty({3}, at::kDouble);
      l[1] = stop_ && stop_->load() ? 1.0 : 0.0;
      l[2] = static_cast<double>(tokens);
      l = l.to(device_);
      l[0].copy_(loss_acc);
      comm_->allreduce_sum_(l);
      l = l.to(at::kCPU);
      loss_sum = l[0].item<double>() / static_cast<double>(world_);
      stop_agreed_ = l[1].item<double>() > 0;
      tokens = static_cast<int64_t>(l[2].item<double>());
    }
    out.tokens = tokens;
    engine::StepContext ctx;
    ctx.lr = lr;
    ctx.epoch = out.epoch;
    out.report = opt_->step(ctx);
    if (shards_) {
      shards_->all_gather_weights();
      sum_.shard_comm_seconds += shards_->comm_seconds() - comm_before;  // the steps' only
    }
    if (!comm_) loss_sum = loss_acc.item<double>();  // the step's own reads have synchronised
    out.loss = loss_sum / static_cast<double>(spec_.train.grad_accum);
    return out;
  }

  // The step just done, to the observer and the reporter.
  void report_step(const StepOutcome& out, double lr, const engine::StepTimes& times) {
    tokens_window_ = 0.8 * tokens_window_ + static_cast<double>(out.tokens);
    seconds_window_ = 0.8 * seconds_window_ + times.wall_seconds;
    if (options_.observer) {
      TrainingStep t;
      t.step = step_;
      t.times = times;
      t.tokens = out.local_tokens;
      t.loss = out.loss;
      t.lr = lr;
      t.skipped = out.report.skipped;
      t.staleness_steps = out.report.staleness_steps;
      t.host_step_seconds = out.report.host_step_seconds;
      t.activations_peak_bytes = peaks_->activations();
      t.total_peak_bytes = peaks_->total();
      t.selected_ratio = opt_->selected_ratio();
      if (const engine::HostOptimizer* host = opt_->host_optimizer()) {
        t.network_bytes_sent = host->network_bytes_sent();
        t.network_bytes_received = host->network_bytes_received();
      }
      options_.observer->on_step(t);
    }
    if (options_.reporter) {
      StepProgress p;
      p.step = step_;
      p.total = spec_.train.steps;
      p.loss = out.loss;
      p.lr = lr;
      p.step_seconds = times.wall_seconds;
      p.tokens_per_second = seconds_window_ > 0 ? tokens_window_ / seconds_window_ : 0;
      p.tokens_per_step = sum_.tokens_per_step;
      const auto tot = clock_.totals();
      p.stall_fraction = tot.wall_seconds > 0 ? tot.stall_total() / tot.wall_seconds : 0;
      p.eta_seconds = tot.wall_seconds / static_cast<double>(step_ - first_) *
                      static_cast<double>(spec_.train.steps - step_);
      options_.reporter->on_step(p);
    }
  }

  // The end of the run — the last window's host step and its copy to the device, the final
  // checkpoint — counts in the totals, not as a training step of its own.
  void finish() {
    clock_.begin_step();
    // A run that ends skipping every step has diverged (or never trained): it is a failure,
    // and its state is not saved over the last good checkpoint's successor.
    const int64_t ran = step_ - first_, skipped = opt_->skipped_steps() - skipped_before_;
    if (ran > 0 && skipped == ran)
      throw std::runtime_error(
          "every one of the " + std::to_string(ran) +
          " steps of this run was skipped: the loss or the gradients were not finite (NaN/Inf); "
          "no final checkpoint was written. Lower train.lr, set train.grad_clip, or check the data");
    if (!sum_.interrupted && trailing_skipped_ > 0 && !std::isfinite(history_.back()))
      throw std::runtime_error(
          "the run diverged: its last " + std::to_string(trailing_skipped_) + " step(s) were skipped (" +
          std::to_string(skipped) + " of " + std::to_string(ran) +
          " in all) because the loss or the gradients were not finite (NaN/Inf); no final "
          "checkpoint was written" +
          (last_saved_ > first_ ? " (the last one is step " + std::to_string(last_saved_) + ")" : "") +
          ". Lower train.lr or set train.grad_clip, and resume");
    if (sum_.interrupted) {
      save(step_);
      if (!sum_.last_checkpoint.empty())
        log("stopped at step " + std::to_string(step_) + "; checkpoint " + sum_.last_checkpoint);
    } else {
      opt_->finish();
      if (shards_) shards_->all_gather_weights();  // the last window's host step
      if (step_ > first_) save(step_);
    }
    sum_.finish_times = clock_.end_step();
    sum_.steps = step_;
    if (options_.observer) {
      TrainingEnd end;
      end.steps = step_;
      end.interrupted = sum_.interrupted;
      end.finish = sum_.finish_times;
      options_.observer->on_finish(end);
    }
    if (options_.final_weights) {
      options_.final_weights->clear();
      for (auto& nt : full_parameters())
        options_.final_weights->emplace_back(nt.name, nt.tensor.detach().to(at::kCPU).to(at::kFloat).clone());
    }
  }

  // Validation loss, step-time quantiles, engine figures; with several ranks, that their
  // weights agree and what their collectives moved.
  void summarize() {
    sum_.skipped_steps = opt_->skipped_steps();
    sum_.final_loss = history_.empty() ? 0 : history_.back();
    if (options_.evaluate && !sum_.interrupted)
      sum_.val_loss = evaluate(*lm_, val_ds_, spec_.train.micro_batch, spec_.train.eval_batches, device_);
    sum_.step_seconds_median = percentile(sum_.step_seconds, 0.5);
    sum_.step_seconds_p90 = percentile(sum_.step_seconds, 0.9);
    sum_.totals = clock_.totals();
    sum_.reselections = opt_->reselections();
    if (const engine::HostOptimizer* host = opt_->host_optimizer()) {
      sum_.host_backend = host->describe();
      sum_.network_bytes_sent = host->network_bytes_sent();
      sum_.network_bytes_received = host->network_bytes_received();
    }
    sum_.optimizer_nodes = spec_.optimizer.host.addresses;
    sum_.max_staleness_windows = opt_->max_staleness_windows();
    if (comm_) {
      // Every update is replicated or all-gathered, so the ranks' weights must be equal
      // bit for bit; a difference is a bug worth shouting about.
      const at::Tensor all = gather_from_every_rank(weights_fingerprint(full_parameters()));
      std::string differ;
      for (int64_t r = 1; r < world_; ++r)
        if (all[r].item<int64_t>() != all[0].item<int64_t>())
          differ += (differ.empty() ? "" : ", ") + std::to_string(r);
      sum_.ranks_identical = differ.empty();
      if (!differ.empty()) log("warning: the weights of rank(s) " + differ + " differ from rank 0's");
      const distributed::CommStats cs = comm_->stats();
      sum_.comm_gradient_bytes = cs.traffic_bytes(distributed::Traffic::kGradients);
      sum_.comm_selection_bytes = cs.traffic_bytes(distributed::Traffic::kSelection);
      sum_.comm_parameter_bytes = cs.traffic_bytes(distributed::Traffic::kParameters);
    }
    if (shards_) sum_.shard_gathered_peak_bytes = shards_->gathered_peak_bytes();
    if (streamed_) sum_.streamed_staging_bytes = streamed_->staging_bytes();
    sum_.device_memory = device_memory();
    sum_.wall_seconds = wall_.seconds();
  }

  std::optional<DevicePeaks> peaks_;
  bool gradients_allocated_ = false;  // every parameter has its .grad() (see gradients_exist)
  const JobSpec& spec_;
  const RunOptions& options_;
  const std::atomic<bool>* stop_;
  bool log_here_ = true;
  Stopwatch wall_;
  RunSummary sum_;
  // setup_devices
  distributed::LocalPlacement local_;
  at::Device device_{at::kCPU};
  at::ScalarType dtype_ = at::kFloat;
  std::optional<c10::DeviceGuard> on_device_;
  bool use_autocast_ = false;
  at::ScalarType autocast_dtype_ = at::kBFloat16;
  CorePlan cores_;
  std::optional<engine::ScopedCores> on_compute_cores_;  // this thread, while the run lasts
  // join_ranks
  std::unique_ptr<distributed::Communicator> comm_;
  int64_t world_ = 1;
  int64_t rank_ = 0;
  bool owns_dir_ = false;
  std::unique_ptr<CheckpointDirLock> dir_lock_;
  // preflight, build_model, build_data
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::string model_key_;
  model::LoadedModel info_;
  std::unique_ptr<model::CausalLM> lm_;
  // train.shard: the model's parameters cut across the ranks (destroyed before lm_ and comm_)
  std::unique_ptr<distributed::ShardedParameters> shards_;
  // train.offload_parameters: the weights in host memory, streamed (destroyed before lm_)
  std::unique_ptr<engine::StreamedParameters> streamed_;
  std::shared_ptr<model::TokenDataset> train_ds_, val_ds_;
  std::optional<model::DataLoader> loader_;
  // build_optimizer
  std::vector<engine::ParamSpec> params_;
  engine::StallClock clock_;
  std::unique_ptr<distributed::EngineCollectives> collectives_;
  std::optional<engine::ZenFlowOptimizer> opt_;
  std::unique_ptr<distributed::GradReducer> reducer_;
  model::ScheduleConfig sched_;
  // resume, save
  nlohmann::json identity_;
  int64_t step_ = 0;
  std::vector<double> history_;
  std::string run_yaml_;
  int64_t last_saved_ = 0;
  // the step loop
  int64_t skipped_before_ = 0;
  int64_t trailing_skipped_ = 0;  // steps skipped in a row at the end of the run so far
  int64_t first_ = 0;
  bool stop_agreed_ = false;  // with several ranks, all stop at the same step
  double tokens_window_ = 0, seconds_window_ = 0;
};

}  // namespace

std::string already_complete_message(int64_t step, int64_t train_steps, const std::string& start_over_hint) {
  return "already complete at step " + std::to_string(step) +
         (step > train_steps ? ", past train.steps " + std::to_string(train_steps) : "") + "; nothing to do" +
         (start_over_hint.empty() ? "" : " (" + start_over_hint + ")");
}

RunSummary run_training(const JobSpec& spec, const RunOptions& options, const std::atomic<bool>* stop) {
  return TrainingRun(spec, options, stop).run();
}

}  // namespace zenflow
