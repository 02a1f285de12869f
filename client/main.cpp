// zenflow: the command-line interface. Verbs register themselves (commands.h).
#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>

#include "client/commands.h"
#include "common/version.h"

namespace zenflow::cli {

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
    std::cerr << "zenflow: error: " << zenflow::error_text(e) << "\n";
    return kExitFailure;
  }
  return ctx.exit_code;
}
