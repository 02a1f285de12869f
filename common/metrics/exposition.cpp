// Prometheus text exposition format 0.0.4: value formatting, escaping and rendering.
#include "common/metrics/exposition.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <system_error>

namespace zenflow::metrics {
namespace {

// name{l1="v1",...,extra_name="extra_value"}; nothing when there are no labels at all.
void append_labels(std::string& out, const std::vector<std::string>& names,
                   const std::vector<std::string>& values, const char* extra_name = nullptr,
                   const std::string& extra_value = {}) {
  if (names.empty() && extra_name == nullptr) return;
  out += '{';
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ',';
    out += names[i];
    out += "=\"";
    out += i < values.size() ? escape_label_value(values[i]) : std::string();
    out += '"';
  }
  if (extra_name != nullptr) {
    if (!names.empty()) out += ',';
    out += extra_name;
    out += "=\"";
    out += extra_value;
    out += '"';
  }
  out += '}';
}

void append_sample(std::string& out, const std::string& name, const char* suffix,
                   const FamilySnapshot& family, const SeriesSnapshot& series, const std::string& value,
                   const char* extra_name = nullptr, const std::string& extra_value = {}) {
  out += name;
  out += suffix;
  append_labels(out, family.label_names, series.label_values, extra_name, extra_value);
  out += ' ';
  out += value;
  out += '\n';
}

}  // namespace

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53: every integer up to it is a double
  if (value == std::floor(value) && std::fabs(value) <= kExactIntegers) {
    return std::to_string(static_cast<int64_t>(value));
  }
  char buf[32];
  // Shortest round-trip (and no locale's decimal comma, unlike printf).
  const auto result = std::to_chars(buf, buf + sizeof buf, value);
  if (result.ec != std::errc()) return "NaN";  // cannot happen: 32 chars fit any double
  return std::string(buf, result.ptr);
}

std::string escape_help(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string escape_label_value(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string render_text(const std::vector<FamilySnapshot>& families) {
  std::string out;
  for (const FamilySnapshot& family : families) {
    if (family.series.empty()) continue;  // HELP/TYPE alone would only be noise
    out += "# HELP " + family.name + ' ' + escape_help(family.help) + '\n';
    out += "# TYPE " + family.name + ' ' + metric_type_name(family.type) + '\n';
    for (const SeriesSnapshot& series : family.series) {
      if (family.type != MetricType::kHistogram) {
        append_sample(out, family.name, "", family, series, format_value(series.value));
        continue;
      }
      const HistogramValue& h = series.histogram;
      uint64_t cumulative = 0;
      for (size_t i = 0; i < family.bucket_bounds.size(); ++i) {
        cumulative += i < h.bucket_counts.size() ? h.bucket_counts[i] : 0;
        append_sample(out, family.name, "_bucket", family, series, std::to_string(cumulative), "le",
                      format_value(family.bucket_bounds[i]));
      }
      // _count is the +Inf bucket by construction, never a separately read counter.
      const uint64_t count = h.count();
      append_sample(out, family.name, "_bucket", family, series, std::to_string(count), "le", "+Inf");
      append_sample(out, family.name, "_sum", family, series, format_value(h.sum));
      append_sample(out, family.name, "_count", family, series, std::to_string(count));
    }
  }
  return out;
}

std::string render_text(const MetricsRegistry& registry) { return render_text(registry.collect()); }

}  // namespace zenflow::metrics
