// Byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2) read from Hugging Face tokenizer.json.
#pragma once
#include <memory>
#include <string>

#include "worker/model/tokenizer.h"

namespace zenflow::model {

// Loads a Hugging Face tokenizer.json (byte-level BPE); `path` is the file or the
// directory holding it. Throws std::runtime_error naming the path and the problem
// when the file is missing, is not valid JSON, or uses something not supported;
// InputError (common/input_file.h) when a file is not a regular file or is larger than
// kMaxTokenizerBytes (tokenizer_config.json: kMaxConfigBytes).
//
// Supported: model.type "BPE" (vocab; merges as "a b" strings or [a, b] pairs;
// unk_token; ignore_merges), added_tokens (matched in the raw text, leftmost-longest,
// before normalization and pre-tokenization; lstrip/rstrip/single_word honoured),
// normalizer null or NFC, pre_tokenizer ByteLevel (GPT-2 regex) or a Sequence of
// Split (the GPT-2 regex, or the Llama 3 / Qwen2 regex with \p{N}, \p{N}{1,k} or
// \p{N}+; behavior Isolated) ending in ByteLevel, decoder null or ByteLevel.
// The post_processor is not applied: encode() adds no BOS/EOS.
//
// eos_id(): tokenizer_config.json's eos_token when that file sits beside the
// tokenizer.json; otherwise the first of <|endoftext|>, <|end_of_text|>, </s>, <eos>
// present; otherwise -1. vocab_size() is the largest id (vocab or added) plus one.
//
// encode() never fails: bytes that are not valid UTF-8 are tokenized as single bytes,
// so decode(encode(s)) == s for any s when there is no normalizer (with NFC it is
// NFC(s)). decode() writes added tokens verbatim and other tokens' bytes; it throws
// std::out_of_range for an id that names no token. Both are thread-safe.
std::unique_ptr<Tokenizer> load_hf_tokenizer(const std::string& path);

// Builds the same tokenizer from GPT-2's original files: encoder.json (token → id) and
// vocab.bpe ("#version" line, then one "a b" merge per line, by rank). <|endoftext|>
// is a special token and eos_id() when the encoder has it. Throws std::runtime_error
// naming the file and the problem.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer_files(const std::string& encoder_json,
                                                     const std::string& vocab_bpe);

}  // namespace zenflow::model
