#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Device memory a CUDA context takes, plain and as an MPS client at each given
# active-thread percentage (default 100 and 30; docs/node-agent.md, MPS "Context charge"): the
# GPU's used memory (nvidia-smi) before and while one, two and three processes each
# hold one primary context. Needs root (it starts an MPS control daemon for GPU 0, in
# a pipe directory of its own, and quits it at the end), gcc and the CUDA headers; no
# hook.
#
#   cuda-hook/gpu/mps-context.sh [percent...]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
CI=$(dirname "$(find / -name cuda.h -path '*include*' -not -path '/proc/*' 2>/dev/null | head -1)")
LIB=${TESSERA_DRIVER_DIR:-/usr/local/nvidia/lib64}
W=$(mktemp -d /tmp/mps-context.XXXX)
gcc -O2 -I"$CI" "$HERE/ctx_hold.c" -o "$W/ctx" -L"$LIB" -l:libcuda.so.1 -Wl,-rpath,"$LIB" || exit 1
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0; }
apps() { nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader | tr '\n' ';'; }
b=$(used); "$W/ctx" 5 & sleep 2.5; u1=$(used); a1=$(apps); "$W/ctx" 3 & sleep 2; u2=$(used); wait
echo "plain: base $b MiB, one context +$((u1 - b)), two +$((u2 - b)); apps: $a1"
mkdir -p "$W/pipe" "$W/log"
export CUDA_MPS_PIPE_DIRECTORY=$W/pipe CUDA_MPS_LOG_DIRECTORY=$W/log
MC=${MPS_CONTROL:-$(command -v nvidia-cuda-mps-control || echo /usr/local/nvidia/bin/nvidia-cuda-mps-control)}
"$MC" -d || { echo "no MPS daemon"; exit 1; }
sleep 1
for pct in ${*:-100 30}; do
	b=$(used)
	CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct "$W/ctx" 9 & sleep 3; u1=$(used); a1=$(apps)
	CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct "$W/ctx" 6 & sleep 2.5; u2=$(used)
	CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$pct "$W/ctx" 3 & sleep 2; u3=$(used); a3=$(apps)
	wait
	echo "MPS clients at $pct %: base $b MiB, one client +$((u1 - b)), two +$((u2 - b)), three +$((u3 - b)); apps (one): $a1; apps (three): $a3"
	sleep 1
done
echo quit | "$MC"
sleep 1
echo "after: $(used) MiB"
rm -rf "$W"
