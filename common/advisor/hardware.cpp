// GPU table, PCIe constants, and the instances the model runs on.
#include "common/advisor/hardware.h"

#include <algorithm>
#include <cmath>

namespace zenflow::advisor {

const char* origin_name(Origin o) {
  switch (o) {
    case Origin::kMeasured:
      return "measured";
    case Origin::kCatalog:
      return "catalog";
    case Origin::kAssumed:
      return "assumed";
  }
  return "?";
}

namespace {

// Peak dense BF16 Tensor Core throughput and memory bandwidth, from NVIDIA's public datasheets.
constexpr GpuSpec kGpus[] = {
    {"A10G", 125, 600, "NVIDIA A10 datasheet (125 TFLOPS dense BF16, 600 GB/s); the A10G is AWS G5's variant"},
    {"L4", 121, 300, "NVIDIA L4 datasheet (121 TFLOPS dense BF16, 300 GB/s)"},
    {"L40S", 362, 864, "NVIDIA L40S datasheet (362 TFLOPS dense BF16, 864 GB/s)"},
    {"A100-SXM4-40GB", 312, 1555, "NVIDIA A100 datasheet (312 TFLOPS dense BF16; 40 GB HBM2, 1,555 GB/s)"},
    {"A100-SXM4-80GB", 312, 2039, "NVIDIA A100 datasheet (312 TFLOPS dense BF16; 80 GB SXM HBM2e, 2,039 GB/s)"},
    {"A100", 312, 1935, "NVIDIA A100 datasheet (312 TFLOPS dense BF16; 80 GB PCIe HBM2e, 1,935 GB/s)"},
    {"H100-SXM", 989, 3350, "NVIDIA H100 datasheet (SXM: 989 TFLOPS dense BF16, 3.35 TB/s)"},
    {"H100", 756, 2000, "NVIDIA H100 datasheet (PCIe: 756 TFLOPS dense BF16, 2 TB/s)"},
    {"H200", 989, 4800, "NVIDIA H200 datasheet (989 TFLOPS dense BF16, 4.8 TB/s; 769-798 measured on an H200 host)"},
    {"GH200", 989, 4000, "NVIDIA GH200 Grace Hopper datasheet (H100-class 989 TFLOPS dense BF16, 4 TB/s HBM3)"},
};

Sourced assumed(double v, const std::string& why) { return {v, Origin::kAssumed, why}; }
Sourced catalog(double v, const std::string& src) { return {v, Origin::kCatalog, src}; }
Sourced measured(double v, const std::string& host) { return {v, Origin::kMeasured, host}; }

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

}  // namespace

const GpuSpec* find_gpu_spec(const std::string& model) {
  for (const GpuSpec& g : kGpus)
    if (model.rfind(g.prefix, 0) == 0) return &g;
  return nullptr;
}

Sourced Instance::host_adam_rate(double cores, double mem_share, const JobProfile& profile) const {
  cores = std::max(cores, 1.0);
  // The memory roof: 28 B per element (fp32 p, m, v read and written, the gradient read).
  const double roof = host_mem_bw_gbps.value * 1e9 * std::clamp(mem_share, 1e-6, 1.0) / 28.0;
  const std::map<int64_t, double>& curve =
      host_adam_measured.empty() ? profile.probes.host_adam_elements_per_second : host_adam_measured;
  const std::string src =
      host_adam_measured.empty() ? "profile probe on " + profile.measured_on.host : host_adam_source;
  if (curve.empty())
    return assumed(std::min(cores * 1.5e9, roof), "1.5 G elem/s per core, capped by the memory roof (an assumed rate: no probe of this host; zenflow profile-host measures it)");
  // Within the measured range: interpolate; beyond it: the last per-core rate, capped by the roof.
  auto lo = curve.begin();
  for (auto it = curve.begin(); it != curve.end(); ++it)
    if (static_cast<double>(it->first) <= cores) lo = it;
  auto hi = std::next(lo);
  double rate;
  if (cores <= static_cast<double>(lo->first) || hi == curve.end()) {
    rate = lo->second * cores / static_cast<double>(lo->first);
  } else {
    const double t = (cores - static_cast<double>(lo->first)) / static_cast<double>(hi->first - lo->first);
    rate = lo->second + t * (hi->second - lo->second);
  }
  const bool extrapolated = cores > static_cast<double>(curve.rbegin()->first) + 1e-9;
  Sourced s{std::min(rate, extrapolated ? roof : rate), Origin::kMeasured, src};
  if (extrapolated || !host_adam_measured.empty() || cpu_device) {
    if (extrapolated)
      s.source += " (per-core rate scaled to " + std::to_string(static_cast<int>(cores)) +
                  " cores, capped by " + origin_name(host_mem_bw_gbps.origin) + " memory bandwidth)";
  }
  if (extrapolated && host_mem_bw_gbps.origin == Origin::kAssumed && rate > roof) s.origin = Origin::kAssumed;
  return s;
}

Instance instance_from_catalog(const InstancePrice& row, const std::string& today) {
  Instance in;
  in.name = row.name;
  in.gpu_model = row.gpu_model;
  in.gpus = row.gpu_count;
  in.gpu_memory_gib = row.gpu_memory_gib.value_or(0);
  in.host_ram_gib = row.ram_gib.value_or(0);
  in.physical_cores = row.vcpus ? std::max<int64_t>(1, *row.vcpus / 2) : 0;
  const std::string src = row.source + " (" + row.date + ")";
  if (const GpuSpec* g = find_gpu_spec(row.gpu_model)) {
    in.peak_tflops = catalog(g->peak_bf16_tflops, g->source);
    in.hbm_gbps = catalog(g->hbm_gbps, g->source);
  } else {
    in.peak_tflops = assumed(100, "unknown GPU model " + row.gpu_model);
    in.hbm_gbps = assumed(1000, "unknown GPU model " + row.gpu_model);
  }
  // PCIe, docs/benchmarks.md §5: Gen4 25 GB/s each way [src nvbandwidth #42]; Gen5 (H100) D2H 52.8,
  // H2D 35.2 [src nvbandwidth #24]; both at once, H2D ~11 while D2H holds ~25 [src #53].
  const int64_t gen = row.pcie_gen.value_or(0);
  if (gen >= 5) {
    in.h2d_gbps = catalog(35.2, "PCIe Gen5 (catalog pcie_gen 5): nvbandwidth #24 H100 SM copy");
    in.d2h_gbps = catalog(52.8, "PCIe Gen5 (catalog pcie_gen 5): nvbandwidth #24 H100 SM copy");
  } else if (gen == 4) {
    in.h2d_gbps = catalog(25, "PCIe Gen4 (catalog pcie_gen 4): nvbandwidth #42");
    in.d2h_gbps = catalog(25, "PCIe Gen4 (catalog pcie_gen 4): nvbandwidth #42");
  } else {
    const bool h = has(row.gpu_model, "H100") || has(row.gpu_model, "H200");
    in.h2d_gbps = assumed(h ? 35.2 : 25, std::string("pcie_gen unknown: Gen") + (h ? "5" : "4") + " assumed");
    in.d2h_gbps = assumed(h ? 52.8 : 25, std::string("pcie_gen unknown: Gen") + (h ? "5" : "4") + " assumed");
  }
  in.bidir_factor = assumed(0.72, "both directions at once: 36 of 50 GB/s on Gen4 (nvbandwidth #53)");
  const bool nvswitch = row.gpu_count >= 2 && (has(row.gpu_model, "SXM") || has(row.gpu_model, "H200"));
  if (nvswitch && has(row.gpu_model, "A100"))
    in.busbw_gbps = assumed(230, "NVLink3 / NVSwitch A100 all-reduce bus bandwidth: an assumed figure, not measured here");
  else if (nvswitch)
    in.busbw_gbps = assumed(370, "NVLink4 ring busbw ~370 GB/s (nccl-tests #212)");
  else
    in.busbw_gbps = assumed(20, "PCIe-only GPUs: ~20 GB/s ring busbw");
  // Host memory bandwidth: not in any catalog (docs/benchmarks.md §5): 6 GB/s per physical core up to
  // 450 GB/s (two sockets of 8-channel DDR5), assumed.
  in.host_mem_bw_gbps =
      assumed(std::min(450.0, 6.0 * static_cast<double>(std::max<int64_t>(1, in.physical_cores))),
              "6 GB/s per physical core, at most 450 GB/s");
  if (row.on_demand_usd_per_hour) {
    in.has_price = true;
    in.usd_per_hour = catalog(*row.on_demand_usd_per_hour, src);
  }
  in.price_date = row.date;
  in.price_verified = row.verified;
  const int64_t age = days_between(row.date, today);
  if (in.has_price && age > 90)
    in.flags.push_back("price is " + std::to_string(age) + " days old (" + row.date + ")");
  if (in.has_price && !row.verified) in.flags.push_back("price not verified (" + row.source + ")");
  if (row.measured) {
    const MeasuredHost& m = *row.measured;
    const std::string host = "measured on " + m.host + " (" + m.date + ")";
    if (m.h2d_gbps) in.h2d_gbps = measured(*m.h2d_gbps, host);
    if (m.d2h_gbps) in.d2h_gbps = measured(*m.d2h_gbps, host);
    if (m.bidir_gbps && m.h2d_gbps && m.d2h_gbps)
      in.bidir_factor = measured(*m.bidir_gbps / (*m.h2d_gbps + *m.d2h_gbps), host);
    if (m.bf16_tflops) in.peak_tflops = measured(*m.bf16_tflops, host);
    if (m.mem_bw_gbps) in.host_mem_bw_gbps = measured(*m.mem_bw_gbps, host);
    for (const auto& [c, eps] : m.host_adam_elements_per_second) in.host_adam_measured[c] = eps;
    in.host_adam_source = host;
  }
  return in;
}

Instance local_instance(const JobProfile& p, const InstancePrice* row) {
  Instance in;
  in.name = "local";
  in.cpu_device = p.measured_on.device == "cpu";
  in.gpu_model = in.cpu_device ? "cpu" : p.measured_on.gpu;
  in.gpus = in.cpu_device ? 0 : 1;
  in.physical_cores = p.measured_on.cores;
  const std::string host = "profile probe on " + p.measured_on.host + " (" + p.measured_on.date + ")";
  double best_gemm = 0;
  for (const auto& [t, g] : p.probes.gemm_gflops) best_gemm = std::max(best_gemm, g);
  in.peak_tflops = measured(best_gemm / 1e3, host);
  in.hbm_gbps = measured(p.probes.device_memory_gbps, host);
  in.h2d_gbps = measured(p.probes.h2d_gbps, host);
  in.d2h_gbps = measured(p.probes.d2h_gbps, host);
  in.bidir_factor = assumed(in.cpu_device ? 1.0 : 0.72, in.cpu_device ? "CPU copies" : "Gen4 default");
  in.busbw_gbps = assumed(in.cpu_device ? 10 : 20, "local ranks");
  in.host_mem_bw_gbps = measured(p.probes.device_memory_gbps, host);
  in.gpu_memory_gib = 0;
  in.host_ram_gib = 0;
  if (row) {
    Instance c = instance_from_catalog(*row, today_utc());
    c.name = "local";
    c.cpu_device = in.cpu_device;
    if (in.cpu_device) c.gpus = 0;
    if (!row->measured || !row->measured->mem_bw_gbps) c.host_mem_bw_gbps = in.host_mem_bw_gbps;
    if (!row->measured || !row->measured->d2h_gbps) c.d2h_gbps = in.d2h_gbps, c.h2d_gbps = in.h2d_gbps;
    if (!row->measured || !row->measured->bf16_tflops) c.peak_tflops = in.peak_tflops;
    c.hbm_gbps = in.hbm_gbps;
    if (c.physical_cores == 0) c.physical_cores = in.physical_cores;
    return c;
  }
  return in;
}

}  // namespace zenflow::advisor
