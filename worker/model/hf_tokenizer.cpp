// Byte-level BPE (GPT-2, Llama 3, Qwen2): added tokens, regex pre-tokenizers as scanners,
// merge-rank BPE over GPT-2's byte alphabet, and the tokenizer.json / encoder.json readers.
#include "worker/model/hf_tokenizer.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/input_file.h"
#include "common/json_error.h"
#include "worker/model/unicode.h"

namespace zenflow::model {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------
// GPT-2's bytes_to_unicode(): bytes that are printable Latin-1 stand for themselves,
// the other 68 map to U+0100.. in byte order, so every token is printable text.

struct ByteAlphabet {
  std::array<char32_t, 256> to_char{};
  std::unordered_map<char32_t, unsigned char> to_byte;
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet alphabet = [] {
    ByteAlphabet a;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      a.to_char[b] = printable ? static_cast<char32_t>(b) : next++;
      a.to_byte[a.to_char[b]] = static_cast<unsigned char>(b);
    }
    return a;
  }();
  return alphabet;
}

// The bytes a token string stands for. A token with characters outside the alphabet
// stands for its own UTF-8 text (what Hugging Face's ByteLevel decoder does).
std::string token_bytes(std::string_view token) {
  const ByteAlphabet& a = byte_alphabet();
  std::string out;
  out.reserve(token.size());
  for (std::size_t i = 0; i < token.size();) {
    char32_t cp;
    i += unicode::decode_utf8(token, i, &cp);
    const auto it = a.to_byte.find(cp);
    if (it == a.to_byte.end()) return std::string(token);
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Pre-tokenizer regexes, implemented as scanners over the UTF-8 text. Each match_*
// returns the byte offset where the regex match starting at byte p ends (the regexes
// match at every position, so pieces tile the text). The alternatives are tried in the
// regex's order with its greedy/backtracking outcome worked out by hand; the comments
// quote them. Bytes that are not UTF-8 count as one "other" code point each.

enum class SplitRegex { kGpt2, kLlama3 };

struct SplitRule {
  SplitRegex regex = SplitRegex::kGpt2;
  int max_digits = 0;  // Llama-3 family: \p{N}{1,max_digits}; 0 means \p{N}+
};

constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr char kLlama3Prefix[] = R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)";
constexpr char kLlama3Suffix[] = R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr unsigned char kL = unicode::kLetterClass, kN = unicode::kNumberClass, kS = unicode::kSpaceClass;

// One code point of the text being scanned.
struct CodePoint {
  char32_t cp;
  unsigned char cls;  // class bits; 0 = "other" ([^\s\p{L}\p{N}])
  std::size_t len;    // bytes
};

constexpr std::array<unsigned char, 128> kAsciiClass = [] {
  std::array<unsigned char, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) t[c] = kL;
    if (c >= '0' && c <= '9') t[c] = kN;
    if ((c >= 0x09 && c <= 0x0D) || c == ' ') t[c] = kS;
  }
  return t;
}();

inline CodePoint code_point_at(std::string_view s, std::size_t p) {
  const auto b = static_cast<unsigned char>(s[p]);
  if (b < 0x80) return CodePoint{b, kAsciiClass[b], 1};
  CodePoint c;
  c.len = unicode::decode_utf8(s, p, &c.cp);
  c.cls = unicode::classify(c.cp);
  return c;
}

inline bool is_newline(char32_t c) { return c == '\r' || c == '\n'; }

// The end of the run of code points from p whose class satisfies `in_class`, stopping
// after at most `max_count` of them (-1: no limit).
template <typename InClass>
std::size_t run_end(std::string_view s, std::size_t p, InClass in_class, int max_count = -1) {
  int count = 0;
  while (p < s.size() && (max_count < 0 || count < max_count)) {
    const CodePoint c = code_point_at(s, p);
    if (!in_class(c.cls)) break;
    p += c.len;
    ++count;
  }
  return p;
}

const auto is_letter_class = [](unsigned char c) { return (c & kL) != 0; };
const auto is_number_class = [](unsigned char c) { return (c & kN) != 0; };
const auto is_other_class = [](unsigned char c) { return c == 0; };

// 's|'t|'re|'ve|'m|'ll|'d at p (an apostrophe), optionally case-insensitive (where ſ,
// U+017F, folds to s). Returns p when there is no match.
std::size_t match_contraction(std::string_view s, std::size_t p, bool ignore_case) {
  const std::size_t n = s.size();
  if (p + 1 >= n) return p;
  const auto fold = [ignore_case](char c) -> char {
    return ignore_case && c >= 'A' && c <= 'Z' ? static_cast<char>(c + ('a' - 'A')) : c;
  };
  const char c1 = fold(s[p + 1]);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return p + 2;
  if (ignore_case && p + 2 < n && s[p + 1] == '\xC5' && s[p + 2] == '\xBF') return p + 3;  // 'ſ
  if (p + 2 < n) {
    const char c2 = fold(s[p + 2]);
    if (((c1 == 'r' || c1 == 'v') && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return p + 3;
  }
  return p;
}

// From a whitespace code point at p: \s*[\r\n]+ when `newlines` (the run up to and
// including its last newline, if it has one), else \s+(?!\S)|\s+ (the run, less its
// last code point when a non-space follows and the run is longer than one).
std::size_t match_space_run(std::string_view s, std::size_t p, bool newlines) {
  std::size_t q = p, last = p, after_newline = 0;
  while (q < s.size()) {
    const CodePoint c = code_point_at(s, q);
    if (!(c.cls & kS)) break;
    last = q;
    q += c.len;
    if (is_newline(c.cp)) after_newline = q;
  }
  if (newlines && after_newline != 0) return after_newline;
  if (q == s.size()) return q;
  return last > p ? last : q;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::size_t match_gpt2(std::string_view s, std::size_t p) {
  if (s[p] == '\'') {
    if (const std::size_t e = match_contraction(s, p, false); e != p) return e;
  }
  CodePoint c = code_point_at(s, p);
  std::size_t start = p;
  if (c.cp == ' ' && p + 1 < s.size()) {
    const CodePoint next = code_point_at(s, p + 1);
    if (!(next.cls & kS)) start = p + 1, c = next;
  }
  if (c.cls & kS) return match_space_run(s, p, false);
  if (c.cls & kL) return run_end(s, start + c.len, is_letter_class);
  if (c.cls & kN) return run_end(s, start + c.len, is_number_class);
  return run_end(s, start + c.len, is_other_class);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,k}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
std::size_t match_llama3(std::string_view s, std::size_t p, int max_digits) {
  if (s[p] == '\'') {
    if (const std::size_t e = match_contraction(s, p, true); e != p) return e;
  }
  const CodePoint c = code_point_at(s, p);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c.cls & kL) return run_end(s, p + c.len, is_letter_class);
  const CodePoint next = p + c.len < s.size() ? code_point_at(s, p + c.len) : CodePoint{0, 0, 0};
  if (!(c.cls & kN) && !is_newline(c.cp) && (next.cls & kL))
    return run_end(s, p + c.len + next.len, is_letter_class);
  // \p{N}{1,k}
  if (c.cls & kN) return run_end(s, p + c.len, is_number_class, max_digits == 0 ? -1 : max_digits - 1);
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  std::size_t other = c.cls == 0 ? p : (c.cp == ' ' && next.len != 0 && next.cls == 0) ? p + 1 : s.size();
  if (other != s.size()) {
    const std::size_t e = run_end(s, other, is_other_class);
    std::size_t q = e;
    while (q < s.size() && is_newline(static_cast<unsigned char>(s[q]))) ++q;
    return q;
  }
  // \s*[\r\n]+, then \s+(?!\S)|\s+
  return match_space_run(s, p, true);
}

// Recognizes a Split pre-tokenizer's regex; throws std::invalid_argument otherwise.
SplitRule parse_split_regex(const std::string& pattern) {
  if (pattern == kGpt2Pattern) return SplitRule{SplitRegex::kGpt2, 0};
  const std::string prefix = kLlama3Prefix, suffix = kLlama3Suffix;
  if (pattern.size() > prefix.size() + suffix.size() && pattern.compare(0, prefix.size(), prefix) == 0 &&
      pattern.compare(pattern.size() - suffix.size(), suffix.size(), suffix) == 0) {
    const std::string digits = pattern.substr(prefix.size(), pattern.size() - prefix.size() - suffix.size());
    if (digits == R"(\p{N}+)") return SplitRule{SplitRegex::kLlama3, 0};
    if (digits == R"(\p{N})") return SplitRule{SplitRegex::kLlama3, 1};
    const std::string open = R"(\p{N}{1,)";
    if (digits.size() > open.size() + 1 && digits.compare(0, open.size(), open) == 0 &&
        digits.back() == '}') {
      const std::string k = digits.substr(open.size(), digits.size() - open.size() - 1);
      if (!k.empty() && k.size() <= 3 &&
          std::all_of(k.begin(), k.end(), [](char ch) { return ch >= '0' && ch <= '9'; }) && std::stoi(k) > 0)
        return SplitRule{SplitRegex::kLlama3, std::stoi(k)};
    }
  }
  throw std::invalid_argument("unsupported Split regex " + json(pattern).dump() +
                              " (supported: the GPT-2 and the Llama 3 / Qwen2 patterns)");
}

// ---------------------------------------------------------------------------------
// What a tokenizer is made of, whichever files it came from.

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
};

struct TokenizerSpec {
  std::vector<std::pair<std::string, int64_t>> vocab;       // token text → id
  std::vector<std::pair<std::string, std::string>> merges;  // by rank
  std::vector<AddedToken> added;
  std::vector<SplitRule> rules;
  bool nfc = false;
  bool add_prefix_space = false;
  bool ignore_merges = false;
  std::string unk_token;   // empty: none
  std::string eos_token;   // empty: none
  std::string eos_source;  // where eos_token came from, for errors
};

class ByteLevelBpeTokenizer : public Tokenizer {
 public:
  // `source` names the file(s) in errors.
  ByteLevelBpeTokenizer(const TokenizerSpec& spec, const std::string& source);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_text_.size()); }
  int32_t eos_id() const override { return eos_id_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  void encode_segment(std::string_view segment, std::vector<int32_t>& ids) const;
  void split_and_encode(std::string_view text, std::size_t rule, std::vector<int32_t>& ids) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const;
  void bpe(std::string_view piece, std::vector<int32_t>& ids) const;
  // Finds the leftmost-longest added token at or after `from`: returns its index and
  // sets [*begin, *end), or returns -1.
  int find_added(std::string_view text, std::size_t from, std::size_t* begin, std::size_t* end) const;

  std::unordered_map<std::string, int32_t> vocab_;  // token bytes → id
  std::vector<std::string> id_text_;                // what decode writes per id
  std::vector<char> id_known_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_id_{};
  std::vector<AddedToken> added_;
  std::array<std::vector<int>, 256> added_by_first_byte_;  // longest first
  std::vector<SplitRule> rules_;
  bool nfc_ = false;
  bool add_prefix_space_ = false;
  bool ignore_merges_ = false;
  int32_t eos_id_ = -1;

  static constexpr std::size_t kCacheLimit = 1 << 16;
  static constexpr std::size_t kCacheMaxPiece = 64;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

ByteLevelBpeTokenizer::ByteLevelBpeTokenizer(const TokenizerSpec& spec, const std::string& source)
    : added_(spec.added),
      rules_(spec.rules),
      nfc_(spec.nfc),
      add_prefix_space_(spec.add_prefix_space),
      ignore_merges_(spec.ignore_merges) {
  const auto fail = [&](const std::string& what) { throw std::runtime_error(source + ": " + what); };
  int64_t max_id = -1;
  for (const auto& [token, id] : spec.vocab) max_id = std::max(max_id, id);
  for (const auto& t : added_) max_id = std::max<int64_t>(max_id, t.id);
  if (max_id < 0) fail("the vocabulary is empty");
  const auto tokens = static_cast<int64_t>(spec.vocab.size() + added_.size());
  if (max_id >= 4 * tokens + 1024)  // ids index a dense table
    fail("token ids are too sparse: id " + std::to_string(max_id) + " among " + std::to_string(tokens) +
         " tokens");
  id_text_.resize(static_cast<std::size_t>(max_id) + 1);
  id_known_.assign(id_text_.size(), 0);

  for (const auto& [token, id] : spec.vocab) {
    if (id_known_[id]) fail("token id " + std::to_string(id) + " is used twice (" + json(token).dump() + ")");
    id_known_[id] = 1;
    id_text_[id] = token_bytes(token);
    vocab_.emplace(id_text_[id], static_cast<int32_t>(id));
  }
  for (const auto& t : added_) {
    id_known_[t.id] = 1;
    id_text_[t.id] = t.content;
  }

  int32_t unk_id = -1;
  if (!spec.unk_token.empty()) {
    const auto it = vocab_.find(token_bytes(spec.unk_token));
    if (it == vocab_.end()) fail("unk_token " + json(spec.unk_token).dump() + " is not in the vocabulary");
    unk_id = it->second;
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(std::string(1, static_cast<char>(b)));
    byte_id_[b] = it != vocab_.end() ? it->second : unk_id;
    if (byte_id_[b] < 0) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      fail(std::string("the vocabulary has no token for byte ") + hex +
           " (byte-level BPE needs all 256, or an unk_token)");
    }
  }

  merges_.reserve(spec.merges.size());
  for (std::size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [a, b] = spec.merges[rank];
    const std::string ba = token_bytes(a), bb = token_bytes(b);
    const auto ia = vocab_.find(ba), ib = vocab_.find(bb), ir = vocab_.find(ba + bb);
    if (ia == vocab_.end() || ib == vocab_.end() || ir == vocab_.end()) {
      const std::string missing = ia == vocab_.end() ? a : ib == vocab_.end() ? b : a + b;
      fail("merge #" + std::to_string(rank) + " " + json(a + " " + b).dump() + ": " + json(missing).dump() +
           " is not in the vocabulary");
    }
    merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), ir->second});
  }

  for (std::size_t k = 0; k < added_.size(); ++k) {
    if (added_[k].content.empty()) fail("added token " + std::to_string(added_[k].id) + " has empty content");
    added_by_first_byte_[static_cast<unsigned char>(added_[k].content[0])].push_back(static_cast<int>(k));
  }
  for (auto& v : added_by_first_byte_)
    std::stable_sort(v.begin(), v.end(),
                     [&](int x, int y) { return added_[x].content.size() > added_[y].content.size(); });

  if (!spec.eos_token.empty()) {
    for (const auto& t : added_)
      if (t.content == spec.eos_token) eos_id_ = t.id;
    if (eos_id_ < 0) {
      const auto it = vocab_.find(token_bytes(spec.eos_token));
      if (it == vocab_.end())
        fail("eos_token " + json(spec.eos_token).dump() + " (from " + spec.eos_source + ") is not a token");
      eos_id_ = it->second;
    }
  }
}

int ByteLevelBpeTokenizer::find_added(std::string_view text, std::size_t from, std::size_t* begin,
                                      std::size_t* end) const {
  if (added_.empty()) return -1;
  for (std::size_t p = from; p < text.size(); ++p) {
    const auto& candidates = added_by_first_byte_[static_cast<unsigned char>(text[p])];
    for (int k : candidates) {
      const AddedToken& t = added_[k];
      if (text.compare(p, t.content.size(), t.content) != 0) continue;
      const std::size_t e = p + t.content.size();
      if (t.single_word) {
        const auto is_word = [](char32_t c) {
          return c == '_' || (unicode::classify(c) & (unicode::kLetterClass | unicode::kNumberClass));
        };
        char32_t before = unicode::kInvalid, after = unicode::kInvalid;
        if (p > 0) {
          std::size_t q = p - 1;
          while (q > 0 && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
          unicode::decode_utf8(text, q, &before);
        }
        if (e < text.size()) unicode::decode_utf8(text, e, &after);
        if ((p > 0 && is_word(before)) || (e < text.size() && is_word(after))) continue;
      }
      *begin = p;
      *end = e;
      return k;
    }
  }
  return -1;
}

std::vector<int32_t> ByteLevelBpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  std::size_t done = 0;  // text before this is encoded
  std::size_t from = 0;
  for (;;) {
    std::size_t begin, end;
    const int k = find_added(text, from, &begin, &end);
    if (k < 0) break;
    const AddedToken& t = added_[k];
    std::size_t seg_end = begin;
    if (t.lstrip) {
      while (seg_end > done) {
        std::size_t q = seg_end - 1;
        while (q > done && (static_cast<unsigned char>(text[q]) & 0xC0) == 0x80) --q;
        char32_t cp;
        unicode::decode_utf8(text, q, &cp);
        if (!unicode::is_whitespace(cp)) break;
        seg_end = q;
      }
    }
    if (t.rstrip) {
      while (end < text.size()) {
        char32_t cp;
        const std::size_t len = unicode::decode_utf8(text, end, &cp);
        if (!unicode::is_whitespace(cp)) break;
        end += len;
      }
    }
    encode_segment(text.substr(done, seg_end - done), ids);
    ids.push_back(t.id);
    done = from = end;
  }
  encode_segment(text.substr(done), ids);
  return ids;
}

void ByteLevelBpeTokenizer::encode_segment(std::string_view segment, std::vector<int32_t>& ids) const {
  if (segment.empty()) return;
  std::string owned;
  if (nfc_) {
    owned = unicode::nfc(segment);
    segment = owned;
  }
  if (add_prefix_space_ && segment[0] != ' ') {
    owned = " " + std::string(segment);
    segment = owned;
  }
  split_and_encode(segment, 0, ids);
}

// Splits `text` with rule `rule` and each piece further with the following rules, then
// runs BPE on the final pieces; nothing is materialized in between.
void ByteLevelBpeTokenizer::split_and_encode(std::string_view text, std::size_t rule,
                                             std::vector<int32_t>& ids) const {
  if (rule == rules_.size()) {
    encode_piece(text, ids);
    return;
  }
  const SplitRule& r = rules_[rule];
  for (std::size_t p = 0; p < text.size();) {
    const std::size_t e =
        r.regex == SplitRegex::kGpt2 ? match_gpt2(text, p) : match_llama3(text, p, r.max_digits);
    split_and_encode(text.substr(p, e - p), rule + 1, ids);
    p = e;
  }
}

void ByteLevelBpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
  if (piece.size() == 1) {
    ids.push_back(byte_id_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (ignore_merges_) {
    const auto it = vocab_.find(std::string(piece));
    if (it != vocab_.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCacheMaxPiece) {
    bpe(piece, ids);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mu_);
    const auto it = cache_.find(key);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const std::size_t first = ids.size();
  bpe(piece, ids);
  std::vector<int32_t> result(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end());
  std::lock_guard<std::mutex> lock(cache_mu_);
  if (cache_.size() >= kCacheLimit) cache_.clear();
  cache_.emplace(std::move(key), std::move(result));
}

// Merges the lowest-ranked adjacent pair (leftmost on ties) until none is mergeable.
void ByteLevelBpeTokenizer::bpe(std::string_view piece, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos, left, right, result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  const auto n = static_cast<int32_t>(piece.size());
  std::vector<Symbol> sym(static_cast<std::size_t>(n));
  for (int32_t i = 0; i < n; ++i)
    sym[i] = Symbol{byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1, true};

  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  const auto push = [&](int32_t pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    const int32_t l = sym[pos].id, r = sym[sym[pos].next].id;
    const auto it = merges_.find(pair_key(l, r));
    if (it != merges_.end()) heap.push(Candidate{it->second.rank, pos, l, r, it->second.result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = sym[c.pos];
    if (!s.alive || s.next < 0 || s.id != c.left || sym[s.next].id != c.right) continue;
    Symbol& right = sym[s.next];
    s.id = c.result;
    right.alive = false;
    s.next = right.next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    push(s.prev);
    push(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[i].next) ids.push_back(sym[i].id);
}

std::string ByteLevelBpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<std::size_t>(id) >= id_text_.size() || !id_known_[id])
      throw std::out_of_range("token id " + std::to_string(id) + " is not in the vocabulary (size " +
                              std::to_string(id_text_.size()) + ")");
    out += id_text_[id];
  }
  return out;
}

// ---------------------------------------------------------------------------------
// Readers.

json read_json(const std::string& path, int64_t max_bytes, const std::string& what) {
  const std::string text = read_regular_file(path, max_bytes, what);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(path + ": not valid JSON: " + json_error_text(e));
  }
}

bool flag(const json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return false;
  if (!it->is_boolean()) throw std::invalid_argument(std::string(key) + " must be a boolean");
  return it->get<bool>();
}

std::string type_of(const json& j, const std::string& where) {
  if (!j.is_object()) throw std::invalid_argument(where + " must be an object");
  const auto it = j.find("type");
  if (it == j.end() || !it->is_string()) throw std::invalid_argument(where + ".type must be a string");
  return it->get<std::string>();
}

// The name of a special token, as tokenizer_config.json writes it (a string or an
// AddedToken object); empty when absent or null.
std::string token_name(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

void parse_normalizer(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j, "normalizer");
  if (type == "NFC") {
    spec.nfc = true;
  } else if (type == "Sequence") {
    for (const auto& n : j.at("normalizers")) parse_normalizer(n, spec);
  } else {
    throw std::invalid_argument("unsupported normalizer type " + json(type).dump() + " (supported: NFC)");
  }
}

// Flattens the pre-tokenizer into split rules; returns whether ByteLevel was seen.
// ByteLevel must come last: its byte mapping is what the BPE model consumes.
void parse_pre_tokenizer(const json& j, TokenizerSpec& spec, bool* byte_level) {
  const std::string type = type_of(j, "pre_tokenizer");
  if (*byte_level) throw std::invalid_argument("pre_tokenizer: ByteLevel must be the last step");
  if (type == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) parse_pre_tokenizer(p, spec, byte_level);
  } else if (type == "ByteLevel") {
    *byte_level = true;
    if (flag(j, "add_prefix_space")) {
      if (!spec.rules.empty())
        throw std::invalid_argument(
            "pre_tokenizer: ByteLevel add_prefix_space after a Split is not supported");
      spec.add_prefix_space = true;
    }
    const auto it = j.find("use_regex");
    const bool use_regex = it == j.end() || it->is_null() || it->get<bool>();
    if (use_regex) spec.rules.push_back(SplitRule{SplitRegex::kGpt2, 0});
  } else if (type == "Split") {
    const json& pattern = j.at("pattern");
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
      throw std::invalid_argument("pre_tokenizer: Split pattern must be {\"Regex\": ...}");
    const std::string behavior = j.value("behavior", "");
    if (behavior != "Isolated")
      throw std::invalid_argument("pre_tokenizer: Split behavior " + json(behavior).dump() +
                                  " is not supported (supported: Isolated)");
    if (flag(j, "invert")) throw std::invalid_argument("pre_tokenizer: Split invert is not supported");
    spec.rules.push_back(parse_split_regex(pattern["Regex"].get<std::string>()));
  } else {
    throw std::invalid_argument("unsupported pre_tokenizer type " + json(type).dump() +
                                " (supported: ByteLevel, Split, Sequence)");
  }
}

void parse_model(const json& m, TokenizerSpec& spec) {
  if (!m.is_object()) throw std::invalid_argument("model must be an object");
  const std::string type = m.contains("type") ? type_of(m, "model") : "BPE";
  if (type != "BPE")
    throw std::invalid_argument("unsupported model type " + json(type).dump() + " (supported: BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto it = m.find(key);
    if (it != m.end() && !it->is_null() && !(it->is_string() && it->get<std::string>().empty()))
      throw std::invalid_argument(std::string("model.") + key + " is not supported");
  }
  if (m.contains("dropout") && !m["dropout"].is_null())
    throw std::invalid_argument("model.dropout is not supported (BPE dropout is for training)");
  if (flag(m, "byte_fallback"))
    throw std::invalid_argument("model.byte_fallback is not supported (SentencePiece-style BPE)");
  spec.ignore_merges = flag(m, "ignore_merges");
  if (m.contains("unk_token") && !m["unk_token"].is_null())
    spec.unk_token = m["unk_token"].get<std::string>();

  const json& vocab = m.at("vocab");
  if (!vocab.is_object()) throw std::invalid_argument("model.vocab must be an object of token → id");
  spec.vocab.reserve(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31))
      throw std::invalid_argument("model.vocab[" + json(token).dump() + "] must be an id in [0, 2^31)");
    spec.vocab.emplace_back(token, id.get<int64_t>());
  }
  const json& merges = m.at("merges");
  if (!merges.is_array()) throw std::invalid_argument("model.merges must be an array");
  spec.merges.reserve(merges.size());
  for (std::size_t k = 0; k < merges.size(); ++k) {
    const json& e = merges[k];
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() ||
          s.find(' ', space + 1) != std::string::npos)
        throw std::invalid_argument("model.merges[" + std::to_string(k) + "] " + e.dump() +
                                    " must be two tokens separated by one space");
      spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      throw std::invalid_argument("model.merges[" + std::to_string(k) +
                                  "] must be \"a b\" or [\"a\", \"b\"]");
    }
  }
}

void parse_added_tokens(const json& list, TokenizerSpec& spec) {
  if (list.is_null()) return;
  if (!list.is_array()) throw std::invalid_argument("added_tokens must be an array");
  for (std::size_t k = 0; k < list.size(); ++k) {
    const json& t = list[k];
    const std::string where = "added_tokens[" + std::to_string(k) + "]";
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() || !t.contains("content") ||
        !t["content"].is_string())
      throw std::invalid_argument(where + " must have an integer id and a string content");
    AddedToken a;
    const int64_t id = t["id"].get<int64_t>();
    if (id < 0 || id >= (int64_t{1} << 31)) throw std::invalid_argument(where + ".id out of range");
    a.id = static_cast<int32_t>(id);
    a.content = t["content"].get<std::string>();
    if (a.content.empty()) throw std::invalid_argument(where + ".content is empty");
    a.special = flag(t, "special");
    a.lstrip = flag(t, "lstrip");
    a.rstrip = flag(t, "rstrip");
    a.single_word = flag(t, "single_word");
    spec.added.push_back(std::move(a));
  }
}

std::string default_eos(const TokenizerSpec& spec) {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    for (const auto& t : spec.added)
      if (t.content == name) return name;
    for (const auto& v : spec.vocab)
      if (v.first == name) return name;
  }
  return "";
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path) {
  std::string file = path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) file = (fs::path(path) / "tokenizer.json").string();
  const json j = read_json(file, kMaxTokenizerBytes, "a tokenizer file");
  TokenizerSpec spec;
  try {
    if (!j.is_object()) throw std::invalid_argument("the top level must be an object");
    if (!j.contains("model")) throw std::invalid_argument("no \"model\"");
    parse_model(j["model"], spec);
    parse_added_tokens(j.value("added_tokens", json()), spec);
    parse_normalizer(j.value("normalizer", json()), spec);
    bool byte_level = false;
    const json pre = j.value("pre_tokenizer", json());
    if (!pre.is_null()) parse_pre_tokenizer(pre, spec, &byte_level);
    if (!byte_level)
      throw std::invalid_argument("not a byte-level BPE tokenizer: the pre_tokenizer has no ByteLevel step");
    const json dec = j.value("decoder", json());
    if (!dec.is_null() && type_of(dec, "decoder") != "ByteLevel")
      throw std::invalid_argument("unsupported decoder type " + json(type_of(dec, "decoder")).dump() +
                                  " (supported: ByteLevel)");
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(file + ": " + e.what());
  } catch (const json::exception& e) {
    throw std::runtime_error(file + ": unexpected structure: " + e.what());
  }

  const fs::path config = fs::path(file).parent_path() / "tokenizer_config.json";
  if (fs::exists(config, ec)) {
    const json c = read_json(config.string(), kMaxConfigBytes, "a tokenizer_config.json");
    if (c.is_object() && c.contains("eos_token")) {
      spec.eos_token = token_name(c["eos_token"]);
      spec.eos_source = config.string();
    }
  }
  if (spec.eos_token.empty()) {
    spec.eos_token = default_eos(spec);
    spec.eos_source = "the default list";
  }
  return std::make_unique<ByteLevelBpeTokenizer>(spec, file);
}

std::unique_ptr<Tokenizer> load_gpt2_tokenizer_files(const std::string& encoder_json,
                                                     const std::string& vocab_bpe) {
  TokenizerSpec spec;
  const json encoder = read_json(encoder_json, kMaxTokenizerBytes, "a tokenizer file");
  if (!encoder.is_object()) throw std::runtime_error(encoder_json + ": must be an object of token → id");
  for (const auto& [token, id] : encoder.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 31))
      throw std::runtime_error(encoder_json + ": " + json(token).dump() + " must map to an id in [0, 2^31)");
    spec.vocab.emplace_back(token, id.get<int64_t>());
  }
  std::istringstream lines(read_regular_file(vocab_bpe, kMaxTokenizerBytes, "a tokenizer file"));
  std::string line;
  for (std::size_t number = 1; std::getline(lines, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (number == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto space = line.find(' ');
    if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw std::runtime_error(vocab_bpe + ":" + std::to_string(number) +
                               ": expected two tokens separated by one space");
    spec.merges.emplace_back(line.substr(0, space), line.substr(space + 1));
  }
  spec.rules.push_back(SplitRule{SplitRegex::kGpt2, 0});
  const auto eot = encoder.find("<|endoftext|>");
  if (eot != encoder.end()) {
    AddedToken t;
    t.content = "<|endoftext|>";
    t.id = static_cast<int32_t>(eot->get<int64_t>());
    t.special = true;
    spec.added.push_back(t);
    spec.eos_token = t.content;
  }
  return std::make_unique<ByteLevelBpeTokenizer>(spec, encoder_json + " + " + vocab_bpe);
}

}  // namespace zenflow::model
