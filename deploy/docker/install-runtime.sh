#!/bin/sh
# Runs inside a runtime stage of the Dockerfile, after the build stage's /out was copied to /:
# installs the packages that own the libraries the binaries load (listed by
# scripts/runtime-deps.sh), selects OpenBLAS as LibTorch's BLAS (as scripts/install-deps.sh
# does), puts the libraries no package owns (a PyTorch wheel's) on the loader's path, creates
# the zenflow user (uid 10001) and its writable directories, and checks that every binary
# resolves every library.
set -eu
share=/usr/local/share/zenflow
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2046  # one package per word
apt-get install -y -qq --no-install-recommends $(cat "$share/runtime-packages.txt")
for alt in libblas.so.3-x86_64-linux-gnu liblapack.so.3-x86_64-linux-gnu; do
  target=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas | head -n1 || true)
  [ -n "$target" ] && update-alternatives --set "$alt" "$target" >/dev/null
done
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log
if [ -n "$(ls -A /usr/local/lib/zenflow 2>/dev/null)" ]; then
  echo /usr/local/lib/zenflow >/etc/ld.so.conf.d/zenflow.conf
fi
ldconfig

useradd --uid 10001 --user-group --create-home --home-dir /home/zenflow --shell /bin/sh zenflow
# /work: the default working directory, where examples/tiny.yaml (no checkpoint.dir) writes
# its runs/tiny-demo.
mkdir -p /work
chown zenflow:zenflow /work

# The GPU driver's libraries come from the host at run time (NVIDIA container toolkit).
host_libs='^[[:space:]]*(libcuda\.so\.1|libnvidia-ml\.so\.1) '
status=0
for b in /usr/local/bin/zenflow /usr/local/bin/zenflow-*; do
  [ "$b" = /usr/local/bin/zenflow-entrypoint ] && continue
  missing=$(ldd "$b" | grep 'not found' | grep -Ev "$host_libs" || true)
  if [ -n "$missing" ]; then
    echo "install-runtime: $b: $(echo "$missing" | tr '\n' ' ')" >&2
    status=1
  fi
done
exit $status
