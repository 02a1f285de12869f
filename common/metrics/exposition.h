// Prometheus text exposition format 0.0.4 of a MetricsRegistry.
//
// Output, per family with at least one series, families sorted by name and series by
// label values:
//   # HELP name help            (help with \ and newline escaped)
//   # TYPE name counter|gauge|histogram
//   name{l1="v1",l2="v2"} value (label values with \, " and newline escaped)
// and for a histogram, per series, cumulative name_bucket{...,le="bound"} lines ending
// with le="+Inf", then name_sum and name_count. No timestamps. Every line ends in "\n".
// Thread-safety: all functions are reentrant; render_text(registry) may run alongside
// metric updates (see registry.h for what a scrape sees).
#pragma once

#include <string>
#include <vector>

#include "common/metrics/registry.h"

namespace zenflow::metrics {

// The Content-Type of render_text's output.
inline constexpr char kTextContentType[] = "text/plain; version=0.0.4; charset=utf-8";

// collect() rendered as text. Throws what registry.collect() throws (a collector's error).
std::string render_text(const MetricsRegistry& registry);

// The same for families already collected (or built by hand, e.g. in tests).
std::string render_text(const std::vector<FamilySnapshot>& families);

// A sample value: integers up to 2^53 in magnitude as plain digits ("3", "-12"),
// other finite values in the shortest form that parses back to the same double ("0.5",
// "105.15", "1e+20", "1e-07"), and "+Inf", "-Inf", "NaN". Locale-independent.
std::string format_value(double value);

// Help text escaped for a HELP line: \ -> \\, newline -> \n.
std::string escape_help(const std::string& help);

// A label value escaped for inside the quotes: \ -> \\, " -> \", newline -> \n.
std::string escape_label_value(const std::string& value);

}  // namespace zenflow::metrics
