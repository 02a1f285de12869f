// The two halves of the `zenflow` command. `zenflow` itself links no LibTorch, so that the
// service verbs (submit, jobs, status, watch, logs, cancel, workers, up, advise, report) and
// --version answer at once; the verbs that need LibTorch live in `zenflow-train`, installed
// beside it, and `zenflow VERB ...` for one of them runs `zenflow-train VERB ...` in its place
// (execv: same process, same PID, same arguments, so the agent, the launcher and scripts
// see one command). This table is the one place that says which verbs those are.
#pragma once

#include <cstring>

namespace zenflow::cli {

struct TrainVerb {
  const char* name;
  const char* help;  // the verb's one-line description, in both halves' --help
  int order;         // its place in --help (commands.h's CommandRegistrar order)
};

inline constexpr TrainVerb kTrainVerbs[] = {
    {"run", "Train a job locally, in this process", 10},
    {"export", "Write the newest checkpoint of a run as a Hugging Face model directory", 30},
    {"tokenize", "Encode texts to token ids, or decode ids to text, printing a JSON array", 40},
    {"profile-host", "Measure this machine's constants for zenflow advise, written as a catalog row", 46},
    {"bench", "Benchmarks that print figures as JSON", 100},
};

// The verb named `name` if it is zenflow-train's, else null.
inline const TrainVerb* train_verb(const char* name) {
  for (const TrainVerb& v : kTrainVerbs)
    if (std::strcmp(v.name, name) == 0) return &v;
  return nullptr;
}

// zenflow-train's name, beside `zenflow` (the ZENFLOW_TRAIN_BINARY environment variable
// overrides the path).
inline constexpr const char* kTrainBinaryName = "zenflow-train";

}  // namespace zenflow::cli
