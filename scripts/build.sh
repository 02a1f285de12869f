#!/usr/bin/env bash
# Configures and builds zenflow into ./build (Release, Ninja). Extra args go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
# ccache: paths relative to the checkout, so fresh clones (CI) hit the same cache.
export CCACHE_BASEDIR="$PWD"
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build
