// Tokenizers turn text into token ids and back.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zenflow::model {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eos_id() const = 0;  // -1 when the tokenizer has none
};

// Bytes are tokens 0..255; no special tokens (eos_id() == -1).
class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  int32_t eos_id() const override { return -1; }
};

// "byte" or a path to a tokenizer.json. Throws std::runtime_error naming the path.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

}  // namespace zenflow::model
