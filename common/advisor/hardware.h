// The hardware constants of an instance the step-time model runs on, each with where it
// came from: measured (a profile's probes, `zenflow profile-host`), catalog (a
// deploy/pricing.yaml row, with its source) or assumed (a default of this file, flagged in
// every answer that uses it).
//
// instance_from_catalog() joins a pricing row with the GPU table below (peak dense bf16,
// HBM bandwidth, each from its datasheet) and the per-generation PCIe constants
// (docs/benchmarks.md §5); a row's `measured` block beats both. local_instance() is the
// machine a profile was measured on, from its probes: the CPU is the device there.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/advisor/job_profile.h"
#include "common/pricing.h"

namespace zenflow::advisor {

enum class Origin { kMeasured, kCatalog, kAssumed };
const char* origin_name(Origin origin);  // "measured", "catalog", "assumed"

// A number and its provenance.
struct Sourced {
  double value = 0;
  Origin origin = Origin::kAssumed;
  std::string source;  // the catalog's source, the measuring host, or why it is assumed
};

struct GpuSpec {
  const char* prefix;  // matches the start of a catalog gpu_model
  double peak_bf16_tflops;
  double hbm_gbps;
  const char* source;
};
// nullptr when no entry matches `gpu_model`.
const GpuSpec* find_gpu_spec(const std::string& gpu_model);

struct Instance {
  std::string name;  // the catalog name, or "local"
  std::string gpu_model;
  int64_t gpus = 0;  // 0: the device is the CPU (a local CPU host)
  bool cpu_device = false;
  double gpu_memory_gib = 0;  // per GPU (the local CPU device: host RAM)
  double host_ram_gib = 0;
  int64_t physical_cores = 0;  // host cores (vCPUs / 2 on cloud rows: assumed SMT 2)
  Sourced peak_tflops, hbm_gbps, h2d_gbps, d2h_gbps, bidir_factor, busbw_gbps, host_mem_bw_gbps;
  // Host AdamW elements/s by core count where measured (a catalog row's `measured` block,
  // or the profile's probe on its own host); else per_core × cores up to the memory roof.
  std::map<int64_t, double> host_adam_measured;
  std::string host_adam_source;
  bool has_price = false;
  Sourced usd_per_hour;
  std::string price_date;
  bool price_verified = true;
  std::vector<std::string> flags;  // price older than 90 days, unverified price, ...

  // Host AdamW elements/s on `cores` cores of a rank whose share of the host memory
  // bandwidth is `mem_share` (0..1], and where the figure came from.
  Sourced host_adam_rate(double cores, double mem_share, const JobProfile& profile) const;
};

// `today` (YYYY-MM-DD) ages the price: older than 90 days is flagged.
Instance instance_from_catalog(const InstancePrice& row, const std::string& today);
// The profile's own host: its probes are the constants (the CPU device on a CPU host).
// A `measured` catalog row (e.g. `zenflow profile-host` output) may override them.
Instance local_instance(const JobProfile& profile, const InstancePrice* measured_row);

}  // namespace zenflow::advisor
