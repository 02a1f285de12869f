// The job spec the CLI tests train: a one-layer Llama on the license texts, about a second on the CPU.
#pragma once

#include <cstdint>
#include <string>

namespace zenflow::test_support {

// `name` becomes the spec's name (and so its default checkpoint.dir, runs/<name> of the
// current directory); no periodic checkpoints.
inline std::string tiny_job_spec(const std::string& name, int64_t steps = 3) {
  return "name: " + name +
         "\n"
         "model: {arch: llama, config: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 4,\n"
         "        intermediate_size: 64, max_position_embeddings: 32}}\n"
         "data: {train: /usr/share/common-licenses, tokenizer: byte}\n"
         "train: {steps: " +
         std::to_string(steps) +
         ", micro_batch: 2, seq_len: 16, lr: 1.0e-3, warmup_steps: 1, device: cpu}\n"
         "optimizer: {mode: zenflow, zenflow: {update_interval: 2, full_warm_up_rounds: 0, min_split_numel: 512}}\n"
         "checkpoint: {every_steps: 0}\n";
}

// tiny_job_spec with its checkpoint.dir written, runs/<name>: a written path resolves
// against the spec's directory, where an absent one would be the current directory's (the
// test's), so a test that runs it leaves nothing where it was started.
inline std::string tiny_job_spec_beside_it(const std::string& name, int64_t steps = 3) {
  std::string text = tiny_job_spec(name, steps);
  const std::string line = "checkpoint: {every_steps: 0}";
  return text.replace(text.find(line), line.size(), "checkpoint: {every_steps: 0, dir: runs/" + name + "}");
}

}  // namespace zenflow::test_support
