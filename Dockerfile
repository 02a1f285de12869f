# zenflow's container image: the binaries (zenflow and zenflow-train, zenflow-coordinator,
# zenflow-worker, zenflow-optimizer) on a Debian 12 runtime with only the shared libraries they load.
#
#   CPU image (the default target, `runtime`), built from Debian packages:
#     docker build -t zenflow .                   # or: buildah bud --isolation chroot -t zenflow .
#     docker run zenflow zenflow --version
#     docker run zenflow zenflow-coordinator --listen 0.0.0.0:7070 --insecure-plaintext ...
#   Without a registry or a daemon (how scripts/image-check.sh builds and smoke-tests it):
#     mmdebstrap --variant=minbase bookworm rootfs.tar && podman import rootfs.tar localhost/debian:bookworm
#     buildah bud --isolation chroot --build-arg BASE=localhost/debian:bookworm -t zenflow .
#
#   CUDA image (target `runtime-cuda`): LibTorch from a PyTorch wheel, as scripts/gpu-check.sh builds
#   on GPU hosts, on NVIDIA's CUDA images (Ubuntu 24.04: the same gRPC 1.51 / protobuf 3.21 as
#   Debian 12, under the same package names, so scripts/install-deps.sh runs there unchanged):
#     docker build --target runtime-cuda -t zenflow:cuda \
#       --build-arg CUDA_BASE=nvidia/cuda:12.6.3-devel-ubuntu24.04 \
#       --build-arg CUDA_RUNTIME_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04 \
#       --build-arg TORCH_VERSION=2.7.1 --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126 \
#       --build-arg TORCH_CUDA_ARCH_LIST="8.0;9.0" .
#     docker run --gpus all zenflow:cuda zenflow-worker --coordinator HOST:7070 ...
#   The wheel must use the C++11 ABI (PyTorch >= 2.7), or the distribution's gRPC and yaml-cpp
#   cannot link with it; the build stage checks. The wheel's libraries (and the nvidia-* wheels
#   they load) are copied into /usr/local/lib/zenflow; the GPU driver comes from the host.
#   NOT BUILT OR RUN on the development machines: they reach no container registry (no
#   nvidia/cuda base) and have no GPU. The CPU image is what scripts/image-check.sh checks.
#
# Build args: BASE (CPU base, default debian:12), ZENFLOW_TARGETS (the binaries to build and
# ship), JOBS (ninja -j; default: every core).
#
# The binaries look for their shipped data where they were built (ZENFLOW_SOURCE_DIR): the build
# stage builds in /opt/zenflow, and the runtime keeps examples/ and deploy/ (pricing.yaml,
# Prometheus config) there. `zenflow run /opt/zenflow/examples/tiny.yaml` checkpoints into
# runs/tiny-demo of the working directory, /work, writable by the image's user (zenflow, uid 10001).

ARG BASE=debian:12
ARG CUDA_BASE=nvidia/cuda:12.6.3-devel-ubuntu24.04
ARG CUDA_RUNTIME_BASE=nvidia/cuda:12.6.3-runtime-ubuntu24.04

# ---- CPU build: Debian's LibTorch, gRPC, UCX, ... (scripts/install-deps.sh) -------------------
FROM ${BASE} AS build
ARG ZENFLOW_TARGETS="zenflow zenflow-train zenflow-coordinator zenflow-worker zenflow-optimizer"
ARG JOBS=
WORKDIR /opt/zenflow
# The dependencies first, in a layer of their own: a source change does not reinstall them.
COPY scripts/install-deps.sh scripts/install-deps.sh
# install-deps fetches uPlot from the npm registry over HTTPS. Behind a TLS-intercepting proxy,
# pass the CA bundle that trusts it as a build secret (never stored in a layer):
#   --secret id=ca-certificates,src=/etc/ssl/certs/ca-certificates.crt   (scripts/image-check.sh does)
RUN --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca-certificates; fi \
 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates \
 && bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# Release build with Ninja, as scripts/build.sh, of the shipped binaries only; then /out: what
# the runtime stage copies (binaries, entrypoint, examples, deploy, the runtime package list).
RUN cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release -DZENFLOW_TESTS=OFF \
 && cmake --build build --target ${ZENFLOW_TARGETS} ${JOBS:+-j ${JOBS}} \
 && bash deploy/docker/stage-out.sh /out ${ZENFLOW_TARGETS}

# ---- CUDA build: LibTorch from a PyTorch wheel (see the header; not buildable here) ------------
FROM ${CUDA_BASE} AS build-cuda
ARG ZENFLOW_TARGETS="zenflow zenflow-train zenflow-coordinator zenflow-worker zenflow-optimizer"
ARG JOBS=
ARG TORCH_VERSION=2.7.1
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu126
ARG TORCH_CUDA_ARCH_LIST="8.0;9.0"
WORKDIR /opt/zenflow
COPY scripts/install-deps.sh scripts/install-deps.sh
# install-deps brings the distribution's CPU LibTorch too: removed, the wheel's replaces it.
RUN --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export NODE_EXTRA_CA_CERTS=/run/secrets/ca-certificates; fi \
 && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      ca-certificates python3-venv \
 && bash scripts/install-deps.sh \
 && DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq libtorch-dev python3-torch \
 && DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq && rm -rf /var/lib/apt/lists/*
RUN --mount=type=secret,id=ca-certificates \
    if [ -s /run/secrets/ca-certificates ]; then export PIP_CERT=/run/secrets/ca-certificates; fi \
 && python3 -m venv /opt/torch \
 && /opt/torch/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}" \
 && /opt/torch/bin/python -c 'import sys, torch; sys.exit(0 if torch.compiled_with_cxx11_abi() else \
      "torch " + torch.__version__ + " uses the pre-C++11 ABI: gRPC and yaml-cpp cannot link with it (use torch >= 2.7)")'
COPY . .
# As scripts/gpu-check.sh configures, with the services on: CUDA kernels, the wheel's CMake
# prefix, the toolkit's header-only NVTX3 where it has one (CUDA 13 has no libnvToolsExt).
RUN export CUDACXX=/usr/local/cuda/bin/nvcc TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST}" CMAKE_POLICY_VERSION_MINIMUM=3.5 \
 && torch_prefix=$(/opt/torch/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)') \
 && nvtx="" && { [ ! -d /usr/local/cuda/include/nvtx3 ] || nvtx="-DUSE_SYSTEM_NVTX=ON -Dnvtx3_dir=/usr/local/cuda/include"; } \
 && cmake -G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release -DZENFLOW_TESTS=OFF -DZENFLOW_CUDA=ON \
      -DCUDAToolkit_ROOT=/usr/local/cuda $nvtx -DCMAKE_PREFIX_PATH="$torch_prefix;/usr/local/cuda" \
 && cmake --build build --target ${ZENFLOW_TARGETS} ${JOBS:+-j ${JOBS}} \
 && bash deploy/docker/stage-out.sh /out ${ZENFLOW_TARGETS}

FROM ${CUDA_RUNTIME_BASE} AS runtime-cuda
COPY --from=build-cuda /out/ /
RUN sh /usr/local/share/zenflow/install-runtime.sh
USER zenflow
WORKDIR /work
EXPOSE 7070 9402 9403 9404
ENTRYPOINT ["/usr/local/bin/zenflow-entrypoint"]
CMD ["zenflow", "--help"]

# ---- CPU runtime (the default target): no compilers, no headers, a non-root user -------------
FROM ${BASE} AS runtime
LABEL org.opencontainers.image.title="zenflow" \
      org.opencontainers.image.description="Stall-free offloaded LLM fine-tuning (ZenFlow): CLI, coordinator, worker, optimizer node"
COPY --from=build /out/ /
RUN sh /usr/local/share/zenflow/install-runtime.sh
USER zenflow
WORKDIR /work
# gRPC (coordinator) and the metrics ports of deploy/prometheus/prometheus.yml.
EXPOSE 7070 9402 9403 9404
ENTRYPOINT ["/usr/local/bin/zenflow-entrypoint"]
CMD ["zenflow", "--help"]
