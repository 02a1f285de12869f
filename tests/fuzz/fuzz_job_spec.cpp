// libFuzzer target: the job spec reader (yaml::parse and the validator) on arbitrary text,
// as the coordinator receives it in SubmitJob from any admin client. Run by scripts/fuzz.sh
// (clang, -fsanitize=fuzzer,address,undefined).
//
// Properties, each a crash (abort) when broken:
//  * every input is either a spec or refused with a SpecError: no other exception, no
//    out-of-bounds read, no undefined behaviour (the sanitizers), no unbounded recursion;
//  * a spec that is accepted writes (to_yaml) text that reads back as the same spec, as
//    the coordinator stores it and a worker reads it back.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/job_spec.h"

namespace {

using zenflow::JobSpec;
using zenflow::SpecError;
using zenflow::SpecSite;

[[noreturn]] void broken(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz_job_spec: %s\n%s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  JobSpec spec;
  try {
    spec = zenflow::parse_job_spec(text, {}, "/specs", SpecSite::kRunsElsewhere);
  } catch (const SpecError&) {
    return 0;
  } catch (const std::exception& e) {
    broken("refused with something other than a SpecError", e.what());
  }
  const std::string written = zenflow::to_yaml(spec);
  JobSpec again;
  try {
    // Base ".": the first parse made every written path absolute; only an absent checkpoint.dir
    // is still relative (runs/<name> of the reader's directory, job_spec.h) and must stay so.
    again = zenflow::parse_job_spec(written, {}, ".", SpecSite::kRunsElsewhere);
  } catch (const std::exception& e) {
    broken("to_yaml wrote a spec that does not read back", std::string(e.what()) + "\n" + written);
  }
  if (!(again == spec)) broken("to_yaml's spec reads back as another spec", written);
  return 0;
}

// With ZENFLOW_FUZZ_SEEDS=DIR: specs of every section's shapes into DIR (the corpus).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("ZENFLOW_FUZZ_SEEDS");
  if (dir == nullptr) return 0;
  const char* const seeds[] = {
      "name: tiny\nmodel: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4}}\n"
      "data: {train: /d/train.txt, val: /d/val.txt, tokenizer: byte}\n"
      "train: {steps: 3, micro_batch: 2, seq_len: 16, device: cpu, lr: 3.0e-4}\n"
      "checkpoint: {dir: /c/tiny, every_steps: 2, keep: 1}\n",
      "name: z\ndata:\n  train: t.txt\noptimizer:\n  mode: zenflow\n  zenflow: {topk_ratio: 0.1, update_interval: auto, "
      "overlap_step: true}\n  host:\n    reserved_cores: [0, 1]\n    addresses: ['127.0.0.1:4000', \"h:1\"]\n"
      "    on_node_loss: spare,fail\nresources: {workers: 2, gpus_per_worker: 1, host_memory_gb: auto, priority: -3}\n"
      "cost: {instance_type: 'p4d.24xlarge', usd_per_hour: ~}\n",
      "name: a\nbase: &b {train: x}\ndata: *b\nmodel:\n  from: 'm dir/x: y'\n  config:\n    tie_word_embeddings: 1\n"
      "    rope_theta: 1e4\n",
  };
  int i = 0;
  for (const char* s : seeds) std::ofstream(std::string(dir) + "/seed-" + std::to_string(i++) + ".yaml") << s;
  return 0;
}
