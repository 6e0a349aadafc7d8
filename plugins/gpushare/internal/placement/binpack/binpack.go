// SPDX-License-Identifier: Apache-2.0

// Package binpack is the Binpack placement policy: best fit. At the node level it
// takes the node with the least GPU and CPU capacity left after placement; at the
// GPU level the fullest GPU that fits. Both keep whole GPUs, whole NVLink islands and
// whole nodes free for the requests that need them.
package binpack

import (
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Name is the policy's name in args, annotations and metrics.
const Name placement.Policy = "Binpack"

// Registration registers the policy.
var Registration = placement.Registration{Policy: Name, New: func(*placement.Env) placement.Placer { return Placer{} }}

// Placer is the Binpack policy's placer. It keeps no state.
type Placer struct{}

var _ placement.Placer = Placer{}

func (Placer) Policy() placement.Policy { return Name }

func (Placer) PreparePod(*v1.Pod, *placement.PodInfo) {}

func (Placer) DeviceScore(m *nodemodel.Model, used []placement.Usage, c *api.ContainerRequest, i int, w *placement.Weights) float64 {
	return placement.PackScore(m, used, c, i, w)
}

func (Placer) PickDevice(_ *placement.Allocation, m *nodemodel.Model, used []placement.Usage, _ *placement.PodInfo, c *api.ContainerRequest, w *placement.Weights, cand []int) int {
	return placement.PickBest(m, used, c, w, cand, placement.PackScore)
}

// hostOnlyFit is the HostOnlyPod of Binpack: pods without GPUs are scored by best fit
// too, and need nothing of the pod beyond the cycle's FitScale. Shared, never written.
var hostOnlyFit = &placement.PodInfo{}

// HostOnlyPod scores pods without GPUs by best fit too: a CPU-only pod belongs on a
// node whose GPUs are taken, not on one whose free GPUs its CPU request would strand.
func (Placer) HostOnlyPod(*v1.Pod) *placement.PodInfo { return hostOnlyFit }

func (Placer) NeedsFit() bool { return true }

// ScoreNode is best fit over free GPU and CPU (Leftover), with GPU locality for
// multi-GPU pods (WeightedScore), less islandWeight points for every fully free
// NVLink island the placement breaks up (pods without a multi-GPU container): a tie
// breaker that keeps islands whole for the pods that need them. As a weighted term it
// fought best fit (fractions went to nodes whose islands were already broken,
// whatever they left free).
//
// Absolute leftovers (not utilisation) fill small nodes before large ones, keeping
// large nodes whole for the pods only they can take; counting CPU keeps CPU-heavy
// pods from stranding the GPUs of a node with CPU to spare.
func (Placer) ScoreNode(_ *placement.PodInfo, a *placement.Allocation, ni fwk.NodeInfo, f *placement.FitScale, w *placement.Weights) int64 {
	score, ok := placement.WeightedScore(w, 1-placement.Leftover(a.Model, a.Used(), ni, f, w), a)
	if !ok {
		return 0
	}
	if !a.MultiGPU() {
		score -= w.Island * float64(a.BrokenIslands())
	}
	return placement.ClampScore(int64(score + 0.5))
}

// ScoreHostOnly is best fit over the node's free GPUs (unchanged by the pod) and its
// CPU after placement. A node without GPUs has none to strand and scores by CPU alone.
func (Placer) ScoreHostOnly(_ *placement.NodeEntry, v placement.NodeView, used []placement.Usage, _ *placement.PodInfo, ni fwk.NodeInfo, f *placement.FitScale, w *placement.Weights) int64 {
	m := v.Model
	if m == nil {
		m = &nodemodel.Model{}
	}
	return placement.ClampScore(int64((1-placement.Leftover(m, used, ni, f, w))*float64(fwk.MaxNodeScore) + 0.5))
}

func (Placer) ScoreExtensions() fwk.ScoreExtensions { return nil }
