// Which instruction set the host kernels run with: CPUID detection and the override.
//
// The host kernels (adamw_step, adamw_window_end, accumulate) exist in three builds:
// AVX-512 (F+BW+VL), AVX2 (+F16C) and portable scalar. At first use the best one the
// CPU and OS support is chosen, unless the environment variable ZENFLOW_HOST_ISA
// (scalar | avx2 | avx512) names another. Every build computes each element with the
// same fp32 operations in the same order and without FMA contraction, so all three
// give bitwise-identical results; the choice changes speed only.
#pragma once

#include <string>

namespace zenflow::engine {

enum class HostIsa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// "scalar", "avx2", "avx512".
const char* host_isa_name(HostIsa isa);

// Parses a name as printed by host_isa_name. Throws std::invalid_argument naming the
// value and the accepted names otherwise.
HostIsa parse_host_isa(const std::string& name);

// Whether this CPU and OS can run `isa` (CPUID feature bits and XCR0 register state).
// kScalar is always supported.
bool host_isa_supported(HostIsa isa);

// The best supported ISA, ignoring the environment.
HostIsa best_host_isa();

// The ISA the kernels use now. On first call resolves ZENFLOW_HOST_ISA; throws
// std::runtime_error if it names an unknown ISA or one this CPU cannot run (and keeps
// throwing on every call, so a misconfigured process cannot silently run another
// kernel). Thread-safe.
HostIsa active_host_isa();

// Makes the kernels use `isa` from now on (tests, the benchmark). Throws
// std::invalid_argument if this CPU cannot run it. Must not be called while host
// kernels are running on other threads.
void set_host_isa(HostIsa isa);

}  // namespace zenflow::engine
