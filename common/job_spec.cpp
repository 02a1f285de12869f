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

void read_int(const Section& s, const std::string& key, int64_t& out, const IntRange& range) {
  if (const yaml::Node* node = s.find(key)) out = int_value(s, key, *node, range);
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

// HF config.json keys accepted under model.config; integer-valued ones are sizes >= 1,
// each bounded (above the largest public models by a wide margin, and below anything that
// overflows a tensor size: 1024 layers x 131072 hidden is already ~7e13 parameters).
const std::vector<std::string> kIntegerModelKeys = {
    "hidden_size",       "num_hidden_layers", "num_attention_heads",    "num_key_value_heads",
    "intermediate_size", "vocab_size",        "max_position_embeddings"};
const std::map<std::string, int64_t> kModelKeyMax = {
    {"hidden_size", 131072},           {"num_hidden_layers", 1024},
    {"num_attention_heads", 4096},     {"num_key_value_heads", 4096},
    {"intermediate_size", 1048576},    {"vocab_size", 16777216},
    {"max_position_embeddings", 4194304}};
const std::vector<std::string> kRealModelKeys = {"rope_theta", "rms_norm_eps", "initializer_range"};
const char* const kTieKey = "tie_word_embeddings";

bool is_integer_model_key(const std::string& key) {
  return std::find(kIntegerModelKeys.begin(), kIntegerModelKeys.end(), key) !=
         kIntegerModelKeys.end();
}

void read_model(const yaml::Node& node, ModelSpec& m, const std::string& base_dir) {
  Section s(node, "model", {"arch", "from", "config"});
  read_choice(s, "arch", m.arch, {"llama", "gpt2"});
  read_string(s, "from", m.from, true);
  m.from = resolve_path(base_dir, m.from);
  m.arch_given = s.find("arch") != nullptr || m.from.empty();

  std::vector<std::string> config_keys = kIntegerModelKeys;
  config_keys.insert(config_keys.end(), kRealModelKeys.begin(), kRealModelKeys.end());
  config_keys.push_back(kTieKey);
  Section c(s.child("config"), "model.config", config_keys);
  m.config.clear();
  for (const std::string& key : config_keys) {
    const yaml::Node* v = c.find(key);
    if (!v) continue;
    if (is_integer_model_key(key)) {
      m.config[key] = static_cast<double>(int_value(c, key, *v, {1, kModelKeyMax.at(key)}));
    } else if (key == kTieKey) {
      std::optional<int64_t> as_int = to_int(*v);
      if (as_int && (*as_int == 0 || *as_int == 1)) {
        m.config[key] = static_cast<double>(*as_int);
      } else {
        m.config[key] = bool_value(c, key, *v) ? 1.0 : 0.0;
      }
    } else {
      double x = 0;
      read_number(c, key, x, above(0));
      m.config[key] = x;
    }
  }
  auto has = [&](const char* k) { return m.config.count(k) != 0; };
  auto get = [&](const char* k) { return static_cast<int64_t>(m.config.at(k)); };
  if (has("hidden_size") && has("num_attention_heads") &&
      get("hidden_size") % get("num_attention_heads") != 0) {
    c.fail("hidden_size", "must be a multiple of num_attention_heads (" +
                              std::to_string(get("num_attention_heads")) + "), got " +
                              std::to_string(get("hidden_size")));
  }
  if (has("num_attention_heads") && has("num_key_value_heads") &&
      get("num_attention_heads") % get("num_key_value_heads") != 0) {
    c.fail("num_key_value_heads", "must divide num_attention_heads (" +
                                      std::to_string(get("num_attention_heads")) + "), got " +
                                      std::to_string(get("num_key_value_heads")));
  }
}

void read_data(const yaml::Node& node, DataSpec& d, const std::string& base_dir) {
  Section s(node, "data", {"train", "val", "format", "tokenizer", "val_fraction"});
  read_string(s, "train", d.train, true);
  if (d.train.empty()) s.fail("train", "required (a file or directory of training data)");
  read_string(s, "val", d.val, true);
  read_choice(s, "format", d.format, {"text", "jsonl", "tokens"});
  read_string(s, "tokenizer", d.tokenizer);
  if (d.tokenizer.empty()) s.fail("tokenizer", "must be \"byte\" or a tokenizer.json path, got ''");
  read_number(s, "val_fraction", d.val_fraction, closed(0, 0.5));
  d.train = resolve_path(base_dir, d.train);
  d.val = resolve_path(base_dir, d.val);
  if (d.tokenizer != "byte") d.tokenizer = resolve_path(base_dir, d.tokenizer);
}

void read_train(const yaml::Node& node, TrainSpec& t) {
  Section s(node, "train",
            {"steps", "micro_batch", "grad_accum", "seq_len", "lr", "schedule", "warmup_steps",
             "min_lr_ratio", "weight_decay", "grad_clip", "seed", "eval_every", "eval_batches",
             "device", "dtype", "autocast", "compute_threads"});
  read_int(s, "steps", t.steps, {1, kBillion});
  read_int(s, "micro_batch", t.micro_batch, {1, 65536});
  read_int(s, "grad_accum", t.grad_accum, {1, 65536});
  read_int(s, "seq_len", t.seq_len, {2, 1048576});
  read_number(s, "lr", t.lr, above(0));
  read_choice(s, "schedule", t.schedule, {"cosine", "linear", "constant"});
  // The default warm-up shrinks to fit a short run (--set train.steps=5 must just work);
  // a warm-up the user wrote must fit as written.
  if (!s.find("warmup_steps")) t.warmup_steps = std::min(t.warmup_steps, t.steps);
  read_int(s, "warmup_steps", t.warmup_steps, {0, kBillion});
  if (t.warmup_steps > t.steps) {
    s.fail("warmup_steps", "must be <= train.steps (" + std::to_string(t.steps) + "), got " +
                               std::to_string(t.warmup_steps));
  }
  read_number(s, "min_lr_ratio", t.min_lr_ratio, closed(0, 1));
  read_number(s, "weight_decay", t.weight_decay, at_least(0));
  read_number(s, "grad_clip", t.grad_clip, at_least(0));
  int64_t seed = static_cast<int64_t>(t.seed);
  read_int(s, "seed", seed, {0, std::numeric_limits<int64_t>::max()});
  t.seed = static_cast<uint64_t>(seed);
  read_int(s, "eval_every", t.eval_every, {0, kBillion});
  read_int(s, "eval_batches", t.eval_batches, {1, kMillion});
  read_choice(s, "device", t.device, {"auto", "cpu", "cuda"});
  read_choice(s, "dtype", t.dtype, {"auto", "float32", "bfloat16", "float16"});
  read_choice(s, "autocast", t.autocast, {"none", "bfloat16", "float16"});
  read_int(s, "compute_threads", t.compute_threads, {0, kMaxCores});
}

void read_zenflow(const yaml::Node& node, ZenflowSpec& z) {
  Section s(node, "optimizer.zenflow",
            {"topk_ratio", "select_strategy", "select_interval", "update_interval",
             "full_warm_up_rounds", "overlap_step", "importance", "reselect_threshold",
             "auto_ratio", "max_update_interval", "min_split_numel"});
  read_number(s, "topk_ratio", z.topk_ratio, closed(0, 1));
  read_choice(s, "select_strategy", z.select_strategy, {"auto", "step", "epoch"});
  read_int_or_auto(s, "select_interval", z.select_interval_auto, z.select_interval, {1, kBillion});
  read_int_or_auto(s, "update_interval", z.update_interval_auto, z.update_interval, {1, kMillion});
  read_int(s, "full_warm_up_rounds", z.full_warm_up_rounds, {0, kMillion});
  read_bool(s, "overlap_step", z.overlap_step);
  read_choice(s, "importance", z.importance, {"l2", "l1"});
  read_number(s, "reselect_threshold", z.reselect_threshold, Range{0, false, 1, true});
  read_number(s, "auto_ratio", z.auto_ratio, Range{0, false, 1, true});
  read_int(s, "max_update_interval", z.max_update_interval, {1, kMillion});
  read_int(s, "min_split_numel", z.min_split_numel, {1, int64_t{1} << 40});
  // Semantics §2: with select_strategy step, re-selection happens at window boundaries
  // only, so S must be a whole number of windows.
  if (z.select_strategy == "step" && !z.select_interval_auto && !z.update_interval_auto &&
      z.select_interval % z.update_interval != 0) {
    s.fail("select_interval",
           "must be a positive multiple of update_interval (" + std::to_string(z.update_interval) +
               ") when select_strategy is step, got " + std::to_string(z.select_interval));
  }
}

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

void read_addresses(const Section& s, HostSpec& h) {
  const yaml::Node* node = s.find("addresses", true);
  if (!node) return;
  h.addresses = string_list(s, "addresses", *node);
  if (h.addresses.size() > 1024) s.fail("addresses", "must list at most 1024 nodes, got " + std::to_string(h.addresses.size()));
  std::set<std::string> seen;
  for (std::size_t i = 0; i < h.addresses.size(); ++i) {
    const std::string& a = h.addresses[i];
    const std::size_t colon = a.rfind(':');
    const std::string where = " (item " + std::to_string(i) + ")";
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < a.size() && a.size() <= 300;
    int64_t port = 0;
    if (ok) {
      for (std::size_t c = colon + 1; c < a.size(); ++c) ok = ok && std::isdigit(static_cast<unsigned char>(a[c]));
      if (ok) port = std::stoll(a.substr(colon + 1, 6));
    }
    if (!ok || port < 1 || port > 65535) s.fail("addresses", "must be HOST:PORT with a port in [1, 65535], got \"" + a + "\"" + where);
    if (!seen.insert(a).second) s.fail("addresses", "\"" + a + "\" appears twice" + where);
  }
}

void read_on_node_loss(const Section& s, HostSpec& h) {
  const yaml::Node* node = s.find("on_node_loss");
  if (!node) return;
  std::vector<std::string> steps = string_list(s, "on_node_loss", *node);
  const std::vector<std::string> known = {"spare", "in_process", "fail"};
  if (steps.empty()) s.fail("on_node_loss", "must name at least one of spare, in_process, fail");
  std::set<std::string> seen;
  for (const std::string& x : steps) {
    if (std::find(known.begin(), known.end(), x) == known.end())
      s.fail("on_node_loss", "must be a list of spare, in_process, fail; got \"" + x + "\"");
    if (!seen.insert(x).second) s.fail("on_node_loss", "\"" + x + "\" appears twice");
  }
  if (steps.back() != "fail" && seen.count("fail"))
    s.fail("on_node_loss", "\"fail\" must come last (nothing after it is tried)");
  h.on_node_loss = std::move(steps);
}

void read_host(const yaml::Node& node, HostSpec& h, const std::string& base_dir) {
  Section s(node, "optimizer.host", {"threads", "reserved_cores", "nodes", "addresses", "token_file", "on_node_loss",
                                     "huge_pages"});
  read_int_or_auto(s, "threads", h.threads_auto, h.threads, {1, kMaxCores});
  if (const yaml::Node* cores = s.find("reserved_cores")) {
    if (is_auto(*cores)) {
      h.reserved_cores_auto = true;
      h.reserved_cores.clear();
    } else {
      const std::string expected = "must be \"auto\" or a non-empty list of core ids";
      if (!cores->is_sequence() || cores->size() == 0) {
        s.fail("reserved_cores", expected + ", got " + describe(*cores));
      }
      if (cores->size() > static_cast<std::size_t>(kMaxCores)) {
        s.fail("reserved_cores", "must list at most " + std::to_string(kMaxCores) +
                                     " core ids, got " + std::to_string(cores->size()));
      }
      std::vector<int> ids;
      std::set<int64_t> seen;
      for (std::size_t i = 0; i < cores->size(); ++i) {
        const yaml::Node& item = cores->item(i);
        const ParsedInt parsed = parse_int(item);
        // Out of int64 is out of range, not "not an integer".
        const std::optional<int64_t> id =
            parsed.integer ? std::optional<int64_t>(parsed.fits ? parsed.value : -1) : std::nullopt;
        const std::string where = " (item " + std::to_string(i) + ")";
        if (!id) {
          s.fail("reserved_cores", "core ids must be integers, got " + describe(item) + where);
        }
        if (*id < 0 || *id > kMaxCoreId) {
          s.fail("reserved_cores", "core ids must be in [0, " + std::to_string(kMaxCoreId) +
                                       "], got " + item.text() + where);
        }
        if (!seen.insert(*id).second) {
          s.fail("reserved_cores", "core id " + std::to_string(*id) + " appears twice" + where);
        }
        ids.push_back(static_cast<int>(*id));
      }
      h.reserved_cores_auto = false;
      h.reserved_cores = std::move(ids);
    }
  }
  read_int(s, "nodes", h.nodes, {0, 1024});
  read_addresses(s, h);
  read_string(s, "token_file", h.token_file, true);
  h.token_file = resolve_path(base_dir, h.token_file);
  read_on_node_loss(s, h);
  if (h.nodes > 0 && !h.addresses.empty() && h.nodes != static_cast<int64_t>(h.addresses.size()))
    s.fail("nodes", "is " + std::to_string(h.nodes) + " but addresses lists " + std::to_string(h.addresses.size()) +
                        " nodes (give one of them, or make them agree)");
  read_bool(s, "huge_pages", h.huge_pages);
}

void read_optimizer(const yaml::Node& node, OptimizerSpec& o, const std::string& base_dir) {
  Section s(node, "optimizer", {"mode", "beta1", "beta2", "eps", "zenflow", "host"});
  read_choice(s, "mode", o.mode, {"zenflow", "offload", "device"});
  read_number(s, "beta1", o.beta1, Range{0, true, 1, false});
  read_number(s, "beta2", o.beta2, Range{0, true, 1, false});
  read_number(s, "eps", o.eps, above(0));
  read_zenflow(s.child("zenflow"), o.zenflow);
  read_host(s.child("host"), o.host, base_dir);
}

void read_resources(const yaml::Node& node, ResourcesSpec& r) {
  Section s(node, "resources",
            {"workers", "gpus_per_worker", "host_memory_gb", "priority", "max_restarts", "hang_timeout"});
  read_int(s, "workers", r.workers, {1, kMaxCores});
  read_int(s, "gpus_per_worker", r.gpus_per_worker, {0, 64});
  if (const yaml::Node* mem = s.find("host_memory_gb")) {
    if (is_auto(*mem)) {
      r.host_memory_gb_auto = true;
      r.host_memory_gb = 0;
    } else {
      std::optional<double> v = to_double(*mem);
      if (!v) s.fail("host_memory_gb", "must be \"auto\" or a number in (0, 1048576], got " + describe(*mem));
      // Converted to bytes in int64 later: bounded (1 PiB) so the conversion is defined.
      check_range(s, "host_memory_gb", *mem, *v, Range{0, false, 1 << 20, true});
      r.host_memory_gb_auto = false;
      r.host_memory_gb = *v;
    }
  }
  read_int(s, "priority", r.priority, {-kMillion, kMillion});
  read_int(s, "max_restarts", r.max_restarts, {0, 1000});
  bool hang_auto = r.hang_timeout == 0;
  read_int_or_auto(s, "hang_timeout", hang_auto, r.hang_timeout,
                   {ResourcesSpec::kMinHangTimeoutSeconds, kBillion});
  if (hang_auto) r.hang_timeout = 0;
}

void read_checkpoint(const yaml::Node& node, CheckpointSpec& c, const std::string& name,
                     const std::string& base_dir) {
  Section s(node, "checkpoint", {"dir", "every_steps", "keep"});
  read_string(s, "dir", c.dir, true);
  // Written: against the spec's directory, like every path. Absent: the current directory's
  // runs/<name>, so a shared spec (the checkout's examples/) never collects runs beside it.
  c.dir = c.dir.empty() ? "runs/" + name : resolve_path(base_dir, c.dir);
  read_int(s, "every_steps", c.every_steps, {0, kBillion});
  read_int(s, "keep", c.keep, {1, kMillion});
}

void read_cost(const yaml::Node& node, CostSpec& c) {
  Section s(node, "cost", {"instance_type", "usd_per_hour"});
  read_string(s, "instance_type", c.instance_type, true, kMaxNameChars);
  if (s.find("usd_per_hour", true)) {
    double v = 0;
    read_number(s, "usd_per_hour", v, at_least(0));
    c.usd_per_hour = v;
  } else {
    c.usd_per_hour.reset();
  }
}

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

JobSpec validate(const yaml::Node& root, const std::string& base_dir, SpecSite site) {
  Section s(root, "",
            {"name", "model", "data", "train", "optimizer", "resources", "checkpoint", "cost"});
  JobSpec spec;
  const yaml::Node* name = s.find("name", true);
  if (!name) s.fail("name", std::string("required (") + kNameRule + ")");
  if (!name->is_scalar() || !valid_name(name->text())) {
    s.fail("name", std::string("must be ") + kNameRule + "; got " + describe(*name));
  }
  spec.name = name->text();
  read_model(s.child("model"), spec.model, base_dir);
  read_data(s.child("data"), spec.data, base_dir);
  read_train(s.child("train"), spec.train);
  read_optimizer(s.child("optimizer"), spec.optimizer, base_dir);
  read_resources(s.child("resources"), spec.resources);
  read_checkpoint(s.child("checkpoint"), spec.checkpoint, spec.name, base_dir);
  check_checkpoint_dir(spec.checkpoint, spec.name, base_dir, site);
  read_cost(s.child("cost"), spec.cost);

  // Learned position tables (gpt2) and rotary caches (llama) are sized by this.
  auto max_pos = spec.model.config.find("max_position_embeddings");
  if (max_pos != spec.model.config.end() &&
      static_cast<double>(spec.train.seq_len) > max_pos->second) {
    throw SpecError("train.seq_len", "must be <= model.config.max_position_embeddings (" +
                                         format_number(max_pos->second) + "), got " +
                                         std::to_string(spec.train.seq_len));
  }
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
  if (!fs::path(spec.checkpoint.dir).is_absolute()) {
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
    if (!path.empty()) out.emplace_back(key, path);
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

namespace {

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

}  // namespace

std::string to_yaml(const JobSpec& spec) {
  SpecWriter out;
  auto num = [&](const char* key, double v) { out.num(key, v); };
  auto integer = [&](const char* key, int64_t v) { out.integer(key, v); };
  auto str = [&](const char* key, const std::string& v) { out.str(key, v); };
  auto boolean = [&](const char* key, bool v) { out.boolean(key, v); };
  auto begin = [&](const char* key) { out.begin(key); };

  str("name", spec.name);

  begin("model");
  if (spec.model.arch_given) str("arch", spec.model.arch);
  str("from", spec.model.from);
  begin("config");
  for (const auto& [key, value] : spec.model.config) {
    if (key == kTieKey) {
      boolean(key.c_str(), value != 0);
    } else if (is_integer_model_key(key)) {
      integer(key.c_str(), static_cast<int64_t>(value));
    } else {
      num(key.c_str(), value);
    }
  }
  out.end();
  out.end();

  begin("data");
  str("train", spec.data.train);
  str("val", spec.data.val);
  str("format", spec.data.format);
  str("tokenizer", spec.data.tokenizer);
  num("val_fraction", spec.data.val_fraction);
  out.end();

  const TrainSpec& t = spec.train;
  begin("train");
  integer("steps", t.steps);
  integer("micro_batch", t.micro_batch);
  integer("grad_accum", t.grad_accum);
  integer("seq_len", t.seq_len);
  num("lr", t.lr);
  str("schedule", t.schedule);
  integer("warmup_steps", t.warmup_steps);
  num("min_lr_ratio", t.min_lr_ratio);
  num("weight_decay", t.weight_decay);
  num("grad_clip", t.grad_clip);
  str("seed", std::to_string(t.seed));
  integer("eval_every", t.eval_every);
  integer("eval_batches", t.eval_batches);
  str("device", t.device);
  str("dtype", t.dtype);
  str("autocast", t.autocast);
  integer("compute_threads", t.compute_threads);
  out.end();

  const OptimizerSpec& o = spec.optimizer;
  const ZenflowSpec& z = o.zenflow;
  begin("optimizer");
  str("mode", o.mode);
  num("beta1", o.beta1);
  num("beta2", o.beta2);
  num("eps", o.eps);
  begin("zenflow");
  num("topk_ratio", z.topk_ratio);
  str("select_strategy", z.select_strategy);
  str("select_interval", z.select_interval_auto ? "auto" : std::to_string(z.select_interval));
  str("update_interval", z.update_interval_auto ? "auto" : std::to_string(z.update_interval));
  integer("full_warm_up_rounds", z.full_warm_up_rounds);
  boolean("overlap_step", z.overlap_step);
  str("importance", z.importance);
  num("reselect_threshold", z.reselect_threshold);
  num("auto_ratio", z.auto_ratio);
  integer("max_update_interval", z.max_update_interval);
  integer("min_split_numel", z.min_split_numel);
  out.end();
  const HostSpec& h = o.host;
  begin("host");
  str("threads", h.threads_auto ? "auto" : std::to_string(h.threads));
  if (h.reserved_cores_auto) {
    str("reserved_cores", "auto");
  } else {
    out.flow("reserved_cores", h.reserved_cores);
  }
  integer("nodes", h.nodes);
  out.flow("addresses", h.addresses);
  if (!h.token_file.empty()) str("token_file", h.token_file);
  out.flow("on_node_loss", h.on_node_loss);
  boolean("huge_pages", h.huge_pages);
  out.end();
  out.end();

  const ResourcesSpec& r = spec.resources;
  begin("resources");
  integer("workers", r.workers);
  integer("gpus_per_worker", r.gpus_per_worker);
  str("host_memory_gb", r.host_memory_gb_auto ? "auto" : format_number(r.host_memory_gb));
  integer("priority", r.priority);
  integer("max_restarts", r.max_restarts);
  if (r.hang_timeout > 0) {
    integer("hang_timeout", r.hang_timeout);
  } else {
    str("hang_timeout", "auto");
  }
  out.end();

  begin("checkpoint");
  str("dir", spec.checkpoint.dir);
  integer("every_steps", spec.checkpoint.every_steps);
  integer("keep", spec.checkpoint.keep);
  out.end();

  begin("cost");
  str("instance_type", spec.cost.instance_type);
  out.raw("usd_per_hour", spec.cost.usd_per_hour ? format_number(*spec.cost.usd_per_hour) : "~");
  out.end();
  return out.take();
}

bool operator==(const ModelSpec& a, const ModelSpec& b) {
  return std::tie(a.arch, a.arch_given, a.from, a.config) ==
         std::tie(b.arch, b.arch_given, b.from, b.config);
}
bool operator==(const DataSpec& a, const DataSpec& b) {
  return std::tie(a.train, a.val, a.format, a.tokenizer, a.val_fraction) ==
         std::tie(b.train, b.val, b.format, b.tokenizer, b.val_fraction);
}
bool operator==(const TrainSpec& a, const TrainSpec& b) {
  return std::tie(a.steps, a.micro_batch, a.grad_accum, a.seq_len, a.lr, a.schedule, a.warmup_steps,
                  a.min_lr_ratio, a.weight_decay, a.grad_clip, a.seed, a.eval_every, a.eval_batches,
                  a.device, a.dtype, a.autocast, a.compute_threads) ==
         std::tie(b.steps, b.micro_batch, b.grad_accum, b.seq_len, b.lr, b.schedule, b.warmup_steps,
                  b.min_lr_ratio, b.weight_decay, b.grad_clip, b.seed, b.eval_every, b.eval_batches,
                  b.device, b.dtype, b.autocast, b.compute_threads);
}
bool operator==(const ZenflowSpec& a, const ZenflowSpec& b) {
  return std::tie(a.topk_ratio, a.select_strategy, a.select_interval_auto, a.select_interval,
                  a.update_interval_auto, a.update_interval, a.full_warm_up_rounds, a.overlap_step,
                  a.importance, a.reselect_threshold, a.auto_ratio, a.max_update_interval,
                  a.min_split_numel) ==
         std::tie(b.topk_ratio, b.select_strategy, b.select_interval_auto, b.select_interval,
                  b.update_interval_auto, b.update_interval, b.full_warm_up_rounds, b.overlap_step,
                  b.importance, b.reselect_threshold, b.auto_ratio, b.max_update_interval,
                  b.min_split_numel);
}
bool operator==(const HostSpec& a, const HostSpec& b) {
  return std::tie(a.threads_auto, a.threads, a.reserved_cores_auto, a.reserved_cores, a.nodes, a.addresses,
                  a.token_file, a.on_node_loss, a.huge_pages) ==
         std::tie(b.threads_auto, b.threads, b.reserved_cores_auto, b.reserved_cores, b.nodes, b.addresses,
                  b.token_file, b.on_node_loss, b.huge_pages);
}
bool operator==(const OptimizerSpec& a, const OptimizerSpec& b) {
  return std::tie(a.mode, a.beta1, a.beta2, a.eps, a.zenflow, a.host) ==
         std::tie(b.mode, b.beta1, b.beta2, b.eps, b.zenflow, b.host);
}
bool operator==(const ResourcesSpec& a, const ResourcesSpec& b) {
  return std::tie(a.workers, a.gpus_per_worker, a.host_memory_gb_auto, a.host_memory_gb, a.priority, a.max_restarts,
                  a.hang_timeout) == std::tie(b.workers, b.gpus_per_worker, b.host_memory_gb_auto, b.host_memory_gb,
                                              b.priority, b.max_restarts, b.hang_timeout);
}
bool operator==(const CheckpointSpec& a, const CheckpointSpec& b) {
  return std::tie(a.dir, a.every_steps, a.keep) == std::tie(b.dir, b.every_steps, b.keep);
}
bool operator==(const CostSpec& a, const CostSpec& b) {
  return std::tie(a.instance_type, a.usd_per_hour) == std::tie(b.instance_type, b.usd_per_hour);
}
bool operator==(const JobSpec& a, const JobSpec& b) {
  return std::tie(a.name, a.model, a.data, a.train, a.optimizer, a.resources, a.checkpoint,
                  a.cost) ==
         std::tie(b.name, b.model, b.data, b.train, b.optimizer, b.resources, b.checkpoint, b.cost);
}

}  // namespace zenflow
