package placement

import (
	v1 "k8s.io/api/core/v1"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/tessera-dev/tessera/api"
	"github.com/tessera-dev/tessera/plugins/gpushare/internal/nodemodel"
)

// binpack is the Binpack policy: best fit. At the node level it takes the node with
// the least GPU and CPU capacity left after placement; at the GPU level the fullest
// GPU that fits. Both keep whole GPUs, whole NVLink islands and whole nodes free for
// the requests that need them.
type binpack struct{}

var _ Placer = binpack{}

// Binpack is the Binpack policy's name.
const Binpack Policy = "Binpack"

// BinpackRegistration registers the Binpack policy.
var BinpackRegistration = Registration{Policy: Binpack, New: func(*Env) Placer { return binpack{} }}

func (binpack) Policy() Policy { return Binpack }

func (binpack) PreparePod(*v1.Pod, *PodInfo) {}

func (binpack) DeviceScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64 {
	return packScore(m, used, c, i, w)
}

func (binpack) PickDevice(_ *Allocation, m *nodemodel.Model, used []Usage, _ *PodInfo, c *api.ContainerRequest, w *Weights, cand []int) int {
	return pickBest(m, used, c, w, cand, packScore)
}

// packScore is the Binpack device score: the device's weighted use after placing c.
// Among equally full choices, it keeps whole NVLink islands free by preferring a GPU
// that is already used or whose island is already broken.
func packScore(m *nodemodel.Model, used []Usage, c *api.ContainerRequest, i int, w *Weights) float64 {
	s := deviceUtil(m, used, c, i, w)
	d := &m.Hot[i]
	if used[i].Tenants == 0 && d.Island >= 0 && islandFree(m, used, d.Island) {
		s -= 1e-3
	}
	return s
}

// hostOnlyFit is the HostOnlyPod of Binpack: pods without GPUs are scored by best fit
// too, and need nothing of the pod beyond the cycle's FitScale. Shared, never written.
var hostOnlyFit = &PodInfo{}

// HostOnlyPod scores pods without GPUs by best fit too: a CPU-only pod belongs on a
// node whose GPUs are taken, not on one whose free GPUs its CPU request would strand.
func (binpack) HostOnlyPod(*v1.Pod) *PodInfo { return hostOnlyFit }

func (binpack) NeedsFit() bool { return true }

// ScoreNode is best fit over free GPU and CPU (leftover), with GPU locality for
// multi-GPU pods (weightedScore), less islandWeight points for every fully free
// NVLink island the placement breaks up (pods without a multi-GPU container): a tie
// breaker that keeps islands whole for the pods that need them. As a weighted term it
// fought best fit (fractions went to nodes whose islands were already broken,
// whatever they left free).
//
// Absolute leftovers (not utilisation) fill small nodes before large ones, keeping
// large nodes whole for the pods only they can take; counting CPU keeps CPU-heavy
// pods from stranding the GPUs of a node with CPU to spare.
func (binpack) ScoreNode(_ *PodInfo, a *Allocation, ni fwk.NodeInfo, f *FitScale, w *Weights) int64 {
	score, ok := weightedScore(w, 1-leftover(a.Model, a.used, ni, f, w), a)
	if !ok {
		return 0
	}
	if !a.multiGPU {
		score -= w.Island * float64(a.brokenIslands)
	}
	return clampScore(int64(score + 0.5))
}

// ScoreHostOnly is best fit over the node's free GPUs (unchanged by the pod) and its
// CPU after placement. A node without GPUs has none to strand and scores by CPU alone.
func (binpack) ScoreHostOnly(c *Cache, _ *PodInfo, ni fwk.NodeInfo, f *FitScale, w *Weights) int64 {
	var buf [16]Usage
	v, used := c.View(ni.Node(), buf[:0])
	m := v.Model
	if m == nil {
		m = &nodemodel.Model{}
	}
	return clampScore(int64((1-leftover(m, used, ni, f, w))*float64(fwk.MaxNodeScore) + 0.5))
}

func (binpack) ScoreExtensions() fwk.ScoreExtensions { return nil }
