#!/usr/bin/env bash
# libFuzzer over the optimizer-node protocol's parsers (tests/fuzz/): builds each target
# with clang (-fsanitize=fuzzer,address,undefined) into build-fuzz/ and runs it for a
# bounded, seeded number of inputs, starting from valid messages of every kind (the
# target writes them, ZENFLOW_FUZZ_SEEDS). Exits non-zero on a
# crash, a sanitizer report or a broken property; the crashing input is kept in
# build-fuzz/. Usage: scripts/fuzz.sh [RUNS] (default 1000000 per target).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$cxx" ]; then
  echo "fuzz.sh: clang++ not found (scripts/install-deps.sh --test-tools installs it)" >&2
  exit 1
fi
out=build-fuzz
mkdir -p "$out"
flags=(-std=gnu++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)
"$cxx" "${flags[@]}" tests/fuzz/fuzz_optimizer_protocol.cpp worker/transport/wire.cpp \
  worker/transport/optimizer_protocol.cpp -o "$out/fuzz_optimizer_protocol"
rm -rf "$out/corpus" && mkdir -p "$out/corpus"
echo "== libFuzzer: optimizer-node protocol parsers, $runs inputs"
# The target writes its seeds (valid messages of every kind) into the corpus at start-up.
rc=0
(cd "$out" && ZENFLOW_FUZZ_SEEDS=corpus ./fuzz_optimizer_protocol -runs="$runs" -seed=1 -max_len=512 \
  -print_final_stats=1 corpus > fuzz_optimizer_protocol.log 2>&1) || rc=$?
grep -E "^#[0-9]+ +DONE|^stat::number_of_executed_units|^stat::peak_rss_mb|ERROR|SUMMARY|fuzz_optimizer_protocol:" \
  "$out/fuzz_optimizer_protocol.log" || true
if [ "$rc" != 0 ]; then
  echo "fuzz.sh: the fuzzer failed (exit $rc); see $out/fuzz_optimizer_protocol.log and the crash-* input in $out/"
  exit 1
fi
