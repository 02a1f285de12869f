// zenflow: the command-line interface. Verbs register themselves (commands.h). This file is
// the main of both halves (verbs.h): `zenflow` (ZENFLOW_CLI_TRAIN unset: no LibTorch; the
// verbs of kTrainVerbs run zenflow-train in its place) and `zenflow-train` (the LibTorch verbs).
#include <algorithm>
#include <exception>
#include <iostream>
#include <map>
#include <mutex>

#include "client/commands.h"
#include "client/verbs.h"
#include "common/version.h"
#if ZENFLOW_CLI_TRAIN
#include "worker/rank/error_text.h"
#endif

namespace zenflow::cli {

namespace {
std::vector<std::pair<int, CommandSetup>>& registry() {
  static std::vector<std::pair<int, CommandSetup>> r;
  return r;
}

std::string error_line(const std::exception& e) {
#if ZENFLOW_CLI_TRAIN
  return zenflow::error_text(e);
#else
  return e.what();
#endif
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
#if !ZENFLOW_CLI_TRAIN
  // A verb of zenflow-train: run it in this process's place, before anything else is set up.
  if (argc >= 2 && train_verb(argv[1]) != nullptr) return exec_train(argc, argv);
#endif
  CLI::App app{"zenflow: stall-free offloaded fine-tuning (ZenFlow)", "zenflow"};
  app.set_version_flag("--version", std::string("zenflow ") + zenflow::kVersion);
  app.require_subcommand(1);
  CommandContext ctx;
  ctx.root = &app;
  ctx.argv.assign(argv, argv + argc);
#if ZENFLOW_CLI_TRAIN
  ctx.bench = app.add_subcommand("bench", train_verb("bench")->help);
  ctx.bench->require_subcommand(1);
#endif
  for (auto& setup : registered_commands()) setup(ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "zenflow: error: " << error_line(e) << "\n";
    return kExitFailure;
  }
  return ctx.exit_code;
}
