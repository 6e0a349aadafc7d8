#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Starts a local Tessera cluster with simulated GPU nodes and schedules a sample
# workload: etcd and kube-apiserver built from Go modules, the Tessera scheduler with the
# binpack and spread profiles, kwok for node heartbeats and pod lifecycle, and one
# simulated node agent per node. Needs no Docker, no GPU and no existing cluster.
#
# Usage: hack/local-up.sh [--detach] [--no-workload] [--no-build]
#        hack/local-up.sh --start COMPONENT   start one stopped component of the running
#                       cluster again: scheduler, kwok or agent-NODE (see local-down.sh)
#   --detach       return once the table is printed, leaving the cluster running
#                  (stop it with hack/local-down.sh); default: stay in the foreground
#                  until Ctrl-C, which stops everything
#   --no-workload  start the cluster and nodes only
#   --no-build     use the binaries already in bin/
# Environment:
#   RUN_DIR              state, logs and kubeconfig (default: .run in the repository)
#   BIN_DIR              the binaries (default: bin in the repository)
#   NODES_FILE           node list (default: config/local/nodes.txt)
#   WORKLOAD_FILE        sample workload (default: config/local/workload.yaml)
#   INVENTORY_STALENESS  the scheduler's inventoryStaleness (default 5m)
#   AGENT_HEARTBEAT      the agents' --heartbeat (default 10s)
#   TESSERA_OWNER_PID    stop the cluster when this process exits (used by the e2e suite)
#
# Why not kwokctl, kwok's own cluster tool: go.mod's tool block builds only
# sigs.k8s.io/kwok/cmd/kwok; kwokctl (same module, v0.8.0) downloads kube-apiserver
# and etcd from dl.k8s.io and GitHub by default (pkg/consts' KubeBinaryPrefix,
# EtcdBinaryPrefix), where make run builds the pinned ones from Go modules offline.
# Its kubeApiserverBinary and etcdBinary settings could take those, but the Tessera
# scheduler, one simulated node agent per node, --start and TESSERA_OWNER_PID would
# all become custom components of a generated kwokctl configuration, and the e2e
# suite drives this script: a rewrite larger than swapping the start-up of etcd and
# the API server.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/local-cluster.sh"

DETACH=false
WORKLOAD=true
BUILD=true
START=""
while (($# > 0)); do
  arg=$1
  shift
  case $arg in
  --detach) DETACH=true ;;
  --no-workload) WORKLOAD=false ;;
  --no-build) BUILD=false ;;
  --start)
    START=${1:-}
    [[ -n $START ]] || tessera::die "--start needs a component name"
    shift
    ;;
  -h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
  *) tessera::die "unknown argument $arg (see --help)" ;;
  esac
done
KT=$BIN_DIR/kubectl-tessera

if [[ -n $START ]]; then
  # Restarting one component (after hack/local-down.sh NAME) reuses the cluster's ports
  # and settings.
  tessera::load_env
  case $START in
  scheduler) tessera::step "tessera-scheduler ready" tessera::start_scheduler ;;
  kwok) tessera::step "kwok ready" tessera::start_kwok ;;
  agent-*)
    topo=$(tessera::topology_of "${START#agent-}")
    [[ -n $topo ]] || tessera::die "node ${START#agent-} is not in $NODES_FILE"
    tessera::step "node agent of ${START#agent-} started" tessera::start_agent "${START#agent-}" "$topo"
    ;;
  *) tessera::die "cannot start $START alone: use scheduler, kwok or agent-NODE" ;;
  esac
  exit 0
fi

for f in "$RUN_DIR"/pids/*.pid; do
  [[ -e $f ]] || continue
  if tessera::running "$(basename "$f" .pid)"; then
    tessera::die "a local cluster is already running from $RUN_DIR; stop it first with: make stop"
  fi
done

# A run starts from an empty state directory: no etcd data, logs or pids of an earlier
# cluster can leak into this one.
case $RUN_DIR in
"" | / | "$HOME" | "$TESSERA_ROOT") tessera::die "refusing to use RUN_DIR=$RUN_DIR" ;;
esac
rm -rf "$RUN_DIR"
mkdir -p "$RUN_DIR/pids" "$RUN_DIR/logs"

# Anything that fails on the way up, and Ctrl-C at any time, stops what was started.
UP=false
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [[ $UP != true || $rc -ne 0 ]]; then
    echo
    tessera::log "stopping the local cluster"
    tessera::stop_all
    tessera::log "stopped; logs are in $RUN_DIR/logs"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

tessera::log "Tessera local cluster in $RUN_DIR"

if [[ $BUILD == true ]]; then
  # One target at a time, so that the slow first builds show which step they are in.
  tessera::log "building (the first build compiles kube-apiserver, kubectl and the scheduler from source: a few minutes)"
  for target in bin/tessera-scheduler:scheduler bin/tessera-node-agent:agent bin/kubectl-tessera:kubectl-tessera \
    bin/etcd:"$BIN_DIR/etcd" bin/kube-apiserver:"$BIN_DIR/kube-apiserver" bin/kwok:"$BIN_DIR/kwok" bin/kubectl:"$BIN_DIR/kubectl"; do
    tessera::step "  built ${target%%:*}" make -s -C "$TESSERA_ROOT" --no-print-directory BIN="$BIN_DIR" "${target#*:}"
  done
fi
for b in etcd kube-apiserver kwok kubectl tessera-scheduler tessera-node-agent kubectl-tessera; do
  [[ -x $BIN_DIR/$b ]] || tessera::die "$BIN_DIR/$b is missing: run make run (or make build control-plane kubectl-tessera)"
done

tessera::free_ports ETCD_PORT ETCD_PEER_PORT APISERVER_PORT SCHEDULER_PORT KWOK_PORT ||
  tessera::die "cannot pick the ports of the cluster"
tessera::save_env

if [[ -n ${TESSERA_OWNER_PID:-} ]]; then
  # Stops this cluster when its owner (a test process) goes away, even if the owner
  # is killed before it can clean up.
  tessera::spawn reaper bash -c 'while kill -0 "$0" 2>/dev/null; do sleep 1; done
    rm -f "$1/pids/reaper.pid" "$1/pids/reaper.start"; RUN_DIR="$1" exec "$2"' "$TESSERA_OWNER_PID" "$RUN_DIR" "$TESSERA_ROOT/hack/local-down.sh"
fi

tessera::step "etcd ready on 127.0.0.1:$ETCD_PORT" tessera::start_etcd
tessera::step "kube-apiserver ready on https://127.0.0.1:$APISERVER_PORT" tessera::start_apiserver
tessera::step "tessera-scheduler ready (profiles tessera-fragmentation, tessera-binpack, tessera-spread; inventoryStaleness $INVENTORY_STALENESS)" tessera::start_scheduler
tessera::step "kwok ready (node heartbeats and pod lifecycle)" tessera::start_kwok

NODES=$(tessera::nodes | awk '{print $1}' | paste -sd, -)
[[ -n $NODES ]] || tessera::die "$NODES_FILE lists no nodes"
create_nodes() { tessera::node_objects | tessera::kubectl create -f - >"$RUN_DIR/logs/create-nodes.log"; }
tessera::step "created $(tessera::nodes | wc -l) nodes from ${NODES_FILE#"$TESSERA_ROOT"/}" create_nodes

start_agents() {
  local name topo
  while read -r name topo _; do
    tessera::start_agent "$name" "$topo" || return 1
  done < <(tessera::nodes)
}
wait_nodes() { "$KT" wait --kubeconfig "$RUN_DIR/kubeconfig" --nodes "$NODES" --timeout 60s >"$RUN_DIR/logs/wait-nodes.log"; }
tessera::step "started $(tessera::nodes | wc -l) simulated node agents" start_agents
tessera::step "nodes Ready with their GPU inventories published" wait_nodes

if [[ $WORKLOAD == true ]]; then
  create_workload() { tessera::kubectl create -f "$WORKLOAD_FILE" >"$RUN_DIR/logs/create-workload.log"; }
  wait_pods() { "$KT" wait --kubeconfig "$RUN_DIR/kubeconfig" --timeout 60s >"$RUN_DIR/logs/wait-pods.log"; }
  tessera::step "created the sample workload (${WORKLOAD_FILE#"$TESSERA_ROOT"/}: $(grep -c '^kind: Pod' "$WORKLOAD_FILE") pods)" create_workload
  tessera::step "every GPU pod placed or refused by the scheduler" wait_pods
  echo
  "$KT" allocation --kubeconfig "$RUN_DIR/kubeconfig" --stale-after "$INVENTORY_STALENESS"
fi

UP=true
echo
tessera::log "local cluster is up"
cat <<EOF

  export KUBECONFIG=$RUN_DIR/kubeconfig
  export PATH=$BIN_DIR:\$PATH     # the kubectl of the pinned Kubernetes, and kubectl tessera
  kubectl tessera allocation      # -n NAMESPACE, -o wide|json|yaml
  kubectl get pods -A -o wide
  logs: $RUN_DIR/logs/

EOF
if [[ $DETACH == true ]]; then
  echo "Stop it with: make stop"
  exit 0
fi
# From here an interrupt is the expected way to stop: it ends the script successfully.
trap 'UP=false; exit 0' INT TERM
echo "Press Ctrl-C to stop the cluster (or run make stop in another terminal)."
while tessera::running kube-apiserver; do
  sleep 1
done
tessera::log "kube-apiserver has stopped (make stop?); stopping the rest"
UP=false
exit 0
