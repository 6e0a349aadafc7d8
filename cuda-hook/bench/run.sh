#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# B3 CPU microbenchmark (make bench, make bench-gpu): runs bench/hookbench without the
# hook, with the hook and limits that do not pace (cores 100), and with pacing on but
# barely binding (cores 99: every launch takes the pacing fast path), interleaved over
# several rounds, and prints each figure with its difference and ratio to the no-hook
# run of the same round. It measures and reports; it asserts no time.
#
#   run.sh <hookbench> <libtessera-cuda.so> <limits-file> <gpu-uuid> <launch-calls> <alloc-calls> [rounds]
#
# The hook reads <limits-file>: either it is the hook's own limits path (the test
# build) or the caller exports TESSERA_LIMITS_FILE=<limits-file> (standalone use).
set -eu
BENCH=$1 HOOK=$2 LIMITS=$3 UUID=$4 NL=$5 NA=$6 ROUNDS=${7:-3}

# B3_CHARGE=kernel: the limits carry the charge line (per-kernel charges; bursts end
# at synchronizes, at queries that find the work done and at synchronous copies).
limits() { # limits <cores>
	charge=
	[ "${B3_CHARGE:-class}" = kernel ] && charge='charge kernel\n'
	printf "version 1\ncgroup /tessera-bench/hookbench\ncontext-mib 0\n${charge}gpu %s 65536 %s 0\n" "$UUID" "$1" >"$LIMITS"
}
field() { sed -n "s/.*$1=\(-\{0,1\}[0-9.]*\).*/\1/p"; }
median() { sort -g | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}'; }

for op in launch launch-ex graph alloc query copy; do
	n=$NL batch=1000
	if [ $op = alloc ]; then n=$NA batch=100; fi
	: >/tmp/hookbench.$$.none
	: >/tmp/hookbench.$$.hook
	: >/tmp/hookbench.$$.paced
	for r in $(seq "$ROUNDS"); do
		"$BENCH" $op $n $batch | field median_ns >>/tmp/hookbench.$$.none
		limits 100
		LD_PRELOAD=$HOOK "$BENCH" $op $n $batch | field median_ns >>/tmp/hookbench.$$.hook
		limits 99
		out=$(LD_PRELOAD=$HOOK "$BENCH" $op $n $batch)
		echo "$out" | field median_ns >>/tmp/hookbench.$$.paced
		echo "$out" | field mean_ns >>/tmp/hookbench.$$.pacedmean
	done
	none=$(median </tmp/hookbench.$$.none)
	hook=$(median </tmp/hookbench.$$.hook)
	paced=$(median </tmp/hookbench.$$.paced)
	pmean=$(median </tmp/hookbench.$$.pacedmean)
	awk -v op=$op -v n=$n -v r="$ROUNDS" -v a="$none" -v b="$hook" -v c="$paced" -v m="$pmean" \
		-v all_a="$(tr '\n' ' ' </tmp/hookbench.$$.none)" -v all_b="$(tr '\n' ' ' </tmp/hookbench.$$.hook)" \
		-v all_c="$(tr '\n' ' ' </tmp/hookbench.$$.paced)" 'BEGIN{
		printf "B3 cpu op=%s calls=%d rounds=%d ns/call (median of rounds): none=%.1f hook,cores=100=%.1f (%+.1f ns, ratio %.3f) hook,cores=99=%.1f (%+.1f ns, ratio %.3f; mean with window closes %.1f) [rounds: none %s| cores=100 %s| cores=99 %s]\n",
			op, n, r, a, b, b-a, b/a, c, c-a, c/a, m, all_a, all_b, all_c }'
	rm -f /tmp/hookbench.$$.*
done

# The same calls in one process, batches alternating between the hook and the
# driver's own function: what the hook adds, free of the differences between runs.
# Smaller batches here: with pacing on, a batch that holds a window's close (a drain
# and a sleep) is an outlier, and with 1000 launches of 3-5 us a quarter of the hooked
# batches held one, which moves the median.
for op in launch launch-ex graph alloc query copy; do
	n=$NL batch=100
	if [ $op = alloc ]; then n=$NA batch=20; fi
	for cores in 100 99; do
		limits $cores
		: >/tmp/hookbench.$$.diff
		line=
		for r in $(seq "$ROUNDS"); do
			out=$(LD_PRELOAD=$HOOK "$BENCH" $op $n $batch paired)
			echo "$out" | field diff_ns >>/tmp/hookbench.$$.diff
			line="$line| $(echo "$out" | sed 's/.*paired //') "
		done
		echo "B3 paired op=$op cores=$cores: hook minus driver, median of rounds $(median </tmp/hookbench.$$.diff) ns/call [rounds: $line]"
		rm -f /tmp/hookbench.$$.diff
	done
done
