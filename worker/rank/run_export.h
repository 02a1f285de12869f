// Exporting a training run: the newest checkpoint of a run directory as a Hugging Face
// model directory (what `zenflow export` does).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace zenflow {

// Bad input to export_run: no run directory, no checkpoint, no or unreadable run.yaml,
// an unknown dtype, an output directory that exists and is not empty. The CLI maps it to its bad-input exit
// code.
class ExportInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ExportSummary {
  std::string checkpoint;  // the step directory exported
  int64_t step = 0;
  std::string out_dir;
  std::string dtype;             // float32 | bfloat16 | float16
  std::string model_type;        // llama | mistral | qwen2 | gpt2
  std::string tokenizer_source;  // where tokenizer files were copied from ("" = none)
  int64_t tensors = 0;
  int64_t parameters = 0;  // scalars
};

// Reads `run_dir` (a job's checkpoint.dir): the newest complete checkpoint
// (load_latest_checkpoint: verified against its manifest; damaged ones are skipped with a
// message through `warn`, and left where they are) and the job spec saved in it
// (run.yaml). Writes nothing but `out_dir`. Writes `out_dir` with export_hf_model: config.json of the
// model (model.from's config.json, or the one generated from model.config for random
// init), the checkpoint's weights, and the tokenizer files of data.tokenizer (when it is
// a path) or else of model.from. dtype "auto" is the dtype model.from was stored in
// (float32 for random init); otherwise float32 | bfloat16 | float16.
// Throws ExportInputError for bad input, std::runtime_error for other failures
// (nothing is left at out_dir then).
ExportSummary export_run(const std::string& run_dir, const std::string& out_dir, const std::string& dtype,
                         const std::function<void(const std::string&)>& warn);

}  // namespace zenflow
