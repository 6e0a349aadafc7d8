#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A dry run of the GPU benchmark scripts on a machine without a GPU: stand-ins for
# python3 (the PyTorch workloads print made-up rates and busy fractions, NVML reads
# nothing), nvidia-smi, nvcc (each CUDA program it builds prints made-up figures in its
# program's format) and the MPS control daemon come first on PATH, and common.sh's
# TESSERA_GPU_DRY_RUN keeps every file under a directory of the run's. gpu/b4-classes.sh
# runs every part for a class that holds the GPU more than half the time and one that
# holds less, attention left out of B4_CLASSES (the parts that pair it measure it),
# then again from the references the first run kept (B4_REUSE=1: the pairs as MPS
# clients, and ab), and beside a node's
# share file (its phases part not run, the file kept); gpu/b4-matrix.sh and
# gpu/run-b7.sh run whole. It checks the scripts' own logic, their rows present and no
# shell error, never a figure: the scripts otherwise run only on GPU machines, where a
# typo costs a call.
#
#   test/gpu-scripts.sh <build-dir>
set -eu
cd "$(dirname "$0")/.."
B=${1:-build}
D=$(mktemp -d "$(cd "$B" && pwd)/gpu-dry.XXXXXX")
# KEEP=1 keeps the run's directory (its out/ holds the last script's results).
trap '[ -n "${KEEP:-}" ] || rm -rf "$D"' EXIT
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
		if [ -n "${TESSERA_BENCH_PHASES:-}" ]; then
			# The share file torch_work.py writes must be where the script made it.
			IFS=: read -r f c k _ <<<"$TESSERA_BENCH_PHASES"
			grep -q "^share $c\$" "$f" || { echo "no share $c in $f" >&2; exit 1; }
			echo "$w phases cap=$c unpaced=$r/$r capped=$r/$r rate_u=$r rate_c=$(awk -v r=$r 'BEGIN{ printf "%.3f", r / 2 }') nvml_u=$held nvml_c=$c.0"
			continue
		fi
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
cat >"$D/bin/nvcc" <<'MOCK'
#!/bin/bash
# nvcc ... <program>.cu ... -o <out>: <out> prints what the program prints.
o= src=
while [ $# -gt 0 ]; do
	case $1 in -o) o=$2 && shift ;; *.cu) src=$(basename "$1") ;; esac
	shift
done
case $src in
work.cu) cat >"$o" <<'W'
#!/bin/bash
now=$(date +%s%6N)
case $1 in
calib) echo "iters=$(($2 * 100))" ;;
*) echo "rate=$(awk -v s=$RANDOM 'BEGIN{ printf "%.3f", 1000 * (0.9 + 0.2 * s / 32767) }') n=100 wall=0.100 t0_us=$now t1_us=$((now + 1000))" ;;
esac
W
	;;
pace.cu) cat >"$o" <<'W'
#!/bin/bash
echo "path=$2 kernels=1000 seconds=$3 rate=$(awk -v s=$RANDOM 'BEGIN{ printf "%.1f", 10000 * (0.9 + 0.2 * s / 32767) }')"
W
	;;
b7.cu) cat >"$o" <<'W'
#!/bin/bash
echo "mode=$1 n=100 seconds=$2 rate=$(awk -v s=$RANDOM 'BEGIN{ printf "%.1f", 1000 * (0.9 + 0.2 * s / 32767) }') kernel_ns=5000 busy=79.3"
W
	;;
*) printf '#!/bin/bash\nexit 0\n' >"$o" ;;
esac
chmod +x "$o"
MOCK
printf '#!/bin/bash\n[ "${1:-}" = -d ] || cat >/dev/null\n' >"$D/bin/nvidia-cuda-mps-control"
chmod +x "$D/bin/python3" "$D/bin/nvidia-smi" "$D/bin/nvcc" "$D/bin/nvidia-cuda-mps-control"
# run <script> [<VAR=value>...]: the script dry, its output in $D/log.
run() {
	local rc=0 script=$1
	shift
	PATH=$D/bin:$PATH TESSERA_GPU_DRY_RUN=$D OUT=$D/out B4_SECONDS=0.1 B7_SECONDS=0.1 B4_CLASSES="llm convnet" \
		env "$@" "gpu/$script" "$B" >"$D/log" 2>&1 || rc=$?
	if [ $rc != 0 ]; then
		cat "$D/log"
		echo "FAIL $script exited $rc"
		exit 1
	fi
	if grep -n "unbound variable\|syntax error\|command not found\|: line [0-9]*:" "$D/log"; then
		echo "FAIL $script: shell errors above"
		exit 1
	fi
}
# want <results file> <pattern>
want() {
	grep -q "$2" "$D/out/$1" || { cat "$D/out/$1"; echo "FAIL $1: no line matching '$2'"; exit 1; }
}
run b4-classes.sh B4_PARTS="alone pairs mixed ab sliced phases" B4_MIXED="70:llm/30:convnet"
[ ! -e "$D/shares" ] || [ -z "$(ls -A "$D/shares")" ] || { ls -R "$D/shares"; echo "FAIL b4-classes.sh: its share file left behind"; exit 1; }
for w in llm convnet; do
	want b4-classes.txt "^phases cap 50 *$w .* unpaced.*\[NVML 50.0% capped"
	want b4-classes.txt "^solo $w: rate"
	want b4-classes.txt "^alone cap 25 *$w "
	want b4-classes.txt "^pair 30 of 30/70 *$w "
	want b4-classes.txt "^sliced u70 of 30/u70 *$w "
	want b4-classes.txt "^sliced u30 of u30/70 *$w .*unhooked beside the paced tenants"
done
want b4-classes.txt "^solo attn: rate"
want b4-classes.txt "^mixed 70 of 70/30 *llm .*(cap 70"
want b4-classes.txt "^mixed 30 of 70/30 *convnet "
want b4-classes.txt "^mixed launch-bound mlp at 30 beside attn at 70"
want b4-classes.txt "^ab convnet "
want b4-classes.txt "info (cap .*host-paced"
run b4-classes.sh B4_REUSE=1 B4_PARTS="pairs mps" B4_PAIR_CAPS="30/70 27/70"
want b4-classes.txt "^pair 27 of 27/70 *llm "
for w in llm convnet; do
	want b4-classes.txt "^mps 30 of 30/70 *$w .* of solo, [0-9.]*% of an unhooked time-sliced pair's tenant"
	want b4-classes.txt "^mps 50 of 50/50 *$w "
done
want b4-classes.txt "^mps launch-bound mlp at 30 beside attn at 70"
run b4-classes.sh B4_REUSE=1 B4_PARTS="ab pairab mixedab"
want b4-classes.txt "^solo llm: .*(reused)"
want b4-classes.txt "^ab convnet "
for w in llm convnet; do
	want b4-classes.txt "^pairab3 unhooked pair $w: rates"
	want b4-classes.txt "^pairab3 70 of 30/70 *$w "
	want b4-classes.txt "^pairab 30 of 30/70 *$w *\(ok  \|FAIL\) in [0-3] of 3 rounds ([ok FAIL].*, .*, .*)"
	want b4-classes.txt "^pairab 50 of 50/50 (second) *$w .* of 3 rounds"
done
want b4-classes.txt "^mixedab2 solo mlp: rate [0-9.]*/s"
want b4-classes.txt "^mixedab3 launch-bound mlp at 30 beside attn at 70: [0-9.]*% of its solo rate"
want b4-classes.txt "^mpsab3 launch-bound mlp at 30 beside attn at 70: "
want b4-classes.txt "^mixedab launch-bound mlp at 30 beside attn at 70, paced: \(ok\|FAIL\) in [0-3] of 3 rounds ([ok FAIL].*, .*, .*)"
want b4-classes.txt "^mixedab launch-bound mlp at 30 beside attn at 70, as MPS clients: .* of 3 rounds"
# A share file already there is a node's: phases is not run, and the file is kept.
U=$(PATH=$D/bin:$PATH nvidia-smi --query-gpu=uuid --format=csv,noheader)
mkdir -p "$D/shares/$U"
echo node >"$D/shares/$U/share"
run b4-classes.sh B4_REUSE=1 B4_PARTS=phases
want b4-classes.txt "^phases: not run: .* is there already"
[ "$(cat "$D/shares/$U/share")" = node ] || { echo "FAIL b4-classes.sh: a node's share file overwritten"; exit 1; }
run b4-matrix.sh
for p in "^solo k10us: rate" "^pair 30/70 *k1ms " "^alone cap 80 *mm8192 " "^B4 matrix: "; do
	want b4-matrix.txt "$p"
done
run run-b7.sh
for m in none hook mps; do
	want b7.txt "^B7 mode=$m mix=mm:25+mm:25+launch:25+launch:25 shares="
done
# pairs-ab.sh with the hook built here named twice (two builds set side by side).
rc=0
PATH=$D/bin:$PATH TESSERA_GPU_DRY_RUN=$D OUT=$D/out gpu/pairs-ab.sh "$B" "$B/libtessera-cuda.so" "$B/libtessera-cuda.so" >"$D/log" 2>&1 || rc=$?
[ $rc = 0 ] || { cat "$D/log"; echo "FAIL pairs-ab.sh exited $rc"; exit 1; }
if grep -n "unbound variable\|syntax error\|command not found\|: line [0-9]*:\|division" "$D/log" ||
	! grep -q "^hook 2 .* round 2: 50 / 50 [0-9.]* / [0-9.]*$" "$D/log"; then
	cat "$D/log"
	echo "FAIL pairs-ab.sh: shell errors or no second hook's 50 / 50 in its last round"
	exit 1
fi
# pace-trace.py on a made-up trace: a step of a templated PyTorch kernel, one in an
# anonymous namespace (the trace's mangled names cut short) and a plain name cut
# short, charged 1.5x the profiler's 20 us a step.
mkdir -p "$D/trace"
cat >"$D/trace/w.kernels" <<'EOF'
w steps=10 wall_s=1 kernels_per_step=3.0 kernel_us_per_step=20.0
kernel count=1.00 mean_us=4.00 name=void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)
kernel count=1.00 mean_us=6.00 name=void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 4, 64, 64>(float*, unsigned int)
kernel count=1.00 mean_us=10.00 name=cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0
EOF
{
	echo "# pid 1: key cls launches charged_ns samples idle raw_ns gap_ns folded_ns min_ns max_ns first_ns met off_ns name"
	echo "0x1 0 10 60000 2 1 12000 0 12000 6000 6000 6000 0 0 _ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEESt5arrayIPcLm1EEEEviT0_T1_"
	echo "0x2 0 10 90000 2 1 18000 0 18000 9000 9000 9000 0 0 _ZN2at6native40_GLOBAL__N__49f7391c_8_Shape_cu_0f1a810719CatArrayBatchedCopyIfjLi4ELi64ELi64EEEvPT_"
	echo "0x3 0 10 150000 2 1 30000 0 30000 15000 15000 15000 0 0 cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_ker"
} >"$D/trace/w.25.kernel.trace"
out=$(python3 gpu/pace-trace.py "$D/trace" w) || { echo "FAIL pace-trace.py exited $?"; exit 1; }
echo "$out" | grep -qF "whole step (10.0 steps by launches): charged 30.0 us a step against 20.0 us of kernels (ratio 1.50); by function, templates pooled, 3 named by both: 30.0 against 20.0 (ratio 1.50)" || {
	echo "$out"
	echo "FAIL pace-trace.py: the whole step's charge not read by function"
	exit 1
}
echo "ok gpu scripts: b4-classes.sh's every part dry (phases and MPS pairs included), again from its kept references and beside a node's share file; b4-matrix.sh, run-b7.sh and pairs-ab.sh dry; pace-trace.py pools a made-up step's kernels by function"
