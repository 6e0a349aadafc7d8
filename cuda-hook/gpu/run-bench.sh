#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# B3-B5 on a real GPU (make bench-gpu). Every figure is a ratio to a run without the
# hook made in the same invocation. Results go to $OUT (or build/gpu)/bench-gpu.txt.
. "$(dirname "$0")/common.sh" "$1"
LOG=$RES/bench-gpu.txt
: >"$LOG"
say() { echo "$*" | tee -a "$LOG"; }
build_gpu_programs || { say "building GPU programs failed"; exit 1; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }
say "machine: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(nvcc --version | tail -1)"

# B3: per-launch and per-alloc cost; hook with pacing off (cores 0) and on but not
# binding for this test (cores 99: every launch goes through the pacing fast path).
limits "$G/c0" 130000 0 0
limits "$G/c99" 130000 99 0
for i in 1 2; do
	say "B3 overhead run $i: none $("$G/pace" overhead) | hook,cores=0 $(hooked "$G/c0" "$G/pace" overhead) | hook,cores=99 $(hooked "$G/c99" "$G/pace" overhead)"
done
# What the fast path's parts cost on this machine (TSC read, vDSO clock, an atomic on a
# shared line, pthread_once's done check).
gcc -O2 "$HERE/bench/clockcost.c" -o "$G/clockcost" -pthread && say "$("$G/clockcost")"
# CPU microbenchmark of the launch fast path and alloc/free (bench/hookbench.c): an
# empty kernel through cuLaunchKernel, cuLaunchKernelEx and cuGraphLaunch, and 1 MiB
# cuMemAlloc+cuMemFree, without the hook, with it at cores 100 and at cores 99.
gcc -O2 -I"$HERE/include" "$HERE/bench/hookbench.c" -o "$G/hookbench" -L"$LIBCUDA_DIR" -l:libcuda.so.1 -ldl &&
	TESSERA_LIMITS_FILE=$G/hookbench.limits "$HERE/bench/run.sh" "$G/hookbench" "$HOOK" "$G/hookbench.limits" "$UUID" \
		100000 20000 "${B3_ROUNDS:-3}" 2>&1 | tee -a "$LOG"
# End to end: PyTorch bf16 matmuls with limits set but not binding.
for i in 1 2; do
	n=$(python3 "$HERE/gpu/torch_mem.py" matmul 4 | field rate)
	h=$(hooked "$G/c0" python3 "$HERE/gpu/torch_mem.py" matmul 4 | field rate)
	say "B3 e2e run $i: matmul/s none $n hook $h ratio $(awk -v a="$h" -v b="$n" 'BEGIN{printf "%.4f", a/b}')"
done

# BENCH_ONLY=b3 stops here (the launch-path figures alone, for a change to the fast path).
[ "${BENCH_ONLY:-}" = b3 ] && exit 0

# B4: achieved share = kernel rate under the hook / unhooked rate, per launch path.
for p in kernel ex coop graph; do
	base=$("$G/pace" rate $p 4 | field rate)
	for c in 10 25 50 75; do
		limits "$G/p$c" 130000 $c 0
		r=$(hooked "$G/p$c" "$G/pace" rate $p 4 | field rate)
		say "B4 path=$p cores=$c share=$(awk -v r="$r" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') (rate $r, unhooked $base)"
		[ $p = kernel ] || break # other paths: one level, to save device time
	done
done
base=$("$G/pace" rate kernel 4 | field rate)
for i in 1; do
	limits "$G/a30" 130000 30 0 /bench/a
	limits "$G/b70" 130000 70 30 /bench/b
	hooked "$G/a30" "$G/pace" rate kernel 6 >"$G/a.out" &
	a=$!
	hooked "$G/b70" "$G/pace" rate kernel 6 >"$G/b.out" &
	b=$!
	wait $a $b
	ra=$(field rate <"$G/a.out")
	rb=$(field rate <"$G/b.out")
	say "B4 two tenants run $i: A(30%) share=$(awk -v r="$ra" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') B(70%) share=$(awk -v r="$rb" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}')"
done
# Two processes of one container at 50%: they share one window and one budget.
limits "$G/s50" 130000 50 0 /bench/s50
hooked "$G/s50" "$G/pace" rate kernel 6 >"$G/a.out" &
a=$!
hooked "$G/s50" "$G/pace" rate kernel 6 >"$G/b.out" &
b=$!
wait $a $b
ra=$(field rate <"$G/a.out")
rb=$(field rate <"$G/b.out")
say "B4 two processes of one 50% container: shares $(awk -v r="$ra" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') + $(awk -v r="$rb" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') = $(awk -v r="$ra" -v s="$rb" -v b="$base" 'BEGIN{printf "%.1f", 100*(r+s)/b}')"
# The same two processes without the hook: what two CUDA processes lose to the GPU's
# time-slicing between contexts, against which the line above is read.
"$G/pace" rate kernel 6 >"$G/a.out" &
a=$!
"$G/pace" rate kernel 6 >"$G/b.out" &
b=$!
wait $a $b
ra=$(field rate <"$G/a.out")
rb=$(field rate <"$G/b.out")
say "B4 two unhooked processes together: shares $(awk -v r="$ra" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') + $(awk -v r="$rb" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') = $(awk -v r="$ra" -v s="$rb" -v b="$base" 'BEGIN{printf "%.1f", 100*(r+s)/b}')"
# Without phases (both windows at 0), for comparison.
limits "$G/b70" 130000 70 0 /bench/b
hooked "$G/a30" "$G/pace" rate kernel 6 >"$G/a.out" &
a=$!
hooked "$G/b70" "$G/pace" rate kernel 6 >"$G/b.out" &
b=$!
wait $a $b
say "B4 two tenants, same phase: A(30%) share=$(awk -v r="$(field rate <"$G/a.out")" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}') B(70%) share=$(awk -v r="$(field rate <"$G/b.out")" -v b="$base" 'BEGIN{printf "%.1f", 100*r/b}')"

# B4 on real work: kernels from 10 us to 20 ms, a CUDA graph, a launch-bound loop,
# PyTorch matmuls of three sizes and a small-MLP training loop; alone at 20/50/80, in
# pairs at 30/70 and 50/50, three tenants (gpu/b4-matrix.sh, its own table).
"$HERE/gpu/b4-matrix.sh" "$B"
cat "$RES/b4-matrix.txt" >>"$LOG"

# The driver's graph memory pool, step by step, without the hook (gpu/graph_pool.c).
gcc -O2 -I"$CUDA_INC" "$HERE/gpu/graph_pool.c" -o "$G/graph_pool" -L"$LIBCUDA_DIR" -l:libcuda.so.1 &&
	"$G/graph_pool" | sed 's/^/graph pool: /' | tee -a "$LOG"

# B5: every path against a 4 GiB limit (driver_taken_mib excludes the context).
limits "$G/l4g" 4096 0 0
for p in alloc pitch managed async pool vmm array array3d mipmap graph graphcapture poolcache; do
	say "B5 $(hooked "$G/l4g" "$G/b5_paths" $p 4096)"
done
