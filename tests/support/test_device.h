// Test helper: the device of the tests that can also run on a GPU.
#pragma once

#include <ATen/Context.h>
#include <c10/core/Device.h>

#include <cstdlib>
#include <string>

namespace zenflow::test_support {

// CUDA when ZENFLOW_TEST_DEVICE=cuda and LibTorch sees a GPU (scripts/gpu-check.sh sets
// it), else the CPU.
inline at::Device test_device() {
  const char* e = std::getenv("ZENFLOW_TEST_DEVICE");
  if (e != nullptr && std::string(e) == "cuda" && at::hasCUDA()) return at::Device(at::kCUDA, 0);
  return at::Device(at::kCPU);
}

}  // namespace zenflow::test_support
