// load_tokenizer: picks the tokenizer a job spec names ("byte" or a tokenizer.json).
// Kept apart from tokenizer.cpp so code that only uses ByteTokenizer does not pull in
// the Hugging Face tokenizer.
#include <memory>
#include <string>

#include "worker/model/hf_tokenizer.h"
#include "worker/model/tokenizer.h"

namespace zenflow::model {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec) {
  if (spec == "byte") return std::make_unique<ByteTokenizer>();
  return load_hf_tokenizer(spec);
}

}  // namespace zenflow::model
