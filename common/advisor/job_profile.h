// The measured profile of one training job (`zenflow run --profile` writes profile.yaml
// beside the checkpoints): what `zenflow advise` calibrates its step-time model from.
//
// Schema (version kProfileVersion, key `zenflow_profile`): the host it was measured on
// and the date; the model's sizes; the settings that ran (mode, batch, U, r, the core
// binding); the steady step of that mode, per step (compute, device optimizer, stall by
// cause, bytes per direction and per collective, data stall, the GEMM share of compute);
// probes run after training on the job's own cores (GEMM rate by compute threads, device
// AdamW rate, transfer bandwidth each way, host AdamW elements/s at several core counts,
// pinned to the job's host cores first); host and device bytes per parameter for every
// mode (worker/rank/preflight.h's exact accounting). Every measured value belongs to
// `measured_on` and `date`.
//
// parse() rejects another schema version, a missing or mistyped key, a negative or
// non-finite number, naming the origin and the key path
// (`runs/x/profile.yaml: step.stall_seconds.data: must be >= 0, got -1`).
// LibTorch-free: the advisor and its tests link it without the engine.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace zenflow::advisor {

constexpr int kProfileVersion = 1;

class ProfileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Stall causes the model predicts (worker/engine/stall_clock.h's names, checkpoint aside).
extern const std::vector<std::string> kStallCauses;

struct MeasuredOn {
  std::string host;  // "Intel(R) Xeon(R) Processor, 2 cores, no GPU"
  std::string cpu_model;
  int64_t cores = 0;   // cores this process could use
  std::string gpu;     // "" on a CPU-only host
  std::string device;  // "cpu" or "cuda"
  std::string date;    // YYYY-MM-DD
  std::string zenflow_version;
};

struct ModelFacts {
  std::string arch;
  int64_t parameters = 0;
  int64_t split_parameters = 0;  // elements of the split matrices (host-owned columns)
  int64_t layers = 0, hidden = 0, vocab = 0;
  int64_t weight_dtype_bytes = 4;
};

struct RunSettings {
  std::string mode;  // device | offload | zenflow
  int64_t micro_batch = 0, grad_accum = 1, seq_len = 0, world_size = 1;
  int64_t update_interval = 1;  // U (1 outside zenflow)
  double topk_ratio = 0;        // r
  int64_t host_threads = 0, compute_threads = 0;
  int64_t steps = 0;  // train.steps (advise's default job length)
  std::vector<int64_t> host_cores, compute_cores;
};

// Per steady step of the mode that ran: per position in a window of U steps, the median over
// windows; the mean over the positions (other_seconds makes the parts sum to step_seconds).
struct StepProfile {
  int64_t steps_measured = 0;
  int64_t tokens_per_step = 0;  // global batch
  double step_seconds = 0;
  double compute_seconds = 0;
  double device_optimizer_seconds = 0;
  double other_seconds = 0;                     // wall minus the parts (loss reads, bookkeeping)
  std::map<std::string, double> stall_seconds;  // kStallCauses
  int64_t d2h_bytes = 0, h2d_bytes = 0;
  std::map<std::string, int64_t> collective_bytes;  // gradients, selection, parameters
  double gemm_share = 0;                            // of compute, from the GEMM probe
  double boundary_step_seconds = 0;                 // zenflow: median boundary step (0 otherwise)
  double accumulation_step_seconds = 0;             // zenflow: median of the other steps
  // The median host AdamW step as it ran in training (a zenflow window's, offload's step),
  // on the job's host cores; -1: none ran (device mode) or not recorded (older profiles).
  double host_step_seconds = -1;
};

struct Probes {
  std::map<int64_t, double> gemm_gflops;  // compute threads -> GFLOP/s at the job's shapes
  // The same GEMM with twice a micro-batch's tokens, at the job's compute threads: how the
  // rate grows with the tokens (a few tokens stream the weights; many are bound by the
  // arithmetic). 0: not probed (older profiles).
  double gemm_gflops_twice_the_tokens = 0;
  double device_adamw_elements_per_second = 0;
  double d2h_gbps = 0, h2d_gbps = 0;                        // the engine's copy path, one direction
  double device_memory_gbps = 0;                            // streaming bandwidth of the device
  std::map<int64_t, double> host_adam_elements_per_second;  // cores -> elem/s
};

// Bytes per parameter of one rank with W data-parallel ranks: fixed + partitioned / W.
struct ModeMemory {
  double host_bytes_per_parameter = 0;    // host RAM (W = 1)
  double device_bytes_per_parameter = 0;  // weights, grads, device optimizer state (W = 1)
  double host_partitioned = 0;            // of host_bytes_per_parameter, the part split over ranks
  double device_partitioned = 0;          // of device_bytes_per_parameter, the part split over ranks
  double host_per_rank(int64_t w) const {
    return host_bytes_per_parameter - host_partitioned + host_partitioned / static_cast<double>(w);
  }
  double device_per_rank(int64_t w) const {
    return device_bytes_per_parameter - device_partitioned + device_partitioned / static_cast<double>(w);
  }
};

struct JobProfile {
  int version = kProfileVersion;
  std::string job;
  MeasuredOn measured_on;
  ModelFacts model;
  RunSettings run;
  StepProfile step;
  Probes probes;
  double activation_bytes = 0;               // one micro-batch, preflight's upper bound
  std::map<std::string, ModeMemory> memory;  // device, offload, zenflow (16-bit weights on a GPU)

  std::string to_yaml() const;
  static JobProfile parse(const std::string& yaml_text, const std::string& origin);
  static JobProfile load(const std::string& path);  // ProfileError when unreadable too
};

// Today's date, YYYY-MM-DD (UTC).
std::string today_utc();
// Days from `from` to `to` (both YYYY-MM-DD); 0 if either is malformed.
int64_t days_between(const std::string& from, const std::string& to);

}  // namespace zenflow::advisor
