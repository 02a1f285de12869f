// Host kernel ISA selection: CPUID/XCR0 detection, ZENFLOW_HOST_ISA, dispatch table.
#include "worker/engine/host_isa.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "worker/engine/host_kernels.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace zenflow::engine {
namespace {

#if defined(__x86_64__)
uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

struct CpuFeatures {
  bool avx2 = false;    // AVX2 + F16C, YMM state enabled by the OS
  bool avx512 = false;  // AVX-512 F+BW+VL, ZMM/opmask state enabled by the OS
};

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = c & (1u << 27);
  const bool avx = c & (1u << 28);
  const bool f16c = c & (1u << 29);
  if (!osxsave || !avx) return f;
  const uint64_t xcr0 = read_xcr0();
  const bool ymm_state = (xcr0 & 0x6) == 0x6;    // SSE + AVX state
  const bool zmm_state = (xcr0 & 0xe6) == 0xe6;  // + opmask, ZMM_Hi256, Hi16_ZMM
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return f;
  const bool avx2 = b & (1u << 5);
  const bool avx512f = b & (1u << 16);
  const bool avx512bw = b & (1u << 30);
  const bool avx512vl = b & (1u << 31);
  f.avx2 = ymm_state && avx2 && f16c;
  f.avx512 = f.avx2 && zmm_state && avx512f && avx512bw && avx512vl;
  return f;
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}
#endif

const host_kernels::Table& table_for(HostIsa isa) {
  static const host_kernels::Table scalar{host_kernels::adamw_step_scalar,
                                          host_kernels::adamw_window_end_scalar,
                                          host_kernels::accumulate_scalar};
#if defined(__x86_64__)
  static const host_kernels::Table avx2{host_kernels::adamw_step_avx2, host_kernels::adamw_window_end_avx2,
                                        host_kernels::accumulate_avx2};
  static const host_kernels::Table avx512{host_kernels::adamw_step_avx512,
                                          host_kernels::adamw_window_end_avx512,
                                          host_kernels::accumulate_avx512};
  if (isa == HostIsa::kAvx512) return avx512;
  if (isa == HostIsa::kAvx2) return avx2;
#endif
  return scalar;
}

// -1 until resolved; then the HostIsa value.
std::atomic<int> g_isa{-1};
std::atomic<const host_kernels::Table*> g_table{nullptr};

HostIsa resolve_from_environment() {
  const char* env = std::getenv("ZENFLOW_HOST_ISA");
  if (env == nullptr || *env == '\0') return best_host_isa();
  HostIsa isa;
  try {
    isa = parse_host_isa(env);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("ZENFLOW_HOST_ISA: ") + e.what());
  }
  if (!host_isa_supported(isa))
    throw std::runtime_error(std::string("ZENFLOW_HOST_ISA=") + env +
                             ": this CPU (or OS) cannot run it; best supported is " +
                             host_isa_name(best_host_isa()));
  return isa;
}

}  // namespace

const char* host_isa_name(HostIsa isa) {
  switch (isa) {
    case HostIsa::kScalar:
      return "scalar";
    case HostIsa::kAvx2:
      return "avx2";
    case HostIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

HostIsa parse_host_isa(const std::string& name) {
  if (name == "scalar") return HostIsa::kScalar;
  if (name == "avx2") return HostIsa::kAvx2;
  if (name == "avx512") return HostIsa::kAvx512;
  throw std::invalid_argument("unknown host ISA '" + name + "' (expected scalar, avx2 or avx512)");
}

bool host_isa_supported(HostIsa isa) {
  switch (isa) {
    case HostIsa::kScalar:
      return true;
#if defined(__x86_64__)
    case HostIsa::kAvx2:
      return features().avx2;
    case HostIsa::kAvx512:
      return features().avx512;
#else
    default:
      return false;
#endif
  }
  return false;
}

HostIsa best_host_isa() {
  if (host_isa_supported(HostIsa::kAvx512)) return HostIsa::kAvx512;
  if (host_isa_supported(HostIsa::kAvx2)) return HostIsa::kAvx2;
  return HostIsa::kScalar;
}

HostIsa active_host_isa() {
  const int current = g_isa.load(std::memory_order_acquire);
  if (current >= 0) return static_cast<HostIsa>(current);
  const HostIsa isa = resolve_from_environment();  // throws on a bad override
  int expected = -1;
  // A concurrent set_host_isa() wins over the environment.
  if (g_isa.compare_exchange_strong(expected, static_cast<int>(isa), std::memory_order_acq_rel)) {
    g_table.store(&table_for(isa), std::memory_order_release);
    return isa;
  }
  return static_cast<HostIsa>(expected);
}

void set_host_isa(HostIsa isa) {
  if (!host_isa_supported(isa))
    throw std::invalid_argument(std::string("host ISA ") + host_isa_name(isa) +
                                " is not supported by this CPU (or OS); best supported is " +
                                host_isa_name(best_host_isa()));
  g_table.store(&table_for(isa), std::memory_order_release);
  g_isa.store(static_cast<int>(isa), std::memory_order_release);
}

namespace host_kernels {

const Table& active_table() {
  const Table* t = g_table.load(std::memory_order_acquire);
  if (t != nullptr) return *t;
  return table_for(active_host_isa());
}

}  // namespace host_kernels
}  // namespace zenflow::engine
