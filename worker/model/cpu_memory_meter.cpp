// A counting CPU allocator (see cpu_memory_meter.h). Each block carries its size in a
// 64-byte header in front of the data, so the data keeps c10's 64-byte alignment and the
// deleter needs nothing but the data pointer (the raw allocate/deallocate interface works).
#include "worker/model/cpu_memory_meter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <mutex>

namespace zenflow::model {
namespace {

constexpr size_t kHeader = 64;  // c10's CPU alignment: data after it stays 64-byte aligned

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};

void raise_peak(int64_t live) {
  int64_t peak = g_peak.load(std::memory_order_relaxed);
  while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

void metered_delete(void* data) {
  if (data == nullptr) return;
  char* block = static_cast<char*>(data) - kHeader;
  const auto bytes = *reinterpret_cast<const int64_t*>(block);
  g_live.fetch_sub(bytes, std::memory_order_relaxed);
  c10::free_cpu(block);
}

struct MeteredCpuAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) const override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, &metered_delete, cpu};
    char* block = static_cast<char*>(c10::alloc_cpu(n + kHeader));  // throws on failure, as c10's
    *reinterpret_cast<int64_t*>(block) = static_cast<int64_t>(n);
    raise_peak(g_live.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n));
    void* data = block + kHeader;
    return {data, data, &metered_delete, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &metered_delete; }
};

}  // namespace

void CpuMemoryMeter::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    static MeteredCpuAllocator allocator;  // lives as long as the tensors it allocated
    // Priority above c10's own registration (0), which stays in place for blocks it made.
    c10::SetCPUAllocator(&allocator, /*priority=*/1);
    g_installed = true;
  });
}

bool CpuMemoryMeter::installed() { return g_installed.load(); }

int64_t CpuMemoryMeter::live_bytes() { return g_live.load(std::memory_order_relaxed); }

int64_t CpuMemoryMeter::peak_bytes() { return g_peak.load(std::memory_order_relaxed); }

int64_t CpuMemoryMeter::reset_peak() {
  const int64_t live = g_live.load(std::memory_order_relaxed);
  g_peak.store(live, std::memory_order_relaxed);
  return live;
}

}  // namespace zenflow::model
