// HostThreadPool (chunking, pinning, determinism, no per-call allocation, errors) and
// HostBuffer (alignment, zero fill, 4 KiB staggering).
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "worker/engine/accumulate_kernel.h"
#include "worker/engine/adamw_kernel.h"
#include "worker/engine/host_isa.h"
#include "worker/engine/host_thread_pool.h"

// Counts every global operator new in this process, to prove that pooled kernel calls
// allocate nothing.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace

// (GCC cannot tell that these free() calls pair with the malloc() in operator new.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace zenflow::engine {
namespace {

struct Range {
  int64_t begin, end;
  int cpu;
};

// Records the chunks of one parallel_for call.
std::vector<Range> chunks_of(HostThreadPool& pool, int64_t n, int64_t align) {
  std::vector<Range> ranges(static_cast<size_t>(pool.size()));
  std::atomic<int> count{0};
  pool.parallel_for(n, align, [&](int64_t b, int64_t e) {
    ranges[static_cast<size_t>(count.fetch_add(1))] = {b, e, sched_getcpu()};
  });
  ranges.resize(static_cast<size_t>(count.load()));
  std::sort(ranges.begin(), ranges.end(), [](const Range& x, const Range& y) { return x.begin < y.begin; });
  return ranges;
}

TEST(HostThreadPool, ChunksCoverTheRangeOnceOnAlignedBoundaries) {
  for (int threads : {1, 2, 3, 5}) {
    HostThreadPool pool(threads, {});
    for (int64_t n : {int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{100}, int64_t{1000003}}) {
      for (int64_t align : {int64_t{1}, int64_t{32}, int64_t{24}}) {
        const int64_t granule = align == 24 ? 48 : align == 32 ? 32 : 16;  // lcm(align, 16)
        const std::vector<Range> r = chunks_of(pool, n, align);
        ASSERT_FALSE(r.empty());
        EXPECT_LE(static_cast<int>(r.size()), threads);
        EXPECT_EQ(r.front().begin, 0);
        EXPECT_EQ(r.back().end, n);
        for (size_t i = 0; i < r.size(); ++i) {
          EXPECT_LT(r[i].begin, r[i].end);
          EXPECT_EQ(r[i].begin % granule, 0) << "threads=" << threads << " n=" << n;
          if (i > 0) {
            EXPECT_EQ(r[i].begin, r[i - 1].end);
          }
        }
        // Balanced: no chunk more than one granule larger than another.
        if (n >= granule * threads) {
          EXPECT_EQ(static_cast<int>(r.size()), threads);
          int64_t lo = n, hi = 0;
          for (size_t i = 0; i + 1 < r.size(); ++i) {
            lo = std::min(lo, r[i].end - r[i].begin);
            hi = std::max(hi, r[i].end - r[i].begin);
          }
          EXPECT_LE(hi - lo, granule);
        }
      }
    }
  }
}

TEST(HostThreadPool, WorkerRunsOnItsPinnedCore) {
  const std::vector<int> cores = available_cores();
  ASSERT_FALSE(cores.empty());
  const int threads = static_cast<int>(std::min<size_t>(cores.size(), 2));
  // Worker i is pinned to cores[i]; reverse the list so the pinning is visibly ours.
  std::vector<int> pinned(cores.rbegin(), cores.rbegin() + threads);
  HostThreadPool pool(threads, pinned);
  for (int rep = 0; rep < 20; ++rep) {
    const std::vector<Range> r = chunks_of(pool, 1 << 12, 16);
    ASSERT_EQ(static_cast<int>(r.size()), threads);
    for (int i = 0; i < threads; ++i)
      EXPECT_EQ(r[static_cast<size_t>(i)].cpu, pinned[static_cast<size_t>(i)]);
  }
}

TEST(HostThreadPool, RejectsBadArguments) {
  EXPECT_THROW(HostThreadPool(0, {}), std::invalid_argument);
  try {
    HostThreadPool pool(1, {CPU_SETSIZE + 5});
    ADD_FAILURE() << "pinning to a nonexistent core succeeded";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(CPU_SETSIZE + 5)), std::string::npos) << e.what();
  }
}

TEST(HostThreadPool, RethrowsAChunkExceptionAndStaysUsable) {
  HostThreadPool pool(3, {});
  EXPECT_THROW(pool.parallel_for(3000, 16,
                                 [](int64_t b, int64_t) {
                                   if (b > 0) throw std::runtime_error("chunk failed");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(3000, 16, [&](int64_t b, int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 3000);
}

TEST(HostThreadPool, NestedCallIsRefused) {
  HostThreadPool pool(2, {});
  std::atomic<int> refused{0};
  pool.parallel_for(100, 16, [&](int64_t, int64_t) {
    try {
      pool.parallel_for(10, 1, [](int64_t, int64_t) {});
    } catch (const std::logic_error&) {
      ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 2);
}

// Back-to-back calls (workers still spinning) and calls after idle gaps (workers asleep
// on the futex) must all complete with every element visited exactly once.
TEST(HostThreadPool, ManyCallsWithAndWithoutIdleGapsComplete) {
  HostThreadPool pool(3, {});
  std::vector<int> hits(1000, 0);
  const int calls = 5000;
  for (int call = 0; call < calls; ++call) {
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
    if (call % 250 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  for (int h : hits) ASSERT_EQ(h, calls);
}

struct State {
  std::vector<float> p, m, v, acc, g;
  std::vector<uint16_t> g16, half;
};

State make_state(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  State s;
  const size_t len = static_cast<size_t>(n) + 8;
  s.p.resize(len);
  s.m.resize(len);
  s.v.resize(len);
  s.acc.resize(len);
  s.g.resize(len);
  s.g16.resize(len);
  s.half.resize(len);
  for (size_t i = 0; i < len; ++i) {
    s.p[i] = normal(rng);
    s.m[i] = 0.1f * normal(rng);
    s.v[i] = 0.01f * std::abs(normal(rng));
    s.acc[i] = normal(rng);
    s.g[i] = normal(rng);
    s.g16[i] = float_to_bf16(normal(rng));
  }
  return s;
}

// One window's worth of host work on `s` at element offset 3 (unaligned), either
// single-threaded (pool == nullptr) or through the pool.
void run_window(State& s, int64_t n, HostThreadPool* pool) {
  const int64_t o = 3;
  AdamWParams params;
  params.weight_decay = 0.05;
  const AdamWCoeffs c = AdamWCoeffs::make(params, 4);
  AdamWSpan span{s.p.data() + o,
                 s.m.data() + o,
                 s.v.data() + o,
                 GradRef::f32(s.g.data() + o),
                 s.half.data() + o,
                 HalfKind::kBF16,
                 n};
  AdamWSpan span16 = span;
  span16.grad = GradRef::bf16(s.g16.data() + o);
  if (pool != nullptr) {
    accumulate(*pool, s.acc.data() + o, GradRef::bf16(s.g16.data() + o), n, 0.5f, false);
    adamw_window_end(*pool, span16, s.acc.data() + o, c, 0.25f);
    adamw_step(*pool, span, c, 1.0f);
    accumulate(*pool, s.acc.data() + o, GradRef::f32(s.g.data() + o), n, 2.0f, true);
  } else {
    accumulate(s.acc.data() + o, GradRef::bf16(s.g16.data() + o), n, 0.5f, false);
    adamw_window_end(span16, s.acc.data() + o, c, 0.25f);
    adamw_step(span, c, 1.0f);
    accumulate(s.acc.data() + o, GradRef::f32(s.g.data() + o), n, 2.0f, true);
  }
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(HostThreadPool, PooledKernelsAreBitwiseIdenticalToSingleThreadedCalls) {
  for (HostIsa isa : {HostIsa::kScalar, best_host_isa()}) {
    const HostIsa saved = active_host_isa();
    set_host_isa(isa);
    for (int threads : {1, 2, 3}) {
      HostThreadPool pool(threads, {});
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{15}, int64_t{16}, int64_t{17}, int64_t{31},
                        int64_t{33}, int64_t{4101}, int64_t{1000003}}) {
        State single = make_state(n, static_cast<uint32_t>(n));
        State pooled = single;
        run_window(single, n, nullptr);
        run_window(pooled, n, &pool);
        EXPECT_TRUE(bitwise_equal(single.p, pooled.p))
            << host_isa_name(isa) << " threads=" << threads << " n=" << n;
        EXPECT_TRUE(bitwise_equal(single.m, pooled.m))
            << host_isa_name(isa) << " threads=" << threads << " n=" << n;
        EXPECT_TRUE(bitwise_equal(single.v, pooled.v))
            << host_isa_name(isa) << " threads=" << threads << " n=" << n;
        EXPECT_TRUE(bitwise_equal(single.acc, pooled.acc))
            << host_isa_name(isa) << " threads=" << threads << " n=" << n;
        EXPECT_TRUE(single.half == pooled.half) << host_isa_name(isa) << " threads=" << threads << " n=" << n;
      }
    }
    set_host_isa(saved);
  }
}

TEST(HostThreadPool, PooledKernelCallsAllocateNothing) {
  HostThreadPool pool(2, {});
  const int64_t n = 4096 + 7;
  State s = make_state(n, 1);
  const AdamWCoeffs c = AdamWCoeffs::make(AdamWParams{}, 1);
  AdamWSpan span{s.p.data(),    s.m.data(),      s.v.data(), GradRef::f32(s.g.data()),
                 s.half.data(), HalfKind::kBF16, n};
  adamw_step(pool, span, c, 1.0f);  // warm-up (ISA resolution, lazy statics)
  const long before = g_allocations.load();
  for (int i = 0; i < 1000; ++i) {
    adamw_step(pool, span, c, 1.0f);
    adamw_window_end(pool, span, s.acc.data(), c, 0.5f);
    accumulate(pool, s.acc.data(), GradRef::bf16(s.g16.data()), n, 1.0f, i % 2 == 0);
  }
  EXPECT_EQ(g_allocations.load() - before, 0);
}

TEST(HostBuffer, IsZeroedAlignedAndStaggeredAcrossPages) {
  HostThreadPool pool(2, {});
  std::vector<HostBuffer> buffers;
  for (int i = 0; i < 4; ++i) buffers.emplace_back(100000 + i, &pool, i % 2 == 0);
  std::vector<uintptr_t> page_offsets;
  for (int i = 0; i < 4; ++i) {
    const HostBuffer& b = buffers[static_cast<size_t>(i)];
    ASSERT_NE(b.data(), nullptr);
    EXPECT_EQ(b.size(), 100000 + i);
    const uintptr_t addr = reinterpret_cast<uintptr_t>(b.data());
    EXPECT_EQ(addr % 64, 0u);
    page_offsets.push_back(addr % 4096);
    for (int64_t k = 0; k < b.size(); ++k) ASSERT_EQ(b.data()[k], 0.0f);
    b.data()[b.size() - 1] = 1.0f;  // the whole range is writable
  }
  std::sort(page_offsets.begin(), page_offsets.end());
  EXPECT_EQ(std::unique(page_offsets.begin(), page_offsets.end()), page_offsets.end())
      << "buffers share their offset within a 4 KiB page";

  HostBuffer moved = std::move(buffers[0]);
  EXPECT_EQ(moved.size(), 100000);
  EXPECT_EQ(buffers[0].data(), nullptr);
  HostBuffer empty(0, nullptr, false);
  EXPECT_EQ(empty.data(), nullptr);
  EXPECT_THROW(HostBuffer(-1, nullptr, false), std::invalid_argument);
}

}  // namespace
}  // namespace zenflow::engine
