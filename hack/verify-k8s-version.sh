#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Checks that go.mod pins k8s.io/kubernetes to the given version and replaces every
# staging module to the matching v0.X.Y (what hack/update-k8s-version.sh writes).
set -euo pipefail
version=${1:?usage: $0 <kubernetes version>}
version=${version#v}
staging="v0.${version#*.}"
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp go.mod go.sum "$tmp/"
hack/update-k8s-version.sh "$version" >/dev/null
if ! diff -u "$tmp/go.mod" go.mod; then
  cp "$tmp/go.mod" "$tmp/go.sum" .
  echo "go.mod is not pinned to Kubernetes $version; run hack/update-k8s-version.sh $version" >&2
  exit 1
fi
cp "$tmp/go.sum" go.sum
grep -q "k8s.io/api => k8s.io/api $staging" go.mod
echo "go.mod pins k8s.io/kubernetes v$version with staging modules at $staging"
