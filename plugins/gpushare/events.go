// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34 && !k8s1.35 && !k8s1.36

package gpushare

import "github.com/tessera-dev/tessera/plugins/internal/fwk"

// boundPodResource is the event resource of pods bound to a node, whose deletion can
// free GPUs: AssignedPod, from Kubernetes 1.37.
const boundPodResource = fwk.AssignedPod
