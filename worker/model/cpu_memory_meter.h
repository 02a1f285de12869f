// The bytes LibTorch's tensors hold in host memory, counted where they are allocated: a
// wrapper around c10's CPU allocator, installed once for the process. On a CPU run the host
// is the device, and this is how a run measures what its forward keeps for the backward
// (activations_peak) the way a CUDA run reads its caching allocator's statistics.
#pragma once

#include <cstdint>

namespace zenflow::model {

class CpuMemoryMeter {
 public:
  // Makes every later CPU tensor allocation go through the meter (the same memory, the same
  // 64-byte alignment: no number a computation produces changes). Idempotent; tensors
  // allocated before it are not counted and free as before.
  static void install();
  static bool installed();
  // Bytes of the metered allocations alive now, and the most alive at once since the last
  // reset_peak() (or install()).
  static int64_t live_bytes();
  static int64_t peak_bytes();
  // Starts a new peak at the bytes alive now; returns them.
  static int64_t reset_peak();
};

}  // namespace zenflow::model
