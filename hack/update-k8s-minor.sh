#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up or bumps the build module of one Kubernetes minor older than the one the
# repository's go.mod pins (build/k8s-minors/README.md says why these modules exist):
#
#   hack/update-k8s-minor.sh 1.34.4
#
# writes build/k8s-minors/1.34/go.mod: the Tessera module taken from this checkout
# (replace => ../../..), k8s.io/kubernetes and every staging module at that release
# (hack/update-k8s-version.sh -C; kubernetes itself replaced too, since the Tessera
# module requires a newer one), the scheduler, kube-apiserver and etcd as the
# module's tools, then go mod tidy, and the go.sum entries of the integration suite.
set -euo pipefail

version=${1:?usage: $0 <kubernetes version, e.g. 1.34.4>}
version=${version#v}
minor=${version%.*}
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build/k8s-minors/$minor
main=github.com/tessera-dev/tessera

mkdir -p "$dir"
cd "$dir"
[ -f go.mod ] || go mod init "$main/build/k8s-minors/$minor"
gover=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$root/go.mod")
go mod edit -go="$gover" \
  -replace="$main=../../.." \
  -require="$main@v0.0.0-00010101000000-000000000000"
"$root/hack/update-k8s-version.sh" -C "$dir" "$version"
# The Tessera module requires the newest kubernetes; without this replace the module
# graph would select that one over the requirement above.
go mod edit -replace="k8s.io/kubernetes=k8s.io/kubernetes@v$version"
go mod edit \
  -tool="$main/cmd/tessera-scheduler" \
  -tool=k8s.io/kubernetes/cmd/kube-apiserver \
  -tool=go.etcd.io/etcd/server/v3
go mod tidy
# make test-integration K8S_MINOR=<minor> builds Tessera's integration suite in this
# module: go.sum needs the modules of its test imports too, which tidy leaves out (they
# are tests of a dependency here).
go list -mod=mod -test -deps -tags "k8s$minor" "$main/test/integration" >/dev/null
echo "build/k8s-minors/$minor: Kubernetes $version"
