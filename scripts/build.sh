#!/usr/bin/env bash
# Configures and builds zenflow into ./build (Release, Ninja). Extra args go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release "$@"
cmake --build build
