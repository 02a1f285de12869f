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

namespace zenflow::model {

// A token stream packed into seq_len+1 blocks exactly as make_text_dataset packs text:
// example i is tokens [i*T, i*T + T + 1). `what` names the source in errors. Throws
// std::runtime_error when there are fewer than seq_len + 1 tokens.
std::shared_ptr<TokenDataset> make_packed_dataset(std::vector<int32_t> tokens, int64_t seq_len,
                                                  const std::string& what);

// JSON Lines (`path` a file, or a directory whose regular files are read in name order),
// one JSON object per line, blank lines skipped, other keys ignored. The first object
// decides the kind, which every line must then share:
//   {"text": ...}        each text's tokens, followed by tok.eos_id() (or, when the
//                        tokenizer has none, by the tokens of "\n"), all packed as by
//                        make_packed_dataset;
//   {"prompt": ..., "completion": ...}
//                        one example per line: tokens = encode(prompt) +
//                        encode(completion) + [eos when the tokenizer has one], cut to
//                        seq_len + 1 and padded (pad = eos, or 0 without one); input[t] =
//                        tokens[t], target[t] = tokens[t + 1] where t + 1 falls on a
//                        completion / eos token, -100 on the prompt and the padding. A
//                        line whose window holds no completion token (prompt too long) is
//                        dropped.
// Throws std::runtime_error naming the file and line for bad JSON, a missing or
// non-string field, or a mix of kinds; and when no example results.
std::shared_ptr<TokenDataset> make_jsonl_dataset(const std::string& path, const Tokenizer& tok, int64_t seq_len);

// Pre-tokenized binary token ids, packed like text. The element type comes from the
// file name: NAME.u16 or NAME.u16.bin (uint16), NAME.u32 or NAME.u32.bin (uint32),
// little-endian, no header. `path` is such a file or a directory of them (all regular
// files, in name order, concatenated). Files are memory-mapped, not copied. Every id is
// checked < vocab_size up front; the error names the file, the token index and byte
// offset, the id and vocab_size. Also throws std::runtime_error naming the file for an
// unrecognized name, a size that is not a whole number of ids, or too few tokens.
std::shared_ptr<TokenDataset> make_token_file_dataset(const std::string& path, int64_t seq_len,
                                                      int64_t vocab_size);

}  // namespace zenflow::model
