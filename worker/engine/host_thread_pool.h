// Persistent worker threads pinned to the host optimizer's reserved cores.
//
// The pool never uses OpenMP (LibTorch resets OpenMP to one thread, and OMP_PROC_BIND
// moves pinned threads; see docs/benchmarks.md §1). parallel_for splits
// [0, n) into size() static contiguous chunks whose boundaries are multiples of `align`
// elements, so results do not depend on timing, and makes no allocation or lock per
// call beyond one wake-up and one completion wait (a generation counter and a futex).
//
// Thread safety: parallel_for may be called from one thread at a time (the host
// optimizer's driver thread); it blocks until every chunk has run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace zenflow::engine {

class HostThreadPool {
 public:
  // Starts `threads` (>= 1) workers. Worker i is pinned to cores[i % cores.size()];
  // an empty `cores` leaves them unpinned. Throws std::invalid_argument for threads < 1
  // and std::runtime_error naming the core when a worker cannot be pinned. Also resolves
  // the host kernel ISA (host_isa.h), so a bad ZENFLOW_HOST_ISA fails here. Idle
  // workers poll (yielding) for ~200 us after a call, then sleep on a futex, so the
  // back-to-back calls of one host step cost ~1-3 us each and a call after an idle gap
  // a futex wake-up (~60-80 us measured on the dev VM). The destructor joins.
  HostThreadPool(int threads, std::vector<int> cores);
  ~HostThreadPool();
  HostThreadPool(const HostThreadPool&) = delete;
  HostThreadPool& operator=(const HostThreadPool&) = delete;

  int size() const;

  // Runs fn(begin, end) on every non-empty chunk of [0, n), chunk i on worker i, and
  // returns when all have finished. Chunk boundaries are multiples of lcm(align, 16)
  // elements (so 4-byte elements of a 64-byte aligned array split on cache lines), and
  // depend only on n, align and size(); chunks differ in size by at most one such
  // granule. The caller polls ~20 us, then sleeps on a futex while the workers run. If fn
  // throws, the first exception is rethrown here after every chunk has finished.
  // Throws std::logic_error if called concurrently or from inside one of its chunks.
  // Keep fn's captures small (one pointer) so std::function does not allocate.
  void parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A large fp32 host buffer: 64-byte aligned, optionally backed by transparent huge
// pages, zero-filled by first touch from the pool's own threads (NUMA-local to them).
// Allocated once; never reallocated on the hot path.
//
// Memory comes straight from mmap. huge_pages=true asks for transparent huge pages
// (madvise(MADV_HUGEPAGE) on a 2 MiB aligned range); false forbids them
// (MADV_NOHUGEPAGE) even where THP is on system-wide. Successive buffers start at
// different cache-line offsets within a page, so the arrays of one kernel call never
// alias modulo 4 KiB. first_touch == nullptr touches the pages on the calling thread;
// otherwise the touch is a parallel_for on that pool (so not while it runs another).
// Throws std::invalid_argument for a negative size and std::runtime_error (with the
// size and errno text) when the mapping fails.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(int64_t elements, HostThreadPool* first_touch, bool huge_pages);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
  size_t bytes_ = 0;     // length of the mapping
  void* map_ = nullptr;  // start of the mapping
};

// Cores available to this process (sched_getaffinity), ascending.
std::vector<int> available_cores();

// Pins the calling thread to `cores` (it may run on any of them); an empty `cores` leaves
// it as it is. Returns "" or why it could not ("core 9 is out of range", the OS's error).
// Threads it starts afterwards inherit the pinning.
std::string pin_current_thread(const std::vector<int>& cores);

// Pins the calling thread to `cores` for this object's lifetime, then back to the cores it
// had. Threads started meanwhile keep `cores` (a thread inherits its creator's): the way
// to put every thread of a component, a library's own included, on given cores. Empty
// `cores` changes nothing; error() says why pinning failed ("" when it did not).
class ScopedCores {
 public:
  explicit ScopedCores(const std::vector<int>& cores);
  ~ScopedCores();
  ScopedCores(const ScopedCores&) = delete;
  ScopedCores& operator=(const ScopedCores&) = delete;
  const std::string& error() const { return error_; }

 private:
  std::vector<int> saved_;  // empty: nothing to restore
  std::string error_;
};

}  // namespace zenflow::engine
