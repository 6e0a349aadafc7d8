# SPDX-License-Identifier: Apache-2.0
# Shared by run-tests.sh and run-bench.sh: builds the GPU programs and sets up
# standalone use of the hook (the administrator's config allowing TESSERA_LIMITS_FILE,
# which needs root).
set -u
B=$(cd "$1" && pwd)
HERE=$(cd "$(dirname "$0")/.." && pwd)
# TESSERA_GPU_DRY_RUN=<dir>: a dry run of a script's own logic on a machine without a
# GPU (test/gpu-scripts.sh), with stand-ins for nvidia-smi and the GPU programs first
# on PATH: nothing is built for the GPU, its files and the GPU's turn file live under
# <dir>, and neither root nor /etc/tessera is needed.
DRY=${TESSERA_GPU_DRY_RUN:-}
G=${DRY:+$DRY/gpu}
G=${G:-$B/gpu}
mkdir -p "$G"
RES=${OUT:-$G}
HOOK=$B/libtessera-cuda.so
# Without the hook, LD_PRELOAD is skipped with only a loader warning and every
# "hooked" figure would be an unhooked one.
[ -f "$HOOK" ] || { echo "no $HOOK: build the hook first (make -C cuda-hook)" >&2; exit 1; }
if [ -z "$DRY" ]; then
	CUDA_INC=$(dirname "$(command -v nvcc)")/../include
	if [ ! -e "$CUDA_INC/cuda.h" ]; then CUDA_INC=$(dirname "$(find / -name cuda.h -path '*include*' -not -path '/proc/*' 2>/dev/null | head -1)"); fi
	LIBCUDA_DIR=$(dirname "$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')")
fi
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
CTX=576
# The GPU's turn file, as the node agent provides it to every paced container
# (api.ContainerTurnsDir; docs/cuda-hook.md, "GPU turns"); TESSERA_TURNS=off runs
# without it, each container paced on its own. turns <on|off> sets it up afresh.
TURNS_DIR=${DRY:+$DRY/turns}
TURNS_DIR=${TURNS_DIR:-/run/tessera-turns}
turns() {
	mkdir -p "$TURNS_DIR"
	rm -f "$TURNS_DIR/$UUID"
	[ "$1" = off ] || truncate -s 4096 "$TURNS_DIR/$UUID"
}

if [ -z "$DRY" ]; then
	if [ "$(id -u)" != 0 ]; then echo "the GPU suite sets up /etc/tessera and needs root"; exit 1; fi
	mkdir -p /etc/tessera
	printf 'allow-env-limits yes\n' >/etc/tessera/cuda-hook.conf
	chmod 644 /etc/tessera/cuda-hook.conf
fi
turns "${TESSERA_TURNS:-on}"

# limits <file> <memory-mib> <cores> <phase> [cgroup]: under the kernel charge model,
# the node agent's default, with the charge line (docs/cuda-hook.md, "Charge
# models"), as the agent writes it; TESSERA_BENCH_CHARGE=class without it, as the
# agent's --pacing-charge=class does.
limits() {
	local charge=
	case ${TESSERA_BENCH_CHARGE:-kernel} in
	kernel) charge='charge kernel\n' ;;
	class) ;;
	*) echo "TESSERA_BENCH_CHARGE=$TESSERA_BENCH_CHARGE: want kernel or class" >&2 && exit 2 ;;
	esac
	printf "version 1\ncgroup %s\ncontext-mib %s\n${charge}gpu %s %s %s %s\n" "${5:-/gpu-test/$(basename "$1")}" $CTX "$UUID" "$2" "$3" "$4" >"$1"
}
# hooked <limits-file> <command...>
hooked() {
	f=$1
	shift
	TESSERA_LIMITS_FILE=$f LD_PRELOAD=$HOOK "$@"
}

build_gpu_programs() {
	gcc -O2 -I"$CUDA_INC" "$HERE/gpu/b5_paths.c" -o "$G/b5_paths" -L"$LIBCUDA_DIR" -l:libcuda.so.1 -ldl || return 1
	gcc -O2 -I"$CUDA_INC" "$HERE/gpu/ctx_mem.c" -o "$G/ctx_mem" -L"$LIBCUDA_DIR" -l:libcuda.so.1 || return 1
	gcc -O2 -I"$CUDA_INC" "$HERE/gpu/orphan.c" -o "$G/orphan" -L"$LIBCUDA_DIR" -l:libcuda.so.1 || return 1
	nvcc -O2 -arch=sm_90 "$HERE/gpu/pace.cu" -o "$G/pace" || return 1
}

# The SM clock (MHz) and board power (W), every 50 ms for the whole run, from NVML
# (its clock samples are not kept by every driver): "<epoch-us> <MHz> <W>" lines in
# $G/clock.log, from nvml_clock_log until the script exits.
nvml_clock_log() {
	python3 - >"$G/clock.log" 2>/dev/null <<'EOF' &
import time
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    while True:
        c = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        p = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
        print(int(time.time() * 1e6), c, f"{p:.0f}", flush=True)
        time.sleep(0.05)
except Exception:
    pass
EOF
	CLOCK_PID=$!
	trap 'kill $CLOCK_PID 2>/dev/null' EXIT
}

# NVML's mean GPU utilisation, and the sampled SM clock and power, between two
# epoch-microsecond stamps: "<util> <MHz> <W>", -1 for what NVML does not give.
util() {
	local u
	u=$(python3 - "$1" "$2" <<'EOF'
import sys
try:
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    t0, t1 = int(sys.argv[1]), int(sys.argv[2])
    _, samples = pynvml.nvmlDeviceGetSamples(h, pynvml.NVML_GPU_UTILIZATION_SAMPLES, t0)
    v = [s.sampleValue.uiVal for s in samples if t0 <= s.timeStamp <= t1]
    print(f"{sum(v) / len(v):.1f}" if v else "-1")
except Exception:
    print("-1")
EOF
	)
	echo "$u $(awk -v a="$1" -v b="$2" '$1 >= a && $1 <= b {n++; c += $2; p += $3} END {if (n) printf "%.0f %.0f", c/n, p/n; else print "-1 -1"}' "$G/clock.log")"
}
# nvml <output-line>: NVML's utilisation, SM clock and power over the line's measured
# interval. NVML keeps only the last seconds of utilisation samples, so a row reported
# long after its run (paired's, after all its rounds) reads them as remembered right
# after the run: a call in this shell (not in $(...)) remembers them.
declare -A NVML_SEEN
nvml() {
	local k
	k="$(field t0_us <<<"$1") $(field t1_us <<<"$1")"
	[ -n "${NVML_SEEN[$k]:-}" ] || NVML_SEEN[$k]=$(util $k)
	echo "${NVML_SEEN[$k]}"
}
