// `zenflow tokenize`: encodes texts to token ids (or decodes ids to text) and prints JSON;
// `zenflow bench tokenizer`: its encode/decode throughput.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/commands.h"
#include "client/verbs.h"
#include "worker/rank/error_text.h"
#include "common/input_file.h"
#include "worker/model/tokenizer.h"

namespace zenflow::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  bool decode = false;
  std::vector<std::string> texts;
};

// "15496 995", "15496,995" or "[15496, 995]" → ids. Throws std::invalid_argument.
std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string token;
  const auto flush = [&] {
    if (token.empty()) return;
    std::size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(token, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != token.size() || value < 0 || value > std::numeric_limits<int32_t>::max())
      throw std::invalid_argument("'" + token + "' is not a token id");
    ids.push_back(static_cast<int32_t>(value));
    token.clear();
  };
  for (char c : text) {
    if (c == ' ' || c == ',' || c == '\t' || c == '\n' || c == '\r' || c == '[' || c == ']')
      flush();
    else
      token.push_back(c);
  }
  flush();
  return ids;
}

int run_tokenize(const TokenizeOptions& opts) {
  std::unique_ptr<model::Tokenizer> tokenizer;
  try {
    tokenizer = model::load_tokenizer(opts.tokenizer);
  } catch (const std::exception& e) {
    std::cerr << "zenflow tokenize: " << error_text(e) << "\n";
    return kExitBadInput;
  }
  std::vector<std::string> inputs = opts.texts;
  if (inputs.empty())
    inputs.emplace_back(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());

  nlohmann::json out = nlohmann::json::array();
  for (const std::string& input : inputs) {
    if (!opts.decode) {
      out.push_back(tokenizer->encode(input));
      continue;
    }
    try {
      out.push_back(tokenizer->decode(parse_ids(input)));
    } catch (const std::exception& e) {  // malformed list, or an id the tokenizer lacks
      std::cerr << "zenflow tokenize: --decode \"" << input << "\": " << error_text(e) << "\n";
      return kExitBadInput;
    }
  }
  // Decoded bytes that are not valid UTF-8 print as U+FFFD.
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return kExitOk;
}

const CommandRegistrar kTokenizeCommand(train_verb("tokenize")->order, [](CommandContext& ctx) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = ctx.root->add_subcommand("tokenize", train_verb("tokenize")->help);
  cmd->add_option("--tokenizer", opts->tokenizer, "\"byte\", a tokenizer.json, or a directory holding one")
      ->required();
  cmd->add_flag("--decode", opts->decode,
                "Decode instead: each TEXT is a list of ids separated by spaces or commas");
  // Every positional argument is one text, verbatim: CLI11 would otherwise split an
  // argument such as "[1, 2]" at its commas (its list syntax, which allow_extra_args
  // enables); a minimum count that is never reached keeps collecting without it.
  constexpr int kAll = CLI::detail::expected_max_vector_size;
  cmd->add_option("text", opts->texts, "Texts to encode (id lists with --decode); stdin when none")
      ->expected(kAll, kAll)
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->footer(
      "Prints one JSON array with an entry per TEXT: its ids, or with --decode its text.\n"
      "Example: zenflow tokenize --tokenizer DIR/tokenizer.json \"Hello world\"  ->  [[15496,995]]");
  CommandContext* context = &ctx;
  cmd->callback([opts, context] { context->exit_code = run_tokenize(*opts); });
});

struct BenchTokenizerOptions {
  std::string tokenizer;
  std::vector<std::string> files;
  int repeat = 5;
};

// Encodes the concatenated files `repeat` times (one encode() call per pass: the first
// pass starts with an empty word cache, later passes find it warm), then decodes.
int run_bench_tokenizer(const BenchTokenizerOptions& opts) {
  std::unique_ptr<model::Tokenizer> tokenizer;
  std::string text;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    tokenizer = model::load_tokenizer(opts.tokenizer);
    const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cerr << "zenflow bench tokenizer: loaded " << opts.tokenizer << " in " << load_s << " s\n";
    for (const std::string& f : opts.files) text += read_regular_file(f, -1, "a text file");
  } catch (const std::exception& e) {
    std::cerr << "zenflow bench tokenizer: " << error_text(e) << "\n";
    return kExitBadInput;
  }
  using clock = std::chrono::steady_clock;
  nlohmann::json passes = nlohmann::json::array();
  std::vector<int32_t> ids;
  double encode_s = 0;
  for (int pass = 0; pass < opts.repeat; ++pass) {
    const auto t0 = clock::now();
    ids = tokenizer->encode(text);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    encode_s += s;
    passes.push_back(static_cast<double>(text.size()) / 1e6 / s);
  }
  const auto t0 = clock::now();
  const std::string decoded = tokenizer->decode(ids);
  const double decode_s = std::chrono::duration<double>(clock::now() - t0).count();
  const double mb = static_cast<double>(text.size()) / 1e6;
  nlohmann::json out = {
      {"tokenizer", opts.tokenizer},
      {"bytes", text.size()},
      {"tokens", ids.size()},
      {"bytes_per_token",
       ids.empty() ? 0.0 : static_cast<double>(text.size()) / static_cast<double>(ids.size())},
      {"passes", opts.repeat},
      {"encode_mb_per_s", mb * opts.repeat / encode_s},
      {"encode_mb_per_s_by_pass", passes},
      {"decode_mb_per_s", mb / decode_s},
      {"round_trip", decoded == text},
  };
  std::cout << out.dump(2) << "\n";
  return kExitOk;
}

const CommandRegistrar kBenchTokenizerCommand(40, [](CommandContext& ctx) {
  auto opts = std::make_shared<BenchTokenizerOptions>();
  CLI::App* cmd =
      ctx.bench->add_subcommand("tokenizer", "Tokenizer encode/decode throughput (MB/s) on text files");
  cmd->add_option("--tokenizer", opts->tokenizer, "\"byte\", a tokenizer.json, or a directory holding one")
      ->required();
  cmd->add_option("--repeat", opts->repeat, "Encode passes over the text")->check(CLI::PositiveNumber);
  cmd->add_option("files", opts->files, "Text files, concatenated")->required();
  CommandContext* context = &ctx;
  cmd->callback([opts, context] { context->exit_code = run_bench_tokenizer(*opts); });
});

}  // namespace
}  // namespace zenflow::cli
