package placement

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
)

// spread is the Spread policy: the least-used node, and on it the least-used GPU,
// minimising contention.
type spread struct{}

var _ Placer = spread{}

// Spread is the Spread policy's name.
const Spread Policy = "Spread"

// SpreadRegistration registers the Spread policy.
var SpreadRegistration = Registration{Policy: Spread, New: func(*Env) Placer { return spread{} }}

func (spread) Policy() Policy { return Spread }

func (spread) PreparePod(*v1.Pod, *PodInfo) {}

func (spread) DeviceScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64 {
	return spreadScore(m, used, c, i, w)
}

func (spread) PickDevice(_ *Allocation, m *nodemodel.Model, used []Usage, _ *PodInfo, c *api.ContainerRequest, w *Weights, cand []int) int {
	return pickBest(m, used, c, w, cand, spreadScore)
}

// spreadScore is the Spread device score: the device's weighted room after placing c.
func spreadScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64 {
	return 1 - deviceUtil(m, used, c, i, w)
}

// HostOnlyPod: pods without GPUs leave GPU use as it is; Spread does not score them.
func (spread) HostOnlyPod(*v1.Pod) *PodInfo { return nil }

func (spread) NeedsFit() bool { return false }

// ScoreNode is 1 - (util+occupied)/2 over the node after placement, with GPU
// locality for multi-GPU pods (weightedScore). Occupied GPUs count as well as use: a
// small fraction moves util by less than one score point on a large node, but always
// occupies a GPU, so nodes stay apart.
func (spread) ScoreNode(_ *PodInfo, a *Allocation, _ fwk.NodeInfo, _ *FitScale, w *Weights) int64 {
	util, occupied := nodeUtilisation(a.Model, a.used, w)
	score, ok := weightedScore(w, 1-(util+occupied)/2, a)
	if !ok {
		return 0
	}
	return clampScore(int64(score + 0.5))
}

// ScoreHostOnly is never called: HostOnlyPod is nil, so PreScore skips such pods.
func (spread) ScoreHostOnly(*Cache, *PodInfo, fwk.NodeInfo, *FitScale, *Weights) int64 { return 0 }

func (spread) ScoreExtensions() fwk.ScoreExtensions { return nil }

// nodeUtilisation returns the weighted GPU memory and cores share granted on the
// node's healthy devices, and the share of them that have a tenant.
func nodeUtilisation(m *nodemodel.Model, used []Usage, w *Weights) (util, occupied float64) {
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
