// export_run: newest checkpoint (and the run.yaml in it) of a run -> Hugging Face model directory.
#include "worker/rank/run_export.h"

#include <filesystem>
#include <optional>
#include <vector>

#include "common/input_file.h"
#include "common/job_spec.h"
#include "common/storage/s3_uri.h"
#include "worker/rank/checkpoint.h"
#include "worker/model/hf_model.h"
#include "worker/model/tokenizer.h"
#include "worker/rank/model_factory.h"
#if ZENFLOW_HAVE_S3
#include "common/storage/object_cache.h"
#include "common/storage/s3.h"
#endif

namespace zenflow {

namespace fs = std::filesystem;

ExportSummary export_run(const std::string& run_dir, const std::string& out_dir, const std::string& dtype,
                         const std::function<void(const std::string&)>& warn) {
  std::error_code ec;
  if (out_dir.empty()) throw ExportInputError("--out: must not be empty");
  if (!fs::is_directory(run_dir, ec)) throw ExportInputError(run_dir + ": not a directory");
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec)))
    throw ExportInputError(
        out_dir + ": already exists and is not an empty directory; choose another --out or remove it");
  std::optional<Checkpoint> ck = load_latest_checkpoint(run_dir, warn);
  if (!ck) throw ExportInputError(run_dir + ": holds no readable checkpoint (step-NNNNNNNN directories)");

  const fs::path job_file = fs::path(ck->path) / "run.yaml";
  JobSpec spec;
  try {
    // Paths in run.yaml are absolute; the data need not exist any more to export.
    spec = parse_job_spec(read_regular_file(job_file.string(), kMaxSpecBytes, "a job spec"), {}, ck->path);
  } catch (const InputError& e) {
    throw ExportInputError(std::string(e.what()) + "; cannot tell which model the checkpoint belongs to");
  } catch (const SpecError& e) {
    throw ExportInputError(job_file.string() + ": " + e.what());
  }

  // A model or tokenizer the run read from a bucket: fetched into this machine's cache.
#if ZENFLOW_HAVE_S3
  std::vector<storage::ObjectCache::Entry> cached;
#endif
  for (auto [key, field] : {std::pair<const char*, std::string*>{"model.from", &spec.model.from},
                            {"data.tokenizer", &spec.data.tokenizer}}) {
    if (!storage::is_s3_uri(*field)) continue;
#if ZENFLOW_HAVE_S3
    try {
      auto client = std::make_shared<storage::S3Client>(storage::s3_settings_from_environment());
      storage::ObjectCache cache(storage::object_cache_dir(), int64_t{200} << 30, client, warn);
      cached.push_back(cache.fetch(storage::parse_s3_uri(*field)));
      *field = cached.back().path;
    } catch (const std::exception& e) {
      throw ExportInputError(std::string(key) + ": " + e.what());
    }
#else
    throw ExportInputError(std::string(key) + ": " + *field + ": this build has no s3:// support");
#endif
  }
  int64_t vocab = 0;
  try {
    vocab = model::load_tokenizer(spec.data.tokenizer)->vocab_size();
  } catch (const std::exception& e) {
    throw ExportInputError(std::string("data.tokenizer: ") + e.what());
  }
  model::LoadedModel info;
  try {
    info = describe_model_from_spec(spec.model, vocab);
  } catch (const std::invalid_argument& e) {
    throw ExportInputError(job_file.string() + ": " + e.what());
  }

  at::ScalarType out_dtype = info.checkpoint_dtype;
  if (dtype == "auto") {
    if (out_dtype != at::kBFloat16 && out_dtype != at::kHalf) out_dtype = at::kFloat;
  } else {
    try {
      out_dtype = model::hf_dtype_from_name(dtype);
    } catch (const std::invalid_argument& e) {
      throw ExportInputError(std::string("--dtype: ") + e.what() + " (or auto)");
    }
  }

  ExportSummary s;
  s.checkpoint = ck->path;
  s.step = ck->step;
  s.out_dir = out_dir;
  s.dtype = model::hf_dtype_name(out_dtype);
  s.model_type = info.model_type;
  if (spec.data.tokenizer != "byte") {
    s.tokenizer_source = spec.data.tokenizer;
  } else if (!spec.model.from.empty()) {
    s.tokenizer_source = spec.model.from;
  }
  std::vector<model::NamedTensor> tensors;
  for (auto& [name, t] : ck->model) {
    tensors.push_back({name, t});
    s.parameters += t.numel();
  }
  s.tensors = static_cast<int64_t>(tensors.size());
  model::export_hf_model(tensors, info.config, out_dir, out_dtype, s.tokenizer_source);
  return s;
}

}  // namespace zenflow
