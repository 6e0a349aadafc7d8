#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Renders the Helm chart config/deploy/tessera to the plain manifests in
# config/deploy/manifests, with the Helm library (hack/render-manifests). Run it after
# changing the chart; hack/verify-manifests.sh checks that nobody forgot.
#
#   hack/render-manifests.sh [OUTPUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-config/deploy/manifests}
mkdir -p "$out"
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/render-manifests" ./hack/render-manifests

# The default install: namespace tessera-system, both components, no ServiceMonitors.
"$bin/render-manifests" -o "$out/tessera.yaml"
# The same with ServiceMonitors, the PrometheusRule alerts and the Grafana dashboard,
# for clusters running the Prometheus Operator.
"$bin/render-manifests" --api-versions monitoring.coreos.com/v1 \
  --set scheduler.metrics.serviceMonitor.enabled=true \
  --set agent.metrics.serviceMonitor.enabled=true \
  --set monitoring.prometheusRule.enabled=true \
  --set monitoring.grafanaDashboard.enabled=true \
  -o "$out/tessera-servicemonitors.yaml"
echo "rendered $(ls "$out" | wc -l) manifest files into $out"
