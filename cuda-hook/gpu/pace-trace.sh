#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# What pacing charges each kernel against what the profiler says it takes, for a
# workload class that a cap holds too much or too little:
#
#   make BUILD=build/trace HOOK_CFLAGS=-DTESSERA_PACE_TRACE
#   gpu/pace-trace.sh build/trace
#
# For each of TRACE_CLASSES (gpu/torch_work.py workloads; convnet llm attn mlp): the
# profiler's kernels by name (unhooked), the solo rate, then the rate under the
# diagnostic hook at each of TRACE_CAPS (25) with each charge model of TRACE_CHARGES
# (kernel class), with its trace (src/pace_trace.h: per kernel, launches, what they
# were charged, and what its samples read) and the hook's pacing summary. Results in
# $OUT (or <build>/gpu)/trace/; gpu/pace-trace.py sets the two side by side.
. "$(dirname "$0")/common.sh" "$1"
T=$RES/trace
mkdir -p "$T"
S=${TRACE_SECONDS:-3}
TW="python3 $HERE/gpu/torch_work.py"
for w in ${TRACE_CLASSES:-convnet llm attn mlp}; do
	TESSERA_BENCH_KERNELS=1 $TW 1 $w >"$T/$w.kernels" || echo "$w: profiler failed"
	$TW "$S" $w >"$T/$w.solo" || echo "$w: solo run failed"
	for c in ${TRACE_CAPS:-25}; do
		for ch in ${TRACE_CHARGES:-kernel class}; do
			f=$w.$c.$ch
			TESSERA_BENCH_CHARGE=$ch limits "$G/$f.limits" 130000 $c 0 "/trace/$w/$c/$ch"
			rm -f "$T/$f.trace"
			TESSERA_PACE_TRACE=$T/$f.trace TESSERA_HOOK_LOG=debug hooked "$G/$f.limits" $TW "$S" $w >"$T/$f.rate" 2>"$G/$f.log" ||
				echo "$f: hooked run failed"
			grep "pacing summary" "$G/$f.log" >"$T/$f.summary"
			echo "$f: $(cat "$T/$f.rate") solo: $(cat "$T/$w.solo")"
		done
	done
done
