#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The hook's layers (docs/cuda-hook.md, "Source map"): the interposers (the exported
# hooks) over the services over the state.
#  1. Only a file that defines hooks includes interpose.h (the hooks' exported
#     prototypes); no header includes it, and a file that does not include it defines
#     no hook.
#  2. No file calls a hook by its exported name: the driver is called through
#     REAL(name), a service's work through the service's own function. A service that
#     called a hook would count what it does twice and run its checks again.
#  3. The state (state.h, real.h and the files of the limits, the region, the log and
#     the clock) includes no service's or interposer's header.
#  4. Pacing's internal headers are included by pacing's files alone: pace.h by
#     pacing.c, pace_measure.c and pace_turns.c, pace_measure.h by the first two,
#     pace_tally.h by pacing.c and pace_tally.c.
# Comments and string literals are left out of the calls checked.
set -eu
src=${1:-$(dirname "$0")/../src}
hooks=$(sed -n 's/^TESSERA_\(CU\|NVML\)_\(HOOK\|LEGACY\)(\([A-Za-z0-9_]*\),.*/\3/p' "$src/symbols.def")
[ -n "$hooks" ] || { echo "FAIL layers: no hooks in $src/symbols.def"; exit 1; }
alt=$(printf '%s\n' $hooks | paste -sd'|' -)
state="state.h real.h fork.h fork.c limits.h limits.c limits_source.h limits_source.c region.h region.c bind.h bind.c bind_reply.c log.h log.c clock.h"
fail=0

# The file without its comments and string literals.
code() {
	awk '
	{
		out = ""; line = $0
		while (line != "") {
			if (incomment) {
				i = index(line, "*/")
				if (i == 0) { line = ""; break }
				line = substr(line, i + 2); incomment = 0
				continue
			}
			if (match(line, /\/\*|\/\/|"/) == 0) { out = out line; break }
			out = out substr(line, 1, RSTART - 1)
			tok = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
			if (tok == "//") break
			if (tok == "/*") { incomment = 1; continue }
			# a string literal: skip to its closing quote
			while (match(line, /\\.|"/)) {
				t = substr(line, RSTART, RLENGTH); line = substr(line, RSTART + RLENGTH)
				if (t == "\"") break
			}
			out = out "\"\""
		}
		print out
	}' "$1"
}

for f in "$src"/*.c "$src"/*.h; do
	name=$(basename "$f")
	body=$(code "$f")
	includes_hooks=0
	grep -q '^[[:space:]]*#[[:space:]]*include[[:space:]]*"interpose.h"' "$f" && includes_hooks=1
	defines=$(printf '%s\n' "$body" | grep -cE "^(CUresult|nvmlReturn_t)[[:space:]]+($alt)[[:space:]]*\(" || true)
	case $name in
	*.h)
		if [ $includes_hooks = 1 ]; then
			echo "FAIL layers: $name includes interpose.h; only the interposers' .c files may"
			fail=1
		fi ;;
	*.c)
		if [ $includes_hooks = 1 ] && [ "$defines" = 0 ]; then
			echo "FAIL layers: $name includes interpose.h but defines no hook"
			fail=1
		fi
		if [ $includes_hooks = 0 ] && [ "$defines" != 0 ]; then
			echo "FAIL layers: $name defines hooks without interpose.h (they would not be exported)"
			fail=1
		fi ;;
	esac
	calls=$(printf '%s\n' "$body" | grep -nE "(^|[^A-Za-z0-9_])($alt)[[:space:]]*\(" |
		grep -vE "^[0-9]+:(CUresult|nvmlReturn_t)[[:space:]]+($alt)[[:space:]]*\(" |
		sed -E "s/(HOOK_)?REAL\(($alt)\)//g" | grep -E "(^|[^A-Za-z0-9_])($alt)[[:space:]]*\(" || true)
	if [ -n "$calls" ]; then
		echo "FAIL layers: $name calls a hook by its exported name (call REAL() or the service's function):"
		printf '%s\n' "$calls" | sed "s/^/  $name:/"
		fail=1
	fi
	for h in pace.h pace_measure.h pace_tally.h; do
		grep -q "^[[:space:]]*#[[:space:]]*include[[:space:]]*\"$h\"" "$f" || continue
		case "$h:$name" in
		pace.h:pacing.c | pace.h:pace_measure.c | pace.h:pace_turns.c | pace_measure.h:pacing.c | pace_measure.h:pace_measure.c | \
			pace_tally.h:pacing.c | pace_tally.h:pace_tally.c) ;;
		*)
			echo "FAIL layers: $name includes $h, pacing's internal header"
			fail=1 ;;
		esac
	done
	case " $state " in
	*" $name "*)
		bad=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f" |
			while read -r h; do
				case " $state symbols.def tessera_cuda.h " in *" $h "*) ;; *) echo "$h" ;; esac
			done)
		if [ -n "$bad" ]; then
			echo "FAIL layers: $name is state and includes a service's or interposer's header:" $bad
			fail=1
		fi ;;
	esac
done
[ $fail = 0 ] || exit 1
echo "ok layers: $(printf '%s\n' $hooks | wc -l) hooks, none called by name; interpose.h only in the interposers; the state includes no service; pacing's internal headers only in pacing"
