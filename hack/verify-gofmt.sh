#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fails when any Go file is not gofmt-formatted.
set -euo pipefail
cd "$(dirname "$0")/.."
bad=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$bad" ]; then
  echo "gofmt needed on:" >&2
  echo "$bad" >&2
  exit 1
fi
