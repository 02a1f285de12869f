// `zenflow`'s stand-ins for zenflow-train's verbs (verbs.h): listed in --help like the others;
// main() runs zenflow-train for them before any parsing (exec_train), so these never parse.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>

#include "client/commands.h"
#include "client/verbs.h"

namespace zenflow::cli {

int exec_train(int argc, char** argv) {
  std::string path;
  if (const char* env = std::getenv("ZENFLOW_TRAIN_BINARY"); env != nullptr && *env != '\0') {
    path = env;
  } else {
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    path = ec ? std::string(kTrainBinaryName) : (self.parent_path() / kTrainBinaryName).string();
  }
  std::vector<char*> args(argv, argv + argc);
  args[0] = path.data();
  args.push_back(nullptr);
  ::execv(path.c_str(), args.data());
  const int err = errno;
  std::cerr << "zenflow " << argv[1] << ": cannot run " << path << ": " << std::strerror(err) << " (the verbs "
            << "that need LibTorch are zenflow-train's, installed beside zenflow: build it with "
            << "scripts/build.sh --target zenflow, or set ZENFLOW_TRAIN_BINARY)\n";
  return kExitFailure;
}

namespace {

// Each stand-in takes any arguments, so that `zenflow --help` lists it, in its place, with its
// description.
const struct StandIns {
  StandIns() {
    for (const TrainVerb& v : kTrainVerbs)
      CommandRegistrar(v.order, [&v](CommandContext& ctx) {
        CLI::App* cmd = ctx.root->add_subcommand(v.name, v.help);
        cmd->allow_extras();
        cmd->prefix_command();
      });
  }
} kStandIns;

}  // namespace
}  // namespace zenflow::cli
