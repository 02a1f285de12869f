// `zenflow tokenize`: encodes texts to token ids (or decodes ids to text) and prints JSON.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <exception>
#include <iostream>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "client/commands.h"
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
    std::cerr << "zenflow tokenize: " << e.what() << "\n";
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
      std::cerr << "zenflow tokenize: --decode \"" << input << "\": " << e.what() << "\n";
      return kExitBadInput;
    }
  }
  // Decoded bytes that are not valid UTF-8 print as U+FFFD.
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return kExitOk;
}

const CommandRegistrar kTokenizeCommand(40, [](CommandContext& ctx) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = ctx.root->add_subcommand(
      "tokenize", "Encode texts to token ids, or decode ids to text, printing a JSON array");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "\"byte\", a tokenizer.json, or a directory holding one")
      ->required();
  cmd->add_flag("--decode", opts->decode,
                "Decode instead: each TEXT is a list of ids separated by spaces or commas");
  cmd->add_option("text", opts->texts, "Texts to encode (id lists with --decode); stdin when none");
  cmd->footer(
      "Prints one JSON array with an entry per TEXT: its ids, or with --decode its text.\n"
      "Example: zenflow tokenize --tokenizer DIR/tokenizer.json \"Hello world\"  ->  [[15496,995]]");
  CommandContext* context = &ctx;
  cmd->callback([opts, context] { context->exit_code = run_tokenize(*opts); });
});

}  // namespace
}  // namespace zenflow::cli
