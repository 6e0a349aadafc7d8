#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# The GPU suite's saturating pairs (gpu/pace.cu's FMA kernels, as run-tests.sh runs
# them) under several builds of the hook in one run, turn by turn, for a pacing change
# that the suite's pairs must not move:
#
#   gpu/pairs-ab.sh <build> <hook.so>...
#
# <build> is where the GPU programs are built (and the unhooked rate read); each
# <hook.so> is a build of libtessera-cuda.so (make BUILD=...). For each hook, in
# PAIRS_ROUNDS rounds (2): the 30 / 70 pair (phases 0 and 30, 6 s, debug logs kept in
# $OUT or <build>/gpu as pair-<n>-<round>-{a30,b70}.log, the pacing summaries of
# the last lines printed) and the 50 / 50 pair (4 s); each tenant's rate as a
# percentage of one unhooked process's. It measures and reports; it asserts nothing.
. "$(dirname "$0")/common.sh" "$1"
shift
[ $# -ge 1 ] || { echo "usage: gpu/pairs-ab.sh <build> <hook.so>..." >&2; exit 2; }
nvcc -O2 -arch=sm_90 "$HERE/gpu/pace.cu" -o "$G/pace" || exit 1
rate() { awk -F'rate=' '/rate=/{print $2}'; }
pct() { awk -v r="$(rate <"$1")" -v b="$base" 'BEGIN{printf "%.1f", 100 * r / b}'; }
base=$("$G/pace" rate kernel 4 | rate)
echo "unhooked: $base kernels/s"
"$G/pace" rate kernel 4 >"$G/ab-u1" &
"$G/pace" rate kernel 4 >"$G/ab-u2"
wait
echo "two unhooked processes: $(pct "$G/ab-u1") / $(pct "$G/ab-u2") % of one's rate"
limits "$G/ab-a30" 130000 30 0 /gpu-test/ab-a
limits "$G/ab-b70" 130000 70 30 /gpu-test/ab-b
limits "$G/ab-c50" 130000 50 0 /gpu-test/ab-c
limits "$G/ab-d50" 130000 50 50 /gpu-test/ab-d
for round in $(seq "${PAIRS_ROUNDS:-2}"); do
	n=0
	for lib in "$@"; do
		n=$((n + 1))
		[ -f "$lib" ] || { echo "no $lib" >&2; exit 1; }
		log=$RES/pair-$n-$round
		TESSERA_HOOK_LOG=debug TESSERA_LIMITS_FILE=$G/ab-a30 LD_PRELOAD=$lib "$G/pace" rate kernel 6 >"$G/ab-a.out" 2>"$log-a30.log" &
		TESSERA_HOOK_LOG=debug TESSERA_LIMITS_FILE=$G/ab-b70 LD_PRELOAD=$lib "$G/pace" rate kernel 6 >"$G/ab-b.out" 2>"$log-b70.log"
		wait
		echo "hook $n ($lib) round $round: 30 / 70 $(pct "$G/ab-a.out") / $(pct "$G/ab-b.out")"
		grep -h "pacing summary charged_ns" "$log-a30.log" "$log-b70.log"
		TESSERA_LIMITS_FILE=$G/ab-c50 LD_PRELOAD=$lib "$G/pace" rate kernel 4 >"$G/ab-a.out" &
		TESSERA_LIMITS_FILE=$G/ab-d50 LD_PRELOAD=$lib "$G/pace" rate kernel 4 >"$G/ab-b.out"
		wait
		echo "hook $n ($lib) round $round: 50 / 50 $(pct "$G/ab-a.out") / $(pct "$G/ab-b.out")"
	done
done
