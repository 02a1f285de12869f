// `zenflow export RUN_DIR --out DIR`: the newest checkpoint of a run (a directory, or a
// bucket prefix) as a Hugging Face model directory.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "client/commands.h"
#include "client/verbs.h"
#include "common/checkpoint_names.h"
#include "common/storage/s3_uri.h"
#if ZENFLOW_HAVE_S3
#include "common/storage/checkpoint_mirror.h"
#include "common/storage/s3.h"
#endif
#include "worker/rank/error_text.h"
#include "worker/rank/run_export.h"

namespace zenflow::cli {
namespace {

struct ExportArgs {
  std::string run_dir;
  std::string out;
  std::string dtype = "auto";
};

#if ZENFLOW_HAVE_S3
// A directory made under $TMPDIR (or /tmp), removed with everything in it when destroyed.
struct TempDir {
  explicit TempDir(const std::string& name) {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/" + name + "-XXXXXX";
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a directory " + tmpl + ": " + std::strerror(errno));
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};


// s3://BUCKET/PREFIX[/step-N]: that step (or the newest that verifies) downloaded into a
// temporary directory first (common/storage/checkpoint_mirror.h); "" and *step -1 for a
// local run directory. Throws ExportInputError for a bad URI or environment.
std::string stage_from_bucket(const std::string& uri, std::shared_ptr<TempDir>* tmp) {
  storage::S3Uri remote = storage::parse_s3_uri(uri).trimmed();
  int64_t step = -1;
  const size_t slash = remote.key.rfind('/');
  if (const int64_t s = checkpoint_step_of(remote.key.substr(slash == std::string::npos ? 0 : slash + 1)); s >= 0) {
    step = s;
    remote.key = slash == std::string::npos ? "" : remote.key.substr(0, slash);
  }
  if (remote.key.empty()) throw ExportInputError(uri + ": name a run's prefix (s3://BUCKET/PREFIX[/step-N])");
  std::shared_ptr<storage::S3Client> client;
  try {
    client = std::make_shared<storage::S3Client>(storage::s3_settings_from_environment());
  } catch (const std::runtime_error& e) {
    throw ExportInputError(uri + ": " + e.what());
  }
  *tmp = std::make_shared<TempDir>("zenflow-export");
  MirrorOptions mo;
  mo.log = [](const std::string& line) { std::cerr << "zenflow export: " << line << "\n"; };
  CheckpointMirror mirror(client, remote, (*tmp)->path, mo);
  CheckpointMirror::Pulled p;
  try {
    p = mirror.pull(step);
  } catch (const storage::S3Error&) {
    throw;  // the bucket's answer: a failure, not the user's input
  } catch (const std::runtime_error& e) {
    throw ExportInputError(e.what());  // no such step
  }
  if (p.step < 0)
    throw ExportInputError(uri + (step >= 0 ? ": the checkpoint is damaged in the bucket"
                                            : ": holds no checkpoint whose objects verify"));
  std::cerr << "zenflow export: step " << p.step << " from " << remote.text() << " (" << (p.bytes_downloaded >> 20)
            << " MiB downloaded)\n";
  return (*tmp)->path;
}

#else
std::string stage_from_bucket(const std::string& uri, std::shared_ptr<void>*) {
  throw ExportInputError(uri + ": this build has no s3:// support (libcurl4-openssl-dev and libexpat1-dev were "
                               "not found when it was built)");
}
using TempDir = void;
#endif

int run_export(const ExportArgs& a) {
  try {
    std::shared_ptr<TempDir> staged;
    const std::string run_dir = storage::is_s3_uri(a.run_dir) ? stage_from_bucket(a.run_dir, &staged) : a.run_dir;
    const ExportSummary s = export_run(run_dir, a.out, a.dtype, [](const std::string& w) {
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
                  "The run's checkpoint.dir (its step-NNNNNNNN directories), or s3://BUCKET/PREFIX[/step-N]: "
                  "the newest step that verifies, or that one")
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
