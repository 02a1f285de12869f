// `zenflow export RUN_DIR --out DIR`: the newest checkpoint of a run as a Hugging Face model directory.
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "client/commands.h"
#include "client/verbs.h"
#include "worker/rank/error_text.h"
#include "worker/rank/run_export.h"

namespace zenflow::cli {
namespace {

struct ExportArgs {
  std::string run_dir;
  std::string out;
  std::string dtype = "auto";
};

int run_export(const ExportArgs& a) {
  try {
    const ExportSummary s = export_run(a.run_dir, a.out, a.dtype, [](const std::string& w) {
      std::cerr << "zenflow export: " << w << "\n";
    });
    std::cerr << "zenflow export: step " << s.step << " of " << s.checkpoint << " -> " << s.out_dir << " ("
              << s.model_type << ", " << s.parameters << " parameters, " << s.dtype << ")\n";
    if (s.tokenizer_source.empty())
      std::cerr << "zenflow export: byte tokenizer: no tokenizer files to copy\n";
    std::cout << nlohmann::json{{"out", s.out_dir},
                                {"checkpoint", s.checkpoint},
                                {"step", s.step},
                                {"model_type", s.model_type},
                                {"dtype", s.dtype},
                                {"tensors", s.tensors},
                                {"parameters", s.parameters},
                                {"tokenizer_source", s.tokenizer_source}}
                     .dump()
              << "\n";
    return kExitOk;
  } catch (const ExportInputError& e) {
    std::cerr << "zenflow export: " << error_text(e) << "\n";
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::cerr << "zenflow export: failed: " << error_text(e) << "\n";
    return kExitFailure;
  }
}

const CommandRegistrar kExportCommand(train_verb("export")->order, [](CommandContext& ctx) {
  auto args = std::make_shared<ExportArgs>();
  CLI::App* cmd = ctx.root->add_subcommand("export", train_verb("export")->help);
  cmd->add_option("run_dir", args->run_dir,
                  "The run's checkpoint.dir (its step-NNNNNNNN directories)")
      ->required();
  cmd->add_option("--out", args->out, "Output directory (must not exist, or be empty)")->required();
  cmd->add_option("--dtype", args->dtype, "Weights dtype: auto (the input model's; float32 for random init)")
      ->check(CLI::IsMember({"auto", "float32", "bfloat16", "float16"}));
  cmd->footer(
      "Writes config.json, model.safetensors and the tokenizer files; prints a JSON summary.\n"
      "Example: zenflow export runs/tiny-demo --out exported/tiny-demo --dtype bfloat16");
  CommandContext* context = &ctx;
  cmd->callback([args, context] { context->exit_code = run_export(*args); });
});

}  // namespace
}  // namespace zenflow::cli
