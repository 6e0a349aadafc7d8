// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34 && !k8s1.35

package fwk

import framework "k8s.io/kube-scheduler/framework"

// From Kubernetes 1.36: PreBindPreFlight returns a result (parallel PreBind), and
// placement scoring.
type (
	PreBindPreFlightResult = framework.PreBindPreFlightResult
	PlacementScorePlugin   = framework.PlacementScorePlugin
)
