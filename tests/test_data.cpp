// Byte tokenizer, text dataset packing and splitting, and the prefetching DataLoader.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/remove_tree.h"
#include "tests/support/bounded_call.h"
#include "worker/model/dataset.h"
#include "worker/model/tokenizer.h"

namespace fs = std::filesystem;
namespace zm = zenflow::model;

namespace {

// A fresh directory under the system temp dir, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path_ = fs::temp_directory_path() / ("zenflow_test_data_" + std::string(info->name()) + "_" +
                                         std::to_string(std::random_device{}()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    zenflow::remove_tree(path_, ec);
  }
  const fs::path& path() const { return path_; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream out(path_ / name, std::ios::binary);
    out << text;
  }

 private:
  fs::path path_;
};

// Example i is a row of the value i (input) and 1000 + i (targets): batches name their
// examples. Odd examples carry no loss at their first position (target -100).
// Optionally throws when asked for example `poison`.
class IndexDataset : public zm::TokenDataset {
 public:
  IndexDataset(int64_t n, int64_t seq_len, int64_t poison = -1)
      : n_(n), seq_len_(seq_len), poison_(poison) {}
  int64_t size() const override { return n_; }
  int64_t seq_len() const override { return seq_len_; }
  void fill(int64_t i, at::Tensor& input_ids, at::Tensor& targets, int64_t row) const override {
    if (i == poison_) throw std::runtime_error("poisoned example " + std::to_string(i));
    input_ids[row].fill_(i);
    targets[row].fill_(1000 + i);
    if (i % 2 == 1) targets[row][0] = -100;
  }

 private:
  int64_t n_, seq_len_, poison_;
};

std::vector<int64_t> examples_of(const zm::Batch& b) {
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < b.input_ids.size(0); ++r)
    ids.push_back(b.input_ids[r][0].item<int64_t>());
  return ids;
}

// Example ids of the next `batches` batches, flattened.
std::vector<int64_t> take(zm::DataLoader& loader, int batches) {
  std::vector<int64_t> ids;
  for (int i = 0; i < batches; ++i) {
    const auto b = examples_of(loader.next());
    ids.insert(ids.end(), b.begin(), b.end());
  }
  return ids;
}

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

}  // namespace

TEST(ByteTokenizer, RoundTripsUtf8TextByteForByte) {
  const std::string text =
      "h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x9A\x80\n";  // héllo, 世界 🚀
  zm::ByteTokenizer tok;
  const auto ids = tok.encode(text);
  ASSERT_EQ(ids.size(), 20u);
  EXPECT_EQ(ids[0], 104);  // 'h'
  EXPECT_EQ(ids[1], 0xC3);
  EXPECT_EQ(ids[2], 0xA9);
  EXPECT_EQ(ids[11], 0xE7);
  EXPECT_EQ(ids[15], 0xF0);
  EXPECT_EQ(ids[19], 10);
  EXPECT_EQ(tok.decode(ids), text);
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_EQ(tok.eos_id(), -1);
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideByteRange) {
  zm::ByteTokenizer tok;
  EXPECT_THROW(tok.decode({65, 256}), std::out_of_range);
  EXPECT_THROW(tok.decode({-1}), std::out_of_range);
  EXPECT_EQ(tok.decode({0, 255}), std::string("\x00\xFF", 2));
}

TEST(LoadTokenizer, ByteSpecGivesTheByteTokenizerAndAMissingPathIsNamed) {
  const auto tok = zm::load_tokenizer("byte");
  EXPECT_EQ(tok->vocab_size(), 256);
  EXPECT_EQ(tok->encode("A\xFF"), (std::vector<int32_t>{65, 255}));
  const std::string missing = "/nonexistent/zenflow/tokenizer.json";
  try {
    zm::load_tokenizer(missing);
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
}

TEST(TextDataset, BlocksMatchTheRawBytesOfSortedConcatenatedFiles) {
  TempDir dir;
  dir.write("b.txt", "second file: \xC3\xA9t\xC3\xA9 and more bytes here.");
  dir.write("a.txt", "The first file, sorted first.\n");
  fs::create_directories(dir.path() / "sub");  // directories are skipped
  std::ofstream(dir.path() / "sub" / "zzz.txt") << "ignored";
  const std::string expected =
      "The first file, sorted first.\n\nsecond file: \xC3\xA9t\xC3\xA9 and more bytes here.";

  zm::ByteTokenizer tok;
  const int64_t T = 8;
  auto ds = zm::make_text_dataset(dir.path().string(), tok, T);
  const int64_t n_tokens = static_cast<int64_t>(expected.size());
  ASSERT_EQ(ds->size(), (n_tokens - 1) / T);
  ASSERT_EQ(ds->seq_len(), T);

  at::Tensor in = at::zeros({2, T}, at::kLong), tg = at::zeros({2, T}, at::kLong);
  for (int64_t i = 0; i < ds->size(); ++i) {
    ds->fill(i, in, tg, i % 2);
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(in[i % 2][t].item<int64_t>(), static_cast<unsigned char>(expected[i * T + t]));
      EXPECT_EQ(tg[i % 2][t].item<int64_t>(), static_cast<unsigned char>(expected[i * T + t + 1]));
    }
  }
  EXPECT_THROW(ds->fill(ds->size(), in, tg, 0), std::out_of_range);

  // A single file works the same way.
  auto single = zm::make_text_dataset((dir.path() / "a.txt").string(), tok, 4);
  EXPECT_EQ(single->size(), (30 - 1) / 4);
  single->fill(1, in, tg, 0);
  EXPECT_EQ(in[0][0].item<int64_t>(), 'f');  // "The first": byte 4
}

// A FIFO or a device as the data file is refused at once naming it (a FIFO used to block
// forever); in a data directory only regular files count: FIFOs, subdirectories and
// dangling links are skipped without being opened. Each call is bounded.
TEST(TextDataset, FifoOrDeviceIsRefusedAndOnlyRegularFilesOfADirectoryAreRead) {
  using zenflow::test_support::call_within;
  TempDir dir;
  const fs::path fifo = dir.path() / "train.txt";
  ASSERT_EQ(zenflow::test_support::make_fifo(fifo), "");
  for (const std::string& path : {fifo.string(), std::string("/dev/zero")}) {
    const auto o = call_within([path] {
      zm::ByteTokenizer tok;
      zm::make_text_dataset(path, tok, 4);
    });
    ASSERT_TRUE(o.returned) << o.message;
    EXPECT_TRUE(o.input_error) << o.message;
    EXPECT_EQ(o.message, path + ": is " + (path == fifo.string() ? "a FIFO" : "a character device") +
                             ", expected a regular file");
  }

  const fs::path data = dir.path() / "data";
  fs::create_directories(data / "sub");
  dir.write("data/a.txt", "aaaa");
  dir.write("data/sub/x.txt", "never read");
  dir.write("outside.txt", "cccc");
  ASSERT_EQ(zenflow::test_support::make_fifo(data / "b.txt"), "");
  fs::create_symlink(dir.path() / "outside.txt", data / "c.txt");
  fs::create_symlink(dir.path() / "gone.txt", data / "d.txt");
  const auto o = call_within([p = data.string()] {
    zm::ByteTokenizer tok;
    auto ds = zm::make_text_dataset(p, tok, 8);
    // "aaaa\ncccc": 9 tokens, one block of 8 + 1.
    if (ds->size() != 1) throw std::runtime_error("size " + std::to_string(ds->size()));
    at::Tensor in = at::zeros({1, 8}, at::kLong), tg = at::zeros({1, 8}, at::kLong);
    ds->fill(0, in, tg, 0);
    std::string text;
    for (int64_t t = 0; t < 8; ++t) text.push_back(static_cast<char>(in[0][t].item<int64_t>()));
    text.push_back(static_cast<char>(tg[0][7].item<int64_t>()));
    if (text != "aaaa\ncccc") throw std::runtime_error("text '" + text + "'");
  });
  ASSERT_TRUE(o.returned) << o.message;
  EXPECT_FALSE(o.threw) << o.message;
}

TEST(TextDataset, MissingAndShortInputsNameThePath) {
  TempDir dir;
  zm::ByteTokenizer tok;
  const std::string missing = (dir.path() / "nope.txt").string();
  const std::string msg = message_of([&] { zm::make_text_dataset(missing, tok, 4); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;

  dir.write("short.txt", "abc");
  const std::string short_path = (dir.path() / "short.txt").string();
  const std::string msg2 = message_of([&] { zm::make_text_dataset(short_path, tok, 4); });
  EXPECT_NE(msg2.find(short_path), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("3 tokens"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("need at least 5"), std::string::npos) << msg2;

  dir.write("five.txt", "abcde");  // exactly one block
  EXPECT_EQ(zm::make_text_dataset((dir.path() / "five.txt").string(), tok, 4)->size(), 1);
}

TEST(TextDataset, SplitTakesTheLastExamplesForValidation) {
  auto ds = std::make_shared<IndexDataset>(10, 3);
  auto [train, val] = zm::split_dataset(ds, 0.25);  // ceil(2.5) = 3
  EXPECT_EQ(train->size(), 7);
  EXPECT_EQ(val->size(), 3);
  at::Tensor in = at::zeros({1, 3}, at::kLong), tg = at::zeros({1, 3}, at::kLong);
  val->fill(0, in, tg, 0);
  EXPECT_EQ(in[0][0].item<int64_t>(), 7);
  train->fill(6, in, tg, 0);
  EXPECT_EQ(in[0][0].item<int64_t>(), 6);
  EXPECT_THROW(val->fill(3, in, tg, 0), std::out_of_range);

  EXPECT_EQ(zm::split_dataset(ds, 0.01).second->size(), 1);  // at least one
  EXPECT_EQ(zm::split_dataset(ds, 0.0).second->size(), 0);
  EXPECT_EQ(zm::split_dataset(ds, 0.99).first->size(), 1);  // train keeps one
  EXPECT_EQ(zm::split_dataset(std::make_shared<IndexDataset>(1, 3), 0.5).second->size(), 0);
  EXPECT_THROW(zm::split_dataset(ds, 1.0), std::invalid_argument);
  EXPECT_THROW(zm::split_dataset(ds, -0.1), std::invalid_argument);
}

TEST(DataLoader, BatchesAreInt64WithTargetsAndTokenCount) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 40; ++i) text += "line " + std::to_string(i) + "\n";
  dir.write("t.txt", text);
  zm::ByteTokenizer tok;
  auto ds = zm::make_text_dataset((dir.path() / "t.txt").string(), tok, 16);
  zm::DataLoader loader(ds, 4, /*seed=*/3, /*prefetch=*/2, /*shuffle=*/false);
  const zm::Batch b = loader.next();
  ASSERT_EQ(b.input_ids.sizes(), (std::vector<int64_t>{4, 16}));
  ASSERT_EQ(b.targets.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(b.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(b.targets.scalar_type(), at::kLong);
  EXPECT_TRUE(b.input_ids.device().is_cpu());
  EXPECT_EQ(b.tokens, 64);
  // Unshuffled: row 1 is example 1 = bytes [16, 33) of the text.
  for (int64_t t = 0; t < 16; ++t) {
    EXPECT_EQ(b.input_ids[1][t].item<int64_t>(), static_cast<unsigned char>(text[16 + t]));
    EXPECT_EQ(b.targets[1][t].item<int64_t>(), static_cast<unsigned char>(text[17 + t]));
  }
}

TEST(DataLoader, TokenCountSkipsMaskedTargets) {
  auto ds = std::make_shared<IndexDataset>(12, 5);
  zm::DataLoader loader(ds, 6, /*seed=*/1);
  int64_t masked = 0;
  for (int i = 0; i < 4; ++i) {
    const zm::Batch b = loader.next();
    int64_t odd = 0;
    for (int64_t id : examples_of(b)) odd += id % 2;
    EXPECT_EQ(b.tokens, 6 * 5 - odd);
    masked += odd;
  }
  EXPECT_EQ(masked, 12);  // two epochs, six odd examples each
}

TEST(DataLoader, UnshuffledKeepsIndexOrderAndDropsTheShortTail) {
  auto ds = std::make_shared<IndexDataset>(10, 2);
  zm::DataLoader loader(ds, 3, 0, 2, /*shuffle=*/false);
  EXPECT_EQ(take(loader, 3), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(loader.epoch(), 0);
  EXPECT_EQ(take(loader, 1), (std::vector<int64_t>{0, 1, 2}));  // 9 is dropped
  EXPECT_EQ(loader.epoch(), 1);
  EXPECT_EQ(loader.position().epoch, 1);
  EXPECT_EQ(loader.position().index, 3);
}

TEST(DataLoader, EachEpochCoversEveryExampleOnceInAFreshOrder) {
  const int64_t n = 23;
  auto ds = std::make_shared<IndexDataset>(n, 2);
  zm::DataLoader loader(ds, 1, /*seed=*/42);
  std::vector<std::vector<int64_t>> epochs;
  for (int e = 0; e < 3; ++e) {
    epochs.push_back(take(loader, static_cast<int>(n)));
    EXPECT_EQ(loader.epoch(), e);
    std::vector<int64_t> sorted = epochs.back();
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  }
  std::vector<int64_t> identity(n);
  for (int64_t i = 0; i < n; ++i) identity[static_cast<size_t>(i)] = i;
  EXPECT_NE(epochs[0], identity);
  EXPECT_NE(epochs[0], epochs[1]);
  EXPECT_NE(epochs[1], epochs[2]);

  // With micro_batch 4: 5 batches per epoch, 20 distinct examples, 3 dropped.
  zm::DataLoader by4(ds, 4, 42);
  const auto first = take(by4, 5);
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), 20u);
  EXPECT_EQ(by4.epoch(), 0);
  take(by4, 1);
  EXPECT_EQ(by4.epoch(), 1);
}

TEST(DataLoader, OrderIsFisherYatesOverMt19937_64SeededBySeedAndEpoch) {
  // The documented permutation, recomputed independently: identical on every
  // standard library because mt19937_64's output sequence is fixed by the standard.
  const int64_t n = 17;
  const uint64_t seed = 7;
  auto ds = std::make_shared<IndexDataset>(n, 2);
  zm::DataLoader loader(ds, 1, seed);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<int64_t> expected(n);
    for (int64_t i = 0; i < n; ++i) expected[static_cast<size_t>(i)] = i;
    std::mt19937_64 rng(seed * 1000003ULL + epoch);
    for (int64_t i = n - 1; i > 0; --i)
      std::swap(expected[static_cast<size_t>(i)],
                expected[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
    EXPECT_EQ(take(loader, static_cast<int>(n)), expected) << "epoch " << epoch;
  }
}

TEST(DataLoader, SameSeedSameSequenceDifferentSeedDifferent) {
  auto ds = std::make_shared<IndexDataset>(50, 2);
  zm::DataLoader a(ds, 4, 1), b(ds, 4, 1, /*prefetch=*/5), c(ds, 4, 2);
  const auto sa = take(a, 30), sb = take(b, 30), sc = take(c, 30);
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, sc);
}

TEST(DataLoader, RestoreContinuesExactly) {
  auto ds = std::make_shared<IndexDataset>(19, 2);
  zm::DataLoader original(ds, 3, 9);
  take(original, 8);  // crosses the first epoch boundary (6 batches per epoch)
  const zm::LoaderPosition pos = original.position();
  EXPECT_EQ(pos.epoch, 1);
  EXPECT_EQ(pos.index, 6);
  const auto rest = take(original, 12);

  zm::DataLoader resumed(ds, 3, 9);
  take(resumed, 2);  // some state and a full prefetch queue to throw away
  resumed.restore(pos);
  EXPECT_EQ(resumed.position().epoch, 1);
  EXPECT_EQ(take(resumed, 12), rest);

  // Restoring the same loader backwards replays too.
  original.restore(pos);
  EXPECT_EQ(take(original, 12), rest);

  // The position at an epoch's end resumes into the next epoch.
  zm::DataLoader a(ds, 3, 9);
  take(a, 6);
  const auto end_of_epoch = a.position();
  EXPECT_EQ(end_of_epoch.epoch, 0);
  EXPECT_EQ(end_of_epoch.index, 18);
  const auto next_epoch = take(a, 2);
  EXPECT_EQ(a.epoch(), 1);
  zm::DataLoader b(ds, 3, 9);
  b.restore(end_of_epoch);
  EXPECT_EQ(take(b, 2), next_epoch);
}

TEST(DataLoader, ErrorsInTheLoaderThreadSurfaceInNext) {
  auto ds = std::make_shared<IndexDataset>(8, 2, /*poison=*/5);
  zm::DataLoader loader(ds, 2, 0, 2, /*shuffle=*/false);
  EXPECT_EQ(take(loader, 2), (std::vector<int64_t>{0, 1, 2, 3}));
  const std::string msg = message_of([&] { loader.next(); });
  EXPECT_NE(msg.find("poisoned example 5"), std::string::npos) << msg;
}

TEST(DataLoader, RejectsBadArgumentsAndShutsDownWithAFullQueue) {
  auto ds = std::make_shared<IndexDataset>(8, 2);
  EXPECT_THROW(zm::DataLoader(ds, 9, 0), std::invalid_argument);
  EXPECT_THROW(zm::DataLoader(ds, 0, 0), std::invalid_argument);
  EXPECT_THROW(zm::DataLoader(ds, 2, 0, 0), std::invalid_argument);
  for (int i = 0; i < 20; ++i) {  // destruction while the thread is blocked or busy
    zm::DataLoader loader(ds, 2, static_cast<uint64_t>(i), 3);
    if (i % 2) loader.next();
  }
  SUCCEED();
}
