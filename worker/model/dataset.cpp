// Text datasets packed into fixed blocks, their train/val split, and the prefetching loader.
#include "worker/model/dataset.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "common/input_file.h"
#include "worker/model/data_files.h"

namespace zenflow::model {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& file) { return read_regular_file(file.string(), -1, "a text file"); }

// A file's text, or a directory's regular files sorted by name and joined by '\n'.
std::string read_text(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::exists(status))
    throw std::runtime_error("text dataset: path '" + path + "' does not exist");
  // Anything but a directory is read as a file: a FIFO or a device is refused by path.
  if (!fs::is_directory(status)) return read_file(path);
  const std::vector<fs::path> files = data_directory_files(path);
  std::string text;
  for (size_t i = 0; i < files.size(); ++i) {
    if (i > 0) text.push_back('\n');
    text += read_file(files[i]);
  }
  return text;
}

// Examples [offset, offset + count) of another dataset.
class SubsetDataset final : public TokenDataset {
 public:
  SubsetDataset(std::shared_ptr<TokenDataset> parent, int64_t offset, int64_t count)
      : parent_(std::move(parent)), offset_(offset), count_(count) {}
  int64_t size() const override { return count_; }
  int64_t seq_len() const override { return parent_->seq_len(); }
  void fill(int64_t i, at::Tensor& input_ids, at::Tensor& targets, int64_t row) const override {
    if (i < 0 || i >= count_)
      throw std::out_of_range("dataset split: example " + std::to_string(i) + " out of range [0, " +
                              std::to_string(count_) + ")");
    parent_->fill(offset_ + i, input_ids, targets, row);
  }

 private:
  std::shared_ptr<TokenDataset> parent_;
  int64_t offset_;
  int64_t count_;
};

}  // namespace

std::shared_ptr<TokenDataset> make_text_dataset(const std::string& path, const Tokenizer& tok,
                                                int64_t seq_len) {
  const std::string what = "text dataset '" + path + "'";
  if (seq_len <= 0) throw std::invalid_argument(what + ": seq_len must be > 0, got " + std::to_string(seq_len));
  return make_packed_dataset(tok.encode(read_text(path)), seq_len, what);
}

std::pair<std::shared_ptr<TokenDataset>, std::shared_ptr<TokenDataset>> split_dataset(
    std::shared_ptr<TokenDataset> ds, double val_fraction) {
  if (!ds) throw std::invalid_argument("split_dataset: null dataset");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw std::invalid_argument("split_dataset: val_fraction must be in [0, 1), got " +
                                std::to_string(val_fraction));
  const int64_t n = ds->size();
  int64_t n_val = static_cast<int64_t>(std::ceil(val_fraction * static_cast<double>(n)));
  if (val_fraction > 0.0 && n >= 2) n_val = std::max<int64_t>(n_val, 1);
  n_val = std::min<int64_t>(n_val, std::max<int64_t>(n - 1, 0));  // train keeps one
  auto train = std::make_shared<SubsetDataset>(ds, 0, n - n_val);
  auto val = std::make_shared<SubsetDataset>(ds, n - n_val, n_val);
  return {train, val};
}

// ---------------------------------------------------------------------------------------
// DataLoader

struct DataLoader::Impl {
  std::shared_ptr<TokenDataset> ds;
  int64_t micro_batch;
  uint64_t seed;
  size_t prefetch;
  bool shuffle;

  // Consumer side (the training thread).
  LoaderPosition consumed;  // after the last batch next() returned
  int64_t last_epoch = 0;   // epoch of the last batch next() returned

  // Shared with the producer thread, under mu.
  std::mutex mu;
  std::condition_variable cv;
  struct Item {
    Batch batch;
    LoaderPosition after;
    int64_t epoch;
  };
  std::deque<Item> queue;
  bool stop = false;
  std::exception_ptr error;

  std::thread producer;

  // Producer-only state.
  LoaderPosition produce_at;
  int64_t order_epoch = -1;
  std::vector<int64_t> order;

  // Fisher-Yates with our own index draw, so the order is the same with every
  // standard library (std::shuffle and the distributions are implementation-defined).
  void make_order(int64_t epoch) {
    const int64_t n = ds->size();
    order.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    if (shuffle) {
      std::mt19937_64 rng(seed * 1000003ULL + static_cast<uint64_t>(epoch));
      for (int64_t i = n - 1; i > 0; --i) {
        const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
        std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
      }
    }
    order_epoch = epoch;
  }

  Item produce_one() {
    if (produce_at.index + micro_batch > ds->size()) {  // drop the short tail
      produce_at.epoch += 1;
      produce_at.index = 0;
    }
    if (order_epoch != produce_at.epoch) make_order(produce_at.epoch);
    const int64_t T = ds->seq_len();
    const auto opts = at::TensorOptions().dtype(at::kLong);
    Batch b;
    b.input_ids = at::empty({micro_batch, T}, opts);
    b.targets = at::empty({micro_batch, T}, opts);
    for (int64_t r = 0; r < micro_batch; ++r)
      ds->fill(order[static_cast<size_t>(produce_at.index + r)], b.input_ids, b.targets, r);
    // Counted in a plain loop: this thread stays out of LibTorch's intra-op thread pool.
    const int64_t* tg = b.targets.data_ptr<int64_t>();
    for (int64_t k = 0; k < micro_batch * T; ++k) b.tokens += tg[k] != -100 ? 1 : 0;
    const int64_t epoch = produce_at.epoch;
    produce_at.index += micro_batch;
    return Item{std::move(b), produce_at, epoch};
  }

  void run() {
    try {
      while (true) {
        {
          std::unique_lock<std::mutex> lock(mu);
          cv.wait(lock, [&] { return stop || queue.size() < prefetch; });
          if (stop) return;
        }
        Item item = produce_one();
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(std::move(item));
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
      cv.notify_all();
    }
  }

  void start(const LoaderPosition& from) {
    produce_at = from;
    stop = false;
    error = nullptr;
    queue.clear();
    producer = std::thread([this] { run(); });
  }

  void halt() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    if (producer.joinable()) producer.join();
  }
};

DataLoader::DataLoader(std::shared_ptr<TokenDataset> ds, int64_t micro_batch, uint64_t seed,
                       int prefetch, bool shuffle)
    : impl_(std::make_unique<Impl>()) {
  if (!ds) throw std::invalid_argument("DataLoader: null dataset");
  if (micro_batch <= 0)
    throw std::invalid_argument("DataLoader: micro_batch must be > 0, got " +
                                std::to_string(micro_batch));
  if (micro_batch > ds->size())
    throw std::invalid_argument("DataLoader: micro_batch " + std::to_string(micro_batch) +
                                " exceeds the dataset's " + std::to_string(ds->size()) +
                                " examples");
  if (prefetch <= 0)
    throw std::invalid_argument("DataLoader: prefetch must be > 0, got " +
                                std::to_string(prefetch));
  impl_->ds = std::move(ds);
  impl_->micro_batch = micro_batch;
  impl_->seed = seed;
  impl_->prefetch = static_cast<size_t>(prefetch);
  impl_->shuffle = shuffle;
  impl_->start(LoaderPosition{});
}

DataLoader::~DataLoader() { impl_->halt(); }

Batch DataLoader::next() {
  Impl& s = *impl_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return !s.queue.empty() || s.error; });
  if (s.queue.empty()) std::rethrow_exception(s.error);
  Impl::Item item = std::move(s.queue.front());
  s.queue.pop_front();
  s.cv.notify_all();
  lock.unlock();
  s.consumed = item.after;
  s.last_epoch = item.epoch;
  return std::move(item.batch);
}

LoaderPosition DataLoader::position() const { return impl_->consumed; }

void DataLoader::restore(const LoaderPosition& pos) {
  if (pos.epoch < 0 || pos.index < 0 || pos.index > impl_->ds->size())
    throw std::invalid_argument("DataLoader::restore: bad position (epoch " +
                                std::to_string(pos.epoch) + ", index " + std::to_string(pos.index) +
                                ") for a dataset of " + std::to_string(impl_->ds->size()) +
                                " examples");
  impl_->halt();
  impl_->consumed = pos;
  impl_->last_epoch = pos.epoch;
  impl_->start(pos);
}

int64_t DataLoader::epoch() const { return impl_->last_epoch; }

}  // namespace zenflow::model
