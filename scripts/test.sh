#!/usr/bin/env bash
# Runs every test: the CTest suite of ./build, libFuzzer, the LibTorch-free targets and their
# tests under ASan + UBSan (scripts/sanitize.sh, ./build-asan), then (when nvcc is present) a
# build check of the CUDA kernels into ./build-cuda. Exits non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
# Test-only tools (prometheus/promtool for the deploy/prometheus tests); a no-op when present.
# If they cannot be installed the suite still runs (their tests report Skipped) but fails.
bash scripts/install-deps.sh --test-tools || { echo "test.sh: installing the test tools failed"; status=1; }
ctest_status=0
ctest --test-dir build --output-on-failure --timeout 900 -j2 || { status=1; ctest_status=1; }
# libFuzzer over the optimizer-node protocol's parsers (bounded and seeded: ~30 s).
bash scripts/fuzz.sh || status=1
# ASan + UBSan: the coordinator, agent, optimizer node and transport, and their tests.
echo "== sanitizers (scripts/sanitize.sh)"
sanitize_status=0
bash scripts/sanitize.sh || { status=1; sanitize_status=1; }
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  echo "== CUDA build check (nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))"
  if [ -f worker/engine/cuda/CMakeLists.txt ]; then
    # CPU LibTorch: the CUDA kernels and their standalone test compile and link (they
    # skip without a GPU); the engine's use of them is exercised by scripts/gpu-check.sh.
    (cmake -G Ninja -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DZENFLOW_CUDA=ON \
      && cmake --build build-cuda --target zenflow_cuda_kernels test_cuda_kernels_raw \
      && ./build-cuda/bin/test_cuda_kernels_raw) || status=1
  fi
  # The engine's CUDA host code (the ZENFLOW_WITH_CUDA_OPS branches: streams, events,
  # kernel dispatch) compiles only against a CUDA LibTorch, which GPU hosts have. Debian's
  # LibTorch ships the c10/cuda headers without their generated macros header: with a
  # stand-in for it, a syntax check catches errors here, before a GPU session.
  echo "== CUDA host-code syntax check"
  shim=build-cuda/shim/c10/cuda/impl
  mkdir -p "$shim"
  printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' > "$shim/cuda_cmake_macros.h"
  # (worker/rank/trainer.cpp too: its CUDA-only steps — pinned batches, autocast — have no guard.)
  for f in $( (grep -l ZENFLOW_WITH_CUDA_OPS worker/engine/*.cpp tests/*.cpp worker/rank/*.cpp; echo worker/rank/trainer.cpp) | sort -u); do
    g++ -fsyntax-only -std=gnu++17 -Wall -Wextra -Werror -Wno-unused-parameter -Wno-deprecated-declarations \
      -DZENFLOW_WITH_CUDA_OPS -DZENFLOW_SOURCE_DIR='""' -DZENFLOW_BINARY_DIR='""' \
      -I. -Ibuild-cuda/shim -I/usr/local/cuda/include -isystem /usr/include/torch/csrc/api/include "$f" \
      || { echo "CUDA host-code syntax check failed: $f"; status=1; }
  done
fi
# A failed test's output is printed where it ended, in the middle of a long log, which CI
# keeps only the end of: print the last lines of each failed test's output again, last.
if [ "$ctest_status" != 0 ] && [ -f build/Testing/Temporary/LastTestsFailed.log ]; then
  echo "== the tests that failed, again: the last 80 lines of each one's output"
  while IFS=: read -r number name; do
    echo "---- $number: $name"
    awk -v n="$number" '/^[0-9]+\/[0-9]+ Testing: /{keep = ($0 ~ "^" n "/")} keep' \
      build/Testing/Temporary/LastTest.log | tail -n 80
  done < build/Testing/Temporary/LastTestsFailed.log
fi
# Then the sanitizer run's failed tests and reports (scripts/sanitize.sh printed them too).
if [ "$sanitize_status" != 0 ] && [ -s build-asan/sanitize-summary.log ]; then
  cat build-asan/sanitize-summary.log
fi
exit $status
