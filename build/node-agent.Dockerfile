# syntax=docker/dockerfile:1
# The Tessera node agent, carrying the CUDA hook library that its DaemonSet's init
# container copies to the host. Both are built by the repository's own make targets.
# Build from the repository root:
#
#   docker build -f build/node-agent.Dockerfile -t tessera-node-agent:dev .
#
# (or make images, which builds both images with the same tag).

ARG GO_IMAGE=golang:1.26.8-bookworm
# The hook is preloaded into tenant containers, so it must load with their C library,
# not the build machine's: built against glibc 2.28 (EL8) it runs in any container with
# glibc 2.28 or later (Ubuntu 20.04+, UBI 8+, Debian 10+). Built on a newer system it
# would need GLIBC_2.34, and the loader would silently skip it in older images.
ARG HOOK_BUILD_IMAGE=almalinux:8
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${GO_IMAGE} AS agent
WORKDIR /src
# go-nvml needs cgo (it dlopens libnvidia-ml.so.1 at run time; nothing links it now).
ENV CGO_ENABLED=1 GOFLAGS=-buildvcs=false
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    make agent BIN=/out

FROM ${HOOK_BUILD_IMAGE} AS hook
# A current compiler (the hook builds with -Werror, tuned on GCC 12) over EL8's glibc.
RUN dnf install -y gcc-toolset-13-gcc gcc-toolset-13-binutils make && dnf clean all
ENV PATH=/opt/rh/gcc-toolset-13/root/usr/bin:$PATH
WORKDIR /src
COPY cuda-hook/ cuda-hook/
RUN make -C cuda-hook all \
    # Refuse a library that needs a newer glibc than the base promises.
    && if objdump -T cuda-hook/build/libtessera-cuda.so | grep -E 'GLIBC_2\.(29|[3-9][0-9])'; then \
         echo "libtessera-cuda.so needs a glibc newer than 2.28" >&2; exit 1; fi

FROM ${BASE_IMAGE}
# /bin/sh, cp and mv are used by the DaemonSet's install-hook init container.
COPY --from=agent /out/tessera-node-agent /usr/local/bin/tessera-node-agent
COPY --from=hook /src/cuda-hook/build/libtessera-cuda.so /opt/tessera/lib/libtessera-cuda.so
ENTRYPOINT ["/usr/local/bin/tessera-node-agent"]
