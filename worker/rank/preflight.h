// Checks a job before anything is allocated: memory estimate vs what the machine has,
// settings that cannot work (errors) and settings that cannot take effect (warnings).
//
// The trainer calls these after picking the device and describing the model
// (describe_model_from_spec reads config.json only), so an oversized job is refused in
// milliseconds with the key to change, instead of being killed by the kernel mid-way.
// Thread-safety: all functions are reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace zenflow {
namespace model {
struct LoadedModel;
}

// Bytes one rank needs, by kind. Estimates: the parameter, gradient and optimizer terms
// follow the model's and the engine's allocations exactly; activation_bytes is a rough
// upper bound (see estimate_job_memory).
struct MemoryEstimate {
  int64_t parameters = 0;              // scalars in the model (exact: the architecture's shapes)
  int64_t weight_bytes = 0;            // parameters x weight dtype, on the device
  int64_t gradient_bytes = 0;          // .grad() of every parameter, weight dtype, on the device
  int64_t device_optimizer_bytes = 0;  // fp32 m, v (+ master) of device-updated state, staging
  int64_t host_optimizer_bytes = 0;    // the host updater's buffers (this rank's share)
  int64_t activation_bytes = 0;        // saved for backward, one micro-batch (upper bound)
  int64_t shard_buffer_bytes = 0;      // train.shard: gathered units and reduce-scatter buffers
  int64_t total_host_bytes = 0;        // host RAM; on the CPU this includes the device terms
  int64_t total_device_bytes = 0;      // weights + gradients + device optimizer + activations
  // The spec key that drives the binding total (host RAM on the CPU, device memory on
  // CUDA), for messages: model.from, model.config.<key>, model.config, train.micro_batch
  // or train.seq_len.
  std::string dominant_key;
  std::string model_key;        // the key that drives weights, gradients and optimizer state
  std::string activation_key;   // train.micro_batch or train.seq_len
  bool device_is_cuda = false;  // as passed: false means the device terms are host RAM too
  int64_t init_host_bytes = 0;  // CUDA random init: the fp32 copy built on the host first
  // With optimizer.host.device_staging_mib 0 on a one-rank engine (one rank, or
  // train.shard): the device and host bytes that kSuggestedStagingMib would save
  // (check_job_fits names that key when it is all a job lacks). 0 otherwise.
  int64_t chunked_staging_saves_device = 0;
  int64_t chunked_staging_saves_host = 0;
  // train.offload_parameters: the weights and their gradients in host memory, with two
  // units' gradient staging (weight_bytes and gradient_bytes are then the device's ring and
  // gradients in flight). By column (zenflow mode): the parameter tensors, and where unit
  // gradients that add to an earlier micro-batch's land (two slots of a unit's, with
  // accumulation).
  int64_t streamed_host_bytes = 0;
};

// The device_staging_mib the preflight suggests (and the advisor tries: kChunkedStagingMib).
constexpr int64_t kSuggestedStagingMib = 1024;

// Memory one rank of `spec` needs, from `described` (describe_model_from_spec: its config
// is the HF config.json the model is built from), `world_size` data-parallel ranks (host
// state is partitioned over them), the device kind and the weights' dtype size (2 or 4).
//   weights, gradients   parameters x weight_dtype_bytes each, on the device.
//   device optimizer     mode device: fp32 m + v (+ fp32 master when weights are 16-bit)
//                        for every parameter; zenflow: the same for the always-device
//                        parameters and for the top-k columns of the split ones, plus the
//                        device staging of split gradients (CUDA, or the CPU with W > 1).
//   host optimizer       modes offload (every parameter) and zenflow (2-D parameters with
//                        numel >= min_split_numel; the host owns every column of them until
//                        the first selection, so all of each is allocated, not 1 - topk):
//                        fp32 master, m, v and two accumulators, two transfer buffers of
//                        gradients and of the last gradient (+ two of weights when 16-bit),
//                        each 1/world_size of the split elements. As the engine allocates.
//   activations          a rough upper bound per micro-batch: micro_batch x seq_len x
//                        (layers x (16 x hidden + 4 x intermediate) x dtype bytes +
//                        vocab x 12 for logits, log-softmax and their gradient in fp32),
//                        plus layers x micro_batch x heads x seq_len^2 x (4 + dtype bytes)
//                        for the attention probabilities LibTorch 1.x keeps (eager
//                        attention; 2.x's fused attention does not). With
//                        train.activation_checkpointing: each layer's input (micro_batch x
//                        seq_len x hidden x dtype bytes) and one layer's worth of the above.
//   train.shard          (world_size > 1; sharded_parameters.h) gradients: the gradients and
//                        the device optimizer state 1/world_size, the weights kept whole beside
//                        this rank's rows, the engine's staging of its own rows only, and one
//                        unit's gradients for the reduce-scatter (shard_buffer_bytes);
//                        parameters: the weights 1/world_size too, and four of the largest
//                        unit's weights (the unit, its flat gather, the next one prefetched)
//                        instead. A unit: the embedding, a decoder layer, or the head.
//   train.offload_parameters (streamed_parameters.h) weights: two of the largest unit's (the
//                        ring); gradients: the most two consecutive units' hold; no device
//                        optimizer state or staging (the engine runs on the host). The host
//                        holds the weights, their gradients and two units' gradient staging
//                        (streamed_host_bytes) beside the host optimizer.
// On CUDA a random init is built in fp32 on the host first (init_host_bytes, freed before
// the optimizer allocates): total_host_bytes is the larger of it and the host optimizer. Sums saturate at
// INT64_MAX. Throws std::invalid_argument("model.config:
// ...") when the config describes no buildable model.
MemoryEstimate estimate_job_memory(const JobSpec& spec, const model::LoadedModel& described,
                                   int64_t world_size, bool device_is_cuda, int weight_dtype_bytes);

// Throws std::invalid_argument when the estimate exceeds what is available, naming the key
// that drives it, the estimate, its parts and the limit, e.g.
//   "model.config.num_hidden_layers: the job needs an estimated 3.2 TiB of host memory
//    (parameters 8.1e11: weights 3.0 TiB, gradients ..., optimizer state ... on the device
//    and ... on the host, activations ...), more than the 22.1 GiB available".
// available_host_bytes <= 0 or available_device_bytes <= 0: unknown, not checked. On the
// CPU the device is the host: only total_host_bytes (which counts both) is checked.
void check_job_fits(const JobSpec& spec, const MemoryEstimate& estimate, int64_t available_host_bytes,
                    int64_t available_device_bytes);

// Memory this process may still allocate: MemAvailable of /proc/meminfo, capped by the
// room left under the cgroup's limit (v2 memory.max - memory.current, v1
// memory.limit_in_bytes - memory.usage_in_bytes, at every level up to the root). 0 when
// none of these can be read.
int64_t available_host_memory_bytes();

// One line per setting that cannot take effect on this run, each starting with its key:
//   optimizer.host.threads   more than the cores left for it (plan_cores caps it at the
//                            process's cores minus one), or ignored (mode device, or
//                            reserved_cores given);
//   optimizer.host.reserved_cores  ignored in mode device;
//   optimizer.host.nodes     remote optimizer nodes are not implemented;
//   train.compute_threads    more threads than cores (they share them);
//   train.autocast           ignored on the CPU;
//   (cost.* is not checked here: `zenflow run` prices it and warns about an instance_type
//   that is not in the pricing catalog, common/pricing.h resolve_price);
//   resources.workers, resources.host_memory_gb, resources.priority  zenflow run does not use
//                            them (a coordinator does; none are given with ZENFLOW_SCHEDULED=1).
// available_cores: the cores this process may use (engine::available_cores().size(); with
// several ranks on a host, the rank's share as plan_cores computes it).
std::vector<std::string> preflight_warnings(const JobSpec& spec, bool device_is_cuda,
                                            int64_t available_cores);

// Throws std::invalid_argument for settings that cannot work on this device:
// train.dtype float16 or bfloat16 on the CPU when this LibTorch's CPU kernels cannot train
// in it (probed with a forward and backward of a tiny llama and gpt2; LibTorch 1.13 has no
// CPU fp16 matmul, softmax or norms, and supports bfloat16), e.g.
//   "train.dtype: float16 cannot train on the CPU with this LibTorch (1.13.0): ...".
void preflight_errors(const JobSpec& spec, bool device_is_cuda);

}  // namespace zenflow
