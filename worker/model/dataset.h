// Token datasets and the prefetching loader that feeds the training loop.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/model/tokenizer.h"

namespace zenflow::model {

// One micro-batch. input_ids and targets are [B, T] int64 on the CPU; targets use
// -100 for positions that carry no loss.
struct Batch {
  at::Tensor input_ids;
  at::Tensor targets;
  int64_t tokens = 0;  // positions with a loss
};

// A dataset of fixed-length examples of seq_len + 1 tokens (input = [0, T), target =
// [1, T+1)); the loss mask travels with each example.
class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seq_len() const = 0;
  // Writes example i into row `row` of the batch tensors ([B, T] int64, CPU).
  virtual void fill(int64_t i, at::Tensor& input_ids, at::Tensor& targets, int64_t row) const = 0;
};

// Plain text packed into seq_len+1 blocks. `path` is a file or a directory (its regular
// files, sorted by name, concatenated). Throws std::runtime_error naming the path when
// it is missing or yields fewer tokens than one block.
std::shared_ptr<TokenDataset> make_text_dataset(const std::string& path, const Tokenizer& tok,
                                                int64_t seq_len);

// Splits a dataset into train = [0, n - n_val) and val = [n - n_val, n) by example
// index, n_val = ceil(val_fraction * n), at least 1 when val_fraction > 0 and n >= 2,
// at most n - 1 (train always keeps an example; val may be empty). Both views share
// `ds`. Throws std::invalid_argument unless 0 <= val_fraction < 1.
std::pair<std::shared_ptr<TokenDataset>, std::shared_ptr<TokenDataset>> split_dataset(
    std::shared_ptr<TokenDataset> ds, double val_fraction);

// Where the loader stands: restoring it continues the exact same batch sequence.
struct LoaderPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // examples consumed in this epoch
};

// Deterministic shuffled micro-batches (permutation per epoch from seed and epoch, the
// same with every standard library), produced by a background thread `prefetch` batches
// ahead. An epoch is floor(size / micro_batch) batches: the short tail is dropped and
// the next epoch begins. shuffle = false keeps index order (validation). next() blocks
// only when the thread has fallen behind; the time it blocks is the trainer's `data`
// stall; an error in the thread (e.g. from fill()) is rethrown by next(). The
// constructor throws std::invalid_argument when micro_batch is not in [1, size()].
// Thread safety: next()/position()/restore() from one thread (the training loop).
class DataLoader {
 public:
  DataLoader(std::shared_ptr<TokenDataset> ds, int64_t micro_batch, uint64_t seed, int prefetch = 2,
             bool shuffle = true);
  ~DataLoader();
  Batch next();
  // Position after the last batch returned by next().
  LoaderPosition position() const;
  // Resets to `pos`; the next next() returns the batch that followed it originally.
  void restore(const LoaderPosition& pos);
  int64_t epoch() const;  // epoch of the last batch returned

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zenflow::model
