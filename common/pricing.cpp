// The pricing catalog: loading, validation, merging; the cost arithmetic.
#include "common/pricing.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "common/number_text.h"

namespace zenflow {
namespace {

class RowReader {
 public:
  RowReader(const std::string& origin, const std::string& path, const YAML::Node& node)
      : origin_(origin), path_(path), node_(node) {}

  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    throw PricingError(origin_ + ": " + path_ + (key.empty() ? "" : "." + key) + ": " + msg);
  }

  // Every key of the row must be one of `known`.
  void check_keys(const std::set<std::string>& known) const {
    for (const auto& kv : node_) {
      const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      if (!known.count(k)) fail(k, "unknown key");
    }
  }

  YAML::Node required(const std::string& key) const {
    const YAML::Node n = node_[key];
    if (!n.IsDefined()) fail(key, "required");
    return n;
  }

  std::string string(const std::string& key) const {
    const YAML::Node n = required(key);
    if (!n.IsScalar() || n.Scalar().empty()) fail(key, "must be a non-empty string");
    return n.Scalar();
  }

  std::optional<std::string> optional_string(const std::string& key) const {
    const YAML::Node n = node_[key];
    if (!n.IsDefined() || n.IsNull()) return std::nullopt;
    if (!n.IsScalar()) fail(key, "must be a string or null");
    return n.Scalar();
  }

  // A finite number >= 0, or null.
  std::optional<double> number(const std::string& key, const YAML::Node& n) const {
    if (n.IsNull()) return std::nullopt;
    if (!n.IsScalar()) fail(key, "must be a number or null");
    double v = 0;
    const std::string error = parse_nonnegative_number(n.Scalar(), &v);
    if (!error.empty()) fail(key, error);
    return v;
  }
  std::optional<double> number(const std::string& key) const { return number(key, required(key)); }

  std::optional<int64_t> integer(const std::string& key) const {
    const YAML::Node n = required(key);
    if (n.IsNull()) return std::nullopt;
    if (!n.IsScalar()) fail(key, "must be an integer or null");
    const std::string& s = n.Scalar();
    errno = 0;
    char* end = nullptr;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE) fail(key, "must be an integer, got " + s);
    if (v < 0) fail(key, "must be >= 0, got " + s);
    return static_cast<int64_t>(v);
  }

  bool boolean(const std::string& key) const {
    const YAML::Node n = required(key);
    bool b = false;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, b)) fail(key, "must be true or false");
    return b;
  }

  const YAML::Node& node() const { return node_; }

 private:
  const std::string& origin_;
  std::string path_;
  YAML::Node node_;
};

bool is_date(const std::string& s) {
  if (s.size() != 10 || s[4] != '-' || s[7] != '-') return false;
  for (size_t i : {0, 1, 2, 3, 5, 6, 8, 9})
    if (s[i] < '0' || s[i] > '9') return false;
  const int month = std::stoi(s.substr(5, 2)), day = std::stoi(s.substr(8, 2));
  return month >= 1 && month <= 12 && day >= 1 && day <= 31;
}

InstancePrice parse_row(const std::string& origin, const std::string& path, const YAML::Node& node) {
  RowReader r(origin, path, node);
  if (!node.IsMap()) r.fail("", "must be a mapping");
  r.check_keys({"name", "provider", "region", "gpu_model", "gpu_count", "gpu_memory_gib", "vcpus", "ram_gib",
                "nic_gbps", "pcie_gen", "on_demand_usd_per_hour", "spot_usd_per_hour", "source", "date",
                "verified", "note", "measured"});
  InstancePrice p;
  p.name = r.string("name");
  p.provider = r.string("provider");
  p.region = r.optional_string("region");
  p.gpu_model = r.string("gpu_model");
  const auto gpus = r.integer("gpu_count");
  if (!gpus) r.fail("gpu_count", "must be an integer (0 for a CPU instance), got null");
  p.gpu_count = *gpus;
  p.gpu_memory_gib = r.number("gpu_memory_gib");
  p.vcpus = r.integer("vcpus");
  p.ram_gib = r.number("ram_gib");
  p.nic_gbps = r.number("nic_gbps");
  p.pcie_gen = r.integer("pcie_gen");
  p.on_demand_usd_per_hour = r.number("on_demand_usd_per_hour");
  const YAML::Node spot = r.required("spot_usd_per_hour");
  if (!spot.IsNull()) {
    if (!spot.IsMap()) r.fail("spot_usd_per_hour", "must be {min, max} or null");
    RowReader s(origin, path + ".spot_usd_per_hour", spot);
    s.check_keys({"min", "max"});
    const auto lo = s.number("min"), hi = s.number("max");
    if (!lo) s.fail("min", "must be a number");
    if (!hi) s.fail("max", "must be a number");
    if (*lo > *hi) s.fail("min", "must be <= max, got " + spot["min"].Scalar() + " > " + spot["max"].Scalar());
    p.spot_usd_per_hour = SpotRange{*lo, *hi};
  }
  p.source = r.string("source");
  p.date = r.string("date");
  if (!is_date(p.date)) r.fail("date", "must be a date YYYY-MM-DD, got " + p.date);
  p.verified = r.boolean("verified");
  p.note = r.optional_string("note");
  const YAML::Node measured = node["measured"];
  if (measured.IsDefined() && !measured.IsNull()) {
    if (!measured.IsMap()) r.fail("measured", "must be a mapping");
    RowReader m(origin, path + ".measured", measured);
    m.check_keys({"date", "host", "h2d_gbps", "d2h_gbps", "bidir_gbps", "bf16_tflops", "mem_bw_gbps",
                  "host_adam_elements_per_second"});
    MeasuredHost h;
    h.date = m.string("date");
    if (!is_date(h.date)) m.fail("date", "must be a date YYYY-MM-DD, got " + h.date);
    h.host = m.string("host");
    auto opt = [&](const char* key) -> std::optional<double> {
      const YAML::Node n = measured[key];
      return n.IsDefined() ? m.number(key, n) : std::nullopt;
    };
    h.h2d_gbps = opt("h2d_gbps");
    h.d2h_gbps = opt("d2h_gbps");
    h.bidir_gbps = opt("bidir_gbps");
    h.bf16_tflops = opt("bf16_tflops");
    h.mem_bw_gbps = opt("mem_bw_gbps");
    const YAML::Node adam = measured["host_adam_elements_per_second"];
    if (adam.IsDefined() && !adam.IsNull()) {
      if (!adam.IsMap()) m.fail("host_adam_elements_per_second", "must be a mapping {cores: elements/s}");
      RowReader a(origin, path + ".measured.host_adam_elements_per_second", adam);
      for (const auto& kv : adam) {
        const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
        char* end = nullptr;
        const long long cores = std::strtoll(k.c_str(), &end, 10);
        if (k.empty() || end != k.c_str() + k.size() || cores < 1) a.fail(k, "the key must be a core count >= 1");
        const auto eps = a.number(k, kv.second);
        if (!eps || *eps <= 0) a.fail(k, "must be a number > 0");
        h.host_adam_elements_per_second.emplace_back(cores, *eps);
      }
      std::sort(h.host_adam_elements_per_second.begin(), h.host_adam_elements_per_second.end());
    }
    p.measured = h;
  }
  return p;
}

void check_non_negative(double x, const char* what) {
  if (!std::isfinite(x) || x < 0)
    throw std::invalid_argument(std::string(what) + " must be a finite number >= 0");
}

}  // namespace

PricingCatalog PricingCatalog::parse(const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw PricingError(origin + ": line " + std::to_string(e.mark.line + 1) + ": " + e.msg);
  }
  if (!root.IsMap()) throw PricingError(origin + ": must be a mapping with the key 'instances'");
  for (const auto& kv : root) {
    const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : "?";
    if (k != "instances") throw PricingError(origin + ": " + k + ": unknown key");
  }
  const YAML::Node list = root["instances"];
  if (!list.IsDefined()) throw PricingError(origin + ": instances: required");
  if (!list.IsSequence()) throw PricingError(origin + ": instances: must be a sequence");
  PricingCatalog c;
  std::set<std::string> names;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string path = "instances[" + std::to_string(i) + "]";
    InstancePrice row = parse_row(origin, path, list[i]);
    if (!names.insert(row.name).second)
      throw PricingError(origin + ": " + path + ".name: duplicate name '" + row.name + "'");
    c.rows_.push_back(std::move(row));
  }
  return c;
}

PricingCatalog PricingCatalog::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PricingError(path + ": cannot read the pricing catalog");
  std::ostringstream text;
  text << in.rdbuf();
  return parse(text.str(), path);
}

void PricingCatalog::merge(const PricingCatalog& overrides) {
  for (const InstancePrice& row : overrides.rows_) {
    bool replaced = false;
    for (InstancePrice& mine : rows_) {
      if (mine.name == row.name) {
        mine = row;
        replaced = true;
        break;
      }
    }
    if (!replaced) rows_.push_back(row);
  }
}

const InstancePrice* PricingCatalog::find_instance(const std::string& name) const {
  for (const InstancePrice& row : rows_)
    if (row.name == name) return &row;
  return nullptr;
}

double usd_for(double seconds, double usd_per_hour, int64_t gpus_used, int64_t gpus_of_instance) {
  check_non_negative(seconds, "seconds");
  check_non_negative(usd_per_hour, "usd_per_hour");
  return usd_per_hour * instance_share(gpus_used, gpus_of_instance) * seconds / 3600.0;
}

std::optional<double> usd_per_million_tokens(double usd, int64_t tokens) {
  check_non_negative(usd, "usd");
  if (tokens <= 0) return std::nullopt;
  return usd * 1e6 / static_cast<double>(tokens);
}

double usd_lost_to_stalls(double exposed_stall_seconds, double usd_per_hour, int64_t gpus_used,
                          int64_t gpus_of_instance) {
  return usd_for(exposed_stall_seconds, usd_per_hour, gpus_used, gpus_of_instance);
}

ResolvedPrice resolve_price(const CostSpec& cost, const PricingCatalog* catalog,
                            std::vector<std::string>* warnings) {
  ResolvedPrice r;
  r.instance = cost.instance_type;
  auto warn = [&](const std::string& w) {
    if (warnings) warnings->push_back(w);
  };
  if (cost.usd_per_hour) {
    r.priced = true;
    r.usd_per_hour = *cost.usd_per_hour;
    r.source = "cost.usd_per_hour";
    return r;
  }
  if (cost.instance_type.empty()) return r;
  const InstancePrice* row = catalog ? catalog->find_instance(cost.instance_type) : nullptr;
  if (!row) {
    warn("cost.instance_type: '" + cost.instance_type +
         "' is not in the pricing catalog, so the job's cost is not computed (set cost.usd_per_hour, or add "
         "the instance with --pricing FILE)");
    return r;
  }
  if (!row->on_demand_usd_per_hour) {
    warn("cost.instance_type: '" + cost.instance_type +
         "' has no on-demand price in the pricing catalog, so the job's cost is not computed (set "
         "cost.usd_per_hour)");
    return r;
  }
  r.priced = true;
  r.usd_per_hour = *row->on_demand_usd_per_hour;
  r.gpus_of_instance = row->gpu_count;
  r.source = row->source;
  r.date = row->date;
  r.verified = row->verified;
  if (!row->verified)
    warn("cost.instance_type: the catalog price of '" + cost.instance_type + "' (" + row->source +
         ") is not verified: the job's cost is an estimate");
  return r;
}

}  // namespace zenflow
