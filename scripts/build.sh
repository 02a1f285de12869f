#!/usr/bin/env bash
# Configures and builds zenflow into ./build (Release, Ninja, ccache).
# Usage: scripts/build.sh [--target T]... [CMAKE_ARGS...]
#   --target T   build only T and what it needs (repeatable; e.g. --target zenflow for the
#                README's run command, which then skips every test binary); default: all.
#   CMAKE_ARGS   passed to the configure step (e.g. -DZENFLOW_UCX=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
targets=()
cmake_args=()
while (($#)); do
  case "$1" in
    --target)
      [ $# -ge 2 ] || { echo "build.sh: --target needs a target name" >&2; exit 2; }
      targets+=("$2")
      shift 2
      ;;
    *)
      cmake_args+=("$1")
      shift
      ;;
  esac
done
# ccache: paths relative to the checkout, so fresh clones (CI) hit the same cache.
export CCACHE_BASEDIR="$PWD"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release ${cmake_args[@]+"${cmake_args[@]}"}
if ((${#targets[@]})); then
  cmake --build build --target "${targets[@]}"
else
  cmake --build build
fi
