// SPDX-License-Identifier: Apache-2.0

//go:build !k8s1.34

package fwk

import framework "k8s.io/kube-scheduler/framework"

// The plugin interfaces and what they return, from
// k8s.io/kube-scheduler/framework, where they are from Kubernetes 1.35.
type (
	Plugin               = framework.Plugin
	Handle               = framework.Handle
	PreFilterPlugin      = framework.PreFilterPlugin
	PreFilterResult      = framework.PreFilterResult
	PreFilterExtensions  = framework.PreFilterExtensions
	FilterPlugin         = framework.FilterPlugin
	PostFilterPlugin     = framework.PostFilterPlugin
	PostFilterResult     = framework.PostFilterResult
	NodeToStatusReader   = framework.NodeToStatusReader
	PreScorePlugin       = framework.PreScorePlugin
	ScorePlugin          = framework.ScorePlugin
	ScoreExtensions      = framework.ScoreExtensions
	NodeScore            = framework.NodeScore
	NodeScoreList        = framework.NodeScoreList
	ReservePlugin        = framework.ReservePlugin
	PreBindPlugin        = framework.PreBindPlugin
	BindPlugin           = framework.BindPlugin
	EnqueueExtensions    = framework.EnqueueExtensions
	NodeInfoLister       = framework.NodeInfoLister
	SharedDRAManager     = framework.SharedDRAManager
	ResourceSliceLister  = framework.ResourceSliceLister
	ResourceClaimTracker = framework.ResourceClaimTracker
	DeviceClassLister    = framework.DeviceClassLister
)

// Score bounds.
const (
	MaxNodeScore = framework.MaxNodeScore
	MinNodeScore = framework.MinNodeScore
)

// Parallelizer runs work in parallel chunks.
type Parallelizer = framework.Parallelizer

// ParallelizerOf is h's parallelizer; nil without a handle or where the handle has
// none (a test's).
func ParallelizerOf(h Handle) Parallelizer {
	if h == nil {
		return nil
	}
	return h.Parallelizer()
}

// ProfileName is the name of h's profile; empty without a handle.
func ProfileName(h Handle) string {
	if h == nil {
		return ""
	}
	return h.ProfileName()
}
