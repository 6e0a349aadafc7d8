// SPDX-License-Identifier: Apache-2.0

//go:build k8s1.34 || k8s1.35 || k8s1.36

package gpushare

import "github.com/tessera-dev/tessera/plugins/internal/fwk"

// boundPodResource is Pod before Kubernetes 1.37, which has no AssignedPod resource:
// the deletion of any pod then reaches hintPodDeleted, which skips pods that were not
// bound with an assignment.
const boundPodResource = fwk.Pod
