#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks that build/k8s-minors holds a build module for each given Kubernetes release
# and no other, each pinned as hack/update-k8s-minor.sh pins it (go.mod and go.sum):
#
#   hack/verify-k8s-minors.sh 1.34.4 1.35.4 1.36.3     (make verify passes K8S_MINORS)
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 <kubernetes version>..." >&2; exit 2; }
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
want=()
for version in "$@"; do
  version=${version#v}
  minor=${version%.*}
  want+=("$minor")
  dir=build/k8s-minors/$minor
  if [ ! -f "$dir/go.mod" ]; then
    echo "$dir/go.mod is missing; run hack/update-k8s-minor.sh $version" >&2
    exit 1
  fi
  cp "$dir/go.mod" "$dir/go.sum" "$tmp/"
  hack/update-k8s-minor.sh "$version" >/dev/null
  if ! diff -u "$tmp/go.mod" "$dir/go.mod" || ! diff -u "$tmp/go.sum" "$dir/go.sum" >/dev/null; then
    cp "$tmp/go.mod" "$tmp/go.sum" "$dir/"
    echo "$dir is not pinned to Kubernetes $version; run hack/update-k8s-minor.sh $version" >&2
    exit 1
  fi
  grep -q "^replace k8s.io/kubernetes => k8s.io/kubernetes v$version\$" "$dir/go.mod"
  echo "$dir pins k8s.io/kubernetes v$version"
done
for d in build/k8s-minors/*/; do
  m=$(basename "$d")
  [[ " ${want[*]} " == *" $m "* ]] && continue
  echo "build/k8s-minors/$m is not one of the minors given ($*)" >&2
  exit 1
done
