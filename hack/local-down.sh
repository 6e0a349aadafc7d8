#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Stops the local Tessera cluster started by hack/local-up.sh (make run): every process
# recorded in $RUN_DIR/pids, by PID. The state directory, with its logs, is kept until
# the next start.
#
# Usage: hack/local-down.sh            stop everything
#        hack/local-down.sh NAME...    stop only these components (etcd, kube-apiserver,
#                                      scheduler, kwok, agent-NODE)
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/local-cluster.sh"

if [[ ! -d $RUN_DIR/pids ]] || [[ -z $(ls -A "$RUN_DIR/pids") ]]; then
  echo "no local cluster is running from $RUN_DIR"
  exit 0
fi
if (($# > 0)); then
  for name in "$@"; do
    tessera::stop "$name"
  done
  exit 0
fi
tessera::log "stopping the local cluster in $RUN_DIR"
tessera::stop_all
tessera::log "stopped"
