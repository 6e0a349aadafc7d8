// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34 && !k8s1.35 && !k8s1.36

package fwk

import framework "k8s.io/kube-scheduler/framework"

// AssignedPod, from Kubernetes 1.37: events of pods bound to a node, apart from the
// general Pod resource.
const AssignedPod = framework.AssignedPod
