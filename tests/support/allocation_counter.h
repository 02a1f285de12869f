// Counts heap allocations in a test binary, so a test can assert that a stretch of code allocates nothing.
//
// Replaces the global operator new/delete: include it in exactly one file of a test binary.
// Usage: g_allocations = 0; g_count_allocations = true; ...; g_count_allocations = false;
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace zenflow::test_support {
inline std::atomic<bool> g_count_allocations{false};
inline std::atomic<long> g_allocations{0};
}  // namespace zenflow::test_support

// GCC 12 pairs the inlined new/delete of the standard containers with these definitions and
// reports malloc/free as mismatched (a false positive: both sides are replaced here).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  if (zenflow::test_support::g_count_allocations.load(std::memory_order_relaxed))
    zenflow::test_support::g_allocations.fetch_add(1, std::memory_order_relaxed);
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void* operator new[](std::size_t size) { return operator new(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
