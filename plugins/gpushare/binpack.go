package gpushare

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
)

// binpack is the Binpack policy: best fit. At the node level it takes the node with
// the least GPU and CPU capacity left after placement; at the GPU level the fullest
// GPU that fits. Both keep whole GPUs, whole NVLink islands and whole nodes free for
// the requests that need them.
type binpack struct{}

var _ placer = binpack{}

func (binpack) policy() Policy { return Binpack }

func (binpack) preparePod(*v1.Pod, *podInfo) {}

func (binpack) deviceScore(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64 {
	return packScore(m, used, c, i, w)
}

func (binpack) pickDevice(m *nodeModel, used []usage, _ *podInfo, c *api.ContainerRequest, w *weights, cand []int, _ *nodeMeasure) int {
	return pickBest(m, used, c, w, cand, packScore)
}

// packScore is the Binpack device score: the device's weighted use after placing c.
// Among equally full choices, it keeps whole NVLink islands free by preferring a GPU
// that is already used or whose island is already broken.
func packScore(m *nodeModel, used []usage, c *api.ContainerRequest, i int, w *weights) float64 {
	s := deviceUtil(m, used, c, i, w)
	d := &m.hot[i]
	if used[i].tenants == 0 && d.island >= 0 && islandFree(m, used, d.island) {
		s -= 1e-3
	}
	return s
}

// hostOnlyFit is the hostOnlyPod of Binpack: pods without GPUs are scored by best fit
// too, and need nothing of the pod beyond the cycle's fitScale. Shared, never written.
var hostOnlyFit = &podInfo{}

// hostOnlyPod scores pods without GPUs by best fit too: a CPU-only pod belongs on a
// node whose GPUs are taken, not on one whose free GPUs its CPU request would strand.
func (binpack) hostOnlyPod(*v1.Pod) *podInfo { return hostOnlyFit }

func (binpack) needsFit() bool { return true }

// scoreNode is best fit over free GPU and CPU (leftover), with GPU locality for
// multi-GPU pods (weightedScore), less islandWeight points for every fully free
// NVLink island the placement breaks up (pods without a multi-GPU container): a tie
// breaker that keeps islands whole for the pods that need them. As a weighted term it
// fought best fit (fractions went to nodes whose islands were already broken,
// whatever they left free).
//
// Absolute leftovers (not utilisation) fill small nodes before large ones, keeping
// large nodes whole for the pods only they can take; counting CPU keeps CPU-heavy
// pods from stranding the GPUs of a node with CPU to spare.
func (binpack) scoreNode(_ *podInfo, a *allocation, ni fwk.NodeInfo, f *fitScale, w *weights) int64 {
	score, ok := weightedScore(w, 1-leftover(a.model, a.used, ni, f, w), a)
	if !ok {
		return 0
	}
	if !a.multiGPU {
		score -= w.island * float64(a.brokenIslands)
	}
	return clampScore(int64(score + 0.5))
}

// scoreHostOnly is best fit over the node's free GPUs (unchanged by the pod) and its
// CPU after placement. A node without GPUs has none to strand and scores by CPU alone.
func (binpack) scoreHostOnly(c *Cache, _ *podInfo, ni fwk.NodeInfo, f *fitScale, w *weights) int64 {
	var buf [16]usage
	v, used := c.view(ni.Node(), buf[:0])
	m := v.model
	if m == nil {
		m = &nodeModel{}
	}
	return clampScore(int64((1-leftover(m, used, ni, f, w))*float64(fwk.MaxNodeScore) + 0.5))
}

func (binpack) scoreExtensions() fwk.ScoreExtensions { return nil }
