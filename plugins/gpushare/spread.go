package gpushare

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// spread is the Spread policy: the least-used node, and on it the least-used GPU,
// minimising contention.
type spread struct{}

var _ placer = spread{}

func (spread) policy() Policy { return Spread }

func (spread) preparePod(*v1.Pod, *podInfo) {}

func (spread) deviceScore(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64 {
	return spreadScore(m, used, c, i, w)
}

func (spread) pickDevice(m *nodeModel, used []usage, _ *podInfo, c *api.ContainerRequest, w *weights, cand []int, _ *nodeMeasure) int {
	return pickBest(m, used, c, w, cand, spreadScore)
}

// spreadScore is the Spread device score: the device's weighted room after placing c.
func spreadScore(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64 {
	return 1 - deviceUtil(m, used, c, i, w)
}

// hostOnlyPod: pods without GPUs leave GPU use as it is; Spread does not score them.
func (spread) hostOnlyPod(*v1.Pod) *podInfo { return nil }

func (spread) needsFit() bool { return false }

// scoreNode is 1 - (util+occupied)/2 over the node after placement, with GPU
// locality for multi-GPU pods (weightedScore). Occupied GPUs count as well as use: a
// small fraction moves util by less than one score point on a large node, but always
// occupies a GPU, so nodes stay apart.
func (spread) scoreNode(_ *podInfo, a *allocation, _ fwk.NodeInfo, _ *fitScale, w *weights) int64 {
	util, occupied := nodeUtilisation(a.model, a.used, w)
	score, ok := weightedScore(w, 1-(util+occupied)/2, a)
	if !ok {
		return 0
	}
	return clampScore(int64(score + 0.5))
}

// scoreHostOnly is never called: hostOnlyPod is nil, so PreScore skips such pods.
func (spread) scoreHostOnly(*Cache, *podInfo, fwk.NodeInfo, *fitScale, *weights) int64 { return 0 }

func (spread) scoreExtensions() fwk.ScoreExtensions { return nil }

// nodeUtilisation returns the weighted GPU memory and cores share granted on the
// node's healthy devices, and the share of them that have a tenant.
func nodeUtilisation(m *nodeModel, used []usage, w *weights) (util, occupied float64) {
	var mem, memTotal, cores, n, busy float64
	for i := range m.devices {
		d := &m.devices[i]
		if !d.healthy {
			continue
		}
		mem += float64(used[i].memMiB)
		memTotal += float64(d.memoryMiB)
		cores += float64(used[i].cores)
		n++
		if used[i].tenants > 0 {
			busy++
		}
	}
	if n == 0 || memTotal == 0 {
		return 0, 0
	}
	return (w.memory*mem/memTotal + w.cores*cores/(100*n)) / (w.memory + w.cores), busy / n
}
