#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# B4 on real work (make bench-gpu, or on its own: gpu/b4-matrix.sh <build-dir>): each
# workload's rate under the hook as a share of its own unhooked solo rate, measured in
# the same run, alone at caps 20/50/80, in pairs at 30/70 and 50/50, and three tenants
# at 20/30/50. Results go to $OUT (or build/gpu)/b4-matrix.txt.
#
# A row's target depends on how much of the GPU the workload needs (its GPU
# utilisation alone, from NVML's samples over its measured interval):
#   need >= 90%            saturating: share within +-3 points of the cap; alone, a
#                          power-bound kernel (its SM clock more than 5 % above its
#                          solo run's) by its share of the GPU's time, NVML's busy time
#                          over its solo run's, not by its rate (see row)
#   need <= cap - 5        not slowed: share >= 95%; a program that needs at most 25 %
#                          alone, and a PyTorch pair: >= 95% of the rate of its
#                          unhooked twin, the same program without limits started
#                          beside it at the same moment, the geometric mean of
#                          B4_ROUNDS rounds, 8, with its 95 % confidence interval
#                          (see "Twins" below); the C loop pair: >= 95% of
#                          its rate in the same pair without limits, run right before
#                          (two launch-bound programs slow each other on a
#                          time-sliced GPU with no limits at all, and that is not the
#                          hook's to undo)
#   otherwise              held to its cap: share about 100 * cap / need (shown, no verdict,
#                          since NVML's utilisation is too coarse to score it to 3 points)
. "$(dirname "$0")/common.sh" "$1"
M=$RES/b4-matrix.txt
: >"$M"
say() { echo "$*" | tee -a "$M"; }
S=${B4_SECONDS:-1.5}
LONG_S=${B4_LONG_SECONDS:-3}
nvcc -O2 -arch=sm_90 "$HERE/gpu/work.cu" -o "$G/work" -lcuda || { say "building gpu/work.cu failed"; exit 1; }
W=$G/work
TW="python3 $HERE/gpu/torch_work.py"
field() { sed -n "s/.*$1=\([0-9.-]*\).*/\1/p" | head -1; }
declare -A IT
for us in 5 10 100 1000 5000 20000; do IT[$us]=$("$W" calib $us | field iters); done
say "B4 matrix $(date -u +%F), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader), GPU turns ${TESSERA_TURNS:-on}; FMA iterations per kernel: 5us=${IT[5]} 10us=${IT[10]} 100us=${IT[100]} 1ms=${IT[1000]} 5ms=${IT[5000]} 20ms=${IT[20000]}"

# The C workloads: name -> command (without the seconds).
declare -A CW=(
	[k10us]="$W kernel ${IT[10]}"
	[k100us]="$W kernel ${IT[100]}"
	[k1ms]="$W kernel ${IT[1000]}"
	[k5ms]="$W kernel ${IT[5000]}"
	[k20ms]="$W kernel ${IT[20000]}"
	[graph10x100us]="$W graph ${IT[100]}"
	[loop]="$W loop ${IT[5]} 300"
)
# B4_CNAMES, B4_TNAMES, B4_ALONE_ONLY=1 (no tenants together) and B4_PARTS (of
# "pairs wc alone", the default) cut the matrix down for a look at some rows; the
# published matrix is the whole one.
CNAMES=${B4_CNAMES-k10us k100us k1ms k5ms k20ms graph10x100us loop}
TNAMES=${B4_TNAMES-mm2048 mm4096 mm8192 mlp}
secs() { [ "$1" = k20ms ] && echo "$LONG_S" || echo "$S"; }
PARTS=${B4_PARTS:-pairs wc alone}
[ -z "${B4_ALONE_ONLY:-}" ] || PARTS=alone
part() { [[ " $PARTS " == *" $1 "* ]]; }
# known <workload>: it is one of this run's (B4_CNAMES, B4_TNAMES); rows of others are left out.
known() { [[ " $CNAMES $TNAMES " == *" $1 "* ]]; }

nvml_clock_log

# hk: hooked, with the hook's debug log (every burst's GPU time and charge) kept in
# b4-debug.log when B4_DEBUG is set.
hk() {
	if [ -n "${B4_DEBUG:-}" ]; then
		echo "== $*" >>"$RES/b4-debug.log"
		TESSERA_HOOK_LOG=debug hooked "$@" 2>>"$RES/b4-debug.log"
	else
		hooked "$@"
	fi
}

declare -A SOLO NEED CLK PWR
# Each tenant's unhooked rate beside the same neighbours, for the not-slowed rows of a
# pair (unhooked and paired, below).
PAIR_REF=()
# Each tenant's ratio to its twins over rounds, "mean low high" (paired, below).
PAIR_RATIO=()
# Solo, unhooked.
for w in $CNAMES; do
	out=$(${CW[$w]} "$(secs $w)")
	SOLO[$w]=$(field rate <<<"$out")
	read -r NEED[$w] CLK[$w] PWR[$w] <<<"$(nvml "$out")"
done
[ -z "$TNAMES" ] || $TW "$S" $TNAMES >"$G/torch.solo" || say "torch workloads failed"
for w in $TNAMES; do
	out=$(grep "^$w " "$G/torch.solo")
	SOLO[$w]=$(field rate <<<"$out")
	read -r NEED[$w] CLK[$w] PWR[$w] <<<"$(nvml "$out")"
done
for w in $CNAMES $TNAMES; do say "solo $w: rate ${SOLO[$w]}/s, GPU utilisation ${NEED[$w]}%, SM clock ${CLK[$w]} MHz, ${PWR[$w]} W"; done

fails=0
# row <label> <workload> <cap> <output-line>: the share and its verdict, and beside
# them what NVML saw over the run (utilisation of the whole GPU, so of every tenant
# in the pair and trio rows, the SM clock and the board's power): a power-bound
# kernel does more work per GPU-second at a higher clock, which a rate share counts
# and a time cap does not.
# row <label> <workload> <cap> <output-line> [<unhooked rate beside the same neighbour>
#     [<ratio to its twins over rounds: "mean low high">]]
row() {
	local share need=${NEED[$2]} verdict rate gpu clk pwr
	rate=$(field rate <<<"$4")
	read -r gpu clk pwr <<<"$(nvml "$4")"
	share=$(awk -v r="$rate" -v b="${SOLO[$2]}" 'BEGIN{if (b > 0) printf "%.1f", 100*r/b; else print "nan"}')
	# Alone, the GPU's busy time is the tenant's (not beside a twin): its share of the
	# solo run's is the time share the cap is about.
	local t=-1
	[[ $1 == alone* ]] && [ -z "${6:-}" ] && t=$(awk -v g="$gpu" -v n="$need" 'BEGIN{if (g >= 0 && n > 0) printf "%.1f", 100*g/n; else print -1}')
	verdict=$(awk -v s="$share" -v c="$3" -v n="$need" -v r="$rate" -v u="${5:-}" -v m="${6:-}" \
		-v t="$t" -v k="$clk" -v k0="${CLK[$2]}" 'BEGIN{
		if (s == "nan") { print "FAIL no rate"; exit }
		# A saturating kernel alone whose SMs ran more than 5 % faster than in its solo
		# run is power-bound: held to part of the time, the GPU runs it at a higher
		# clock, and its rate is no longer its share of the GPU'"'"'s time, which is what
		# gpu-cores caps (docs/cuda-hook.md, "Known gaps"). It is judged by its time.
		if ((n >= 90 || n < 0) && t >= 0 && k0 > 0 && k > 1.05 * k0) { e = t - c
			printf "%s err %+.1f in time (cap %d; power-bound: SM %d MHz, solo %d)", (e >= -3 && e <= 3) ? "ok  " : "FAIL", e, c, k, k0; exit }
		if (n >= 90 || n < 0) { e = s - c; printf "%s err %+.1f (cap %d)", (e >= -3 && e <= 3) ? "ok  " : "FAIL", e, c; exit }
		# Against its twins over rounds: ok at a mean of 95 % or more; slowed where
		# even the interval'"'"'s top is under 95 %; else the rounds cannot tell.
		if (n <= c - 5 && split(m, a, " ") == 3) { v = 100 * a[1]; lo = 100 * a[2]; hi = 100 * a[3]
			printf "%s not slowed: %.1f%% of its twins'"'"' rate (95%% CI %.1f-%.1f; cap %d, want >= 95)", (v >= 95) ? "ok  " : (hi < 95) ? "FAIL" : "info unsure", v, lo, hi, c; exit }
		if (n <= c - 5 && u > 0) { v = 100 * r / u; printf "%s not slowed: %.1f%% of its rate unhooked (cap %d, want >= 95)", (v >= 95) ? "ok  " : "FAIL", v, c; exit }
		if (n <= c - 5) { printf "%s not slowed (needs %.0f%%, cap %d, want >= 95)", (s >= 95) ? "ok  " : "FAIL", n, c; exit }
		printf "info held: expect about %.0f (needs %.0f%%, cap %d)", 100 * c / n, n, c }')
	# The pairs run without the turn file are there for comparison (how Tessera would
	# do without it), not a setting Tessera runs in: shown, not counted.
	[[ $1 == *"no turns"* ]] && verdict="ref  ${verdict:5}"
	case $verdict in FAIL*) fails=$((fails + 1)) ;; esac
	local tshare=""
	[ "$t" = -1 ] || tshare=", time share $t%"
	say "$(printf '%-26s %-14s share %6s%%  %-52s [GPU busy %s%%%s, SM %s MHz, %s W]' "$1" "$2" "$share" "$verdict" "$gpu" "$tshare" "$clk" "$pwr")"
}

# together <label> <cap:phase:workload[:wc]>...: the tenants at once, each in its own
# container; a tenant marked wc is work-conserving (the limits' work-conserving line).
together() {
	run_together "$@" && report_together "$@"
	PAIR_REF=()
}
# run_together <label> <spec>...: together's run; each tenant's output in $G/t<i>.out.
# Fails (runs nothing) where a workload is not one of this run's.
# With TWINS=1, each tenant's unhooked twin runs beside it too, its output in $G/u<i>.out.
run_together() {
	local label=$1 i=0 pids=()
	shift
	for t in "$@"; do
		IFS=: read -r c ph w x <<<"$t"
		known "$w" || return 1
	done
	local -x TESSERA_BENCH_BARRIER
	line_up $(for t in "$@"; do
		IFS=: read -r c ph w x <<<"$t"
		echo "$w"
		[ -z "${TWINS:-}" ] || echo "$w"
	done)
	for t in "$@"; do
		IFS=: read -r c ph w x <<<"$t"
		limits "$G/t$i" 130000 "$c" "$ph" "/b4/${label//[ \/]/_}/$w/$i"
		[ "$x" != wc ] || echo work-conserving >>"$G/t$i"
		hk "$G/t$i" $(cmd "$w") >"$G/t$i.out" &
		pids+=($!)
		if [ -n "${TWINS:-}" ]; then
			$(cmd "$w") >"$G/u$i.out" &
			pids+=($!)
		fi
		i=$((i + 1))
	done
	wait "${pids[@]}"
}
# line_up <workload>...: the PyTorch processes of the next run, started together, measure
# the same seconds (torch_work.py, TESSERA_BENCH_BARRIER, which the caller makes local
# and exported); a PyTorch process's start-up takes seconds, and is not what its
# neighbours' rates should be measured beside.
BARRIERS=0
line_up() {
	local n=0 w
	for w in "$@"; do [ -n "${CW[$w]:-}" ] || n=$((n + 1)); done
	BARRIERS=$((BARRIERS + 1))
	rm -rf "$G/barrier.$BARRIERS"
	TESSERA_BENCH_BARRIER=$G/barrier.$BARRIERS:$n
}
# cmd <workload>: its command line, seconds included.
cmd() {
	if [ -n "${CW[$1]:-}" ]; then echo "${CW[$1]} $(secs "$1")"; else echo "$TW $S $1"; fi
}
# report_together <label> <spec>...: the rows of the run in $G/t<i>.out, and how the
# tenants divided what the GPU delivered to them together: a time-sliced GPU loses the
# switches between busy contexts (two unhooked saturating processes get about 92 % of
# one's rate together), and the caps are shares of GPU time.
report_together() {
	local label=$1 i=0 shares="" caps=""
	shift
	for t in "$@"; do
		IFS=: read -r c ph w x <<<"$t"
		row "$label" "$w" "$c" "$(head -1 "$G/t$i.out")" "${PAIR_REF[$i]:-}" "${PAIR_RATIO[$i]:-}"
		shares="$shares $(awk -v r="$(field rate <"$G/t$i.out")" -v b="${SOLO[$w]}" 'BEGIN{if (b > 0) printf "%.2f", 100*r/b; else print 0}')"
		caps="$caps $c"
		i=$((i + 1))
	done
	[ "$i" -lt 2 ] || say "$(awk -v s="$shares" -v c="$caps" -v l="$label" 'BEGIN{
		n = split(s, a, " "); split(c, k, " "); t = 0; for (i = 1; i <= n; i++) t += a[i]
		o = ""; q = ""; for (i = 1; i <= n; i++) { o = o (i > 1 ? " / " : "") sprintf("%.1f", t > 0 ? 100 * a[i] / t : 0); q = q (i > 1 ? " / " : "") k[i] }
		printf "%-26s info split of their total %s (caps %s), together %.1f%% of one solo rate", l, o, q, t }')"
}
# Twins. A launch-bound program's rate is its host thread's, and the host's speed
# drifts: the same PyTorch loop, started again and again on an idle H200 host, reads
# 560-760 steps/s, pinned to its own cores or not. A not-slowed row therefore compares
# each tenant with an unhooked twin of itself (the same program without limits)
# started at the same moment beside it: both see the same host, and the twin's work
# on the GPU, a tenant's one more neighbour, is what the tenant's share must leave
# room for anyway. Two copies started together still differ: on the H200 host the
# ratio of a PyTorch loop to its twin spreads with a standard deviation of 8-12 %
# from round to round, the hook with pacing off (gpu-cores 100) included. So one
# round, or the median of five, says little about 5 %; the row is the geometric mean
# of B4_ROUNDS rounds (8) with its 95 % confidence interval, and the round nearest
# that mean is the one shown.
#
# paired <label> <spec>...: tenants that need less than their caps (one alone, or
# several together), each beside its twin.
paired() {
	local label=$1 r i n=${B4_ROUNDS:-8} ratios
	shift
	for ((r = 0; r < n; r++)); do
		TWINS=1 run_together "$label" "$@" || return
		mkdir -p "$G/round$r"
		for ((i = 0; i < $#; i++)); do
			cp "$G/t$i.out" "$G/u$i.out" "$G/round$r/"
			nvml "$(head -1 "$G/t$i.out")" >/dev/null
		done
	done
	for ((i = 0; i < $#; i++)); do
		ratios=""
		for ((r = 0; r < n; r++)); do
			ratios="$ratios $((r + 1)):$(ratio "$G/round$r/t$i.out" "$G/round$r/u$i.out")"
		done
		PAIR_RATIO[$i]=$(mean_ratio "$ratios")
		r=$(($(nearest_round "$ratios" "${PAIR_RATIO[$i]%% *}") - 1))
		cp "$G/round$r/t$i.out" "$G/t$i.out"
		say "$(printf '%-26s tenant %d: %d rounds, its rate against its twin'"'"'s:%s; geometric mean %s (95%% CI %s-%s), round %d shown' \
			"$label" "$((i + 1))" "$n" "$ratios" ${PAIR_RATIO[$i]} "$((r + 1))")"
	done
	report_together "$label" "$@"
	PAIR_RATIO=()
}
# ratio <hooked-output> <unhooked-output>: the first's rate over the second's.
ratio() {
	awk -v h="$(field rate <"$1")" -v u="$(field rate <"$2")" 'BEGIN{printf "%.4f", (u > 0 ? h / u : 0)}'
}
# mean_ratio "<round>:<ratio> ...": "<geometric mean> <low> <high>", the interval
# the 95 % one of Student's t over the logarithms (rounds whose ratio is 0, a
# process that gave no rate, count as 0.01).
mean_ratio() {
	tr ' ' '\n' <<<"$1" | sed '/^$/d' | cut -d: -f2 | awk '
		{ x = $1 > 0.01 ? $1 : 0.01; l[++n] = log(x); s += l[n] }
		END {
			m = s / n; v = 0; for (i = 1; i <= n; i++) v += (l[i] - m) ^ 2
			split("12.71 4.303 3.182 2.776 2.571 2.447 2.365 2.306 2.262 2.228 2.201 2.179 2.160 2.145 2.131", t, " ")
			q = n - 1 <= 15 ? t[n - 1] : 2.1
			h = n > 1 ? q * sqrt(v / (n - 1) / n) : 0
			printf "%.4f %.4f %.4f", exp(m), exp(m - h), exp(m + h) }'
}
# nearest_round "<round>:<ratio> ..." <ratio>: the round whose ratio is nearest.
nearest_round() {
	tr ' ' '\n' <<<"$1" | sed '/^$/d' | awk -F: -v m="$2" '{ d = $2 - m; d = d < 0 ? -d : d; if (NR == 1 || d < b) { b = d; r = $1 } } END { print r }'
}
# unhooked <label> <workload> <workload>: the same pair without limits, for reference;
# the next together's not-slowed rows are judged against these rates (PAIR_REF), a
# C program's rate being steady from one run to the next.
unhooked() {
	local label=$1 a=$2 b=$3
	known "$a" && known "$b" || return
	local -x TESSERA_BENCH_BARRIER
	line_up "$a" "$b"
	$(cmd "$a") >"$G/u0.out" &
	p=$!
	$(cmd "$b") >"$G/u1.out"
	wait $p
	PAIR_REF=("$(field rate <"$G/u0.out")" "$(field rate <"$G/u1.out")")
	say "$(printf '%-26s %-14s share %6s%% + %s%% (no limits, for reference)' "$label" "$a+$b" \
		"$(awk -v r="$(field rate <"$G/u0.out")" -v b="${SOLO[$a]}" 'BEGIN{printf "%.1f", 100*r/b}')" \
		"$(awk -v r="$(field rate <"$G/u1.out")" -v b="${SOLO[$b]}" 'BEGIN{printf "%.1f", 100*r/b}')")"
}

if part pairs; then
	together "pair 30/70" 30:0:k1ms 70:30:k1ms
	together "pair 30/70" 30:0:mm8192 70:30:mm8192
	together "pair 50/50" 50:0:k100us 50:50:k100us
	together "pair 50/50" 50:0:mm2048 50:50:mm2048
	# Kernels longer than a time slice: each would be cut by the other tenant's time
	# slices; the containers take the GPU's turns instead (docs/cuda-hook.md, "GPU
	# turns"), and the same pairs without the turn file are shown for comparison.
	unhooked "pair unhooked" k5ms k5ms
	together "pair 30/70" 30:0:k5ms 70:30:k5ms
	together "pair 50/50" 50:0:k5ms 50:50:k5ms
	unhooked "pair unhooked" k20ms k20ms
	together "pair 50/50" 50:0:k20ms 50:50:k20ms
	together "pair 30/70" 30:0:k20ms 70:30:k20ms
	together "three 20/30/50" 20:0:k20ms 30:20:k5ms 50:50:k20ms
	together "pair 50/50" 50:0:k20ms 50:50:k100us
	if [ "${TESSERA_TURNS:-on}" != off ]; then
		turns off
		together "pair 50/50 no turns" 50:0:k20ms 50:50:k20ms
		together "pair 30/70 no turns" 30:0:k20ms 70:30:k20ms
		turns on
	fi
	unhooked "pair 30/70 unhooked" loop loop
	together "pair 30/70" 30:0:loop 70:30:loop
	paired "pair 30/70" 30:0:mlp 70:30:mlp
	together "three 20/30/50" 20:0:k100us 30:20:k1ms 50:50:graph10x100us
fi

# Work-conserving at 30 (docs/cuda-hook.md, "Work-conserving"): alone it may use the
# whole GPU, so its row is judged against 100; beside a saturating 70 % tenant it
# keeps to 30 and the neighbour gets its 70.
if part wc; then
	for w in k1ms k20ms mm8192; do
		known "$w" || continue
		limits "$G/wc" 130000 30 0 "/b4/wc30/$w"
		echo work-conserving >>"$G/wc"
		if [ -n "${CW[$w]:-}" ]; then
			row "alone wc cap 30" $w 100 "$(hk "$G/wc" ${CW[$w]} "$(secs $w)")"
		else
			row "alone wc cap 30" $w 100 "$(hk "$G/wc" $TW "$S" $w | head -1)"
		fi
	done
	together "pair 30wc/70" 30:0:k1ms:wc 70:30:k1ms
	together "pair 30wc/70" 30:0:mm8192:wc 70:30:mm8192
fi

# host_bound <workload> <cap>: a not-slowed row (it needs at most cap - 5 % of the GPU)
# of a program light enough on the GPU (25 % at most) for a twin beside it to leave
# the GPU as free as it was: its host sets its pace. A heavier one is judged against
# its solo rate.
host_bound() {
	awk -v n="${NEED[$1]}" -v c="$2" 'BEGIN{exit !(n >= 0 && n <= c - 5 && n <= 25)}'
}

# A host-bound PyTorch program under the hook with pacing off (gpu-cores 100) beside
# its twin: what the hook's interception alone costs it, against which the not-slowed
# rows below, pacing and all, can be read.
part alone && for w in $TNAMES; do
	! host_bound "$w" 100 || paired "alone cap 100" "100:0:$w"
done

# Alone at B4_ALONE_CAPS (20 50 80; B4's targets name 10 and 75 too) after the
# tenants together, whose rows a run cut short by a time limit would otherwise lose.
# The PyTorch programs held to a cap run one after the other in one process, as in
# the solo run.
part alone && for c in ${B4_ALONE_CAPS:-20 50 80}; do
	held=""
	for w in $CNAMES $TNAMES; do
		if host_bound "$w" $c; then
			paired "alone cap $c" "$c:0:$w"
		elif [ -n "${CW[$w]:-}" ]; then
			limits "$G/m$c" 130000 $c 0 "/b4/alone$c/$w"
			row "alone cap $c" "$w" $c "$(hk "$G/m$c" $(cmd "$w"))"
		else
			held="$held $w"
		fi
	done
	[ -n "$held" ] || continue
	limits "$G/m$c" 130000 $c 0 "/b4/alone$c/torch"
	hk "$G/m$c" $TW "$S" $held >"$G/torch.$c"
	for w in $held; do row "alone cap $c" "$w" $c "$(grep "^$w " "$G/torch.$c")"; done
done
say "B4 matrix: $fails rows failed (the comparison rows without the turn file, ref, not counted)"
