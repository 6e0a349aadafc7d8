// SPDX-License-Identifier: Apache-2.0

// Package spread is the Spread placement policy: the least-used node, and on it the
// least-used GPU, minimising contention.
package spread

import (
	v1 "k8s.io/api/core/v1"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/placement"
	"github.com/tessera-dev/tessera/plugins/internal/fwk"
)

// Name is the policy's name in args, annotations and metrics.
const Name placement.Policy = "Spread"

// Registration registers the policy.
var Registration = placement.Registration{Policy: Name, New: func(*placement.Env) placement.Placer { return Placer{} }}

// Placer is the Spread policy's placer. It keeps no state.
type Placer struct{}

var _ placement.Placer = Placer{}

func (Placer) Policy() placement.Policy { return Name }

func (Placer) PreparePod(*v1.Pod, *placement.PodInfo) {}

func (Placer) DeviceScore(m *nodemodel.Model, used []placement.Usage, c *api.ContainerRequest, i int, w *placement.Weights) float64 {
	return deviceScore(m, used, c, i, w)
}

func (Placer) PickDevice(_ *placement.Allocation, m *nodemodel.Model, used []placement.Usage, _ *placement.PodInfo, c *api.ContainerRequest, w *placement.Weights, cand []int) int {
	return placement.PickBest(m, used, c, w, cand, deviceScore)
}

// deviceScore is the Spread device score: the device's weighted room after placing c.
func deviceScore(m *nodemodel.Model, used []placement.Usage, c *api.ContainerRequest, i int, w *placement.Weights) float64 {
	return 1 - placement.DeviceUtil(m, used, c, i, w)
}

// HostOnlyPod: pods without GPUs leave GPU use as it is; Spread does not score them.
func (Placer) HostOnlyPod(*v1.Pod) *placement.PodInfo { return nil }

func (Placer) NeedsFit() bool { return false }

// ScoreNode is 1 - (util+occupied)/2 over the node after placement, with GPU
// locality for multi-GPU pods (WeightedScore). Occupied GPUs count as well as use: a
// small fraction moves util by less than one score point on a large node, but always
// occupies a GPU, so nodes stay apart.
func (Placer) ScoreNode(_ *placement.PodInfo, a *placement.Allocation, _ fwk.NodeInfo, _ *placement.FitScale, w *placement.Weights) int64 {
	util, occupied := nodeUtilisation(a.Model, a.Used(), w)
	score, ok := placement.WeightedScore(w, 1-(util+occupied)/2, a)
	if !ok {
		return 0
	}
	return placement.ClampScore(int64(score + 0.5))
}

// ScoreHostOnly is never called: HostOnlyPod is nil, so PreScore skips such pods.
func (Placer) ScoreHostOnly(*placement.NodeEntry, placement.NodeView, []placement.Usage, *placement.PodInfo, fwk.NodeInfo, *placement.FitScale, *placement.Weights) int64 {
	return 0
}

func (Placer) ScoreExtensions() fwk.ScoreExtensions { return nil }

// nodeUtilisation returns the weighted GPU memory and cores share granted on the
// node's healthy devices, and the share of them that have a tenant.
func nodeUtilisation(m *nodemodel.Model, used []placement.Usage, w *placement.Weights) (util, occupied float64) {
	var mem, memTotal, cores, n, busy float64
	for i := range m.Devices {
		d := &m.Devices[i]
		if !d.Healthy {
			continue
		}
		mem += float64(used[i].MemMiB)
		memTotal += float64(d.MemoryMiB)
		cores += float64(used[i].Cores)
		n++
		if used[i].Tenants > 0 {
			busy++
		}
	}
	if n == 0 || memTotal == 0 {
		return 0, 0
	}
	return (w.Memory*mem/memTotal + w.Cores*cores/(100*n)) / (w.Memory + w.Cores), busy / n
}
