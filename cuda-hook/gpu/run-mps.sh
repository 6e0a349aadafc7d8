#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# MPS clients held by the hook on a real GPU (make test-gpu-mps): the SM share comes
# from the limits file's mps line, not from the tenant's environment. One MPS control
# daemon serves the GPU; each client runs as a bound container does, in its own mount
# namespace with its limits directory mounted at /run/tessera (the hook's production
# path) and the hook preloaded. The tenant leaves CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
# unset, raises it to 100, points CUDA_MPS_PIPE_DIRECTORY elsewhere, or lowers it;
# each share is the client's rate over one process's solo rate in the same run.
# Results: $OUT (or build/gpu)/mps-hook.txt.
. "$(dirname "$0")/common.sh" "$1"
LOG=$RES/mps-hook.txt
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
D=${MPS_SECONDS:-2}
B7_BUILD_ONLY=1 "$HERE/gpu/run-b7.sh" "$B" >/dev/null || { say "building b7 failed"; exit 1; }
gcc -O2 -I"$CUDA_INC" "$HERE/gpu/mps_probe.c" -o "$G/mps_probe" -L"$LIBCUDA_DIR" -l:libcuda.so.1 2>"$G/mps_probe.build" ||
	say "building the probe failed: $(head -3 "$G/mps_probe.build")"
MPSCTL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
PATH=$(dirname "$MPSCTL"):$PATH
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
say "MPS hook check: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); ${D}s windows; $(date -u +%F)"
SOLO=$("$G/b7" mm "$D" 0 | field rate)
say "solo (one process, no MPS, no hook): mm $SOLO/s"

MPS=$G/mpsh
rm -rf "$MPS" && mkdir -p "$MPS/pipe" "$MPS/log" "$MPS/empty"
CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe CUDA_MPS_LOG_DIRECTORY=$MPS/log "$MPSCTL" -d || { say "MPS control daemon did not start"; exit 1; }
# The clients' mount point, made here only where the machine has none, and taken away
# again at the end: a /run/tessera left behind tells every hooked process after this
# run that it is inside a Tessera container, and with no limits there they are refused
# CUDA (B4 run after this suite failed so).
MADE_RUN=
[ -d /run/tessera ] || { mkdir -p /run/tessera && MADE_RUN=1; }
trap 'echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe "$MPSCTL"; [ -z "$MADE_RUN" ] || rmdir /run/tessera 2>/dev/null' EXIT

# client <label> <granted%> <pipe in the mps line> <hook|nohook> <program...>: env
# comes from the caller; prints the program's output. Each client has a limits
# directory and a cgroup (the key of its accounting region) of its own, named by the
# subshell's PID: the label is prose, and a cgroup path may not hold spaces.
client() {
	local label=$1 pct=$2 pipe=$3 hook=$4 id=$BASHPID
	shift 4
	local L=$G/lim-$id
	mkdir -p "$L"
	printf 'version 1\ncgroup /gpu-test/mps-%s\ncontext-mib %s\ngpu %s 40960 0 0\nmps %s %s\n' "$id" $CTX "$UUID" "$pct" "$pipe" >"$L/limits"
	local pre=""
	[ "$hook" = hook ] && pre=$HOOK
	unshare -m --propagation private sh -c 'l=$0 p=$1; shift; mount --bind "$l" /run/tessera || exit 1; [ -n "$p" ] && export LD_PRELOAD="$p"; exec "$@"' \
		"$L" "$pre" "$@" 2>&1
}
share() { awk -v r="$1" -v b="$SOLO" 'BEGIN{ if (r == "") print "FAILED"; else printf "%.1f", 100*r/b }'; }
# Each client's whole output (the hook's log at info level included) goes to
# $RES/mps-clients.log.
: >"$RES/mps-clients.log"
run() {
	local label=$1
	shift
	local out
	out=$(TESSERA_HOOK_LOG=info client "$label" "$@" "$G/b7" mm "$D" 0)
	printf '== %s\n%s\n' "$label" "$out" >>"$RES/mps-clients.log"
	say "$label: share $(share "$(echo "$out" | field rate | tail -1)") % of solo ($(echo "$out" | tail -1))"
}
P=$MPS/pipe
CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 run "no hook, tenant sets 100 (the escape the hook closes)" 30 "$P" nohook
# What the hook sets, without the hook: the percentage, then the pinned memory limit too.
CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 run "no hook, environment 30" 30 "$P" nohook
CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=40960M \
	run "no hook, environment 30 and pinned memory 0=40960M" 30 "$P" nohook
(
	unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE CUDA_MPS_PIPE_DIRECTORY
	run "hook, granted 30, tenant sets nothing" 30 "$P" hook
)
CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 run "hook, granted 30, tenant sets 100" 30 "$P" hook
CUDA_MPS_PIPE_DIRECTORY=/tmp/no-mps-here CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 run "hook, granted 30, tenant points the pipe directory elsewhere" 30 "$P" hook
CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=10 run "hook, granted 30, tenant lowers to 10" 30 "$P" hook
say "hook, granted 30, no MPS server behind the pipe directory: $(client nodaemon 30 "$MPS/empty" hook "$G/b7" mm 1 0 | tail -1)"
if [ -x "$G/mps_probe" ]; then
	say "$(CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 client p1 30 "$P" nohook "$G/mps_probe" | tail -1) [no hook, env 30]"
	say "$(CUDA_MPS_PIPE_DIRECTORY=$P CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30 client p2 30 "$P" nohook "$G/mps_probe" raise | tail -1) [no hook, env 30]"
	say "$(
		unset CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
		client p3 30 "$P" hook "$G/mps_probe" raise | tail -1
	) [hook, granted 30]"
fi
