#!/usr/bin/env bash
# Lists what built binaries need at run time, for a runtime image without compilers or headers.
#
#   scripts/runtime-deps.sh OUT_DIR BINARY...
#
# Writes OUT_DIR/packages.txt: the Debian/Ubuntu packages that own the shared libraries the
# binaries load (ldd, then dpkg -S; -dev packages never, libc and friends included: apt skips
# what the base already has). Copies every needed library that no package owns (e.g. the
# LibTorch of a PyTorch wheel and the nvidia-* wheels it loads) into OUT_DIR/lib/. Fails when
# a library is not found at all, except the GPU driver's own (libcuda.so.1, libnvidia-ml.so.1:
# the host provides them at run time, through the NVIDIA container toolkit).
set -euo pipefail

if (($# < 2)); then
  echo "usage: $0 OUT_DIR BINARY..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/lib"
: >"$out/packages.txt.tmp"

missing=0
libs=()
for bin in "$@"; do
  [ -x "$bin" ] || { echo "runtime-deps: $bin: not an executable" >&2; exit 1; }
  host_libs='^[[:space:]]*(libcuda\.so\.1|libnvidia-ml\.so\.1) '
  if ldd "$bin" | grep "=> not found" | grep -Eqv "$host_libs"; then
    ldd "$bin" | grep "=> not found" | grep -Ev "$host_libs" | sed "s|^|runtime-deps: $bin: |" >&2
    missing=1
  fi
  mapfile -t -O "${#libs[@]}" libs < <(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }')
done
((missing)) && exit 1

# dpkg knows a file by the path its package installed: on merged-/usr systems that may be
# /lib/... or /usr/lib/...; an alternative (libblas.so.3) resolves to its provider's file.
# One dpkg -S call for every candidate path of every library (it is slow per call).
declare -A owner=()
candidates=()
for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
  real=$(readlink -f "$lib")
  candidates+=("$real" "$lib" "${real#/usr}" "/usr${real}")
done
while IFS= read -r line; do
  [[ "$line" == *": /"* ]] || continue
  pkgs=${line%%: /*}
  path=${line#*: }
  owner[$path]=${pkgs%%,*}
done < <(dpkg -S "${candidates[@]}" 2>/dev/null || true)

for lib in $(printf '%s\n' "${libs[@]}" | sort -u); do
  real=$(readlink -f "$lib")
  pkg=""
  for c in "$real" "$lib" "${real#/usr}" "/usr${real}"; do
    [ -n "${owner[$c]:-}" ] && { pkg=${owner[$c]%%:*}; break; }
  done
  if [ -n "$pkg" ]; then
    case "$pkg" in *-dev) ;; *) echo "$pkg" >>"$out/packages.txt.tmp" ;; esac
  else
    cp -L "$lib" "$out/lib/"
    echo "runtime-deps: $(basename "$lib") belongs to no package: copied to $out/lib" >&2
  fi
done
sort -u "$out/packages.txt.tmp" >"$out/packages.txt"
rm -f "$out/packages.txt.tmp"
echo "runtime-deps: $(wc -l <"$out/packages.txt") packages, $(find "$out/lib" -type f | wc -l) unpackaged libraries" >&2
