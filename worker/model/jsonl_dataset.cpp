// JSON Lines datasets ({"text"} packed, {"prompt","completion"} masked) and packed token streams.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/input_file.h"
#include "common/json_error.h"
#include "worker/model/data_files.h"
#include "worker/model/dataset.h"

namespace zenflow::model {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

class PackedDataset final : public TokenDataset {
 public:
  PackedDataset(std::vector<int32_t> tokens, int64_t seq_len, std::string what)
      : tokens_(std::move(tokens)), seq_len_(seq_len), what_(std::move(what)) {}

  int64_t size() const override { return (static_cast<int64_t>(tokens_.size()) - 1) / seq_len_; }
  int64_t seq_len() const override { return seq_len_; }

  void fill(int64_t i, at::Tensor& input_ids, at::Tensor& targets, int64_t row) const override {
    if (i < 0 || i >= size())
      throw std::out_of_range(what_ + ": example " + std::to_string(i) + " out of range [0, " +
                              std::to_string(size()) + ")");
    auto in = input_ids.accessor<int64_t, 2>()[row];
    auto tg = targets.accessor<int64_t, 2>()[row];
    const int32_t* block = tokens_.data() + i * seq_len_;
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[t] = block[t];
      tg[t] = block[t + 1];
    }
  }

 private:
  std::vector<int32_t> tokens_;
  int64_t seq_len_;
  std::string what_;
};

// One example per row: seq_len + 1 tokens and the first target position with a loss
// and one past the last.
class PromptCompletionDataset final : public TokenDataset {
 public:
  PromptCompletionDataset(std::vector<int32_t> rows, std::vector<std::pair<int64_t, int64_t>> loss_spans,
                          int64_t seq_len, std::string what)
      : rows_(std::move(rows)), spans_(std::move(loss_spans)), seq_len_(seq_len), what_(std::move(what)) {}

  int64_t size() const override { return static_cast<int64_t>(spans_.size()); }
  int64_t seq_len() const override { return seq_len_; }

  void fill(int64_t i, at::Tensor& input_ids, at::Tensor& targets, int64_t row) const override {
    if (i < 0 || i >= size())
      throw std::out_of_range(what_ + ": example " + std::to_string(i) + " out of range [0, " +
                              std::to_string(size()) + ")");
    auto in = input_ids.accessor<int64_t, 2>()[row];
    auto tg = targets.accessor<int64_t, 2>()[row];
    const int32_t* tokens = rows_.data() + i * (seq_len_ + 1);
    const auto [first, last] = spans_[static_cast<size_t>(i)];
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[t] = tokens[t];
      tg[t] = t >= first && t < last ? tokens[t + 1] : -100;
    }
  }

 private:
  std::vector<int32_t> rows_;
  std::vector<std::pair<int64_t, int64_t>> spans_;
  int64_t seq_len_;
  std::string what_;
};

std::vector<fs::path> input_files(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw std::runtime_error("jsonl dataset: path '" + path + "' does not exist");
  // Anything but a directory is read as a file: a FIFO or a device is refused by path.
  if (!fs::is_directory(status)) return {fs::path(path)};
  std::vector<fs::path> files = data_directory_files(path);
  if (files.empty()) throw std::runtime_error("jsonl dataset: directory '" + path + "' has no files");
  return files;
}

// One file's lines, read as they are consumed: a jsonl file may be as large as the disk.
class LineReader {
 public:
  explicit LineReader(const std::string& path) : path_(path) {
    const int fd = open_regular_file(path, -1, "a data file");
    file_ = ::fdopen(fd, "rb");
    if (!file_) {
      const int err = errno;
      ::close(fd);
      throw InputError(path, std::string("cannot read: ") + std::strerror(err));
    }
  }
  ~LineReader() {
    std::free(buf_);
    std::fclose(file_);
  }
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  // The next line without its '\n'; false at the end of the file.
  bool next(std::string& line) {
    const ssize_t n = ::getline(&buf_, &cap_, file_);
    if (n < 0) {
      if (std::ferror(file_)) throw InputError(path_, std::string("read failed: ") + std::strerror(errno));
      return false;
    }
    line.assign(buf_, static_cast<size_t>(n));
    if (!line.empty() && line.back() == '\n') line.pop_back();
    return true;
  }

 private:
  std::string path_;
  FILE* file_ = nullptr;
  char* buf_ = nullptr;
  size_t cap_ = 0;
};

enum class Kind { kUnknown, kText, kPromptCompletion };

const std::string& string_field(const json& obj, const char* key, const std::string& where) {
  const auto it = obj.find(key);
  if (it == obj.end()) throw std::runtime_error(where + ": missing \"" + key + "\"");
  if (!it->is_string()) throw std::runtime_error(where + ": \"" + key + "\" is not a string");
  return it->get_ref<const std::string&>();
}

}  // namespace

std::shared_ptr<TokenDataset> make_packed_dataset(std::vector<int32_t> tokens, int64_t seq_len,
                                                  const std::string& what) {
  if (seq_len <= 0)
    throw std::invalid_argument(what + ": seq_len must be > 0, got " + std::to_string(seq_len));
  if (static_cast<int64_t>(tokens.size()) < seq_len + 1)
    throw std::runtime_error(what + ": " + std::to_string(tokens.size()) + " tokens, need at least " +
                             std::to_string(seq_len + 1) + " (one block of seq_len + 1)");
  return std::make_shared<PackedDataset>(std::move(tokens), seq_len, what);
}

std::shared_ptr<TokenDataset> make_jsonl_dataset(const std::string& path, const Tokenizer& tok,
                                                 int64_t seq_len) {
  const std::string what = "jsonl dataset '" + path + "'";
  if (seq_len <= 0)
    throw std::invalid_argument(what + ": seq_len must be > 0, got " + std::to_string(seq_len));
  const int32_t eos = tok.eos_id();
  const std::vector<int32_t> separator = eos >= 0 ? std::vector<int32_t>{eos} : tok.encode("\n");
  const int64_t width = seq_len + 1;

  Kind kind = Kind::kUnknown;
  std::vector<int32_t> packed;                     // kText
  std::vector<int32_t> rows;                       // kPromptCompletion
  std::vector<std::pair<int64_t, int64_t>> spans;  // kPromptCompletion
  int64_t dropped = 0;
  for (const fs::path& file : input_files(path)) {
    LineReader in(file.string());
    std::string line;
    for (int64_t number = 1; in.next(line); ++number) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const std::string where = file.string() + ":" + std::to_string(number);
      json obj;
      try {
        obj = json::parse(line);
      } catch (const json::parse_error& e) {
        throw std::runtime_error(where + ": not valid JSON: " + json_error_text(e));
      }
      if (!obj.is_object()) throw std::runtime_error(where + ": not a JSON object");
      const bool pc = obj.contains("prompt") || obj.contains("completion");
      if (kind == Kind::kUnknown) {
        if (!pc && !obj.contains("text"))
          throw std::runtime_error(where +
                                   ": expected a \"text\" string, or \"prompt\" and \"completion\" strings");
        kind = pc ? Kind::kPromptCompletion : Kind::kText;
      } else if (pc != (kind == Kind::kPromptCompletion)) {
        throw std::runtime_error(where + ": mixes " + (pc ? "prompt/completion" : "text") +
                                 " lines into a file of " + (pc ? "text" : "prompt/completion") + " lines");
      }

      if (kind == Kind::kText) {
        const std::vector<int32_t> ids = tok.encode(string_field(obj, "text", where));
        packed.insert(packed.end(), ids.begin(), ids.end());
        packed.insert(packed.end(), separator.begin(), separator.end());
        continue;
      }
      std::vector<int32_t> ids = tok.encode(string_field(obj, "prompt", where));
      const auto prompt_len = static_cast<int64_t>(ids.size());
      const std::vector<int32_t> completion = tok.encode(string_field(obj, "completion", where));
      ids.insert(ids.end(), completion.begin(), completion.end());
      if (eos >= 0) ids.push_back(eos);
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(ids.size()), width);
      // Target t predicts token t + 1: the loss covers t + 1 in [prompt_len, n).
      const int64_t first = std::max<int64_t>(prompt_len - 1, 0);
      const int64_t last = n - 1;
      if (first >= last) {
        ++dropped;
        continue;
      }
      ids.resize(static_cast<size_t>(width), eos >= 0 ? eos : 0);
      rows.insert(rows.end(), ids.begin(), ids.end());
      spans.emplace_back(first, last);
    }
  }
  if (kind == Kind::kUnknown) throw std::runtime_error(what + ": no JSON lines");
  if (kind == Kind::kText) {
    packed.resize(packed.size() - separator.size());  // no separator after the last text
    return make_packed_dataset(std::move(packed), seq_len, what);
  }
  if (spans.empty())
    throw std::runtime_error(what + ": no usable prompt/completion example (" + std::to_string(dropped) +
                             " dropped: the prompt fills all seq_len + 1 = " + std::to_string(width) +
                             " tokens, or the completion is empty)");
  return std::make_shared<PromptCompletionDataset>(std::move(rows), std::move(spans), seq_len, what);
}

}  // namespace zenflow::model
