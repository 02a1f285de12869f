#!/usr/bin/env bash
# Builds the CPU image from ./Dockerfile and smoke-tests it, with no registry and no daemon.
#
#   bash scripts/image-check.sh            # as root, from anywhere; ~20-25 min cold on 2 cores
#
# Phases (each timed; a failed phase stops the check, exit 1):
#   tools   mmdebstrap, buildah, podman, uidmap (scripts/install-deps.sh --image-tools)
#   base    a Debian 12 minbase rootfs (mmdebstrap, cached as a tar in $ZENFLOW_IMAGE_CACHE) imported
#           as localhost/debian:bookworm (podman import)
#   build   buildah bud --isolation chroot --layers --build-arg BASE=localhost/debian:bookworm
#           --target runtime -t $ZENFLOW_IMAGE (the build stage compiles the binaries in the chroot)
#   version every binary's --version and the entrypoint, in a container of the image (buildah from + run)
#   train   zenflow run /opt/zenflow/examples/tiny.yaml, 5 steps, as the image's user
#   service a coordinator (tokens, a free port, /metrics) and a CPU worker in the container: the
#           worker registers (zenflow workers), /healthz answers 200, SIGTERM stops both (exit 0)
# then prints the runtime image's size and every phase's time.
#
# Environment: ZENFLOW_IMAGE (default localhost/zenflow:check), ZENFLOW_IMAGE_CACHE (default
# /var/cache/zenflow-image: the rootfs tar, reused by later runs), ZENFLOW_DEBIAN_MIRROR (default
# http://deb.debian.org), ZENFLOW_BUILD_CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt: the
# CA bundle the build stage trusts for HTTPS, passed as a build secret). `podman run` does not work on these machines (crun cannot set
# RLIMIT_NOFILE), hence `buildah run --isolation chroot`; the container shares the host's network,
# so the service phase uses 127.0.0.1 and free ports. A tree without the zenflow-optimizer target
# (it is built in another branch) builds the other three binaries and says so.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
IMAGE="${ZENFLOW_IMAGE:-localhost/zenflow:check}"
CACHE="${ZENFLOW_IMAGE_CACHE:-/var/cache/zenflow-image}"
MIRROR="${ZENFLOW_DEBIAN_MIRROR:-http://deb.debian.org}"
CA_BUNDLE="${ZENFLOW_BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
BASE_IMAGE=localhost/debian:bookworm
LOGDIR="${ZENFLOW_IMAGE_LOGS:-$ROOT/build/image-check}"
mkdir -p "$LOGDIR" "$CACHE"
START=$(date +%s)
SUMMARY=()
CONTAINER=""

say() { echo "image-check: $*"; }
cleanup() { [ -n "$CONTAINER" ] && buildah rm "$CONTAINER" >/dev/null 2>&1; }
trap cleanup EXIT

# phase NAME COMMAND...: runs COMMAND (output to $LOGDIR/NAME.log and the terminal), times it;
# on failure prints the summary so far and exits 1.
phase() {
  local name=$1
  shift
  local t0 t1 rc took
  say "== $name"
  t0=$(date +%s.%N)
  # In this shell (not a pipeline's subshell), so that a phase can set CONTAINER for the next.
  "$@" > >(tee "$LOGDIR/$name.log") 2>&1
  rc=$?
  wait $! 2>/dev/null  # tee has written everything
  t1=$(date +%s.%N)
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if ((rc == 0)); then
    SUMMARY+=("$(printf '%-8s ok     %8ss' "$name" "$took")")
  else
    SUMMARY+=("$(printf '%-8s FAILED %8ss (exit %s; %s)' "$name" "$took" "$rc" "$LOGDIR/$name.log")")
    report
    exit 1
  fi
}

report() {
  say "---- summary"
  local line
  for line in "${SUMMARY[@]}"; do say "$line"; done
  say "total $(($(date +%s) - START))s; logs in $LOGDIR"
}

tools() { bash "$ROOT/scripts/install-deps.sh" --image-tools; }

base() {
  local tar="$CACHE/debian-bookworm-minbase.tar"
  if [ -s "$tar" ]; then
    echo "cached rootfs $tar ($(du -h "$tar" | cut -f1))"
  else
    mmdebstrap --variant=minbase --format=tar bookworm "$tar.tmp" \
      "deb $MIRROR/debian bookworm main" \
      "deb $MIRROR/debian bookworm-updates main" \
      "deb $MIRROR/debian-security bookworm-security main" || return 1
    mv "$tar.tmp" "$tar"
  fi
  if podman image exists "$BASE_IMAGE"; then
    echo "$BASE_IMAGE already imported"
  else
    podman import "$tar" "$BASE_IMAGE" || return 1
  fi
}

build() {
  local targets="zenflow zenflow-train zenflow-coordinator zenflow-worker zenflow-optimizer"
  if ! grep -rqs --include=CMakeLists.txt 'add_executable(zenflow-optimizer' "$ROOT"; then
    targets="zenflow zenflow-train zenflow-coordinator zenflow-worker"
    echo "NOTE: this tree has no zenflow-optimizer target: building the image without it"
  fi
  # The host's CA bundle as a build secret: the build stage fetches from the npm registry over
  # HTTPS, through whatever TLS-intercepting proxy the host trusts (not stored in the image).
  local secret=()
  [ -s "$CA_BUNDLE" ] && secret=(--secret "id=ca-certificates,src=$CA_BUNDLE")
  buildah bud --isolation chroot --layers --target runtime "${secret[@]}" \
    --build-arg BASE="$BASE_IMAGE" --build-arg ZENFLOW_TARGETS="$targets" \
    -t "$IMAGE" -f "$ROOT/Dockerfile" "$ROOT"
}

in_container() { buildah run --isolation chroot "$CONTAINER" -- "$@"; }

version() {
  CONTAINER=$(buildah from "$IMAGE") || return 1
  in_container zenflow --version || return 1
  in_container zenflow-coordinator --version || return 1
  in_container zenflow-worker --version || return 1
  if grep -rqs --include=CMakeLists.txt 'add_executable(zenflow-optimizer' "$ROOT"; then
    in_container zenflow-optimizer --version || return 1
  fi
  # The entrypoint: a binary by name, a bare flag to zenflow.
  in_container /usr/local/bin/zenflow-entrypoint zenflow-coordinator --version || return 1
  in_container /usr/local/bin/zenflow-entrypoint --version || return 1
  [ "$(in_container id -u)" = 10001 ] || { echo "the image's user is not uid 10001"; return 1; }
  if in_container sh -c 'command -v c++ || command -v gcc || ls /usr/include/torch' 2>/dev/null; then
    echo "the runtime image has a compiler or LibTorch headers"
    return 1
  fi
}

train() {
  in_container zenflow run /opt/zenflow/examples/tiny.yaml --set train.steps=5 --set train.warmup_steps=1 --fresh || return 1
  in_container sh -c 'ls -d /work/runs/tiny-demo/step-*' || return 1  # the working directory's runs/
}

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

service() {
  local mport
  mport=$(free_port) || return 1
  # One shell in the container: tokens, a coordinator on a free port, a worker, the checks, the stop.
  # shellcheck disable=SC2016  # the script expands its variables inside the container
  in_container sh -c '
    set -u
    mport=$1
    d=$(mktemp -d)
    token() { head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n"; }
    token >"$d/admin.token"; token >"$d/worker.token"; chmod 600 "$d"/*.token
    zenflow-coordinator --listen 127.0.0.1:0 --db "$d/zenflow.db" --admin-token-file "$d/admin.token" \
      --worker-token-file "$d/worker.token" --metrics-port "$mport" 2>"$d/coordinator.log" &
    cpid=$!
    addr=""
    for i in $(seq 100); do
      addr=$(sed -n "s/.*listening on \([0-9.]*:[0-9]*\).*/\1/p" "$d/coordinator.log" | head -n1)
      [ -n "$addr" ] && break
      sleep 0.1
    done
    [ -n "$addr" ] || { echo "coordinator did not start"; cat "$d/coordinator.log"; exit 1; }
    echo "coordinator listening on $addr, metrics on 127.0.0.1:$mport"
    zenflow-worker --coordinator "$addr" --token-file "$d/worker.token" --work-dir "$d/w1" --name w1 \
      --cpu-only --cpu-slots 1 2>"$d/worker.log" &
    wpid=$!
    ok=0
    for i in $(seq 100); do
      if zenflow workers --coordinator "$addr" --token-file "$d/admin.token" 2>/dev/null | grep -q "^w1 "; then ok=1; break; fi
      sleep 0.2
    done
    zenflow workers --coordinator "$addr" --token-file "$d/admin.token"
    [ "$ok" = 1 ] || { echo "worker w1 did not register"; cat "$d/worker.log" "$d/coordinator.log"; exit 1; }
    # /healthz over a raw socket: the image has no curl.
    health=$(bash -c "exec 3<>/dev/tcp/127.0.0.1/$mport; printf \"GET /healthz HTTP/1.0\r\n\r\n\" >&3; head -n1 <&3")
    echo "GET /healthz: $health"
    case "$health" in *" 200 "*) ;; *) echo "/healthz did not answer 200"; exit 1 ;; esac
    kill -TERM "$wpid" "$cpid"
    wait "$wpid"; wrc=$?
    wait "$cpid"; crc=$?
    echo "after SIGTERM: worker exit $wrc, coordinator exit $crc"
    [ "$wrc" = 0 ] && [ "$crc" = 0 ]
  ' service "$mport"
}

image_size() {
  local bytes
  bytes=$(podman image inspect "$IMAGE" --format '{{.Size}}') || return 1
  awk -v b="$bytes" -v i="$IMAGE" 'BEGIN { printf "runtime image %s: %d bytes (%.0f MB)\n", i, b, b / 1e6 }'
  buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' | grep -E "^($IMAGE|$BASE_IMAGE) " || true
}

cd "$ROOT" || exit 1
phase tools tools
phase base base
phase build build
phase version version
phase train train
phase service service
phase size image_size
report
