#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# B7, co-located throughput on a real GPU (make bench-b7): two to four tenants run
# together on one GPU with no limits, with the CUDA hook's pacing (gpu-cores as
# cores, non-overlapping phases, as the node agent places them) and under MPS (one
# MPS control daemon for the GPU, gpu-cores as CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, the
# hook enforcing memory only, as Tessera binds an MPS container). Each tenant's share
# is its rate over the solo rate of one unhooked process of its kind, measured in the
# same run; the aggregate is the sum of the shares. Results: $OUT (or build/gpu)/b7.txt.
. "$(dirname "$0")/common.sh" "$1"
LOG=$RES/b7.txt
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
D=${B7_SECONDS:-2}
CUDA_LIB=$(dirname "$(command -v nvcc)")/../lib64
[ "$G/b7" -nt "$HERE/gpu/b7.cu" ] || nvcc -O2 -arch=sm_90 "$HERE/gpu/b7.cu" -o "$G/b7" -lcublas -Xlinker -rpath,"$CUDA_LIB" 2>"$G/b7.build" ||
	{ say "no cuBLAS: the mm tenant is a compute-bound FMA kernel"; nvcc -O2 -arch=sm_90 -DNO_CUBLAS "$HERE/gpu/b7.cu" -o "$G/b7"; } ||
	{ say "building b7 failed"; cat "$G/b7.build"; exit 1; }
"$G/b7" launch 0.2 0 >/dev/null 2>&1 || { say "the cuBLAS build does not run: the mm tenant is a compute-bound FMA kernel"; nvcc -O2 -arch=sm_90 -DNO_CUBLAS "$HERE/gpu/b7.cu" -o "$G/b7"; }
[ -n "${B7_BUILD_ONLY:-}" ] && exit 0
MPSCTL=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
PATH=$(dirname "$MPSCTL"):$PATH
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
say "B7 machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); ${D}s windows"

declare -A SOLO
SOLO[mm]=$("$G/b7" mm "$D" 0 | field rate)
line=$("$G/b7" launch "$D" 0)
SOLO[launch]=$(field rate <<<"$line")
# How much of the GPU the launch-bound loop holds alone (its kernels' GPU time run back
# to back, times its solo rate): B7's target for it is 0.9 x min(share, that) / that of
# its solo rate.
NEED=$(sed -n 's/.*busy=\([0-9.]*\).*/\1/p' <<<"$line")
say "B7 solo rates (one unhooked process): mm ${SOLO[mm]}/s launch ${SOLO[launch]}/s (its kernels $(sed -n 's/.*kernel_ns=\([0-9]*\).*/\1/p' <<<"$line") ns each back to back: the GPU held ${NEED:-?} % of the time alone)"

MPS=$G/mps
mkdir -p "$MPS/pipe" "$MPS/log"
mps_env() { echo "CUDA_VISIBLE_DEVICES=$UUID CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe CUDA_MPS_LOG_DIRECTORY=$MPS/log"; }
env $(mps_env) "$MPSCTL" -d || { say "MPS control daemon did not start"; exit 1; }

# mix <mode> <kind:share>...: the tenants start together and measure one window. Each
# tenant is a container of its own (its own cgroup line, so no state is carried from
# an earlier mix's tenant).
MIXN=0
mix() {
	local mode=$1 i=0 phase=0 pids=() names=() shares=() total=0 start verdict=
	shift
	MIXN=$((MIXN + 1))
	start=$(awk -v t="$(date +%s.%N)" 'BEGIN{printf "%.3f", t + 1.5}')
	for t in "$@"; do
		local kind=${t%%:*} share=${t##*:}
		case $mode in
		none) "$G/b7" "$kind" "$D" "$start" >"$G/t$i.out" 2>&1 & ;;
		hook)
			limits "$G/l$i" 20000 "$share" "$phase" "/b7/$$-$MIXN-$i"
			hooked "$G/l$i" "$G/b7" "$kind" "$D" "$start" >"$G/t$i.out" 2>&1 &
			;;
		sliced)
			# The matmul tenants paced as under hook, the launch-bound ones without
			# the hook: what the GPU's time slicing alone leaves them beside paced
			# long kernels, the most any pacing of theirs could give them.
			limits "$G/l$i" 20000 "$share" "$phase" "/b7/$$-$MIXN-$i"
			if [ "$kind" = launch ]; then
				"$G/b7" "$kind" "$D" "$start" >"$G/t$i.out" 2>&1 &
			else
				hooked "$G/l$i" "$G/b7" "$kind" "$D" "$start" >"$G/t$i.out" 2>&1 &
			fi
			;;
		mps)
			limits "$G/l$i" 20000 0 0 "/b7/$$-$MIXN-$i"
			CUDA_MPS_PIPE_DIRECTORY=$MPS/pipe CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$share \
				hooked "$G/l$i" "$G/b7" "$kind" "$D" "$start" >"$G/t$i.out" 2>&1 &
			;;
		esac
		pids+=($!)
		names+=("$kind")
		shares+=("$share")
		phase=$((phase + share))
		i=$((i + 1))
	done
	wait "${pids[@]}"
	if [ -n "${B7_DEBUG:-}" ]; then
		for ((j = 0; j < i; j++)); do grep -h "pacing summary" "$G/t$j.out" | sed "s#^#$mode $* tenant $j: #"; done >>"$RES/b7-debug.log"
	fi
	local out=""
	for ((j = 0; j < i; j++)); do
		local r
		r=$(field rate <"$G/t$j.out")
		if [ -z "$r" ]; then
			say "B7 mode=$mode mix=$(
				IFS=+
				echo "$*"
			) tenant $j FAILED: $(tail -2 "$G/t$j.out" | tr '\n' ' ')"
			return
		fi
		local s
		s=$(awk -v r="$r" -v b="${SOLO[${names[$j]}]}" 'BEGIN{printf "%.1f", 100*r/b}')
		out="$out${out:+ }$s"
		total=$(awk -v a="$total" -v s="$s" 'BEGIN{printf "%.1f", a+s}')
		# B7's target: 0.9 x min(share, need) / need of the solo rate, need being
		# what the tenant holds of the GPU alone (the matmuls all of it; the
		# launch-bound loop what it measured, else all of it). No target without
		# limits.
		if [ "$mode" != none ]; then
			local need=100
			[ "${names[$j]}" != launch ] || need=${NEED:-100}
			verdict="$verdict${verdict:+ }$(awk -v s="$s" -v c="${shares[$j]}" -v n="$need" 'BEGIN{
				w = 0.9 * (c < n ? c : n) / n * 100; printf "%s(want>=%.1f)", (s >= w) ? "ok" : "MISS", w }')"
		fi
	done
	say "B7 mode=$mode mix=$(
		IFS=+
		echo "$*"
	) shares=${out// /,} aggregate=$total${verdict:+ $verdict}"
}

# B7_DEBUG=1: the hook logs at debug level and its pacing summaries go to b7-debug.log.
[ -n "${B7_DEBUG:-}" ] && export TESSERA_HOOK_LOG=debug && : >"$RES/b7-debug.log"
# B7_MIXES overrides the mixes: "mm:30 mm:70;mm:50 launch:50"; B7_MODES the modes
# ("hook" alone, to check a change of the hook's pacing in a third of the time;
# "sliced", not run by default: the matmul tenants paced, the launch-bound ones
# unhooked, for what time slicing alone leaves the latter).
MIXES=("mm:30 mm:70" "mm:50 launch:50" "mm:25 mm:25 launch:25 launch:25" "mm:25 mm:25 mm:25 mm:25")
[ -n "${B7_MIXES:-}" ] && IFS=';' read -ra MIXES <<<"$B7_MIXES"
for m in "${MIXES[@]}"; do
	for mode in ${B7_MODES:-none hook mps}; do
		# shellcheck disable=SC2086
		mix $mode $m
	done
done
echo quit | env $(mps_env) "$MPSCTL"
