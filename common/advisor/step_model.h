// The analytical step-time model of `zenflow advise` (docs/benchmarks.md §5), calibrated
// from a job's measured profile.
//
// Per rank and optimizer step, for mode device, offload or zenflow on an instance:
//   compute      roofline scaling of the measured forward+backward: the GEMM share by FLOPs
//                (6N + 12 L d seq per token) over peak FLOP/s (same device: the GEMM probe's
//                rate at the compute threads), the rest by weights streamed per micro-batch
//                over memory bandwidth; from a CPU profile to a GPU, FLOPs at an assumed MFU
//   device opt.  AdamW streaming 28 B/element on the device (+ zenflow's column scoring)
//   PCIe         bytes per direction / that direction's bandwidth
//   host opt.    host AdamW at the rank's cores (28 B/element roof): offload waits for it
//                every step; zenflow overlaps the window's step with the next window,
//                max(0, T_win - eta (U-1) T_gpu) / U per step
//   collectives  ring all-reduce (device) or reduce-scatter + all-gather, exposed beyond
//                an assumed overlap with backward
//   data, other  the profile's measured seconds per step
// With a model config (Scenario::model) the model's exact shapes replace the profile's model
// scaled by a cube root: FLOPs, split elements and the memory of model_memory.h; activation
// checkpointing costs one more forward (compute x 4/3); predict() picks the micro-batch and
// the checkpointing setting. With Scenario::global_batch every instance trains the same
// sequences per step: W GPUs share them, so the job's $ compare like for like.
// Calibration: on the profile's own device, each term of the mode that ran is scaled so the
// profile's configuration reproduces its measured parts (eta is fitted for zenflow); other
// modes use the probes. Every constant that is assumed is listed in Prediction::assumed.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/advisor/hardware.h"
#include "common/advisor/job_profile.h"
#include "common/advisor/model_memory.h"

namespace zenflow::advisor {

// The job as asked about: the profile's settings, changed by --set.
struct Scenario {
  std::string mode;
  int64_t micro_batch = 0, grad_accum = 1, seq_len = 0;
  int64_t ranks = 0;                       // data-parallel GPUs; 0: every GPU of the instance (1 on a CPU)
  int64_t update_interval = 1;             // U
  double topk_ratio = 0.1;                 // r
  int64_t host_threads = 0;                // per rank; 0: offload every core of the rank, zenflow half
  int64_t compute_threads = 0;             // local CPU device only; 0: the profile's
  double parameters = 0;                   // 0: the profile's model
  bool host_shares_compute_cores = false;  // local: the host pool runs on the compute cores
  // Sequences per optimizer step over all ranks, held on every instance: W ranks train
  // global_batch / W each (rounded up where W does not divide it), in micro-batches of at
  // most micro_batch. 0: micro_batch x grad_accum per rank whatever W (a W-GPU row trains W
  // times the batch).
  int64_t global_batch = 0;
  std::optional<ModelShape> model;  // --model-config: exact shapes (`parameters` is then unused)
  // train.activation_checkpointing. Unset: off, except with a model config, where predict()
  // picks it (see predict()).
  std::optional<bool> activation_checkpointing;
  // train.shard (none | gradients | parameters). Unset: none, except with a model config
  // on several GPUs, where predict() picks it.
  std::optional<std::string> shard;
  // optimizer.host.device_staging_mib. Unset: 0 (whole gradients), except with a model
  // config on a GPU in offload or zenflow mode, where predict() also tries
  // kChunkedStagingMib and keeps it only where whole staging does not fit or is slower.
  std::optional<int64_t> device_staging_mib;
  // train.offload_parameters. Unset: off, except with a model config on GPUs in zenflow mode
  // (any number) or offload mode (one GPU: the trainer refuses it on several), where
  // predict() also tries it (with activation checkpointing, unsharded) and keeps it only
  // where the resident weights do not fit or it is faster. Every step then streams what the
  // host owns of each unit's weights (offload: all; zenflow: every rank's unselected
  // columns) twice per micro-batch: the weight_stream stall is what of that the compute does
  // not hide (streamed bytes over the H2D bandwidth, less the compute). On several ranks
  // the host columns' gradients and updated weights also cross PCIe for their exchange.
  std::optional<bool> offload_parameters;
};

// The profile's own configuration.
Scenario scenario_of(const JobProfile& profile);
// Applies one --set key=value: mode, micro_batch, grad_accum, seq_len, ranks,
// update_interval, topk_ratio, host_threads, compute_threads, parameters (7e9, 7B, 70B),
// activation_checkpointing (true or false), shard (none, gradients or parameters),
// device_staging_mib (0, or MiB of chunked device staging), offload_parameters (true or false).
// std::invalid_argument naming the key for an unknown key or a bad value.
void apply_setting(Scenario& s, const std::string& key_equals_value);

struct Prediction {
  std::string instance, mode;
  int64_t ranks = 1;
  bool fits = true;
  std::vector<std::string> why_not;  // what does not fit, with the numbers
  double step_seconds = 0;
  double compute_seconds = 0, device_optimizer_seconds = 0, other_seconds = 0;
  std::map<std::string, double> stall_seconds;  // kStallCauses
  double stall_total = 0;
  int64_t tokens_per_step = 0;              // global batch
  int64_t micro_batch = 0, grad_accum = 1;  // per rank, as predicted
  int64_t global_batch = 0;                 // sequences per step over all ranks when held; else 0
  bool activation_checkpointing = false;    // assumed for this answer (see Scenario)
  std::string shard = "none";               // train.shard assumed for this answer (see Scenario)
  int64_t device_staging_mib = 0;           // optimizer.host.device_staging_mib assumed (see Scenario)
  bool offload_parameters = false;          // train.offload_parameters assumed (see Scenario)
  std::optional<RankMemory> memory;         // with a model config: one rank's memory by kind
  double gpu_memory_gib = 0;                // needed per GPU (device memory; host RAM on a CPU device)
  double host_ram_gib = 0;                  // needed on the node
  double host_cores_per_rank = 0;
  bool priced = false;
  double usd_per_hour = 0;  // the job's share of the instance
  double usd_per_1m_tokens = 0, job_seconds = 0, job_usd = 0, usd_lost_to_stalls = 0;
  bool calibrated = false;           // terms scaled to the profile's measurement (same device, same mode)
  std::vector<std::string> assumed;  // assumed constants this answer used
  std::vector<std::string> flags;    // stale or unverified price, ...
  std::map<std::string, Sourced> inputs;  // the constants, with provenance
};

// Predicts one mode of `s` on `instance` for `steps` steps. Never throws for a job that
// does not fit: fits = false and why_not say why (the times are still computed). With a
// model config, the fastest setting that fits among micro-batches of at most micro_batch
// that divide the rank's sequences per step (the rest accumulated), activation
// checkpointing off or on (where activation_checkpointing is unset) and, on several GPUs,
// train.shard none, gradients or parameters (with checkpointing; where shard is unset);
// none fitting, the one needing the least GPU memory.
Prediction predict(const JobProfile& profile, const Instance& instance, const Scenario& s, int64_t steps);

}  // namespace zenflow::advisor
