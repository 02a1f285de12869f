// Pinned host thread pool (generation counter + futex wake-ups) and first-touched,
// optionally huge-page-backed host buffers.
#include "worker/engine/host_thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "worker/engine/adamw_kernel.h"
#include "worker/engine/host_isa.h"

namespace zenflow::engine {
namespace {

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ volatile("yield");
#endif
}

// How long a worker polls for the next call, and the caller for completion, before
// sleeping on a futex. A futex wake-up of a sleeping thread took ~70 us on the dev VM
// (a halted vCPU must be woken) against ~1 us for a polling one, so workers, which own
// their reserved cores, poll long enough to catch the next call of a host step
// (host_optimizer splits a step into back-to-back calls). The caller polls briefly: it
// may share a core with a worker or with training threads.
constexpr std::chrono::microseconds kWorkerSpin{200};
constexpr std::chrono::microseconds kCallerSpin{20};

int64_t gcd64(int64_t a, int64_t b) {
  while (b != 0) {
    const int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

// The HostThreadPool currently running a chunk on this thread (nested calls deadlock).
thread_local const void* t_running_pool = nullptr;

}  // namespace

struct HostThreadPool::Impl {
  int threads = 1;
  std::vector<int> cores;
  std::vector<std::thread> workers;

  // The call being run: written by the caller before `generation` is bumped.
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t n = 0;
  int64_t granule = 1;

  alignas(64) std::atomic<uint32_t> generation{0};  // futex word: bumped once per call
  std::atomic<int> sleeping_workers{0};
  bool stopping = false;  // published by a generation bump

  alignas(64) std::atomic<int> pending{0};  // chunks not finished in this call
  std::atomic<uint32_t> done{0};            // futex word: 1 once pending hits 0
  std::atomic<int> caller_sleeping{0};

  alignas(64) std::atomic<bool> busy{false};  // a parallel_for is in progress
  std::atomic<bool> failed{false};
  std::exception_ptr error;  // first exception of this call

  // Start-up handshake: each worker reports whether pinning worked.
  std::mutex start_mu;
  std::condition_variable start_cv;
  int started = 0;
  std::string start_error;

  void chunk(int worker, int64_t* begin, int64_t* end) const {
    const int64_t granules = (n + granule - 1) / granule;
    const int64_t per = granules / threads;
    const int64_t extra = granules % threads;
    const int64_t first = worker * per + (worker < extra ? worker : extra);
    const int64_t count = per + (worker < extra ? 1 : 0);
    *begin = std::min(n, first * granule);
    *end = std::min(n, (first + count) * granule);
  }

  void worker_main(int index) {
    const std::string pin_error =
        cores.empty() ? std::string()
                      : pin_current_thread({cores[static_cast<size_t>(index) % cores.size()]});
    const std::string name = "zf-host-" + std::to_string(index);
    pthread_setname_np(pthread_self(), name.c_str());
    {
      std::lock_guard<std::mutex> lock(start_mu);
      if (!pin_error.empty() && start_error.empty())
        start_error = "HostThreadPool: cannot pin worker " + std::to_string(index) + " to " + pin_error;
      ++started;
    }
    start_cv.notify_all();

    uint32_t seen = 0;
    for (;;) {
      uint32_t g = generation.load(std::memory_order_acquire);
      if (g == seen) {
        const auto until = std::chrono::steady_clock::now() + kWorkerSpin;
        while ((g = generation.load(std::memory_order_acquire)) == seen &&
               std::chrono::steady_clock::now() < until) {
          for (int k = 0; k < 16; ++k) cpu_relax();
          // Lets another runnable thread on this core (an oversubscribed pool, or a
          // training thread where cores are shared) run instead of this poll.
          sched_yield();
        }
        while (g == seen) {
          sleeping_workers.fetch_add(1, std::memory_order_seq_cst);
          futex_wait(&generation, seen);
          sleeping_workers.fetch_sub(1, std::memory_order_seq_cst);
          g = generation.load(std::memory_order_acquire);
        }
      }
      seen = g;
      if (stopping) return;

      int64_t begin, end;
      chunk(index, &begin, &end);
      if (begin < end) {
        t_running_pool = this;
        try {
          (*fn)(begin, end);
        } catch (...) {
          if (!failed.exchange(true, std::memory_order_acq_rel)) error = std::current_exception();
        }
        t_running_pool = nullptr;
      }
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        done.store(1, std::memory_order_seq_cst);
        if (caller_sleeping.load(std::memory_order_seq_cst) != 0) futex_wake_all(&done);
      }
    }
  }

  void wake_workers() {
    generation.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping_workers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&generation);
  }

  void stop_and_join() {
    stopping = true;
    wake_workers();
    for (auto& t : workers) t.join();
    workers.clear();
  }
};

HostThreadPool::HostThreadPool(int threads, std::vector<int> cores) : impl_(new Impl) {
  if (threads < 1)
    throw std::invalid_argument("HostThreadPool: threads must be >= 1, got " + std::to_string(threads));
  // Resolve the kernel ISA here, on the constructing thread, so that a bad
  // ZENFLOW_HOST_ISA fails loudly before any work is queued.
  active_host_isa();
  impl_->threads = threads;
  impl_->cores = std::move(cores);
  impl_->workers.reserve(static_cast<size_t>(threads));
  try {
    for (int i = 0; i < threads; ++i) impl_->workers.emplace_back([this, i] { impl_->worker_main(i); });
  } catch (...) {
    impl_->stop_and_join();
    throw;
  }
  std::string error;
  {
    std::unique_lock<std::mutex> lock(impl_->start_mu);
    impl_->start_cv.wait(lock, [this, threads] { return impl_->started == threads; });
    error = impl_->start_error;
  }
  if (!error.empty()) {
    impl_->stop_and_join();
    throw std::runtime_error(error);
  }
}

HostThreadPool::~HostThreadPool() { impl_->stop_and_join(); }

int HostThreadPool::size() const { return impl_->threads; }

void HostThreadPool::parallel_for(int64_t n, int64_t align, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (t_running_pool == impl_.get())
    throw std::logic_error("HostThreadPool::parallel_for called from one of its own chunks");
  if (impl_->busy.exchange(true, std::memory_order_acquire))
    throw std::logic_error("HostThreadPool::parallel_for called concurrently from two threads");
  Impl& s = *impl_;
  // Chunk boundaries: multiples of `align` and of 16 elements (a 64-byte cache line of
  // fp32), so chunks of aligned fp32 arrays never share a cache line.
  const int64_t a = align < 1 ? 1 : align;
  s.granule = a / gcd64(a, 16) * 16;
  s.n = n;
  s.fn = &fn;
  s.failed.store(false, std::memory_order_relaxed);
  s.error = nullptr;
  s.done.store(0, std::memory_order_relaxed);
  s.pending.store(s.threads, std::memory_order_relaxed);
  s.wake_workers();

  // Completion is `done`, never `pending` alone: the last worker sets done after its
  // decrement, so returning on done guarantees no worker still touches this call's
  // state when the next call resets it.
  const auto until = std::chrono::steady_clock::now() + kCallerSpin;
  while (s.done.load(std::memory_order_acquire) == 0 && std::chrono::steady_clock::now() < until) {
    for (int k = 0; k < 16; ++k) cpu_relax();
    sched_yield();  // a worker may be waiting for this core
  }
  while (s.done.load(std::memory_order_seq_cst) == 0) {
    s.caller_sleeping.store(1, std::memory_order_seq_cst);
    if (s.done.load(std::memory_order_seq_cst) == 0) futex_wait(&s.done, 0);
    s.caller_sleeping.store(0, std::memory_order_seq_cst);
  }
  // done = 1 was stored (release) after the last decrement of `pending`, whose
  // acquire-release chain orders every worker's writes before it.
  std::exception_ptr error = s.failed.load(std::memory_order_acquire) ? s.error : nullptr;
  s.error = nullptr;
  s.fn = nullptr;
  s.busy.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

// Successive buffers start at different offsets within a page (0, 320, 640, ... bytes,
// all multiples of 64), so that the streams of one kernel (p, m, v, g ...) do not share
// their low 12 address bits: loads and stores that look alike modulo 4 KiB make the
// CPU's memory disambiguation stall ("4K aliasing").
std::atomic<unsigned> g_buffer_counter{0};
constexpr size_t kStaggerStep = 320;
constexpr unsigned kStaggerSlots = 12;
}  // namespace

HostBuffer::HostBuffer(int64_t elements, HostThreadPool* first_touch, bool huge_pages) : size_(elements) {
  if (elements < 0)
    throw std::invalid_argument("HostBuffer: negative element count " + std::to_string(elements));
  if (elements == 0) return;
  const size_t stagger = kStaggerStep * (g_buffer_counter.fetch_add(1) % kStaggerSlots);
  const size_t payload = static_cast<size_t>(elements) * sizeof(float) + stagger;
  const size_t alignment = huge_pages ? kHugePage : kPage;
  // Over-allocate by one alignment so the mapping can start on a 2 MiB boundary.
  bytes_ = (payload + alignment - 1) / alignment * alignment + (huge_pages ? kHugePage : 0);
  void* raw = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    throw std::runtime_error("HostBuffer: cannot map " + std::to_string(bytes_) + " bytes for " +
                             std::to_string(elements) + " floats: " + std::strerror(errno));
  map_ = raw;
  char* base = static_cast<char*>(raw);
  if (huge_pages) {
    const uintptr_t addr = reinterpret_cast<uintptr_t>(base);
    base = reinterpret_cast<char*>((addr + kHugePage - 1) / kHugePage * kHugePage);
    // Advisory: where transparent huge pages are disabled this fails harmlessly.
    madvise(base, bytes_ - static_cast<size_t>(base - static_cast<char*>(raw)), MADV_HUGEPAGE);
  } else {
    // Keep "off" meaning off even where THP is enabled system-wide (benchmarks compare).
    madvise(raw, bytes_, MADV_NOHUGEPAGE);
  }
  data_ = reinterpret_cast<float*>(base + stagger);

  // First touch: fault every page in from the pool thread that will process it, using
  // the kernels' own chunking (kHostChunkAlign), so the kernel places each page on the
  // NUMA node of the thread that streams it. A page belongs to the chunk holding its
  // first byte (the first page to chunk 0). The mapping is already zero-filled.
  char* const page_base = base;
  const size_t offset = stagger;
  auto touch = [page_base, offset](int64_t begin, int64_t end) {
    const size_t first_byte = offset + static_cast<size_t>(begin) * sizeof(float);
    const size_t end_byte = offset + static_cast<size_t>(end) * sizeof(float);
    size_t page = begin == 0 ? 0 : (first_byte + kPage - 1) / kPage;
    for (; page * kPage < end_byte; ++page) reinterpret_cast<volatile char*>(page_base)[page * kPage] = 0;
  };
  if (first_touch != nullptr) {
    first_touch->parallel_for(elements, kHostChunkAlign, touch);
  } else {
    touch(0, elements);
  }
}

HostBuffer::~HostBuffer() {
  if (map_ != nullptr) munmap(map_, bytes_);
}

HostBuffer::HostBuffer(HostBuffer&& o) noexcept
    : data_(o.data_), size_(o.size_), bytes_(o.bytes_), map_(o.map_) {
  o.data_ = nullptr;
  o.size_ = 0;
  o.bytes_ = 0;
  o.map_ = nullptr;
}

HostBuffer& HostBuffer::operator=(HostBuffer&& o) noexcept {
  if (this != &o) {
    if (map_ != nullptr) munmap(map_, bytes_);
    data_ = o.data_;
    size_ = o.size_;
    bytes_ = o.bytes_;
    map_ = o.map_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.bytes_ = 0;
    o.map_ = nullptr;
  }
  return *this;
}

std::string pin_current_thread(const std::vector<int>& cores) {
  if (cores.empty()) return "";
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int core : cores) {
    if (core < 0 || core >= CPU_SETSIZE) return "core " + std::to_string(core) + " is out of range";
    CPU_SET(core, &set);
  }
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc == 0) return "";
  std::string which = cores.size() == 1 ? "core " : "cores ";
  for (size_t i = 0; i < cores.size(); ++i) which += (i ? "," : "") + std::to_string(cores[i]);
  return which + ": " + std::strerror(rc);
}

ScopedCores::ScopedCores(const std::vector<int>& cores) {
  if (cores.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (const int rc = pthread_getaffinity_np(pthread_self(), sizeof(set), &set); rc != 0) {
    error_ = std::string("reading this thread's cores: ") + std::strerror(rc);
    return;
  }
  std::vector<int> had;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) had.push_back(c);
  error_ = pin_current_thread(cores);
  if (error_.empty()) saved_ = std::move(had);
}

ScopedCores::~ScopedCores() { pin_current_thread(saved_); }

std::vector<int> available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

}  // namespace zenflow::engine
