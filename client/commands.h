// Registry of `zenflow` subcommands. Each command lives in its own file and registers
// itself with a static ZENFLOW_COMMAND(...) object, so adding a verb touches no other file.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "common/attempt_contract.h"

namespace zenflow::cli {

// Set up a subcommand on `app` (the root app, or the `bench` group for bench verbs).
// The callback registered on the subcommand sets `exit_code` when it runs.
struct CommandContext {
  CLI::App* root = nullptr;
  CLI::App* bench = nullptr;  // `zenflow bench ...`
  int exit_code = 0;
  std::vector<std::string> argv;  // the process's arguments, argv[0] included
};

using CommandSetup = std::function<void(CommandContext&)>;

struct CommandRegistrar {
  CommandRegistrar(int order, CommandSetup setup);
};

// All registered setups, ordered by `order` (help lists verbs in this order).
std::vector<CommandSetup> registered_commands();

// `zenflow` (no LibTorch): runs zenflow-train with these arguments in this process's place
// (verbs.h). Returns only when it cannot, having said why: kExitFailure.
int exec_train(int argc, char** argv);

// Exit codes shared by all verbs; a rank's are the attempt contract's
// (common/attempt_contract.h says what each means to the agent and the coordinator).
constexpr int kExitOk = attempt::kExitOk;
constexpr int kExitFailure = attempt::kExitFailed;
constexpr int kExitBadInput = attempt::kExitBadInput;  // bad job spec, bad flags
constexpr int kExitInterrupted = attempt::kExitInterrupted;
constexpr int kExitWorkerFault = attempt::kExitWorkerFault;  // checkpoint.dir locked by another run
constexpr int kExitLeaseLost = attempt::kExitLeaseLost;
constexpr int kExitOptimizerNodeLost = attempt::kExitNodeLost;

// A coordinator to talk to (service_commands.cpp; in builds with the services): where,
// the admin token's file and TLS, from the flags or ZENFLOW_COORDINATOR / _TOKEN_FILE /
// _TLS_CA.
struct CoordinatorFlags {
  std::string coordinator;
  std::string token_file;
  std::string tls_ca;
  std::string tls_server_name;
};
void add_coordinator_flags(CLI::App* cmd, CoordinatorFlags& f);
// The profile the coordinator keeps for job `id` (`zenflow advise JOB_ID`) into *yaml.
// Returns the verbs' exit code: 0, or (after printing why) 2 bad input or no profile yet,
// 3 no such job, 4 denied, 5 unavailable.
int fetch_job_profile(const CoordinatorFlags& f, const std::string& id, std::string* yaml);

}  // namespace zenflow::cli
