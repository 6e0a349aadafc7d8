#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# B4's matrix on the fake driver: each launch pattern alone without the hook (what it
# needs of the GPU), alone under the hook at each cap, and two of it side by side at
# 30/70 and 50/50 on the fake's time-sliced GPU (bench/fake-mix.sh runs each row), with
# B4's verdict for each tenant: within 3 points of its cap where it needs more than
# its cap, at least 95 % of its need where it needs less (not slowed). A pair is
# judged as B4 judges one on a GPU: where both need more than their caps, each cap
# scaled by what the same pair unhooked held of the GPU together (U; the GPU's
# context switches between two busy contexts cost it the rest), or what the hooked
# pair held together where that is more (paced containers that take the GPU in
# turns switch less often than time slicing does). And time slicing
# leaves a tenant whose progress waits on its kernels (a launch-bound loop) at most
# need x (1 - f) beside a neighbour that keeps the GPU busy while it holds it,
# f = min(the other's cap, need) of the time (docs/benchmarks.md, what time slicing
# leaves a launch-bound tenant): where that is under its scaled cap less 3, the
# tenant is judged against at least 95 % of it and at most its cap plus 3 (a
# neighbour that leaves gaps, as another such loop does, leaves it more). It measures
# and reports; its exit status says only whether every row ran. Run from cuda-hook/
# (not while the suite runs: the rows use the test variant's node files):
#
#   bench/fake-matrix.sh [<path>...]
#
# <path>: test/hooktest's pace patterns (default: the classes below). MATRIX_CAPS
# (25 50 80) the caps alone, MATRIX_PAIRS ("30/70 50/50") the pairs; MIX_SECONDS (5
# here: the first second holds the estimates' settling), FAKE_CUDA_CALL_NS and HOOKLIB
# as for bench/fake-mix.sh; FAKE_CUDA_SWITCH_US=160 has the fake GPU's context switch
# cost 160 us, with which two busy contexts in turns lose about 8 % of it, as
# attention or large matmuls do on an H200 (FMA kernels lose less there).
set -eu
cd "$(dirname "$0")/.."
export MIX_SECONDS=${MIX_SECONDS:-5}
paths=("$@")
[ ${#paths[@]} -gt 0 ] || paths=(k1000 k20000 small mixedsync attn1000 attn3000 slowhost1000 bwd1000 streams200 polle200
	copy200 dynsync rare2000 fresh1000 model400 model1500 llm250 cold8 lb5)
caps=${MATRIX_CAPS:-25 50 80}
pairs=${MATRIX_PAIRS:-30/70 50/50}
shares() { sed -n 's/.*share \([0-9.]*\).*/\1/p'; }
share() { shares | head -1; }
# verdict <share> <cap> <need>: B4's rule for one tenant alone.
verdict() {
	awk -v s="$1" -v c="$2" -v n="$3" 'BEGIN {
		if (n > c + 3) { d = s - c; printf "%s(%+.1f)", (d <= 3 && d >= -3) ? "ok" : "MISS", d }
		else { printf "%s(%.0f%% of need)", (s >= 0.95 * n) ? "ok" : "SLOW", 100 * s / n }
	}'
}
# pair_verdict <share> <cap> <need> <other's cap> <U> <H>: as verdict, against the
# lesser of its cap (scaled by U, or by what the hooked pair held, H, where that is
# more, where both tenants need more than their caps) and what time slicing leaves it
# beside the other.
pair_verdict() {
	awk -v s="$1" -v c="$2" -v n="$3" -v o="$4" -v u="$5" -v h="$6" 'BEGIN {
		if (h > 100) h = 100
		if (h > u) u = h
		f = o < n ? o : n; b = n * (1 - f / 100); t = (n > c + 3 && n > o + 3) ? c * u / 100 : c
		if (b > t - 3) { d = s - t; printf "%s(%+.1f)", (d <= 3 && d >= -3) ? "ok" : "MISS", d }
		else printf "%s(bound %.1f)", (s >= 0.95 * b && s <= c + 3) ? "ok" : "MISS", b
	}'
}
rc=0
printf '%-14s %6s' path need
for c in $caps; do printf ' | %5s %-20s' "$c" verdict; done
for p in $pairs; do printf ' | %-11s %5s %-28s' "$p" U verdicts; done
printf '\n'
for path in "${paths[@]}"; do
	need=$(bench/fake-mix.sh "100:$path:unhooked" | share)
	[ -n "$need" ] || { echo "$path: no share alone" >&2; rc=1; continue; }
	printf '%-14s %6s' "$path" "$need"
	for c in $caps; do
		s=$(bench/fake-mix.sh "$c:$path" | share)
		[ -n "$s" ] || { rc=1; s=0; }
		printf ' | %5s %-20s' "$s" "$(verdict "$s" "$c" "$need")"
	done
	for p in $pairs; do
		a=${p%/*} b=${p#*/}
		out=$(bench/fake-mix.sh "$a:$path:unhooked" "$b:$path:unhooked") || rc=1
		u=$(shares <<<"$out" | awk '{ u += $1 } END { print u + 0 }')
		out=$(bench/fake-mix.sh "$a:$path" "$b:$path") || rc=1
		sa=$(sed -n 1p <<<"$out" | share) sb=$(sed -n 2p <<<"$out" | share)
		h=$(awk -v a="${sa:-0}" -v b="${sb:-0}" 'BEGIN { print a + b }')
		printf ' | %5s/%-5s %5s %-28s' "${sa:-0}" "${sb:-0}" "$u" \
			"$(pair_verdict "${sa:-0}" "$a" "$need" "$b" "$u" "$h") $(pair_verdict "${sb:-0}" "$b" "$need" "$a" "$u" "$h")"
	done
	printf '\n'
done
exit $rc
