// Metrics registry: counters, gauges and histograms with labels, updated lock-free.
//
// A process owns one MetricsRegistry. Families (name, help, type, label names, and for
// histograms the bucket bounds) are registered once, at setup; a series handle is taken
// once per label-value set and kept:
//
//   Counter& steps = registry.counter("zenflow_steps_total", "Steps done", {"job_id", "rank"})
//                        .with({"j1", "0"});
//   steps.inc();   // training thread: no lock, no allocation
//
// Names follow the Prometheus data model and zenflow's conventions (docs/design.md §7); a bad
// name, label or bucket list is a std::invalid_argument naming the metric and the rule.
//
// Thread-safety: every member function may be called from any thread. Registration,
// with() and collect() take mutexes and allocate; they belong to setup and to the
// scraping thread. Counter/Gauge/Histogram updates are lock-free (an atomic add or store,
// or a compare-exchange loop for doubles), never lock and never allocate: the training
// thread may call them.
//
// Consistency model (the same as prometheus-cpp's): every value is an independent
// relaxed atomic. A scrape reads them one after the other, so it may see one series
// before and another after a concurrent update, and a histogram's _sum from a slightly
// different instant than its buckets. A histogram's _count is the sum of the bucket
// counts read by that scrape, so _count always equals its le="+Inf" bucket and the
// buckets are always cumulative-monotone.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace zenflow::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// "counter", "gauge", "histogram": the exposition's TYPE word.
const char* metric_type_name(MetricType type);

// Whether `s` is well-formed UTF-8 (no overlongs, no surrogates, at most U+10FFFF):
// Prometheus requires it of help and label values, and one bad byte would make the whole
// scrape unparsable.
bool is_utf8(const std::string& s);

// A histogram's value: per-bucket (not cumulative) counts, one for each finite bound and
// a last one for +Inf, and the sum of the observed values.
struct HistogramValue {
  std::vector<uint64_t> bucket_counts;
  double sum = 0;

  // The number of observations: the sum of bucket_counts.
  uint64_t count() const;
};

// One series of a family as read by a scrape.
struct SeriesSnapshot {
  std::vector<std::string> label_values;  // in the family's label_names order
  double value = 0;                       // counter, gauge
  HistogramValue histogram;               // histogram
};

// One family as read by a scrape: what exposition renders.
struct FamilySnapshot {
  std::string name;
  std::string help;
  MetricType type = MetricType::kGauge;
  std::vector<std::string> label_names;
  std::vector<double> bucket_bounds;   // histogram: finite, strictly increasing; +Inf implicit
  std::vector<SeriesSnapshot> series;  // sorted by label_values (byte-wise, lexicographic)
};

namespace detail {
// Adds `delta` to `target` with a CAS loop (C++17 has no fetch_add on atomic<double>).
inline void atomic_add(std::atomic<double>& target, double delta) noexcept {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + delta, std::memory_order_relaxed,
                                       std::memory_order_relaxed)) {
  }
}
static_assert(std::atomic<double>::is_always_lock_free, "metric updates must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "metric updates must be lock-free");
}  // namespace detail

template <typename Metric>
class Family;

// Each series sits on its own cache line: series updated by different threads (the
// training loop, the host optimizer's pool, the data loader) must not share one, or every
// update would bounce the line between cores.
inline constexpr size_t kSeriesAlignment = 64;

// A monotonically increasing value (events, seconds, bytes). Obtained from
// Family<Counter>::with(); lives as long as the registry.
class alignas(kSeriesAlignment) Counter {
 public:
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  // Adds `amount`. A negative amount is ignored, as in prometheus-cpp, and so is NaN: a
  // counter never goes down or breaks, and the training thread must not get an exception.
  void inc(double amount = 1.0) noexcept {
    if (amount >= 0) detail::atomic_add(value_, amount);
  }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  template <typename>
  friend class Family;
  Counter() = default;
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (a ratio, a loss, bytes in use). Obtained from
// Family<Gauge>::with(); lives as long as the registry.
class alignas(kSeriesAlignment) Gauge {
 public:
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void set(double value) noexcept { value_.store(value, std::memory_order_relaxed); }
  void inc(double amount = 1.0) noexcept { detail::atomic_add(value_, amount); }
  void dec(double amount = 1.0) noexcept { detail::atomic_add(value_, -amount); }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  template <typename>
  friend class Family;
  Gauge() = default;
  std::atomic<double> value_{0.0};
};

// A distribution over fixed buckets (durations, sizes). Obtained from
// Family<Histogram>::with(); lives as long as the registry.
class alignas(kSeriesAlignment) Histogram {
 public:
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  // Counts `value` in the first bucket whose bound is >= value (bounds are inclusive, as
  // Prometheus's le says); above every bound, or NaN, goes to +Inf. Adds it to the sum.
  void observe(double value) noexcept {
    size_t i = 0;
    const size_t n = bounds_.size();
    // A linear scan: bucket lists are short (about 10-20), and it needs no NaN special case
    // (NaN compares false everywhere and lands in +Inf).
    while (i < n && !(value <= bounds_[i])) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    detail::atomic_add(sum_, value);
  }

  // The current counts and sum (allocates: for scrapes and tests, not the training thread).
  HistogramValue value() const;
  const std::vector<double>& bucket_bounds() const { return bounds_; }

 private:
  template <typename>
  friend class Family;
  explicit Histogram(const std::vector<double>& bounds);
  const std::vector<double>& bounds_;                 // the family's, which outlives this
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_.size() + 1, the last is +Inf
  std::atomic<double> sum_{0.0};
};

// What a family is: fixed at registration. Families live as long as their registry.
class MetricFamily {
 public:
  virtual ~MetricFamily() = default;
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }
  const std::vector<double>& bucket_bounds() const { return bucket_bounds_; }  // histograms only

  // Throws std::invalid_argument, naming the metric, unless `label_values` has one valid
  // UTF-8 value per label name.
  void check_label_values(const std::vector<std::string>& label_values) const;

 protected:
  MetricFamily(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
               std::vector<double> bucket_bounds);

 private:
  friend class MetricsRegistry;
  // Appends this family's series, read now, to `out` (keyed by label values).
  virtual void snapshot_series(std::map<std::vector<std::string>, SeriesSnapshot>& out) const = 0;

  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
  std::vector<double> bucket_bounds_;
};

// The series of one family, by label values.
template <typename Metric>
class Family final : public MetricFamily {
 public:
  // The series for `label_values` (one per label name, in order), created at 0 on the
  // first call; every later call returns the same object, which stays valid as long as
  // the registry. Takes a mutex and may allocate: call it at setup and keep the reference,
  // not per step. Throws std::invalid_argument on the wrong number of values or a value
  // that is not valid UTF-8.
  Metric& with(const std::vector<std::string>& label_values);

 private:
  friend class MetricsRegistry;
  using MetricFamily::MetricFamily;
  void snapshot_series(std::map<std::vector<std::string>, SeriesSnapshot>& out) const override;

  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<Metric>> series_;
};

extern template class Family<Counter>;
extern template class Family<Gauge>;
extern template class Family<Histogram>;

// Where a collector puts the samples it produces at scrape time (values gathered from
// elsewhere, e.g. child processes). Samples go into families declared on the registry
// beforehand; they are merged with that family's own series.
class SampleSink {
 public:
  SampleSink(const SampleSink&) = delete;
  SampleSink& operator=(const SampleSink&) = delete;

  // Adds a counter or gauge series to family `name`. Throws std::invalid_argument naming
  // the metric when the family is not declared, is a histogram, the label values do not fit,
  // a counter value is negative or NaN, or the series already exists in this scrape (a
  // registered handle or another sample with the same label values).
  void add(const std::string& name, const std::vector<std::string>& label_values, double value);

  // Adds a histogram series; `value.bucket_counts` has one count per bound of the family
  // plus +Inf (not cumulative). Throws as add() does, and on a bucket count mismatch.
  void add_histogram(const std::string& name, const std::vector<std::string>& label_values,
                     HistogramValue value);

 private:
  friend class MetricsRegistry;
  struct Scrape;
  explicit SampleSink(Scrape& scrape) : scrape_(scrape) {}
  SeriesSnapshot& new_series(const std::string& name, const std::vector<std::string>& label_values,
                             bool histogram);
  Scrape& scrape_;
};

// The metric families of a process and the collectors that add samples at scrape time.
// Families are never removed; neither are series, so handles never dangle.
class MetricsRegistry {
 public:
  using Collector = std::function<void(SampleSink&)>;
  using CollectorId = uint64_t;

  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Registers (or finds) a family and returns it; the reference stays valid as long as the
  // registry. Registering the same name again with the same type, help, labels (and
  // buckets) returns the same family. Throws std::invalid_argument, naming the metric:
  //  - a name not matching [a-zA-Z_:][a-zA-Z0-9_:]*; a counter not ending in _total, or
  //    a gauge or histogram ending in it (only counters do, docs/design.md §7);
  //  - empty or non-UTF-8 help;
  //  - a label name not matching [a-zA-Z_][a-zA-Z0-9_]*, starting with __ (reserved),
  //    repeated, or "le" on a histogram (its bucket label);
  //  - histogram bounds that are empty, not finite (+Inf is implicit) or not strictly
  //    increasing;
  //  - the name already registered with another type, help, labels or buckets, or a
  //    sample name (histogram x -> x_bucket, x_sum, x_count) colliding with another family's.
  Family<Counter>& counter(const std::string& name, const std::string& help,
                           const std::vector<std::string>& label_names = {});
  Family<Gauge>& gauge(const std::string& name, const std::string& help,
                       const std::vector<std::string>& label_names = {});
  Family<Histogram>& histogram(const std::string& name, const std::string& help,
                               const std::vector<std::string>& label_names,
                               const std::vector<double>& bucket_bounds);

  // Adds a callback run by every collect() (so every scrape), in the order added, one scrape
  // at a time, on the scraping thread and with no registry lock held. Its samples must be
  // for families registered before the scrape began (register them before adding it); it
  // must not call collect() or remove_collector() (deadlock). What it throws propagates
  // out of collect(). Returns the id for remove_collector().
  CollectorId add_collector(Collector collector);

  // Removes a collector. When this returns the collector is not running and will not run
  // again, so what it captured may be destroyed. Unknown ids are ignored.
  void remove_collector(CollectorId id);

  // Reads every family now: families sorted by name, each with its registered series and
  // the collectors' samples merged, sorted by label values. Families with no series are
  // included (exposition skips them). Throws what a collector throws.
  std::vector<FamilySnapshot> collect() const;

 private:
  template <typename Metric>
  Family<Metric>& register_family(MetricType type, const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names,
                                  const std::vector<double>& bucket_bounds);

  mutable std::mutex mu_;  // families_, sample_owners_, collectors_
  std::map<std::string, std::unique_ptr<MetricFamily>> families_;
  std::map<std::string, std::string> sample_owners_;  // sample name -> family name
  std::map<CollectorId, std::shared_ptr<const Collector>> collectors_;
  CollectorId next_collector_id_ = 1;
  mutable std::mutex scrape_mu_;  // one collect() at a time; held while collectors run
};

// Bucket bounds start, start*factor, ... (count of them). Throws std::invalid_argument
// unless start > 0, factor > 1 and count >= 1.
std::vector<double> exponential_buckets(double start, double factor, int count);

// Registers zenflow_build_info{version} (docs/design.md §7, in every process) and sets it to 1.
// Pass zenflow::kVersion from "common/version.h". Returns the series.
Gauge& register_build_info(MetricsRegistry& registry, const std::string& version);

}  // namespace zenflow::metrics
