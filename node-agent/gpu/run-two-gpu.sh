#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Checks of the node agent on real GPUs (make test-gpu-2): the container bound to one
# GPU runs on a node of one GPU or more, the two-GPU ones need two.
#
#   node-agent/gpu/run-two-gpu.sh build DIR   build what the checks need into DIR
#   node-agent/gpu/run-two-gpu.sh run DIR     run them (root, two NVIDIA GPUs, cgroup v2)
#
# build needs Go and gcc, not a GPU: the test binaries of nvmlsource and nri (-tags gpu),
# the agent, runc from its Go module (no seccomp build tag) and the CUDA hook. The
# binaries are stripped and xz-compressed so DIR can be copied to a GPU machine that
# has no Go. run needs no container runtime: the nri test drives the real NRI plugin
# with NRI's runtime side and runs the containers with DIR/runc.
#
# Results go to $OUT (or DIR/results): summary.txt, and results.tar.gz with the
# machine's nvidia-smi -q and topo -m, the inventory, every test log, each container's
# adjustment, OCI spec and output.
set -u
RUNC_VERSION=v1.5.3
cmd=${1:-}
DIR=${2:-}
if [ -z "$cmd" ] || [ -z "$DIR" ]; then
	echo "usage: $0 build|run DIR" >&2
	exit 2
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

build() {
	mkdir -p "$DIR"
	DIR=$(cd "$DIR" && pwd)
	cd "$ROOT" || exit 1
	export CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations"
	set -e
	go test -c -tags gpu -ldflags='-s -w' -o "$DIR/nvmlsource-gpu.test" ./node-agent/nvmlsource
	go test -c -tags gpu -ldflags='-s -w' -o "$DIR/nri-gpu.test" ./node-agent/nri
	go build -ldflags='-s -w' -o "$DIR/tessera-node-agent" ./cmd/tessera-node-agent
	GOBIN="$DIR" go install -ldflags='-s -w' "github.com/opencontainers/runc@$RUNC_VERSION"
	# The hook as committed (HEAD), so that edits in progress do not travel.
	tmp=$(mktemp -d)
	git archive HEAD cuda-hook api/testdata | tar -x -C "$tmp"
	make -s -C "$tmp/cuda-hook" >/dev/null
	cp "$tmp/cuda-hook/build/libtessera-cuda.so" "$DIR/"
	rm -rf "$tmp"
	for f in nvmlsource-gpu.test nri-gpu.test tessera-node-agent runc; do xz -f -T0 "$DIR/$f"; done
	set +e
	ls -l "$DIR"
}

run() {
	DIR=$(cd "$DIR" && pwd)
	RES=${OUT:-$DIR/results}
	W=$(mktemp -d)
	mkdir -p "$RES" "$W/containers"
	for f in "$DIR"/*.xz; do [ -e "$f" ] && xz -dc "$f" >"$W/$(basename "$f" .xz)"; done
	cp "$DIR/libtessera-cuda.so" "$W/"
	chmod +x "$W"/*.test "$W/tessera-node-agent" "$W/runc"
	S=$RES/summary.txt
	: >"$S"
	say() { echo "$*" | tee -a "$S"; }
	say "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	say "kernel: $(uname -r), cgroup fs: $(stat -fc %T /sys/fs/cgroup), go: $(command -v go || echo none)"
	say "runc: $("$W/runc" --version | head -1)"
	nvidia-smi --query-gpu=index,uuid,name,memory.total,pci.bus_id,driver_version --format=csv,noheader | tee -a "$S"
	say "== nvidia-smi topo -m"
	nvidia-smi topo -m 2>&1 | tee -a "$S"
	nvidia-smi nvlink -s >"$W/nvlink.txt" 2>&1
	say "nvidia-smi nvlink -s: $(grep -c 'GB/s' "$W/nvlink.txt") active links listed"
	nvidia-smi -q >"$W/nvidia-smi-q.txt" 2>&1
	"$W/tessera-node-agent" --print-inventory --node-name gpu-node >"$W/inventory.json" 2>"$W/inventory.err"
	say "print-inventory rc=$? ($(grep -c '"uuid"' "$W/inventory.json") UUIDs)"
	fails=0
	t() { # t <name> <binary> <regexp>
		(cd "$W" && "$W/$2" -test.v -test.count=1 -test.timeout=8m -test.run "$3") >"$W/$1.txt" 2>&1
		rc=$?
		say "== $1 (rc=$rc)"
		grep -E '^(=== RUN|--- |    [a-z_]+\.go:[0-9]+:.*(Error|want|is |lists|GPU [0-9])|ok|FAIL|PASS)' "$W/$1.txt" | grep -v '^=== RUN' | head -60 | tee -a "$S"
		[ $rc -eq 0 ] || fails=$((fails + 1))
	}
	t nvml nvmlsource-gpu.test 'RealNVML'
	TESSERA_RUNC=$W/runc TESSERA_HOOK_LIBRARY=$W/libtessera-cuda.so TESSERA_GPU_TEST_OUT=$W/containers \
		t containers nri-gpu.test 'RealContainer|RealTwoGPU'
	for f in "$W"/containers/*.txt; do
		[ -e "$f" ] || continue
		say "== container $(basename "$f" .txt)"
		sed -n '/^== output/,$p' "$f" | head -80 | tee -a "$S"
	done
	say "two-gpu: $fails failed"
	tar -C "$W" -czf "$RES/results.tar.gz" --exclude='*.test' --exclude=runc --exclude=tessera-node-agent --exclude='*.so' .
	rm -rf "$W"
	[ $fails -eq 0 ]
}

case $cmd in
build) build ;;
run) run ;;
*)
	echo "usage: $0 build|run DIR" >&2
	exit 2
	;;
esac
