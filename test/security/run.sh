#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs the attack suite (test/security/attacks.txt): every listed test must exist, run
# and pass. Without a GPU it runs the go and hook entries (make test-security); with
# --gpu, on a machine with an NVIDIA GPU, root, the driver, nvcc and PyTorch, the
# gpu-go and gpu-hook entries (make test-security-gpu). A GPU machine without Go runs
# the gpu-go tests from binaries built elsewhere with `test/security/run.sh
# --build-gpu DIR` (DIR/<package>.test.xz), found through GPU_TEST_BIN=DIR.
set -euo pipefail
cd "$(dirname "$0")/../.."
mode=cpu
[ "${1:-}" = --gpu ] && mode=gpu
list=test/security/attacks.txt
export CGO_CFLAGS=${CGO_CFLAGS:--O2 -g -Wno-deprecated-declarations}
if [ "${1:-}" = --build-gpu ]; then
	dir=${2:?usage: run.sh --build-gpu DIR}
	mkdir -p "$dir"
	for pkg in $(awk -F'|' '$1 == "gpu-go" {print $2}' "$list" | sort -u); do
		go test -c -tags gpu -ldflags='-s -w' -o "$dir/$(basename "$pkg").test" "$pkg"
		xz -f -T0 "$dir/$(basename "$pkg").test"
	done
	exit 0
fi
fails=0
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# go_tests <kind> [tags]: runs every entry of that kind, one go test per package.
go_tests() {
	local kind=$1 tags=${2:-}
	local pkgs
	pkgs=$(awk -F'|' -v k="$kind" '$1 == k {print $2}' "$list" | sort -u)
	for pkg in $pkgs; do
		local names top
		names=$(awk -F'|' -v k="$kind" -v p="$pkg" '$1 == k && $2 == p {print $3}' "$list")
		top=$(printf '%s\n' "$names" | cut -d/ -f1 | sort -u | paste -sd'|')
		if [ -n "${GPU_TEST_BIN:-}" ] && [ -n "$tags" ]; then
			# A test binary built elsewhere; it runs in its package's directory.
			xz -dc "$GPU_TEST_BIN/$(basename "$pkg").test.xz" >"$out/t.test" && chmod +x "$out/t.test"
			(cd "$pkg" && "$out/t.test" -test.count=1 -test.v -test.run "^($top)\$") >"$out/log" 2>&1 || true
		else
			go test -count=1 -v ${tags:+-tags "$tags"} -run "^($top)\$" "$pkg" >"$out/log" 2>&1 || true
		fi
		# Keep each package's log beside the results where the caller collects them.
		[ -n "${OUT:-}" ] && cp "$out/log" "$OUT/$(basename "$pkg")-$kind.log"
		while IFS= read -r name; do
			if grep -qE -- "--- PASS: $(printf '%s' "$name" | sed 's/ /_/g; s/[.[\*^$()+?{}]/\\&/g') \(" "$out/log"; then
				echo "ok   $name ($pkg)"
			else
				echo "FAIL $name ($pkg): missing, skipped or failed"
				{ grep -E -- "--- (FAIL|SKIP): $name|_test.go:[0-9]+:" "$out/log" || true; } | head -5 | sed 's/^/       /'
				fails=$((fails + 1))
			fi
		done <<<"$names"
	done
}

# sections <kind> <log>: every listed check or section header appears in the log as passed.
sections() {
	local kind=$1 log=$2
	while IFS= read -r name; do
		if grep -qF -- "$name" "$log" && ! grep -F -- "$name" "$log" | grep -q '^FAIL'; then
			echo "ok   $name (CUDA hook)"
		else
			echo "FAIL $name (CUDA hook): missing or failed"
			fails=$((fails + 1))
		fi
	done < <(awk -F'|' -v k="$kind" '$1 == k {print $3}' "$list")
}

if [ "$mode" = cpu ]; then
	make --no-print-directory "$PWD/bin/etcd" >/dev/null
	PATH=$PWD/bin:$PATH go_tests go
	# The fake-driver suite stops at its first failed check, so a section header
	# followed by the suite's last line means all of that section passed.
	if make --no-print-directory -C cuda-hook test-plain >"$out/hook.log" 2>&1; then
		sections hook "$out/hook.log"
	else
		tail -20 "$out/hook.log"
		echo "FAIL the CUDA hook's fake-driver suite"
		fails=$((fails + 1))
	fi
else
	make --no-print-directory -C cuda-hook test-gpu >"$out/gpu.log" 2>&1 || true
	[ -n "${OUT:-}" ] && cp "$out/gpu.log" "$OUT/hook-gpu.log"
	sections gpu-hook "$out/gpu.log"
	# The fallback binding's test preloads the hook the suite above built.
	export TESSERA_HOOK=$PWD/cuda-hook/build/libtessera-cuda.so
	go_tests gpu-go gpu
fi
total=$(grep -c "^$( [ "$mode" = cpu ] && echo '\(go\|hook\)' || echo 'gpu-\(go\|hook\)')|" "$list")
echo "attack suite ($mode): $((total - fails)) of $total attacks fail as they should"
[ "$fails" -eq 0 ]
