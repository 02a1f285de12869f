// JSONL (text and prompt/completion) and binary token-file datasets, and make_dataset_from_spec.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "common/job_spec.h"
#include "common/remove_tree.h"
#include "tests/support/bounded_call.h"
#include "tests/support/error_of.h"
#include "worker/model/causal_lm.h"
#include "worker/model/dataset.h"
#include "worker/model/tokenizer.h"
#include "worker/rank/model_factory.h"

namespace fs = std::filesystem;
namespace zm = zenflow::model;

namespace {

fs::path scratch_dir(const std::string& name) {
  const fs::path dir = fs::path(ZENFLOW_BINARY_DIR) / "test-tmp" / "test_datasets" / name;
  zenflow::remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

template <typename T>
void write_ids(const fs::path& path, const std::vector<T>& ids) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * sizeof(T)));
}

// Bytes are tokens 0..255 and 256 is the end-of-sequence token.
class EosByteTokenizer : public zm::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    return zm::ByteTokenizer().encode(text);
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    return zm::ByteTokenizer().decode(ids);
  }
  int64_t vocab_size() const override { return 257; }
  int32_t eos_id() const override { return 256; }
};

constexpr int64_t kEos = 256;
constexpr int64_t kIgnore = -100;

struct Example {
  std::vector<int64_t> input, target;
};

Example example(const zm::TokenDataset& ds, int64_t i) {
  const int64_t T = ds.seq_len();
  at::Tensor in = at::full({2, T}, -7, at::kLong), tg = at::full({2, T}, -7, at::kLong);
  ds.fill(i, in, tg, 1);
  Example e;
  for (int64_t t = 0; t < T; ++t) {
    e.input.push_back(in[1][t].item<int64_t>());
    e.target.push_back(tg[1][t].item<int64_t>());
  }
  return e;
}

std::vector<int64_t> bytes(const std::string& s) { return std::vector<int64_t>(s.begin(), s.end()); }

using zenflow::test_support::error_of;

}  // namespace

TEST(JsonlDataset, TextLinesArePackedWithNewlineSeparatorsWhenTheTokenizerHasNoEos) {
  const fs::path dir = scratch_dir("text_byte");
  write_text(dir / "d.jsonl",
             "{\"text\": \"abc\"}\n{\"id\": 3, \"text\": \"de\"}\n\n  \n{\"text\": \"fgh\"}\n");
  const auto ds = zm::make_jsonl_dataset((dir / "d.jsonl").string(), zm::ByteTokenizer(), 3);
  // Stream "abc\nde\nfgh" (10 tokens): (10 - 1) / 3 = 3 blocks of 4 sharing an edge.
  ASSERT_EQ(ds->size(), 3);
  EXPECT_EQ(example(*ds, 0).input, bytes("abc"));
  EXPECT_EQ(example(*ds, 0).target, bytes("bc\n"));
  EXPECT_EQ(example(*ds, 1).input, bytes("\nde"));
  EXPECT_EQ(example(*ds, 1).target, bytes("de\n"));
  EXPECT_EQ(example(*ds, 2).input, bytes("\nfg"));
  EXPECT_EQ(example(*ds, 2).target, bytes("fgh"));
}

TEST(JsonlDataset, TextLinesAreSeparatedByEos) {
  const fs::path dir = scratch_dir("text_eos");
  write_text(dir / "d.jsonl", "{\"text\": \"ab\"}\n{\"text\": \"cd\"}\n{\"text\": \"e\"}\n");
  const auto ds = zm::make_jsonl_dataset((dir / "d.jsonl").string(), EosByteTokenizer(), 3);
  // a b EOS c d EOS e: 7 tokens, 2 examples, no EOS after the last text.
  ASSERT_EQ(ds->size(), 2);
  EXPECT_EQ(example(*ds, 0).input, (std::vector<int64_t>{'a', 'b', kEos}));
  EXPECT_EQ(example(*ds, 1).input, (std::vector<int64_t>{'c', 'd', kEos}));
  EXPECT_EQ(example(*ds, 1).target, (std::vector<int64_t>{'d', kEos, 'e'}));
}

TEST(JsonlDataset, PromptCompletionMasksPromptAndPaddingExactly) {
  const fs::path dir = scratch_dir("prompt_completion");
  write_text(dir / "d.jsonl",
             "{\"prompt\": \"ab\", \"completion\": \"xyz\"}\n"
             "{\"prompt\": \"0123456789\", \"completion\": \"z\"}\n"  // prompt fills the window: dropped
             "{\"prompt\": \"abcdef\", \"completion\": \"uvwxyz\"}\n"
             "{\"prompt\": \"\", \"completion\": \"hi\"}\n");
  const auto ds = zm::make_jsonl_dataset((dir / "d.jsonl").string(), EosByteTokenizer(), 8);
  ASSERT_EQ(ds->size(), 3);
  // "ab" + "xyz" + EOS padded with EOS to 9: the loss covers predicting x, y, z, EOS.
  Example e = example(*ds, 0);
  EXPECT_EQ(e.input, (std::vector<int64_t>{'a', 'b', 'x', 'y', 'z', kEos, kEos, kEos}));
  EXPECT_EQ(e.target, (std::vector<int64_t>{kIgnore, 'x', 'y', 'z', kEos, kIgnore, kIgnore, kIgnore}));
  // Cut to 9 tokens: "abcdef" + "uvw"; the loss covers u, v, w.
  e = example(*ds, 1);
  EXPECT_EQ(e.input, bytes("abcdefuv"));
  EXPECT_EQ(e.target, (std::vector<int64_t>{kIgnore, kIgnore, kIgnore, kIgnore, kIgnore, 'u', 'v', 'w'}));
  // No prompt: every completion token after the first is a target.
  e = example(*ds, 2);
  EXPECT_EQ(e.input, (std::vector<int64_t>{'h', 'i', kEos, kEos, kEos, kEos, kEos, kEos}));
  EXPECT_EQ(e.target,
            (std::vector<int64_t>{'i', kEos, kIgnore, kIgnore, kIgnore, kIgnore, kIgnore, kIgnore}));

  // The loss sees only the completion: logits that put all mass on a wrong token at
  // every prompt / padding position change nothing; uniform elsewhere gives ln V.
  at::Tensor in = at::empty({1, 8}, at::kLong), tg = at::empty({1, 8}, at::kLong);
  ds->fill(0, in, tg, 0);
  at::Tensor logits = at::zeros({1, 8, 257});
  for (int64_t t : {0, 5, 6, 7}) logits[0][t][3] = 100.0;
  EXPECT_NEAR(zm::causal_lm_loss(logits, tg).item<double>(), std::log(257.0), 1e-6);
  logits[0][2][3] = 100.0;  // a completion position does count
  EXPECT_GT(zm::causal_lm_loss(logits, tg).item<double>(), 20.0);

  // The loader counts only the loss-carrying positions.
  zm::DataLoader loader(ds, 3, 1, 1, /*shuffle=*/false);
  EXPECT_EQ(loader.next().tokens, 4 + 3 + 2);
}

TEST(JsonlDataset, PromptCompletionWithoutEosPadsWithZero) {
  const fs::path dir = scratch_dir("prompt_completion_byte");
  write_text(dir / "d.jsonl", "{\"prompt\": \"ab\", \"completion\": \"c\"}\n");
  const auto ds = zm::make_jsonl_dataset((dir / "d.jsonl").string(), zm::ByteTokenizer(), 4);
  ASSERT_EQ(ds->size(), 1);
  const Example e = example(*ds, 0);
  EXPECT_EQ(e.input, (std::vector<int64_t>{'a', 'b', 'c', 0}));
  EXPECT_EQ(e.target, (std::vector<int64_t>{kIgnore, 'c', kIgnore, kIgnore}));
}

TEST(JsonlDataset, BadLinesAreErrorsNamingFileAndLine) {
  const fs::path dir = scratch_dir("bad");
  const zm::ByteTokenizer tok;
  auto error_for = [&](const std::string& content) {
    write_text(dir / "d.jsonl", content);
    return error_of([&] { zm::make_jsonl_dataset((dir / "d.jsonl").string(), tok, 2); });
  };
  const std::string file = (dir / "d.jsonl").string();
  std::string e = error_for("{\"text\": \"abc\"}\n{\"prompt\": \"a\", \"completion\": \"b\"}\n");
  EXPECT_NE(e.find(file + ":2: mixes prompt/completion lines into a file of text lines"), std::string::npos)
      << e;
  e = error_for("{\"text\": \"abcdef\"}\n\n{\"text\": \"abc\"\n");
  EXPECT_NE(e.find(file + ":3: not valid JSON"), std::string::npos) << e;
  e = error_for("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\"}\n");
  EXPECT_NE(e.find(file + ":2: missing \"completion\""), std::string::npos) << e;
  e = error_for("{\"text\": 5}\n");
  EXPECT_NE(e.find(file + ":1: \"text\" is not a string"), std::string::npos) << e;
  e = error_for("[1, 2]\n");
  EXPECT_NE(e.find(file + ":1: not a JSON object"), std::string::npos) << e;
  e = error_for("{\"body\": \"abc\"}\n");
  EXPECT_NE(e.find(file + ":1: expected a \"text\" string, or \"prompt\" and \"completion\" strings"),
            std::string::npos)
      << e;
  e = error_for("{\"prompt\": \"abcdef\", \"completion\": \"x\"}\n");
  EXPECT_NE(e.find("no usable prompt/completion example (1 dropped"), std::string::npos) << e;
  e = error_for("\n");
  EXPECT_NE(e.find("no JSON lines"), std::string::npos) << e;
  e = error_for("{\"text\": \"ab\"}\n");
  EXPECT_NE(e.find("2 tokens, need at least 3"), std::string::npos) << e;
}

TEST(JsonlDataset, LastLineWithoutNewlineAndCrlfLinesAreRead) {
  const fs::path dir = scratch_dir("line_ends");
  write_text(dir / "d.jsonl", "{\"text\": \"ab\"}\r\n{\"text\": \"cd\"}");
  const zm::ByteTokenizer tok;
  auto ds = zm::make_jsonl_dataset((dir / "d.jsonl").string(), tok, 4);
  ASSERT_EQ(ds->size(), 1);  // "ab\ncd": 5 tokens
  const Example e = example(*ds, 0);
  EXPECT_EQ(e.input, (std::vector<int64_t>{'a', 'b', '\n', 'c'}));
  EXPECT_EQ(e.target, (std::vector<int64_t>{'b', '\n', 'c', 'd'}));
}

// A FIFO as the data file is refused at once naming it (a FIFO token file used to block
// its open forever); in a data directory a FIFO is skipped, never opened. Bounded calls.
TEST(DatasetFiles, FifoIsRefusedAsAFileAndSkippedInADirectory) {
  using zenflow::test_support::call_within;
  using zenflow::test_support::make_fifo;
  const fs::path dir = scratch_dir("fifo");
  ASSERT_EQ(make_fifo(dir / "train.jsonl"), "");
  ASSERT_EQ(make_fifo(dir / "train.u16"), "");
  const std::string jsonl = (dir / "train.jsonl").string(), tokens = (dir / "train.u16").string();
  const auto refused = [](const std::string& path, const std::function<void()>& fn) {
    const auto o = call_within(fn);
    ASSERT_TRUE(o.returned) << o.message;
    EXPECT_TRUE(o.input_error) << o.message;
    EXPECT_EQ(o.message, path + ": is a FIFO, expected a regular file");
  };
  refused(jsonl, [jsonl] {
    const zm::ByteTokenizer tok;
    zm::make_jsonl_dataset(jsonl, tok, 2);
  });
  refused(tokens, [tokens] { zm::make_token_file_dataset(tokens, 2, 256); });

  fs::create_directories(dir / "jsonl_dir");
  write_text(dir / "jsonl_dir" / "a.jsonl", "{\"text\": \"abcdef\"}\n");
  ASSERT_EQ(make_fifo(dir / "jsonl_dir" / "b.jsonl"), "");
  fs::create_directories(dir / "tokens_dir");
  write_ids(dir / "tokens_dir" / "a.u16", std::vector<uint16_t>{1, 2, 3, 4, 5});
  ASSERT_EQ(make_fifo(dir / "tokens_dir" / "b.u16"), "");
  const auto o = call_within([jd = (dir / "jsonl_dir").string(), td = (dir / "tokens_dir").string()] {
    const zm::ByteTokenizer tok;
    if (zm::make_jsonl_dataset(jd, tok, 2)->size() != 2) throw std::runtime_error("jsonl size");
    if (zm::make_token_file_dataset(td, 2, 256)->size() != 2) throw std::runtime_error("tokens size");
  });
  ASSERT_TRUE(o.returned) << o.message;
  EXPECT_FALSE(o.threw) << o.message;

  // A directory holding only a FIFO has no files.
  fs::create_directories(dir / "only_fifo");
  ASSERT_EQ(make_fifo(dir / "only_fifo" / "x.u16"), "");
  const std::string only = (dir / "only_fifo").string();
  const auto none = call_within([only] { zm::make_token_file_dataset(only, 2, 256); });
  ASSERT_TRUE(none.returned) << none.message;
  EXPECT_NE(none.message.find("directory has no files"), std::string::npos) << none.message;
}

TEST(TokenFileDataset, Uint16AndUint32FilesPackAcrossFileBoundaries) {
  const fs::path dir = scratch_dir("tokens");
  std::vector<uint16_t> a;
  for (uint16_t i = 0; i < 100; ++i) a.push_back(i);
  write_ids(dir / "single.u16.bin", a);
  auto ds = zm::make_token_file_dataset((dir / "single.u16.bin").string(), 10, 100);
  ASSERT_EQ(ds->size(), 9);  // (100 - 1) / 10
  Example e = example(*ds, 3);
  EXPECT_EQ(e.input, (std::vector<int64_t>{30, 31, 32, 33, 34, 35, 36, 37, 38, 39}));
  EXPECT_EQ(e.target, (std::vector<int64_t>{31, 32, 33, 34, 35, 36, 37, 38, 39, 40}));

  // A directory: a.u16.bin (0..9) then b.u32 (70000 + 10..24), in name order.
  fs::create_directories(dir / "shards");
  std::vector<uint16_t> first;
  std::vector<uint32_t> second;
  for (uint16_t i = 0; i < 10; ++i) first.push_back(i);
  for (uint32_t i = 10; i < 25; ++i) second.push_back(70000 + i);
  write_ids(dir / "shards" / "b.u32", second);
  write_ids(dir / "shards" / "a.u16.bin", first);
  ds = zm::make_token_file_dataset((dir / "shards").string(), 4, 70025);
  ASSERT_EQ(ds->size(), 6);  // 25 tokens
  e = example(*ds, 2);       // tokens 8..12 straddle the two files
  EXPECT_EQ(e.input, (std::vector<int64_t>{8, 9, 70010, 70011}));
  EXPECT_EQ(e.target, (std::vector<int64_t>{9, 70010, 70011, 70012}));
  e = example(*ds, 5);
  EXPECT_EQ(e.target, (std::vector<int64_t>{70021, 70022, 70023, 70024}));
  EXPECT_THROW(example(*ds, 6), std::out_of_range);
}

TEST(TokenFileDataset, BadFilesAreErrorsNamingTheOffset) {
  const fs::path dir = scratch_dir("tokens_bad");
  write_ids(dir / "big.u16", std::vector<uint16_t>{1, 2, 3, 500, 4, 5});
  std::string e = error_of([&] { zm::make_token_file_dataset((dir / "big.u16").string(), 2, 256); });
  EXPECT_NE(e.find("token file '" + (dir / "big.u16").string() +
                   "': token 3 (byte offset 6) is 500, not < vocab_size 256"),
            std::string::npos)
      << e;
  write_ids(dir / "big.u32.bin", std::vector<uint32_t>{7, 70000});
  e = error_of([&] { zm::make_token_file_dataset((dir / "big.u32.bin").string(), 1, 50257); });
  EXPECT_NE(e.find("token 1 (byte offset 4) is 70000, not < vocab_size 50257"), std::string::npos) << e;

  write_text(dir / "odd.u16", std::string(7, '\0'));
  e = error_of([&] { zm::make_token_file_dataset((dir / "odd.u16").string(), 1, 256); });
  EXPECT_NE(e.find("7 bytes is not a whole number of 16-bit ids"), std::string::npos) << e;
  write_ids(dir / "train.bin", std::vector<uint16_t>{1, 2, 3});
  e = error_of([&] { zm::make_token_file_dataset((dir / "train.bin").string(), 1, 256); });
  EXPECT_NE(e.find("the name must end in .u16, .u16.bin, .u32 or .u32.bin"), std::string::npos) << e;
  write_ids(dir / "short.u16", std::vector<uint16_t>{1, 2});
  e = error_of([&] { zm::make_token_file_dataset((dir / "short.u16").string(), 2, 256); });
  EXPECT_NE(e.find("2 tokens, need at least 3"), std::string::npos) << e;
}

TEST(DatasetFromSpec, FormatsAndValidationSplit) {
  const fs::path dir = scratch_dir("spec");
  std::string lines;
  for (int i = 0; i < 20; ++i)
    lines += "{\"prompt\": \"q" + std::to_string(i) + "\", \"completion\": \"a\"}\n";
  write_text(dir / "train.jsonl", lines);
  write_text(dir / "val.jsonl",
             "{\"prompt\": \"p\", \"completion\": \"c\"}\n{\"prompt\": \"p\", \"completion\": \"d\"}\n");
  const EosByteTokenizer tok;
  zenflow::DataSpec d;
  d.format = "jsonl";
  d.train = (dir / "train.jsonl").string();
  d.val_fraction = 0.1;
  auto [train, val] = zenflow::make_dataset_from_spec(d, tok, 6, 257);
  EXPECT_EQ(train->size(), 18);
  EXPECT_EQ(val->size(), 2);
  // The held-out examples are the last lines: "q18" -> input q 1 8 a EOS EOS.
  EXPECT_EQ(example(*val, 0).input, (std::vector<int64_t>{'q', '1', '8', 'a', kEos, kEos}));

  d.val = (dir / "val.jsonl").string();
  std::tie(train, val) = zenflow::make_dataset_from_spec(d, tok, 6, 257);
  EXPECT_EQ(train->size(), 20);
  ASSERT_EQ(val->size(), 2);
  EXPECT_EQ(example(*val, 1).target, (std::vector<int64_t>{'d', kEos, kIgnore, kIgnore, kIgnore, kIgnore}));

  zenflow::DataSpec tokens;
  tokens.format = "tokens";
  write_ids(dir / "t.u16", std::vector<uint16_t>(41, 3));
  tokens.train = (dir / "t.u16").string();
  tokens.val_fraction = 0.25;
  std::tie(train, val) = zenflow::make_dataset_from_spec(tokens, tok, 10, 4);
  EXPECT_EQ(train->size() + val->size(), 4);
  EXPECT_EQ(val->size(), 1);
  EXPECT_NE(
      error_of([&] { zenflow::make_dataset_from_spec(tokens, tok, 10, 3); }).find("is 3, not < vocab_size 3"),
      std::string::npos);

  zenflow::DataSpec text;
  write_text(dir / "t.txt", "hello world, hello tokens");
  text.train = (dir / "t.txt").string();
  text.val_fraction = 0.0;
  std::tie(train, val) = zenflow::make_dataset_from_spec(text, zm::ByteTokenizer(), 4, 256);
  EXPECT_EQ(train->size(), 6);  // (25 - 1) / 4
  EXPECT_EQ(val->size(), 0);
  text.format = "parquet";
  EXPECT_THROW(zenflow::make_dataset_from_spec(text, zm::ByteTokenizer(), 4, 256), std::invalid_argument);
}
