#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The hook must export exactly its hooks (symbols.def) and the lookups (dlsym, dlvsym and glibc's
# private _dl_sym, _dl_vsym, __libc_dlsym, __libc_dlvsym; anything else would
# interpose on the program or the libraries it loads), and import nothing newer than glibc 2.28.
set -eu
lib=$1
dir=$(dirname "$0")/..
want=$( (sed -n 's/^TESSERA_\(CU\|NVML\)_\(HOOK\|LEGACY\)(\([A-Za-z0-9_]*\),.*/\3/p' "$dir/src/symbols.def"; echo dlsym; echo dlvsym; echo _dl_sym; echo _dl_vsym; echo __libc_dlsym; echo __libc_dlvsym) | sort)
got=$(nm -D --defined-only "$lib" | awk '$2 == "T" || $2 == "W" || $2 == "D" || $2 == "B" {print $3}' | sort)
if [ "$want" != "$got" ]; then
	echo "FAIL exports of $lib differ from symbols.def:"
	printf '%s\n' "$want" > /tmp/tessera-want.$$
	printf '%s\n' "$got" | diff /tmp/tessera-want.$$ - || true
	rm -f /tmp/tessera-want.$$
	exit 1
fi
echo "ok exports: $(echo "$got" | wc -l) symbols, all hooks"

# Tenant images bring their own glibc, as old as 2.28 (compat/glibc-2.28.h): no symbol
# the hook imports may be newer.
newest=$(nm -D --undefined-only "$lib" | sed -n 's/.*@GLIBC_\([0-9.]*\).*/\1/p' | sort -t. -k1,1n -k2,2n | tail -1)
if [ -n "$newest" ] && [ "$(printf '%s\n2.28\n' "$newest" | sort -t. -k1,1n -k2,2n | tail -1)" != 2.28 ]; then
	echo "FAIL $lib needs glibc $newest:"
	nm -D --undefined-only "$lib" | grep "@GLIBC_$newest" | sed 's/^/  /'
	exit 1
fi
echo "ok glibc: nothing newer than ${newest:-?} (at most 2.28)"
