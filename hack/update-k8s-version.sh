#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Pin k8s.io/kubernetes to one version and replace every k8s.io staging module it
# requires at v0.0.0 with the matching published v0.X.Y. The list of staging modules is
# read from kubernetes' own go.mod, so a Kubernetes bump is this one command:
#
#   hack/update-k8s-version.sh 1.37.2
#
# -C DIR edits the go.mod in DIR instead of the repository's (a per-minor build module
# under build/k8s-minors, which hack/update-k8s-minor.sh sets up).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root
if [ "${1:-}" = -C ]; then
  dir=$(cd "$root" && cd "${2:?-C needs a directory}" && pwd)
  shift 2
fi
version=${1:?usage: $0 [-C dir] <kubernetes version, e.g. 1.37.2>}
version=${version#v}
staging="v0.${version#*.}"   # 1.37.2 -> v0.37.2

cd "$dir"

gomod=$(go mod download -json "k8s.io/kubernetes@v${version}" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')
if [ -z "$gomod" ] || [ ! -f "$gomod" ]; then
  echo "could not fetch the go.mod of k8s.io/kubernetes@v${version}" >&2
  exit 1
fi

# Every "k8s.io/X => ./staging/src/k8s.io/X" line in kubernetes' go.mod names a staging module.
mods=$(grep -E '^[[:space:]]*k8s\.io/[^ ]+ => \./staging/src/' "$gomod" | awk '{print $1}' | sort -u)
if [ -z "$mods" ]; then
  echo "no staging replaces found in $gomod" >&2
  exit 1
fi

args=()
for m in $mods; do
  args+=("-replace=${m}=${m}@${staging}")
done
go mod edit "${args[@]}"
go mod edit -require="k8s.io/kubernetes@v${version}"
echo "k8s.io/kubernetes v${version}; $(echo "$mods" | wc -l) staging modules replaced to ${staging}"
