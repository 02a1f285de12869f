#!/usr/bin/env bash
# Downloads, here, the Debian packages that the engine-only build needs and a GPU host lacks.
#
# GPU hosts have CUDA, CMake, ninja and a PyTorch wheel (whose LibTorch we build against)
# but no Debian dev packages and no network. scripts/gpu-check.sh extracts these .deb
# files into a local prefix there. Output: ./.debs/*.deb (ignored by git; carry `.debs`
# with the device tool). Run from the repository root; needs apt-get and the Debian
# archive (apt-get update is run when the package lists are missing).
set -euo pipefail

packages=(
  libyaml-dev libyaml-0-2         # job spec parsing (zenflow_common); .so loaded at run time
  libyaml-cpp-dev libyaml-cpp0.7  # pricing catalog and profiles (zenflow_common)
  nlohmann-json3-dev              # header-only JSON
  libcli11-dev                    # header-only CLI parsing (zenflow CLI)
  libcivetweb-dev libcivetweb1    # /metrics HTTP server (zenflow_metrics); .so loaded at run time
  libsqlite3-dev libsqlite3-0     # the coordinator's store (server/), built in every configuration
  libgtest-dev libgmock-dev       # tests (static libraries + CMake config)
  libucx0 libucx-dev              # optimizer nodes (ZENFLOW_UCX): transport, zenflow-optimizer, --vs-node
  libnuma1 libibverbs1 librdmacm1 # what libucx0 loads (its RDMA modules find no device without providers)
)

dir="${1:-.debs}"
mkdir -p "$dir"
cd "$dir"
if ! apt-cache show "${packages[0]}" >/dev/null 2>&1; then
  apt-get update -qq
fi
rm -f ./*.deb
apt-get -o APT::Sandbox::User=root download "${packages[@]}"
debs=(./*.deb)
echo "fetch-gpu-debs: ${#debs[@]} packages, $(du -sh . | cut -f1) in $dir:"
printf '  %s\n' "${debs[@]}"
