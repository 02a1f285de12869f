// The GPU instance pricing catalog (deploy/pricing.yaml) and the cost arithmetic of a run.
//
// A catalog is a YAML mapping with one key, `instances`: a sequence of rows, each with the
// keys below (every key required, null where unknown, except `note`, `region`). Loading
// rejects, naming the file and the key path (`deploy/pricing.yaml:
// instances[3].on_demand_usd_per_hour: must be >= 0, got -1`): an unknown key, a missing
// key, a row without `source` or `date`, a negative or non-finite number, a spot range
// with min > max, a duplicate name. The one optional mapping, `measured`, holds constants
// measured on the machine (MeasuredHost: date, host, h2d_gbps, d2h_gbps, bidir_gbps,
// bf16_tflops, mem_bw_gbps, host_adam_elements_per_second {cores: elem/s}). `merge` applies a user override file by name: its rows
// replace rows of the same name or are added.
//
// Cost: a job is charged its share of the instance, gpus_used / gpu_count of the instance
// (a 2-GPU job on an 8-GPU p4d pays 2/8 of its price). gpus_used 0 (a CPU run) or an
// instance of 0 GPUs is charged the whole instance: the job occupies the machine, not a
// GPU of it. gpus_used above the instance's count is charged the whole instance too. A
// price given directly (cost.usd_per_hour) is the job's own rate: charged in full.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <utility>
#include <string>
#include <vector>

#include "common/job_spec.h"

namespace zenflow {

// "FILE: key.path: message".
class PricingError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SpotRange {
  double min = 0;
  double max = 0;
};

// Constants measured on the machine itself (`zenflow profile-host` writes them): they beat
// the catalog's specs and the advisor's assumed defaults (common/advisor/hardware.h).
struct MeasuredHost {
  std::string date;                       // YYYY-MM-DD (required)
  std::string host;                       // CPU model, cores, GPU (required)
  std::optional<double> h2d_gbps;         // pinned host->device, one direction
  std::optional<double> d2h_gbps;         // pinned device->host, one direction
  std::optional<double> bidir_gbps;       // both directions at once, their sum
  std::optional<double> bf16_tflops;      // dense bf16 GEMM on one GPU
  std::optional<double> mem_bw_gbps;      // host streaming bandwidth, every core
  std::vector<std::pair<int64_t, double>> host_adam_elements_per_second;  // (cores, elem/s), ascending cores
};

struct InstancePrice {
  std::string name;                   // the cloud's instance type, e.g. p4d.24xlarge
  std::string provider;               // aws, gcp, azure, lambda, onprem, ...
  std::optional<std::string> region;  // where the price was read
  std::string gpu_model;
  int64_t gpu_count = 0;
  std::optional<double> gpu_memory_gib;
  std::optional<int64_t> vcpus;
  std::optional<double> ram_gib;
  std::optional<double> nic_gbps;
  std::optional<int64_t> pcie_gen;
  std::optional<double> on_demand_usd_per_hour;  // null: no price known (e.g. "verify")
  std::optional<SpotRange> spot_usd_per_hour;
  std::string source;  // where the numbers come from (required, non-empty)
  std::string date;    // YYYY-MM-DD the numbers were collected (required)
  bool verified = false;  // false: [recall] / ≈ / "verify" values
  std::optional<std::string> note;
  std::optional<MeasuredHost> measured;  // optional key `measured` (see MeasuredHost)
};

class PricingCatalog {
 public:
  // `origin` names the text in errors (the file path).
  static PricingCatalog parse(const std::string& yaml_text, const std::string& origin);
  static PricingCatalog load(const std::string& path);  // PricingError if unreadable too

  // Rows of `overrides` replace the rows of the same name, or are appended.
  void merge(const PricingCatalog& overrides);
  const InstancePrice* find_instance(const std::string& name) const;  // nullptr if absent
  const std::vector<InstancePrice>& instances() const { return rows_; }

 private:
  std::vector<InstancePrice> rows_;
};

// The fraction of the instance a job is charged (see the header comment). Inline: the
// worker metrics use it without linking the catalog. std::invalid_argument if negative.
inline double instance_share(int64_t gpus_used, int64_t gpus_of_instance) {
  if (gpus_used < 0 || gpus_of_instance < 0) throw std::invalid_argument("GPU counts must be >= 0");
  if (gpus_used == 0 || gpus_of_instance == 0 || gpus_used >= gpus_of_instance) return 1.0;
  return static_cast<double>(gpus_used) / static_cast<double>(gpus_of_instance);
}
// usd_per_hour × share × seconds / 3600. std::invalid_argument on negative or non-finite input.
double usd_for(double seconds, double usd_per_hour, int64_t gpus_used, int64_t gpus_of_instance);
// usd × 1e6 / tokens; nullopt when tokens <= 0.
std::optional<double> usd_per_million_tokens(double usd, int64_t tokens);
// What the exposed stall seconds cost: usd_for(stall seconds, ...).
double usd_lost_to_stalls(double exposed_stall_seconds, double usd_per_hour, int64_t gpus_used,
                          int64_t gpus_of_instance);

// The price a job runs at, from its cost section and the catalog.
struct ResolvedPrice {
  bool priced = false;           // false: no cost is computed
  double usd_per_hour = 0;       // of the instance (or the spec's own rate)
  int64_t gpus_of_instance = 0;  // 0: charged in full (a spec rate, or an instance without GPUs)
  std::string instance;          // cost.instance_type ("" when not given)
  std::string source;            // "cost.usd_per_hour" or the catalog row's source
  std::string date;              // the catalog row's date ("" for a spec rate)
  bool verified = true;
};
// cost.usd_per_hour if given, else cost.instance_type looked up in `catalog` (may be null).
// Appends to `warnings` (one line naming the key) when cost.instance_type is set but is not
// in the catalog or has no price there; nothing when the cost section is empty.
ResolvedPrice resolve_price(const CostSpec& cost, const PricingCatalog* catalog,
                            std::vector<std::string>* warnings);

}  // namespace zenflow
