// Prometheus text exposition 0.0.4: a strict parser, relabelling and the merge of several
// processes' expositions into one valid one (see exposition_merge.h).
#include "common/metrics/exposition_merge.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <set>
#include <string_view>
#include <system_error>

#include "common/metrics/exposition.h"
#include "common/metrics/registry.h"

namespace zenflow::metrics {
namespace {

bool is_blank(char c) { return c == ' ' || c == '\t'; }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The names a family's samples may take, which no other family may use.
std::vector<std::string> sample_names(const std::string& type, const std::string& name) {
  if (type == "histogram") return {name, name + "_bucket", name + "_sum", name + "_count"};
  if (type == "summary") return {name, name + "_sum", name + "_count"};
  return {name};
}

bool has_label(const ParsedSample& s, const std::string& label) {
  return std::any_of(s.labels.begin(), s.labels.end(), [&](const auto& kv) { return kv.first == label; });
}

bool belongs(const ParsedFamily& f, const ParsedSample& s) {
  if (f.type == "histogram")
    return s.name == f.name + "_bucket" || s.name == f.name + "_sum" || s.name == f.name + "_count";
  if (f.type == "summary")
    return s.name == f.name || s.name == f.name + "_sum" || s.name == f.name + "_count";
  return s.name == f.name;
}

bool is_float(const std::string& v) {
  std::string lower;
  for (char c : v) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  for (const char* word : {"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity", "nan"})
    if (lower == word) return true;
  // Otherwise digits: from_chars alone would also take "nan(...)" and "infinity" spellings.
  const char* begin = v.data();
  const char* end = v.data() + v.size();
  const bool plus = begin != end && *begin == '+';
  if (plus) ++begin;
  const char* digits = !plus && begin != end && *begin == '-' ? begin + 1 : begin;
  if (digits == end || (*digits != '.' && !is_digit(*digits))) return false;
  double parsed = 0;
  const auto r = std::from_chars(begin, end, parsed, std::chars_format::general);
  return r.ec == std::errc() && r.ptr == end;
}

bool is_integer(const std::string& v) {
  size_t i = v.size() > 1 && v[0] == '-' ? 1 : 0;
  if (i == v.size()) return false;
  for (; i < v.size(); ++i)
    if (!is_digit(v[i])) return false;
  return v.size() <= 20;
}

// One line, read left to right; every failure names the line.
class LineReader {
 public:
  LineReader(std::string_view line, int number) : s_(line), number_(number) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw ExpositionError("line " + std::to_string(number_) + ": " + what);
  }
  bool done() const { return i_ >= s_.size(); }
  char peek() const { return done() ? '\0' : s_[i_]; }
  bool skip_blanks() {
    const size_t start = i_;
    while (!done() && is_blank(s_[i_])) ++i_;
    return i_ > start;
  }
  void expect(char c, const char* what) {
    if (peek() != c) fail(std::string("expected ") + what);
    ++i_;
  }
  // [a-zA-Z_:][a-zA-Z0-9_:]*
  std::string metric_name() {
    const size_t start = i_;
    while (!done() && (is_alpha(s_[i_]) || s_[i_] == ':' || (i_ > start && is_digit(s_[i_])))) ++i_;
    if (i_ == start) fail("expected a metric name");
    return std::string(s_.substr(start, i_ - start));
  }
  // [a-zA-Z_][a-zA-Z0-9_]*
  std::string label_name() {
    const size_t start = i_;
    while (!done() && (is_alpha(s_[i_]) || (i_ > start && is_digit(s_[i_])))) ++i_;
    if (i_ == start) fail("expected a label name");
    return std::string(s_.substr(start, i_ - start));
  }
  // "..." with \\, \" and \n unescaped.
  std::string label_value() {
    expect('"', "a quoted label value");
    std::string out;
    while (true) {
      if (done()) fail("unterminated label value");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      const char e = peek();
      ++i_;
      if (e == '\\') {
        out += '\\';
      } else if (e == '"') {
        out += '"';
      } else if (e == 'n') {
        out += '\n';
      } else {
        fail("bad escape in a label value (only \\\\, \\\" and \\n)");
      }
    }
  }
  // Up to the next blank or the end.
  std::string token() {
    const size_t start = i_;
    while (!done() && !is_blank(s_[i_])) ++i_;
    return std::string(s_.substr(start, i_ - start));
  }
  std::string rest() {
    std::string out(s_.substr(std::min(i_, s_.size())));
    i_ = s_.size();
    return out;
  }

 private:
  std::string_view s_;
  int number_;
  size_t i_ = 0;
};

std::string unescape_help(const std::string& raw) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\\' && i + 1 < raw.size() && (raw[i + 1] == '\\' || raw[i + 1] == 'n')) {
      out += raw[i + 1] == 'n' ? '\n' : '\\';
      ++i;
    } else {
      out += raw[i];
    }
  }
  return out;
}

ParsedSample parse_sample(LineReader& r) {
  ParsedSample s;
  s.name = r.metric_name();
  if (r.peek() == '{') {
    r.expect('{', "{");
    while (true) {
      r.skip_blanks();
      if (r.peek() == '}') break;
      std::string name = r.label_name();
      r.skip_blanks();
      r.expect('=', "= after a label name");
      r.skip_blanks();
      std::string value = r.label_value();
      if (has_label(s, name)) r.fail("label \"" + name + "\" appears twice");
      if (!is_utf8(value)) r.fail("value of label \"" + name + "\" is not valid UTF-8");
      s.labels.emplace_back(std::move(name), std::move(value));
      r.skip_blanks();
      if (r.peek() != ',') break;
      r.expect(',', ",");
    }
    r.expect('}', ", or } after a label");
  }
  if (!r.skip_blanks()) r.fail("expected a blank before the value");
  s.value = r.token();
  if (!is_float(s.value)) r.fail("value \"" + s.value + "\" is not a float");
  r.skip_blanks();
  if (!r.done()) {
    s.timestamp = r.token();
    if (!is_integer(s.timestamp)) r.fail("timestamp \"" + s.timestamp + "\" is not an integer");
    r.skip_blanks();
    if (!r.done()) r.fail("unexpected text after the timestamp");
  }
  return s;
}

void append_sample(std::string& out, const ParsedSample& s) {
  out += s.name;
  if (!s.labels.empty()) {
    out += '{';
    for (size_t i = 0; i < s.labels.size(); ++i) {
      if (i) out += ',';
      out += s.labels[i].first;
      out += "=\"";
      out += escape_label_value(s.labels[i].second);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  out += s.value;
  if (!s.timestamp.empty()) {
    out += ' ';
    out += s.timestamp;
  }
  out += '\n';
}

// Identifies a series across sources: its name and label set, whatever the label order.
std::string series_key(const ParsedSample& s) {
  std::vector<std::pair<std::string, std::string>> labels = s.labels;
  std::sort(labels.begin(), labels.end());
  std::string key = s.name;
  for (const auto& [k, v] : labels) {
    key += '\0';
    key += k;
    key += '\0';
    key += v;
  }
  return key;
}

}  // namespace

ParsedExposition parse_exposition(const std::string& text, size_t max_bytes) {
  if (text.size() > max_bytes)
    throw ExpositionError("exposition of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                          std::to_string(max_bytes));
  ParsedExposition out;
  std::map<std::string, size_t> index;  // family name -> position in out.families
  std::vector<bool> typed;              // per family: a TYPE line was read
  std::set<std::string> taken;          // sample names of the families so far
  size_t current = SIZE_MAX;            // the family being read
  auto open_family = [&](const std::string& name, const std::string& type, const LineReader& r) {
    if (index.count(name)) r.fail("family \"" + name + "\" appears in two places (split by another family)");
    index[name] = out.families.size();
    ParsedFamily& f = out.families.emplace_back();
    f.name = name;
    f.type = type;
    typed.push_back(false);
    current = out.families.size() - 1;
  };
  int number = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    ++number;
    LineReader r(line, number);
    r.skip_blanks();
    if (r.done()) continue;
    if (r.peek() == '#') {
      r.expect('#', "#");
      r.skip_blanks();
      const std::string word = r.token();
      if (word != "HELP" && word != "TYPE") continue;  // a comment
      r.skip_blanks();
      const std::string name = r.metric_name();
      if (!r.done() && !r.skip_blanks()) r.fail("expected a blank after the metric name");
      if (current == SIZE_MAX || out.families[current].name != name) open_family(name, "untyped", r);
      ParsedFamily& f = out.families[current];
      if (!f.samples.empty()) r.fail(word + " for \"" + name + "\" after its samples");
      if (word == "HELP") {
        if (f.has_help) r.fail("HELP for \"" + name + "\" given twice");
        f.help = unescape_help(r.rest());
        if (!is_utf8(f.help)) r.fail("HELP for \"" + name + "\" is not valid UTF-8");
        f.has_help = true;
      } else {
        if (typed[current]) r.fail("TYPE for \"" + name + "\" given twice");
        std::string type = r.token();
        r.skip_blanks();
        if (!r.done() || (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" &&
                          type != "untyped"))
          r.fail("unknown TYPE for \"" + name + "\"");
        f.type = std::move(type);
        typed[current] = true;
      }
      continue;
    }
    ParsedSample s = parse_sample(r);
    if (current == SIZE_MAX || !belongs(out.families[current], s)) {
      const ParsedFamily* f = current == SIZE_MAX ? nullptr : &out.families[current];
      if (f != nullptr && f->name == s.name)
        r.fail("sample \"" + s.name + "\" of " + f->type + " \"" + f->name +
               "\" needs a _bucket, _sum or _count suffix");
      // A histogram's or summary's sample away from its family is a split, too.
      if (taken.count(s.name))
        r.fail("samples of \"" + s.name + "\" appear in two places (split by another family)");
      open_family(s.name, "untyped", r);
    }
    ParsedFamily& f = out.families[current];
    if (f.samples.empty())
      for (const std::string& n : sample_names(f.type, f.name)) taken.insert(n);
    if (f.type == "histogram" && s.name == f.name + "_bucket" && !has_label(s, "le"))
      r.fail("bucket of histogram \"" + f.name + "\" without an le label");
    f.samples.push_back(std::move(s));
  }
  return out;
}

void add_missing_labels(ParsedExposition& exposition,
                        const std::vector<std::pair<std::string, std::string>>& labels) {
  for (ParsedFamily& f : exposition.families) {
    for (ParsedSample& s : f.samples) {
      std::vector<std::pair<std::string, std::string>> merged;
      merged.reserve(labels.size() + s.labels.size());
      for (const auto& kv : labels)
        if (!has_label(s, kv.first)) merged.push_back(kv);
      if (merged.empty()) continue;
      merged.insert(merged.end(), s.labels.begin(), s.labels.end());
      s.labels = std::move(merged);
    }
  }
}

std::string merge_expositions(const std::vector<ParsedExposition>& sources, MergeStats* stats) {
  struct Block {
    std::string type;
    const std::string* help = nullptr;
    std::vector<const ParsedSample*> samples;
  };
  MergeStats local;
  MergeStats& st = stats != nullptr ? *stats : local;
  std::map<std::string, Block> blocks;        // by family name: the output order
  std::map<std::string, std::string> owners;  // sample name -> family name
  std::set<std::string> series;               // series_key of every sample kept
  for (const ParsedExposition& source : sources) {
    for (const ParsedFamily& f : source.families) {
      auto it = blocks.find(f.name);
      if (it == blocks.end()) {
        // Gauge "x_count" beside histogram "x" would write x_count under two families.
        const std::vector<std::string> names = sample_names(f.type, f.name);
        const bool collides = std::any_of(names.begin(), names.end(), [&](const std::string& n) {
          auto o = owners.find(n);
          return o != owners.end() && o->second != f.name;
        });
        if (collides) {
          ++st.families_dropped;
          continue;
        }
        for (const std::string& n : names) owners.emplace(n, f.name);
        it = blocks.emplace(f.name, Block{f.type, nullptr, {}}).first;
      } else if (it->second.type != f.type) {
        ++st.families_dropped;
        continue;
      }
      Block& b = it->second;
      if (b.help == nullptr && f.has_help) b.help = &f.help;
      for (const ParsedSample& s : f.samples) {
        if (!series.insert(series_key(s)).second) {
          ++st.samples_dropped;
          continue;
        }
        b.samples.push_back(&s);
      }
    }
  }
  std::string out;
  for (const auto& [name, b] : blocks) {
    if (b.samples.empty()) continue;  // as render_text: HELP/TYPE alone would only be noise
    if (b.help != nullptr) out += "# HELP " + name + ' ' + escape_help(*b.help) + '\n';
    out += "# TYPE " + name + ' ' + b.type + '\n';
    for (const ParsedSample* s : b.samples) append_sample(out, *s);
  }
  return out;
}

}  // namespace zenflow::metrics
