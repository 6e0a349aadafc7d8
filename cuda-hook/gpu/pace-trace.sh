#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# What pacing charges each kernel against what the profiler says it takes, for a
# workload class that a cap holds too much or too little:
#
#   make BUILD=build/trace HOOK_CFLAGS=-DTESSERA_PACE_TRACE
#   gpu/pace-trace.sh build/trace
#
# For each of TRACE_CLASSES (gpu/torch_work.py workloads; convnet llm attn mlp; none
# where it is set empty, for a pair's traces alone): the profiler's kernels by name
# (unhooked), the solo rate, then the rate under the
# diagnostic hook at each of TRACE_CAPS (25) with each charge model of TRACE_CHARGES
# (kernel class), with its trace (src/pace_trace.h: per kernel, launches, what they
# were charged, and what its samples read) and the hook's pacing summary; and for each
# of TRACE_PAIRS (attn), two tenants of it at 30 / 70, their rates and summaries (GPU
# turns taken, waited for, handed over). Results, with each run's debug log (every
# burst and the pacing summary), in $OUT (or <build>/gpu)/trace/; gpu/pace-trace.py sets
# the profiler's kernels and the traces side by side.
. "$(dirname "$0")/common.sh" "$1"
T=$RES/trace
mkdir -p "$T"
S=${TRACE_SECONDS:-3}
TW="python3 $HERE/gpu/torch_work.py"
for w in ${TRACE_CLASSES-convnet llm attn mlp}; do
	TESSERA_BENCH_KERNELS=1 $TW 1 $w >"$T/$w.kernels" || echo "$w: profiler failed"
	$TW "$S" $w >"$T/$w.solo" || echo "$w: solo run failed"
	for c in ${TRACE_CAPS:-25}; do
		for ch in ${TRACE_CHARGES:-kernel class}; do
			r=$w.$c.$ch
			TESSERA_BENCH_CHARGE=$ch limits "$G/$r.limits" 130000 $c 0 "/trace/$w/$c/$ch"
			rm -f "$T/$r.trace"
			TESSERA_PACE_TRACE=$T/$r.trace TESSERA_HOOK_LOG=debug hooked "$G/$r.limits" $TW "$S" $w >"$T/$r.rate" 2>"$T/$r.log" ||
				echo "$r: hooked run failed"
			echo "$r: $(cat "$T/$r.rate") solo: $(cat "$T/$w.solo")"
		done
	done
done
for w in ${TRACE_PAIRS-attn}; do
	[ -f "$T/$w.solo" ] || $TW "$S" $w >"$T/$w.solo"
	for ch in ${TRACE_CHARGES:-kernel class}; do
		rm -rf "$G/bar.$w.$ch"
		pids=()
		for spec in 30:0 70:30; do
			r=$w.pair${spec%%:*}.$ch
			TESSERA_BENCH_CHARGE=$ch limits "$G/$r.limits" 130000 ${spec%%:*} ${spec#*:} "/trace/$w/pair/$ch/${spec%%:*}"
			rm -f "$T/$r.trace"
			TESSERA_BENCH_BARRIER="$G/bar.$w.$ch:2" TESSERA_PACE_TRACE=$T/$r.trace TESSERA_HOOK_LOG=debug \
				hooked "$G/$r.limits" $TW "$S" $w >"$T/$r.rate" 2>"$T/$r.log" &
			pids+=($!)
		done
		for p in "${pids[@]}"; do wait $p || echo "$w pair $ch: a tenant failed"; done
		for c in 30 70; do
			echo "$w.pair$c.$ch: $(cat "$T/$w.pair$c.$ch.rate") solo: $(cat "$T/$w.solo")"
		done
	done
done
