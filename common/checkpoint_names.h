// The names of a checkpoint directory's parts (worker/rank/checkpoint.h): what the rank
// writes and what a bucket mirror (common/storage/checkpoint_mirror.h) lists and fetches.
// Header-only.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace zenflow {

inline constexpr const char* kCheckpointManifest = "manifest.json";

// "step-00000090".
inline std::string checkpoint_step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

// The step of a name step-NNNNNNNN (digits only, any count), or -1.
inline int64_t checkpoint_step_of(const std::string& name) {
  if (name.size() <= 5 || name.rfind("step-", 0) != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

// A rank's engine shard in a step directory: "engine.safetensors" for rank 0,
// "engine-rank-00003.safetensors" for rank 3.
inline std::string checkpoint_shard_name(int rank) {
  if (rank == 0) return "engine.safetensors";
  char buf[48];
  std::snprintf(buf, sizeof(buf), "engine-rank-%05d.safetensors", rank);
  return buf;
}

// The rank of a shard name (checkpoint_shard_name's inverse), or -1 for any other file.
inline int checkpoint_shard_rank(const std::string& name) {
  if (name == "engine.safetensors") return 0;
  const std::string head = "engine-rank-", tail = ".safetensors";
  if (name.size() != head.size() + 5 + tail.size() || name.rfind(head, 0) != 0 ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return -1;
  int r = 0;
  for (size_t i = head.size(); i < head.size() + 5; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    r = r * 10 + (name[i] - '0');
  }
  return r > 0 ? r : -1;
}

}  // namespace zenflow
