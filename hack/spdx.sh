#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every source file of Tessera carries an SPDX licence line (the LICENSE file is
# Apache-2.0). `hack/spdx.sh` checks (make verify); `hack/spdx.sh --fix` adds the line
# where it is missing: first line of Go, C, CUDA, header, X-macro list (.def) and
# linker version-script (.map) files, after the shebang of scripts, first line of
# Makefiles. Configuration (YAML, the chart's templates) is data and carries none.
set -euo pipefail
cd "$(dirname "$0")/.."
line='SPDX-License-Identifier: Apache-2.0'
fix=false
[ "${1:-}" = --fix ] && fix=true
missing=0
# Tracked and untracked-but-not-ignored source files.
files() {
	git ls-files --cached --others --exclude-standard -- \
		'*.go' '*.c' '*.h' '*.cu' '*.def' '*.map' '*.sh' '*.py' 'Makefile' '*/Makefile' '*.mk' \
		'cmd/kubectl-tessera/kubectl_complete-tessera' '.ci/run' | sort -u
}
while IFS= read -r f; do
	[ -f "$f" ] || continue
	head -3 "$f" | grep -qF "$line" && continue
	if ! $fix; then
		echo "no SPDX line: $f"
		missing=$((missing + 1))
		continue
	fi
	case "$f" in
	*.go) comment="// $line" ;;
	*.c | *.h | *.cu | *.def | *.map) comment="/* $line */" ;;
	*) comment="# $line" ;;
	esac
	tmp=$(mktemp)
	if head -1 "$f" | grep -q '^#!'; then
		{ head -1 "$f"; echo "$comment"; tail -n +2 "$f"; } >"$tmp"
	elif [[ "$f" == *.go ]]; then
		# A blank line after it keeps the licence line out of the package's doc comment.
		{ echo "$comment"; echo; cat "$f"; } >"$tmp"
	else
		{ echo "$comment"; cat "$f"; } >"$tmp"
	fi
	chmod --reference="$f" "$tmp"
	mv "$tmp" "$f"
done < <(files)
if ! $fix && [ "$missing" -gt 0 ]; then
	echo "$missing source files lack '$line': run hack/spdx.sh --fix"
	exit 1
fi
$fix || echo "every source file carries '$line'"
