#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The real-node suite for a GPU machine without Go, a container runtime or a network.
#
#   test/node/gpu-bundle.sh build DIR   build everything into DIR (the binaries in one bin.tar.xz)
#   test/node/gpu-bundle.sh run DIR     run make test-node-gpu's tests and B6 from DIR
#
# build needs what make test-node needs. The Kubernetes components and the node agent
# travel as one binary: the suite's test binary built with the nodebox tag, which runs
# as kube-apiserver, etcd, kubelet, kubectl, tessera-scheduler or tessera-node-agent by
# the name it is called under (six separate binaries would be about 110 MB compressed;
# this one is about a third of that). runc is static (libseccomp linked in). The files
# node.sh needs from the repository travel in DIR/repo.
#
# run needs root and an NVIDIA driver (libraries in TESSERA_NODE_DRIVER_DIR, default
# /usr/local/nvidia/lib64). Environment: NODE_TESTS (the top-level tests, a regexp;
# default ^TestNode$, the device-plugin node; ^TestNodeDRA$ the DRA node),
# NODE_TEST_RUN (test regexp below them, pass first, e.g. nri/MPSShares; default every
# case), TESSERA_NODE_MODES (default nri), B6_MODE (dra: B6's GPU pods ask through
# ResourceClaims on a node in DRA mode),
# TESSERA_NODE_MPS_CONTROL (the MPS control program of the MPSShares case, default
# /usr/local/nvidia/bin/nvidia-cuda-mps-control, nvidia-cuda-mps-server beside it), B6_PODS (default 20; 0: no B6), LIMIT_S
# and B6_LIMIT_S (seconds for the tests and for B6, default 100 and 60);
# TESSERA_NODE_GPU=0 runs the same on the fake driver (to check a bundle without a GPU). Results go to $OUT (or DIR/results):
# summary.txt, b6.txt and logs.tar.gz.
set -u
cmd=${1:-}
DIR=${2:-}
[[ -n $cmd && -n $DIR ]] || { echo "usage: $0 build|run DIR" >&2; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
K8S_VERSION=1.37.2

build() {
  set -e
  mkdir -p "$DIR"
  DIR=$(cd "$DIR" && pwd)
  cd "$ROOT"
  export CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
  make --no-print-directory node-binaries node-images node-fake-driver hook
  local ldf="-X k8s.io/component-base/version.gitVersion=v$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"
  # The Go linker marks a binary that imports "plugin" (some Kubernetes code does)
  # bind-now, which go-nvml's lazily resolved NVML symbols cannot survive.
  go test -c -tags nodebox -ldflags "$ldf -s -w -extldflags=-Wl,-z,lazy" -o "$DIR/nodebox" ./test/node
  GOBIN="$DIR/static" go install -tags "seccomp netgo osusergo" -ldflags "-s -w -extldflags -static" github.com/opencontainers/runc@v1.5.3
  mv "$DIR/static/runc" "$DIR/runc"
  rmdir "$DIR/static"
  cp bin/node/containerd bin/node/containerd-shim-runc-v2 bin/node/ctr "$DIR/"
  cp _output/node-test/images.tar cuda-hook/build/libtessera-cuda.so "$DIR/"
  mkdir -p "$DIR/fake"
  cp cuda-hook/build/plain/fake/libcuda.so.1 cuda-hook/build/plain/fake/libnvidia-ml.so.1 _output/node-test/bin/fake-mps-control "$DIR/fake/"
  rm -rf "$DIR/repo"
  mkdir -p "$DIR/repo/hack/lib" "$DIR/repo/config/scheduler" "$DIR/repo/test/node"
  cp hack/lib/local-cluster.sh "$DIR/repo/hack/lib/"
  cp config/scheduler/tessera-scheduler.yaml "$DIR/repo/config/scheduler/"
  mkdir -p "$DIR/repo/config/deploy/manifests" "$DIR/repo/config/dra"
  cp config/dra/deviceclass.yaml "$DIR/repo/config/dra/"
  cp config/deploy/manifests/tessera.yaml "$DIR/repo/config/deploy/manifests/"
  cp test/node/node.sh test/node/with-fake-dev.sh test/node/fake-gpus.yaml test/node/gpu-bundle.sh "$DIR/repo/test/node/"
  # One xz stream, one thread (no block split), with a dictionary larger than the
  # five binaries together: containerd, its shim and ctr share most of their code, and
  # the whole bundle must fit in 64 MiB. Compressing needs about 3 GB of memory,
  # unpacking 256 MiB.
  local bins=(nodebox containerd containerd-shim-runc-v2 ctr runc)
  tar -C "$DIR" -cf - "${bins[@]}" | xz -T1 --lzma2=preset=9e,dict=256MiB >"$DIR/bin.tar.xz"
  (cd "$DIR" && rm -f "${bins[@]}")
  set +e
  ls -l "$DIR"
  du -sh "$DIR"
}

run() {
  DIR=$(cd "$DIR" && pwd)
  local res=${OUT:-$DIR/results} w b
  w=$(mktemp -d /tmp/tnode.XXXX)
  b=$w/bin
  mkdir -p "$res" "$b"
  xz -dc "$DIR/bin.tar.xz" | tar -x -C "$b" || { echo "unpacking $DIR/bin.tar.xz failed" >&2; return 1; }
  chmod +x "$b"/*
  for n in kube-apiserver etcd kubelet kubectl tessera-scheduler tessera-node-agent; do ln -s nodebox "$b/$n"; done
  local S=$res/summary.txt
  : >"$S"
  say() { echo "$*" | tee -a "$S"; }
  say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  say "kernel: $(uname -r), cgroup fs: $(stat -fc %T /sys/fs/cgroup), root subtree_control: $(cat /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null)"
  nvidia-smi --query-gpu=index,uuid,name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$S"
  export TESSERA_NODE_DRIVER_DIR=${TESSERA_NODE_DRIVER_DIR:-/usr/local/nvidia/lib64}
  # NVML for the agent.
  export LD_LIBRARY_PATH=$TESSERA_NODE_DRIVER_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export NODE_DIR=$w/node BIN_DIR=$b NODE_BIN_DIR=$b IMAGES_TAR=$DIR/images.tar HOOK_LIBRARY=$DIR/libtessera-cuda.so FAKE_DRIVER_DIR=$DIR/fake FAKE_MPS_CONTROL=$DIR/fake/fake-mps-control
  export TESSERA_NODE_SUITE=1 TESSERA_NODE_GPU=${TESSERA_NODE_GPU:-1} TESSERA_NODE_MODES=${TESSERA_NODE_MODES:-nri} TESSERA_NODE_LOGS=$w/logs
  cd "$DIR/repo/test/node" || return 1
  timeout "${LIMIT_S:-100}" "$b/nodebox" -test.v -test.count=1 -test.run "${NODE_TESTS:-^TestNode\$}/${NODE_TEST_RUN:-.}" >"$w/test.txt" 2>&1
  say "== ${NODE_TESTS:-TestNode} (rc=$?)"
  grep -E '^\s*(--- |ok|FAIL|PASS)|(node|cores|torch|mps|dra)_test.go|suite_test.go:[0-9]+: (starting|stopping)' "$w/test.txt" | cut -c1-400 | tee -a "$S"
  if [[ ${B6_PODS:-20} != 0 ]]; then
    TESSERA_NODE_B6=1 TESSERA_B6_MODE=${B6_MODE:-} TESSERA_B6_PODS=${B6_PODS:-20} TESSERA_B6_OUT=$res/b6.txt NODE_DIR=$w/b6node TESSERA_NODE_LOGS=$w/b6logs \
      timeout "${B6_LIMIT_S:-60}" "$b/nodebox" -test.v -test.count=1 -test.run '^TestB6PodStart$' >"$w/b6.txt" 2>&1
    say "== B6 (rc=$?)"
    cat "$res/b6.txt" 2>/dev/null | tee -a "$S"
    grep -E '^\s*(--- |FAIL)|b6_test.go' "$w/b6.txt" | head -20 | tee -a "$S"
  fi
  # A timeout leaves the node up: stop it by its recorded PIDs.
  for d in "$w/node-nri" "$w/node-fallback" "$w/b6node-nri"; do
    [[ -d $d/run ]] && NODE_DIR=$d "$DIR/repo/test/node/node.sh" down >/dev/null 2>&1
  done
  tar -czf "$res/logs.tar.gz" -C "$w" test.txt logs b6.txt b6logs 2>/dev/null
  rm -rf "$w"
  ls -l "$res"
}

case $cmd in
build) build ;;
run) run ;;
*) echo "usage: $0 build|run DIR" >&2; exit 2 ;;
esac
