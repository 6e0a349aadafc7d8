#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs every fuzz target of the module (each func Fuzz* in a _test.go file) for
# FUZZTIME each, one after the other: `go test -fuzz` takes one target at a time.
# A failing input is written to the package's testdata/fuzz/<target>/ and fails the
# run; commit it beside the fix, and it runs in every `go test` from then on.
#
#   hack/fuzz.sh [FUZZTIME] [FUZZMINIMIZETIME]      e.g. hack/fuzz.sh 3s
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${1:-30s}
# Time spent shrinking each input that finds new code (the default, 60 s, stalls a
# short run) and each failing one.
minimize=${2:-10s}
go=${GO:-go}

targets=$(grep -r -o --include='*_test.go' --exclude-dir=.git --exclude-dir=_output --exclude-dir=bin \
  '^func Fuzz[A-Za-z0-9_]*' . | sed 's|^\(.*\)/[^/]*_test.go:func |\1 |' | sort)
if [ -z "$targets" ]; then
  echo "no fuzz targets found" >&2
  exit 1
fi

# One target's run. Go's fuzzing engine can fail a run with nothing but "context
# deadline exceeded" when a worker does not answer its coordinator in time at the end
# of a short run on a loaded machine; no input is written then. Such a run is repeated
# once; a run that wrote a failing input, or failed otherwise, fails the script.
fuzz_one() {
  local out rc
  out=$(mktemp)
  set +e
  "$go" test "$1" -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" != 0 ] && grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written' "$out"; then
    echo "(the fuzzing engine timed out with no failing input: once more)"
    rm -f "$out"
    "$go" test "$1" -run '^$' -fuzz "^$2\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimize"
    return
  fi
  rm -f "$out"
  return "$rc"
}

start=$(date +%s)
while read -r pkg name; do
  t0=$(date +%s)
  echo "=== fuzz $pkg $name ($fuzztime)"
  fuzz_one "$pkg" "$name"
  echo "--- $pkg $name: $(( $(date +%s) - t0 )) s"
done <<<"$targets"
echo "fuzzed $(wc -l <<<"$targets") targets in $(( $(date +%s) - start )) s"
