// Parsing and merging Prometheus text expositions (format 0.0.4): how one process serves
// the metrics of others it runs (the worker agent and its ranks) from a single /metrics.
//
// The format lets a family appear once: its HELP and TYPE, then all its samples. Several
// processes' expositions concatenated would split families (and repeat HELP/TYPE), which
// Prometheus rejects for the whole scrape. merge_expositions() gives each family one
// block, whichever sources it came from.
//
//   std::vector<ParsedExposition> sources;
//   sources.push_back(parse_exposition(render_text(own_registry)));
//   ParsedExposition rank = parse_exposition(body);   // throws ExpositionError if malformed
//   add_missing_labels(rank, {{"job_id", "j-000001"}, {"rank", "0"}});
//   sources.push_back(std::move(rank));
//   std::string text = merge_expositions(sources, &stats);
//
// Thread-safety: all functions are reentrant (no shared state).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace zenflow::metrics {

// A malformed exposition: "line N: reason".
class ExpositionError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One sample line.
struct ParsedSample {
  std::string name;  // as written: the family's name, or with _bucket/_sum/_count
  std::vector<std::pair<std::string, std::string>> labels;  // in written order; values unescaped
  std::string value;      // as written, checked to be a float ("1", "0.5", "+Inf", "NaN", "1e-07")
  std::string timestamp;  // as written, checked to be an integer; "" when absent
};

// One family: its metadata and every sample of it, in written order.
struct ParsedFamily {
  std::string name;
  std::string help;  // unescaped; meaningful when has_help
  bool has_help = false;
  std::string type = "untyped";  // counter, gauge, histogram, summary or untyped (no TYPE line)
  std::vector<ParsedSample> samples;
};

struct ParsedExposition {
  std::vector<ParsedFamily> families;  // in written order
};

// Parses text format 0.0.4. Comments other than HELP and TYPE, and empty lines, are
// skipped. Throws ExpositionError, naming the line, for: a bad metric or label name, a
// label repeated in a sample, an unterminated or badly escaped label value, a value that
// is not a float, a timestamp that is not an integer, an unknown TYPE, HELP or TYPE given
// twice for a family or after its samples, a sample that does not belong to its family
// (a histogram's must be name_bucket with an le label, name_sum or name_count), a family
// that appears in two places (split), or text larger than `max_bytes`.
ParsedExposition parse_exposition(const std::string& text, size_t max_bytes = 64u << 20);

// Gives every sample each of `labels` it lacks (by name), placed before its own labels in
// the order given; labels a sample has keep their values.
void add_missing_labels(ParsedExposition& exposition,
                        const std::vector<std::pair<std::string, std::string>>& labels);

struct MergeStats {
  int64_t families_dropped = 0;  // a source's family whose TYPE differs from the first source's
  int64_t samples_dropped = 0;   // a sample (name and label set) an earlier source already gave
};

// The sources as one exposition: families sorted by name, each as one block with the HELP
// (the first source's that has one) and TYPE of the first source that has the family, then
// its samples, source by source in the order given, each source's in its own order (a
// histogram's bucket, _sum and _count lines stay together). Label values are escaped as
// render_text() does; "# TYPE name untyped" is written for families without a TYPE.
// `stats` (optional) counts what was dropped to keep the output valid.
std::string merge_expositions(const std::vector<ParsedExposition>& sources, MergeStats* stats = nullptr);

}  // namespace zenflow::metrics
