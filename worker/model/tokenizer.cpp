// The byte-level tokenizer: every byte is its own token.
#include "worker/model/tokenizer.h"

#include <stdexcept>
#include <string>

namespace zenflow::model {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || id > 255)
      throw std::out_of_range("ByteTokenizer::decode: token id " + std::to_string(id) +
                              " is outside the byte range [0, 255]");
    text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
  }
  return text;
}

}  // namespace zenflow::model
