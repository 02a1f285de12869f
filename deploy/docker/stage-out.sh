#!/usr/bin/env bash
# Runs at the end of a Dockerfile build stage, in the source tree: lays out OUT as the files the
# runtime stage copies to / — the stripped binaries and the entrypoint in /usr/local/bin,
# examples/ and deploy/ (less this directory) in /opt/zenflow, where the binaries look for them,
# the runtime package list and install-runtime.sh in /usr/local/share/zenflow, libraries no
# package owns in /usr/local/lib/zenflow.
#
#   deploy/docker/stage-out.sh OUT TARGET...
set -euo pipefail
out=$1
shift
bins=()
for t in "$@"; do bins+=("build/bin/$t"); done
mkdir -p "$out/usr/local/bin" "$out/usr/local/share/zenflow" "$out/usr/local/lib/zenflow" "$out/opt/zenflow/deploy"
cp "${bins[@]}" deploy/docker/zenflow-entrypoint "$out/usr/local/bin/"
for t in "$@"; do strip --strip-unneeded "$out/usr/local/bin/$t"; done
cp -rL examples "$out/opt/zenflow/"
for entry in deploy/*; do
  [ "$entry" = deploy/docker ] || cp -rL "$entry" "$out/opt/zenflow/deploy/"
done
cp deploy/docker/install-runtime.sh "$out/usr/local/share/zenflow/"
rt=$(mktemp -d)
bash scripts/runtime-deps.sh "$rt" "${bins[@]}"
cp "$rt/packages.txt" "$out/usr/local/share/zenflow/runtime-packages.txt"
cp -a "$rt/lib/." "$out/usr/local/lib/zenflow/"
rm -rf "$rt"
