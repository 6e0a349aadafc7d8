#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# with-fake-dev.sh DIR NODES command...: runs the command (exec, same PID) in a private
# mount namespace whose /dev also holds the device nodes of the directory NODES: an
# overlay on the host's /dev with its upper layer in DIR, so the host's /dev is never
# written. The real-node suite runs containerd so on a simulated node: the device
# plugin's allocation in fallback mode names /dev/nvidia* host paths, which containerd
# looks up, and the machine has no NVIDIA driver.
set -e
d=$1 nodes=$2
shift 2
mkdir -p "$d/upper" "$d/work" "$d/host"
exec unshare -m --propagation private sh -c '
  set -e
  d=$1 nodes=$2
  shift 2
  mount --rbind /dev "$d/host"
  mount -t overlay overlay -o "lowerdir=/dev,upperdir=$d/upper,workdir=$d/work" /dev
  for m in pts shm mqueue hugepages; do
    if mountpoint -q "$d/host/$m"; then mount --rbind "$d/host/$m" "/dev/$m"; fi
  done
  cp -a "$nodes/." /dev/
  exec "$@"' sh "$d" "$nodes" "$@"
