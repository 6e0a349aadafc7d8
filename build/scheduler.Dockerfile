# syntax=docker/dockerfile:1
# The Tessera scheduler: kube-scheduler with the TesseraGPUShare plugin, built by the
# repository's own make target. Build from the repository root:
#
#   docker build -f build/scheduler.Dockerfile -t tessera-scheduler:dev .
#
# (or make images, which builds both images with the same tag).

ARG GO_IMAGE=golang:1.26.8-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
# The scheduler needs no cgo: a static binary runs on a distroless base.
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    make scheduler BIN=/out

FROM ${BASE_IMAGE}
COPY --from=build /out/tessera-scheduler /usr/local/bin/tessera-scheduler
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/tessera-scheduler"]
