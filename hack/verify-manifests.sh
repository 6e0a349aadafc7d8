#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails when config/deploy/manifests is not what the chart renders to.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
hack/render-manifests.sh "$tmp" >/dev/null
if ! diff -ru config/deploy/manifests "$tmp"; then
  echo "config/deploy/manifests is out of date with the chart: run make manifests" >&2
  exit 1
fi
echo "config/deploy/manifests matches the chart"
