// SPDX-License-Identifier: Apache-2.0

//go:build k8s1.34

package fwk

import (
	"context"

	"k8s.io/client-go/util/workqueue"
	framework "k8s.io/kubernetes/pkg/scheduler/framework"
)

// The plugin interfaces and what they return, from
// k8s.io/kubernetes/pkg/scheduler/framework, where Kubernetes 1.34 keeps them.
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

// Parallelizer runs work in parallel chunks: what the 1.34 handle's Parallelizer
// (a struct there, an interface from 1.35) does.
type Parallelizer interface {
	Until(ctx context.Context, pieces int, doWorkPiece workqueue.DoWorkPieceFunc, operation string)
}

// ParallelizerOf is h's parallelizer; nil without a handle.
func ParallelizerOf(h Handle) Parallelizer {
	if h == nil {
		return nil
	}
	return h.Parallelizer()
}

// ProfileName is the name of h's profile; empty without a handle. The 1.34 Handle
// does not list ProfileName, but the framework behind it has it (it is in the
// interface from 1.35).
func ProfileName(h Handle) string {
	if p, ok := h.(interface{ ProfileName() string }); ok {
		return p.ProfileName()
	}
	return ""
}
