// Metrics registry: registration rules, series handles and the scrape-time snapshot.
#include "common/metrics/registry.h"

#include <cmath>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "common/metrics/exposition.h"

namespace zenflow::metrics {
namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

[[noreturn]] void fail(const std::string& metric, const std::string& what) {
  throw std::invalid_argument("metric " + quoted(metric) + ": " + what);
}

bool is_metric_name(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool is_label_name(const std::string& s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::vector<std::string>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + v[i];
  return out + "}";
}

std::string join(const std::vector<double>& v) {
  std::string out = "{";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + format_value(v[i]);
  return out + "}";
}

// The names a family takes in the exposition (its own, in HELP/TYPE, and its samples'),
// which no other family may use.
std::vector<std::string> exposed_names(MetricType type, const std::string& name) {
  if (type == MetricType::kHistogram) return {name, name + "_bucket", name + "_sum", name + "_count"};
  return {name};
}

void validate(MetricType type, const std::string& name, const std::string& help,
              const std::vector<std::string>& label_names, const std::vector<double>& bounds) {
  if (!is_metric_name(name)) fail(name, "invalid name, must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  const bool total = ends_with(name, "_total");
  if (type == MetricType::kCounter && !total) fail(name, "a counter's name must end in _total");
  if (type != MetricType::kCounter && total) {
    fail(name, std::string("only counters' names end in _total, this is a ") + metric_type_name(type));
  }
  if (help.empty()) fail(name, "help text is empty");
  if (!is_utf8(help)) fail(name, "help text is not valid UTF-8");
  for (size_t i = 0; i < label_names.size(); ++i) {
    const std::string& label = label_names[i];
    if (!is_label_name(label)) {
      fail(name, "invalid label name " + quoted(label) + ", must match [a-zA-Z_][a-zA-Z0-9_]*");
    }
    if (label.compare(0, 2, "__") == 0)
      fail(name, "label name " + quoted(label) + " is reserved (starts with __)");
    if (type == MetricType::kHistogram && label == "le") {
      fail(name, "label name \"le\" is reserved for histogram buckets");
    }
    for (size_t j = 0; j < i; ++j) {
      if (label_names[j] == label) fail(name, "label name " + quoted(label) + " appears twice");
    }
  }
  if (type != MetricType::kHistogram) return;
  if (bounds.empty()) fail(name, "a histogram needs at least one bucket bound (+Inf is implicit)");
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i])) {
      fail(name, "bucket bounds must be finite (+Inf is implicit), got " + format_value(bounds[i]));
    }
    if (i > 0 && !(bounds[i] > bounds[i - 1])) {
      fail(name, "bucket bounds must be strictly increasing, got " + format_value(bounds[i]) + " after " +
                     format_value(bounds[i - 1]));
    }
  }
}

}  // namespace

bool is_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      len = 3;
      if (c == 0xE0) lo = 0xA0;  // overlong
      if (c == 0xED) hi = 0x9F;  // surrogates
    } else if (c >= 0xF0 && c <= 0xF4) {
      len = 4;
      if (c == 0xF0) lo = 0x90;  // overlong
      if (c == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return false;
    }
    if (i + len > n || p[i + 1] < lo || p[i + 1] > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return false;
    }
    i += len;
  }
  return true;
}

const char* metric_type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

uint64_t HistogramValue::count() const {
  uint64_t total = 0;
  for (uint64_t c : bucket_counts) total += c;
  return total;
}

Histogram::Histogram(const std::vector<double>& bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i <= bounds.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

HistogramValue Histogram::value() const {
  HistogramValue v;
  v.bucket_counts.resize(bounds_.size() + 1);
  for (size_t i = 0; i <= bounds_.size(); ++i)
    v.bucket_counts[i] = buckets_[i].load(std::memory_order_relaxed);
  v.sum = sum_.load(std::memory_order_relaxed);
  return v;
}

MetricFamily::MetricFamily(std::string name, std::string help, MetricType type,
                           std::vector<std::string> label_names, std::vector<double> bucket_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      bucket_bounds_(std::move(bucket_bounds)) {}

void MetricFamily::check_label_values(const std::vector<std::string>& label_values) const {
  if (label_values.size() != label_names_.size()) {
    fail(name_, "expected " + std::to_string(label_names_.size()) + " label values " + join(label_names_) +
                    ", got " + std::to_string(label_values.size()));
  }
  for (size_t i = 0; i < label_values.size(); ++i) {
    if (!is_utf8(label_values[i]))
      fail(name_, "value of label " + quoted(label_names_[i]) + " is not valid UTF-8");
  }
}

template <typename Metric>
Metric& Family<Metric>::with(const std::vector<std::string>& label_values) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(label_values);
  if (it != series_.end()) return *it->second;
  check_label_values(label_values);
  std::unique_ptr<Metric> metric;
  if constexpr (std::is_same_v<Metric, Histogram>) {
    metric.reset(new Histogram(bucket_bounds()));
  } else {
    metric.reset(new Metric());
  }
  return *series_.emplace(label_values, std::move(metric)).first->second;
}

template <typename Metric>
void Family<Metric>::snapshot_series(std::map<std::vector<std::string>, SeriesSnapshot>& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [labels, metric] : series_) {
    SeriesSnapshot& s = out[labels];
    s.label_values = labels;
    if constexpr (std::is_same_v<Metric, Histogram>) {
      s.histogram = metric->value();
    } else {
      s.value = metric->value();
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// The scrape being built: per family its metadata and series by label values, so that
// collector samples merge in sorted and duplicates are caught as they are added.
struct SampleSink::Scrape {
  struct Entry {
    FamilySnapshot family;  // series left empty until the end
    std::map<std::vector<std::string>, SeriesSnapshot> series;
    const MetricFamily* source = nullptr;
  };
  std::map<std::string, Entry> families;
};

SeriesSnapshot& SampleSink::new_series(const std::string& name, const std::vector<std::string>& label_values,
                                       bool histogram) {
  auto it = scrape_.families.find(name);
  if (it == scrape_.families.end()) fail(name, "a collector's sample for a family that is not registered");
  Scrape::Entry& entry = it->second;
  const MetricType type = entry.family.type;
  if (histogram != (type == MetricType::kHistogram)) {
    fail(name, std::string("a collector added a ") + (histogram ? "histogram" : "counter/gauge") +
                   " sample to a " + metric_type_name(type));
  }
  entry.source->check_label_values(label_values);
  auto [series, inserted] = entry.series.try_emplace(label_values);
  if (!inserted) fail(name, "a collector added series " + join(label_values) + ", which already exists");
  series->second.label_values = label_values;
  return series->second;
}

void SampleSink::add(const std::string& name, const std::vector<std::string>& label_values, double value) {
  auto it = scrape_.families.find(name);
  if (it != scrape_.families.end() && it->second.family.type == MetricType::kCounter && !(value >= 0)) {
    fail(name, "a collector's counter value must be >= 0, got " + format_value(value));
  }
  new_series(name, label_values, false).value = value;
}

void SampleSink::add_histogram(const std::string& name, const std::vector<std::string>& label_values,
                               HistogramValue value) {
  auto it = scrape_.families.find(name);
  if (it != scrape_.families.end() && it->second.family.type == MetricType::kHistogram) {
    const size_t expected = it->second.family.bucket_bounds.size() + 1;
    if (value.bucket_counts.size() != expected) {
      fail(name, "a collector's histogram has " + std::to_string(value.bucket_counts.size()) +
                     " bucket counts, expected " + std::to_string(expected) + " (the bounds and +Inf)");
    }
  }
  new_series(name, label_values, true).histogram = std::move(value);
}

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

template <typename Metric>
Family<Metric>& MetricsRegistry::register_family(MetricType type, const std::string& name,
                                                 const std::string& help,
                                                 const std::vector<std::string>& label_names,
                                                 const std::vector<double>& bucket_bounds) {
  validate(type, name, help, label_names, bucket_bounds);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = families_.find(name);
  if (it != families_.end()) {
    const MetricFamily& existing = *it->second;
    if (existing.type() != type) {
      fail(name, std::string("already registered as a ") + metric_type_name(existing.type()) + ", not a " +
                     metric_type_name(type));
    }
    if (existing.help() != help) {
      fail(name, "already registered with help " + quoted(existing.help()) + ", not " + quoted(help));
    }
    if (existing.label_names() != label_names) {
      fail(name,
           "already registered with labels " + join(existing.label_names()) + ", not " + join(label_names));
    }
    if (existing.bucket_bounds() != bucket_bounds) {
      fail(name, "already registered with buckets " + join(existing.bucket_bounds()) + ", not " +
                     join(bucket_bounds));
    }
    return static_cast<Family<Metric>&>(*it->second);
  }
  // Gauge "x_count" next to histogram "x" would give two series named x_count.
  const std::vector<std::string> samples = exposed_names(type, name);
  for (const std::string& sample : samples) {
    auto owner = sample_owners_.find(sample);
    if (owner != sample_owners_.end()) {
      const MetricFamily& other = *families_.at(owner->second);
      fail(name, "name " + sample + " is already used by " + metric_type_name(other.type()) + " " +
                     quoted(other.name()));
    }
  }
  std::unique_ptr<Family<Metric>> family(new Family<Metric>(name, help, type, label_names, bucket_bounds));
  Family<Metric>& result = *family;
  families_.emplace(name, std::move(family));
  for (const std::string& sample : samples) sample_owners_.emplace(sample, name);
  return result;
}

Family<Counter>& MetricsRegistry::counter(const std::string& name, const std::string& help,
                                          const std::vector<std::string>& label_names) {
  return register_family<Counter>(MetricType::kCounter, name, help, label_names, {});
}

Family<Gauge>& MetricsRegistry::gauge(const std::string& name, const std::string& help,
                                      const std::vector<std::string>& label_names) {
  return register_family<Gauge>(MetricType::kGauge, name, help, label_names, {});
}

Family<Histogram>& MetricsRegistry::histogram(const std::string& name, const std::string& help,
                                              const std::vector<std::string>& label_names,
                                              const std::vector<double>& bucket_bounds) {
  return register_family<Histogram>(MetricType::kHistogram, name, help, label_names, bucket_bounds);
}

MetricsRegistry::CollectorId MetricsRegistry::add_collector(Collector collector) {
  auto shared = std::make_shared<const Collector>(std::move(collector));
  std::lock_guard<std::mutex> lock(mu_);
  const CollectorId id = next_collector_id_++;
  collectors_.emplace(id, std::move(shared));
  return id;
}

void MetricsRegistry::remove_collector(CollectorId id) {
  // Waiting for scrape_mu_ is what guarantees the collector is not running on return.
  std::lock_guard<std::mutex> scrape_lock(scrape_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  collectors_.erase(id);
}

std::vector<FamilySnapshot> MetricsRegistry::collect() const {
  std::lock_guard<std::mutex> scrape_lock(scrape_mu_);
  SampleSink::Scrape scrape;
  std::vector<std::shared_ptr<const Collector>> collectors;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [name, family] : families_) {
      SampleSink::Scrape::Entry& entry = scrape.families[name];
      entry.family.name = family->name();
      entry.family.help = family->help();
      entry.family.type = family->type();
      entry.family.label_names = family->label_names();
      entry.family.bucket_bounds = family->bucket_bounds();
      entry.source = family.get();
    }
    for (const auto& [id, collector] : collectors_) collectors.push_back(collector);
  }
  // Families are never removed, so the pointers stay valid without mu_; series are read
  // under each family's own mutex, so registration elsewhere is not held up by a scrape.
  for (auto& [name, entry] : scrape.families) entry.source->snapshot_series(entry.series);
  SampleSink sink(scrape);
  for (const auto& collector : collectors) (*collector)(sink);

  std::vector<FamilySnapshot> out;
  out.reserve(scrape.families.size());
  for (auto& [name, entry] : scrape.families) {
    FamilySnapshot& family = out.emplace_back(std::move(entry.family));
    family.series.reserve(entry.series.size());
    for (auto& [labels, series] : entry.series) family.series.push_back(std::move(series));
  }
  return out;
}

std::vector<double> exponential_buckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1 || !std::isfinite(start) || !std::isfinite(factor)) {
    throw std::invalid_argument("exponential_buckets: need start > 0, factor > 1 and count >= 1, got start " +
                                format_value(start) + ", factor " + format_value(factor) + ", count " +
                                std::to_string(count));
  }
  std::vector<double> bounds;
  bounds.reserve(count);
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) bounds.push_back(b);
  return bounds;
}

Gauge& register_build_info(MetricsRegistry& registry, const std::string& version) {
  Gauge& info =
      registry.gauge("zenflow_build_info", "zenflow build information; the value is always 1", {"version"})
          .with({version});
  info.set(1);
  return info;
}

}  // namespace zenflow::metrics
