#!/usr/bin/env bash
# Installs zenflow's build, test and run dependencies from Debian 12 packages.
# Idempotent: packages already present are skipped by apt. Run as root.
# --test-tools also installs what only the test suite needs (scripts/test.sh passes it).
set -euo pipefail

test_tools=0
for arg in "$@"; do
  case "$arg" in
    --test-tools) test_tools=1 ;;
    *) echo "install-deps: unknown argument: $arg (known: --test-tools)" >&2; exit 2 ;;
  esac
done

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
# Test tools: real servers the tests start on free ports (prometheus, promtool).
test_packages=(prometheus)
((test_tools)) && packages+=("${test_packages[@]}")

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Packages that ship a service (prometheus) must not start it: the tests start their own
  # on free ports, and a system one would hold 9090. Where no policy says so already, deny
  # service starts for the duration of the install.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
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

# Under systemd, make sure the packaged Prometheus service neither runs nor starts at boot.
if ((test_tools)) && [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
