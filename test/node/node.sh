#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A real Kubernetes node for the real-node suite (make test-node, make test-node-gpu):
# etcd, kube-apiserver, the Tessera scheduler and a default scheduler (both the
# tessera-scheduler binary, which is kube-scheduler with Tessera's plugins), containerd
# 2.x with NRI, runc, kubelet and the Tessera node agent, all on this machine, all
# started from binaries built from Go modules, with no registry, no CNI and no Docker.
#
#   test/node/node.sh up            start everything (NODE_DIR must not hold a node)
#   test/node/node.sh down          stop everything, remove containers, mounts, cgroups
#   test/node/node.sh stop NAME     stop one component (agent, kubelet, containerd, ...)
#   test/node/node.sh start NAME    start it again with the same settings
#
# Environment:
#   NODE_DIR       state, logs, sockets (default /tmp/tessera-node; keep it short: the
#                  sockets under it must fit in 108 bytes)
#   BIN_DIR        etcd, kube-apiserver, kubectl, tessera-scheduler, tessera-node-agent
#   NODE_BIN_DIR   containerd, containerd-shim-runc-v2, ctr, runc, kubelet
#   IMAGES_TAR     OCI archive of the test images (test/node/images), imported into
#                  containerd's k8s.io namespace
#   HOOK_LIBRARY   the CUDA hook the agent injects (absolute path)
#   MODE           nri (default): the agent binds at container creation through NRI;
#                  fallback: NRI off in the agent, binding at the first CUDA call;
#                  dra: the agent serves the GPUs as the DRA driver gpu.tessera.dev
#   GPU            0 (default): a simulated GPU topology (FAKE_TOPOLOGY) whose UUIDs are
#                  the fake libcuda's; 1: the machine's GPUs through NVML
#   FAKE_TOPOLOGY  simulated topology file (default test/node/fake-gpus.yaml)
#   FAKE_DRIVER_DIR  with GPU=0: the fake libcuda.so.1 and libnvidia-ml.so.1
#                  (cuda-hook/build/plain/fake), installed as the node's driver in
#                  NODE_DIR/driver, from which the agent writes the node's CDI spec
#   TESSERA_NODE_DRIVER_DIR  with GPU=1: where the machine's driver libraries are
#                  (default /usr/local/nvidia/lib64), searched by the agent's CDI
#                  discovery
#   MPS_GPUS       the agent's --mps-gpus (default none: every GPU time-sliced): GPUs
#                  served in mps sharing mode, each by an MPS control daemon the agent
#                  runs, with its pipe, shm and log directories under NODE_DIR/m; needs
#                  MODE=nri. Read when the agent starts (node.sh start agent too)
#   TESSERA_NODE_MPS_CONTROL  with GPU=1: the MPS control program (default
#                  /usr/local/nvidia/bin/nvidia-cuda-mps-control; nvidia-cuda-mps-server
#                  must be beside it)
#   FAKE_MPS_CONTROL  with GPU=0: the fake MPS control program
#                  (test/node/fakemps, built into _output/node-test/bin)
#   NRI_VALIDATOR  with MODE=nri, 1 (default): containerd's NRI default validator is
#                  on, so a GPU container whose pod requires the agent's NRI plugin
#                  (the chart's require-nri-plugin policy, applied to the API server
#                  here from config/deploy/manifests/tessera.yaml) is refused while
#                  the plugin is not connected; 0: off. Never on in the fallback mode,
#                  whose agent does not connect to NRI.
#
# GPU containers get their GPUs and the driver's files through CDI: the agent writes
# the node's spec into NODE_DIR/cdi (containerd's cdi_spec_dirs), never into the
# host's /var/run/cdi.
#
# Pods must use hostNetwork: the node has no CNI plugin, so containerd reports the pod
# network not ready and kubelet starts only host-network pods. Kubelet runs in a private
# mount namespace in which NODE_DIR/device-plugins is /var/lib/kubelet/device-plugins
# (kubelet's device-plugin socket path is fixed), so two nodes can run on one machine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export TESSERA_ROOT=$ROOT
NODE_DIR=${NODE_DIR:-/tmp/tessera-node}
export RUN_DIR=$NODE_DIR/run
BIN_DIR=${BIN_DIR:-$ROOT/bin}
NODE_BIN_DIR=${NODE_BIN_DIR:-$ROOT/bin/node}
MODE=${MODE:-nri}
GPU=${GPU:-0}
FAKE_TOPOLOGY=${FAKE_TOPOLOGY:-$ROOT/test/node/fake-gpus.yaml}
NODE_NAME=${NODE_NAME:-tessera-node}
# shellcheck source=../../hack/lib/local-cluster.sh
source "$ROOT/hack/lib/local-cluster.sh"

CTR_SOCK=$NODE_DIR/containerd.sock
NRI_SOCK=$NODE_DIR/nri.sock

ctr_() { "$NODE_BIN_DIR/ctr" -a "$CTR_SOCK" -n k8s.io "$@"; }

# The cgroup hierarchies kubelet and runc use: the v1 controllers of a hybrid or v1
# machine, or the unified hierarchy when /sys/fs/cgroup is cgroup2.
cgroup_dirs() {
  if [[ $(stat -fc %T /sys/fs/cgroup) == cgroup2fs ]]; then
    echo /sys/fs/cgroup
    return
  fi
  local d
  for d in /sys/fs/cgroup/*/; do
    d=${d%/}
    # cgroup2fs too: the unified hierarchy of a hybrid machine, where kubelet also
    # makes its cgroups.
    case $(stat -fc %T "$d") in cgroupfs | cgroup2fs) echo "$d" ;; esac
  done
}

cgroup_v1() { [[ $(stat -fc %T /sys/fs/cgroup) != cgroup2fs ]]; }

# --- containerd ---------------------------------------------------------------------

containerd_config() {
  cat >"$NODE_DIR/containerd.toml" <<EOF
version = 3
root = '$NODE_DIR/containerd/root'
state = '$NODE_DIR/containerd/state'
[grpc]
  address = '$CTR_SOCK'
[ttrpc]
  address = '$CTR_SOCK.ttrpc'
[debug]
  level = 'info'
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'tessera.local/tessera-pause:test'
  [plugins.'io.containerd.cri.v1.runtime']
    # Without CAP_SYS_RESOURCE (containers, some CI sandboxes) no process may lower
    # its oom_score_adj; the pause container's -998 would fail its start.
    restrict_oom_score_adj = true
    cdi_spec_dirs = ['$NODE_DIR/cdi']
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '$NODE_BIN_DIR/runc'
      SystemdCgroup = false
  [plugins.'io.containerd.nri.v1.nri']
    disable = false
    socket_path = '$NRI_SOCK'
    plugin_path = '$NODE_DIR/nri-plugins'
    plugin_config_path = '$NODE_DIR/nri-conf'
EOF
  if [[ $MODE == nri && ${NRI_VALIDATOR:-1} == 1 ]]; then
    cat >>"$NODE_DIR/containerd.toml" <<EOF
    # Refuse a container whose pod's required-plugins.noderesource.dev annotations
    # name a plugin that is not connected (the node agent's, for GPU containers).
    [plugins.'io.containerd.nri.v1.nri'.default_validator]
      enable = true
EOF
  fi
}

start_containerd() {
  mkdir -p "$NODE_DIR/containerd" "$NODE_DIR/cdi"
  containerd_config
  local wrap=()
  # A simulated node has no /dev/nvidia*: containerd sees fake ones (with-fake-dev.sh).
  [[ $GPU == 1 ]] || wrap=("$ROOT/test/node/with-fake-dev.sh" "$NODE_DIR/devns" "$NODE_DIR/dev")
  PATH=$NODE_BIN_DIR:$PATH tessera::spawn containerd "${wrap[@]}" "$NODE_BIN_DIR/containerd" --config "$NODE_DIR/containerd.toml" || return 1
  WAIT_PID=containerd tessera::wait_until 30 containerd ctr_ version
}

import_images() {
  ctr_ images import "$IMAGES_TAR" >/dev/null
  ctr_ images ls -q | grep -q tessera.local/tessera-pause:test
}

# --- kubelet ------------------------------------------------------------------------

kubelet_config() {
  cat >"$NODE_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Kubelet 1.35+ refuses cgroup v1 unless told otherwise; hybrid machines are v1 to it.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$CTR_SOCK
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
failSwapOn: false
podLogsDir: $NODE_DIR/pod-logs
resolvConf: ""
serializeImagePulls: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
maxPods: 200
EOF
}

start_kubelet() {
  # The mount point of kubelet's device-plugin directory on the host: what node.sh
  # creates there, it removes at down (created.txt).
  local p
  for p in /var/lib/kubelet /var/lib/kubelet/device-plugins; do
    [[ -e $p ]] || { mkdir "$p" && echo "$p" >>"$NODE_DIR/created.txt"; }
  done
  mkdir -p "$NODE_DIR/kubelet" "$NODE_DIR/pod-logs" "$NODE_DIR/device-plugins"
  local d c
  if ! cgroup_v1; then
    # Pure cgroup v2: the controllers kubelet needs must be enabled below the root
    # (a machine without systemd may have left them off).
    for c in cpuset cpu io memory pids hugetlb; do
      grep -qw "$c" /sys/fs/cgroup/cgroup.subtree_control || echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    done
  fi
  while read -r d; do mkdir -p "$d$CGROUP_ROOT"; done < <(cgroup_dirs)
  kubelet_config
  tessera::spawn kubelet unshare -m --propagation private sh -c \
    'mount --bind "$1" /var/lib/kubelet/device-plugins && shift && exec "$@"' sh "$NODE_DIR/device-plugins" \
    "$NODE_BIN_DIR/kubelet" --config "$NODE_DIR/kubelet.yaml" --kubeconfig "$RUN_DIR/kubeconfig" \
    --root-dir "$NODE_DIR/kubelet" --cert-dir "$NODE_DIR/kubelet/pki" --hostname-override "$NODE_NAME" --v=2 || return 1
  WAIT_PID=kubelet tessera::wait_until 60 kubelet tessera::http_ok "$KUBELET_HEALTHZ_PORT" /healthz &&
    WAIT_PID=kubelet tessera::wait_until 60 "node $NODE_NAME" tessera::kubectl get node "$NODE_NAME"
}

# --- node agent ---------------------------------------------------------------------

start_agent() {
  mkdir -p "$NODE_DIR/agent" "$NODE_DIR/limits" "$NODE_DIR/bind"
  local args=(--node-name "$NODE_NAME" --kubeconfig "$RUN_DIR/kubeconfig"
    --state-dir "$NODE_DIR/agent" --limits-root "$NODE_DIR/limits" --turns-dir "$NODE_DIR/turns" --hook-library "$HOOK_LIBRARY"
    --metrics-addr "" --health-addr "127.0.0.1:$AGENT_HEALTH_PORT" --poll 1s --heartbeat 10s --logging-format text)
  # CDI: the spec goes to containerd's cdi_spec_dirs, on this node only. No
  # nvidia-cdi-hook: the spec mounts the libraries into /usr/local/nvidia/lib64.
  args+=(--cdi-spec-dir "$NODE_DIR/cdi" --cdi-hook none)
  local env=()
  if [[ $GPU == 1 ]]; then
    args+=(--watchdog=true --cdi-library-search-paths "${TESSERA_NODE_DRIVER_DIR:-/usr/local/nvidia/lib64}")
  else
    # The fake driver in NODE_DIR/driver, as the host sees it too; NVIDIA's discovery
    # asks its libnvidia-ml, which shows as many GPUs as the topology has.
    args+=(--simulate "$FAKE_TOPOLOGY" --dev-dir "$NODE_DIR/dev" --watchdog=false
      --cdi-driver-root "$NODE_DIR/driver" --cdi-host-driver-root "$NODE_DIR/driver"
      --cdi-library-search-paths "$NODE_DIR/driver$FAKE_DRIVER_LIB_DIR")
    env=(env "FAKE_CUDA_DEVICES=$(grep -c 'GPU-' "$FAKE_TOPOLOGY")" "FAKE_NVML_DRIVER_VERSION=$(fake_driver_version)")
  fi
  if [[ -n ${MPS_GPUS:-} ]]; then
    local ctl
    if [[ $GPU == 1 ]]; then
      ctl=${TESSERA_NODE_MPS_CONTROL:-/usr/local/nvidia/bin/nvidia-cuda-mps-control}
    else
      ctl=${FAKE_MPS_CONTROL:-}
    fi
    [[ -x $ctl ]] || tessera::die "MPS_GPUS=$MPS_GPUS: no MPS control program at '$ctl' (TESSERA_NODE_MPS_CONTROL with GPU=1, FAKE_MPS_CONTROL without)"
    # The root is short: each GPU's pipe directory (<root>/<uuid>/pipe) must fit 80
    # bytes, for the MPS sockets in it. The daemon starts nvidia-cuda-mps-server from
    # its PATH.
    args+=(--mps-gpus "$MPS_GPUS" --mps-control "$ctl" --mps-root "$NODE_DIR/m" --mps-health-interval 1s)
    ((${#env[@]})) || env=(env)
    env+=("PATH=$(dirname "$ctl"):$PATH")
  fi
  case $MODE in
  nri) args+=(--device-plugin --device-plugin-dir "$NODE_DIR/device-plugins" --nri --nri-socket "$NRI_SOCK") ;;
  fallback) args+=(--device-plugin --device-plugin-dir "$NODE_DIR/device-plugins" --nri=false --bind-fallback --bind-socket "$NODE_DIR/bind/bind.sock") ;;
  # DRA: the GPUs served as gpu.tessera.dev through kubelet's plugin directories under
  # its --root-dir; each prepared claim's CDI spec beside the node's.
  dra) args+=(--device-plugin=false --dra --dra-plugin-dir "$NODE_DIR/kubelet/plugins/gpu.tessera.dev"
    --dra-registrar-dir "$NODE_DIR/kubelet/plugins_registry" --dra-cdi-spec-dir "$NODE_DIR/cdi"
    --nri --nri-socket "$NRI_SOCK") ;;
  *) echo "MODE=$MODE: want nri, fallback or dra" >&2 && return 1 ;;
  esac
  tessera::spawn agent "${env[@]}" "$BIN_DIR/tessera-node-agent" "${args[@]}" || return 1
  WAIT_PID=agent tessera::wait_until 60 "tessera-node-agent" tessera::http_ok "$AGENT_HEALTH_PORT" /readyz
}

# The device nodes the agent hands to GPU containers on a simulated node: the NVIDIA
# majors and minors, created here (nothing behind them; the fake libcuda opens none).
fake_devices() {
  mkdir -p "$NODE_DIR/dev"
  local i n
  n=$(grep -c 'GPU-' "$FAKE_TOPOLOGY")
  for ((i = 0; i < n; i++)); do [[ -e $NODE_DIR/dev/nvidia$i ]] || mknod "$NODE_DIR/dev/nvidia$i" c 195 "$i"; done
  [[ -e $NODE_DIR/dev/nvidiactl ]] || mknod "$NODE_DIR/dev/nvidiactl" c 195 255
  [[ -e $NODE_DIR/dev/nvidia-uvm ]] || mknod "$NODE_DIR/dev/nvidia-uvm" c 510 0
}

# Where the fake driver's libraries are under NODE_DIR/driver: where the NVIDIA
# driver is on the suite's GPU machine (and on GKE-style nodes), outside the loader's
# cache.
FAKE_DRIVER_LIB_DIR=/usr/local/nvidia/lib64

fake_driver_version() { sed -n 's/^driver: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$FAKE_TOPOLOGY"; }

# The fake driver as the node's NVIDIA driver: its libraries under their versioned
# names (the version the fake NVML reports, the topology's) with the soname links a
# driver install has. Containers get them through the agent's CDI spec only; the test
# image holds no driver.
fake_driver() {
  local lib=$NODE_DIR/driver$FAKE_DRIVER_LIB_DIR v l
  v=$(fake_driver_version)
  [[ -n $v ]] || tessera::die "$FAKE_TOPOLOGY names no driver version"
  [[ -n ${FAKE_DRIVER_DIR:-} && -f $FAKE_DRIVER_DIR/libcuda.so.1 && -f $FAKE_DRIVER_DIR/libnvidia-ml.so.1 ]] ||
    tessera::die "FAKE_DRIVER_DIR: the fake libcuda.so.1 and libnvidia-ml.so.1 are needed (cuda-hook/build/plain/fake)"
  mkdir -p "$lib"
  for l in libcuda libnvidia-ml; do
    cp "$FAKE_DRIVER_DIR/$l.so.1" "$lib/$l.so.$v"
    ln -sf "$l.so.$v" "$lib/$l.so.1"
  done
}

# --- schedulers ---------------------------------------------------------------------

# The default scheduler: kube-scheduler's default profile, as in any cluster. Tessera's
# binary is kube-scheduler, so it plays that part too.
start_default_scheduler() {
  cat >"$NODE_DIR/default-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection: {kubeconfig: "$RUN_DIR/kubeconfig"}
leaderElection: {leaderElect: false}
profiles: [{schedulerName: default-scheduler}]
EOF
  tessera::spawn default-scheduler "$BIN_DIR/tessera-scheduler" --config "$NODE_DIR/default-scheduler.yaml" \
    --bind-address 127.0.0.1 --secure-port "$DEFAULT_SCHEDULER_PORT" \
    --authentication-kubeconfig "$RUN_DIR/kubeconfig" --authorization-kubeconfig "$RUN_DIR/kubeconfig" \
    --authentication-skip-lookup || return 1
  WAIT_PID=default-scheduler tessera::wait_until 60 "default scheduler" tessera::port_open "$DEFAULT_SCHEDULER_PORT"
}

# --- the chart's admission policies --------------------------------------------------

# The chart's require-nri-plugin MutatingAdmissionPolicy and its binding, from the
# rendered default install: GPU pods get the annotation that containerd's NRI default
# validator reads, as in a cluster with the chart.
apply_policies() {
  local m=$ROOT/config/deploy/manifests/tessera.yaml
  [[ -f $m ]] || tessera::die "$m: the chart's rendered manifests are needed"
  local doc="" line
  : >"$NODE_DIR/policies.yaml"
  while IFS= read -r line || [[ -n $line ]]; do
    if [[ $line == --- ]]; then
      policy_doc "$doc"
      doc=""
    else
      doc+=$line$'\n'
    fi
  done <"$m"
  policy_doc "$doc"
  [[ $(grep -c '^kind: MutatingAdmissionPolicy' "$NODE_DIR/policies.yaml") == 2 ]] ||
    tessera::die "$m: no require-nri-plugin MutatingAdmissionPolicy and binding"
  tessera::kubectl apply -f "$NODE_DIR/policies.yaml" >/dev/null
}

policy_doc() {
  [[ $1 =~ (^|$'\n')kind:\ MutatingAdmissionPolicy(Binding)?$'\n' && $1 =~ $'\n'\ \ name:\ [a-z0-9-]*-require-nri-plugin$'\n' ]] &&
    printf -- '---\n%s' "$1" >>"$NODE_DIR/policies.yaml"
  return 0
}

# --- whole node ---------------------------------------------------------------------

save_node_env() {
  tessera::save_env
  local v
  for v in KUBELET_PORT KUBELET_HEALTHZ_PORT AGENT_HEALTH_PORT DEFAULT_SCHEDULER_PORT CGROUP_ROOT MODE GPU NODE_NAME; do
    printf '%s=%q\n' "$v" "${!v}" >>"$RUN_DIR/env"
  done
}

up() {
  [[ ! -e $RUN_DIR/env ]] || tessera::die "$NODE_DIR already holds a node (test/node/node.sh down first)"
  [[ $(id -u) == 0 ]] || tessera::die "the real-node suite needs root (kubelet, containerd, runc)"
  [[ -n ${IMAGES_TAR:-} && -f $IMAGES_TAR ]] || tessera::die "IMAGES_TAR: the test images' OCI archive is needed"
  [[ -n ${HOOK_LIBRARY:-} && -f $HOOK_LIBRARY ]] || tessera::die "HOOK_LIBRARY: the CUDA hook library is needed"
  mkdir -p "$RUN_DIR"
  tessera::free_ports ETCD_PORT ETCD_PEER_PORT APISERVER_PORT SCHEDULER_PORT DEFAULT_SCHEDULER_PORT \
    KUBELET_PORT KUBELET_HEALTHZ_PORT AGENT_HEALTH_PORT || tessera::die "cannot pick the ports of the cluster"
  KWOK_PORT=0
  # One cgroup subtree per node, named after its directory, so that runs never share one.
  CGROUP_ROOT=/tessera-node-$(printf '%s' "$NODE_DIR" | cksum | cut -d' ' -f1)
  save_node_env
  [[ $GPU == 1 ]] || tessera::step "fake GPU device nodes" fake_devices
  [[ $GPU == 1 ]] || tessera::step "fake driver in $NODE_DIR/driver" fake_driver
  # B6's baseline on a GPU is a privileged pod (test/node/b6_test.go).
  [[ $GPU != 1 ]] || export APISERVER_ALLOW_PRIVILEGED=true
  tessera::step "etcd ready" tessera::start_etcd
  tessera::step "kube-apiserver ready" tessera::start_apiserver
  tessera::step "tessera-scheduler ready" tessera::start_scheduler
  tessera::step "default scheduler ready" start_default_scheduler
  tessera::step "admission policies applied" apply_policies
  tessera::step "containerd ready" start_containerd
  tessera::step "test images imported" import_images
  tessera::step "kubelet ready, node registered" start_kubelet
  tessera::step "tessera-node-agent ready ($MODE)" start_agent
}

start_one() {
  tessera::load_env
  case $1 in
  agent) start_agent ;;
  kubelet) start_kubelet ;;
  containerd) start_containerd ;;
  scheduler) tessera::start_scheduler ;;
  default-scheduler) start_default_scheduler ;;
  *) tessera::die "cannot start $1 (agent, kubelet, containerd, scheduler, default-scheduler)" ;;
  esac
}

# unmount_under DIR: every mount point below DIR, deepest first.
unmount_under() {
  local m
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$1/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
}

down() {
  [[ -d $RUN_DIR ]] || return 0
  tessera::load_env 2>/dev/null || true
  tessera::stop agent
  stop_mps_daemons
  tessera::stop kubelet
  # Containers outlive kubelet and containerd (their shims keep them): end them here.
  if tessera::running containerd; then
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$t" >/dev/null 2>&1 || true; done
  fi
  tessera::stop containerd
  # The shims outlive containerd (that is what they are for): stop this node's, found
  # by the socket address on their command line.
  stop_shims
  tessera::stop default-scheduler
  tessera::stop_all
  unmount_under "$NODE_DIR"
  if [[ -n ${CGROUP_ROOT:-} ]]; then
    local d
    while read -r d; do
      [[ -d $d$CGROUP_ROOT ]] && find "$d$CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done < <(cgroup_dirs)
  fi
  remove_created
  rm -rf "$NODE_DIR"
}

# stop_mps_daemons kills the MPS control daemons (with their servers, in their
# process group) that a stopped agent left under NODE_DIR/m: the agent sends them
# quit when it stops, so only an agent that was killed leaves one.
stop_mps_daemons() {
  local f pid
  for f in "$NODE_DIR"/m/*/pipe/nvidia-cuda-mps-control.pid; do
    [[ -f $f ]] || continue
    pid=$(<"$f")
    [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -q mps-control || continue
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  done
}

# stop_shims kills the runc shims of this node's containerd (their command line names
# its socket), by PID.
stop_shims() {
  local f pid pids=()
  for f in /proc/[0-9]*/cmdline; do
    pid=${f#/proc/}
    pid=${pid%/cmdline}
    if tr '\0' ' ' 2>/dev/null <"$f" | grep -q -- "-address $CTR_SOCK "; then
      pids+=("$pid")
    fi
  done
  ((${#pids[@]} == 0)) && return 0
  kill -KILL "${pids[@]}" 2>/dev/null || true
  local i
  for i in $(seq 1 50); do
    kill -0 "${pids[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
}

# remove_created removes the host directories start_kubelet created, deepest first,
# unless another node's kubelet still has its device-plugin directory mounted there.
remove_created() {
  [[ -f $NODE_DIR/created.txt ]] || return 0
  if grep -qs ' /var/lib/kubelet/device-plugins ' /proc/[0-9]*/mountinfo; then
    return 0
  fi
  local p
  while read -r p; do rmdir "$p" 2>/dev/null || true; done < <(sort -r "$NODE_DIR/created.txt")
}

case ${1:-} in
up) up ;;
down) down ;;
start) start_one "${2:?start what}" ;;
stop)
  tessera::load_env
  tessera::stop "${2:?stop what}"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
  exit 2
  ;;
esac
