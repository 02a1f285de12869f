#!/usr/bin/env bash
# Installs zenflow's build, test and run dependencies from Debian 12 packages.
# Idempotent: packages already present are skipped by apt. Run as root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-openmp libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  libcivetweb-dev libsqlite3-dev
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-torch
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "install-deps: all ${#packages[@]} packages present"
fi

# LibTorch links the reference BLAS through the libblas.so.3 alternative unless
# OpenBLAS is selected; matmuls are 7-20x slower without it.
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
  target=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas | head -n1 || true)
  [ -n "$target" ] && update-alternatives --set "$alt" "$target" >/dev/null
done
