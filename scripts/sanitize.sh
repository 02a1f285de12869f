#!/usr/bin/env bash
# ASan + UBSan over everything that links no LibTorch: builds ./build-asan with
# ZENFLOW_SANITIZE=address,undefined (store, scheduler, coordinator, rpc/auth, heartbeat
# stream, zenflow-worker, the UCX transport, zenflow-optimizer) and runs their tests with
# CTest, the multi-process service tests included: the coordinators, agents and optimizer
# nodes they start are this build's; `zenflow` (CLI, `zenflow up`, the ranks) is a copy of
# ./build's (ZENFLOW_TRAINER_BINARY; scripts/build.sh first). Every sanitizer report, from
# any process, is written to build-asan/sanitizer-logs/ and fails the run, printed last.
# Extra args go to CTest (e.g. -R Coordinator). Exits non-zero on a failed test or any
# sanitizer report. ZENFLOW_TRAINER_BINARY: another normal build's zenflow.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build-asan
rm -f "$build/sanitize-summary.log"
# The normal build's zenflow, which the tests run (its ranks need LibTorch).
trainer=${ZENFLOW_TRAINER_BINARY:-$PWD/build/bin/zenflow}
# ccache: paths relative to the checkout, so fresh clones (CI) hit the same cache; with -g,
# ccache would also hash the build directory (CCACHE_NOHASHDIR: not).
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
# -O1 -g: faster to compile than -O2, and stacks that match the source.
cmake -G Ninja -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
  -DZENFLOW_SANITIZE=address,undefined -DZENFLOW_TRAINER_BINARY="$trainer"
cmake --build "$build"

logs="$PWD/$build/sanitizer-logs"
rm -rf "$logs" && mkdir -p "$logs"
# Reports go to files (NAME.PID), not stderr: a coordinator's or agent's would otherwise be
# lost with its test's temporary directory. Leaks are checked: a leak that only gRPC, protobuf
# or UCX frames hold goes to tests/sanitizers/lsan.supp (none needed so far), never ours.
export ASAN_OPTIONS="log_path=$logs/asan:detect_leaks=1:check_initialization_order=1:strict_init_order=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/sanitizers/ubsan.supp"

status=0
failures="$build/sanitize-failures.log"
: > "$failures"
# run_ctest ARGS: one CTest pass; each failed test's last lines are kept for the summary.
run_ctest() {
  ctest --test-dir "$build" --output-on-failure --timeout 900 "$@" && return 0
  status=1
  [ -f "$build/Testing/Temporary/LastTestsFailed.log" ] || return 0
  while IFS=: read -r number name; do
    echo "---- $number: $name"
    awk -v n="$number" '/^[0-9]+\/[0-9]+ Testing: /{keep = ($0 ~ "^" n "/")} keep' \
      "$build/Testing/Temporary/LastTest.log" | tail -n 60
  done < "$build/Testing/Temporary/LastTestsFailed.log" >> "$failures"
}
# Not AdvisorLocal.PredictsOtherConfigurationsOfThisMachine: it times ./build's training runs
# (minutes, alone), nothing of which is instrumented; ./build's suite runs it. The control-plane
# bench drives an instrumented coordinator (2-3x slower) at a fixed schedule: alone, after
# the rest. A failed test runs once more (until-pass:2); a sanitizer report still fails the
# run, its file stays in $logs.
if [ $# -gt 0 ]; then
  run_ctest -j2 --repeat until-pass:2 "$@"
else
  run_ctest -j2 --repeat until-pass:2 -E '^(AdvisorLocal\.|Service\.ControlPlaneBench)'
  run_ctest --repeat until-pass:2 -R '^Service\.ControlPlaneBench'
fi

# The failures, last (CI keeps only the end of a long log): each failed test's last lines,
# then every distinct sanitizer report (the same stack from several processes: once).
summary="$build/sanitize-summary.log"
{
  if [ -s "$failures" ]; then
    echo "== sanitize.sh: the tests that failed under ASan/UBSan, again: the last 60 lines of each one's output"
    cat "$failures"
  fi
  reports=$(find "$logs" -type f | sort)
  if [ -n "$reports" ]; then
    echo "== sanitize.sh: $(echo "$reports" | wc -l) sanitizer report(s) (build-asan/sanitizer-logs/)"
    declare -A seen=()
    for f in $reports; do
      key=$({ grep -E '^ +#[0-9]+ ' "$f" || cat "$f"; } | sed -E 's/0x[0-9a-f]+|==[0-9]+==//g' | md5sum | cut -c1-32)
      if [ -n "${seen[$key]:-}" ]; then
        seen[$key]+=" $(basename "$f")"
        continue
      fi
      seen[$key]=" "
      echo "---- $(basename "$f") ($(sed -n 's/^SUMMARY: //p' "$f" | head -n 1))"
      head -n 120 "$f"
    done
    for key in "${!seen[@]}"; do
      if [ "${seen[$key]}" != " " ]; then echo "(the same report again from:${seen[$key]# })"; fi
    done
  fi
} > "$summary"
if [ -s "$summary" ]; then
  status=1
  cat "$summary"
fi
exit $status
