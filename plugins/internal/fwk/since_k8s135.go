// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package fwk

import framework "k8s.io/kube-scheduler/framework"

// Pod signatures (opportunistic batching), from Kubernetes 1.35.
type (
	SignPlugin   = framework.SignPlugin
	SignFragment = framework.SignFragment
)

// The scheduler's map from extended resource names to the DeviceClasses that serve
// them through DRA (KEP-5004), from Kubernetes 1.35.
type DeviceClassResolver = framework.DeviceClassResolver
