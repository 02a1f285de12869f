// zenflow: the command-line interface. Verbs register themselves (commands.h).
#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>

#include <c10/util/Exception.h>

#include "client/commands.h"
#include "common/version.h"

namespace zenflow::cli {

std::string error_text(const std::exception& e, bool verbose) {
  if (verbose) return e.what();
  if (const auto* c10 = dynamic_cast<const c10::Error*>(&e)) {
    const std::string msg = c10->what_without_backtrace();
    return msg.substr(0, msg.find('\n')) + " (--verbose shows LibTorch's trace)";
  }
  return e.what();
}

namespace {
std::vector<std::pair<int, CommandSetup>>& registry() {
  static std::vector<std::pair<int, CommandSetup>> r;
  return r;
}
}  // namespace

CommandRegistrar::CommandRegistrar(int order, CommandSetup setup) {
  registry().emplace_back(order, std::move(setup));
}

std::vector<CommandSetup> registered_commands() {
  auto r = registry();
  std::stable_sort(r.begin(), r.end(), [](auto& a, auto& b) { return a.first < b.first; });
  std::vector<CommandSetup> out;
  for (auto& e : r) out.push_back(e.second);
  return out;
}

}  // namespace zenflow::cli

int main(int argc, char** argv) {
  using namespace zenflow::cli;
  CLI::App app{"zenflow: stall-free offloaded fine-tuning (ZenFlow)"};
  app.set_version_flag("--version", std::string("zenflow ") + zenflow::kVersion);
  app.require_subcommand(1);
  CommandContext ctx;
  ctx.root = &app;
  ctx.argv.assign(argv, argv + argc);
  ctx.bench = app.add_subcommand("bench", "Benchmarks that print figures as JSON");
  ctx.bench->require_subcommand(1);
  for (auto& setup : registered_commands()) setup(ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "zenflow: error: " << error_text(e) << "\n";
    return kExitFailure;
  }
  return ctx.exit_code;
}
