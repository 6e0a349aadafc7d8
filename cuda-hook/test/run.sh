#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Runs the fake-driver suite against one build variant of the hook (plain, asan,
# ubsan): run.sh <variant> <build dir> <root>. The variant's hook reads its limits,
# config and shared memory under <root> (the Makefile's TEST_ROOT/<variant>) instead of
# /run/tessera, /etc/tessera and /dev/shm.
set -eu
variant=$1
B=$(cd "$2" && pwd)
ROOT=$3
T=$B/hooktest
PRELOAD=$B/libtessera-cuda.so
if [ "$variant" = asan ]; then
	# The sanitizer runtime must come before everything else that is preloaded.
	PRELOAD="$(${CC:-gcc} -print-file-name=libasan.so) $PRELOAD"
	# LeakSanitizer needs ptrace, which some CI sandboxes deny; ASan itself still runs.
	export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0
fi
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LD_LIBRARY_PATH=$B/fake
unset TESSERA_LIMITS_FILE || true

U1=GPU-fa4e0000-0000-0000-0000-000000000001
U3=GPU-fa4e0000-0000-0000-0000-000000000003
pass=0

reset() {
	rm -rf "$ROOT"
	mkdir -p "$ROOT/run/tessera" "$ROOT/etc" "$ROOT/shm" "$ROOT/turns"
}
# TESSERA_TEST_CHARGE picks the charge model every case runs under: kernel (the node
# agent's default; each limits file gets the charge line) or class (make test
# CHARGE=class: no line).
CHARGE=${TESSERA_TEST_CHARGE:-kernel}
case $CHARGE in class | kernel) ;; *) echo "TESSERA_TEST_CHARGE=$CHARGE: want class or kernel" >&2 && exit 2 ;; esac
# limits <context-mib> <gpu line>...
limits() {
	ctx=$1
	shift
	{
		echo "# written by test/run.sh"
		echo "version 1"
		echo "cgroup /tessera-test/$variant"
		echo "context-mib $ctx"
		for g in "$@"; do echo "gpu $g"; done
	} >"$ROOT/run/tessera/limits"
	[ "$CHARGE" = class ] || charge_kernel
}
# charge_kernel: the limits file's charge line (per-kernel charges; without it, the
# class estimator).
charge_kernel() {
	grep -q '^charge kernel$' "$ROOT/run/tessera/limits" ||
		sed -i '/^context-mib /a charge kernel' "$ROOT/run/tessera/limits"
}
config() {
	printf '%s\n' "$1" >"$ROOT/etc/cuda-hook.conf"
	chmod 644 "$ROOT/etc/cuda-hook.conf"
}
t() {
	LD_PRELOAD="$PRELOAD" "$T" "$@" || return
	pass=$((pass + 1))
}
# timed <command...>: a check of a share measured over wall time, which a loaded
# machine (CI's two cores, other builds) can push past its margin by descheduling the
# program at the wrong moment. It gets three tries: the faults these checks are for
# miss on every try (billing another context's turns: 22.5 % where 25 is wanted),
# noise on one.
timed() {
	for try in 1 2 3; do
		if "$@"; then
			return 0
		fi
		[ $try = 3 ] || echo "   (measured over wall time on a loaded machine: try $((try + 1)) of 3)"
	done
	return 1
}
# tenv <NAME=value>... <scenario...>: t with more variables in the environment.
tenv() {
	(
		while case $1 in [A-Z]*=*) true ;; *) false ;; esac; do
			export "${1?}"
			shift
		done
		LD_PRELOAD="$PRELOAD" "$T" "$@"
	) || return
	pass=$((pass + 1))
}

echo "== $variant: every allocation path stops at the limit"
reset
limits 64 "$U1 1024 0 0"
for p in direct dlsym procaddr procaddr-v1 pitch managed async async-ptsz pool vmm array array3d mipmap; do
	t alloc $p 64 1024 64
done

echo "== $variant: memory info, pool caches, devices, symbol resolution"
t meminfo 1024 64
t poolcache 1024 64
t graphmem 1024 64
reset
limits 0 "$U3 2048 0 0" "$U1 2048 0 0"
t devices
tenv FAKE_CUDA_IGNORE_VISIBLE=1 devices
t procaddr
echo "== $variant: no lookup by name hands out the driver's own functions"
# libc's dlsym from dlsym or dlvsym (any handle, any version), dlvsym itself, glibc's
# private lookups and cuGetProcAddress: each answer is the hook's, and the whole
# grant allocated through it is refused (the dlvsym route held 8000 MiB under this
# 1024 MiB grant before).
reset
limits 64 "$U1 1024 0 0"
for r in dlsym dlvsym dlvsym-dlvsym private procaddr; do
	t lookup $r 1024
done
# The driver's older ABIs by name: CUDA 3.1's allocations refused, the old context
# calls counted as the current ones.
reset
limits 256 "$U1 1024 0 0"
t v1abi 1024 256
reset
limits 0 "$U3 2048 0 0" "$U1 2048 0 0"
echo "== $variant: the tenant's CUDA_VISIBLE_DEVICES narrows the container's GPUs"
tenv CUDA_VISIBLE_DEVICES=1 visible 01
tenv CUDA_VISIBLE_DEVICES=$U1,$U3 visible 01,03
tenv CUDA_VISIBLE_DEVICES=GPU-fa4e0000-0000-0000-0000-000000000003 visible 03
tenv CUDA_VISIBLE_DEVICES=0,7,1 visible 03
tenv CUDA_VISIBLE_DEVICES=GPU-fa4e0000-0000-0000-0000-000000000002 visible none
tenv CUDA_VISIBLE_DEVICES= visible none

echo "== $variant: two processes share one limit; a killed one's usage is reclaimed"
reset
limits 32 "$U1 1024 0 0"
LD_PRELOAD="$PRELOAD" "$T" hold 600 "$ROOT/ready" &
holder=$!
i=0
while [ ! -e "$ROOT/ready" ]; do
	i=$((i + 1))
	[ $i -lt 200 ] || { echo "FAIL holder never got ready"; kill $holder; exit 1; }
	sleep 0.05
done
t try 600 oom
t try 300 ok
kill -9 $holder
wait $holder 2>/dev/null || true
t try 900 ok

echo "== $variant: a damaged accounting region is refused, never trusted, never a crash"
for m in magic slots-hw slots-hw-sealed used-sealed random; do
	reset
	limits 32 "$U1 1024 0 0"
	rm -f "$ROOT/ready" "$ROOT/go"
	LD_PRELOAD="$PRELOAD" "$T" damaged "$ROOT/ready" "$ROOT/go" 2>"$ROOT/damaged.err" &
	holder=$!
	i=0
	while [ ! -e "$ROOT/ready" ]; do
		i=$((i + 1))
		[ $i -lt 200 ] || { echo "FAIL damaged: holder never got ready"; kill $holder; exit 1; }
		sleep 0.05
	done
	"$B/region_poke" "$ROOT"/shm/tessera-*.region $m
	touch "$ROOT/go"
	wait $holder || { echo "FAIL damaged ($m): the running process"; cat "$ROOT/damaged.err"; exit 1; }
	grep -q "accounting region is damaged" "$ROOT/damaged.err" || { echo "FAIL damaged ($m): no reason logged"; cat "$ROOT/damaged.err"; exit 1; }
	pass=$((pass + 1))
	t damaged-new 2>/dev/null
done
reset
limits 32 "$U1 1024 0 0"
t try 64 ok
"$B/region_poke" "$ROOT"/shm/tessera-*.region truncate
t damaged-new 2>/dev/null                  # a truncated region is refused at open
# The pacer's fields out of range: reset before use, no overflow, no endless sleep.
reset
limits 0 "$U1 81920 30 0"
t pace kernel 30 0.3
"$B/region_poke" "$ROOT"/shm/tessera-*.region pacer
t pace kernel 30 0.3 2>/dev/null

echo "== $variant: the accounting region lives where the limits file's region line says"
# An MPS client's /dev/shm is its GPU's MPS server's, shared by every client of it: the
# node agent gives each container a directory of its own and names it in a region
# line; the hook keeps the region there and nowhere else.
reset
mkdir -p "$ROOT/region-a"
limits 32 "$U1 1024 0 0"
sed -i "s|^context-mib 32\$|context-mib 32\nregion $ROOT/region-a|" "$ROOT/run/tessera/limits"
grep -q "^region $ROOT/region-a\$" "$ROOT/run/tessera/limits"
t try 64 ok
ls "$ROOT"/region-a/tessera-*.region >/dev/null 2>&1 || { echo "FAIL no region in the region line's directory"; exit 1; }
[ -z "$(ls "$ROOT/shm")" ] || { echo "FAIL a region in the default directory:"; ls "$ROOT/shm"; exit 1; }
pass=$((pass + 1))

echo "== $variant: every context, raised device limits and module globals are counted"
reset
limits 256 "$U1 4096 0 0"
tenv FAKE_CUDA_CTX_MIB=200 contexts create 4096 256 256
tenv FAKE_CUDA_CTX_MIB=200 contexts green 4096 256 0
reset
limits 64 "$U1 1024 0 0"
t teardown 1024 64
reset
limits 64 "$U1 1024 0 0"
t modules module 1024 100
t modules library 1024 100
t devlimits 1024

echo "== $variant: fork"
reset
limits 32 "$U1 1024 0 0"
t fork 1024 32

echo "== $variant: a dead process's memory stays counted while a child holds its driver descriptors"
# The fork-orphan attack: a new process allocates 900 MiB under a 1024 MiB grant,
# makes a holder that keeps the driver's descriptors (fork, or a raw clone that runs no
# atfork handler) and exits. The driver keeps the memory while the holder lives (on an
# H200, gpu/orphan.c; the fake driver models it), so a new process must be refused
# then and get the memory once the holder has exited; three generations, and the
# container never holds more than its grant (giving the usage back at the allocator's
# exit held 1800 MiB at once).
reset
limits 32 "$U1 1024 0 0"
rm -f "$ROOT/tally"*
FAKE_CUDA_TALLY=$ROOT/tally t orphan 3 900 1024

echo "== $variant: threads and processes racing for one limit"
reset
limits 0 "$U1 1024 0 0"
t threads 16 1024
rm -f "$ROOT/tally"
FAKE_CUDA_TALLY=$ROOT/tally t threads 8 1024 2

echo "== $variant: missing, malformed or unauthorized limits fail closed"
# refused_with <text> [VAR=value...]: CUDA is refused and the hook says why.
refused_with() {
	want=$1
	shift
	env "$@" LD_PRELOAD="$PRELOAD" "$T" refused 800 2>"$ROOT/refused.err" || { cat "$ROOT/refused.err"; exit 1; }
	grep -q "$want" "$ROOT/refused.err" || { echo "FAIL hook's reason lacks \"$want\":"; cat "$ROOT/refused.err"; exit 1; }
	pass=$((pass + 1))
}
reset
refused_with "inside a Tessera container (the limits directory"    # the limits directory, nothing in it
echo "version 2" >"$ROOT/run/tessera/limits"
t refused 800 2>/dev/null
# Standalone: no limits directory, no device plugin marker.
reset
rmdir "$ROOT/run/tessera"
printf 'version 1\ncgroup /standalone\ncontext-mib 0\ngpu %s 2048 0 0\n' $U1 >"$ROOT/alt.limits"
ENV_LIMITS=TESSERA_LIMITS_FILE=$ROOT/alt.limits
refused_with "standalone use is not enabled" $ENV_LIMITS           # no config: env is ignored
config "allow-env-limits yes"
tenv $ENV_LIMITS total-is 2048                                      # standalone use
refused_with "TESSERA_LIMITS_FILE is not set"                       # enabled but nothing given
chmod 664 "$ROOT/etc/cuda-hook.conf"
refused_with "writable only by it" $ENV_LIMITS                      # config writable by others
config "allow-env-limits no"
refused_with "does not say" $ENV_LIMITS
# Inside a Tessera container, env limits are refused whatever the config says: the
# limits directory without a file or socket (an agent restarting on a node without
# NRI), or the device plugin's marker.
config "allow-env-limits yes"
mkdir -p "$ROOT/run/tessera"
refused_with "inside a Tessera container (the limits directory" $ENV_LIMITS
rmdir "$ROOT/run/tessera"
refused_with "inside a Tessera container (the device plugin's TESSERA_GPU_REQUESTED is set)" $ENV_LIMITS TESSERA_GPU_REQUESTED=1
refused_with "inside a Tessera container" $ENV_LIMITS TESSERA_GPU_REQUESTED=
tenv $ENV_LIMITS total-is 2048                                      # and standalone still works
mkdir -p "$ROOT/run/tessera"
limits 0 "$U1 1024 0 0"
tenv $ENV_LIMITS total-is 1024                                      # the container's file wins

echo "== $variant: an MPS client's share comes from the limits file, not the environment"
reset
mkdir -p "$ROOT/mps" && : >"$ROOT/mps/control"
limits 0 "$U1 1024 0 0"
echo "mps 30 $ROOT/mps" >>"$ROOT/run/tessera/limits"
t mps 30 "$ROOT/mps" 0=1024M 30                                          # nothing set: the grant
tenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 mps 30 "$ROOT/mps" 0=1024M 30   # raised: the grant
tenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1e2 mps 30 "$ROOT/mps" 0=1024M 30
tenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=-5 mps 30 "$ROOT/mps" 0=1024M 30
tenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20 mps 20 "$ROOT/mps" 0=1024M 30    # lower: the tenant's
tenv CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=12.5 mps 12.5 "$ROOT/mps" 0=1024M 30
tenv CUDA_MPS_PIPE_DIRECTORY=/elsewhere mps 30 "$ROOT/mps" 0=1024M 30      # no other server
tenv CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G mps 30 "$ROOT/mps" 0=1024M 30
rm "$ROOT/mps/control"
t mps refused 2>/dev/null                                               # no MPS server: no CUDA

echo "== $variant: limits from the node agent's socket (no NRI); every failure fails closed"
SOCK=$ROOT/run/tessera/bind.sock
# agent <mode> [arg]: a stand-in for the agent's socket, answering every caller alike.
agent() {
	rm -f "$SOCK.ready"
	"$B/fake_agent" "$SOCK" "$@" &
	agent_pid=$!
	i=0
	while [ ! -e "$SOCK.ready" ]; do
		i=$((i + 1))
		[ $i -lt 200 ] || { echo "FAIL fake agent never listened"; exit 1; }
		sleep 0.05
	done
}
stop_agent() {
	kill $agent_pid
	wait $agent_pid 2>/dev/null || true
	rm -f "$SOCK.ready"
}
reset
printf 'version 1\ncgroup /tessera-test/%s-agent\ncontext-mib 64\ngpu %s 1024 0 0\n' "$variant" $U1 >"$ROOT/agent.limits"
printf 'version 1\ncgroup /standalone\ncontext-mib 0\ngpu %s 2048 0 0\n' $U1 >"$ROOT/alt.limits"
agent ok "$ROOT/agent.limits"
t alloc direct 64 1024 64
t meminfo 1024 64
t fork 1024 64
config "allow-env-limits yes"
tenv $ENV_LIMITS total-is 1024                                      # the agent wins over env limits
stop_agent
agent error "container \"main\" of pod team/train: it asks for tessera.dev/gpu but the pod has no assignment"
refused_with "the node agent refused: container \"main\" of pod team/train: it asks for"
stop_agent
agent silent
refused_with "closed the connection without an answer"
stop_agent
agent nofd
refused_with "came with 0 descriptors"
stop_agent
agent unsealed "$ROOT/agent.limits"
refused_with "did not come sealed"
stop_agent
printf 'version 1\ncgroup relative\ncontext-mib 0\ngpu %s 1024 0 0\n' $U1 >"$ROOT/bad.limits"
agent ok "$ROOT/bad.limits"
refused_with "the node agent's limits: "
stop_agent
refused_with "cannot reach the node agent"                           # socket left, agent gone
rm -f "$SOCK"
refused_with "inside a Tessera container" $ENV_LIMITS                # agent restarting: socket gone

echo "== $variant: compute pacing"
reset
limits 0 "$U1 81920 30 0"
for p in kernel kernel-ptsz ex coop graph grid grid-async multi; do
	t pace $p 30 0.6
done
# A multi-device launch's entry is paced on its stream's GPU, not the current
# context's: the first GPU unpaced and current, the entry on the second's stream.
limits 0 "$U3 81920 0 0" "$U1 81920 30 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/multi-other|" "$ROOT/run/tessera/limits"
t pace multi-other 30 0.6
limits 0 "$U1 81920 30 0"
t pace long 30 1.2                     # kernels longer than the allowance: owed, not free
# ... from the program's first launch on: its first kernels run before the first sample
# is read (the hook waits for it), and the launch after that wait finds its stream
# idle by the hook's doing, not its host's. Taken for the GPU waiting on the host (the
# kernel model's gap test), the first burst's 40 ms overrun went unowed: 25.0-25.3 %
# at cap 20 over 1 s, 21.6 % owed.
limits 0 "$U1 81920 20 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/long-first|" "$ROOT/run/tessera/limits"
timed t pace long 20 1.0 0 23.5
limits 0 "$U1 81920 30 0"
# Kernels of two lengths charged their mean. Timed: in about one run in 50 the class
# estimate stayed on the short kernels while a slow host's chained bursts went
# uncounted, 38-40 % here and 38.1 % once on CI (docs/cuda-hook.md, Known gaps:
# launches charged under their GPU time by a host that keeps about the GPU's pace).
timed t pace mixed 30 0.8
# The same mix from a host at about the GPU's pace (130 us of host work after each
# launch; 98.9 % of the GPU alone), the queue shallow, with the kernel model. With one
# launch sample in flight, a launch due while it ran went unsampled and the first due
# after it was sampled, so long samples taken were few and set aside as turns, and the
# wait bound took the bursts' unproved time for the host's: 40-45 % at cap 30. With
# samples in flight side by side, 31-34 %.
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/hostmix|" "$ROOT/run/tessera/limits"
charge_kernel
timed t pace hostmix130 30 1.5 0 37
limits 0 "$U1 81920 30 0"
# near_alone <container> <path> <cores> <seconds> <margin>: pace-near in a container
# of its own (its cgroup line), which starts with nothing owed or learnt before.
near_alone() {
	limits 0 "$U1 81920 $3 0"
	sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/$1|" "$ROOT/run/tessera/limits"
	shift
	timed t pace-near "$@"
}
# Kernels of very different lengths under one estimate (launches without a handle),
# alone: 20 us and 1 ms at 7:1 with a synchronize every 40 launches (mixedsync), and
# 20 us with one of 2 ms every 100th launch, which few samples meet (rare2000). Their
# long samples were set aside as another context's turns, bursts that spanned a
# synchronize were never owed, and what bursts ran over their samples was let go as
# turns: mixedsync 99 % at cap 50 under the class model (56-59 % under the kernel
# model), rare2000 55 %. The probes now say whose time it was, and a wait bounds a
# burst's GPU time from below (docs/cuda-hook.md).
near_alone mixedsync mixedsync 50 1.5 5
near_alone rare rare2000 50 1.5 3
# ... and over 4 s at cap 80, where the class model's low charge lets mixedsync's
# bursts span periods: a refill that found tokens left kept one period's allowance
# and the burst then owed all it ran (68-74 %); what the refills dropped while a
# counted burst ran is now set against what it owes.
near_alone mixedsync80 mixedsync 80 4 5
# 20 us kernels with every eighth one of 1 ms at a grid never launched before: each
# long kernel is charged its class's estimate, the tokens last while the host blocks in
# its launches on a full queue, and such bursts were neither back to back nor bounded:
# 96-100 % at cap 80, now chained after two periods and owed.
near_alone fresh fresh1000 80 1.5 6
limits 0 "$U1 81920 30 0"
# Steps of one 1 ms kernel and 40 of 20 us, from different functions, each ending in
# a synchronize (an attention training step's shape): the long kernels are 56 % of
# the GPU time and 2.4 % of the launches. The GPU-time share at cap 25 must be within
# 3 points in both charge models. The class estimator (no charge line) charged each
# launch its class's mean, with samples over 3x it set aside, and ran 44.5 %; it holds
# since the probes tell a long sample of its own from another context's turn and a
# synchronize bounds a burst's GPU time from below. Per-kernel charges hold it by
# each function's own samples.
limits 0 "$U1 81920 25 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/attn-class|" "$ROOT/run/tessera/limits"
timed t pace-near attn1000 25 1.5 3
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/attn|" "$ROOT/run/tessera/limits"
charge_kernel
timed t pace-near attn1000 25 1.5 3
# The same with a launch latency of 10 us on an idle queue (a sample on an idle stream
# reads it too): the bursts bring the entries' level down through their class's gain.
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/attn-latency|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_LAUNCH_NS=10000 pace-near attn1000 25 1.5 3
# A launch-bound step of 200 functions of 5 us, the GPU about a fifth busy, each
# function's first launch 500 us longer (a cold first launch: real GPU time, and
# owed). Under cap 50 with per-kernel charges, past those first launches, no kernel's
# entry may keep its cold launch (each rests on two samples or more: at most 3x the
# kernel's 5 us, which the samples read with the fake's host time), and the program
# must run as it does unpaced (about 18-20 %; at least 10 % is wanted, a loaded
# machine deschedules the host's 20 us between launches). Entries that were the mean
# of their first samples read 20 us and more after seconds.
limits 0 "$U1 81920 50 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/cold|" "$ROOT/run/tessera/limits"
cold_check() {
	local out worst
	out=$(FAKE_CUDA_COLD_US=500 TESSERA_HOOK_LOG=debug LD_PRELOAD="$PRELOAD" "$T" pace cold200 50 1.5 10 2>&1) || {
		echo "$out" | grep -v "pacing burst" | tail -3
		return 1
	}
	echo "$out" | grep "^pace "
	worst=$(echo "$out" | sed -n 's/.*pacing summary kernel=.* estimate_ns=\([0-9]*\) samples=\([0-9]*\) .*/\1 \2/p' |
		awk '$2 >= 2 && $1 > m {m = $1} END {print m + 0}')
	echo "   longest entry of a kernel of 5 us: $worst ns"
	[ "$worst" -gt 0 ] && [ "$worst" -le 15000 ] || {
		echo "FAIL a kernel's entry kept its cold first launch: $worst ns for a kernel of 5 us"
		return 1
	}
	pass=$((pass + 1))
}
timed cold_check
# 200 us kernels on two streams at once (the fake's FAKE_CUDA_STREAMS runs them
# overlapped): each launch is charged its own length, together twice the GPU time they
# take; bursts measured over both streams bring the gain down to it (13.0 % at cap 25
# and 25.6 % at 50 when a burst of two streams was not measured). With the charge line:
# the class estimator neither charges per kernel nor measures bursts of two streams.
for c in 25 50; do
	limits 0 "$U1 81920 $c 0"
	charge_kernel
	sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/streams$c|" "$ROOT/run/tessera/limits"
	timed tenv FAKE_CUDA_STREAMS=1 pace-near streams200 $c 1.5 3
done
# The same at cap 50, and the attention-shaped steps at cap 25, with a launch latency
# of 30 us on an idle queue: after each synchronize the GPU idles until the next
# kernel starts. A burst that spans the synchronize bills that idle time as the
# program's GPU time; with per-kernel charges bursts end at the program's
# synchronizes. Bursts across them read 44.1 % (streams, cap 50) and 22.3 % (attention,
# cap 25).
limits 0 "$U1 81920 50 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/streams-latency|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_STREAMS=1 FAKE_CUDA_LAUNCH_NS=30000 pace-near streams200 50 1.5 3
# The same program waiting by polling instead of synchronizing: a query that finds
# the work done ends the burst as a synchronize does (an event per stream queried,
# TensorFlow's way, and each stream queried). Bursts across the polls read 44.1 % in
# both.
for w in e s; do
	limits 0 "$U1 81920 50 0"
	charge_kernel
	sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/poll$w-latency|" "$ROOT/run/tessera/limits"
	timed tenv FAKE_CUDA_STREAMS=1 FAKE_CUDA_LAUNCH_NS=30000 pace-near poll${w}200 50 1.5 3
done
# ... and reading a result back with a synchronous copy, which waits for the work
# queued before it as a synchronize does. Bursts across the copies read 44.2 %.
limits 0 "$U1 81920 50 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/copy-latency|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_STREAMS=1 FAKE_CUDA_LAUNCH_NS=30000 pace-near copy200 50 1.5 3
limits 0 "$U1 81920 25 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/attn-sync|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_LAUNCH_NS=30000 pace-near attn1000 25 1.5 3
# The attention-shaped step whose host issues its short kernels slower than the GPU
# runs them, so that the GPU waits for it about a tenth of the step, and whose long
# kernel is still queued at the synchronize, with events that take 1 us of the queue
# (on an idle stream a sample's start event has then not run when its launch
# returns): the queue at F made such bursts pass for back to back, their idle gaps
# were owed and moved the gain up (1.116), and the step got 45.0 % at cap 50, which
# it needs 88 % of. Bursts in which a launch sample finds the GPU waiting for the
# host are not back to back. At cap 80 with events of 3 us, whose time its short
# kernels' samples read too and which no burst's gain takes out then, it got 72.2 %,
# and 74.9 % with the gap test alone: the events' own time is measured (the debug
# summary's event_ns, within a fifth of 3 us) and taken out of the samples.
limits 0 "$U1 81920 50 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/slowhost50|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_EVENT_NS=1000 pace-near slowhost1000 50 1.5 3
limits 0 "$U1 81920 80 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/slowhost80|" "$ROOT/run/tessera/limits"
# slowhost_check <event-ns> <cap> [<VAR=value>...]: the step at cap, its events' own
# time measured within a fifth.
slowhost_check() {
	local out ev e=$1 c=$2
	shift 2
	out=$(env "$@" FAKE_CUDA_EVENT_NS=$e TESSERA_HOOK_LOG=debug LD_PRELOAD="$PRELOAD" "$T" pace-near slowhost1000 $c 1.5 3 2>&1) || {
		echo "$out" | grep -v "pacing burst" | tail -3
		return 1
	}
	echo "$out" | grep "^pace-near "
	ev=$(echo "$out" | sed -n 's/.*pacing summary kernel_gain=.* event_ns=\([0-9]*\) .*/\1/p')
	echo "   the events' own time measured: ${ev:-none} ns ($e in the fake)"
	[ -n "$ev" ] && [ "$ev" -ge $((e * 4 / 5)) ] && [ "$ev" -le $((e * 6 / 5)) ] || {
		echo "FAIL the events' own time read ${ev:-nothing}, want $e ns within a fifth"
		return 1
	}
	pass=$((pass + 1))
}
timed slowhost_check 3000 80
# The same step beside another context's turns (1.5 ms of every 20), with events of
# 1 us whose records return 1.5 us after queueing them: a pair recorded on a drained
# stream then runs apart and is not read, so the events' time is read from pairs
# behind launch samples' kernels, also while another context is seen. Read only
# behind kernels queued behind others, and only while no other context was seen, it
# had no reading: its idle samples held the events' time (on an H100, an LLM step's
# decode kernels were charged 1.23x their time).
limits 0 "$U1 81920 50 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/slowhost-other|" "$ROOT/run/tessera/limits"
timed slowhost_check 1000 50 FAKE_CUDA_CALL_NS=1500 FAKE_CUDA_OTHER=1000,1500,20000
# A training step whose backward pass another thread launches while the step's own
# thread waits for it, then synchronizes (PyTorch's autograd engine): a burst holds
# both threads' launches and is charged what all of them were charged. Charged only
# the launches of the thread that opened it, the bursts read 4x their charge, the
# gain rose to 2.06 and the step ran 19.6 % at cap 25 and 37.5 % at 50 (on an H200
# the same cause took the gain down, to 0.57, and attention at cap 50 to 72 %).
for c in 25 50; do
	limits 0 "$U1 81920 $c 0"
	charge_kernel
	sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/backward$c|" "$ROOT/run/tessera/limits"
	timed t pace-near bwd1000 $c 1.5 3
done
limits 0 "$U1 81920 30 0"
# 10 us kernels whose samples read 2 us of event time more than the kernels take back
# to back: the bursts give the difference back, and it is not lost to the refill's cap
# (it was: 74.6 % at cap 80 on an H200).
limits 0 "$U1 81920 80 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/small|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_EVENT_NS=2000 pace small 80 0.8 77
# A cap is a share of the GPU's time a container holds, the GPU's own gaps between its
# back-to-back kernels included: 10 us kernels each 3 us behind the one before get 50 %
# of the GPU, their kernels about 38 %. Capped by kernel time, they would hold 65 %.
limits 0 "$U1 81920 50 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/gaps|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_GAP_NS=3000 pace-near small 50 1.5 3
# A host-bound step of 5 us kernels, its host busy 20 us after each launch (the GPU
# about a fifth busy: no burst of it runs back to back, so it is held to what its
# launch samples say), on a driver whose launches and event records return 1.5 us
# after queueing their work and whose idle queue starts a kernel 1 us after its
# launch. A sample that finds its stream idle has the host's time to issue its
# launch taken out; read after the end event's record, that time held the record's
# 1.5 us too, in which the kernel runs: the 5 us kernels were charged 2.7 us, and
# the step ran 18.2-19.3 % at cap 10, about as unpaced (22 %); 4.3 us and 11.4-11.9 %
# once read before it, the rest being the events' own time, which a pair of events
# recorded on a drained stream read as the host's time between the two records (1.7
# us for 1); 8.1-8.3 % now that such pairs are not read (the idle samples hold the
# fake's 1 us launch latency).
limits 0 "$U1 81920 10 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/host-calls|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_CALL_NS=1500 FAKE_CUDA_LAUNCH_NS=1000 FAKE_CUDA_EVENT_NS=1000 pace cold4 10 1.5 5 14
# A decode step's 5 us kernels, each function launched mostly on an idle stream and
# a fifth of the time queued behind the step's own kernels, on a GPU that starts a
# kernel queued right behind an event 2 us late (an event's record runs once the work
# before it has ended, and the kernel after it starts afresh): the samples queued
# behind work read 7 us, those on an idle stream 5. Charged the queued samples' mean
# in place of the idle ones' (as kernels sampled both ways were, on an H100 charging
# an LLM step 13 % over its kernel time and holding it 7 points under its cap at 50),
# the step got 19.3-21.2 % at cap 25; each sample now counts for what it read (23.6).
limits 0 "$U1 81920 25 0"
charge_kernel
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/decode|" "$ROOT/run/tessera/limits"
timed tenv FAKE_CUDA_FENCE_NS=2000 pace-near decode5 25 1.5 3
# A container alone whose probes of its turns on the GPU (pacing's residency probes,
# run in its first samples) include record calls that returned late, as a descheduled
# thread's do: such a probe must not set the usual lag, or every later probe reads as
# waiting for another context and the launches as shorter than they are (76 % at cap
# 50 here, 69.4 % on an H200, before). On the fake's time-sliced GPU, alone.
limits 0 "$U1 81920 50 0"
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/slow-probes|" "$ROOT/run/tessera/limits"
rm -f "$ROOT/gpu1"
FAKE_CUDA_SLOW_SIDE_RECORD=200 FAKE_CUDA_SHARED_GPU="$ROOT/gpu1" LD_PRELOAD="$PRELOAD" "$T" pace k5000 50 1.5
pass=$((pass + 1))
limits 0 "$U1 81920 30 0"
t capture
limits 0 "$U1 81920 60 20"
t pace kernel 60 0.6
limits 0 "$U1 81920 50 0"
t pace-procs 2 50 0.8                  # two processes of one container share its 50%
t light 50 0.6                         # a program needing 20% is not slowed at 50%
limits 0 "$U1 81920 15 0"
timed t light 15 0.8                   # held at 15%, it gets 15%: its host time is not owed
limits 0 "$U1 81920 20 0"
timed t pace-shift 20 1.5              # short launches after long kernels are not held at 20%
limits 0 "$U1 81920 30 0"
# A pause with the stream idle right after a container's first launch is not billed
# (a fresh container: its region has no tokens left by the checks above).
sed -i "s|^cgroup .*|cgroup /tessera-test/$variant/pause|" "$ROOT/run/tessera/limits"
timed t pace-pause 30 0.5 0.8
limits 0 "$U1 81920 30 0"
# Another context holds the GPU 1.5 ms of every period, inside this one's bursts.
timed tenv FAKE_CUDA_OTHER=1000,1500,20000 pace-turns 30 0.8
# Two containers at 30/70 on one GPU that runs them in 2 ms turns (the fake's
# FAKE_CUDA_SHARED_GPU), and two at 50/50: each gets its share (4 points allowed for
# a loaded machine; billing the other's turns gave 25 / 65.5).
rm -rf "$ROOT/run/tessera"
config "allow-env-limits yes"
# beside <cores a> <phase a> <cores b> <phase b> "<scenario a>" "<scenario b>": two
# containers (fresh regions) at once on one simulated GPU; fails if either fails.
beside_n=0
BESIDE_DEFAULT=
[ "$CHARGE" = class ] || BESIDE_DEFAULT='charge kernel\n'
beside() {
	beside_n=$((beside_n + 1))
	printf 'version 1\ncgroup /pair/%s/a\ncontext-mib 0\n%bgpu %s 81920 %s %s\n' $beside_n "${BESIDE_CHARGE:-$BESIDE_DEFAULT}" $U1 $1 $2 >"$ROOT/a.limits"
	printf 'version 1\ncgroup /pair/%s/b\ncontext-mib 0\n%bgpu %s 81920 %s %s\n' $beside_n "${BESIDE_CHARGE:-$BESIDE_DEFAULT}" $U1 $3 $4 >"$ROOT/b.limits"
	rm -f "$ROOT/gpu"
	# shellcheck disable=SC2086 # each scenario is words
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/a.limits LD_PRELOAD="$PRELOAD" "$T" $5 &
	a=$!
	# shellcheck disable=SC2086
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/b.limits LD_PRELOAD="$PRELOAD" "$T" $6 &
	b=$!
	ra=0
	rb=0
	wait $a || ra=$?
	wait $b || rb=$?
	[ $ra = 0 ] && [ $rb = 0 ]
}
# pair <cores a> <phase a> <cores b> <phase b>: both tenants saturating; fails if
# either misses its share.
pair() {
	beside $1 $2 $3 $4 "pace-share $1 2" "pace-share $3 2"
}
for p in "30 0 70 30" "50 0 50 50"; do
	timed pair $p
	pass=$((pass + 2))
done
# Two attention-shaped tenants (a 1 ms kernel among 40 of 20 us, a synchronize a step)
# at 30/70 and 50/50 with per-kernel charges, on a GPU that runs them in 2 ms turns:
# each burst ends at the step's synchronize and the next opens at the next launch,
# and each tenant gets its share (4 points allowed, as for the pairs above).
charge_pair() {
	BESIDE_CHARGE='charge kernel\n' beside $1 $2 $3 $4 "pace-near attn1000 $1 2 4" "pace-near attn1000 $3 2 4"
}
for p in "30 0 70 30" "50 0 50 50"; do
	timed charge_pair $p
	pass=$((pass + 2))
done
# Two graph + eager steps (gmix40: a 40 us replay, then six 5 us kernels each after
# 40 us of host work, and a synchronize; about 18 % of the GPU alone) at 30/70 on a GPU
# whose events, first on a drained queue, run outside their context's turn
# (FAKE_CUDA_EARLY_EVENTS, as an H100 ran PyTorch's graph + eager step): each needs
# less than its cap and is not held for replays whose samples hold the other's turn.
# Without the lead-in before a graph launch's sample (pace_measure.c) the 30 % tenant's
# replay entry read 225 us, it was held and got 7.4 %; 14.5-16.1 with it, against
# 17.5-18.1 for the unhooked pair's.
graph_pair() {
	(
		export FAKE_CUDA_EARLY_EVENTS=1 FAKE_CUDA_SWITCH_US=120
		BESIDE_CHARGE='charge kernel\n' beside 30 0 70 30 "pace gmix40 30 1.5 10" "pace gmix40 70 1.5 10"
	)
}
timed graph_pair
pass=$((pass + 2))
# Kernels of 10 ms, five time slices each: every one is cut by the other's turns, which
# its launch samples read as its own unless the context's turns are probed (44.4 / 45.0
# here before the probes, and 31.6 / 31.6 with 20 ms kernels on an H200).
timed beside 50 0 50 50 "pace-share 50 2.5 k10000" "pace-share 50 2.5 k10000"
pass=$((pass + 2))
# A light container (it needs 20 %) beside a saturating one is not held under its
# 30 %: the last kernels of its bursts wait for the other's turns, and such a burst,
# which spans its host's work, must not read as back to back (it did: the light one's
# host work got 39 % of the time, owing 114 ms in 2 s). The saturating one's share
# is not checked here: the light one's switches cost it.
timed beside 30 0 70 30 "light 30 1.5" "pace kernel 70 1.5"
pass=$((pass + 2))
# A work-conserving container saturating alone takes the idle GPU (at least 80 % at
# cores 30); the other container, started after that, gets its 70 % and the first is
# held to its 30 % again.
wc_pair() {
	beside_n=$((beside_n + 1))
	printf 'version 1\ncgroup /pair/%s/a\ncontext-mib 0\n%bgpu %s 81920 30 0\nwork-conserving\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
	printf 'version 1\ncgroup /pair/%s/b\ncontext-mib 0\n%bgpu %s 81920 70 30\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/b.limits"
	rm -f "$ROOT/gpu"
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/a.limits LD_PRELOAD="$PRELOAD" "$T" pace-wc 30 1 3 &
	a=$!
	sleep 1.3
	ra=0
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/b.limits LD_PRELOAD="$PRELOAD" "$T" pace-share 70 2.5 || ra=$?
	wait $a || ra=$?
	[ $ra = 0 ]
}
timed wc_pair
pass=$((pass + 2))
# With short kernels (100 us, not probed for themselves), and again after the GPU was
# the first container's alone for a while: a second container for 1.5 s, and after it
# a third. Each must get its 70 %; the first is well under what it would take had it
# not made room (75 %) over the whole of its second window.
wc_trio() {
	beside_n=$((beside_n + 1))
	printf 'version 1\ncgroup /pair/%s/a\ncontext-mib 0\n%bgpu %s 81920 30 0\nwork-conserving\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
	printf 'version 1\ncgroup /pair/%s/b\ncontext-mib 0\n%bgpu %s 81920 70 30\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/b.limits"
	printf 'version 1\ncgroup /pair/%s/c\ncontext-mib 0\n%bgpu %s 81920 70 30\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/c.limits"
	rm -f "$ROOT/gpu"
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/a.limits LD_PRELOAD="$PRELOAD" "$T" pace-wc 30 1 7 k100 55 &
	a=$!
	sleep 1.3
	ra=0
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/b.limits LD_PRELOAD="$PRELOAD" "$T" pace-share 70 1.2 k100 || ra=$?
	sleep 2.6
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/c.limits LD_PRELOAD="$PRELOAD" "$T" pace-share 70 1.5 k100 || ra=$?
	wait $a || ra=$?
	[ $ra = 0 ]
}
timed wc_trio
pass=$((pass + 3))
# GPU turns (the node's turn file for the GPU, which the agent provides): kernels of
# 20 ms, ten time slices each, on a GPU whose context switch costs 160 us, where two
# busy contexts in turns lose 8 % of the GPU as on an H200. Without the turn file the
# pair at 50/50 got 44.6 / 41.0 % here, at 30/70 27.1 / 66.1 %.
turns_pair() {
	rm -f "$ROOT/turns/$U1"
	truncate -s 4096 "$ROOT/turns/$U1"
	FAKE_CUDA_SWITCH_US=160 beside "$@"
}
timed turns_pair 50 0 50 50 "pace-share 50 3 k20000" "pace-share 50 3 k20000"
timed turns_pair 30 0 70 30 "pace-share 30 3 k20000" "pace-share 70 3 k20000"
pass=$((pass + 4))
# A turn file left holding a word far ahead (from before a reboot, whose clock
# started again): void, the pair takes turns as in a new file (had they waited on it,
# each would have given up and been time-sliced: 44.6 / 41.0 at 50/50).
stale_pair() {
	rm -f "$ROOT/turns/$U1"
	truncate -s 4096 "$ROOT/turns/$U1"
	"$T" turn-hog "$ROOT/turns/$U1" 0 3600
	FAKE_CUDA_SWITCH_US=160 beside "$@"
}
timed stale_pair 50 0 50 50 "pace-share 50 3 k20000" "pace-share 50 3 k20000"
pass=$((pass + 2))
# A saturating container at 30 beside an LLM-shaped step at 70 (llm250: a prefill of
# long kernels, then decode steps after host work), the GPU's turn file there: the
# step's host gaps keep it in tokens, so it is rarely held, keeps to no slot and never
# forfeits, and its prefill lands in the other's slot, whose bursts spill for it.
# Forfeiting such spills less half of the other's turns took the 30 % tenant to
# 25.2-25.9 here; slot bursts that forfeit often are let off all of the turns where
# no other container on the GPU says its own forfeit often (pacing.c,
# forfeit_frequent): 28.0-28.6.
forfeit_pair() {
	rm -f "$ROOT/turns/$U1"
	truncate -s 4096 "$ROOT/turns/$U1"
	beside "$@"
}
timed forfeit_pair 30 0 70 30 "pace-share 30 2 k1000" "pace llm250 70 2"
pass=$((pass + 2))
# A tenant that takes the turn and never lets go costs a container of 20 ms kernels
# its wait (100 ms) once: it is then time-sliced with the others' work for 30 s.
rm -f "$ROOT/turns/$U1"
truncate -s 4096 "$ROOT/turns/$U1"
"$T" turn-hog "$ROOT/turns/$U1" 4 &
hog=$!
printf 'version 1\ncgroup /turns/hogged\ncontext-mib 0\n%bgpu %s 81920 50 0\n' "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
timed env TESSERA_LIMITS_FILE="$ROOT/a.limits" LD_PRELOAD="$PRELOAD" "$T" pace-share 50 2 k20000
wait $hog
pass=$((pass + 1))
rm -f "$ROOT/turns/$U1"

echo "== $variant: reserved compute: a container without cores is paced to what is not reserved"
# Reserved compute is a guarantee: a container granted no cores on a GPU whose share
# directory the node agent mounted is paced to the share its file gives (what the
# reservations leave), and follows it while it runs. Without it, the container beside
# a 70 % reservation was time-sliced with it and took half the GPU.
S1=$ROOT/shares/$U1
mkdir -p "$S1"
share() {
	printf 'version 1\nreserved %s\ncontainers 1\nshare %s\nphase %s\n' "$1" "$2" "$3" >"$S1/share"
}
# Beside a saturating 70 % container, the one without cores is held to 30 % and the
# 70 % container gets its 70 (floors that a loaded machine leaves room under: 20 and
# 60; unpaced, the one without cores took half the GPU and left the other half).
share 70 30 70
timed beside 0 0 70 0 "pace kernel 30 2 20" "pace kernel 70 2 60"
pass=$((pass + 2))
# Alone with nothing reserved: not paced.
share 0 100 0
printf 'version 1\ncgroup /share/alone\ncontext-mib 0\n%bgpu %s 81920 0 0\n' "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
tenv TESSERA_LIMITS_FILE="$ROOT/a.limits" pace kernel 0 1
# It follows the file: arrivals, departures, a malformed file (the last share kept).
printf 'version 1\ncgroup /share/follow\ncontext-mib 0\n%bgpu %s 81920 0 0\n' "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
timed tenv TESSERA_LIMITS_FILE="$ROOT/a.limits" pace-follow "$S1/share"
# As B4's phases move it: half-second phases, each capped one at the cap from its start
# (a saturating loop; and a host-paced LLM step needing about 77 %, under the kernel
# model, which B4 runs: the class model runs such a step over its cap, 76.5-77.1 % at
# 50, docs/cuda-hook.md "Known gaps").
printf 'version 1\ncgroup /share/phases\ncontext-mib 0\n%bgpu %s 81920 0 0\n' "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
timed tenv TESSERA_LIMITS_FILE="$ROOT/a.limits" pace-phases "$S1/share" kernel 25
printf 'version 1\ncgroup /share/phases-llm\ncontext-mib 0\ncharge kernel\ngpu %s 81920 0 0\n' $U1 >"$ROOT/a.limits"
timed tenv TESSERA_LIMITS_FILE="$ROOT/a.limits" pace-phases "$S1/share" llm250 50
# No valid file ever read: the least share (1 %), never unpaced.
rm -f "$S1/share"
printf 'version 1\ncgroup /share/missing\ncontext-mib 0\n%bgpu %s 81920 0 0\n' "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
tenv TESSERA_LIMITS_FILE="$ROOT/a.limits" pace kernel 1 1
# Work-conserving (its pod's annotation) takes the idle GPU alone and is held to the
# unreserved 30 % once the 70 % container has work, which gets at least 60 (unpaced,
# the work-conserving one took 62 % and left it 38): an opt-in to idle time, not out
# of the reservations.
wc_unreserved() {
	beside_n=$((beside_n + 1))
	share 70 30 70
	printf 'version 1\ncgroup /pair/%s/a\ncontext-mib 0\n%bgpu %s 81920 0 0\nwork-conserving\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/a.limits"
	printf 'version 1\ncgroup /pair/%s/b\ncontext-mib 0\n%bgpu %s 81920 70 0\n' $beside_n "$BESIDE_DEFAULT" $U1 >"$ROOT/b.limits"
	rm -f "$ROOT/gpu"
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/a.limits LD_PRELOAD="$PRELOAD" "$T" pace-wc 30 1 3 &
	a=$!
	sleep 1.3
	ra=0
	FAKE_CUDA_SHARED_GPU=$ROOT/gpu TESSERA_LIMITS_FILE=$ROOT/b.limits LD_PRELOAD="$PRELOAD" "$T" pace kernel 70 2.5 60 || ra=$?
	wait $a || ra=$?
	[ $ra = 0 ]
}
timed wc_unreserved
pass=$((pass + 2))
rm -rf "$ROOT/shares"
mkdir -p "$ROOT/run/tessera"
limits 0 "$U1 81920 0 0"
t pace kernel 0 0.3

echo "== $variant: $pass checks passed"
