# SPDX-License-Identifier: Apache-2.0
# Shell functions that start and stop the pieces of a local Tessera cluster: etcd,
# kube-apiserver, the Tessera scheduler, kwok (node heartbeats and pod lifecycle) and one
# simulated node agent per node. hack/local-up.sh and hack/local-down.sh source this
# file; the end-to-end suite drives those scripts, so there is one way to bring a local
# cluster up.
#
# Everything lives in $RUN_DIR: pids/<component>.pid, logs/<component>.log, the
# kubeconfig, certificates and the generated configs. Processes are stopped by the PIDs
# recorded there, never by name, so two clusters (or a cluster and a test) can coexist.

TESSERA_ROOT=${TESSERA_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
BIN_DIR=${BIN_DIR:-$TESSERA_ROOT/bin}
RUN_DIR=${RUN_DIR:-$TESSERA_ROOT/.run}
NODES_FILE=${NODES_FILE:-$TESSERA_ROOT/config/local/nodes.txt}
WORKLOAD_FILE=${WORKLOAD_FILE:-$TESSERA_ROOT/config/local/workload.yaml}
INVENTORY_STALENESS=${INVENTORY_STALENESS:-5m}
AGENT_HEARTBEAT=${AGENT_HEARTBEAT:-10s}

# The clock every progress line is measured from.
TESSERA_T0=${TESSERA_T0:-$(date +%s%N)}

# tessera::elapsed prints seconds since $1 (nanoseconds, default TESSERA_T0), one decimal.
tessera::elapsed() {
  local from=${1:-$TESSERA_T0} now
  now=$(date +%s%N)
  local ms=$(((now - from) / 1000000))
  printf '%d.%01d' $((ms / 1000)) $((ms % 1000 / 100))
}

# tessera::log prints a progress line prefixed with the time since start.
tessera::log() {
  printf '[%6ss] %s\n' "$(tessera::elapsed)" "$*"
}

tessera::die() {
  printf '[%6ss] ERROR: %s\n' "$(tessera::elapsed)" "$*" >&2
  exit 1
}

# tessera::step "what" command...: runs the command and prints how long it took; a
# failure ends the script (whose EXIT trap stops what was started).
tessera::step() {
  local what=$1
  shift
  local t0
  t0=$(date +%s%N)
  if ! "$@"; then
    tessera::die "$what failed"
  fi
  tessera::log "$what ($(tessera::elapsed "$t0")s)"
}

# tessera::port_open reports whether something listens on 127.0.0.1:$1.
tessera::port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

tessera::port_free() {
  ! tessera::port_open "$1"
}

# tessera::free_ports VAR...: sets each named variable to a port on 127.0.0.1 that
# nothing listens on and that no earlier call of this shell handed out. Ports are drawn
# at random from a range outside the usual ephemeral one so that parallel clusters
# rarely collide. It assigns rather than prints: a $(...) runs in a subshell, whose
# record of the ports handed out would be lost, and two components could then be given
# the same port (one of them failing to bind).
TESSERA_PORTS_TAKEN=" "
tessera::free_ports() {
  local v p i
  for v in "$@"; do
    p=
    for i in $(seq 1 200); do
      p=$((20000 + RANDOM % 12000))
      if [[ $TESSERA_PORTS_TAKEN != *" $p "* ]] && tessera::port_free "$p"; then
        break
      fi
      p=
    done
    [[ -n $p ]] || { echo "no free port on 127.0.0.1 between 20000 and 31999 for $v" >&2; return 1; }
    TESSERA_PORTS_TAKEN+="$p "
    printf -v "$v" '%s' "$p"
  done
}

# tessera::wait_until TIMEOUT_S DESCRIPTION command...: retries the command every 0.2 s
# until it succeeds; fails after TIMEOUT_S seconds, or at once when the component whose
# pid file is named in WAIT_PID has exited.
tessera::wait_until() {
  local timeout=$1 what=$2
  shift 2
  local deadline=$(($(date +%s) + timeout))
  until "$@" >/dev/null 2>&1; do
    if [[ -n ${WAIT_PID:-} ]] && ! tessera::running "$WAIT_PID"; then
      echo "$what: $WAIT_PID exited; last lines of $RUN_DIR/logs/$WAIT_PID.log:" >&2
      tail -n 20 "$RUN_DIR/logs/$WAIT_PID.log" >&2 || true
      return 1
    fi
    if (($(date +%s) >= deadline)); then
      echo "$what: not ready after ${timeout}s" >&2
      [[ -n ${WAIT_PID:-} ]] && tail -n 20 "$RUN_DIR/logs/$WAIT_PID.log" >&2
      return 1
    fi
    sleep 0.2
  done
}

# tessera::http_ok PORT PATH: a plain-HTTP GET of PATH on 127.0.0.1:PORT answers 200.
# Bash's /dev/tcp keeps curl off the list of things a clean machine must have.
tessera::http_ok() (
  local status
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
  read -r -t 5 _ status _ <&3 || return 1
  [[ $status == 200 ]]
)

# tessera::pid NAME prints the recorded PID of component NAME.
tessera::pid() {
  cat "$RUN_DIR/pids/$1.pid" 2>/dev/null
}

# tessera::alive PID reports whether a process is alive. An exited process that its
# parent has not reaped yet (a zombie) counts as gone: components outlive the script
# that started them, and whoever inherits them may reap them late.
tessera::alive() {
  kill -0 "$1" 2>/dev/null || return 1
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]]
}

# tessera::starttime PID prints the process's start time (clock ticks since boot),
# which together with the PID identifies it even after the PID is reused.
tessera::starttime() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  # shellcheck disable=SC2086
  set -- ${stat##*) }
  echo "${20}"
}

# tessera::running NAME reports whether component NAME's recorded process is alive. A
# PID file left from before a reboot may name an unrelated process by now; the recorded
# start time tells them apart, so nothing else is ever signalled.
tessera::running() {
  local pid
  pid=$(tessera::pid "$1") || return 1
  [[ -n $pid ]] && tessera::alive "$pid" || return 1
  [[ ! -f $RUN_DIR/pids/$1.start ]] || [[ $(tessera::starttime "$pid") == $(cat "$RUN_DIR/pids/$1.start") ]]
}

# tessera::spawn NAME command...: starts a component in its own session (so that a
# Ctrl-C in the terminal reaches the script, which then stops everything in order) with
# its output in logs/NAME.log and its PID in pids/NAME.pid.
tessera::spawn() {
  local name=$1
  shift
  mkdir -p "$RUN_DIR/pids" "$RUN_DIR/logs"
  if tessera::running "$name"; then
    echo "$name is already running (pid $(tessera::pid "$name"))" >&2
    return 1
  fi
  setsid "$@" >>"$RUN_DIR/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$RUN_DIR/pids/$name.pid"
  tessera::starttime $! >"$RUN_DIR/pids/$name.start" || rm -f "$RUN_DIR/pids/$name.start"
}

# tessera::stop NAME: SIGTERM, then SIGKILL after 10 s, by recorded PID only.
tessera::stop() {
  local name=$1 pid i
  pid=$(tessera::pid "$name") || return 0
  if ! tessera::running "$name"; then
    rm -f "$RUN_DIR/pids/$name.pid" "$RUN_DIR/pids/$name.start"
    return 0
  fi
  rm -f "$RUN_DIR/pids/$name.pid" "$RUN_DIR/pids/$name.start"
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 1 100); do
    tessera::alive "$pid" || return 0
    sleep 0.1
  done
  echo "$name (pid $pid) did not stop on SIGTERM within 10s; killing it" >&2
  kill -KILL "$pid" 2>/dev/null || true
}

# tessera::stop_all stops every recorded component: the clients first, the API server
# and etcd last, so that nothing logs errors about a vanished API server on the way down.
tessera::stop_all() {
  local f name jobs=()
  [[ -d $RUN_DIR/pids ]] || return 0
  for f in "$RUN_DIR"/pids/agent-*.pid "$RUN_DIR"/pids/reaper.pid; do
    [[ -e $f ]] || continue
    name=$(basename "$f" .pid)
    tessera::stop "$name" &
    jobs+=($!)
  done
  # Wait for these stops only: a bare wait would also wait for the components this
  # shell started, which are still running.
  ((${#jobs[@]} == 0)) || wait "${jobs[@]}"
  for name in kwok scheduler kube-apiserver etcd; do
    tessera::stop "$name"
  done
}

# tessera::save_env writes the ports and paths of this cluster to $RUN_DIR/env, which
# later calls (restarting one component, the e2e suite) source.
tessera::save_env() {
  local v
  : >"$RUN_DIR/env"
  for v in ETCD_PORT ETCD_PEER_PORT APISERVER_PORT SCHEDULER_PORT KWOK_PORT INVENTORY_STALENESS AGENT_HEARTBEAT NODES_FILE; do
    printf '%s=%q\n' "$v" "${!v}" >>"$RUN_DIR/env"
  done
}

tessera::load_env() {
  [[ -f $RUN_DIR/env ]] || tessera::die "no cluster state in $RUN_DIR (start one with make run)"
  # shellcheck disable=SC1091
  source "$RUN_DIR/env"
}

# --- etcd -------------------------------------------------------------------------

tessera::start_etcd() {
  mkdir -p "$RUN_DIR/etcd"
  tessera::spawn etcd "$BIN_DIR/etcd" \
    --name local \
    --data-dir "$RUN_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "local=http://127.0.0.1:$ETCD_PEER_PORT" \
    --unsafe-no-fsync \
    --quota-backend-bytes 4294967296 \
    --log-level warn || return 1
  WAIT_PID=etcd tessera::wait_until 30 "etcd" tessera::http_ok "$ETCD_PORT" /health
}

# --- kube-apiserver -----------------------------------------------------------------

# tessera::make_credentials writes the admin token, the service-account signing key and
# the kubeconfig. The serving certificate is self-signed by kube-apiserver itself
# (--cert-dir), which is why the kubeconfig skips TLS verification: this cluster listens
# on 127.0.0.1 only and exists for local trials and tests.
tessera::make_credentials() {
  mkdir -p "$RUN_DIR/pki"
  command -v openssl >/dev/null || { echo "openssl is needed to make the service-account key" >&2; return 1; }
  if [[ ! -f $RUN_DIR/pki/token ]]; then
    head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RUN_DIR/pki/token"
  fi
  local token
  token=$(cat "$RUN_DIR/pki/token")
  echo "$token,admin,admin,system:masters" >"$RUN_DIR/pki/tokens.csv"
  if [[ ! -f $RUN_DIR/pki/sa.key ]]; then
    openssl genrsa -out "$RUN_DIR/pki/sa.key" 2048 2>/dev/null &&
      openssl rsa -in "$RUN_DIR/pki/sa.key" -pubout -out "$RUN_DIR/pki/sa.pub" 2>/dev/null || return 1
  fi
  cat >"$RUN_DIR/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: tessera-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: $token
contexts:
- name: tessera-local
  context: {cluster: tessera-local, user: admin}
current-context: tessera-local
EOF
}

tessera::start_apiserver() {
  tessera::make_credentials || return 1
  # Without kube-controller-manager nothing would create the default ServiceAccount or
  # remove the not-ready taint TaintNodesByCondition puts on new nodes, so those two
  # admission plugins are off; the endpoint reconciler would refuse a loopback address.
  tessera::spawn kube-apiserver "$BIN_DIR/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 \
    --advertise-address 127.0.0.1 \
    --secure-port "$APISERVER_PORT" \
    --cert-dir "$RUN_DIR/pki" \
    --token-auth-file "$RUN_DIR/pki/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-key-file "$RUN_DIR/pki/sa.pub" \
    --service-account-signing-key-file "$RUN_DIR/pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --endpoint-reconciler-type none \
    --disable-admission-plugins ServiceAccount,TaintNodesByCondition \
    --enable-priority-and-fairness=false \
    --allow-privileged="${APISERVER_ALLOW_PRIVILEGED:-false}" \
    --profiling=false || return 1
  # /readyz, not just a successful list: the API server serves lists before its
  # start-up hooks (bootstrap RBAC, system namespaces) have finished.
  WAIT_PID=kube-apiserver tessera::wait_until 90 "kube-apiserver" \
    tessera::kubectl get --raw /readyz --request-timeout 5s
}

# tessera::kubectl runs the kubectl built from the pinned Kubernetes against this cluster.
tessera::kubectl() {
  "$BIN_DIR/kubectl" --kubeconfig "$RUN_DIR/kubeconfig" "$@"
}

# --- scheduler ----------------------------------------------------------------------

# tessera::scheduler_config writes a copy of the shipped scheduler configuration that
# runs outside a cluster: the local kubeconfig, no leader election, and the inventory
# staleness limit of this cluster.
tessera::scheduler_config() {
  local src=$TESSERA_ROOT/config/scheduler/tessera-scheduler.yaml out=$RUN_DIR/tessera-scheduler.yaml
  sed -e "s|^\(  kubeconfig:\) \"\"|\1 \"$RUN_DIR/kubeconfig\"|" \
    -e 's|^\(  leaderElect:\) true|\1 false|' \
    -e "s|^\(  *inventoryStaleness:\) .*|\1 $INVENTORY_STALENESS|" "$src" >"$out"
  # The edits are textual; refuse to run a scheduler that would use the in-cluster
  # configuration or fight over a lease if the shipped file changed shape.
  grep -q "kubeconfig: \"$RUN_DIR/kubeconfig\"" "$out" && grep -q 'leaderElect: false' "$out" || {
    echo "cannot adapt $src for a local run: expected 'kubeconfig: \"\"' and 'leaderElect: true' under clientConnection and leaderElection" >&2
    return 1
  }
}

tessera::start_scheduler() {
  tessera::scheduler_config || return 1
  tessera::spawn scheduler "$BIN_DIR/tessera-scheduler" \
    --config "$RUN_DIR/tessera-scheduler.yaml" \
    --bind-address 127.0.0.1 \
    --secure-port "$SCHEDULER_PORT" \
    --authentication-kubeconfig "$RUN_DIR/kubeconfig" \
    --authorization-kubeconfig "$RUN_DIR/kubeconfig" \
    --authentication-skip-lookup || return 1
  # --authentication-skip-lookup: this API server has no client CA, so it never writes
  # the extension-apiserver-authentication ConfigMap the scheduler would look up.
  # Its health endpoint is HTTPS only; the scheduler opens the port once its informers
  # and profiles are set up, which is what the next steps need.
  WAIT_PID=scheduler tessera::wait_until 60 "tessera-scheduler" tessera::port_open "$SCHEDULER_PORT"
}

# --- kwok -----------------------------------------------------------------------------

# kwok plays kubelet for the simulated nodes: it marks them Ready and heartbeats them,
# runs pods bound to them and finishes their deletion. It manages only nodes carrying
# the kwok.x-k8s.io/node=fake annotation.
tessera::start_kwok() {
  tessera::spawn kwok "$BIN_DIR/kwok" \
    --kubeconfig "$RUN_DIR/kubeconfig" \
    --config "$TESSERA_ROOT/config/local/kwok-stages.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --node-ip 127.0.0.1 \
    --node-port "$KWOK_PORT" \
    --server-address "127.0.0.1:$KWOK_PORT" \
    --cidr 10.0.0.0/16 || return 1
  WAIT_PID=kwok tessera::wait_until 30 "kwok" tessera::http_ok "$KWOK_PORT" /healthz
}

# --- nodes and agents ---------------------------------------------------------------

# tessera::nodes prints "NAME TOPOLOGY" for every node of the node list, without comments.
tessera::nodes() {
  sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$NODES_FILE"
}

# tessera::node_objects prints the Node objects of the node list: ordinary nodes with
# CPU and memory, annotated for kwok. Their GPUs appear only through the agents.
tessera::node_objects() {
  local name topo cpu mem
  echo "apiVersion: v1"
  echo "kind: List"
  echo "items:"
  while read -r name topo cpu mem; do
    cat <<EOF
- apiVersion: v1
  kind: Node
  metadata:
    name: $name
    annotations: {kwok.x-k8s.io/node: fake}
    labels: {kubernetes.io/hostname: $name, kubernetes.io/os: linux, type: kwok}
  status:
    capacity: {cpu: "${cpu:-64}", memory: ${mem:-512Gi}, pods: "110"}
    allocatable: {cpu: "${cpu:-64}", memory: ${mem:-512Gi}, pods: "110"}
EOF
  done < <(tessera::nodes)
}

# tessera::start_agent NODE TOPOLOGY: a node agent in simulated mode for one node.
tessera::start_agent() {
  local node=$1 topo=$2
  [[ $topo == /* ]] || topo=$TESSERA_ROOT/config/simulated/$topo
  [[ -f $topo ]] || { echo "node $node: topology file $topo does not exist" >&2; return 1; }
  tessera::spawn "agent-$node" "$BIN_DIR/tessera-node-agent" \
    --simulate "$topo" \
    --node-name "$node" \
    --kubeconfig "$RUN_DIR/kubeconfig" \
    --heartbeat "$AGENT_HEARTBEAT" \
    --poll 1s \
    --logging-format text
}

# tessera::topology_of NODE prints the topology file of NODE from the node list.
tessera::topology_of() {
  tessera::nodes | awk -v n="$1" '$1 == n {print $2}'
}
