// Job spec parsing, --set overrides, strict validation and YAML output (docs/design.md §6).
#include "common/job_spec.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>
#include <type_traits>

#include "common/allowed_roots.h"
#include "common/input_file.h"
#include "common/storage/s3_uri.h"
#include "common/yaml_tree.h"

namespace zenflow {
namespace {

namespace fs = std::filesystem;

std::string join_key(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : prefix + "." + key;
}

// Shortest decimal text that reads back as exactly `v` (so to_yaml round-trips).
std::string format_number(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

// A scalar as quoted in messages; a huge one (a 50 MB name) is shortened.
std::string quote(const std::string& text) {
  constexpr std::size_t kShown = 64;
  if (text.size() <= kShown) return "'" + text + "'";
  return "'" + text.substr(0, kShown) + "...' (" + std::to_string(text.size()) + " characters)";
}

// What the user wrote, for the "got ..." part of an error.
std::string describe(const yaml::Node& node) {
  switch (node.type()) {
    case yaml::Node::Type::kScalar:
      return quote(node.text());
    case yaml::Node::Type::kSequence:
      return "a list";
    case yaml::Node::Type::kMap:
      return "a mapping";
    default:
      return "an empty value";
  }
}

std::string join_names(const std::vector<std::string>& names, const char* sep) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : sep) + n;
  return out;
}

// Scalar text with an optional leading '+' removed (from_chars does not accept it).
std::string_view numeric_text(const yaml::Node& node) {
  std::string_view text = node.text();
  if (!text.empty() && text.front() == '+') text.remove_prefix(1);
  return text;
}

std::optional<double> to_double(const yaml::Node& node) {
  if (!node.is_scalar()) return std::nullopt;
  std::string_view text = numeric_text(node);
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
    return std::nullopt;
  }
  return v;
}

// An integer as written: 100, +100 or 1e2 (2.5 is not an integer). `fits` is false for
// an integer outside int64 (9223372036854775808, 1e30): out of every key's range.
struct ParsedInt {
  bool integer = false;
  bool fits = false;
  int64_t value = 0;
};

ParsedInt parse_int(const yaml::Node& node) {
  ParsedInt out;
  if (!node.is_scalar()) return out;
  std::string_view text = numeric_text(node);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (!text.empty() && end == text.data() + text.size()) {
    if (ec == std::errc()) return {true, true, v};
    if (ec == std::errc::result_out_of_range) return {true, false, 0};
  }
  std::optional<double> d = to_double(node);
  if (!d || std::trunc(*d) != *d) return out;
  // 2^63 is exactly representable; every double below it in magnitude converts exactly.
  if (std::fabs(*d) >= 9223372036854775808.0) return {true, false, 0};
  return {true, true, static_cast<int64_t>(*d)};
}

std::optional<int64_t> to_int(const yaml::Node& node) {
  ParsedInt p = parse_int(node);
  if (!p.integer || !p.fits) return std::nullopt;
  return p.value;
}

bool is_auto(const yaml::Node& node) { return node.is_scalar() && node.text() == "auto"; }

// One YAML mapping of the spec, at `path`, with its set of allowed keys. Construction
// rejects non-mappings, unknown keys and repeated keys; a null node (`model:` with
// nothing after it) counts as an empty mapping.
class Section {
 public:
  Section(const yaml::Node& node, std::string path, std::vector<std::string> allowed)
      : path_(std::move(path)) {
    if (node.is_null()) return;
    if (!node.is_map()) {
      throw SpecError(path_.empty() ? "<root>" : path_, "must be a mapping, got " + describe(node));
    }
    for (std::size_t i = 0; i < node.size(); ++i) {
      if (!node.key(i).is_scalar()) {
        throw SpecError(path_.empty() ? "<root>" : path_,
                        "keys must be plain names, got " + describe(node.key(i)));
      }
      const std::string& key = node.key(i).text();
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        throw SpecError(key_path(key), "unknown key (allowed: " + join_names(allowed, ", ") + ")");
      }
      if (!fields_.emplace(key, &node.value(i)).second) {
        throw SpecError(key_path(key), "key appears more than once");
      }
    }
  }

  // The value under `key`, or nullptr when the key is absent (or, if `null_ok`, written
  // with no value). A key written with no value is an error otherwise: it is more
  // likely a slip than a request for the default.
  const yaml::Node* find(const std::string& key, bool null_ok = false) const {
    auto it = fields_.find(key);
    if (it == fields_.end()) return nullptr;
    if (it->second->is_null()) {
      if (null_ok) return nullptr;
      fail(key, "has no value (omit the key to get the default)");
    }
    return it->second;
  }

  // The value under `key` as a node (null when absent), for nested sections.
  const yaml::Node& child(const std::string& key) const {
    static const yaml::Node absent;
    auto it = fields_.find(key);
    return it == fields_.end() ? absent : *it->second;
  }

  std::string key_path(const std::string& key) const { return join_key(path_, key); }

  // Throws "<path>.<key>: <reason>" with the offending value.
  [[noreturn]] void fail(const std::string& key, const std::string& reason) const {
    throw SpecError(key_path(key), reason);
  }

 private:
  std::string path_;
  std::map<std::string, const yaml::Node*> fields_;  // into the tree, which outlives it
};

// Allowed numeric interval; infinite ends are unbounded.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  bool lo_closed = true;
  double hi = std::numeric_limits<double>::infinity();
  bool hi_closed = true;

  bool contains(double v) const {
    return (lo_closed ? v >= lo : v > lo) && (hi_closed ? v <= hi : v < hi);
  }
  std::string text() const {
    bool has_lo = std::isfinite(lo), has_hi = std::isfinite(hi);
    if (has_lo && has_hi) {
      return std::string("in ") + (lo_closed ? "[" : "(") + format_number(lo) + ", " +
             format_number(hi) + (hi_closed ? "]" : ")");
    }
    if (has_lo) return (lo_closed ? ">= " : "> ") + format_number(lo);
    if (has_hi) return (hi_closed ? "<= " : "< ") + format_number(hi);
    return "a number";
  }
};

Range at_least(double lo) { return Range{lo, true}; }
Range above(double lo) { return Range{lo, false}; }
Range closed(double lo, double hi) { return Range{lo, true, hi, true}; }

void check_range(const Section& s, const std::string& key, const yaml::Node& node, double v,
                 const Range& range) {
  if (!range.contains(v)) s.fail(key, "must be " + range.text() + ", got " + node.text());
}

// Closed integer interval, in int64 (a double loses exactness near 2^63). Every integer
// key has one: an unbounded size is an allocation or a fork bomb waiting for a typo.
struct IntRange {
  int64_t lo;
  int64_t hi;
  bool contains(const ParsedInt& v) const { return v.fits && v.value >= lo && v.value <= hi; }
  std::string text() const { return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }
};

constexpr int64_t kBillion = 1000000000;
constexpr int64_t kMillion = 1000000;
constexpr int64_t kMaxCores = 4096;  // host threads, compute threads, listed core ids
constexpr int64_t kMaxCoreId = 65535;
constexpr std::size_t kMaxPathBytes = 4096;  // PATH_MAX on Linux
constexpr std::size_t kMaxNameChars = 128;

int64_t int_value(const Section& s, const std::string& key, const yaml::Node& node,
                  const IntRange& range) {
  const ParsedInt v = parse_int(node);
  if (!v.integer) s.fail(key, "must be an integer, got " + describe(node));
  if (!range.contains(v)) s.fail(key, "must be " + range.text() + ", got " + node.text());
  return v.value;
}

void read_number(const Section& s, const std::string& key, double& out, const Range& range = {}) {
  const yaml::Node* node = s.find(key);
  if (!node) return;
  std::optional<double> v = to_double(*node);
  if (!v) s.fail(key, "must be a finite number, got " + describe(*node));
  check_range(s, key, *node, *v, range);
  out = *v;
}

bool bool_value(const Section& s, const std::string& key, const yaml::Node& node) {
  if (node.is_scalar()) {
    const std::string& t = node.text();
    if (t == "true" || t == "True" || t == "TRUE") return true;
    if (t == "false" || t == "False" || t == "FALSE") return false;
  }
  s.fail(key, "must be true or false, got " + describe(node));
}

void read_bool(const Section& s, const std::string& key, bool& out) {
  if (const yaml::Node* node = s.find(key)) out = bool_value(s, key, *node);
}

// `optional` strings accept a key with no value, meaning "not given".
void read_string(const Section& s, const std::string& key, std::string& out,
                 bool optional = false, std::size_t max_bytes = kMaxPathBytes) {
  const yaml::Node* node = s.find(key, optional);
  if (!node) return;
  if (!node->is_scalar()) s.fail(key, "must be a string, got " + describe(*node));
  if (node->text().size() > max_bytes) {
    s.fail(key, "must be at most " + std::to_string(max_bytes) + " bytes, got " + describe(*node));
  }
  out = node->text();
}

void read_choice(const Section& s, const std::string& key, std::string& out,
                 const std::vector<std::string>& choices) {
  const yaml::Node* node = s.find(key);
  if (!node) return;
  if (!node->is_scalar() ||
      std::find(choices.begin(), choices.end(), node->text()) == choices.end()) {
    s.fail(key, "must be one of " + join_names(choices, ", ") + "; got " + describe(*node));
  }
  out = node->text();
}

// "auto" or an integer in `range`.
void read_int_or_auto(const Section& s, const std::string& key, bool& is_auto_out, int64_t& out,
                      const IntRange& range) {
  const yaml::Node* node = s.find(key);
  if (!node) return;
  if (is_auto(*node)) {
    is_auto_out = true;
    out = 0;
    return;
  }
  const ParsedInt v = parse_int(*node);
  if (!range.contains(v)) {
    s.fail(key, "must be \"auto\" or an integer " + range.text() + ", got " +
                    (v.integer ? node->text() : describe(*node)));
  }
  is_auto_out = false;
  out = v.value;
}

// Relative paths are taken relative to the spec's directory; absolute ones stay as written.
std::string resolve_path(const std::string& base_dir, const std::string& p) {
  if (p.empty() || fs::path(p).is_absolute()) return p;
  fs::path base = base_dir.empty() ? fs::path(".") : fs::path(base_dir);
  return (base / p).lexically_normal().string();
}

// The block-style YAML to_yaml writes. (yaml-cpp's Emitter took 200 us a spec, twice the
// parse, and the coordinator writes one per submit.) A string is written plain when it can
// only read back as that string, else double-quoted, with YAML's escapes for quotes,
// backslashes and control bytes.
class SpecWriter {
 public:
  void begin(const char* key) {
    line(key);
    out_ += '\n';
    depth_ += 1;
  }
  void end() { depth_ -= 1; }
  void raw(const char* key, const std::string& value) {  // numbers, booleans, ~
    line(key);
    out_ += ' ';
    out_ += value;
    out_ += '\n';
  }
  void str(const char* key, const std::string& value) { raw(key, scalar(value)); }
  void num(const char* key, double v) { raw(key, format_number(v)); }
  void integer(const char* key, int64_t v) { raw(key, std::to_string(v)); }
  void boolean(const char* key, bool v) { raw(key, v ? "true" : "false"); }
  template <typename T>
  void flow(const char* key, const std::vector<T>& items) {
    std::string v = "[";
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) v += ", ";
      if constexpr (std::is_same_v<T, std::string>) {
        v += scalar(items[i]);
      } else {
        v += std::to_string(items[i]);
      }
    }
    raw(key, v + "]");
  }
  std::string take() { return std::move(out_); }

  static std::string scalar(const std::string& v) {
    static const std::set<std::string> kWords = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"};
    std::string lower(v);
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    bool plain = !v.empty() && v.size() < 1024 && v[0] != '-' && v[0] != '+' && v[0] != '.' && !kWords.count(lower);
    for (size_t i = 0; plain && i < v.size(); ++i) {
      const unsigned char c = static_cast<unsigned char>(v[i]);
      plain = std::isalnum(c) || c == '_' || c == '/' || c == '.' || c == '-' || c == '+';
    }
    if (plain) return v;
    std::string q = "\"";
    for (const unsigned char c : v) {
      switch (c) {
        case '"': q += "\\\""; break;
        case '\\': q += "\\\\"; break;
        case '\n': q += "\\n"; break;
        case '\t': q += "\\t"; break;
        case '\r': q += "\\r"; break;
        default:
          if (c < 0x20 || c == 0x7f) {
            char esc[8];
            std::snprintf(esc, sizeof(esc), "\\x%02x", c);
            q += esc;
          } else {
            q += static_cast<char>(c);  // UTF-8 bytes as they are
          }
      }
    }
    return q + "\"";
  }

 private:
  void line(const char* key) {
    out_.append(static_cast<size_t>(2 * depth_), ' ');
    out_ += key;
    out_ += ':';
  }
  std::string out_;
  int depth_ = 0;
};

// The name becomes a path component (runs/<name>): a leading letter or digit rules out
// ".", ".." and hidden or option-like names; the length keeps paths and logs sane.
bool valid_name(const std::string& name) {
  auto alnum = [](char ch) {
    return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9');
  };
  if (name.empty() || name.size() > kMaxNameChars || !alnum(name.front())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char ch) { return alnum(ch) || ch == '.' || ch == '_' || ch == '-'; });
}

const char* const kNameRule =
    "1 to 128 characters: a letter or digit, then letters, digits, '.', '_' or '-'";

// `p` absolute, symlinks of its existing part resolved, without a trailing separator.
fs::path comparable_path(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) abs = p;
  fs::path canon = fs::weakly_canonical(abs, ec);
  if (ec) canon = abs;
  canon = canon.lexically_normal();
  if (!canon.has_filename() && canon.has_relative_path()) canon = canon.parent_path();
  return canon;
}

// checkpoint.dir receives step-N directories and its lock, and old checkpoints are pruned
// there: it must be a directory of its own, not one that holds the user's files.

void check_checkpoint_dir(const CheckpointSpec& c, const std::string& name, const std::string& spec_dir,
                          SpecSite site) {
  if (storage::is_s3_uri(c.dir)) {  // its syntax was checked as it was read
    if (storage::parse_s3_uri(c.dir).key.empty())
      throw SpecError("checkpoint.dir", "must not be a whole bucket (" + c.dir + "); use a prefix such as " + c.dir +
                                            (c.dir.back() == '/' ? "" : "/") + "runs/" + name);
    return;
  }
  const std::string use = "; use a subdirectory such as runs/" + name;
  if (site == SpecSite::kRunsElsewhere) {  // lexical rules only: no system call
    auto lexical = [](const fs::path& p) {
      fs::path n = p.lexically_normal();
      if (!n.has_filename() && n.has_relative_path()) n = n.parent_path();
      return n.empty() ? fs::path(".") : n;
    };
    const fs::path dir = lexical(c.dir);
    if (dir.is_absolute() && dir == dir.root_path())
      throw SpecError("checkpoint.dir", "must not be the root directory (" + dir.string() + ")" + use);
    if (dir == lexical(spec_dir.empty() ? "." : spec_dir))
      throw SpecError("checkpoint.dir",
                      "must not be the directory holding the job spec (" + dir.string() + ")" + use);
    return;
  }
  const fs::path dir = comparable_path(c.dir);
  if (dir == dir.root_path()) {
    throw SpecError("checkpoint.dir", "must not be the root directory (" + dir.string() + ")" + use);
  }
  const char* home = std::getenv("HOME");
  if (home && *home && dir == comparable_path(home)) {
    throw SpecError("checkpoint.dir", "must not be the home directory (" + dir.string() + ")" + use);
  }
  if (dir == comparable_path(spec_dir.empty() ? "." : spec_dir)) {
    throw SpecError("checkpoint.dir",
                    "must not be the directory holding the job spec (" + dir.string() + ")" + use);
  }
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    throw SpecError("checkpoint.dir",
                    "is " + describe_file_type(st.st_mode) + ", expected a directory: " + dir.string());
  }
}

// ---- Lists ---------------------------------------------------------------------------------

// A list of strings, or one string holding a comma-separated list.
std::vector<std::string> string_list(const Section& s, const std::string& key, const yaml::Node& node) {
  std::vector<std::string> out;
  if (node.is_scalar()) {
    std::string item;
    for (char c : node.text() + ",") {
      if (c == ',') {
        out.push_back(item);
        item.clear();
      } else if (c != ' ') {
        item += c;
      }
    }
    if (out.size() == 1 && out[0].empty()) out.clear();
  } else if (node.is_sequence()) {
    for (std::size_t i = 0; i < node.size(); ++i) {
      if (!node.item(i).is_scalar()) s.fail(key, "items must be strings, got " + describe(node.item(i)) + " (item " + std::to_string(i) + ")");
      out.push_back(node.item(i).text());
    }
  } else {
    s.fail(key, "must be a list, got " + describe(node));
  }
  return out;
}

std::vector<std::string> parse_addresses(const Section& s, const std::string& key, const yaml::Node& node) {
  std::vector<std::string> addresses = string_list(s, key, node);
  if (addresses.size() > 1024) s.fail(key, "must list at most 1024 nodes, got " + std::to_string(addresses.size()));
  std::set<std::string> seen;
  for (std::size_t i = 0; i < addresses.size(); ++i) {
    const std::string& a = addresses[i];
    const std::size_t colon = a.rfind(':');
    const std::string where = " (item " + std::to_string(i) + ")";
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < a.size() && a.size() <= 300;
    int64_t port = 0;
    if (ok) {
      for (std::size_t c = colon + 1; c < a.size(); ++c) ok = ok && std::isdigit(static_cast<unsigned char>(a[c]));
      if (ok) port = std::stoll(a.substr(colon + 1, 6));
    }
    if (!ok || port < 1 || port > 65535) s.fail(key, "must be HOST:PORT with a port in [1, 65535], got \"" + a + "\"" + where);
    if (!seen.insert(a).second) s.fail(key, "\"" + a + "\" appears twice" + where);
  }
  return addresses;
}

std::vector<std::string> parse_node_loss_steps(const Section& s, const std::string& key, const yaml::Node& node) {
  std::vector<std::string> steps = string_list(s, key, node);
  const std::vector<std::string> known = {"spare", "in_process", "fail"};
  if (steps.empty()) s.fail(key, "must name at least one of spare, in_process, fail");
  std::set<std::string> seen;
  for (const std::string& x : steps) {
    if (std::find(known.begin(), known.end(), x) == known.end())
      s.fail(key, "must be a list of spare, in_process, fail; got \"" + x + "\"");
    if (!seen.insert(x).second) s.fail(key, "\"" + x + "\" appears twice");
  }
  if (steps.back() != "fail" && seen.count("fail")) s.fail(key, "\"fail\" must come last (nothing after it is tried)");
  return steps;
}

std::vector<int> parse_core_ids(const Section& s, const std::string& key, const yaml::Node& cores) {
  const std::string expected = "must be \"auto\" or a non-empty list of core ids";
  if (!cores.is_sequence() || cores.size() == 0) s.fail(key, expected + ", got " + describe(cores));
  if (cores.size() > static_cast<std::size_t>(kMaxCores)) {
    s.fail(key, "must list at most " + std::to_string(kMaxCores) + " core ids, got " + std::to_string(cores.size()));
  }
  std::vector<int> ids;
  std::set<int64_t> seen;
  for (std::size_t i = 0; i < cores.size(); ++i) {
    const yaml::Node& item = cores.item(i);
    const ParsedInt parsed = parse_int(item);
    // Out of int64 is out of range, not "not an integer".
    const std::optional<int64_t> id =
        parsed.integer ? std::optional<int64_t>(parsed.fits ? parsed.value : -1) : std::nullopt;
    const std::string where = " (item " + std::to_string(i) + ")";
    if (!id) s.fail(key, "core ids must be integers, got " + describe(item) + where);
    if (*id < 0 || *id > kMaxCoreId) {
      s.fail(key, "core ids must be in [0, " + std::to_string(kMaxCoreId) + "], got " + item.text() + where);
    }
    if (!seen.insert(*id).second) s.fail(key, "core id " + std::to_string(*id) + " appears twice" + where);
    ids.push_back(static_cast<int>(*id));
  }
  return ids;
}

// ---- model.config ----------------------------------------------------------------------------

// The HF config.json keys model.config accepts, in the order messages list them. Sizes are
// integers >= 1, each bounded (above the largest public models by a wide margin, and below
// anything that overflows a tensor size: 1024 layers x 131072 hidden is already ~7e13
// parameters); reals are > 0; the flag is a boolean or 0/1. Kept in a std::map<string,
// double> (only the keys the user wrote), so these rows are not members.
struct ConfigKey {
  enum Kind { kSize, kReal, kFlag };
  const char* key;
  Kind kind;
  int64_t max;  // kSize only
  const char* meaning;
};
const ConfigKey kModelConfigKeys[] = {
    {"hidden_size", ConfigKey::kSize, 131072, "Width of the hidden states"},
    {"num_hidden_layers", ConfigKey::kSize, 1024, "Transformer blocks"},
    {"num_attention_heads", ConfigKey::kSize, 4096, "Query heads; divides hidden_size"},
    {"num_key_value_heads", ConfigKey::kSize, 4096, "Key/value heads (grouped-query attention); divides num_attention_heads"},
    {"intermediate_size", ConfigKey::kSize, 1048576, "Hidden width of the MLP"},
    {"vocab_size", ConfigKey::kSize, 16777216, "Embedding rows (tokens)"},
    {"max_position_embeddings", ConfigKey::kSize, 4194304, "Longest sequence the model takes; train.seq_len <= it"},
    {"rope_theta", ConfigKey::kReal, 0, "Rotary embedding base (llama)"},
    {"rms_norm_eps", ConfigKey::kReal, 0, "Epsilon of the normalization layers"},
    {"initializer_range", ConfigKey::kReal, 0, "Standard deviation of the random initialization"},
    {"tie_word_embeddings", ConfigKey::kFlag, 0, "The output layer shares the input embedding"},
};

const ConfigKey* find_config_key(const std::string& key) {
  for (const ConfigKey& k : kModelConfigKeys)
    if (key == k.key) return &k;
  return nullptr;
}

std::map<std::string, double> parse_model_config(const yaml::Node& node) {
  std::vector<std::string> keys;
  for (const ConfigKey& k : kModelConfigKeys) keys.push_back(k.key);
  Section c(node, "model.config", keys);
  std::map<std::string, double> config;
  for (const ConfigKey& k : kModelConfigKeys) {
    const yaml::Node* v = c.find(k.key);
    if (!v) continue;
    if (k.kind == ConfigKey::kSize) {
      config[k.key] = static_cast<double>(int_value(c, k.key, *v, {1, k.max}));
    } else if (k.kind == ConfigKey::kFlag) {
      std::optional<int64_t> as_int = to_int(*v);
      if (as_int && (*as_int == 0 || *as_int == 1)) {
        config[k.key] = static_cast<double>(*as_int);
      } else {
        config[k.key] = bool_value(c, k.key, *v) ? 1.0 : 0.0;
      }
    } else {
      double x = 0;
      read_number(c, k.key, x, above(0));
      config[k.key] = x;
    }
  }
  auto has = [&](const char* k) { return config.count(k) != 0; };
  auto get = [&](const char* k) { return static_cast<int64_t>(config.at(k)); };
  if (has("hidden_size") && has("num_attention_heads") && get("hidden_size") % get("num_attention_heads") != 0) {
    c.fail("hidden_size", "must be a multiple of num_attention_heads (" + std::to_string(get("num_attention_heads")) +
                              "), got " + std::to_string(get("hidden_size")));
  }
  if (has("num_attention_heads") && has("num_key_value_heads") &&
      get("num_attention_heads") % get("num_key_value_heads") != 0) {
    c.fail("num_key_value_heads", "must divide num_attention_heads (" + std::to_string(get("num_attention_heads")) +
                                      "), got " + std::to_string(get("num_key_value_heads")));
  }
  return config;
}

void write_model_config(SpecWriter& out, const char* key, const std::map<std::string, double>& config) {
  out.begin(key);
  for (const auto& [name, value] : config) {
    const ConfigKey* k = find_config_key(name);
    if (k && k->kind == ConfigKey::kFlag) {
      out.boolean(name.c_str(), value != 0);
    } else if (k && k->kind == ConfigKey::kSize) {
      out.integer(name.c_str(), static_cast<int64_t>(value));
    } else {
      out.num(name.c_str(), value);
    }
  }
  out.end();
}

// ---- The field table ---------------------------------------------------------------------------
//
// Each section of the spec is one function, rows(V&, Of<Section>), with one row per YAML
// key in the order messages list the keys, to_yaml writes them and docs/spec.md documents
// them. A row says what the key takes (its kind: Int, Real, ...), its bounds, its meaning
// (one line, for docs/spec.md) and the member(s) it fills; the member's initializer
// (common/job_spec.h) is the default. Parsing (Reader), to_yaml (Writer), operator==
// (Equal), each section's allowed keys (KeyList) and docs/spec.md's table (Reference) all
// walk these rows: a new knob is its member plus one row. Rules between keys are
// hand-written in check_rules(), each run right after the row it names.

template <typename S>
struct Of {};

// A number within `range`; with `or_auto`, "auto" too.
template <typename RangeType, bool or_auto>
struct Bounded {
  const char* key;
  RangeType range;
  const char* meaning;
};
// An integer: int64_t, or uint64_t (train.seed) read within the range.
using Int = Bounded<IntRange, false>;
// A finite number: double, or std::optional<double> (a key with no value: unset).
using Real = Bounded<Range, false>;
// "auto" or an integer: members (bool is_auto, int64_t value), or one int64_t where 0
// stands for auto.
using IntOrAuto = Bounded<IntRange, true>;
// "auto" or a number: members (bool is_auto, double value).
using RealOrAuto = Bounded<Range, true>;
struct Flag {
  const char* key;
  const char* meaning;
};
// One of `choices`: std::string, and optionally a bool member recording whether the key
// was written (model.arch: to_yaml writes it only then).
struct Choice {
  const char* key;
  std::vector<std::string> choices;
  const char* meaning;
};
struct Text {
  const char* key;
  const char* meaning;
  bool null_ok = false;  // `key:` with no value means "not given"
  std::size_t max_bytes = kMaxPathBytes;
};
// A path, resolved against the spec's directory as it is read.
struct Path {
  const char* key;
  const char* meaning;
  bool null_ok = false;
  const char* if_empty = nullptr;  // the reason an empty value is refused; nullptr: allowed
  const char* word = nullptr;      // a value that is not a path (data.tokenizer: "byte")
  bool omit_empty = false;         // to_yaml leaves the key out when empty
  bool s3_ok = false;              // an s3://bucket/prefix URI is taken as it is (checkpoint.dir)
};
// A list the parse function reads and checks: std::vector<T>, or (bool is_auto,
// std::vector<T>) when "auto" is allowed too.
template <typename T>
struct List {
  const char* key;
  std::vector<T> (*parse)(const Section&, const std::string& key, const yaml::Node&);
  const char* type;    // for the reference
  const char* bounds;  // for the reference
  const char* meaning;
  bool null_ok = false;
};
// The job's name (required; kNameRule).
struct Name {
  const char* key;
  const char* meaning;
};
// model.config: the kModelConfigKeys map.
struct ModelConfig {
  const char* key;
};
// A nested section: its own rows.
struct Nested {
  const char* key;
};

template <typename V>
void rows(V& v, Of<ModelSpec>) {
  v(Choice{"arch", {"llama", "gpt2"}, "Architecture; with model.from and arch both written, the directory's must be it"},
    &ModelSpec::arch, &ModelSpec::arch_given);
  v(Path{"from",
         "Directory with config.json and safetensors weights, or its s3://bucket/prefix (downloaded into the "
         "worker's cache); empty: random initialization",
         true, nullptr, nullptr, false, true},
    &ModelSpec::from);
  v(ModelConfig{"config"}, &ModelSpec::config);
}

template <typename V>
void rows(V& v, Of<DataSpec>) {
  v(Path{"train", "Training data: a file, or a directory (its regular files, sorted); or an s3:// object or prefix",
         true, "required (a file or directory of training data)", nullptr, false, true},
    &DataSpec::train);
  v(Path{"val", "Validation data (a path or an s3:// URI); empty: hold out data.val_fraction of train", true, nullptr,
         nullptr, false, true},
    &DataSpec::val);
  v(Choice{"format", {"text", "jsonl", "tokens"}, "How the data files are read"}, &DataSpec::format);
  v(Path{"tokenizer", "\"byte\", or a tokenizer.json (or a directory holding one; or an s3:// URI of either)", false,
         "must be \"byte\" or a tokenizer.json path, got ''", "byte", false, true},
    &DataSpec::tokenizer);
  v(Real{"val_fraction", closed(0, 0.5), "Share of train held out for validation when data.val is empty"},
    &DataSpec::val_fraction);
}

template <typename V>
void rows(V& v, Of<TrainSpec>) {
  v(Int{"steps", {1, kBillion}, "Optimizer steps"}, &TrainSpec::steps);
  v(Int{"micro_batch", {1, 65536}, "Sequences per rank in one forward/backward pass"}, &TrainSpec::micro_batch);
  v(Int{"grad_accum", {1, 65536}, "Micro-batches per optimizer step"}, &TrainSpec::grad_accum);
  v(Int{"seq_len", {2, 1048576}, "Tokens per sequence; <= model.config.max_position_embeddings when given"},
    &TrainSpec::seq_len);
  v(Real{"lr", above(0), "Peak learning rate"}, &TrainSpec::lr);
  v(Choice{"schedule", {"cosine", "linear", "constant"}, "Learning-rate decay after the warm-up"},
    &TrainSpec::schedule);
  v(Int{"warmup_steps", {0, kBillion}, "Linear warm-up steps; <= train.steps; when omitted, min(10, train.steps)"},
    &TrainSpec::warmup_steps);
  v(Real{"min_lr_ratio", closed(0, 1), "Final learning rate as a fraction of train.lr"}, &TrainSpec::min_lr_ratio);
  v(Real{"weight_decay", at_least(0), "Decoupled (AdamW) weight decay"}, &TrainSpec::weight_decay);
  v(Real{"grad_clip", at_least(0), "Clip of the global gradient L2 norm; 0 disables"}, &TrainSpec::grad_clip);
  v(Int{"seed", {0, std::numeric_limits<int64_t>::max()}, "Seed of the initialization and the data order"},
    &TrainSpec::seed);
  v(Int{"eval_every", {0, kBillion}, "Steps between evaluations; 0: only at the end"}, &TrainSpec::eval_every);
  v(Int{"eval_batches", {1, kMillion}, "Validation batches per evaluation"}, &TrainSpec::eval_batches);
  v(Choice{"device", {"auto", "cpu", "cuda"}, "Where the model trains; auto: cuda when there is one"},
    &TrainSpec::device);
  v(Choice{"dtype", {"auto", "float32", "bfloat16", "float16"},
           "Weights on the device; auto: bfloat16 on cuda, float32 on the cpu"},
    &TrainSpec::dtype);
  v(Choice{"autocast", {"none", "bfloat16", "float16"},
           "Mixed precision on cuda (matmuls in this dtype, weights in train.dtype); ignored on the cpu"},
    &TrainSpec::autocast);
  v(Int{"compute_threads", {0, kMaxCores}, "CPU threads of the training computation; 0: the cores the host optimizer leaves"},
    &TrainSpec::compute_threads);
  v(Flag{"activation_checkpointing",
         "Keep only each decoder layer's input through the forward and recompute the layer in the backward "
         "(about one more forward of compute for a fraction of the activation memory)"},
    &TrainSpec::activation_checkpointing);
  v(Choice{"shard", {"none", "gradients", "parameters"},
           "Across data-parallel ranks: gradients: each rank keeps 1/ranks of the gradients and optimizer "
           "state (ZeRO-2); parameters: of the weights too, each layer's gathered just before its forward and "
           "its recomputing backward (ZeRO-3; needs activation_checkpointing)"},
    &TrainSpec::shard);
  v(Flag{"offload_parameters",
         "Keep the weights in host memory and copy each layer's to the device just before its forward and its "
         "recomputing backward, one layer ahead, so the device holds two layers' weights instead of the model's; "
         "the gradients go to the host layer by layer. optimizer.mode offload, or zenflow, where the selected "
         "columns stay on the device and only the others stream; needs activation_checkpointing"},
    &TrainSpec::offload_parameters);
}

template <typename V>
void rows(V& v, Of<ZenflowSpec>) {
  v(Real{"topk_ratio", closed(0, 1), "Share of each large matrix's columns (by gradient importance) updated on the device every step"},
    &ZenflowSpec::topk_ratio);
  v(Choice{"select_strategy", {"auto", "step", "epoch"},
           "When the columns are re-selected: step (every select_interval steps), epoch, or auto (each epoch, and "
           "when a matrix's selected share of importance drops below reselect_threshold)"},
    &ZenflowSpec::select_strategy);
  v(IntOrAuto{"select_interval", {1, kBillion},
              "Steps (step) or epochs (epoch) between re-selections; a multiple of update_interval for step; auto: "
              "10 windows, or 1 epoch"},
    &ZenflowSpec::select_interval_auto, &ZenflowSpec::select_interval);
  v(IntOrAuto{"update_interval", {1, kMillion},
              "Steps per window: the host columns get one update per window; auto: a window closes once "
              "auto_ratio of the matrices are ready, or after max_update_interval steps"},
    &ZenflowSpec::update_interval_auto, &ZenflowSpec::update_interval);
  v(Int{"full_warm_up_rounds", {0, kMillion}, "Steps before the first selection, run as offload (every column updated on the host each step)"},
    &ZenflowSpec::full_warm_up_rounds);
  v(Flag{"overlap_step", "Run a window's host update while the next window trains"}, &ZenflowSpec::overlap_step);
  v(Choice{"importance", {"l2", "l1"}, "Column importance: the L2 or L1 norm of its gradient"},
    &ZenflowSpec::importance);
  v(Real{"reselect_threshold", Range{0, false, 1, true},
         "select_strategy auto: re-select a matrix whose selected columns hold less than this share of a fresh "
         "selection's importance"},
    &ZenflowSpec::reselect_threshold);
  v(Real{"auto_ratio", Range{0, false, 1, true},
         "update_interval auto: the share of matrices that must be ready before a window closes"},
    &ZenflowSpec::auto_ratio);
  v(Int{"max_update_interval", {1, kMillion}, "update_interval auto: the longest window"},
    &ZenflowSpec::max_update_interval);
  v(Int{"min_split_numel", {1, int64_t{1} << 40}, "Parameters with fewer elements stay on the device"},
    &ZenflowSpec::min_split_numel);
}

template <typename V>
void rows(V& v, Of<HostSpec>) {
  v(IntOrAuto{"threads", {1, kMaxCores}, "Host optimizer threads; auto: half this rank's cores, at least 1"},
    &HostSpec::threads_auto, &HostSpec::threads);
  v(List<int>{"reserved_cores", parse_core_ids, "list of integers or auto",
              "auto, or 1 to 4096 distinct core ids in [0, 65535]",
              "Cores of the host optimizer threads; auto: the last cores of this rank's share"},
    &HostSpec::reserved_cores_auto, &HostSpec::reserved_cores);
  v(Int{"nodes", {0, 1024}, "Remote zenflow-optimizer nodes a coordinator assigns; 0: in-process"}, &HostSpec::nodes);
  v(List<std::string>{"addresses", parse_addresses, "list of strings", "at most 1024 distinct HOST:PORT",
                      "zenflow-optimizer nodes holding each rank's host state; empty: optimizer.host.nodes, or in-process",
                      true},
    &HostSpec::addresses);
  v(Path{"token_file", "File with the token the nodes require", true, nullptr, nullptr, true}, &HostSpec::token_file);
  v(List<std::string>{"on_node_loss", parse_node_loss_steps, "list of strings",
                      "spare, in_process, fail, each at most once, fail last",
                      "What a lost node leads to, tried in order"},
    &HostSpec::on_node_loss);
  v(Flag{"huge_pages", "Back the host state with huge pages"}, &HostSpec::huge_pages);
  v(Int{"device_staging_mib", {0, 1 << 20},
        "Device memory that stages the host-owned columns' gradients and updates, in chunks; 0: two whole "
        "gradients and one whole update (about 3 x 2 bytes per split bf16 element), so each copy overlaps the "
        "next step; > 0 also keeps 24 instead of 32 host bytes per split bf16 element. One rank, or train.shard, "
        "with the in-process host optimizer"},
    &HostSpec::device_staging_mib);
}

template <typename V>
void rows(V& v, Of<OptimizerSpec>) {
  v(Choice{"mode", {"zenflow", "offload", "device"},
           "zenflow: top-k columns on the device, the rest on the host once a window; offload: every update on "
           "the host, every step; device: plain AdamW on the device"},
    &OptimizerSpec::mode);
  v(Real{"beta1", Range{0, true, 1, false}, "AdamW decay of the first moment"}, &OptimizerSpec::beta1);
  v(Real{"beta2", Range{0, true, 1, false}, "AdamW decay of the second moment"}, &OptimizerSpec::beta2);
  v(Real{"eps", above(0), "AdamW epsilon of the denominator"}, &OptimizerSpec::eps);
  v(Nested{"zenflow"}, &OptimizerSpec::zenflow);
  v(Nested{"host"}, &OptimizerSpec::host);
}

template <typename V>
void rows(V& v, Of<ResourcesSpec>) {
  v(Int{"workers", {1, kMaxCores}, "Workers the job runs on"}, &ResourcesSpec::workers);
  v(Int{"gpus_per_worker", {0, 64}, "GPUs the job takes on each worker"}, &ResourcesSpec::gpus_per_worker);
  v(RealOrAuto{"host_memory_gb", Range{0, false, 1 << 20, true},
               "Host memory the job takes on each worker, in GiB; auto: estimated from the model and optimizer.mode"},
    &ResourcesSpec::host_memory_gb_auto, &ResourcesSpec::host_memory_gb);
  v(Int{"priority", {-kMillion, kMillion}, "Queue order: higher first; may preempt strictly lower priorities"},
    &ResourcesSpec::priority);
  v(Int{"max_restarts", {0, 1000},
        "Restarts after a lost worker or a crashed rank before the job is FAILED; preemption does not count"},
    &ResourcesSpec::max_restarts);
  v(IntOrAuto{"hang_timeout", {ResourcesSpec::kMinHangTimeoutSeconds, kBillion},
              "Seconds without progress before an attempt is killed and requeued; auto: the larger of 10 x the "
              "median step time and 300 (3 x before the first step)"},
    &ResourcesSpec::hang_timeout);
}

template <typename V>
void rows(V& v, Of<CheckpointSpec>) {
  v(Path{"dir",
         "Where step-N checkpoints are written: a directory, or s3://bucket/prefix (written through a local "
         "staging directory, uploaded in the background); absent: runs/<name> under the current directory (submitted "
         "to a coordinator with --checkpoint-root: ROOT/<name>)",
         true, nullptr, nullptr, false, true},
    &CheckpointSpec::dir);
  v(Int{"every_steps", {0, kBillion}, "Steps between periodic checkpoints; 0: none"}, &CheckpointSpec::every_steps);
  v(Int{"keep", {1, kMillion}, "Checkpoints kept; older ones are pruned"}, &CheckpointSpec::keep);
  v(Int{"upload_mib_per_s", {0, kMillion},
        "With an s3:// dir: the most MiB/s the background upload sends, over all its parts (each rank's shard "
        "upload too), to leave the network to training; 0: no cap"},
    &CheckpointSpec::upload_mib_per_s);
}

template <typename V>
void rows(V& v, Of<CostSpec>) {
  v(Text{"instance_type", "Instance type whose price the pricing catalog gives", true, kMaxNameChars},
    &CostSpec::instance_type);
  v(Real{"usd_per_hour", at_least(0), "The job's own hourly rate in USD, charged in full (not a share of the instance); ~: the catalog's"},
    &CostSpec::usd_per_hour);
}

template <typename V>
void rows(V& v, Of<JobSpec>) {
  v(Name{"name", "The job's name; the default checkpoint directory is runs/<name>"}, &JobSpec::name);
  v(Nested{"model"}, &JobSpec::model);
  v(Nested{"data"}, &JobSpec::data);
  v(Nested{"train"}, &JobSpec::train);
  v(Nested{"optimizer"}, &JobSpec::optimizer);
  v(Nested{"resources"}, &JobSpec::resources);
  v(Nested{"checkpoint"}, &JobSpec::checkpoint);
  v(Nested{"cost"}, &JobSpec::cost);
}

// ---- Rules between keys ------------------------------------------------------------------------
//
// Hand-written, each run by the Reader right after the row it names (`after`), so that a
// spec with several mistakes is refused for the first one in row order.

struct ReadContext {
  std::string base_dir;
  SpecSite site;
};

template <typename S>
void check_rules(S&, const Section&, const ReadContext&, std::string_view /*after*/) {}

void check_rules(ModelSpec& m, const Section&, const ReadContext&, std::string_view after) {
  if (after == "from") m.arch_given = m.arch_given || m.from.empty();  // without a directory, arch decides
}

void check_rules(TrainSpec& t, const Section& s, const ReadContext&, std::string_view after) {
  if (after != "warmup_steps") return;
  // The default warm-up shrinks to fit a short run (--set train.steps=5 must just work);
  // a warm-up the user wrote must fit as written.
  if (!s.find("warmup_steps")) t.warmup_steps = std::min(t.warmup_steps, t.steps);
  if (t.warmup_steps > t.steps) {
    s.fail("warmup_steps", "must be <= train.steps (" + std::to_string(t.steps) + "), got " +
                               std::to_string(t.warmup_steps));
  }
}

void check_rules(ZenflowSpec& z, const Section& s, const ReadContext&, std::string_view after) {
  // Semantics §2: with select_strategy step, re-selection happens at window boundaries
  // only, so S must be a whole number of windows.
  if (after == "min_split_numel" && z.select_strategy == "step" && !z.select_interval_auto &&
      !z.update_interval_auto && z.select_interval % z.update_interval != 0) {
    s.fail("select_interval",
           "must be a positive multiple of update_interval (" + std::to_string(z.update_interval) +
               ") when select_strategy is step, got " + std::to_string(z.select_interval));
  }
}

void check_rules(HostSpec& h, const Section& s, const ReadContext&, std::string_view after) {
  if (after == "on_node_loss" && h.nodes > 0 && !h.addresses.empty() &&
      h.nodes != static_cast<int64_t>(h.addresses.size()))
    s.fail("nodes", "is " + std::to_string(h.nodes) + " but addresses lists " + std::to_string(h.addresses.size()) +
                        " nodes (give one of them, or make them agree)");
  if (after == "device_staging_mib" && h.device_staging_mib > 0 && (h.nodes > 0 || !h.addresses.empty()))
    s.fail("device_staging_mib", "applies to the in-process host optimizer; remote optimizer nodes (nodes / "
                                 "addresses) read gradients from whole device staging as they send them");
}

void check_rules(JobSpec& spec, const Section&, const ReadContext& ctx, std::string_view after) {
  // Sharding (docs/semantics.md §10) keeps each rank's host state in the rank.
  if (after == "optimizer" && spec.train.shard != "none") {
    if (spec.optimizer.host.nodes > 0 || !spec.optimizer.host.addresses.empty())
      throw SpecError("train.shard", "'" + spec.train.shard +
                                         "' keeps the optimizer state in the ranks; it does not work with remote "
                                         "optimizer nodes (optimizer.host.nodes / addresses)");
  }
  if (after == "train" && spec.train.offload_parameters) {
    if (!spec.train.activation_checkpointing)
      throw SpecError("train.offload_parameters", "needs train.activation_checkpointing: true (each layer's "
                                                  "weights are streamed again for its backward, which recomputes "
                                                  "the layer)");
    if (spec.train.shard != "none")
      throw SpecError("train.offload_parameters", "does not combine with train.shard: '" + spec.train.shard +
                                                      "' (the weights are either streamed from this host or "
                                                      "sharded across the ranks)");
  }
  if (after == "optimizer" && spec.train.offload_parameters) {
    if (spec.optimizer.mode == "device")
      throw SpecError("train.offload_parameters",
                      "needs optimizer.mode: offload or zenflow, got 'device' (device mode keeps every weight and its "
                      "optimizer state on the device)");
    if (spec.optimizer.mode == "zenflow" && spec.optimizer.host.device_staging_mib > 0)
      throw SpecError("train.offload_parameters",
                      "in zenflow mode stages the host columns' gradients on the host unit by unit; not with "
                      "optimizer.host.device_staging_mib (" +
                          std::to_string(spec.optimizer.host.device_staging_mib) + ")");
    if (spec.optimizer.host.nodes > 0 || !spec.optimizer.host.addresses.empty())
      throw SpecError("train.offload_parameters", "runs the host optimizer in this process, over the weights "
                                                  "it streams; not with remote optimizer nodes "
                                                  "(optimizer.host.nodes / addresses)");
  }
  if (after == "train" && spec.train.shard == "parameters" && !spec.train.activation_checkpointing)
    throw SpecError("train.shard", "'parameters' needs train.activation_checkpointing: true (each layer's "
                                   "weights are gathered again for its backward, which recomputes the layer)");
  if (after == "checkpoint") {
    // Written: against the spec's directory, like every path (its row). Absent: the current
    // directory's runs/<name>, so a shared spec (the checkout's examples/) never collects runs
    // beside it; load_job_spec makes it absolute.
    if (spec.checkpoint.dir.empty()) {
      spec.checkpoint.dir = "runs/" + spec.name;
      spec.checkpoint.dir_defaulted = true;
    }
    check_checkpoint_dir(spec.checkpoint, spec.name, ctx.base_dir, ctx.site);
  }
  // Learned position tables (gpt2) and rotary caches (llama) are sized by this.
  auto max_pos = spec.model.config.find("max_position_embeddings");
  if (after == "cost" && max_pos != spec.model.config.end() &&
      static_cast<double>(spec.train.seq_len) > max_pos->second) {
    throw SpecError("train.seq_len", "must be <= model.config.max_position_embeddings (" +
                                         format_number(max_pos->second) + "), got " +
                                         std::to_string(spec.train.seq_len));
  }
}

// ---- What the rows derive ----------------------------------------------------------------------

// The keys of a section, in row order: what its Section allows.
struct KeyList {
  std::vector<std::string> keys;
  template <typename Row, typename... Members>
  void operator()(const Row& row, Members...) {
    keys.emplace_back(row.key);
  }
};

template <typename S>
const std::vector<std::string>& keys_of() {
  static const std::vector<std::string> keys = [] {
    KeyList list;
    rows(list, Of<S>{});
    return list.keys;
  }();
  return keys;
}

// Reads one section into `out`: unknown and repeated keys first, then row by row the
// row's value and bounds and the rules that follow the row (check_rules).
template <typename S>
class Reader {
 public:
  Reader(const yaml::Node& node, const std::string& path, S& out, const ReadContext& ctx)
      : s_(node, path, keys_of<S>()), out_(out), ctx_(ctx) {}

  void run() { rows(*this, Of<S>{}); }

  template <typename Row, typename... Members>
  void operator()(const Row& row, Members... members) {
    read(row, members...);
    check_rules(out_, s_, ctx_, row.key);
  }

 private:
  template <typename T>
  void read(const Int& r, T S::*m) {
    if (const yaml::Node* node = s_.find(r.key)) out_.*m = static_cast<T>(int_value(s_, r.key, *node, r.range));
  }
  void read(const Real& r, double S::*m) { read_number(s_, r.key, out_.*m, r.range); }
  void read(const Real& r, std::optional<double> S::*m) {
    if (s_.find(r.key, true)) {
      double v = 0;
      read_number(s_, r.key, v, r.range);
      out_.*m = v;
    } else {
      (out_.*m).reset();
    }
  }
  void read(const Flag& r, bool S::*m) { read_bool(s_, r.key, out_.*m); }
  void read(const Choice& r, std::string S::*m) { read_choice(s_, r.key, out_.*m, r.choices); }
  void read(const Choice& r, std::string S::*m, bool S::*written) {
    read_choice(s_, r.key, out_.*m, r.choices);
    out_.*written = s_.find(r.key) != nullptr;
  }
  void read(const Text& r, std::string S::*m) { read_string(s_, r.key, out_.*m, r.null_ok, r.max_bytes); }
  void read(const Path& r, std::string S::*m) {
    std::string& path = out_.*m;
    read_string(s_, r.key, path, r.null_ok);
    if (r.if_empty && path.empty()) s_.fail(r.key, r.if_empty);
    if (storage::is_s3_uri(path)) {
      if (!r.s3_ok) s_.fail(r.key, "is an s3:// URI; this key takes a local path (got " + path.substr(0, 200) + ")");
      try {
        storage::parse_s3_uri(path);
      } catch (const std::invalid_argument& e) {
        s_.fail(r.key, e.what());
      }
      return;
    }
    if (!r.word || path != r.word) path = resolve_path(ctx_.base_dir, path);
  }
  void read(const IntOrAuto& r, bool S::*auto_flag, int64_t S::*m) {
    read_int_or_auto(s_, r.key, out_.*auto_flag, out_.*m, r.range);
  }
  void read(const IntOrAuto& r, int64_t S::*m) {  // 0 stands for auto
    bool zero = out_.*m == 0;
    read_int_or_auto(s_, r.key, zero, out_.*m, r.range);
    if (zero) out_.*m = 0;
  }
  void read(const RealOrAuto& r, bool S::*auto_flag, double S::*m) {
    const yaml::Node* node = s_.find(r.key);
    if (!node) return;
    if (is_auto(*node)) {
      out_.*auto_flag = true;
      out_.*m = 0;
      return;
    }
    std::optional<double> v = to_double(*node);
    if (!v) s_.fail(r.key, "must be \"auto\" or a number " + r.range.text() + ", got " + describe(*node));
    check_range(s_, r.key, *node, *v, r.range);
    out_.*auto_flag = false;
    out_.*m = *v;
  }
  template <typename T>
  void read(const List<T>& r, std::vector<T> S::*m) {
    if (const yaml::Node* node = s_.find(r.key, r.null_ok)) out_.*m = r.parse(s_, r.key, *node);
  }
  template <typename T>
  void read(const List<T>& r, bool S::*auto_flag, std::vector<T> S::*m) {
    const yaml::Node* node = s_.find(r.key, r.null_ok);
    if (!node) return;
    const bool automatic = is_auto(*node);
    out_.*m = automatic ? std::vector<T>{} : r.parse(s_, r.key, *node);
    out_.*auto_flag = automatic;
  }
  void read(const Name& r, std::string S::*m) {
    const yaml::Node* name = s_.find(r.key, true);
    if (!name) s_.fail(r.key, std::string("required (") + kNameRule + ")");
    if (!name->is_scalar() || !valid_name(name->text())) {
      s_.fail(r.key, std::string("must be ") + kNameRule + "; got " + describe(*name));
    }
    out_.*m = name->text();
  }
  void read(const ModelConfig& r, std::map<std::string, double> S::*m) {
    out_.*m = parse_model_config(s_.child(r.key));
  }
  template <typename Sub>
  void read(const Nested& r, Sub S::*m) {
    Reader<Sub>(s_.child(r.key), s_.key_path(r.key), out_.*m, ctx_).run();
  }

  Section s_;
  S& out_;
  const ReadContext& ctx_;
};

// Writes one section's keys, in row order, as to_yaml documents them.
template <typename S>
class Writer {
 public:
  Writer(SpecWriter& out, const S& v) : out_(out), v_(v) {}
  void write() { rows(*this, Of<S>{}); }

  template <typename T>
  void operator()(const Int& r, T S::*m) {
    out_.raw(r.key, std::to_string(v_.*m));
  }
  void operator()(const Real& r, double S::*m) { out_.num(r.key, v_.*m); }
  void operator()(const Real& r, std::optional<double> S::*m) {
    out_.raw(r.key, (v_.*m) ? format_number(*(v_.*m)) : "~");
  }
  void operator()(const Flag& r, bool S::*m) { out_.boolean(r.key, v_.*m); }
  void operator()(const Choice& r, std::string S::*m) { out_.str(r.key, v_.*m); }
  void operator()(const Choice& r, std::string S::*m, bool S::*written) {
    if (v_.*written) out_.str(r.key, v_.*m);
  }
  void operator()(const Text& r, std::string S::*m) { out_.str(r.key, v_.*m); }
  void operator()(const Path& r, std::string S::*m) {
    if (!r.omit_empty || !(v_.*m).empty()) out_.str(r.key, v_.*m);
  }
  void operator()(const IntOrAuto& r, bool S::*auto_flag, int64_t S::*m) {
    out_.str(r.key, v_.*auto_flag ? "auto" : std::to_string(v_.*m));
  }
  void operator()(const IntOrAuto& r, int64_t S::*m) { out_.str(r.key, v_.*m > 0 ? std::to_string(v_.*m) : "auto"); }
  void operator()(const RealOrAuto& r, bool S::*auto_flag, double S::*m) {
    out_.str(r.key, v_.*auto_flag ? "auto" : format_number(v_.*m));
  }
  template <typename T>
  void operator()(const List<T>& r, std::vector<T> S::*m) {
    out_.flow(r.key, v_.*m);
  }
  template <typename T>
  void operator()(const List<T>& r, bool S::*auto_flag, std::vector<T> S::*m) {
    if (v_.*auto_flag) {
      out_.str(r.key, "auto");
    } else {
      out_.flow(r.key, v_.*m);
    }
  }
  void operator()(const Name& r, std::string S::*m) { out_.str(r.key, v_.*m); }
  void operator()(const ModelConfig& r, std::map<std::string, double> S::*m) {
    write_model_config(out_, r.key, v_.*m);
  }
  template <typename Sub>
  void operator()(const Nested& r, Sub S::*m) {
    out_.begin(r.key);
    Writer<Sub>(out_, v_.*m).write();
    out_.end();
  }

 private:
  SpecWriter& out_;
  const S& v_;
};

// Every member a row names, compared exactly (doubles too).
template <typename S>
class Equal {
 public:
  Equal(const S& a, const S& b) : a_(a), b_(b) {}
  bool same() {
    rows(*this, Of<S>{});
    return same_;
  }
  template <typename Row, typename... Members>
  void operator()(const Row&, Members... m) {
    same_ = same_ && ((a_.*m == b_.*m) && ...);
  }

 private:
  const S& a_;
  const S& b_;
  bool same_ = true;
};

template <typename S>
bool rows_equal(const S& a, const S& b) {
  return Equal<S>(a, b).same();
}

// ---- The reference (docs/spec.md) ---------------------------------------------------------------

struct KeyDoc {
  std::string key, type, default_value, bounds, meaning;
};

// "in [0, 1]" -> "[0, 1]"; "a number" -> "finite".
std::string bounds_text(const std::string& range_text) {
  if (range_text.rfind("in ", 0) == 0) return range_text.substr(3);
  return range_text == "a number" ? "finite" : range_text;
}

std::string one_of(const std::vector<std::string>& choices) { return "one of " + join_names(choices, ", "); }

// One entry per key with its type, bounds and meaning from the row and its default as
// to_yaml writes it for a default-constructed section.
template <typename S>
class Reference {
 public:
  Reference(std::string path, const S& defaults, std::vector<KeyDoc>& out)
      : path_(std::move(path)), defaults_(defaults), out_(out) {}
  void list() { rows(*this, Of<S>{}); }

  template <typename T>
  void operator()(const Int& r, T S::*m) {
    add(r.key, "integer", written(r, m), bounds_text(r.range.text()), r.meaning);
  }
  template <typename T>
  void operator()(const Real& r, T S::*m) {
    const bool optional = !std::is_same_v<T, double>;
    add(r.key, optional ? "number or ~" : "number", written(r, m), bounds_text(r.range.text()), r.meaning);
  }
  void operator()(const Flag& r, bool S::*m) { add(r.key, "boolean", written(r, m), "true or false", r.meaning); }
  template <typename... M>
  void operator()(const Choice& r, M S::*... m) {
    add(r.key, "string", written(r, m...), one_of(r.choices), r.meaning);
  }
  void operator()(const Text& r, std::string S::*m) {
    add(r.key, "string", written(r, m), "at most " + std::to_string(r.max_bytes) + " bytes", r.meaning);
  }
  void operator()(const Path& r, std::string S::*m) {
    const std::string value = written(r, m);
    add(r.key, "path", r.if_empty && value == "\"\"" ? "required" : value,
        "at most " + std::to_string(kMaxPathBytes) + " bytes", r.meaning);
  }
  template <typename... M>
  void operator()(const IntOrAuto& r, M S::*... m) {
    add(r.key, "integer or auto", written(r, m...), bounds_text(r.range.text()), r.meaning);
  }
  void operator()(const RealOrAuto& r, bool S::*auto_flag, double S::*m) {
    add(r.key, "number or auto", written(r, auto_flag, m), bounds_text(r.range.text()), r.meaning);
  }
  template <typename T, typename... M>
  void operator()(const List<T>& r, M S::*... m) {
    add(r.key, r.type, written(r, m...), r.bounds, r.meaning);
  }
  void operator()(const Name& r, std::string S::*) { add(r.key, "string", "required", kNameRule, r.meaning); }
  void operator()(const ModelConfig& r, std::map<std::string, double> S::*) {
    for (const ConfigKey& k : kModelConfigKeys) {
      const std::string key = std::string(r.key) + "." + k.key;
      if (k.kind == ConfigKey::kSize) {
        add(key, "integer", "unset", "[1, " + std::to_string(k.max) + "]", k.meaning);
      } else if (k.kind == ConfigKey::kReal) {
        add(key, "number", "unset", bounds_text(above(0).text()), k.meaning);
      } else {
        add(key, "boolean", "unset", "true, false, 1 or 0", k.meaning);
      }
    }
  }
  template <typename Sub>
  void operator()(const Nested& r, Sub S::*m) {
    Reference<Sub>(join_key(path_, r.key), defaults_.*m, out_).list();
  }

 private:
  // The row's value in the defaults as to_yaml writes it ("key: value\n"); "" where to_yaml
  // leaves an empty value out.
  template <typename Row, typename... M>
  std::string written(const Row& row, M S::*... m) {
    SpecWriter w;
    Writer<S>(w, defaults_)(row, m...);
    const std::string line = w.take();
    const std::size_t colon = line.find(": ");
    return colon == std::string::npos ? "\"\"" : line.substr(colon + 2, line.size() - colon - 3);
  }
  void add(const std::string& key, std::string type, std::string value, std::string bounds, const char* meaning) {
    out_.push_back({join_key(path_, key), std::move(type), std::move(value), std::move(bounds), meaning});
  }

  std::string path_;
  const S& defaults_;
  std::vector<KeyDoc>& out_;
};

JobSpec validate(const yaml::Node& root, const std::string& base_dir, SpecSite site) {
  JobSpec spec;
  const ReadContext ctx{base_dir, site};
  Reader<JobSpec>(root, "", spec, ctx).run();
  return spec;
}

// Applies one "a.b.c=value" override to `root`, creating missing intermediate mappings.
void apply_override(yaml::Node& root, const std::string& assignment) {
  const std::size_t eq = assignment.find('=');
  std::vector<std::string> keys;
  if (eq != std::string::npos) {
    for (std::size_t start = 0;;) {
      const std::size_t dot = assignment.find('.', start);
      if (dot == std::string::npos || dot > eq) {
        keys.push_back(assignment.substr(start, eq - start));
        break;
      }
      keys.push_back(assignment.substr(start, dot - start));
      start = dot + 1;
    }
  }
  const bool bad_path =
      keys.empty() || std::any_of(keys.begin(), keys.end(), [](const std::string& k) {
        return k.empty() || k.find_first_of(" \t") != std::string::npos;
      });
  if (eq == std::string::npos || bad_path) {
    throw SpecError("--set",
                    "expected KEY.PATH=VALUE (e.g. train.steps=100), got '" + assignment + "'");
  }
  const std::string key_path = assignment.substr(0, eq);
  yaml::Node value;
  try {
    value = yaml::parse(assignment.substr(eq + 1));
  } catch (const yaml::ParseError& e) {
    throw SpecError(key_path, "cannot parse --set value '" + assignment.substr(eq + 1) + "': " + e.what());
  }

  if (root.is_null()) root = yaml::Node::map();
  yaml::Node* current = &root;
  std::string prefix;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    if (!current->is_map()) {
      throw SpecError(prefix.empty() ? "<root>" : prefix,
                      "cannot set '" + key_path + "': not a mapping, got " + describe(*current));
    }
    prefix = join_key(prefix, keys[i]);
    yaml::Node& next = current->set(keys[i]);
    if (next.is_null()) next = yaml::Node::map();
    current = &next;
  }
  if (!current->is_map()) {
    throw SpecError(prefix.empty() ? "<root>" : prefix,
                    "cannot set '" + key_path + "': not a mapping, got " + describe(*current));
  }
  current->set(keys.back()) = std::move(value);
}

JobSpec parse_from(const std::string& yaml_text, const std::vector<std::string>& overrides,
                   const std::string& base_dir, const std::string& source, SpecSite site = SpecSite::kRunsHere) {
  yaml::Node root;
  try {
    root = yaml::parse(yaml_text);
  } catch (const yaml::ParseError& e) {
    throw SpecError(source, e.what());
  }
  for (const std::string& o : overrides) apply_override(root, o);
  return validate(root, base_dir, site);
}

// `path` (a file or directory the spec names) must exist and be of a kind `accept`s; the
// error names `key` and the absolute path.
void check_input_path(const std::string& key, const std::string& path, const char* expected,
                      bool (*accept)(unsigned mode)) {
  std::error_code ec;
  fs::path abs = fs::absolute(path, ec);
  const std::string shown = ec ? path : abs.lexically_normal().string();
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    // require_regular_file words errno the same way for every input file.
    try {
      require_regular_file(path);
    } catch (const InputError& e) {
      const std::string what = e.what();
      throw SpecError(key, what.substr(e.path().size() + 2) + ": " + shown);
    }
    throw SpecError(key, "cannot stat: " + shown);
  }
  if (!accept(st.st_mode)) {
    throw SpecError(key, "is " + describe_file_type(st.st_mode) + ", expected " + expected + ": " + shown);
  }
}

bool regular_or_directory(unsigned mode) { return S_ISREG(mode) || S_ISDIR(mode); }
bool regular(unsigned mode) { return S_ISREG(mode); }
bool directory(unsigned mode) { return S_ISDIR(mode); }

}  // namespace

JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                       const std::string& base_dir) {
  return parse_from(yaml_text, overrides, base_dir, "<yaml>");
}

JobSpec parse_job_spec(const std::string& yaml_text, const std::vector<std::string>& overrides,
                       const std::string& base_dir, SpecSite site) {
  return parse_from(yaml_text, overrides, base_dir, "<yaml>", site);
}

JobSpec load_job_spec(const std::string& path, const std::vector<std::string>& overrides) {
  std::string text;
  try {
    text = read_regular_file(path, kMaxSpecBytes, "a job spec");
  } catch (const InputError& e) {
    const std::string what = e.what();
    throw SpecError(path, what.substr(e.path().size() + 2));
  }
  std::error_code ec;
  fs::path dir = fs::absolute(fs::path(path), ec).parent_path();
  if (ec) dir = fs::path(path).parent_path();
  JobSpec spec = parse_from(text, overrides, dir.string(), path);
  // The default checkpoint.dir is relative to the current directory: made absolute here, so
  // what `zenflow submit` sends and what `zenflow run` prints is the directory it means.
  if (!fs::path(spec.checkpoint.dir).is_absolute() && !storage::is_s3_uri(spec.checkpoint.dir)) {
    fs::path cwd = fs::current_path(ec);
    if (!ec) spec.checkpoint.dir = (cwd / spec.checkpoint.dir).lexically_normal().string();
  }
  check_allowed_roots(spec, allowed_roots_from_env());  // before any of its paths is looked at
  check_spec_paths(spec);
  return spec;
}

std::vector<std::pair<const char*, std::string>> confined_paths(const JobSpec& spec) {
  std::vector<std::pair<const char*, std::string>> out;
  auto add = [&](const char* key, const std::string& path) {
    if (!path.empty() && !storage::is_s3_uri(path)) out.emplace_back(key, path);  // a bucket is no local path
  };
  add("model.from", spec.model.from);
  add("data.train", spec.data.train);
  add("data.val", spec.data.val);
  if (spec.data.tokenizer != "byte") add("data.tokenizer", spec.data.tokenizer);
  add("checkpoint.dir", spec.checkpoint.dir);
  add("optimizer.host.token_file", spec.optimizer.host.token_file);
  return out;
}

namespace {
// `p` absolute, with `.`/`..` and the symlinks of its existing part resolved.
fs::path resolved(const std::string& p) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(fs::path(p)), ec);
  return ec ? fs::absolute(fs::path(p)).lexically_normal() : out;
}
}  // namespace

void check_allowed_roots(const JobSpec& spec, const std::vector<std::string>& roots) {
  if (roots.empty()) return;
  std::vector<fs::path> resolved_roots;
  std::string listed;
  for (const std::string& r : roots) {
    resolved_roots.push_back(resolved(r));
    listed += (listed.empty() ? "" : ", ") + r;
  }
  for (const auto& [key, path] : confined_paths(spec)) {
    const fs::path p = resolved(path);
    if (std::none_of(resolved_roots.begin(), resolved_roots.end(),
                     [&](const fs::path& root) { return path_within(p, root); }))
      throw SpecError(key, path + (p.string() == path ? "" : " (" + p.string() + ")") +
                               " is outside the directories this worker allows (" + listed +
                               "; zenflow-worker --allowed-root)");
  }
}

std::vector<std::string> allowed_roots_from_env() {
  std::vector<std::string> out;
  const char* env = std::getenv("ZENFLOW_ALLOWED_ROOTS");
  if (!env) return out;
  std::string s = env;
  for (size_t start = 0; start <= s.size();) {
    const size_t colon = s.find(':', start);
    const std::string item = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (!item.empty()) out.push_back(item);
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  return out;
}

void check_spec_paths(const JobSpec& spec) {
  // s3:// URIs are fetched (object_cache.h) and checked as the local copies they become.
  auto check_input_path = [](const char* key, const std::string& p, const char* what, auto kind) {
    if (!storage::is_s3_uri(p)) zenflow::check_input_path(key, p, what, kind);
  };
  const DataSpec& d = spec.data;
  check_input_path("data.train", d.train, "a regular file or a directory", regular_or_directory);
  if (!d.val.empty()) {
    check_input_path("data.val", d.val, "a regular file or a directory", regular_or_directory);
  }
  if (d.tokenizer != "byte") {
    check_input_path("data.tokenizer", d.tokenizer, "a regular file or a directory",
                     regular_or_directory);
    // A directory stands for the tokenizer.json inside it (load_hf_tokenizer).
    if (fs::is_directory(d.tokenizer)) {
      check_input_path("data.tokenizer", (fs::path(d.tokenizer) / "tokenizer.json").string(),
                       "a regular file", regular);
    }
  }
  if (!spec.model.from.empty()) {
    check_input_path("model.from", spec.model.from, "a directory", directory);
  }
}


std::string to_yaml(const JobSpec& spec) {
  SpecWriter out;
  Writer<JobSpec>(out, spec).write();
  return out.take();
}

bool operator==(const ModelSpec& a, const ModelSpec& b) { return rows_equal(a, b); }
bool operator==(const DataSpec& a, const DataSpec& b) { return rows_equal(a, b); }
bool operator==(const TrainSpec& a, const TrainSpec& b) { return rows_equal(a, b); }
bool operator==(const ZenflowSpec& a, const ZenflowSpec& b) { return rows_equal(a, b); }
bool operator==(const HostSpec& a, const HostSpec& b) { return rows_equal(a, b); }
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b) { return rows_equal(a, b); }
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b) { return rows_equal(a, b); }
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b) { return rows_equal(a, b); }
bool operator==(const CostSpec& a, const CostSpec& b) { return rows_equal(a, b); }
bool operator==(const JobSpec& a, const JobSpec& b) { return rows_equal(a, b); }

std::string job_spec_reference_markdown() {
  std::vector<KeyDoc> keys;
  const JobSpec defaults;
  Reference<JobSpec>("", defaults, keys).list();
  auto cell = [](const std::string& text) {
    std::string out;
    for (char c : text) out += c == '|' || c == '<' ? std::string("\\") + c : std::string(1, c);
    return out;
  };
  std::string out = "| Key | Type | Default | Bounds | Meaning |\n| --- | --- | --- | --- | --- |\n";
  for (const KeyDoc& k : keys) {
    const bool value = k.default_value != "required" && k.default_value != "unset";
    out += "| `" + k.key + "` | " + cell(k.type) + " | " +
           (value ? "`" + k.default_value + "`" : k.default_value) + " | " + cell(k.bounds) + " | " +
           cell(k.meaning) + " |\n";
  }
  return out;
}

}  // namespace zenflow
