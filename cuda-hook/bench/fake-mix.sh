#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Tenants side by side on the fake driver's time-sliced GPU (FAKE_CUDA_SHARED_GPU: one
# context at a time, 2 ms slices, as a GPU without MPS runs several processes), each a
# container of its own with its gpu-cores and a phase after the one before, the GPU's
# turn file present as the node agent provides it; prints each tenant's share of the
# GPU's time (the fake's busy time over wall time). It measures and reports; it
# asserts nothing. Run from cuda-hook/ (it builds the fake-driver test variant):
#
#   bench/fake-mix.sh <cores>:<path>[:unhooked]...
#
# <path> is a launch pattern of test/hooktest's pace scenario: k1000 (1 ms kernels back
# to back), lb5 (a launch-bound loop: 32 kernels of 5 us and a synchronize), attn1000 and
# the others listed there. ":unhooked" runs that tenant without the hook (its cores
# still place the next tenant's phase), to set the hook's pacing of it against what
# the GPU's time slicing alone gives it. FAKE_CUDA_CALL_NS (3000 here) is the host's
# time in each launch, MIX_SECONDS (2) the measured seconds, HOOKLIB another build of
# the test variant's hook (make BUILD=build/x HOOK_CFLAGS=... build/x/plain/
# libtessera-cuda.so) to set against this one. Example, B7's shape (two
# matmul-like tenants and two launch-bound ones at 25 %):
#
#   bench/fake-mix.sh 25:k1000 25:k1000 25:lb5 25:lb5
set -eu
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,/^set -eu/p' "$0" | sed 's/^# \{0,1\}//; /^set -eu/d' >&2; exit 2; }
make -s build/plain/libtessera-cuda.so build/plain/hooktest
B=$PWD/build/plain
ROOT=$(cat build/test-root)/mix
UUID=GPU-fa4e0000-0000-0000-0000-000000000001
rm -rf "$ROOT"
mkdir -p "$ROOT"
# The test variant keeps the node's files (config, limits, turn files, shares) under
# the test root's plain/, where the suite sets them up (so not while the suite runs):
# each tenant here names its own limits file, which the hook reads only where the
# node gave none, and the GPU's turn file is there as the agent provides it.
HOOKLIB=${HOOKLIB:-$B/libtessera-cuda.so}
P=$(cat build/test-root)/plain
rm -rf "$P/run" "$P/shares" "$P/turns"
mkdir -p "$P/etc" "$P/shm" "$P/turns"
truncate -s 4096 "$P/turns/$UUID"
printf 'allow-env-limits yes\n' >"$P/etc/cuda-hook.conf"
chmod 644 "$P/etc/cuda-hook.conf"
export LD_LIBRARY_PATH=$B/fake FAKE_CUDA_CALL_NS=${FAKE_CUDA_CALL_NS:-3000}
n=$$ i=0 phase=0 pids=()
for t in "$@"; do
	IFS=: read -r cores path unhooked <<<"$t"
	case $cores in '' | *[!0-9]*) echo "$t: want <cores>:<path>[:unhooked]" >&2 && exit 2 ;; esac
	printf 'version 1\ncgroup /mix/%s/%s\ncontext-mib 0\ncharge kernel\ngpu %s 81920 %s %s\n' $n $i $UUID "$cores" $((phase % 100)) >"$ROOT/$i.limits"
	pre=$HOOKLIB
	[ -z "$unhooked" ] || pre=
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/$i.limits LD_PRELOAD=$pre \
		"$B/hooktest" pace "$path" "$cores" "${MIX_SECONDS:-2}" >"$ROOT/$i.out" 2>&1 &
	pids+=($!)
	phase=$((phase + cores))
	i=$((i + 1))
done
# A tenant's exit status is its scenario's checks (the suite's, of a tenant alone): a
# share is what counts here, and a tenant that printed none failed.
for p in "${pids[@]}"; do wait "$p" || true; done
rc=0 k=0
for t in "$@"; do
	s=$(grep -o 'share [0-9.]*' "$ROOT/$k.out" | tail -1)
	[ -n "$s" ] || rc=1
	echo "$t: ${s:-failed: $(tail -1 "$ROOT/$k.out")}"
	k=$((k + 1))
done
exit $rc
