#!/usr/bin/env bash
# libFuzzer over what zenflow reads from the network (tests/fuzz/): the optimizer-node
# protocol's parsers, the connection handshake a node's listening socket speaks to anyone,
# and the job spec reader (what SubmitJob parses). Builds each target
# with clang (-fsanitize=fuzzer,address,undefined) into build-fuzz/ and runs it for a
# bounded, seeded number of inputs, starting from valid inputs of every kind (the target
# writes them, ZENFLOW_FUZZ_SEEDS). Exits non-zero on a crash, a sanitizer report or a
# broken property; the crashing input is kept in build-fuzz/. Usage: scripts/fuzz.sh
# [RUNS] [SPEC_RUNS] [HANDSHAKE_RUNS] (default 1000000 protocol inputs; 300000 specs, about
# 25 s; 300000 handshakes).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
spec_runs=${2:-300000}
handshake_runs=${3:-300000}
cxx=$(command -v clang++ || command -v clang++-14 || true)
if [ -z "$cxx" ]; then
  echo "fuzz.sh: clang++ not found (scripts/install-deps.sh --test-tools installs it)" >&2
  exit 1
fi
out=build-fuzz
mkdir -p "$out"
flags=(-std=gnu++17 -O1 -g -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I.)

# fuzz NAME WHAT RUNS MAX_LEN: runs build-fuzz/NAME from the seeds it writes; 1 on failure.
fuzz() {
  local name=$1 what=$2 n=$3 max_len=$4 rc=0
  rm -rf "$out/corpus-$name" && mkdir -p "$out/corpus-$name"
  echo "== libFuzzer: $what, $n inputs"
  (cd "$out" && ZENFLOW_FUZZ_SEEDS="corpus-$name" "./$name" -runs="$n" -seed=1 -max_len="$max_len" \
    -print_final_stats=1 "corpus-$name" > "$name.log" 2>&1) || rc=$?
  grep -E "^#[0-9]+ +DONE|^stat::number_of_executed_units|^stat::peak_rss_mb|ERROR|SUMMARY|$name:" \
    "$out/$name.log" || true
  if [ "$rc" != 0 ]; then
    echo "fuzz.sh: the fuzzer failed (exit $rc); see $out/$name.log and the crash-* input in $out/"
    return 1
  fi
}

"$cxx" "${flags[@]}" tests/fuzz/fuzz_optimizer_protocol.cpp worker/transport/wire.cpp \
  worker/transport/optimizer_protocol.cpp -o "$out/fuzz_optimizer_protocol"
"$cxx" "${flags[@]}" tests/fuzz/fuzz_node_handshake.cpp worker/transport/handshake.cpp -lcrypto \
  -o "$out/fuzz_node_handshake"
"$cxx" "${flags[@]}" tests/fuzz/fuzz_job_spec.cpp common/job_spec.cpp common/yaml_tree.cpp \
  common/input_file.cpp $(pkg-config --cflags --libs yaml-0.1) -o "$out/fuzz_job_spec"
status=0
fuzz fuzz_optimizer_protocol "optimizer-node protocol parsers" "$runs" 512 || status=1
fuzz fuzz_node_handshake "connection handshake (a node's and a client's side, and the two together)" \
  "$handshake_runs" 8192 || status=1
fuzz fuzz_job_spec "job spec reader (yaml::parse, validation, to_yaml round trip)" "$spec_runs" 4096 || status=1
exit $status
