// profile.yaml: writing, and reading with key-path errors.
#include "common/advisor/job_profile.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <set>
#include <sstream>

#include "common/number_text.h"

namespace zenflow::advisor {

const std::vector<std::string> kStallCauses = {"host_optimizer", "transfer_d2h", "transfer_h2d",
                                               "network",        "allreduce",    "data"};

namespace {

// A node and its key path, for errors.
class Reader {
 public:
  Reader(const std::string& origin, std::string path, YAML::Node node)
      : origin_(origin), path_(std::move(path)), node_(std::move(node)) {}
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    std::string p = path_;
    if (!key.empty()) p += (p.empty() ? "" : ".") + key;
    throw ProfileError(origin_ + ": " + p + ": " + msg);
  }
  Reader child(const std::string& key) const {
    const YAML::Node n = node_[key];
    if (!n.IsDefined() || !n.IsMap()) fail(key, n.IsDefined() ? "must be a mapping" : "required");
    return Reader(origin_, path_.empty() ? key : path_ + "." + key, n);
  }
  bool has(const std::string& key) const { return node_[key].IsDefined() && !node_[key].IsNull(); }
  YAML::Node required(const std::string& key) const {
    const YAML::Node n = node_[key];
    if (!n.IsDefined()) fail(key, "required");
    return n;
  }
  std::string str(const std::string& key) const {
    const YAML::Node n = required(key);
    if (n.IsNull()) return "";
    if (!n.IsScalar()) fail(key, "must be a string");
    return n.Scalar();
  }
  double num(const std::string& key) const { return num_of(key, required(key)); }
  double num_of(const std::string& key, const YAML::Node& n) const {
    if (!n.IsScalar()) fail(key, "must be a number");
    double v = 0;
    const std::string error = parse_nonnegative_number(n.Scalar(), &v);
    if (!error.empty()) fail(key, error);
    return v;
  }
  int64_t integer(const std::string& key) const {
    const double v = num(key);
    if (v != std::floor(v)) fail(key, "must be an integer, got " + node_[key].Scalar());
    return static_cast<int64_t>(v);
  }
  std::vector<int64_t> ints(const std::string& key) const {
    const YAML::Node n = required(key);
    if (!n.IsSequence()) fail(key, "must be a sequence of integers");
    std::vector<int64_t> out;
    for (size_t i = 0; i < n.size(); ++i)
      out.push_back(static_cast<int64_t>(num_of(key + "[" + std::to_string(i) + "]", n[i])));
    return out;
  }
  // {int: number}
  std::map<int64_t, double> int_map(const std::string& key) const {
    const Reader r = child(key);
    std::map<int64_t, double> out;
    for (const auto& kv : r.node_) {
      const std::string k = kv.first.Scalar();
      char* end = nullptr;
      const long long i = std::strtoll(k.c_str(), &end, 10);
      if (k.empty() || end != k.c_str() + k.size() || i < 1) r.fail(k, "the key must be a count >= 1");
      out[i] = r.num_of(k, kv.second);
    }
    return out;
  }
  const YAML::Node& node() const { return node_; }

 private:
  const std::string& origin_;
  std::string path_;
  YAML::Node node_;
};

}  // namespace

std::string today_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

int64_t days_between(const std::string& from, const std::string& to) {
  auto parse = [](const std::string& s, std::tm* tm) {
    return s.size() == 10 && std::sscanf(s.c_str(), "%d-%d-%d", &tm->tm_year, &tm->tm_mon, &tm->tm_mday) == 3;
  };
  std::tm a{}, b{};
  if (!parse(from, &a) || !parse(to, &b)) return 0;
  a.tm_year -= 1900, b.tm_year -= 1900, a.tm_mon -= 1, b.tm_mon -= 1;
  return static_cast<int64_t>(std::llround(std::difftime(timegm(&b), timegm(&a)) / 86400.0));
}

std::string JobProfile::to_yaml() const {
  YAML::Emitter e;
  e.SetDoublePrecision(6);
  e << YAML::Comment("zenflow job profile: zenflow run --profile; read by zenflow advise");
  e << YAML::BeginMap;
  e << YAML::Key << "zenflow_profile" << YAML::Value << version;
  e << YAML::Key << "job" << YAML::Value << job;
  e << YAML::Key << "measured_on" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "host" << YAML::Value << measured_on.host;
  e << YAML::Key << "cpu_model" << YAML::Value << measured_on.cpu_model;
  e << YAML::Key << "cores" << YAML::Value << measured_on.cores;
  e << YAML::Key << "gpu" << YAML::Value;
  if (measured_on.gpu.empty())
    e << YAML::Null;
  else
    e << measured_on.gpu;
  e << YAML::Key << "device" << YAML::Value << measured_on.device;
  e << YAML::Key << "date" << YAML::Value << measured_on.date;
  e << YAML::Key << "zenflow_version" << YAML::Value << measured_on.zenflow_version;
  e << YAML::EndMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "arch" << YAML::Value << model.arch;
  e << YAML::Key << "parameters" << YAML::Value << model.parameters;
  e << YAML::Key << "split_parameters" << YAML::Value << model.split_parameters;
  e << YAML::Key << "layers" << YAML::Value << model.layers;
  e << YAML::Key << "hidden" << YAML::Value << model.hidden;
  e << YAML::Key << "vocab" << YAML::Value << model.vocab;
  e << YAML::Key << "weight_dtype_bytes" << YAML::Value << model.weight_dtype_bytes;
  e << YAML::EndMap;
  e << YAML::Key << "run" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "mode" << YAML::Value << run.mode;
  e << YAML::Key << "micro_batch" << YAML::Value << run.micro_batch;
  e << YAML::Key << "grad_accum" << YAML::Value << run.grad_accum;
  e << YAML::Key << "seq_len" << YAML::Value << run.seq_len;
  e << YAML::Key << "world_size" << YAML::Value << run.world_size;
  e << YAML::Key << "update_interval" << YAML::Value << run.update_interval;
  e << YAML::Key << "topk_ratio" << YAML::Value << run.topk_ratio;
  e << YAML::Key << "host_threads" << YAML::Value << run.host_threads;
  e << YAML::Key << "compute_threads" << YAML::Value << run.compute_threads;
  e << YAML::Key << "steps" << YAML::Value << run.steps;
  e << YAML::Key << "host_cores" << YAML::Value << YAML::Flow << run.host_cores;
  e << YAML::Key << "compute_cores" << YAML::Value << YAML::Flow << run.compute_cores;
  e << YAML::EndMap;
  e << YAML::Key << "step" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "steps_measured" << YAML::Value << step.steps_measured;
  e << YAML::Key << "tokens_per_step" << YAML::Value << step.tokens_per_step;
  e << YAML::Key << "step_seconds" << YAML::Value << step.step_seconds;
  e << YAML::Key << "compute_seconds" << YAML::Value << step.compute_seconds;
  e << YAML::Key << "device_optimizer_seconds" << YAML::Value << step.device_optimizer_seconds;
  e << YAML::Key << "other_seconds" << YAML::Value << step.other_seconds;
  e << YAML::Key << "stall_seconds" << YAML::Value << YAML::BeginMap;
  for (const std::string& c : kStallCauses) {
    auto it = step.stall_seconds.find(c);
    e << YAML::Key << c << YAML::Value << (it == step.stall_seconds.end() ? 0.0 : it->second);
  }
  e << YAML::EndMap;
  e << YAML::Key << "transfer_bytes" << YAML::Value << YAML::Flow << YAML::BeginMap << YAML::Key << "d2h"
    << YAML::Value << step.d2h_bytes << YAML::Key << "h2d" << YAML::Value << step.h2d_bytes << YAML::EndMap;
  e << YAML::Key << "collective_bytes" << YAML::Value << YAML::Flow << YAML::BeginMap;
  for (const char* k : {"gradients", "selection", "parameters"}) {
    auto it = step.collective_bytes.find(k);
    e << YAML::Key << k << YAML::Value << (it == step.collective_bytes.end() ? int64_t{0} : it->second);
  }
  e << YAML::EndMap;
  e << YAML::Key << "gemm_share" << YAML::Value << step.gemm_share;
  e << YAML::Key << "boundary_step_seconds" << YAML::Value << step.boundary_step_seconds;
  e << YAML::Key << "accumulation_step_seconds" << YAML::Value << step.accumulation_step_seconds;
  if (step.host_step_seconds >= 0) e << YAML::Key << "host_step_seconds" << YAML::Value << step.host_step_seconds;
  e << YAML::EndMap;
  e << YAML::Key << "probes" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "gemm_gflops" << YAML::Value << YAML::Flow << probes.gemm_gflops;
  if (probes.gemm_gflops_twice_the_tokens > 0)
    e << YAML::Key << "gemm_gflops_twice_the_tokens" << YAML::Value << probes.gemm_gflops_twice_the_tokens;
  e << YAML::Key << "device_adamw_elements_per_second" << YAML::Value
    << probes.device_adamw_elements_per_second;
  e << YAML::Key << "d2h_gbps" << YAML::Value << probes.d2h_gbps;
  e << YAML::Key << "h2d_gbps" << YAML::Value << probes.h2d_gbps;
  e << YAML::Key << "device_memory_gbps" << YAML::Value << probes.device_memory_gbps;
  e << YAML::Key << "host_adam_elements_per_second" << YAML::Value << YAML::Flow
    << probes.host_adam_elements_per_second;
  e << YAML::EndMap;
  e << YAML::Key << "activation_bytes" << YAML::Value << activation_bytes;
  e << YAML::Key << "memory" << YAML::Value << YAML::BeginMap;
  for (const auto& [mode, m] : memory) {
    e << YAML::Key << mode << YAML::Value << YAML::Flow << YAML::BeginMap;
    e << YAML::Key << "host_bytes_per_parameter" << YAML::Value << m.host_bytes_per_parameter;
    e << YAML::Key << "device_bytes_per_parameter" << YAML::Value << m.device_bytes_per_parameter;
    e << YAML::Key << "host_partitioned" << YAML::Value << m.host_partitioned;
    e << YAML::Key << "device_partitioned" << YAML::Value << m.device_partitioned;
    e << YAML::EndMap;
  }
  e << YAML::EndMap;
  e << YAML::EndMap;
  return std::string(e.c_str()) + "\n";
}

JobProfile JobProfile::parse(const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& ex) {
    throw ProfileError(origin + ": line " + std::to_string(ex.mark.line + 1) + ": " + ex.msg);
  }
  if (!root.IsMap()) throw ProfileError(origin + ": must be a mapping (a zenflow profile.yaml)");
  const Reader r(origin, "", root);
  JobProfile p;
  const int64_t version = r.integer("zenflow_profile");
  if (version != kProfileVersion)
    r.fail("zenflow_profile",
           "version " + std::to_string(version) + " is not the version this zenflow reads (" +
               std::to_string(kProfileVersion) + "); re-profile the job with this zenflow");
  p.job = r.str("job");
  const Reader on = r.child("measured_on");
  p.measured_on.host = on.str("host");
  p.measured_on.cpu_model = on.str("cpu_model");
  p.measured_on.cores = on.integer("cores");
  p.measured_on.gpu = on.str("gpu");
  p.measured_on.device = on.str("device");
  if (p.measured_on.device != "cpu" && p.measured_on.device != "cuda")
    on.fail("device", "must be cpu or cuda, got " + p.measured_on.device);
  p.measured_on.date = on.str("date");
  if (days_between(p.measured_on.date, p.measured_on.date) != 0 || p.measured_on.date.size() != 10)
    on.fail("date", "must be a date YYYY-MM-DD, got " + p.measured_on.date);
  p.measured_on.zenflow_version = on.str("zenflow_version");
  const Reader m = r.child("model");
  p.model.arch = m.str("arch");
  p.model.parameters = m.integer("parameters");
  if (p.model.parameters <= 0) m.fail("parameters", "must be > 0");
  p.model.split_parameters = m.integer("split_parameters");
  if (p.model.split_parameters > p.model.parameters) m.fail("split_parameters", "must be <= parameters");
  p.model.layers = m.integer("layers");
  p.model.hidden = m.integer("hidden");
  p.model.vocab = m.integer("vocab");
  p.model.weight_dtype_bytes = m.integer("weight_dtype_bytes");
  const Reader run = r.child("run");
  p.run.mode = run.str("mode");
  if (p.run.mode != "device" && p.run.mode != "offload" && p.run.mode != "zenflow")
    run.fail("mode", "must be device, offload or zenflow, got " + p.run.mode);
  p.run.micro_batch = run.integer("micro_batch");
  p.run.grad_accum = run.integer("grad_accum");
  p.run.seq_len = run.integer("seq_len");
  p.run.world_size = run.integer("world_size");
  if (p.run.micro_batch < 1 || p.run.grad_accum < 1 || p.run.seq_len < 1 || p.run.world_size < 1)
    run.fail("", "micro_batch, grad_accum, seq_len and world_size must be >= 1");
  p.run.update_interval = std::max<int64_t>(1, run.integer("update_interval"));
  p.run.topk_ratio = run.num("topk_ratio");
  if (p.run.topk_ratio > 1) run.fail("topk_ratio", "must be in [0, 1]");
  p.run.host_threads = run.integer("host_threads");
  p.run.compute_threads = run.integer("compute_threads");
  p.run.steps = run.integer("steps");
  p.run.host_cores = run.ints("host_cores");
  p.run.compute_cores = run.ints("compute_cores");
  const Reader s = r.child("step");
  p.step.steps_measured = s.integer("steps_measured");
  p.step.tokens_per_step = s.integer("tokens_per_step");
  p.step.step_seconds = s.num("step_seconds");
  if (p.step.step_seconds <= 0) s.fail("step_seconds", "must be > 0");
  p.step.compute_seconds = s.num("compute_seconds");
  p.step.device_optimizer_seconds = s.num("device_optimizer_seconds");
  p.step.other_seconds = s.num("other_seconds");
  const Reader stall = s.child("stall_seconds");
  for (const std::string& c : kStallCauses) p.step.stall_seconds[c] = stall.num(c);
  const Reader tb = s.child("transfer_bytes");
  p.step.d2h_bytes = tb.integer("d2h");
  p.step.h2d_bytes = tb.integer("h2d");
  const Reader cb = s.child("collective_bytes");
  for (const char* k : {"gradients", "selection", "parameters"}) p.step.collective_bytes[k] = cb.integer(k);
  p.step.gemm_share = s.num("gemm_share");
  if (p.step.gemm_share > 1) s.fail("gemm_share", "must be in [0, 1]");
  p.step.boundary_step_seconds = s.num("boundary_step_seconds");
  p.step.accumulation_step_seconds = s.num("accumulation_step_seconds");
  p.step.host_step_seconds = s.has("host_step_seconds") ? s.num("host_step_seconds") : -1;  // optional
  const Reader pr = r.child("probes");
  p.probes.gemm_gflops = pr.int_map("gemm_gflops");
  if (pr.has("gemm_gflops_twice_the_tokens")) {  // optional: older profiles lack it
    p.probes.gemm_gflops_twice_the_tokens = pr.num("gemm_gflops_twice_the_tokens");
    if (p.probes.gemm_gflops_twice_the_tokens <= 0) pr.fail("gemm_gflops_twice_the_tokens", "must be > 0");
  }
  p.probes.device_adamw_elements_per_second = pr.num("device_adamw_elements_per_second");
  p.probes.d2h_gbps = pr.num("d2h_gbps");
  p.probes.h2d_gbps = pr.num("h2d_gbps");
  p.probes.device_memory_gbps = pr.num("device_memory_gbps");
  p.probes.host_adam_elements_per_second = pr.int_map("host_adam_elements_per_second");
  p.activation_bytes = r.num("activation_bytes");
  const Reader mem = r.child("memory");
  for (const char* mode : {"device", "offload", "zenflow"}) {
    const Reader mm = mem.child(mode);
    ModeMemory x{mm.num("host_bytes_per_parameter"), mm.num("device_bytes_per_parameter"),
                 mm.num("host_partitioned"), mm.num("device_partitioned")};
    if (x.host_partitioned > x.host_bytes_per_parameter)
      mm.fail("host_partitioned", "must be <= host_bytes_per_parameter");
    if (x.device_partitioned > x.device_bytes_per_parameter)
      mm.fail("device_partitioned", "must be <= device_bytes_per_parameter");
    p.memory[mode] = x;
  }
  return p;
}

JobProfile JobProfile::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ProfileError(path + ": cannot read the profile");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

}  // namespace zenflow::advisor
