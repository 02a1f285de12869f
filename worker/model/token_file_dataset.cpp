// Pre-tokenized binary token files (.u16 / .u32), memory-mapped and packed like text.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/input_file.h"
#include "worker/model/data_files.h"
#include "worker/model/dataset.h"

namespace zenflow::model {
namespace {

namespace fs = std::filesystem;

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Bytes per id from the file name (2 or 4), 0 when the name carries no type.
int element_size(const fs::path& file) {
  const std::string name = file.filename().string();
  if (ends_with(name, ".u16") || ends_with(name, ".u16.bin")) return 2;
  if (ends_with(name, ".u32") || ends_with(name, ".u32.bin")) return 4;
  return 0;
}

// One read-only mapping of a token file.
class TokenFile {
 public:
  TokenFile(const fs::path& path, int elem) : path_(path.string()), elem_(elem) {
    const int fd = open_regular_file(path_, -1, "a token file");  // no size limit: mapped, not read
    struct stat st {};
    if (fstat(fd, &st) != 0) {
      const std::string err = std::strerror(errno);
      ::close(fd);
      throw std::runtime_error("token file '" + path_ + "': cannot stat: " + err);
    }
    bytes_ = static_cast<size_t>(st.st_size);
    if (bytes_ % static_cast<size_t>(elem_) != 0) {
      ::close(fd);
      throw std::runtime_error("token file '" + path_ + "': " + std::to_string(bytes_) +
                               " bytes is not a whole number of " + std::to_string(elem_ * 8) +
                               "-bit ids (truncated?)");
    }
    if (bytes_ > 0) {
      void* addr = mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
      const std::string err = std::strerror(errno);
      if (addr == MAP_FAILED) {
        ::close(fd);
        throw std::runtime_error("token file '" + path_ + "': mmap failed: " + err);
      }
      data_ = addr;
    }
    ::close(fd);
  }
  ~TokenFile() {
    if (data_) munmap(data_, bytes_);
  }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t size() const { return static_cast<int64_t>(bytes_) / elem_; }
  uint32_t at(int64_t k) const {
    if (elem_ == 2) return static_cast<const uint16_t*>(data_)[k];
    return static_cast<const uint32_t*>(data_)[k];
  }
  const std::string& path() const { return path_; }

  void check_ids(int64_t vocab_size) const {
    const int64_t n = size();
    for (int64_t k = 0; k < n; ++k) {
      const uint32_t id = at(k);
      if (static_cast<int64_t>(id) >= vocab_size)
        throw std::runtime_error("token file '" + path_ + "': token " + std::to_string(k) + " (byte offset " +
                                 std::to_string(k * elem_) + ") is " + std::to_string(id) +
                                 ", not < vocab_size " + std::to_string(vocab_size));
    }
  }

 private:
  std::string path_;
  int elem_;
  size_t bytes_ = 0;
  void* data_ = nullptr;
};

class TokenFileDataset final : public TokenDataset {
 public:
  TokenFileDataset(std::vector<std::unique_ptr<TokenFile>> files, int64_t seq_len, std::string what)
      : files_(std::move(files)), seq_len_(seq_len), what_(std::move(what)) {
    int64_t total = 0;
    for (const auto& f : files_) {
      starts_.push_back(total);
      total += f->size();
    }
    total_ = total;
  }

  int64_t total_tokens() const { return total_; }
  int64_t size() const override { return (total_ - 1) / seq_len_; }
  int64_t seq_len() const override { return seq_len_; }

  void fill(int64_t i, at::Tensor& input_ids, at::Tensor& targets, int64_t row) const override {
    if (i < 0 || i >= size())
      throw std::out_of_range(what_ + ": example " + std::to_string(i) + " out of range [0, " +
                              std::to_string(size()) + ")");
    auto in = input_ids.accessor<int64_t, 2>()[row];
    auto tg = targets.accessor<int64_t, 2>()[row];
    // Tokens [i*T, i*T + T + 1) may span files: walk them from the one holding the start.
    const int64_t begin = i * seq_len_;
    size_t f =
        static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), begin) - starts_.begin() - 1);
    int64_t k = begin - starts_[f];
    for (int64_t t = 0; t <= seq_len_; ++t) {
      while (k >= files_[f]->size()) {
        ++f;
        k = 0;
      }
      const int64_t id = files_[f]->at(k++);
      if (t < seq_len_) in[t] = id;
      if (t > 0) tg[t - 1] = id;
    }
  }

 private:
  std::vector<std::unique_ptr<TokenFile>> files_;
  std::vector<int64_t> starts_;  // first global token index of each file
  int64_t total_ = 0;
  int64_t seq_len_;
  std::string what_;
};

}  // namespace

std::shared_ptr<TokenDataset> make_token_file_dataset(const std::string& path, int64_t seq_len,
                                                      int64_t vocab_size) {
  const std::string what = "token dataset '" + path + "'";
  if (seq_len <= 0)
    throw std::invalid_argument(what + ": seq_len must be > 0, got " + std::to_string(seq_len));
  if (vocab_size <= 0) throw std::invalid_argument(what + ": vocab_size must be > 0");
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status)) throw std::runtime_error(what + ": path does not exist");
  std::vector<fs::path> paths;
  if (fs::is_directory(status)) {
    paths = data_directory_files(path);
    if (paths.empty()) throw std::runtime_error(what + ": directory has no files");
  } else {
    paths.push_back(path);  // a FIFO or a device is refused by TokenFile, never opened
  }
  std::vector<std::unique_ptr<TokenFile>> files;
  for (const fs::path& p : paths) {
    const int elem = element_size(p);
    if (elem == 0)
      throw std::runtime_error("token file '" + p.string() +
                               "': the name must end in .u16, .u16.bin, .u32 or .u32.bin to say the id type");
    files.push_back(std::make_unique<TokenFile>(p, elem));
    files.back()->check_ids(vocab_size);
  }
  auto ds = std::make_shared<TokenFileDataset>(std::move(files), seq_len, what);
  if (ds->total_tokens() < seq_len + 1)
    throw std::runtime_error(what + ": " + std::to_string(ds->total_tokens()) + " tokens, need at least " +
                             std::to_string(seq_len + 1) + " (one block of seq_len + 1)");
  return ds;
}

}  // namespace zenflow::model
