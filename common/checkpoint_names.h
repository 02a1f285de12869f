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

}  // namespace zenflow
