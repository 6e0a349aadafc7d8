#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds the CUDA hook's test variants and runs its fake-driver suite from a copy of
# the hook at a path of more than 150 characters, as a clone into a deep directory
# would have it. Paths the build embeds or the tests create (the bind socket) must not
# depend on where the checkout lives.
set -euo pipefail
cd "$(dirname "$0")/.."

base=$(mktemp -d "${TMPDIR:-/tmp}/tessera-long-path.XXXXXX")
trap 'rm -rf "$base"' EXIT
dir=$base
while [ ${#dir} -lt 160 ]; do dir=$dir/a-rather-long-directory-name; done
dir=$dir/tessera
mkdir -p "$dir"

# The hook and what its suite reads outside it (the limits vectors), as tracked or
# new files of this checkout, without its build output.
git ls-files -z --cached --others --exclude-standard -- cuda-hook api/testdata/limits |
	xargs -0 tar -cf - | tar -xf - -C "$dir"

echo "== the CUDA hook at a path of ${#dir} characters"
# Every variant is compiled (the sanitizers change what the compiler warns about);
# the plain one runs its whole suite.
make --no-print-directory -C "$dir/cuda-hook" all build/asan/libtessera-cuda.so build/ubsan/libtessera-cuda.so >/dev/null
make --no-print-directory -C "$dir/cuda-hook" test-plain | tail -1
make --no-print-directory -C "$dir/cuda-hook" clean
