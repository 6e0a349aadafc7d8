#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A dry run of gpu/b4-classes.sh on a machine without a GPU: stand-ins for python3 (the
# PyTorch workloads print made-up rates and busy fractions, NVML reads nothing) and for
# nvidia-smi come first on PATH, and common.sh's TESSERA_GPU_DRY_RUN keeps every file
# under a directory of the run's. Every part runs through for a class that holds the
# GPU more than half the time and one that holds less, attention left out of
# B4_CLASSES (the mixed, mps-free parts pair it), then again from the references the
# first run kept (B4_REUSE=1). It checks the script's own logic, its rows and verdicts
# present and no shell error, never a figure: the script is otherwise run only on GPU
# machines, where a typo costs a call.
#
#   test/gpu-scripts.sh <build-dir>
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
D=$(mktemp -d "$(cd "$B" && pwd)/gpu-dry.XXXXXX")
trap 'rm -rf "$D"' EXIT
mkdir -p "$D/bin" "$D/out"
cat >"$D/bin/python3" <<'MOCK'
#!/bin/bash
# torch_work.py <seconds> <workload>...: a made-up rate each, its solo runs 20 % apart
# for llm (a host-paced step), and busy fractions under TESSERA_BENCH_BUSY.
case "${1:-}" in
*torch_work.py)
	shift 2
	now=$(date +%s%6N)
	for w in "$@"; do
		case $w in llm) base=40 held=37.6 ;; convnet) base=300 held=15.1 ;; attn) base=800 held=76.4 ;; *) base=600 held=7.1 ;; esac
		r=$(awk -v b=$base -v s=$RANDOM 'BEGIN{ printf "%.3f", b * (0.8 + 0.4 * s / 32767) }')
		extra=
		[ -z "${TESSERA_BENCH_BUSY:-}" ] || extra=" busy=$held held=$held prate=$((base * 2 / 3))"
		echo "$w rate=$r cpu_us=1 t0_us=$now t1_us=$((now + 1000))$extra"
	done
	;;
-) echo -1 ;; # NVML's readings (common.sh's util and clock log): none
*) exit 1 ;;
esac
MOCK
cat >"$D/bin/nvidia-smi" <<'MOCK'
#!/bin/bash
case "$*" in *uuid*) echo GPU-d1700000-0000-0000-0000-000000000000 ;; *) echo "dry run, 0.0" ;; esac
MOCK
chmod +x "$D/bin/python3" "$D/bin/nvidia-smi"
run() {
	local rc=0
	PATH=$D/bin:$PATH TESSERA_GPU_DRY_RUN=$D OUT=$D/out B4_SECONDS=0.1 B4_CLASSES="llm convnet" "$@" \
		gpu/b4-classes.sh "$B" >"$D/log" 2>&1 || rc=$?
	if [ $rc != 0 ]; then
		cat "$D/log"
		echo "FAIL b4-classes.sh exited $rc"
		exit 1
	fi
	if grep -n "unbound variable\|syntax error\|command not found\|: line [0-9]*:" "$D/log"; then
		echo "FAIL b4-classes.sh: shell errors above"
		exit 1
	fi
}
want() {
	grep -q "$1" "$D/out/b4-classes.txt" || { cat "$D/out/b4-classes.txt"; echo "FAIL b4-classes.sh: no line matching '$1'"; exit 1; }
}
run env B4_PARTS="alone pairs mixed ab sliced"
for w in llm convnet; do
	want "^solo $w: rate"
	want "^alone cap 25 *$w "
	want "^pair 30 of 30/70 *$w "
	want "^sliced u70 of 30/u70 *$w "
done
want "^solo attn: rate"
want "^mixed launch-bound mlp at 30 beside attn at 70"
want "^ab convnet "
want "info (cap .*host-paced"
run env B4_REUSE=1 B4_PARTS="ab"
want "^solo llm: .*(reused)"
want "^ab convnet "
echo "ok gpu scripts: b4-classes.sh's every part in a dry run, and again from its kept references"
