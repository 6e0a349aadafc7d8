#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# B4's workload classes (gpu/torch_work.py: attn convnet llm graphmix streams, and
# mlp as the launch-bound neighbour; with B4_CLASSES, also polled, a program that
# waits by polling, fusedopt, a step whose update is a fused optimizer's long
# multi-tensor kernels, and loader, a data loader's small copies between a small
# model's kernels), judged in GPU time:
#
#   gpu/b4-classes.sh <build-dir> [<build-dir>...]
#
# Each workload's GPU busy fractions first, from torch.profiler's trace (torch_work.py's
# busy()): its kernel time over wall time, and the GPU time it holds, that and the
# GPU's own gaps between back-to-back kernels, in which a time-sliced GPU runs no
# other context's work either (a cap is a share of that time: a program of short
# kernels queued back to back holds the whole GPU whatever their kernel time adds up
# to). Then its unhooked solo rate in another process without the profiler
# (torch.profiler slows launches, and the workloads run after it in the same process,
# so a rate beside it is not the solo rate; a host-bound workload's the median of
# B4_SOLO_RUNS runs, below), and the fractions carried over to that rate as GPU time
# per step (a step the profiler slowed holds its GPU a smaller part of its time).
# Then, for each build's hook (to set one hook against another in the same run),
# every workload alone at B4_CAPS (25 50 80), each in a process (and container) of
# its own, so that none starts with what the one before it owed or taught the
# estimates; pairs of the same workload at 30/70 and 50/50, one
# workload per pair of processes, so that both tenants run the same class over the
# same seconds; and the mixed pair, attn at 70 beside the launch-bound mlp at 30. A
# build directory whose parent holds a file REVISION is labelled with it (a tree
# copied out of git has no history). A row's GPU share is its rate share times the
# GPU it holds alone (its kernel time's share beside it): within +-3 points of the
# cap where the cap is under what it needs, else not slowed (>= 95 % of its rate); a
# pair's rows against what two unhooked processes of the workload get side by side
# (PAIR, below), or what the hooked pair held in all where that is more. The
# launch-bound tenant of the mixed pair wants >= 0.9 x min(cap, need) / need of its
# rate (B7's target), and with B4_PARTS holding mps, the same pair and each
# workload's pairs as MPS clients (their rates, not judged); with ab, the host-paced
# workloads against solo runs interleaved with theirs (below), which judges their
# rows alone that their host's speed decides; with pairab, their pairs in rounds, each
# against an unhooked pair run right before it; with mixedab, the mixed pair in rounds,
# paced and as MPS clients, each against a solo run of the mlp before it; with phases,
# every workload capped and unpaced by turns in one process, judged against itself.
# B4_PARTS (of "alone pairs mixed mps ab pairab mixedab sliced phases"; all but mps,
# pairab, mixedab, sliced and phases by default) and
# B4_CLASSES choose rows; B4_MIXED adds mixed pairs (below);
# B4_SECONDS the measured seconds (2); B4_CHARGES the charge models each hook runs
# under, one after the other against the same solo references (TESSERA_BENCH_CHARGE,
# else kernel; "kernel class" sets the two side by side). Results: $OUT (or
# build/gpu)/b4-classes.txt.
# B4_DEBUG=1 runs every hooked tenant with the hook's debug log (a line per burst: its
# GPU time, charge, host time, lag, what it owed or gave back; the pacing summary at
# exit): the summaries, labelled by row, in b4-classes-debug.txt, the whole logs in
# b4-classes-debug.tar.gz.
. "$(dirname "$0")/common.sh" "$1"
M=$RES/b4-classes.txt
: >"$M"
say() { echo "$*" | tee -a "$M"; }
S=${B4_SECONDS:-2}
CL=${B4_CLASSES:-attn convnet llm graphmix streams}
CAPS=${B4_CAPS:-25 50 80}
PARTS=${B4_PARTS:-alone pairs mixed ab}
part() { [[ " $PARTS " == *" $1 "* ]]; }
TW="python3 $HERE/gpu/torch_work.py"
# Every measured process runs on CPUs of its own: a workload's solo runs and its rows
# alone on one set (TW0), a pair's second tenant on another (TW1), so that a
# host-bound workload, which runs as fast as the cores its threads land on, meets the
# same cores in its reference and its rows. It is not enough: unpinned, the LLM step's
# solo rate moved 33-46 steps/s from one process to the next on an H100, and pinned,
# graph + eager's moved 1,153-1,616 (B4_PARTS=ab, below, sets such rows against solo
# runs interleaved with theirs). B4_CPUS sets how many CPUs each set has (a quarter of
# the machine's by default; 1 puts a process's threads on one core), and B4_NUMA=1
# runs each process with numactl --localalloc (its memory on the node of the CPUs it
# runs on). Neither holds a host-bound step's speed still: on an H100 the LLM step's
# five solo runs spread 47 % as they are, 104 % on one CPU, 55 % with its memory local
# and 29 % (and slower) with both (B4_PARTS=phases judges such steps in one process).
if [ -n "${B4_NUMA:-}" ]; then
	command -v numactl >/dev/null || { echo "B4_NUMA=1: no numactl on this machine" >&2; exit 2; }
	TW="numactl --localalloc $TW"
fi
TW0=$TW TW1=$TW
if command -v taskset >/dev/null && [ "$(nproc)" -ge 8 ]; then
	q=$(($(nproc) / 4))
	k=${B4_CPUS:-$q}
	case $k in '' | *[!0-9]*) k=0 ;; esac
	[ "$k" -ge 1 ] && [ "$k" -le "$q" ] || { echo "B4_CPUS=${B4_CPUS:-}: want 1 to $q" >&2; exit 2; }
	TW0="taskset -c $q-$((q + k - 1)) $TW" TW1="taskset -c $((2 * q))-$((2 * q + k - 1)) $TW"
fi
field() { sed -n "s/.*$1=\([0-9.-]*\).*/\1/p" | head -1; }
# rates <workload> <file> [<separator>]: every rate the workload's lines in the file give.
rates() { grep "^$1 " "$2" | sed -n "s/.*rate=\([0-9.-]*\).*/\1/p" | paste -sd"${3:- }" -; }
# hostpaced <workload>: its rate follows its host's speed: it holds the GPU less than
# 80 % of the time alone (it waits for its host the rest), or its solo runs (below)
# spread over more than 10 %. The LLM step holds 39-70 %, and its solo runs read
# 33.8-48.2 steps/s from one process to the next on an H100, yet three of them on
# another machine only 47.8-49.5: a few runs do not show the spread; attention, which
# holds 90 %, spreads 1 %.
hostpaced() { awk -v b="${HELD[$1]}" -v lo="${LO[$1]:-}" -v hi="${HI[$1]:-}" 'BEGIN{ exit !((b != "" && b < 80) || (lo > 0 && hi > 1.1 * lo)) }'; }
# needs <workload>: the GPU it holds at its slowest and its fastest solo run's rate.
needs() { awk -v b="${HELD[$1]}" -v lo="${LO[$1]:-}" -v hi="${HI[$1]:-}" -v s="${SOLO[$1]}" 'BEGIN{
	printf "%.1f %.1f", (lo > 0 && s > 0) ? b * lo / s : b, (hi > 0 && s > 0) ? b * hi / s : b }'; }
declare -A SOLO BUSY HELD NV CK PRATE LO HI
nvml_clock_log
say "B4 classes $(date -u +%F), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), ${S}s per row"
# Each workload's GPU busy fraction first, then its solo runs, each in a process of its
# own, as every hooked row runs, and NVML's utilisation over it read right after: NVML
# keeps its samples for a few seconds, and read after all the solo runs of one process
# the first workloads' were gone (no time share for attention and polled on
# 2026-12-05). Each runs B4_SOLO_RUNS times (3): a workload bound by its host moves with
# the host's speed from one process to the next (the LLM step read 22.6 steps/s solo in
# one run, 36-42 in others and 35-52 under caps), and its reference is the run of the
# median rate, with the others shown beside; their spread says whether its rows are
# its host's (hostpaced).
# B4_REUSE=1 takes a workload's references (its busy fractions, its solo rate and
# NVML's reading over it) from the last run of this script on the machine, where it
# measured them (build/gpu/classes.refs), instead of measuring them again: for a later
# part (B4_PARTS) in another run on the same machine, against the same references.
# The references hold for the machine (and boot) that measured them: a host-bound
# step's solo rate moved 293-475 steps/s between machines of one kind, so references
# from another are dropped and measured again.
REFS=$G/classes.refs
# The workloads with references: the classes, and the launch-bound mlp and attention
# where a part pairs the two (mixed, mps, sliced) though B4_CLASSES leaves them out.
REFW=$CL
if part mixed || part mps || part sliced || part mixedab; then
	for w in attn mlp; do
		[[ " $REFW " == *" $w "* ]] || REFW="$REFW $w"
	done
fi
# B4_MIXED: more mixed pairs with the mixed part, each "<cap>:<workload>/<cap>:<workload>"
# (70:llm/30:attn: a host-paced step that is rarely held beside a saturating one, the
# pair in which the held tenant pays for the other's turns in its slot; docs/cuda-hook.md,
# Known gaps), every row judged as a pair's row against its cap or its need.
MIXED=
if part mixed; then
	for mp in ${B4_MIXED:-}; do
		if ! [[ $mp =~ ^[0-9]+:[a-z][a-z0-9]*/[0-9]+:[a-z][a-z0-9]*$ ]]; then
			echo "B4_MIXED: $mp is not <cap>:<workload>/<cap>:<workload> (e.g. 70:llm/30:attn)" >&2
			exit 2
		fi
		a=${mp%/*} b=${mp#*/}
		if [ $((${a%%:*} + ${b%%:*})) -gt 100 ] || [ "${a%%:*}" -lt 1 ] || [ "${b%%:*}" -lt 1 ]; then
			echo "B4_MIXED: $mp: want caps of 1 or more that add up to 100 at most" >&2
			exit 2
		fi
		for w in ${a#*:} ${b#*:}; do
			[[ " $REFW " == *" $w "* ]] || REFW="$REFW $w"
		done
		MIXED="$MIXED ${a%%:*}:0:${a#*:}/${b%%:*}:${a%%:*}:${b#*:}" # together's specs
	done
fi
MACHINE="# machine $(cat /proc/sys/kernel/random/boot_id 2>/dev/null || hostname) $UUID"
if [ "$(head -1 "$REFS" 2>/dev/null)" != "$MACHINE" ]; then
	[ ! -s "$REFS" ] || [ -z "${B4_REUSE:-}" ] || say "the references in $REFS are from another machine: measured again"
	echo "$MACHINE" >"$REFS"
fi
declare -A REUSED
if [ -n "${B4_REUSE:-}" ]; then
	while read -r w so bu he nv ck lo hi; do
		[[ " $REFW " == *" $w "* ]] || continue
		SOLO[$w]=$so BUSY[$w]=$bu HELD[$w]=$he NV[$w]=$nv CK[$w]=$ck LO[$w]=${lo:-$so} HI[$w]=${hi:-$so} REUSED[$w]=1
		say "solo $w: rate $so/s, GPU held $he% (kernels $bu%), NVML utilisation $nv%, SM clock $ck MHz (reused)"
	done <"$REFS"
fi
for w in $REFW; do
	[ -z "${REUSED[$w]:-}" ] || continue
	TESSERA_BENCH_BUSY=1 $TW0 0.3 $w >"$G/classes.busy.$w" || say "$w: busy fraction failed"
	BUSY[$w]=$(grep "^$w " "$G/classes.busy.$w" | field busy)
	HELD[$w]=$(grep "^$w " "$G/classes.busy.$w" | field held)
	HELD[$w]=${HELD[$w]:-${BUSY[$w]}}
	PRATE[$w]=$(grep "^$w " "$G/classes.busy.$w" | field prate)
done
for w in $REFW; do
	[ -z "${REUSED[$w]:-}" ] || continue
	runs=${B4_SOLO_RUNS:-3}
	: >"$G/classes.solo.$w"
	for ((r = 0; r < runs; r++)); do
		$TW0 "$S" $w >>"$G/classes.solo.$w" || say "$w: solo run failed"
		nvml "$(grep "^$w " "$G/classes.solo.$w" | tail -1)" >/dev/null
	done
	line=$(grep "^$w " "$G/classes.solo.$w" | sort -t= -k2 -g | awk '{ l[NR] = $0 } END { if (NR) print l[int((NR + 1) / 2)] }')
	SOLO[$w]=$(field rate <<<"$line")
	read -r NV[$w] CK[$w] _ <<<"$(nvml "$line")"
	all=$(rates $w "$G/classes.solo.$w" /)
	read -r LO[$w] HI[$w] <<<"$(rates $w "$G/classes.solo.$w" | awk '{ lo = hi = $1; for (i = 2; i <= NF; i++) { if ($i < lo) lo = $i; if ($i > hi) hi = $i } print lo, hi }')"
	# The profiled steps' fractions carried over to the solo rate, as GPU time per step
	# (torch_work.py's busy()): the profiler slowed the attention step on an H100 by
	# enough to read its held time 3-4 points low.
	prof=
	if [ -n "${PRATE[$w]:-}" ] && [ -n "${SOLO[$w]}" ]; then
		prof=" (profiled ${HELD[$w]}% / ${BUSY[$w]}% at ${PRATE[$w]} steps/s)"
		read -r HELD[$w] BUSY[$w] <<<"$(awk -v h="${HELD[$w]}" -v b="${BUSY[$w]}" -v p="${PRATE[$w]}" -v s="${SOLO[$w]}" 'BEGIN{
			k = (p > 0) ? s / p : 1; h *= k; b *= k; printf "%.1f %.1f", (h > 100 ? 100 : h), (b > 100 ? 100 : b) }')"
	fi
	say "solo $w: rate ${SOLO[$w]}/s$([ "$runs" -gt 1 ] && echo " (median of $all)"), GPU held ${HELD[$w]}% (kernels ${BUSY[$w]}%)$prof, NVML utilisation ${NV[$w]}%, SM clock ${CK[$w]} MHz"
	{
		grep -v "^$w " "$REFS"
		echo "$w ${SOLO[$w]:--} ${BUSY[$w]:--} ${HELD[$w]:--} ${NV[$w]:--1} ${CK[$w]:--1} ${LO[$w]:--} ${HI[$w]:--}"
	} >"$REFS.new" && mv "$REFS.new" "$REFS"
done
# row <label> <workload> <cap> <output-line> [<scale> <reference rate>]: a row whose
# workload needs more than its cap times scale is judged by its GPU share against that,
# +-3; any other is not slowed (>= 95 % of the reference rate, its solo rate by
# default). One needing at most 3 points over its cap passes either way (ab and phases
# too): a cap held exactly slows such a workload below 95 % (27.7 % needed at cap 25,
# 91 % of its rate), and what it needs is known to a few points only. Beside it, what
# NVML saw over the row (the whole GPU's utilisation, the SM clock): alone, the
# tenant's time share is the GPU it holds alone times its utilisation over its solo
# run's, and a capped row whose SMs ran more than 5 % faster than solo
# (a power-bound step held to part of the time runs at a higher clock, and does more
# per GPU-second) is judged by that time share, as B4's matrix judges its kernels.
# A host-paced workload's rows alone whose verdict its host's speed decides are not
# judged here: its rate moves more than the verdict's 5 % from one process to the next
# (83-134 % of a solo run minutes before, on an H100), and with it what it needs (a row
# at a cap above what it needs at its slowest solo run's rate may be a capped row or a
# not-slowed one), so such rows are judged against solo runs interleaved with theirs
# (ab, below) and shown here as info.
row() {
	local gpu clk hb=0 nlo nhi
	read -r gpu clk _ <<<"$(nvml "$4")"
	read -r nlo nhi <<<"$(needs "$2")"
	! hostpaced "$2" || hb=1
	say "$(awk -v hb=$hb -v l="$1" -v w="$2" -v c="$3" -v r="$(field rate <<<"$4")" -v s="${SOLO[$2]}" -v b="${HELD[$2]}" -v kb="${BUSY[$2]}" -v k="${5:-1}" \
		-v ref="${6:-${SOLO[$2]}}" -v u="$gpu" -v u0="${NV[$2]}" -v ck="$clk" -v ck0="${CK[$2]}" -v nlo="$nlo" -v nhi="$nhi" 'BEGIN{
		if (r == "" || s <= 0) { printf "%-30s %-8s no rate", l, w; exit }
		sh = 100 * r / s; g = sh * b / 100; t = c * k
		ts = (l ~ /^alone/ && u >= 0 && u0 > 0) ? b * u / u0 : -1
		printf "%-30s %-8s rate %8.2f/s = %5.1f%% of solo, GPU %5.1f%% (held alone %.0f%%, kernels %.1f%%) ", l, w, r, sh, g, b, sh * kb / 100
		if (l ~ /^alone/ && hb && nlo <= t + 3) { printf "info (cap %d: %.1f%% of solo; host-paced, needing %.1f-%.1f%% by its solo runs: judged by ab)", c, 100 * r / ref, nlo, nhi }
		else if (b > t + 3 && ts >= 0 && ck0 > 0 && ck > 1.05 * ck0) { e = ts - t
			printf "%s err %+.1f in time (cap %d; SM %d MHz, solo %d)", (e >= -3 && e <= 3) ? "ok  " : "FAIL", e, c, ck, ck0 }
		else if (b > t + 3) { e = g - t; printf "%s err %+.1f (cap %d", (e >= -3 && e <= 3) ? "ok  " : "FAIL", e, c; if (k != 1) printf " x %.2f = %.1f", k, t; printf ")" }
		else if (b > t) { e = g - t; v = 100 * r / ref
			printf "%s err %+.1f or not slowed (cap %d: %.1f%% of %s; needing %.1f%%, within 3 over the cap)", ((e >= -3 && e <= 3) || v >= 95) ? "ok  " : "FAIL", e, c, v, (ref == s) ? "solo" : "the unhooked pair", b }
		else { v = 100 * r / ref; printf "%s not slowed (cap %d: %.1f%% of %s, want >= 95)", (v >= 95) ? "ok  " : "FAIL", c, v, (ref == s) ? "solo" : "the unhooked pair" }
		printf " [NVML %s%%%s, SM %s MHz]", u, (ts >= 0) ? sprintf(", time share %.1f%%", ts) : "", ck }')"
}
# ab_verdict <workload> <cap> <solo rates> <unpaced rates> <capped rates>: ab's verdict
# (below), the rates one per round in order. Its GPU time a step is HELD over SOLO.
ab_verdict() {
	awk -v w=$1 -v c=$2 -v s="$3" -v u="$4" -v k="$5" -v b="${HELD[$1]}" -v m="${SOLO[$1]}" '
	function med(a, n,  i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
	BEGIN{
		n = split(s, ss, " "); nu = split(u, us, " "); nk = split(k, ks, " ")
		if (nu > n) nu = n
		if (nk > n) nk = n
		if (!nu || !nk || m <= 0) { printf "ab %-8s no rates", w; exit }
		for (i = 1; i <= nu; i++) ru[i] = (ss[i] > 0) ? 100 * us[i] / ss[i] : 0
		mu = med(ru, nu)
		printf "ab %-8s solo rates %s; unpaced %s, cap %d %s; ", w, s, u, c, k
		for (i = 1; i <= nk; i++) rk[i] = (ss[i] > 0) ? 100 * ks[i] / ss[i] : 0
		mk = med(rk, nk); need = b * med(ss, n) / m; g = mk * need / 100
		printf "unpaced %.1f%% of the solo run of its round (median of %d) %s; ", mu, nu, (mu >= 95) ? "ok" : "FAIL"
		printf "cap %d %.1f%%, GPU %.1f%% (needing %.1f%% at the median of these solo runs) ", c, mk, g, need
		e = g - c
		if (need > c + 3) printf "%s err %+.1f", (e >= -3 && e <= 3) ? "ok" : "FAIL", e
		else if (need > c) printf "%s err %+.1f or not slowed (within 3 over the cap)", ((e >= -3 && e <= 3) || mk >= 95) ? "ok" : "FAIL", e
		else printf "%s not slowed (want >= 95)", (mk >= 95) ? "ok" : "FAIL"
	}'
}
# pairab_verdict <workload>: the pairab part's verdicts (below) from its rounds' rows on
# stdin: each tenant of 30/70 and 50/50 (the first and second of a pair apart) ok where
# most of its rounds are, with each round's verdict and figure.
pairab_verdict() {
	awk -v w=$1 '
	$1 ~ /^pairab[0-9]+$/ && $3 == "of" && $5 == w {
		k = $2 " of " $4; t = k ((cnt[$1, k]++) ? " (second)" : "")
		if (!(t in n)) order[++no] = t
		ok = ($0 ~ / ok   /); v = ""
		if (match($0, /err [-+][0-9.]+/)) v = substr($0, RSTART + 4, RLENGTH - 4)
		if (match($0, /[0-9.]+% of the unhooked pair/)) v = v (v != "" ? " or " : "") substr($0, RSTART, index(substr($0, RSTART), "%"))
		n[t]++; good[t] += ok; fig[t] = fig[t] (n[t] > 1 ? ", " : "") (ok ? "ok " : "FAIL ") v
	}
	END {
		for (j = 1; j <= no; j++) { t = order[j]
			printf "pairab %-22s %-8s %s in %d of %d rounds (%s)\n", t, w, (2 * good[t] > n[t]) ? "ok  " : "FAIL", good[t], n[t], fig[t] }
	}'
}
# phases_verdict <workload> <cap> <phases line>: a row of the phases part (below). Its
# GPU time a step is HELD over SOLO; what it needs, that at its unpaced rate in the
# same process. Beside it, NVML's utilisation over the capped and the unpaced phases
# (alone on the GPU, the process's own busy time: a reading that rests on no
# reference).
phases_verdict() {
	awk -v w=$1 -v c=$2 -v line="$3" -v b="${HELD[$1]}" -v m="${SOLO[$1]}" 'BEGIN{
		n = split(line, f, " "); for (i = 1; i <= n; i++) { split(f[i], kv, "="); v[kv[1]] = kv[2] }
		u = v["rate_u"] + 0; k = v["rate_c"] + 0
		if (u <= 0 || m <= 0) { printf "%-30s %-8s no rate", "phases cap " c, w; exit }
		# Each round'"'"'s capped rate over its unpaced one: their mean and its standard
		# error, how far the host moved within the process against the verdict'"'"'s 5 %.
		nu = split(v["unpaced"], us, "/"); nk = split(v["capped"], ks, "/"); if (nk < nu) nu = nk
		lo = hi = us[1]; sr = sq = 0
		for (i = 1; i <= nu; i++) { if (us[i] < lo) lo = us[i]; if (us[i] > hi) hi = us[i]; x = (us[i] > 0) ? 100 * ks[i] / us[i] : 0; sr += x; sq += x * x }
		mr = sr / nu; se = (nu > 1) ? sqrt((sq / nu - mr * mr > 0 ? sq / nu - mr * mr : 0) / (nu - 1)) : 0
		need = b * u / m; g = b * k / m
		printf "%-30s %-8s unpaced %.1f/s (%.1f%% of solo; %d rounds, %.0f%% apart), cap %d %.1f/s: %.1f%% of unpaced (rounds %.1f +- %.1f), GPU %.1f%% (needing %.1f%% unpaced) ", \
			"phases cap " c, w, u, 100 * u / m, nu, 100 * (hi - lo) / lo, c, k, 100 * k / u, mr, se, g, need
		e = g - c
		if (need > c + 3) printf "%s err %+.1f", (e >= -3 && e <= 3) ? "ok  " : "FAIL", e
		else if (need > c) printf "%s err %+.1f or not slowed (within 3 over the cap)", ((e >= -3 && e <= 3) || k >= 0.95 * u) ? "ok  " : "FAIL", e
		else printf "%s not slowed (want >= 95)", (k >= 0.95 * u) ? "ok  " : "FAIL"
		if (v["nvml_c"] != "") printf " [NVML %s%% capped, %s%% unpaced]", v["nvml_c"], v["nvml_u"]
	}'
}
# What two unhooked processes of a workload get side by side, their measured seconds
# lined up: the GPU time (rate share times GPU held alone) the pair holds in all,
# PAIR, and each one's rate, PAIRRATE. A time-sliced GPU runs two contexts in turns,
# losing the switches, and fills one's idle gaps with the other's kernels only where
# their turns meet: a pair of workloads that each keep it busy gets less than 100 %
# between them (two attention steps about 84 %, two FMA loops 92-94 %). Where the pair
# was slowed (either under 95 % of its solo rate), a cap is a share of what the pair
# can hold: a tenant at c that needs more is judged against c x PAIR / 100 (the switch
# cost shared as the time; c x HELD / 100 where the hooked pair held more in all, HELD),
# and one that needs less against the unhooked pair's rate. Only a pair that needs more
# than the whole GPU (each busy more than half the time alone) scales its caps: two
# convnet steps busy 22 % each held 43 % in all, slowed by their hosts, not by the GPU's
# switches, and scaled by that a 30 % tenant needing 22 was judged against a cap of 13.
declare -A PAIR PAIRRATE PAIRK
# unhooked_pair <workload> [<label>]: two unhooked processes of it side by side, PAIR,
# PAIRRATE and PAIRK set from them.
unhooked_pair() {
	local w=$1 a b r0 r1
	rm -rf "$G/ubar.$w"
	TESSERA_BENCH_BARRIER="$G/ubar.$w:2" $TW0 "$S" $w >"$G/upair.$w.0" &
	a=$!
	TESSERA_BENCH_BARRIER="$G/ubar.$w:2" $TW1 "$S" $w >"$G/upair.$w.1" &
	b=$!
	wait $a $b || say "unhooked pair $w failed"
	r0=$(grep "^$w " "$G/upair.$w.0" | field rate)
	r1=$(grep "^$w " "$G/upair.$w.1" | field rate)
	read -r PAIR[$w] PAIRRATE[$w] PAIRK[$w] <<<"$(awk -v a="$r0" -v b="$r1" -v s="${SOLO[$w]}" -v u="${HELD[$w]}" 'BEGIN{
		if (a == "" || b == "" || s <= 0) { print "- " s " 1"; exit }
		p = (a + b) / s * u; k = (2 * u > 100 && (a < 0.95 * s || b < 0.95 * s)) ? p / 100 : 1
		printf "%.1f %.3f %.3f", p, (a + b) / 2, k }')"
	say "${2:-unhooked pair} $w: rates $r0 + $r1 = $(awk -v a="$r0" -v b="$r1" -v s="${SOLO[$w]}" 'BEGIN{printf "%.1f%% + %.1f%%", 100*a/s, 100*b/s}') of solo, GPU ${PAIR[$w]}% in all (caps scaled by ${PAIRK[$w]})"
}
if part pairs; then
	for w in $CL; do
		unhooked_pair $w
	done
fi
# debug_summary: under B4_DEBUG, the debug logs' summaries and the logs themselves; also
# run when the script is stopped (a time limit), so that the rows run so far keep theirs.
debug_summary() {
	[ -n "${B4_DEBUG:-}" ] && [ -d "$G/debug" ] || return 0
	# Per log, the pacing summaries and the bursts: counted (owed or given back and
	# read for the gain), not counted, and of those how many a launch sample saw the
	# GPU wait for the host in (gap=1).
	for f in "$G"/debug/*.log; do
		grep -h "pacing summary" "$f" | sed "s#^#$(basename "$f" .log): #"
		echo "$(basename "$f" .log): bursts counted=$(grep -c 'pacing burst gpu_ns=' "$f")" \
			"not_counted=$(grep -c 'pacing burst not counted' "$f") of_which_gap=$(grep -c 'pacing burst not counted.* gap=1' "$f")"
		# The kernels sampled both on an idle stream and queued behind work: what the
		# idle samples read against the queued ones (weighted by the idle samples; the
		# queued ones hold the GPU's gap before them too). An entry with queued
		# samples is charged from those (the hook's kt_fold).
		grep -h "pacing summary kernel=" "$f" | awk -v l="$(basename "$f" .log)" '{
			for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			if (v["idle"] > 0 && v["queued"] > 0 && v["queued_mean_ns"] > 0) { n++; w += v["idle"]; r += v["idle"] * v["idle_mean_ns"] / v["queued_mean_ns"] } }
			END { if (n) printf "%s: idle-stream samples read %.3f of queued ones (%d kernels sampled both ways, %d idle samples)\n", l, r / w, n, w }'
	done >"$RES/b4-classes-debug.txt"
	tar -czf "$RES/b4-classes-debug.tar.gz" -C "$G" debug
}
# The phases part's share file, where the node agent keeps it for the GPU (the hook's
# TESSERA_SHARES_DIR/<uuid>/share): share_file <share> writes it; shares_gone removes
# what share_file wrote, and the directory where it made it, so that no later
# container granted no cores on this GPU (an MPS client's) is paced to it. A share
# file already there is a node's: the part is then not run.
SHDIR=${DRY:+$DRY/shares}
SHDIR=${SHDIR:-/run/tessera-shares}/$UUID
SHMADE= SHWROTE=
share_file() {
	[ -d "$SHDIR" ] || { mkdir -p "$SHDIR" && SHMADE=1; }
	SHWROTE=1
	printf 'version 1\nreserved %d\ncontainers 1\nshare %d\nphase 0\n' $((100 - $1)) $1 >"$SHDIR/share.new" && mv "$SHDIR/share.new" "$SHDIR/share"
}
shares_gone() {
	[ -n "$SHWROTE" ] || return 0
	rm -f "$SHDIR"/share*
	[ -z "$SHMADE" ] || rmdir "$SHDIR" 2>/dev/null || true
	SHMADE= SHWROTE=
}
rm -rf "$G/debug"
trap 'shares_gone; debug_summary; exit 143' TERM INT
# hk <log name> <limits file> <command...>: hooked, with the debug log kept under B4_DEBUG.
hk() {
	local name=$1
	shift
	if [ -n "${B4_DEBUG:-}" ]; then
		mkdir -p "$G/debug"
		TESSERA_HOOK_LOG=debug hooked "$@" 2>"$G/debug/$name.log"
	else
		hooked "$@"
	fi
}
n=0
for bd in "$@"; do
for TESSERA_BENCH_CHARGE in ${B4_CHARGES:-${TESSERA_BENCH_CHARGE:-kernel}}; do
	HOOK=$(cd "$bd" && pwd)/libtessera-cuda.so
	# The revision names the tree only where it was committed as it is (a GPU
	# machine's copy of a working tree keeps the checkout's last commit): the
	# library's own digest names the build whatever the tree.
	say "== hook $HOOK ($(cat "$bd/../REVISION" 2>/dev/null || git -C "$bd" log -1 --format=%h 2>/dev/null); sha256 $(sha256sum "$HOOK" 2>/dev/null | cut -c1-12)), charge model $TESSERA_BENCH_CHARGE"
	part alone && for c in $CAPS; do
		for w in $CL; do
			n=$((n + 1))
			limits "$G/c$n" 130000 $c 0 "/b4c/$n/alone$c"
			hk "$n-alone$c-$w" "$G/c$n" $TW0 "$S" $w >"$G/classes.$n" || say "alone cap $c $w failed"
			row "alone cap $c" $w $c "$(grep "^$w " "$G/classes.$n")"
		done
	done
	# together <label> <cap:phase:workloads>...: the tenants at once, their measured
	# seconds lined up (TESSERA_BENCH_BARRIER). A cap written u<cap> runs that tenant
	# without the hook (its cap only names it): what time slicing alone gives it beside
	# the paced others.
	together() {
		local label=$1 pids=() specs=() i=0 tw u
		shift
		n=$((n + 1))
		rm -rf "$G/bar$n"
		for spec in "$@"; do
			IFS=: read -r c ph ws <<<"$spec"
			u=${c%%[0-9]*}
			c=${c#u}
			tw=TW$((i % 2))
			if [ -n "$u" ]; then
				TESSERA_BENCH_BARRIER="$G/bar$n:$#" ${!tw} "$S" $ws >"$G/together.$n.$i" &
			elif [ "$label" = mps ]; then
				# An MPS container: its cap a share of the SMs, the hook enforcing
				# memory only, as the node agent binds it (docs/cuda-hook.md, "MPS clients").
				limits "$G/t$n.$i" 130000 0 0 "/b4c/$n/t$i"
				CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$c TESSERA_BENCH_BARRIER="$G/bar$n:$#" \
					hk "$n-$label$c-${ws// /+}-$i" "$G/t$n.$i" ${!tw} "$S" $ws >"$G/together.$n.$i" &
			else
				limits "$G/t$n.$i" 130000 $c $ph "/b4c/$n/t$i"
				TESSERA_BENCH_BARRIER="$G/bar$n:$#" hk "$n-$label$c-${ws// /+}-$i" "$G/t$n.$i" ${!tw} "$S" $ws >"$G/together.$n.$i" &
			fi
			pids+=($!)
			specs+=("$u$c:$ws")
			i=$((i + 1))
		done
		for p in "${pids[@]}"; do wait $p || say "$label: a tenant failed"; done
		# The GPU time the tenants held in all (rate share times GPU held alone).
		local held=0 gs=()
		i=0
		for spec in "${specs[@]}"; do
			for w in ${spec#*:}; do
				gs+=("$(awk -v r="$(grep "^$w " "$G/together.$n.$i" | field rate)" -v s="${SOLO[$w]}" -v b="${HELD[$w]}" \
					'BEGIN{ printf "%.3f", (r != "" && s > 0) ? r / s * b : 0 }')")
				held=$(awk -v h="$held" -v g="${gs[-1]}" 'BEGIN{ printf "%.3f", h + g }')
			done
			i=$((i + 1))
		done
		i=0
		for spec in "${specs[@]}"; do
			for w in ${spec#*:}; do
				if [ "${spec:0:1}" = u ]; then
					# Unhooked: what time slicing gives it beside the paced tenants,
					# the bound a paced row of it can be judged by.
					say "$(awk -v l="$label ${spec%%:*} of $(IFS=/; echo "${specs[*]%%:*}")" -v w=$w -v s="${SOLO[$w]}" -v b="${HELD[$w]}" \
						-v r="$(grep "^$w " "$G/together.$n.$i" | field rate)" 'BEGIN{
						if (r == "" || s <= 0) printf "%-30s %-8s no rate", l, w
						else printf "%-30s %-8s rate %8.2f/s = %5.1f%% of solo, GPU %5.1f%% unhooked beside the paced tenants (time slicing'"'"'s bound: info)", l, w, r, 100 * r / s, b * r / s }')"
					i=$((i + 1))
					continue 2
				fi
				# The paced tenant beside an unhooked one: not a row of B4's, but what
				# it got with the other unpaced, set against its paced pair's row.
				if [ "$label" = sliced ]; then
					say "$(awk -v l="$label ${spec%%:*} of $(IFS=/; echo "${specs[*]%%:*}")" -v w=$w -v s="${SOLO[$w]}" -v b="${HELD[$w]}" \
						-v r="$(grep "^$w " "$G/together.$n.$i" | field rate)" 'BEGIN{
						if (r == "" || s <= 0) printf "%-30s %-8s no rate", l, w
						else printf "%-30s %-8s rate %8.2f/s = %5.1f%% of solo, GPU %5.1f%% paced beside the unhooked tenant (info)", l, w, r, 100 * r / s, b * r / s }')"
					i=$((i + 1))
					continue 2
				fi
				if [ "$label" = mps ]; then
					# A share of the SMs is not one of the GPU's time: the rate only,
					# and for a pair of one workload, against what each of two unhooked
					# processes of it got time-sliced (PAIRRATE, with B4_PARTS pairs).
					local p=
					[ "${specs[0]#*:}" = "${specs[-1]#*:}" ] && p=${PAIRRATE[$w]:-}
					say "$(awk -v l="$label ${spec%%:*} of $(IFS=/; echo "${specs[*]%%:*}")" -v w=$w -v s="${SOLO[$w]}" -v p="$p" \
						-v r="$(grep "^$w " "$G/together.$n.$i" | field rate)" 'BEGIN{
						if (r == "" || s <= 0) printf "%-30s %-8s no rate", l, w
						else printf "%-30s %-8s rate %8.2f/s = %5.1f%% of solo%s (SMs, not time: not judged)", l, w, r, 100 * r / s,
							(p > 0) ? sprintf(", %.1f%% of an unhooked time-sliced pair'"'"'s tenant", 100 * r / p) : "" }')"
					continue
				fi
				# A pair of one workload is judged against what a pair of it can hold:
				# what the unhooked pair held, or what this pair held where that is
				# more (paced tenants that keep out of each other's turns lose less to
				# the switches than two unhooked ones). A tenant that takes more than
				# its cap's part of that still fails, and so does the other.
				local k=1 ref=
				[[ $label == pair* ]] && [ -n "${PAIRK[$w]:-}" ] && ref=${PAIRRATE[$w]} &&
					k=$(awk -v k="${PAIRK[$w]}" -v h="$held" 'BEGIN{ h /= 100; printf "%.3f", (k < 1 && h > k) ? (h < 1 ? h : 1) : k }')
				row "$label ${spec%%:*} of $(IFS=/; echo "${specs[*]%%:*}")" $w ${spec%%:*} "$(grep "^$w " "$G/together.$n.$i")" $k $ref
			done
			i=$((i + 1))
		done
		# How the tenants split what they held in all, against how their caps split the
		# GPU: a reading that does not depend on the unhooked pair (the GPU an unhooked
		# attention pair held moved from 80 to 85 % between two runs of one day).
		[ "$label" = mps ] || [ "$label" = sliced ] || say "$(awk -v gs="${gs[*]}" -v cs="${specs[*]%%:*}" -v h="$held" -v l="$label" 'BEGIN{
			n = split(gs, g, " "); split(cs, c, " "); tc = 0; for (j = 1; j <= n; j++) tc += c[j]
			printf "%-30s info: split of the %.1f%% they held", l " " cs, h
			for (j = 1; j <= n; j++) printf "%s %.1f", (j > 1 ? " /" : ""), (h > 0 ? 100 * g[j] / h : 0)
			printf " (caps"; for (j = 1; j <= n; j++) printf "%s %.1f", (j > 1 ? " /" : ""), 100 * c[j] / tc; printf ")" }')"
	}
	# B4_PAIR_CAPS ("30/70 50/50") the pairs' caps; others, such as 27/70 (the smaller
	# tenant at its cap scaled by what an unhooked pair holds), show what the larger
	# tenant gets where the smaller one gives up its part of the switches.
	part pairs && for w in $CL; do
		for pc in ${B4_PAIR_CAPS:-30/70 50/50}; do
			together "pair" "${pc%/*}:0:$w" "${pc#*/}:${pc%/*}:$w"
		done
	done
	# beside <label> [<solo rate>]: the mixed pair's launch-bound tenant against B7's
	# target, its rate set against its solo reference or the solo rate given.
	beside() {
		say "$(awk -v l="$1" -v r="$(grep '^mlp ' "$G/together.$n.1" | field rate)" -v s="${2:-${SOLO[mlp]}}" -v b="${HELD[mlp]}" 'BEGIN{
			w = 0.9 * (b < 30 ? b : 30) / b * 100; v = 100 * r / s
			printf "%s launch-bound mlp at 30 beside attn at 70: %.1f%% of its solo rate, want >= %.1f %s", l, v, w, (l == "sliced") ? "(unhooked: info)" : (v >= w) ? "ok" : "FAIL" }')"
	}
	if part mixed; then
		together "mixed" "70:0:attn" "30:70:mlp"
		beside mixed
		for mp in $MIXED; do
			together "mixed" "${mp%/*}" "${mp#*/}"
		done
	fi
	# B4_PARTS with sliced: each 30 / 70 pair's tenants, one at a time, and the mixed
	# pair's launch-bound one, unhooked beside the other paced as in its row: what time
	# slicing leaves it (B7's sliced mode), the bound that no pacing of it can lift (a
	# host-paced step's launches wait for the other's time slices whatever its cap; the
	# smaller tenant unhooked is not held to 30 either, so where it gets less than 30
	# there, its paced row's shortfall is time slicing's).
	if part sliced; then
		for w in $CL; do
			together "sliced" "30:0:$w" "u70:30:$w"
			together "sliced" "u30:0:$w" "70:30:$w"
		done
		together "sliced" "70:0:attn" "u30:70:mlp"
		beside sliced
	fi
	# B4_PARTS with ab: each host-paced workload (hostpaced) in B4_AB_ROUNDS rounds (3)
	# of three processes one after another: its solo run, under the hook unpaced
	# (gpu-cores 100) and under the hook at B4_AB_CAP (by default the lowest of B4_CAPS
	# whose row alone is judged here, else 80), the order turned by one each round.
	# Each hooked rate is set against the solo run of its own round, the host's speed
	# moving between processes as much as a row is judged by, and the median of the
	# rounds' ratios is judged: the unpaced one not slowed, the capped one as a row
	# against what the workload needs at the median of these solo runs (its GPU time
	# a step is fixed): its GPU share within +-3 of the cap where it needs more, else
	# not slowed.
	if part ab; then
		for w in $CL; do
			hostpaced $w || continue
			: >"$G/ab.$w.solo"
			: >"$G/ab.$w.100"
			: >"$G/ab.$w.cap"
			# The lowest cap whose row alone is judged here in its place (row():
			# what it needs at its slowest solo run at most the cap plus 3).
			c=${B4_AB_CAP:-$(awk -v h="$(needs $w | cut -d" " -f1)" -v caps="$CAPS" 'BEGIN{ n = split(caps, a, " "); c = 0
				for (i = 1; i <= n; i++) if (a[i] + 0 >= h - 3 && (c == 0 || a[i] + 0 < c)) c = a[i] + 0; print c ? c : 80 }')}
			for ((r = 0; r < ${B4_AB_ROUNDS:-3}; r++)); do
				for ((j = 0; j < 3; j++)); do
					case $(((r + j) % 3)) in
					0) $TW0 "$S" $w >>"$G/ab.$w.solo" || say "ab $w: solo run failed" ;;
					1)
						limits "$G/ab.l" 130000 100 0 "/b4c/ab/$w/$r/100"
						hk "ab-$w-$r-100" "$G/ab.l" $TW0 "$S" $w >>"$G/ab.$w.100" || say "ab $w: unpaced run failed"
						;;
					2)
						limits "$G/ab.l" 130000 $c 0 "/b4c/ab/$w/$r/cap"
						hk "ab-$w-$r-cap" "$G/ab.l" $TW0 "$S" $w >>"$G/ab.$w.cap" || say "ab $w: capped run failed"
						;;
					esac
				done
			done
			say "$(ab_verdict $w $c "$(rates $w "$G/ab.$w.solo")" "$(rates $w "$G/ab.$w.100")" "$(rates $w "$G/ab.$w.cap")")"
		done
	fi
	# B4_PARTS with pairab: each host-paced workload's pairs (30/70, 50/50) in
	# B4_AB_ROUNDS rounds (3), each round's unhooked pair run right before its hooked
	# pairs and their rows judged against it (as the pairs part judges against its one
	# unhooked pair): a host-bound pair's rates move with its host from one process to
	# the next as much as a row is judged by (unhooked graph + eager pairs read 72-81 %
	# of solo in four runs on two H100 machines, hooked ones 69-89 %). A tenant's
	# verdict is that of most of its rounds, its rounds' figures beside.
	if part pairab; then
		declare -A KEEP_PAIR KEEP_RATE KEEP_K
		for w in $CL; do
			hostpaced $w || continue
			KEEP_PAIR[$w]=${PAIR[$w]:-} KEEP_RATE[$w]=${PAIRRATE[$w]:-} KEEP_K[$w]=${PAIRK[$w]:-}
			from=$(($(wc -l <"$M") + 1))
			for ((r = 1; r <= ${B4_AB_ROUNDS:-3}; r++)); do
				unhooked_pair $w "pairab$r unhooked pair"
				together "pairab$r" "30:0:$w" "70:30:$w"
				together "pairab$r" "50:0:$w" "50:50:$w"
			done
			say "$(tail -n +"$from" "$M" | pairab_verdict $w)"
			PAIR[$w]=${KEEP_PAIR[$w]} PAIRRATE[$w]=${KEEP_RATE[$w]} PAIRK[$w]=${KEEP_K[$w]}
			[ -n "${PAIR[$w]}" ] || unset "PAIR[$w]" "PAIRRATE[$w]" "PAIRK[$w]"
		done
	fi
	# B4_PARTS with phases: each workload at each of B4_CAPS in one process of its own,
	# capped and unpaced by turns (torch_work.py's TESSERA_BENCH_PHASES), as a container
	# granted no cores whose unreserved share the script moves between the cap and 100
	# (the node agent's share file, docs/cuda-hook.md "Unreserved containers"): the same
	# allowance and charges as a container granted the cap, without the GPU's turns
	# (alone on the GPU, a turn is never waited for). B4_PHASE_ROUNDS rounds (8) of a
	# capped and an unpaced phase of B4_PHASE_SECONDS (0.5) each, in the order capped,
	# unpaced, unpaced, capped, ...: the capped phases are judged against the unpaced
	# ones of the same process, whose host's speed moves between processes by more
	# than a verdict's margin, and within one as well (the LLM step's unpaced rounds of
	# one second read 26-37 steps/s in one process on an H100): short phases in that
	# order weigh a host that speeds up or slows down alike on both sides. Within +-3
	# of the cap in GPU time where the unpaced rate needs more, else not slowed; the
	# rounds' ratios' mean and standard error beside, how far the host moved.
	if part phases && [ -e "$SHDIR/share" ] && [ -z "$SHWROTE" ]; then
		say "phases: not run: $SHDIR/share is there already (a node's share file; the part writes its own)"
	elif part phases; then
		for c in $CAPS; do
			for w in $CL; do
				n=$((n + 1))
				share_file $c
				limits "$G/c$n" 130000 0 0 "/b4c/$n/phases$c"
				TESSERA_BENCH_PHASES="$SHDIR/share:$c:${B4_PHASE_ROUNDS:-8}:0.15" hk "$n-phases$c-$w" "$G/c$n" $TW0 "${B4_PHASE_SECONDS:-0.5}" $w \
					>"$G/classes.$n" || say "phases cap $c $w failed"
				say "$(phases_verdict $w $c "$(grep "^$w phases" "$G/classes.$n")")"
			done
		done
		shares_gone
	fi
done
done
# B4_PARTS with mps: each workload's pairs (30/70, 50/50) and the mixed pair as MPS
# clients (one MPS control daemon for the GPU, each tenant's cap its
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), the mode docs/install.md recommends for node pools
# that mix launch-bound and long-kernel tenants or need a long-kernel pair's shares
# exact, with the last hook above enforcing memory.
# mps_daemon <start|quit>: the MPS control daemon for the GPU, its pipe and log under
# $G/mps (the clients' CUDA_MPS_PIPE_DIRECTORY in together()); start fails where it
# does not start.
MPS=$G/mps
mps_daemon() {
	local ctl=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
	if [ "$1" = quit ]; then
		echo quit | CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe "$ctl"
		return
	fi
	mkdir -p "$MPS/pipe" "$MPS/log"
	CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe CUDA_MPS_LOG_DIRECTORY=$MPS/log "$ctl" -d
}
if part mps; then
	if mps_daemon start; then
		for w in $CL; do
			together "mps" "30:0:$w" "70:30:$w"
			together "mps" "50:0:$w" "50:50:$w"
		done
		together "mps" "70:0:attn" "30:70:mlp"
		beside mps
		mps_daemon quit
	else
		say "mps: the MPS control daemon did not start"
	fi
fi
# B4_PARTS with mixedab: the mixed pair in B4_AB_ROUNDS rounds (3), each with a solo
# run of the launch-bound mlp right before it, on the CPUs it has in the pair (its rate
# moves with its host: 688-876 steps/s in three solo runs on an H100), then the pair
# under the last hook above and, where the MPS control daemon starts, as MPS clients;
# the mlp judged against its round's solo run (B7's target), its verdict that of most
# rounds, each round's figure beside.
if part mixedab; then
	mps_on=
	mps_daemon start && mps_on=1 ||
		say "mixedab: the MPS control daemon did not start (paced rounds only)"
	from=$(($(wc -l <"$M") + 1))
	for ((r = 1; r <= ${B4_AB_ROUNDS:-3}; r++)); do
		ref=$($TW1 "$S" mlp | grep "^mlp " | field rate)
		say "mixedab$r solo mlp: rate ${ref:-none}/s"
		together "mixedab$r" "70:0:attn" "30:70:mlp"
		beside "mixedab$r" "$ref"
		if [ -n "$mps_on" ]; then
			together "mps" "70:0:attn" "30:70:mlp"
			beside "mpsab$r" "$ref"
		fi
	done
	[ -z "$mps_on" ] || mps_daemon quit
	say "$(tail -n +"$from" "$M" | awk '
		$1 ~ /^(mixed|mps)ab[0-9]+$/ && $2 == "launch-bound" {
			m = ($1 ~ /^mps/) ? "as MPS clients" : "paced"; if (!(m in n)) order[++no] = m
			v = $0; sub(/.*70: /, "", v); sub(/ of its solo rate.*/, "", v)
			ok = ($NF == "ok"); n[m]++; good[m] += ok; fig[m] = fig[m] (n[m] > 1 ? ", " : "") (ok ? "ok " : "FAIL ") v
		}
		END { for (j = 1; j <= no; j++) { m = order[j]
			printf "%smixedab launch-bound mlp at 30 beside attn at 70, %s: %s in %d of %d rounds (%s)", (j > 1 ? "\n" : ""), m,
				(2 * good[m] > n[m]) ? "ok" : "FAIL", good[m], n[m], fig[m] } }')"
fi
debug_summary
